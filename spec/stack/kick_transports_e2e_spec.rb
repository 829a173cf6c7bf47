# frozen_string_literal: true

require 'tmpdir'
require_relative 'kick_world'

# Kicks end to end over Choria and over SSH, for real: the report of a real `puppet
# apply --reports kick` run goes through the `kick` processor to the core, whose
# Choria transport signs a `puppet#runonce` and sends it through nats-server, or whose
# SSH transport runs the system's `ssh` with the runonce script of docs/ssh.md (as
# `ssh.command`, without sudo). The servers are script/transport-stack's: an sshd of
# its own on 127.0.0.1, Debian's nats-server with the Choria test CA, and a Choria
# server stand-in written from the published protocol (spec/fixtures/choria/
# responder.rb), which runs the same runonce script on the server. On the server the
# script asks its `puppet` (spec/fixtures/kick_e2e/puppet-over-ssh: the real `puppet
# config print`, and the real `puppet apply --reports kick` run of run-puppet) for its
# lock files and starts its run. The facts come from the stack's Puppet YAML fact
# cache (source: puppet_cache).
#
# Run by script/test-kick-e2e, which starts the stack and sets PK_KICK_TRANSPORT_STACK_DIR.
# the constants' namespace
module KickTransportsE2E
  include KickWorld # its constants, for the examples below

  RSpec.describe 'kicks end to end over Choria and SSH: real puppet apply runs', order: :defined do
    include KickWorld

    stack = ENV.fetch('PK_KICK_TRANSPORT_STACK_DIR') { raise 'PK_KICK_TRANSPORT_STACK_DIR is not set: run script/test-kick-e2e' }
    # The default command's script, as docs/ssh.md shows it (a unit test holds the
    # two equal), run without sudo and given the stack's `puppet`.
    RUNONCE_SCRIPT = File.read(File.join(ROOT, 'docs', 'ssh.md'))[/```sh\n(answer\(\) \{.*?)```\n/m, 1]
    CHORIA = File.join(ROOT, 'tests', 'fixtures', 'choria', 'nats')
    CHAIN = 'node1.example.com -> lb1.example.com'
    KICKS_LB = "notify { 'kick -> haproxy': }\n"

    before(:all) do
      raise 'docs/ssh.md shows no runonce script' unless RUNONCE_SCRIPT

      @stack = stack
      @e2e = File.join(stack, 'kick_e2e')
      @nats_port = File.read(File.join(stack, 'stack.env'))[/^PK_TRANSPORT_STACK_NATS_PORT=(\d+)$/, 1]
      prepare_world
    end

    after(:all) do
      warn "kick transports e2e timings: #{@times.join('; ')}" if @times && !@times.empty?
    end

    after do |example|
      next unless example.exception && @stack

      dump_failure(example)
      %w[sshd.log nats.log responder.log choria/responder.log].each do |log|
        warn "----- #{log}:\n#{read(File.join(@stack, log))}"
      end
    end

    # Where the facts come from, and the carrier's keys; `@kick_keys` and
    # `@known_hosts` are a scenario's own.
    def kicker_settings(_name)
      settings = {
        'source' => 'puppet_cache',
        'puppet_cache' => { 'dirs' => [File.join(@stack, 'facts')] },
        'kick' => { 'transport' => carrier }.merge(@kick_keys || {}),
      }
      settings.merge(carrier == 'ssh' ? ssh_settings : choria_settings)
    end

    def ssh_settings
      { 'ssh' => {
        'config_file' => File.join(@stack, 'ssh_config'),
        'known_hosts' => File.join(@stack, @known_hosts || 'known_hosts'),
        'identity_file' => File.join(@stack, 'kicker_key'),
        'connect_timeout' => 5,
        'command' => ['/bin/sh', '-c', RUNONCE_SCRIPT, 'puppet-kicker-runonce', '--puppet', File.join(@stack, 'bin', 'puppet')],
      } }
    end

    def choria_settings
      { 'choria' => {
        'brokers' => ["127.0.0.1:#{@nats_port}"],
        'certname' => 'kicker.mcollective',
        'ssl_ca' => File.join(CHORIA, 'ca.pem'),
        'ssl_cert' => File.join(CHORIA, 'kicker.mcollective.pem'),
        'ssl_key' => File.join(CHORIA, 'kicker.mcollective.key'),
        'connect_timeout' => 10,
      } }
    end

    # An operator's `puppet agent --onetime` on one server, over the stack's ssh.
    def run_puppet_on(id)
      sh('ssh', '-F', File.join(@stack, 'ssh_config'), '-i', File.join(@stack, 'kicker_key'), '-o', 'BatchMode=yes',
         '-o', 'IdentitiesOnly=yes', '-o', "UserKnownHostsFile=#{File.join(@stack, 'known_hosts')}",
         '-o', 'StrictHostKeyChecking=yes', id, File.join(@stack, 'bin', 'puppet'), 'agent', '--onetime')
    end

    # Real `puppet agent --disable`/`--enable` on a server's own dirs.
    def agent(id, *args)
      dirs = node_file(id, 'puppet')
      sh('puppet', 'agent', *args, '--confdir', "#{dirs}/etc", '--vardir', "#{dirs}/var",
         '--rundir', "#{dirs}/var/run", '--logdir', "#{dirs}/var/log")
    end

    def all_logs
      helper_log = File.join(@e2e, 'cache', @scenario, 'helper.log')
      SERVERS.map { |id| log_since(id) }.join("\n") + (File.exist?(helper_log) ? File.read(helper_log) : '')
    end

    # node1 runs with a kick of the load balancers; the kick is given up (kick keys
    # of the scenario: `max_attempts`), and no run follows.
    def kick_given_up(name, **kick_keys)
      @kick_keys = kick_keys.transform_keys(&:to_s)
      scenario(name, node_pp: KICKS_LB, haproxy_pp: '')
      run_puppet_on(NODE1)
      wait_for('the kick of lb1 to be given up') { outcomes.any? }
      settle!
      expect(runs(NODE1).size).to eq(1)
      expect(runs(LB1)).to eq([])
      expect(outcomes.map { |target, _, chain| [target, chain] }).to eq([[LB1, CHAIN]])
      outcomes.first[1]
    ensure
      @kick_keys = nil
    end

    %w[choria ssh].each do |transport|
      context "through #{transport}" do
        let(:carrier) { transport }

        it 'a new node runs Puppet and kicks the load balancer, whose run lists it in haproxy.cfg' do
          scenario("#{carrier}-seed", haproxy_pp: '', node_pp: NODE_PP)
          # Before: node1 is not in the fact cache yet; the load balancer lists node2 only.
          sh('script/transport-stack', 'down', NODE1)
          run_puppet_on(LB1)
          wait_for("#{LB1}'s first run") { runs(LB1).first&.key?(:end) }
          expect(runs(LB1).first[:rc]).to eq(0), log_since(LB1)
          expect(haproxy_servers).to eq([HAPROXY_LINE['node2', '127.0.0.12']])

          # node1 appears, new (no backend.conf of an earlier scenario's), and runs Puppet.
          FileUtils.rm_f(File.join(@e2e, 'out', NODE1, 'backend.conf'))
          sh('script/transport-stack', 'up', NODE1)
          kicked_at = Time.now.to_f
          run_puppet_on(NODE1)
          wait_for("#{LB1}'s kicked run to end") { runs(LB1)[1]&.key?(:end) }
          settle!

          expect([runs(NODE1).size, runs(LB1).size, runs(NODE2).size, runs(WEB1).size]).to eq([1, 2, 0, 0])
          node_run = runs(NODE1).first
          lb_run = runs(LB1).last
          expect([node_run[:rc], lb_run[:rc]]).to eq([0, 0])
          # The runonce script's options: a kicked run.
          expect(lb_run[:options]).to start_with('--onetime --daemonize --no-splay --no-usecacheonfailure --color=false')
          expect(lb_run[:start]).to be > node_run[:start]

          node_log = log_since(NODE1)
          expect(node_log).to include("Kick[load balancers]: Triggered 'refresh' from 1 event")
          expect(node_log).to include("Notice: puppet-kicker: kick queued for lb1.example.com (chain #{CHAIN})")
          expect(node_log).to include("Notice: puppet-kicker: kicked lb1.example.com: Puppet run started (attempt 1, chain #{CHAIN})")
          lb_log = log_since(LB1)
          expect(lb_log).to include("puppet-kicker: kicked run of lb1.example.com reported (chain #{CHAIN})")
          expect(lb_log).to match(%r{File\[.*/haproxy\.cfg\]/content: content changed})
          expect(outcomes).to eq([[LB1, 'started', CHAIN]])

          # The load balancer now lists the new node, in fqdn order.
          expect(haproxy_servers).to eq([HAPROXY_LINE['node1', '127.0.0.11'], HAPROXY_LINE['node2', '127.0.0.12']])
          timing("#{carrier}: node1's run -> lb1's kicked run started after #{format('%.1f', lb_run[:start] - kicked_at)} s, " \
                 "ended after #{format('%.1f', lb_run[:end] - kicked_at)} s")
        end

        it 'a busy load balancer answers busy, and gets its kicked run after the run in progress' do
          scenario("#{carrier}-busy", node_pp: KICKS_LB, haproxy_pp: '')
          # lb1 starts a run that holds its lock until the test releases it.
          hold = File.join(@e2e, 'slow', LB1)
          File.write(hold, "hold\n")
          run_puppet_on(LB1)
          wait_for("#{LB1}'s long run to start") { runs(LB1).first && running?(LB1) }
          run_puppet_on(NODE1)
          busy = /kick of lb1\.example\.com not started \(Puppet is currently applying a catalog \(pid \d+\), cannot run now[^;]*; retrying \(attempt (\d+) failed\)/
          # (The kicking process logs its retries when it ends: the kick state says it at once.)
          wait_for('a busy answer from lb1') do
            Array(kick_status['pending']).any? { |p| p['last_error'].to_s.include?('currently applying a catalog') }
          end
          expect(runs(LB1).size).to eq(1)
          File.write("#{hold}.release", '')
          wait_for("#{LB1}'s kicked run to end") { runs(LB1)[1]&.key?(:end) }
          settle!

          long, kicked = runs(LB1)
          expect([runs(LB1).size, runs(NODE1).size]).to eq([2, 1])
          expect([long[:kicked], kicked[:kicked]]).to eq([false, true])
          expect([long[:rc], kicked[:rc], runs(NODE1).first[:rc]]).to eq([0, 0, 0])
          expect(kicked[:start]).to be >= long[:end]
          retries = all_logs.scan(busy).flatten.map(&:to_i).uniq.sort
          expect(retries.first).to eq(1)
          started = all_logs[/kicked lb1\.example\.com: Puppet run started \(attempt (\d+), chain #{CHAIN}\)/, 1]
          expect(started&.to_i).to eq(retries.max + 1), all_logs
          expect(outcomes).to eq([[LB1, 'started', CHAIN]])
          timing("#{carrier}: #{retries.size} busy answer(s); kicked run started " \
                 "#{format('%.1f', kicked[:start] - long[:end])} s after the long run ended")
        end

        it 'puppet kicker rollout run: the batches in order, each server once, every agent enabled after' do
          scenario("#{carrier}-rollout", node_pp: '', haproxy_pp: '')
          started = Time.now.to_f
          env = { 'PUPPET_KICKER_CONFIG' => File.join(@e2e, 'puppet_kicker.yaml'), 'RUBYLIB' => File.join(ROOT, 'lib'),
                  'PUPPET_KICKER_HELPER' => '0', }
          Dir.mktmpdir do |puppet|
            dirs = %w[confdir vardir logdir rundir codedir].flat_map { |name| ["--#{name}", File.join(puppet, name)] }
            out, err, status = Open3.capture3(env, '/usr/bin/puppet', 'kicker', 'rollout', 'run', '--roles', 'node,haproxy',
                                              '--order', 'given', '--batch', '1', '--timeout-per-batch', '120',
                                              '--certname', 'master.example.com', *dirs, chdir: puppet)
            expect(status.exitstatus).to eq(0), "#{out}\n#{err}"
            expect(err).to include('rollout: batch 3 of 3 (haproxy): lb1.example.com')
          end
          order = [NODE1, NODE2, LB1]
          expect(order.map { |id| runs(id).size }).to eq([1, 1, 1])
          order.each_cons(2) { |a, b| expect(runs(b).first[:start]).to be >= runs(a).first[:end] }
          order.each { |id| expect(File.exist?(node_file(id, 'puppet/var/state/agent_disabled.lock'))).to be(false) }
          next unless carrier == 'choria'

          # Each server was held off, then let go and run, through the puppet agent's actions.
          seen = File.readlines(File.join(@stack, 'choria', 'responder.log')).map { |line| JSON.parse(line) }
          actions = ->(id) { seen.select { |r| r['at'] >= started && r['identity'] == id }.map { |r| [r['action'], r['statuscode']] } }
          order.each { |id| expect(actions[id].first(3)).to eq([['disable', 0], ['enable', 0], ['runonce', 0]]), actions[id].inspect }
        end

        it 'a disabled load balancer answers disabled with its message, and does not run' do
          agent(LB1, '--disable', 'maintenance window 42')
          begin
            result = kick_given_up("#{carrier}-disabled", max_attempts: 2)
          ensure
            agent(LB1, '--enable')
          end
          disabled = 'Puppet is disabled, cannot run now: maintenance window 42'
          expect(all_logs).to match(/kick of lb1\.example\.com not started \(#{disabled}[^;]*; retrying \(attempt 1 failed\)/)
          expect(result).to start_with("failed: #{disabled}")
        end
      end
    end

    context 'through ssh' do
      let(:carrier) { 'ssh' }

      it 'a target whose host key is not in known_hosts is refused, and nothing runs there' do
        @known_hosts = 'known_hosts.other'
        result = kick_given_up('ssh-hostkey', max_attempts: 1)
        expect(result).to start_with('failed: ssh to lb1.example.com: the host key is unknown or does not match known_hosts')
        expect(result).to include('Host key verification failed')
      ensure
        @known_hosts = nil
      end
    end

    context 'through choria' do
      let(:carrier) { 'choria' }

      # The stand-in's next reply to lb1 is forged as `how`; a forgery runs nothing.
      def forged(name, how)
        File.write(File.join(@stack, 'choria', 'forge', LB1), how)
        kick_given_up(name, max_attempts: 1, reply_timeout: 3)
      end

      it 'a reply whose hash is not its message is refused' do
        result = forged('choria-hash', 'hash')
        expect(result).to match(/\Afailed: choria: reply for lb1\.example\.com via broker \S*#{@nats_port} refused: /)
        expect(result).to end_with("Choria secure reply's hash is not the SHA-256 of its message")
      end

      it 'a reply from a server that is not the target is refused' do
        result = forged('choria-sender', 'sender')
        expect(result).to match(/\Afailed: choria: reply for lb1\.example\.com via broker \S*#{@nats_port} refused: Choria reply's/)
        expect(result).to include('"impostor.example.com" is not a target of the request')
      end
    end
  end
end
