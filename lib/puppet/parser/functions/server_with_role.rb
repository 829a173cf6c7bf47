# frozen_string_literal: true

# For ERB templates written for the original puppet-kicker, which call
# `scope.function_server_with_role([...])`. Manifests, EPP and `scope.call_function`
# reach the modern function in lib/puppet/functions, which this delegates to.
Puppet::Parser::Functions.newfunction(:server_with_role, type: :rvalue, arity: -2, doc: <<-DOC) do |args|
  Legacy entry point of `server_with_role`; see lib/puppet/functions/server_with_role.rb.
  @return [Any] what `server_with_role` returns: a server's facts, or the default.
DOC
  call_function('server_with_role', args)
end
