# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'
require_relative '../../../puppet_kicker/status_view'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:refresh) do
    summary 'Refresh the index from the fact source now.'
    description <<-DESCRIPTION
      Reads the fact source now, as the background refresh does, swaps in the new
      index and writes the snapshot every process sharing the cache dir reads; then
      prints the servers, how many were added, changed and dropped, and the time it
      took. When another process is refreshing the same cache dir, this one waits
      for it and takes its result.

      The refresh always runs to its end before the command exits: one merely
      queued would die with this short-lived process, and the masterless helper
      refreshes only an index older than `cache.ttl`. `--wait` adds, on a terminal,
      a progress line with the servers read so far.

      A failed refresh exits 1 with the source's reason (the directory or URL and
      what went wrong); the last index keeps serving.
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker refresh
      $ puppet kicker refresh --wait
      $ puppet kicker refresh --render-as json
    EXAMPLES
    returns 'The refresh record: outcome, servers, added, changed, dropped, duration_ms (with --render-as json or yaml).'

    option '--wait' do
      summary 'On a terminal, show the servers read so far while the refresh runs.'
    end

    # (|*args|: Puppet's wrapper passes the options last, and needs arity -1 for that.)
    when_invoked do |*args|
      options = args.pop
      ticket = PuppetKicker.command('refresh')['ticket']
      shown = options[:wait] && $stdout.tty?
      begin
        loop do
          answer = PuppetKicker.command('refresh_progress', 'ticket' => ticket, 'wait_ms' => 200)
          break answer if answer['done']

          $stdout.print("\r#{PuppetKicker::StatusView.progress(answer)}\e[K") if shown
          $stdout.flush if shown
        end
      ensure
        $stdout.print("\r\e[K") if shown
      end
    end

    # Machine output: the record of the refresh, as status shows it.
    %i[json yaml].each do |format|
      when_rendering(format) { |answer| answer['refresh'] }
    end

    when_rendering :console do |answer|
      PuppetKicker::StatusView.refreshed(answer)
    end
  end
end
