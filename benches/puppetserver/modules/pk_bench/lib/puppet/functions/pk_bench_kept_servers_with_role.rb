# frozen_string_literal: true

# @summary
#   The no-op of pk_bench_servers_with_role that returns what the backend holds for
#   `servers_with_role(role)` in the compile's environment (its #kept, the one
#   backend call of a kept answer), for benches/puppetserver/run's "where the time
#   goes". Under the ffi backend only.
Puppet::Functions.create_function(:pk_bench_kept_servers_with_role) do
  dispatch :servers_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'String[1]', :environment
  end

  def servers_with_role(role, environment = nil)
    PuppetKicker.native.kept('servers_with_role', role, environment || closure_scope.environment.name.to_s)
  end
end
