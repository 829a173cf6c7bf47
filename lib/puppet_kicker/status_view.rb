# frozen_string_literal: true

require 'time'

module PuppetKicker
  # What `puppet kicker status` and `refresh` show people of the core's answers
  # (src/command/status.rs, refresh.rs): aligned "key: value" lines, times in UTC
  # with their age, durations and sizes read at a glance.
  module StatusView
    class << self
      # A non-negative whole number of seconds given as `option`, or nil when not given.
      def seconds(value, option)
        return nil if value.nil?
        raise QueryError, "puppet kicker: #{option} takes whole seconds (0 or more), not #{value.inspect}" \
          unless value.to_s.match?(/\A\d{1,15}\z/)

        Integer(value.to_s, 10)
      end

      # The status answer as "key: value" lines.
      def status(answer)
        now = answer['now_ms']
        lines = [['source', answer['source_description']],
                 ['index', index(answer['index'], now)],
                 ['memory', size(answer['index']['bytes'])],
                 ['snapshot', snapshot(answer['index']['snapshot'])],
                 ['last refresh', last_refresh(answer, now)],
                 ['backoff', backoff(answer['backoff'], now)],
                 ['kicks', kicks(answer['kicks'])],
                 ['helper', helper(answer['helper'])],]
        lines << ['max age', max_age(answer)] if answer['max_age_seconds']
        aligned(lines)
      end

      # A finished refresh in one line: the counts, the servers and the time taken.
      def refreshed(answer)
        record = answer['refresh']
        how = record['outcome'] == 'adopted' ? 'taken from the refresh another process just ran' : 'done'
        "Refresh #{how}: #{plural(record['servers'], 'server')} " \
          "(#{counts(record)}) in #{duration(record['duration_ms'])}"
      end

      # The progress line of a refresh still running.
      def progress(answer)
        "Refreshing: #{plural(answer['servers_read'], 'server')} read, #{duration(answer['elapsed_ms'])}"
      end

      def counts(record)
        "#{record['added']} added, #{record['changed']} changed, #{record['dropped']} dropped"
      end

      # 850ms, 2.3s, 4m 05s, 3h 02m, 2d 05h.
      def duration(millis)
        return "#{millis}ms" if millis < 1000
        return format('%.1fs', millis / 1000.0) if millis < 60_000

        s = millis / 1000
        return format('%dm %02ds', s / 60, s % 60) if s < 3600
        return format('%dh %02dm', s / 3600, s % 3600 / 60) if s < 86_400

        format('%dd %02dh', s / 86_400, s % 86_400 / 3600)
      end

      def size(bytes)
        return "#{bytes} bytes" if bytes < 1024

        units = %w[KiB MiB GiB TiB]
        value = bytes / 1024.0
        unit = units.shift
        while value >= 1024 && units.any?
          value /= 1024
          unit = units.shift
        end
        format('%.1f %s', value, unit)
      end

      private

      def aligned(lines)
        width = lines.map { |key, _| key.length }.max + 1
        lines.map { |key, value| "#{"#{key}:".ljust(width)}  #{value}" }.join("\n")
      end

      def at(millis, now)
        return 'never' unless millis

        ago = now - millis
        relative = ago >= 0 ? "#{duration(ago)} ago" : "in #{duration(-ago)}"
        "#{Time.at(millis / 1000).utc.iso8601} (#{relative})"
      end

      def index(index, now)
        return 'no data' if index['servers'].zero?

        "#{plural(index['servers'], 'server')}, generation #{index['generation']}, built #{at(index['built_at_ms'], now)}"
      end

      def snapshot(snapshot)
        bytes = snapshot['bytes']
        "#{snapshot['path']} (#{bytes ? size(bytes) : 'none yet'})"
      end

      def last_refresh(answer, now)
        record = answer['last_refresh']
        unreadable = answer['last_refresh_unreadable']
        return unreadable ? "unknown (#{unreadable})" : 'none recorded' unless record

        took = "in #{duration(record['duration_ms'])}"
        head = "#{record['outcome']}, #{at(record['finished_ms'], now)} #{took}, pid #{record['pid']}"
        record['outcome'] == 'failed' ? "#{head}: #{record['error']}" : "#{head}: #{counts(record)}"
      end

      def backoff(backoff, now)
        return 'none' if backoff['failures'].zero?

        retry_at = backoff['retry_at_ms']
        after = retry_at ? ", no refresh before #{at(retry_at, now)}" : ''
        "#{plural(backoff['failures'], 'failure')} in a row#{after}"
      end

      def kicks(kicks)
        return 'none recorded' unless kicks
        return "unknown (#{kicks['unreadable']})" if kicks['unreadable']

        s = kicks['summary']
        "#{s['pending']} pending (#{s['in_flight']} in flight), #{s['follow_ups']} follow-ups, " \
          "#{s['running']} running; recently #{s['recent_started']} started, #{s['recent_failed']} failed; " \
          "#{plural(s['loops'], 'loop')} suppressed; runs reported #{s['recent_confirmed'].to_i} confirmed, " \
          "#{s['recent_run_failed'].to_i} failed, #{s['recent_unconfirmed'].to_i} unconfirmed, " \
          "#{s['awaiting_confirmation'].to_i} awaited"
      end

      def helper(helper)
        return 'none running' unless helper

        waiting = Array(helper['waiting_for'])
        "pid #{helper['pid']}, until #{Time.at(helper['ends_by'].to_i).utc.iso8601}" \
          "#{waiting.empty? ? '' : ", waiting for: #{waiting.join('; ')}"}"
      end

      def max_age(answer)
        limit = "#{answer['max_age_seconds']}s"
        age = answer['index']['age_ms']
        return "#{limit}: no data (exit #{answer['exit_code']})" unless age
        return "#{limit}: exceeded, the data is #{duration(age)} old (exit #{answer['exit_code']})" if answer['stale']

        "#{limit}: fresh"
      end

      def plural(count, noun)
        "#{count} #{count == 1 ? noun : "#{noun}s"}"
      end
    end
  end
end
