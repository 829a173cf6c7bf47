# frozen_string_literal: true

# What the stack specs read back from a test node's own files: its puppet runs
# (runs.log, written by spec/fixtures/kick_e2e/run-puppet) and its puppet log.
# The including spec defines `node_file(id, name)` and sets `@runs_before` and
# `@log_before` (per node: runs and log bytes before the current scenario).
module NodeRuns
  # Runs from runs.log: start/end lines, in order (a server runs one at a time).
  def all_runs(id)
    path = node_file(id, 'runs.log')
    return [] unless File.exist?(path)

    File.readlines(path).each_with_object([]) do |line, runs|
      kind, at, _host, *rest = line.split
      if kind == 'start'
        runs << { start: at.to_f, options: rest.join(' '), kicked: rest.include?('--no-splay') }
      elsif kind == 'end' && runs.last
        runs.last.merge!(end: at.to_f, rc: Integer(rest.first.delete_prefix('rc=')))
      end
    end
  end

  # This scenario's runs of `id`.
  def runs(id)
    all_runs(id).drop(@runs_before[id])
  end

  # What `id`'s puppet runs logged in this scenario, without Facter's noise about
  # /proc/1/environ (a sandbox that hides it).
  def log_since(id)
    path = node_file(id, 'puppet.log')
    return '' unless File.exist?(path)

    text = File.binread(path)[(@log_before || {}).fetch(id, 0)..] || ''
    text.force_encoding('UTF-8').lines.reject { |l| l.include?('Facter: Permission denied') }.join
  end
end
