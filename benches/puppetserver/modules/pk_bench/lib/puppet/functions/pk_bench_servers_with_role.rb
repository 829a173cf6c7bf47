# frozen_string_literal: true

# @summary
#   A no-op with the signature of puppet-kicker's `servers_with_role` (the same
#   dispatch and parameter types), for benches/puppetserver/run: what calling such
#   a function costs, to compare a kept answer of the real one with. Not in the
#   module's namespace, as the real one is not: Puppet finds both the same way.
Puppet::Functions.create_function(:pk_bench_servers_with_role) do
  dispatch :servers_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'String[1]', :environment
  end

  def servers_with_role(_role, _environment = nil)
    [].freeze
  end
end
