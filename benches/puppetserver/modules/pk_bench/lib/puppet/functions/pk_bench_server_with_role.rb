# frozen_string_literal: true

# @summary
#   A no-op with the signature of puppet-kicker's `server_with_role` (the same
#   dispatch and parameter types), for benches/puppetserver/run.
Puppet::Functions.create_function(:pk_bench_server_with_role) do
  dispatch :server_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'Any', :default
  end

  def server_with_role(_role, default = nil)
    default
  end
end
