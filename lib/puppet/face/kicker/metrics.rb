# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:metrics) do
    summary 'The index and the kicks as Prometheus metrics, for node_exporter\'s textfile collector.'
    description <<-DESCRIPTION
      Prints, in Prometheus's text format, the figures `status` shows: the index's
      servers, age (+Inf with no data), memory and snapshot size; refresh failures in
      a row, whether the last refresh succeeded, its duration and time; kicks pending,
      and the counters of kicks sent, failed and suppressed. The same metrics every
      time, in the same order. Like `status`, it answers offline, from the snapshot.

      With `--textfile PATH` (a `.prom` file in node_exporter's
      `--collector.textfile.directory`) it writes them there instead, atomically (a
      temporary file in the same directory, then a rename), readable by all, and
      prints nothing: run it from cron or a systemd timer.
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker metrics
      $ puppet kicker metrics --textfile /var/lib/prometheus/node-exporter/puppet_kicker.prom
    EXAMPLES
    returns 'The metrics, as Prometheus text.'

    option '--textfile PATH' do
      summary 'Write them atomically to this .prom file, for node_exporter, and print nothing.'
    end

    when_invoked do |*args|
      options = args.pop
      text = PuppetKicker.command('metrics')['text']
      next text unless options[:textfile]

      PuppetKicker::Face.write_textfile(options[:textfile], text)
      nil
    end
  end
end
