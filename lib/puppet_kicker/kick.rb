# frozen_string_literal: true

require 'json'

module PuppetKicker
  # Finds the kicks in a Puppet report, for PuppetKicker.process_report. Ruby 2.6 syntax: puppetserver runs this.
  module Kicks
    # `kick -> haproxy`, `kick->haproxy`, `kick -> web, db`, `kick -> /^web/`
    NOTIFY_TITLE = /\A\s*kick\s*->\s*(.*?)\s*\z/m.freeze
    # What a refreshed Kick resource logs; the report keeps it with the resource.
    LOG_PREFIX = 'puppet-kicker kick: '

    module_function

    # Kicks as the core's wire format expects them: an Array of Hashes.
    def from_report(report)
      kicks = []
      report.resource_statuses.each_value do |status|
        case status.resource_type
        when 'Notify'
          kick = notify_kick(status)
        when 'Kick'
          kick = refreshed_kick(report, status)
        else
          next
        end
        kicks << kick if kick
      end
      kicks
    end

    # The original's form: a changed Notify titled `kick -> ROLES`. A notify changes
    # on every run, so this kicks on every run; the `kick` type does not.
    def notify_kick(status)
      match = NOTIFY_TITLE.match(status.title.to_s)
      return nil unless match && status.changed && status.events.any? { |e| e.status.to_s == 'success' }

      roles = roles_from(match[1])
      roles.empty? ? nil : { 'resource' => "Notify[#{status.title}]", 'roles' => roles }
    end

    # A Kick resource fires only when refreshed; its parameters are in its log line.
    def refreshed_kick(report, status)
      refreshed = status.events.any? { |e| e.name.to_s == 'refresh' && e.status.to_s == 'success' }
      return nil unless status.changed && refreshed

      suffix = "Kick[#{status.title}]"
      line = report.logs.reverse_each.find do |log|
        log.source.to_s.end_with?(suffix) && log.message.to_s.start_with?(LOG_PREFIX)
      end
      return nil unless line

      params = JSON.parse(line.message.to_s[LOG_PREFIX.length..])
      { 'resource' => suffix }.merge(params.select { |k, _| %w[roles facts environment].include?(k) })
    rescue JSON::ParserError
      nil
    end

    # `/regex/` is one role (it may contain commas); otherwise a comma-separated list.
    def roles_from(text)
      return [text] if text.length >= 2 && text.start_with?('/') && text.end_with?('/')

      text.split(',').map(&:strip).reject(&:empty?)
    end

    # `pid`: masterless, this process, whose run holds the host's agent lock until it
    # exits (a kick of the host waits for that).
    def payload(report, kicks, pid: nil)
      fields = {
        'host' => report.host.to_s,
        'environment' => report.environment.to_s,
        'time' => (report.time.to_f * 1000).to_i,
        'noop' => report.noop ? true : false,
        'kicks' => kicks,
      }
      fields['pid'] = pid if pid
      # changed, unchanged or failed: confirms a kick of this host (absent before
      # Puppet has computed it).
      fields['status'] = report.status.to_s if report.status
      JSON.generate(fields)
    end
  end
end
