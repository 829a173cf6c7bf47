# frozen_string_literal: true

require_relative '../../puppet_kicker'

Puppet::Reports.register_report(:kick) do
  desc <<-DESC
    Makes the servers a run kicked run Puppet, through `kick.transport`: mcollective's
    or Choria's `puppet#runonce` in the collective named after the environment, or
    the system's `ssh`. A kick is a `kick` resource that was
    refreshed, or (as in the original puppet-kicker) a changed `notify` titled
    `kick -> ROLE`. Coalesced, retried, loop-safe and persisted; see the README.
    Enable with `reports = log, kick` in puppet.conf.
  DESC

  def process
    PuppetKicker.process_report(self)
  rescue PuppetKicker::Error => e
    Puppet.err("puppet-kicker: report from #{host} not processed: #{e.message}")
  end
end
