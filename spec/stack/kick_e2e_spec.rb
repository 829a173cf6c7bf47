# frozen_string_literal: true

require_relative 'kick_world'

# Kicks end to end, for real: the mcollective test stack of script/mco-stack, whose
# test `puppet` agent's `runonce` runs spec/fixtures/kick_e2e/run-puppet, a real
# masterless `puppet apply --reports kick` of the server's manifest (by its `role`
# fact) with this module. A report's kicks go through the `kick` processor to the
# core, which sends mcollective `runonce` to the targets; their runs report in turn.
#
# Run by script/test-kick-e2e, which starts the stack (its own ports and directory)
# and sets PK_KICK_E2E_STACK_DIR (spec/stack/ is not in the default rspec run).
# the constants' namespace
module KickE2E
  include KickWorld # its constants, for the examples below

  RSpec.describe 'kicks end to end: mcollective runonce of real puppet apply runs', order: :defined do
    include KickWorld

    stack = ENV.fetch('PK_KICK_E2E_STACK_DIR') { raise 'PK_KICK_E2E_STACK_DIR is not set: run script/test-kick-e2e' }

    before(:all) do
      @stack = stack
      @e2e = File.join(stack, 'kick_e2e')
      @client_cfg = File.join(stack, 'client.cfg')
      prepare_world
    end

    after(:all) do
      warn "kick e2e timings: #{@times.join('; ')}" if @times && !@times.empty?
    end

    after do |example|
      next unless example.exception && @stack

      dump_failure(example)
      warn "----- mco-stack status:\n#{sh('script/mco-stack', 'status', allow_fail: true)}"
    end

    # The facts come from the stack's mcollectived, and so do the kicks.
    def kicker_settings(_name)
      { 'source' => 'mcollective', 'mcollective' => { 'client_config' => @client_cfg, 'discovery_timeout' => 1 } }
    end

    # `mco rpc puppet runonce` of one server, as an operator would (no force: the run's
    # options have no --no-splay, unlike the kicker's runonce with force=true).
    def runonce(id)
      out = sh('mco', 'rpc', 'puppet', 'runonce', '-I', id, '--dt', '1', '--config', @client_cfg, '--json')
      replies = JSON.parse(out)
      expect(replies.map { |r| [r['sender'], r['statuscode']] }).to eq([[id, 0]]), "runonce #{id}: #{out}"
    end

    # ---------------------------------------------------------------- scenarios

    it 'a new node runs Puppet, kicks the load balancer, whose run lists it in haproxy.cfg' do
      # The node's config change refreshes a `kick`: it kicks only when something changed.
      scenario('seed', haproxy_pp: '', node_pp: NODE_PP)
      # Before: node1 does not exist yet; the load balancer lists node2 only.
      sh('script/mco-stack', 'down', NODE1)
      runonce(LB1)
      wait_for("#{LB1}'s first run") { runs(LB1).first&.key?(:end) }
      expect(runs(LB1).first[:rc]).to eq(0), log_since(LB1)
      expect(haproxy_servers).to eq([HAPROXY_LINE['node2', '127.0.0.12']])

      # node1 appears and runs Puppet.
      sh('script/mco-stack', 'up', NODE1)
      kicked_at = Time.now.to_f
      runonce(NODE1)
      wait_for("#{LB1}'s kicked run to end") { runs(LB1)[1]&.key?(:end) }
      settle!

      expect(runs(NODE1).size).to eq(1)
      expect(runs(LB1).size).to eq(2)
      expect(runs(NODE2) + runs(WEB1)).to eq([])
      node_run = runs(NODE1).first
      lb_run = runs(LB1).last
      expect([node_run[:rc], lb_run[:rc]]).to eq([0, 0])
      expect(lb_run[:kicked]).to be(true), "the kicked run's options: #{lb_run[:options]}"
      expect(lb_run[:start]).to be > node_run[:start]

      node_log = log_since(NODE1)
      expect(node_log).to include("Kick[load balancers]: Triggered 'refresh' from 1 event")
      expect(node_log).to include('Notice: puppet-kicker: kick queued for lb1.example.com (chain node1.example.com -> lb1.example.com)')
      expect(node_log).to include('Notice: puppet-kicker: kicked lb1.example.com: Puppet run started (attempt 1, chain node1.example.com -> lb1.example.com)')
      lb_log = log_since(LB1)
      expect(lb_log).to include('puppet-kicker: kicked run of lb1.example.com reported (chain node1.example.com -> lb1.example.com)')
      expect(lb_log).to match(%r{File\[.*/haproxy\.cfg\]/content: content changed})

      status = kick_status
      expect(status['recent_outcomes'].map { |o| o.values_at('target', 'result', 'chain') })
        .to eq([[LB1, 'started', 'node1.example.com -> lb1.example.com']])
      expect(status['pending'] + status['running']).to eq([])

      # The load balancer now lists the new node, in fqdn order.
      expect(haproxy_servers).to eq([HAPROXY_LINE['node1', '127.0.0.11'], HAPROXY_LINE['node2', '127.0.0.12']])
      timing("node1's runonce -> lb1's kicked run started after #{format('%.1f', lb_run[:start] - kicked_at)} s, " \
             "ended after #{format('%.1f', lb_run[:end] - kicked_at)} s; node1's run #{format('%.1f', node_run[:end] - node_run[:start])} s")

      # node1 again, nothing changed: the `kick` is not refreshed, nobody is kicked.
      runonce(NODE1)
      wait_for("#{NODE1}'s second run") { runs(NODE1)[1]&.key?(:end) }
      settle!
      expect(runs(NODE1).size).to eq(2)
      expect(runs(LB1).size).to eq(2)
      expect(log_since(NODE1).scan('kick queued').size).to eq(1)
    end

    it 'node kicks haproxy and haproxy kicks node: the loop is cut, logged, and the runs are counted' do
      # The original's form on both sides: a `kick -> ROLE` notify kicks on every run.
      scenario('cycle', node_pp: "notify { 'kick -> haproxy': }\n", haproxy_pp: "notify { 'kick -> node': }\n")
      sh('script/mco-stack', 'up', NODE1) # already up unless the first scenario failed early
      runonce(NODE1)
      # node1 (origin) -> lb1 (kicked) -> node2 (kicked by lb1; node1 is suppressed),
      # and node2's kick of lb1 is suppressed: three runs, then nothing.
      wait_for("#{NODE2}'s kicked run to end") { runs(NODE2).first&.key?(:end) }
      settle!

      counts = SERVERS.to_h { |id| [id, runs(id).size] }
      expect(counts).to eq(NODE1 => 1, NODE2 => 1, LB1 => 1, WEB1 => 0)
      expect(SERVERS.flat_map { |id| runs(id) }.map { |r| r[:rc] }).to all(eq(0))
      expect([runs(LB1).first[:kicked], runs(NODE2).first[:kicked]]).to eq([true, true])
      expect(runs(LB1).first[:start]).to be < runs(NODE2).first[:start]

      lb_log = log_since(LB1)
      expect(lb_log).to include('puppet-kicker: kicked run of lb1.example.com reported (chain node1.example.com -> lb1.example.com)')
      expect(lb_log).to include('Warning: puppet-kicker: kick cycle between roles: haproxy -> node -> haproxy')
      expect(lb_log).to include('Warning: puppet-kicker: kick of node1.example.com by lb1.example.com (Notify[kick -> node]) ' \
                                'suppressed: it would close a loop: node1.example.com -> lb1.example.com -> node1.example.com')
      expect(lb_log).to include('puppet-kicker: kicked node2.example.com: Puppet run started ' \
                                '(attempt 1, chain node1.example.com -> lb1.example.com -> node2.example.com)')
      node2_log = log_since(NODE2)
      expect(node2_log).to include('Warning: puppet-kicker: kick of lb1.example.com by node2.example.com (Notify[kick -> haproxy]) ' \
                                   'suppressed: it would close a loop: node1.example.com -> lb1.example.com -> node2.example.com -> lb1.example.com')

      status = kick_status
      expect(status['role_cycles']).to eq([%w[haproxy node haproxy]])
      expect(status['role_edges']).to contain_exactly(%w[haproxy node], %w[node haproxy])
      expect(status['recent_outcomes'].map { |o| o.values_at('target', 'result', 'chain') }).to eq([
                                                                                                     [LB1, 'started', 'node1.example.com -> lb1.example.com'],
                                                                                                     [NODE2, 'started',
                                                                                                      'node1.example.com -> lb1.example.com -> node2.example.com',],
                                                                                                   ])
      expect(status['pending'] + status['running']).to eq([])
      expect(haproxy_servers).to eq([HAPROXY_LINE['node1', '127.0.0.11'], HAPROXY_LINE['node2', '127.0.0.12']])
      last_end = SERVERS.flat_map { |id| runs(id) }.map { |r| r[:end] }.max
      timing("#{counts.values.sum} runs (node1 1, lb1 1, node2 1), settled #{ago(last_end)} after the first runonce, " \
             "then #{QUIET} s without a run")
    end

    it 'a node kicking its own role: one change runs each peer once and the node not again' do
      scenario('own-role', node_pp: "notify { 'kick -> node': }\n", haproxy_pp: '')
      sh('script/mco-stack', 'up', NODE1)
      runonce(NODE1)
      # node1 kicks role node: node2 only. node2's kicked run kicks role node too:
      # itself left out, node1 a loop. Two runs in all.
      wait_for("#{NODE2}'s kicked run to end") { runs(NODE2).first&.key?(:end) }
      settle!

      counts = SERVERS.to_h { |id| [id, runs(id).size] }
      expect(counts).to eq(NODE1 => 1, NODE2 => 1, LB1 => 0, WEB1 => 0)
      expect(runs(NODE2).first[:kicked]).to be(true)
      expect(runs(NODE2).first[:start]).to be > runs(NODE1).first[:start]
      expect(log_since(NODE1)).to include('Notice: puppet-kicker: Notify[kick -> node] from node1.example.com does not kick ' \
                                          'node1.example.com itself: it has just run')
      node2_log = log_since(NODE2)
      expect(node2_log).to include('Notice: puppet-kicker: Notify[kick -> node] from node2.example.com does not kick ' \
                                   'node2.example.com itself: it has just run')
      expect(node2_log).to include('suppressed: it would close a loop: node1.example.com -> node2.example.com -> node1.example.com')
      status = kick_status
      expect(status['recent_outcomes'].map { |o| o.values_at('target', 'result') }).to eq([[NODE2, 'started']])
      expect(status['pending'] + status['running']).to eq([])
      timing("node2 ran #{format('%.1f', runs(NODE2).first[:start] - runs(NODE1).first[:end])} s after node1's run ended; node1 once")
    end

    it 'a busy load balancer gets its kicked run after the run in progress' do
      scenario('busy', node_pp: "notify { 'kick -> haproxy': }\n", haproxy_pp: '')
      # lb1 starts a long run (12 s before it even applies) and holds its lock.
      File.write(File.join(@e2e, 'slow', LB1), "12\n")
      runonce(LB1)
      wait_for("#{LB1}'s long run to start") { runs(LB1).first }
      runonce(NODE1)
      wait_for("#{LB1}'s kicked run to end") { runs(LB1)[1]&.key?(:end) }
      settle!

      expect(runs(NODE1).size).to eq(1)
      busy, kicked = runs(LB1)
      expect(runs(LB1).size).to eq(2)
      expect([busy[:kicked], kicked[:kicked]]).to eq([false, true])
      expect([busy[:rc], kicked[:rc], runs(NODE1).first[:rc]]).to eq([0, 0, 0])
      expect(kicked[:start]).to be >= busy[:end]

      node_log = log_since(NODE1)
      expect(node_log).to include('Notice: puppet-kicker: kick queued for lb1.example.com (chain node1.example.com -> lb1.example.com)')
      # Refused while busy, retried (by node1's process while it waits to exit, by
      # lb1's own, or by the masterless helper a process leaves behind), then
      # started: attempts 1..n refused, n + 1 started.
      helper_log = File.join(@e2e, 'cache', @scenario, 'helper.log')
      logs = SERVERS.map { |id| log_since(id) } << (File.exist?(helper_log) ? File.read(helper_log) : '')
      refused = /kick of lb1\.example\.com not started \(Puppet is currently applying a catalog, cannot run now \(status 1\)\); retrying \(attempt (\d+) failed\)/
      retries = logs.flat_map { |log| log.scan(refused).flatten.map(&:to_i) }.sort
      expect(retries).not_to be_empty, node_log
      expect(retries.uniq).to eq((1..retries.max).to_a)
      started = logs.join[/kicked lb1\.example\.com: Puppet run started \(attempt (\d+), chain node1\.example\.com -> lb1\.example\.com\)/, 1]
      expect(started&.to_i).to eq(retries.max + 1), logs.join("\n")
      # Known issue (reported): a process starting while another has the kick in
      # flight clears the in-flight mark (KickService::start's recover_in_flight), so
      # both may send the same attempt; harmless here (both are refused), but noted.
      duplicates = retries.size - retries.uniq.size
      warn "kick e2e: #{duplicates} attempt(s) sent twice by two processes: #{retries}" if duplicates.positive?
      expect(log_since(LB1)).to include('puppet-kicker: kicked run of lb1.example.com reported (chain node1.example.com -> lb1.example.com)')

      status = kick_status
      expect(status['recent_outcomes'].map { |o| o.values_at('target', 'result', 'chain') })
        .to eq([[LB1, 'started', 'node1.example.com -> lb1.example.com']])
      outcome_at = status['recent_outcomes'].first['at'] / 1000.0
      expect(outcome_at).to be >= busy[:end]
      expect(status['pending'] + status['running']).to eq([])
      timing("lb1 busy #{ago(busy[:start])}..#{ago(busy[:end])}; #{retries.size} busy refusal(s) #{retries}; " \
             "kicked run started #{ago(kicked[:start])} (attempt #{started}), #{format('%.1f', kicked[:start] - busy[:end])} s after the busy run ended")
    end
  end
end
