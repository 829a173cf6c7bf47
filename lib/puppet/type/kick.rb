# frozen_string_literal: true

require 'json'

Puppet::Type.newtype(:kick) do
  @doc = <<-DOC
    @summary Makes other servers run Puppet when something here really changed.

    A `kick` does nothing by itself. When refreshed (`notify => Kick[...]`, `~>`),
    the `kick` report processor makes the servers it selects run Puppet, through
    mcollective, Choria or SSH (`kick.transport`). Unlike `notify { 'kick -> haproxy': }`, which changes on every run,
    dependents run only when something changed. Nothing is kicked under `--noop`.

    @example Refresh the load balancers when this node's service config changes
      file { '/etc/myapp.conf': content => ..., notify => Kick['load balancers'] }
      kick { 'load balancers': role => 'haproxy' }

    @example Select the servers with a query
      kick { 'db replicas': facts => ['role=db', 'db_replica=true'] }
  DOC

  newparam(:name, namevar: true) do
    desc 'A name for this kick.'
  end

  newparam(:role, array_matching: :all) do
    desc 'Role(s) of the servers to kick: the value of their `role` fact, or `/regex/`.'
    validate do |value|
      Array(value).each do |role|
        raise ArgumentError, "role must be a non-empty String, not #{role.inspect}" unless role.is_a?(String) && !role.strip.empty?
      end
    end
  end

  newparam(:facts, array_matching: :all) do
    desc 'Clauses selecting the servers to kick, as in `servers_with_facts`, e.g. `role=db`.'
    validate do |value|
      Array(value).each do |clause|
        raise ArgumentError, "facts must be clauses like 'role=db', not #{clause.inspect}" unless clause.is_a?(String) && clause =~ /[=<>~]/
      end
    end
  end

  newparam(:environment) do
    desc "The environment of the servers to kick; this run's by default."
  end

  validate do
    raise Puppet::Error, "Kick[#{self[:name]}]: set exactly one of role and facts" if self[:role].nil? == self[:facts].nil?
  end

  # Called by Puppet when this resource is notified. The report processor reads this
  # line back from the report, so it carries the parameters as JSON.
  def refresh
    data = { 'roles' => self[:role] && Array(self[:role]), 'facts' => self[:facts] && Array(self[:facts]), 'environment' => self[:environment] }
    notice("puppet-kicker kick: #{JSON.generate(data.compact)}")
  end
end
