# frozen_string_literal: true

require_relative '../../puppet_kicker'

# @summary
#   Returns the first server of a role (in `fqdn` order), or a default when there is none.
#
# @example One haproxy server, or a stand-in
#   $lb = server_with_role('haproxy', { 'hostname' => 'localhost', 'ipaddress' => '127.0.0.1' })
Puppet::Functions.create_function(:server_with_role) do
  # @param role
  #   The value of the server's `role` fact: a name, `/regex/`, or a list meaning any of them.
  # @param default
  #   What to return when no server has the role.
  # @return [Any] The server's facts (plus `certname`), or `default`.
  dispatch :server_with_role do
    param 'Variant[String[1], Array[String[1], 1]]', :role
    optional_param 'Any', :default
  end

  def server_with_role(role, default = nil)
    PuppetKicker::Functions.server_with_role(closure_scope, role, default)
  end
end
