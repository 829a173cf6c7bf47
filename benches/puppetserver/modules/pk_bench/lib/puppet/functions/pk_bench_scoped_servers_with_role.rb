# frozen_string_literal: true

# @summary
#   servers_with_role's signature and body, given the calling scope by Puppet
#   (an InternalFunction's `scope_param`) rather than asking for its closure scope
#   (`closure_scope`: Puppet.lookup(:global_scope), a thread-local context lookup,
#   on every call), for benches/puppetserver/run's "where the time goes".
Puppet::Functions.create_function(:pk_bench_scoped_servers_with_role, Puppet::Functions::InternalFunction) do
  dispatch :servers_with_role do
    scope_param
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'String[1]', :environment
  end

  def servers_with_role(scope, role, environment = nil)
    PuppetKicker::Functions.servers_with_role(scope, role, environment)
  end
end
