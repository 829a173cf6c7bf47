# frozen_string_literal: true

require_relative '../../pk_bench/once'

# @summary
#   servers_with_role's signature and very method, the method from a module loaded
#   once (PkBench::Once) rather than defined in this file, for
#   benches/puppetserver/run's "where the time goes": what a function whose file
#   Puppet evaluates for each compile saves by calling code JRuby compiled once.
Puppet::Functions.create_function(:pk_bench_once_servers_with_role) do
  dispatch :servers_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'String[1]', :environment
  end

  include PkBench::Once
end
