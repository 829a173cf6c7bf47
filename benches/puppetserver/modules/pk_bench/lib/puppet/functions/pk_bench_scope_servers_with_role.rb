# frozen_string_literal: true

# @summary
#   The no-op of pk_bench_servers_with_role that also asks for its scope
#   (`closure_scope`), as servers_with_role's method does, for
#   benches/puppetserver/run's "where the time goes".
Puppet::Functions.create_function(:pk_bench_scope_servers_with_role) do
  dispatch :servers_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'String[1]', :environment
  end

  def servers_with_role(_role, _environment = nil)
    closure_scope
    [].freeze
  end
end
