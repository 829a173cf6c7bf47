# frozen_string_literal: true

# What the stack specs read back from a test node's own files: its puppet runs
# (runs.log, written by spec/fixtures/kick_e2e/run-puppet), whether one is running,
# and its puppet log; and waiting for any of it; and a command run from the checkout
# (`sh`), for the scripts that start and stop parts of the stack. The including spec sets `@stack`
# (script/mco-stack's directory), `@runs_before` and `@log_before` (per node: runs
# and log bytes before the current scenario), and defines `longest_wait` (seconds).
require 'open3'

module NodeRuns
  def node_file(id, name)
    File.join(@stack, 'nodes', id, name)
  end

  # A file's text, or a line saying it is missing (for failure dumps).
  def read(path)
    File.exist?(path) ? File.read(path) : "(no #{path})"
  end

  # Runs `cmd` in the checkout; its output. A failure raises, with the output, unless
  # `allow_fail`.
  def sh(*cmd, allow_fail: false, env: {})
    out, status = Open3.capture2e(env, *cmd, chdir: ROOT)
    raise "#{cmd.join(' ')} failed (#{status}):\n#{out}" unless allow_fail || status.success?

    out
  end

  # The block's first truthy answer, asked every 0.2 s; an error after `timeout` s.
  def wait_for(what, timeout = longest_wait)
    deadline = Time.now + timeout
    until (result = yield)
      raise "timed out after #{timeout}s waiting for #{what}" if Time.now > deadline

      sleep 0.2
    end
    result
  end

  # A run holds the agent's lock file (with its pid) from the runonce until it ends.
  def running?(id)
    pid = Integer(File.read(node_file(id, 'agent_catalog_run.lock')).strip)
    Process.kill(0, pid)
    true
  rescue Errno::ENOENT, Errno::ESRCH, ArgumentError
    false
  end

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
