# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'
require_relative '../../../puppet_kicker/status_view'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:status) do
    summary 'How fresh the index is, how the last refresh went, what the kicks do.'
    description <<-DESCRIPTION
      Shows the index as it is (source, generation, servers, age, memory, snapshot),
      the last refresh any process sharing the cache dir recorded (its outcome,
      counts and duration), the backoff after failed refreshes, the kicks (pending,
      in flight, running, recent outcomes, loops) and the masterless helper. It never
      refreshes nor waits on the source: it answers offline, from the snapshot.

      With `--max-age SECONDS` it is a monitoring check: exit code 2 when the data
      is older than that, or there is none; 0 otherwise. The output is printed
      either way. `--render-as json` or `yaml` gives every figure (times in Unix
      milliseconds, sizes in bytes).
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker status
      $ puppet kicker status --max-age 3600 || echo stale
      $ puppet kicker status --render-as json
    EXAMPLES
    returns 'The status, as a Hash (with --render-as json or yaml).'

    option '--max-age SECONDS' do
      summary 'Exit with code 2 when the data is older than this many seconds, or there is none.'
    end

    # (|*args|: Puppet's wrapper passes the options last, and needs arity -1 for that.)
    when_invoked do |*args|
      options = args.pop
      answer = PuppetKicker.command('status', 'max_age' => PuppetKicker::StatusView.seconds(options[:max_age], '--max-age'))
      PuppetKicker::Face.exit_code = answer['exit_code'] if answer['exit_code'].positive?
      answer
    end

    when_rendering :console do |answer|
      PuppetKicker::StatusView.status(answer)
    end
  end
end
