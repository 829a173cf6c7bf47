# frozen_string_literal: true

# For ERB templates written for the original puppet-kicker, which call
# `scope.function_servers_with_facts([...])`. Manifests, EPP and `scope.call_function`
# reach the modern function in lib/puppet/functions, which this delegates to.
Puppet::Parser::Functions.newfunction(:servers_with_facts, type: :rvalue, arity: -2, doc: <<-DOC) do |args|
  Legacy entry point of `servers_with_facts`; see lib/puppet/functions/servers_with_facts.rb.
  @return [Array[Hash]] what `servers_with_facts` returns.
DOC
  call_function('servers_with_facts', args)
end
