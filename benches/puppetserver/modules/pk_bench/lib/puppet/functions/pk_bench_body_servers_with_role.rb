# frozen_string_literal: true

# @summary
#   servers_with_role's very method, in a function of this module
#   (`PuppetKicker::Functions.servers_with_role`, the body every call of the real
#   one runs), for benches/puppetserver/run's "where the time goes": the same body,
#   called from a file Puppet loads as it loads the no-op's.
Puppet::Functions.create_function(:pk_bench_body_servers_with_role) do
  dispatch :servers_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'String[1]', :environment
  end

  def servers_with_role(role, environment = nil)
    PuppetKicker::Functions.servers_with_role(closure_scope, role, environment)
  end
end
