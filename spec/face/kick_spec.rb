# frozen_string_literal: true

require_relative 'face_helper'

describe 'puppet kicker kick', type: :face do
  # This machine's certname.
  def master
    'master.example.com'
  end

  # A kick as this machine asks for it.
  def kick(dir, *args, **opts)
    kicker(dir, 'kick', '--certname', master, *args, env: { 'PUPPET_KICKER_HELPER' => '0' }, **opts)
  end

  def state_file(dir)
    File.join(dir, 'cache', 'kicks.msgpack')
  end

  %w[magnus ffi].each do |backend|
    context "through the #{backend} backend" do
      before(:all) { @dir = ScratchMaster.create }

      it 'shows with --dry-run the targets and what the planner would decide, and records nothing' do
        run = kick(@dir, '--role', 'node', '--dry-run', backend: backend)
        expect(run.exitstatus).to eq(0), run.to_s
        expect(run.stdout).to eq(<<~TABLE)
          TARGET             ROLE  OUTCOME     DETAIL
          node1.example.com  node  would kick  chain master.example.com -> node1.example.com
          node2.example.com  node  would kick  chain master.example.com -> node2.example.com
          node3.example.com  node  would kick  chain master.example.com -> node3.example.com
          3 targets: 3 would kick
          Dry run: nothing recorded or sent.
        TABLE
        expect(File.exist?(state_file(@dir))).to be(false), 'a dry run writes no kick state'
      end

      it 'gives with --render-as json the targets, their outcomes and the exit code' do
        run = kick(@dir, '--facts', 'role=node', 'os.release.major=12', '--dry-run',
                   '--render-as', 'json', backend: backend)
        expect(run.exitstatus).to eq(0), run.to_s
        expect(run.json['targets'].map { |t| [t['certname'], t['role'], t['outcome']] })
          .to eq([['node1.example.com', 'node', 'would kick'], ['node2.example.com', 'node', 'would kick']])
        expect(run.json).to include('certname' => master, 'environment' => 'production', 'exit_code' => 0,
                                    'resource' => 'puppet kicker kick --facts role=node os.release.major=12 ' \
                                                  '--environment production')
      end
    end
  end

  context 'for real, with no mcollective to reach' do
    before(:all) do
      @dir = ScratchMaster.create('kick' => { 'retry_base' => '30s' },
                                  'mcollective' => { 'client_config' => '/nonexistent/client.cfg' })
    end

    it 'queues the kick, tries at once, prints the retry scheduled and exits 4; the kick lines are logged' do
      run = kick(@dir, '--role', 'haproxy', '--wait', '10', '--color', 'false')
      expect(run.exitstatus).to eq(4), run.to_s
      # Log lines on stderr, the answer alone on stdout.
      expect(run.stderr.lines).to include('Notice: puppet-kicker: kick queued for lb1.example.com ' \
                                          "(chain master.example.com -> lb1.example.com)\n")
      table = run.stdout.lines
      expect(table[0].split).to eq(%w[TARGET ROLE OUTCOME DETAIL])
      expect(table[1]).to match(/\Alb1\.example\.com  haproxy  retry scheduled  mcollective is not usable for kicks: .*; attempt 2 in \d+s\n\z/)
      expect(table[2]).to eq("1 target: 1 retry scheduled\n")
      status = JSON.parse(File.read(File.join(@dir, 'cache', 'kick-status.json')))
      expect(status['pending'].map { |p| [p['target'], p['attempts']] }).to eq([['lb1.example.com', 1]])
      expect(status['pending_count']).to eq(1)
      expect(status['counters']).to include('sent' => 0, 'failed' => 0, 'suppressed' => 0, 'confirmed_changed' => 0, 'unconfirmed' => 0)

      # Again: it joins the kick in backoff, brings it forward, and its attempt fails too.
      run = kick(@dir, '--role', 'haproxy', '--wait', '10', '--render-as', 'json')
      expect(run.exitstatus).to eq(4), run.to_s
      expect(run.json['targets'].map { |t| t.values_at('certname', 'outcome') })
        .to eq([['lb1.example.com', 'retry scheduled']])
      expect(run.json['targets'][0]['detail']).to match(/; attempt 3 in \d+s\z/)
    end

    it 'exits 3 and says so when nothing matches' do
      run = kick(@dir, '--role', 'nosuchrole')
      expect([run.exitstatus, run.stdout]).to eq([3, "No server matches.\n"]), run.to_s
      expect(run.stderr).to include('puppet kicker kick --role nosuchrole --environment production from ' \
                                    "#{master} matches no server in environment production")
      run = kick(@dir, '--role', 'nosuchrole', '--dry-run', '--render-as', 'json')
      expect(run.json).to include('targets' => [], 'exit_code' => 3)
      expect(run.json['messages']).to eq(["puppet kicker kick --role nosuchrole --environment production from #{master} " \
                                          'matches no server in environment production'])
    end
  end

  context 'with a kick.policy' do
    before(:all) do
      @dir = ScratchMaster.create('kick' => { 'policy' => { 'node' => ['haproxy'], '*' => ['node'] } })
    end

    it 'refuses as for a report from this machine: by its role, else the * rule; exit 2' do
      run = kick(@dir, '--role', '/^(haproxy|node)$/', '--dry-run', '--environment', 'production')
      expect(run.exitstatus).to eq(2), run.to_s
      expect(run.stdout.lines.map(&:split).map { |l| l.first(3) }).to include(
        ['lb1.example.com', 'haproxy', 'suppressed'], ['node1.example.com', 'node', 'would']
      )
      expect(run.stdout).to include('policy does not let role (none) kick role haproxy')
      # As node1 (role node), the policy lets it kick haproxy.
      run = kicker(@dir, 'kick', '--certname', 'node1.example.com', '--role', 'haproxy', '--dry-run')
      expect(run.exitstatus).to eq(0), run.to_s
    end
  end

  context 'with bad input' do
    before(:all) { @dir = ScratchMaster.create }

    it 'names a bad clause and its column, without a backtrace, and exits 1' do
      run = kick(@dir, '--facts', 'uptime', '--dry-run')
      expect(run.exitstatus).to eq(1), run.to_s
      expect(run.stderr).to include("clause 'uptime': no operator").and include('(at column 7)')
      expect(run.stderr).not_to match(/\.rb:\d+:in/)
    end

    it 'needs exactly one of --role and --facts, clauses only after --facts, and whole seconds' do
      expect(kick(@dir).stderr).to include('give either --role ROLE or --facts CLAUSE...')
      expect(kick(@dir, '--role', 'node', '--facts', 'a=b').stderr).to include('give either')
      expect(kick(@dir, 'role=node').stderr).to include('"role=node" is not an option: give clauses after --facts')
      run = kick(@dir, '--role', 'node', '--wait', 'soon')
      expect([run.exitstatus, run.stderr]).to match([1, include('--wait "soon": give whole seconds')])
    end
  end
end
