# frozen_string_literal: true

require 'fileutils'
require 'json'
require 'open3'
require 'yaml'
require_relative 'node_runs'

# Masterless, for real (issue 9): only `puppet apply` processes, each exiting when its
# run ends, against the mcollective test stack of script/mco-stack (RabbitMQ and four
# mcollectived whose `runonce` runs spec/fixtures/kick_e2e/run-puppet, a real
# `puppet apply --reports kick`). What a process leaves undone at exit (a refresh, a
# retry, a follow-up) is finished by the helper it spawns.
#
# Run by script/test-masterless, which starts the stack (its own ports and directory)
# and sets PK_MASTERLESS_STACK_DIR.
# The constants' namespace.
module Masterless
  RSpec.describe 'masterless: refreshes and pending kicks complete without a master', order: :defined do
    include NodeRuns

    stack = ENV.fetch('PK_MASTERLESS_STACK_DIR') { raise 'PK_MASTERLESS_STACK_DIR is not set: run script/test-masterless' }

    NODE1 = 'node1.example.com'
    NODE2 = 'node2.example.com'
    LB1 = 'lb1.example.com'
    WEB1 = 'web1.staging.example.com'
    SERVERS = [NODE1, NODE2, LB1, WEB1].freeze
    WAIT = Integer(ENV.fetch('PK_MASTERLESS_WAIT', '150'))
    QUIET = Integer(ENV.fetch('PK_MASTERLESS_QUIET', '12'))
    DISCOVERY_TIMEOUT = 2
    TTL = 2

    before(:all) do
      @stack = stack
      @e2e = File.join(stack, 'kick_e2e')
      @client_cfg = File.join(stack, 'client.cfg')
      FileUtils.rm_rf(@e2e)
      FileUtils.mkdir_p(%w[manifests slow out cache modules/kicker].map { |d| File.join(@e2e, d) })
      %w[lib native templates metadata.json].each { |f| FileUtils.cp_r(File.join(ROOT, f), File.join(@e2e, 'modules', 'kicker')) }
      @times = []
      @scenarios = []
    end

    after(:all) do
      warn "masterless timings: #{@times.join('; ')}" if @times && !@times.empty?
    end

    after do |example|
      release_held_run
      next unless example.exception && @stack

      warn "\n===== masterless failure: #{example.description}"
      SERVERS.each do |id|
        warn "----- #{id} runs.log:\n#{read(node_file(id, 'runs.log'))}"
        warn "----- #{id} puppet.log (this scenario):\n#{log_since(id)}"
        warn "----- #{id} mcollectived.log (tail):\n#{tail(node_file(id, 'mcollectived.log'), 15)}"
      end
      if @scenario
        warn "----- helper.log:\n#{tail(File.join(cache_dir, 'helper.log'), 80)}"
        warn "----- kick-status.json:\n#{read(File.join(cache_dir, 'kick-status.json'))}"
      end
      warn "----- mco-stack status:\n#{sh('script/mco-stack', 'status', allow_fail: true)}"
    end

    def tail(path, lines)
      File.exist?(path) ? File.readlines(path).last(lines).join : "(no #{path})"
    end

    def longest_wait
      WAIT
    end

    def cache_dir
      File.join(@e2e, 'cache', @scenario)
    end

    # A scenario: its own cache dir, manifests and counts from here on. Default kick
    # settings; the fact source as a masterless operator would set it up.
    # Each example is a new object: what ran before is in @scenarios (before(:all)).
    # The previous scenario must have settled (its helper done, its kicks delivered)
    # before this one counts runs, even when its example failed.
    def scenario(name, node_pp:, haproxy_pp:)
      settle! if (@scenario = @scenarios.last)
      @scenarios << name
      @scenario = name
      @t0 = Time.now.to_f
      File.write(File.join(@e2e, 'puppet_kicker.yaml'), {
        'source' => 'mcollective',
        'mcollective' => { 'client_config' => @client_cfg, 'discovery_timeout' => DISCOVERY_TIMEOUT },
        'cache' => { 'dir' => cache_dir, 'ttl' => TTL },
      }.to_yaml)
      File.write(File.join(@e2e, 'manifests', 'node.pp'), node_pp)
      File.write(File.join(@e2e, 'manifests', 'haproxy.pp'), haproxy_pp)
      @runs_before = SERVERS.to_h { |id| [id, all_runs(id).size] }
      @log_before = SERVERS.to_h { |id| [id, File.size?(node_file(id, 'puppet.log')).to_i] }
    end

    def kick_status
      JSON.parse(File.read(File.join(cache_dir, 'kick-status.json')))
    rescue Errno::ENOENT, JSON::ParserError
      {}
    end

    def runonce(id)
      out = sh('mco', 'rpc', 'puppet', 'runonce', '-I', id, '--dt', '1', '--config', @client_cfg, '--json')
      replies = JSON.parse(out)
      expect(replies.map { |r| [r['sender'], r['statuscode']] }).to eq([[id, 0]]), "runonce #{id}: #{out}"
    end

    # One `puppet apply` of `id` run here, as cron would run it (not through mco).
    def apply(id)
      env = { 'PK_PUPPET_IDENTITY' => id, 'PK_PUPPET_STATEDIR' => File.join(@stack, 'nodes', id),
              'PK_PUPPET_OPTIONS' => '--cron', }
      sh(File.join(ROOT, 'spec/fixtures/kick_e2e/run-puppet'), env: env)
    end

    def helper_pid
      status = kick_status
      status['helper'] && status['helper']['pid']
    end

    # From helper.json (never by trying helper.lock: a helper starting meanwhile would
    # find it held and exit).
    def helper_alive?
      pid = JSON.parse(File.read(File.join(cache_dir, 'helper.json')))['pid']
      Process.kill(0, pid)
      true
    rescue Errno::ENOENT, Errno::ESRCH, JSON::ParserError, TypeError
      false
    end

    # No run, no helper, nothing pending or running.
    def idle?
      status = kick_status
      SERVERS.none? { |id| running?(id) } && !helper_alive? &&
        Array(status['pending']).empty? && Array(status['running']).empty?
    end

    # Ends a run held by `hold` (see run-puppet), also when an example failed first.
    def release_held_run
      File.write(File.join(@e2e, 'slow', "#{@held}.release"), '') if @held
      @held = nil
    end

    def settle!
      wait_for('every run and the helper to end, no kick pending') { idle? }
      counts = SERVERS.map { |id| all_runs(id).size }
      sleep QUIET
      expect(SERVERS.map { |id| all_runs(id).size }).to eq(counts), 'a run started after the system had settled'
      expect(idle?).to be(true)
    end

    def ago(t)
      format('%.1f s', t - @t0)
    end

    # ---------------------------------------------------------------- scenarios

    it 'broker down, a fact changed, broker back: a new apply soon sees the changed fact' do
      scenario('refresh', node_pp: '', haproxy_pp: <<~'PUPPET')
        $out = $facts['kick_e2e_out']
        $marked = servers_with_facts('pk_marker=changed').map |$s| { $s['certname'] }
        file { $out: ensure => directory }
        file { "${out}/marked.txt": ensure => file, content => "${join(sort($marked), ',')}\n" }
      PUPPET
      marked = -> { File.read(File.join(@e2e, 'out', LB1, 'marked.txt')).strip rescue nil } # rubocop:disable Style/RescueModifier
      apply(LB1) # the cold start
      expect(marked.call).to eq('')
      snapshot = File.join(cache_dir, 'index.msgpack')
      expect(File.exist?(snapshot)).to be(true)

      sh('script/mco-stack', 'down', 'broker')
      File.open(node_file(NODE2, 'facts.yaml'), 'a') { |f| f.puts 'pk_marker: changed' }
      3.times do
        sleep TTL
        apply(LB1)
        expect(marked.call).to eq(''), 'the broker is down: the old snapshot answers'
      end
      sh('script/mco-stack', 'up', 'broker')
      back = Time.now.to_f
      deadline = back + TTL + DISCOVERY_TIMEOUT + 10
      seen_by = nil
      applies = 0
      until seen_by
        started = Time.now.to_f
        raise "no apply started within #{format('%.1f', deadline - back)} s of the broker's return saw the changed fact" if started > deadline

        apply(LB1)
        applies += 1
        seen_by = started if marked.call == NODE2
      end
      helper_refreshes = read(File.join(cache_dir, 'helper.log')).scan(/refresh done: 4 servers/).size
      @times << "refresh: an apply started #{format('%.1f', seen_by - back)} s after the broker came back saw the fact " \
                "(#{applies} apply run(s); bound #{TTL + DISCOVERY_TIMEOUT + 10} s; #{helper_refreshes} helper refresh(es))"
    end

    it 'a kick during a kicked run of a busy load balancer gives it exactly one follow-up run' do
      scenario('follow-up', haproxy_pp: '', node_pp: <<~'PUPPET')
        notify { 'kick -> haproxy': }
      PUPPET
      # lb1's kicked run sleeps 25 s before applying: node2's kick arrives meanwhile.
      File.write(File.join(@e2e, 'slow', LB1), "25\n")
      runonce(NODE1)
      wait_for("#{LB1}'s kicked run to start") { runs(LB1).first }
      runonce(NODE2)
      wait_for("#{NODE2}'s run to end") { runs(NODE2).first&.key?(:end) }
      expect(runs(LB1).first).not_to have_key(:end), "#{LB1}'s kicked run ended before #{NODE2}'s report"
      expect(log_since(NODE2)).to include('lb1.example.com is running a kicked run; one follow-up run queued')
      wait_for("#{LB1}'s follow-up run to end") { runs(LB1)[1]&.key?(:end) }
      settle!

      expect(SERVERS.to_h { |id| [id, runs(id).size] }).to eq(NODE1 => 1, NODE2 => 1, LB1 => 2, WEB1 => 0)
      first, follow_up = runs(LB1)
      expect([first[:kicked], follow_up[:kicked]]).to eq([true, true])
      expect(follow_up[:start]).to be >= first[:end]
      expect(SERVERS.flat_map { |id| runs(id) }.map { |r| r[:rc] }).to all(eq(0))
      started = kick_status['recent_outcomes'].select { |o| o['result'] == 'started' }.map { |o| o['target'] }
      expect(started).to eq([LB1, LB1])
      @times << "follow-up: lb1's follow-up run started #{format('%.1f', follow_up[:start] - first[:end])} s after its kicked run ended"
    end

    it 'a helper killed with SIGKILL while a kick is due: the kick is delivered after the next apply, once' do
      scenario('sigkill', haproxy_pp: '', node_pp: <<~'PUPPET')
        if $facts['fqdn'] =~ /^node1/ { notify { 'kick -> haproxy': } }
      PUPPET
      # lb1 is busy with a long run of its own, held until the test releases it:
      # node1's kick is refused and retried (30 s, then 60 s later).
      File.write(File.join(@e2e, 'slow', LB1), "hold\n")
      @held = LB1
      runonce(LB1)
      wait_for("#{LB1}'s long run to start") { runs(LB1).first }
      runonce(NODE1)
      wait_for("#{NODE1}'s run to end") { runs(NODE1).first&.key?(:end) }
      pid = wait_for('the helper to show its pid in kick-status.json') { helper_alive? && helper_pid }
      expect(pid).to eq(JSON.parse(File.read(File.join(cache_dir, 'helper.json')))['pid'])
      # While it refreshes the stale index first, the helper says it waits for
      # "refresh"; on a loaded machine that takes seconds. Then it lists the kick.
      status = wait_for('the helper to list the kick it waits for') do
        current = kick_status
        current if current.dig('helper', 'waiting_for').to_a.join(' ').match?(/kick of lb1\.example\.com/)
      end
      expect(status['helper']['pid']).to eq(pid)
      expect(status['pending'].map { |p| p['target'] }).to eq([LB1])
      Process.kill('KILL', pid)
      wait_for('the killed helper to be gone') { !helper_alive? }
      expect(kick_status['pending'].map { |p| p['target'] }).to eq([LB1]), 'the pending kick survived'

      runonce(NODE2) # the next apply; node2 kicks nobody
      wait_for("#{NODE2}'s run to end") { runs(NODE2).first&.key?(:end) }
      release_held_run # lb1's own run may end now
      wait_for("#{LB1}'s kicked run to end", 2 * WAIT) { runs(LB1)[1]&.key?(:end) }
      settle!
      expect(SERVERS.to_h { |id| [id, runs(id).size] }).to eq(NODE1 => 1, NODE2 => 1, LB1 => 2, WEB1 => 0)
      expect(runs(LB1).map { |r| r[:kicked] }).to eq([false, true])
      expect(runs(LB1)[1][:start]).to be > runs(NODE2).first[:start]
      started = kick_status['recent_outcomes'].select { |o| o['result'] == 'started' }.map { |o| o['target'] }
      expect(started).to eq([LB1])
    end

    it 'a server kicking its own role runs once: it has just run, so its kick leaves it out' do
      scenario('self', node_pp: '', haproxy_pp: <<~'PUPPET')
        notify { 'kick -> haproxy': }
      PUPPET
      runonce(LB1)
      wait_for("#{LB1}'s run to end") { runs(LB1).first&.key?(:end) }
      settle!
      expect(SERVERS.to_h { |id| [id, runs(id).size] }).to eq(NODE1 => 0, NODE2 => 0, LB1 => 1, WEB1 => 0)
      expect(log_since(LB1)).to include('Notify[kick -> haproxy] from lb1.example.com does not kick lb1.example.com itself: it has just run')
      expect(kick_status['pending']).to be_empty
    end
  end
end
