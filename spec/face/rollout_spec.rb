# frozen_string_literal: true

require 'socket'
require 'yaml'
require_relative 'face_helper'

describe 'puppet kicker rollout', type: :face do
  # A masterless run of `certname` whose report (through the `kick` processor) kicks
  # `role`: the planner draws an edge from certname's role to role's (dry run).
  def report_kick(dir, certname, role)
    puppet = %w[confdir vardir logdir rundir codedir].flat_map { |name| ["--#{name}", File.join(dir, 'puppet', name)] }
    env = { 'PUPPET_KICKER_CONFIG' => File.join(dir, 'puppet_kicker.yaml'), 'RUBYLIB' => File.join(ROOT, 'lib'),
            'PUPPET_KICKER_HELPER' => '0', }
    out, status = Open3.capture2e(env, *KickerFace::PUPPET, 'apply', '--certname', certname, '--reports', 'kick',
                                  *puppet, '-e', "notify { 'kick -> #{role}': }")
    expect(status).to be_success, out
  end

  context 'before any kick: no graph' do
    before(:all) { @dir = ScratchMaster.create }

    %w[magnus ffi].each do |backend|
      it "plans the environment's servers by role name, in batches (#{backend})" do
        run = kicker(@dir, 'rollout', 'plan', '--batch', '2', backend: backend)
        expect(run.exitstatus).to eq(0), run.to_s
        expect(run.stdout).to eq(<<~TEXT)
          Rollout plan for production (order: graph, batches of 2): 4 servers in 2 groups, 3 batches

          Group 1 of 2: haproxy
            batch 1 of 1: lb1.example.com
          Group 2 of 2: node
            batch 1 of 2: node1.example.com, node2.example.com
            batch 2 of 2: node3.example.com

          Nothing was run: this is the plan only.
        TEXT
      end
    end

    it 'follows --roles as typed with --order given, and selects with --facts and --environment' do
      run = kicker(@dir, 'rollout', 'plan', '--roles', 'node,haproxy', '--order', 'given', '--render-as', 'json')
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.json['groups'].map { |g| g['name'] }).to eq(%w[node haproxy])
      run = kicker(@dir, 'rollout', 'plan', '--facts', 'os.release.major=12', 'role=node', '--render-as', 'json')
      expect(run.json['groups'].map { |g| g['servers'] }).to eq([%w[node1.example.com node2.example.com]])
      run = kicker(@dir, 'rollout', 'plan', '--environment', 'staging', '--render-as', 'json')
      expect(run.json['groups'].map { |g| g['servers'] }).to eq([%w[node9.staging.example.com]])
    end

    it 'names what is wrong, without a backtrace, and exits 1' do
      {
        %w[plan --batch 0] => '--batch 0: a batch holds at least 1 server',
        %w[plan --batch ten] => '--batch "ten": give a whole number',
        %w[plan --order random] => '--order "random": use graph or given',
        %w[plan --order given] => '--order given needs --roles',
        %w[plan --roles web] => 'nothing to roll out: no server of environment "production" matches --roles web',
        %w[run --timeout-per-batch 15m] => '--timeout-per-batch "15m": give whole seconds',
        %w[status] => 'puppet kicker rollout status: no rollout saved in ',
        %w[deploy] => 'puppet kicker rollout deploy: no such subcommand; use plan, run, status',
      }.each do |args, message|
        run = kicker(@dir, 'rollout', *args)
        expect(run.exitstatus).to eq(1), run.to_s
        expect(run.stderr).to include(message)
        expect(run.stderr).not_to match(/\.rb:\d+:in/)
      end
    end
  end

  context 'run, with a broker that cannot be reached' do
    before(:all) do
      # The scratch master's own client.cfg and a broker port nothing listens on, not
      # whatever mcollective configuration the machine has.
      closed = TCPServer.new('127.0.0.1', 0)
      port = closed.addr[1]
      closed.close
      @dir = ScratchMaster.create
      File.write(File.join(@dir, 'client.cfg'), "connector = rabbitmq\nplugin.psk = k\n")
      config = File.join(@dir, 'puppet_kicker.yaml')
      mcollective = { 'client_config' => File.join(@dir, 'client.cfg'), 'pool' => ["127.0.0.1:#{port}"],
                      'connect_timeout' => 2, }
      File.write(config, YAML.load_file(config).merge('mcollective' => mcollective).to_yaml)
    end

    it 'stops before running anything, says why, and exits 2' do
      run = kicker(@dir, 'rollout', 'run', '--batch', '2')
      expect(run.exitstatus).to eq(2), run.to_s
      expect(run.stdout).to match(/stopped: lb1.example.com could not disable Puppet: mcollective: no broker could be reached/)
      expect(run.stdout).to include('node1.example.com: not run (never disabled)')
      status = kicker(@dir, 'rollout', 'status', '--render-as', 'json')
      expect(status.exitstatus).to eq(0), status.to_s
      expect(JSON.parse(status.stdout)['rollout']['phase']['phase']).to eq('stopped')
    end
  end

  context 'with kicks seen in reports: node -> haproxy, haproxy -> node' do
    before(:all) do
      @dir = ScratchMaster.create('kick' => { 'dry_run' => true })
      [%w[node1.example.com haproxy], %w[lb1.example.com node]].each do |certname, role|
        report_kick(@dir, certname, role)
      end
    end

    it 'runs the cycle as one group and reports it with the rule that broke it' do
      run = kicker(@dir, 'rollout', 'plan', '--render-as', 'json')
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.json['groups']).to eq([{ 'name' => 'haproxy, node', 'roles' => %w[haproxy node], 'cycle' => true,
                                          'servers' => %w[lb1.example.com node1.example.com node2.example.com
                                                          node3.example.com],
                                          'batches' => [%w[lb1.example.com node1.example.com node2.example.com
                                                           node3.example.com]], }])
      expect(run.json['cycles'].map { |c| [c['roles'], c['group']] }).to eq([[%w[haproxy node], 1]])
      expect(run.json['cycles'][0]['rule']).to start_with('roles in a kick cycle run together as one group')
      text = kicker(@dir, 'rollout', 'plan').stdout
      expect(text).to include('Group 1 of 1: haproxy, node  (a kick cycle: these roles run together)')
      expect(text).to include('  haproxy, node: haproxy -> node, node -> haproxy; group 1')
    end
  end
end
