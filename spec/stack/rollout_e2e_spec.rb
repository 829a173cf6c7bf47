# frozen_string_literal: true

require 'fileutils'
require 'json'
require 'open3'
require 'tmpdir'
require 'yaml'
require_relative 'node_runs'

# `puppet kicker rollout run` on the kick e2e stack (see kick_e2e_spec.rb): the test
# `puppet` agents of real mcollectived, whose runonce runs a real `puppet apply` of
# the server's role (spec/fixtures/kick_e2e/run-puppet), whose disable and enable
# hold the agent, and whose last_run_summary reads the summary that apply wrote.
# Production: node1 and node2 (role node), lb1 (haproxy); `--roles node,haproxy
# --order given --batch 1` makes three batches: node1, node2, lb1.
#
# Run by script/test-kick-e2e after kick_face_spec.rb, on the same stack.
module RolloutE2E
  RSpec.describe 'puppet kicker rollout run on the mcollective stack', order: :defined do
    include NodeRuns

    stack = ENV.fetch('PK_KICK_E2E_STACK_DIR') { raise 'PK_KICK_E2E_STACK_DIR is not set: run script/test-kick-e2e' }
    NODE1 = 'node1.example.com'
    NODE2 = 'node2.example.com'
    LB1 = 'lb1.example.com'
    ORDER = [NODE1, NODE2, LB1].freeze
    SERVERS = (ORDER + ['web1.staging.example.com']).freeze
    MASTER = 'master.example.com'
    WAIT = Integer(ENV.fetch('PK_KICK_E2E_WAIT', '90'))
    PLAN = %w[--roles node,haproxy --order given --batch 1 --timeout-per-batch 120].freeze

    before(:all) do
      @stack = stack
      @e2e = File.join(stack, 'kick_e2e')
      FileUtils.mkdir_p(%w[manifests slow out cache modules/kicker].map { |d| File.join(@e2e, d) })
      %w[lib native templates metadata.json].each do |f|
        FileUtils.cp_r(File.join(ROOT, f), File.join(@e2e, 'modules', 'kicker'))
      end
      @client_cfg = File.join(stack, 'client.cfg')
      @puppet = Dir.mktmpdir('puppet-kicker-rollout-e2e')
      ORDER.each { |id| sh('script/mco-stack', 'up', id) }
      wait_for('every run to end') { SERVERS.none? { |id| running?(id) } }
    end

    # Each example: its own rollout state (cache dir), manifests that kick nothing,
    # node2's failing when `fail_node2`, and run counts from here on.
    def fresh(name, fail_node2: false, kick: {})
      wait_for('every run to end') { SERVERS.none? { |id| running?(id) } }
      @config = File.join(@e2e, 'puppet_kicker.yaml')
      FileUtils.rm_rf(File.join(@e2e, 'cache', "rollout-#{name}")) # a rollout of an earlier run of this spec
      File.write(@config, {
        'source' => 'mcollective',
        'mcollective' => { 'client_config' => @client_cfg, 'discovery_timeout' => 1 },
        'cache' => { 'dir' => File.join(@e2e, 'cache', "rollout-#{name}"), 'ttl' => 0 },
        'kick' => { 'coalesce' => 1, 'retry_base' => 2, 'retry_max' => 4, 'exit_wait' => 60 }.merge(kick),
      }.to_yaml)
      failing = fail_node2 ? "if $facts['fqdn'] == '#{NODE2}' { exec { '/bin/false': } }\n" : ''
      File.write(File.join(@e2e, 'manifests', 'node.pp'), "notify { 'ran': }\n#{failing}")
      File.write(File.join(@e2e, 'manifests', 'haproxy.pp'), "notify { 'ran': }\n")
      @runs_before = SERVERS.to_h { |id| [id, all_runs(id).size] }
    end

    # Whatever an example left behind when it failed: its held run released, its
    # servers enabled again (an example that passed left them so).
    after do
      (@pids || []).each do |pid|
        Process.kill('KILL', -pid)
        Process.wait(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
      @pids = []
      ORDER.each { |id| release(id) if running?(id) }
      wait_for('every run to end') { SERVERS.none? { |id| running?(id) } }
      enabled.each do |id, on|
        sh('mco', 'rpc', 'puppet', 'enable', '-I', id, '--dt', '1', '--config', @client_cfg) unless on
      end
    end

    def longest_wait
      WAIT
    end

    def sh(*cmd)
      out, status = Open3.capture2e(*cmd, chdir: ROOT)
      raise "#{cmd.join(' ')} failed (#{status}):\n#{out}" unless status.success?

      out
    end

    def env
      { 'PUPPET_KICKER_CONFIG' => @config, 'RUBYLIB' => File.join(ROOT, 'lib'), 'PUPPET_KICKER_HELPER' => '0' }
    end

    def dirs
      %w[confdir vardir logdir rundir codedir].flat_map { |name| ["--#{name}", File.join(@puppet, name)] }
    end

    def kicker(*args)
      Open3.capture3(env, '/usr/bin/puppet', 'kicker', *args, '--certname', MASTER, *dirs, chdir: @puppet)
    end

    # `puppet kicker rollout run ...` in the background: its pid; output in `log`.
    def spawn_rollout(log, *args)
      pid = Process.spawn(env, '/usr/bin/puppet', 'kicker', 'rollout', 'run', *args, '--certname', MASTER, *dirs,
                          chdir: @puppet, %i[out err] => [log, 'w'], pgroup: true)
      (@pids ||= []) << pid
      pid
    end

    # What each server's agent says: enabled or not.
    def enabled
      out = sh('mco', 'rpc', 'puppet', 'status', *ORDER.flat_map { |id| ['-I', id] }, '--dt', '1', '--config', @client_cfg,
               '--json')
      JSON.parse(out).to_h { |r| [r['sender'], r['data']['enabled']] }
    end

    # A long run of `id`: it holds until released (see run-puppet).
    def hold(id)
      FileUtils.rm_f(File.join(@e2e, 'slow', "#{id}.release"))
      File.write(File.join(@e2e, 'slow', id), "hold\n")
    end

    def release(id)
      FileUtils.touch(File.join(@e2e, 'slow', "#{id}.release"))
    end

    it 'runs the batches in order, each server once, and no scheduled run gets in while a server waits' do
      fresh('order')
      hold(NODE1)
      log = File.join(@puppet, 'order.log')
      pid = spawn_rollout(log, *PLAN)
      wait_for("#{NODE1}'s run to start") { runs(NODE1).first }
      # A scheduled run of lb1 (cron's `mco puppet runonce`) while it waits for its batch.
      out, = Open3.capture2('mco', 'rpc', 'puppet', 'runonce', '-I', LB1, '--dt', '1', '--config', @client_cfg, '--json')
      refused = JSON.parse(out).first
      expect([refused['sender'], refused['statuscode']]).to eq([LB1, 1])
      expect(refused['statusmsg']).to match(/disabled/)
      expect(enabled).to eq(NODE1 => true, NODE2 => false, LB1 => false)
      release(NODE1)
      _, status = Process.wait2(pid)
      expect(status.exitstatus).to eq(0), File.read(log)

      expect(ORDER.map { |id| runs(id).size }).to eq([1, 1, 1])
      ORDER.each_cons(2) do |before, after|
        expect(runs(after).first[:start]).to be >= runs(before).first[:end], "#{after} started before #{before} ended"
      end
      expect(ORDER.map { |id| runs(id).first[:rc] }).to eq([0, 0, 0])
      expect(enabled).to eq(NODE1 => true, NODE2 => true, LB1 => true)
      out, = kicker('rollout', 'status', '--render-as', 'json')
      rollout = JSON.parse(out)['rollout']
      expect(rollout['phase']).to eq('phase' => 'finished')
      expect(ORDER.map { |id| rollout['servers'][id]['state'] }).to eq(%w[done done done])
      expect(File.read(log)).to include("rollout: batch 1 of 3 (node): #{NODE1}")
    end

    it 'stops at a failed batch 2, enables the servers not yet run, and exits non-zero' do
      fresh('failure', fail_node2: true)
      out, err, status = kicker('rollout', 'run', *PLAN)
      expect(status.exitstatus).to eq(2), "#{out}\n#{err}"
      expect(ORDER.map { |id| runs(id).size }).to eq([1, 1, 0])
      # (puppet apply exits 0 with a failed resource: the run's summary says it failed)
      expect(enabled).to eq(NODE1 => true, NODE2 => true, LB1 => true)
      expect(err).to include("rollout: #{NODE2}: its run failed")
      expect(err).to match(/rollout [0-9TZ]+ stopped: batch 2 failed: #{NODE2}; 1 servers not run were enabled again/)
      expect(out).to include("#{LB1}: not run (enabled again)")
    end

    it 'on SIGTERM in the middle, enables every server it disabled and did not run' do
      fresh('sigterm')
      hold(NODE1)
      log = File.join(@puppet, 'sigterm.log')
      pid = spawn_rollout(log, *PLAN)
      wait_for("#{NODE1}'s run to start") { runs(NODE1).first }
      expect(enabled).to eq(NODE1 => true, NODE2 => false, LB1 => false)
      Process.kill('TERM', pid)
      _, status = Process.wait2(pid)
      expect(status.exitstatus).to eq(2), File.read(log)
      expect(enabled).to eq(NODE1 => true, NODE2 => true, LB1 => true)
      expect(File.read(log)).to include('stopped: stopped by SIGTERM')
      release(NODE1)
      wait_for("#{NODE1}'s run to end") { runs(NODE1).first&.key?(:end) }
      expect([runs(NODE2).size, runs(LB1).size]).to eq([0, 0])
    end

    # `puppet kicker kick`'s table rows: certname, role, outcome, detail.
    def rows(out)
      out.lines.drop_while { |l| !l.start_with?('TARGET') }.drop(1).take_while { |l| l.include?('.example.com') }
         .map { |l| l.split(/\s{2,}/, 4).map(&:strip) }
    end

    it "kick --wait waits for each kicked server's last-run summary: confirmed, and counted in metrics" do
      fresh('confirm', kick: { 'confirm_by' => 'transport' })
      out, err, status = kicker('kick', '--role', 'node', '--wait', '90')
      expect(status.exitstatus).to eq(0), "#{out}\n#{err}"
      expect(rows(out).map { |r| r.first(3) }).to eq([[NODE1, 'node', 'confirmed'], [NODE2, 'node', 'confirmed']])
      expect(rows(out).map(&:last)).to all(match(/\Areported: changed, \d+ s after the kick\z/))
      status_file = JSON.parse(File.read(File.join(@e2e, 'cache', 'rollout-confirm', 'kick-status.json')))
      expect(status_file['confirmations'].map { |c| c.values_at('target', 'outcome') })
        .to contain_exactly([NODE1, 'changed'], [NODE2, 'changed'])
      metrics, = kicker('metrics')
      expect(metrics).to include('puppet_kicker_kicks_confirmed_total{outcome="changed"} 2')
      expect(metrics).to include('puppet_kicker_kick_to_report_seconds_count 2')
    end

    it 'a kick whose run does not end within kick.confirm_within is unconfirmed' do
      fresh('unconfirmed', kick: { 'confirm_by' => 'transport', 'confirm_within' => '20s' })
      hold(NODE1)
      out, err, status = kicker('kick', '--facts', "fqdn=#{NODE1}", '--wait', '60')
      expect(status.exitstatus).to eq(2), "#{out}\n#{err}"
      expect(rows(out).map { |r| r.first(3) }).to eq([[NODE1, 'node', 'unconfirmed']])
      expect(err).to include("kick of #{NODE1} UNCONFIRMED: no report of a run started after it within 20 s")
      release(NODE1)
    end

    it 'after SIGKILL, --resume finishes the rollout and no server runs twice' do
      fresh('resume')
      hold(NODE1)
      log = File.join(@puppet, 'resume.log')
      pid = spawn_rollout(log, *PLAN)
      wait_for("#{NODE1}'s run to start") { runs(NODE1).first }
      Process.kill('KILL', pid)
      Process.wait2(pid)
      expect(enabled).to eq(NODE1 => true, NODE2 => false, LB1 => false), 'held as the killed process left them'
      _, err, status = kicker('rollout', 'run', *PLAN)
      expect(status.exitstatus).not_to eq(0)
      expect(err).to match(/rollout [0-9TZ]+ is in progress .*: continue it with --resume/)
      release(NODE1)
      out, err, status = kicker('rollout', 'run', '--resume')
      expect(status.exitstatus).to eq(0), "#{out}\n#{err}"
      expect(ORDER.map { |id| runs(id).size }).to eq([1, 1, 1])
      expect(enabled).to eq(NODE1 => true, NODE2 => true, LB1 => true)
    end
  end
end
