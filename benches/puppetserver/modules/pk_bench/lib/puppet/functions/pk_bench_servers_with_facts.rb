# frozen_string_literal: true

# @summary
#   A no-op with the signature of puppet-kicker's `servers_with_facts` (the same
#   dispatch and parameter types), for benches/puppetserver/run.
Puppet::Functions.create_function(:pk_bench_servers_with_facts) do
  dispatch :servers_with_facts do
    required_repeated_param 'String[1]', :clauses
  end

  def servers_with_facts(*_clauses)
    [].freeze
  end
end
