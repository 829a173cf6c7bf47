# frozen_string_literal: true

require 'fileutils'
require 'json'
require 'open3'
require_relative 'kick_world'

# One kick state for two compilers, for real: two puppetserver 7.9 processes (compiler
# a and compiler b) with the same module, code and `kick.state: postgresql` on one
# PostgreSQL 15 cluster (TLS, a password); the mcollective test stack's servers, whose
# runonce runs a real `puppet agent` against the compiler each scenario names
# (spec/fixtures/shared_state/run-agent), so that each report goes to that compiler's
# `kick` report processor. The kicks go out through mcollective from whichever
# compiler dispatches them. The last example SIGKILLs compiler a: it runs last
# (`order: :defined`).
#
# Run by script/test-shared-state, which starts all of it and sets PK_SHARED_STATE_DIR
# and PK_SHARED_STATE_PORTS (spec/stack/ is not in the default rspec run).
module SharedStateE2E
  NODE1 = KickWorld::NODE1
  NODE2 = KickWorld::NODE2
  LB1 = KickWorld::LB1
  WEB1 = KickWorld::WEB1
  SERVERS = KickWorld::SERVERS
  WAIT = Integer(ENV.fetch('PK_SHARED_STATE_WAIT', '150'))
  # After settling: this long without a new run means nothing more comes.
  QUIET = Integer(ENV.fetch('PK_SHARED_STATE_QUIET', '8'))
  # kick.coalesce, kick.in_flight_timeout (a claim's lease) and kick.reply_timeout in
  # both compilers' puppet_kicker.yaml (script/test-shared-state).
  COALESCE = 10
  LEASE = 30
  REPLY_TIMEOUT = 14

  RSpec.describe 'one kick state for two puppetserver compilers (kick.state: postgresql)', order: :defined do
    include NodeRuns

    dir = ENV.fetch('PK_SHARED_STATE_DIR') { raise 'PK_SHARED_STATE_DIR is not set: run script/test-shared-state' }
    ports = ENV.fetch('PK_SHARED_STATE_PORTS').split.map { |p| Integer(p) }

    before(:all) do
      @dir = dir
      @stack = File.join(dir, 'stack')
      @client_cfg = File.join(@stack, 'client.cfg')
      @ports = { a: ports[0], b: ports[1] }
      @times = []
    end

    after(:all) do
      warn "shared state e2e timings: #{@times.join('; ')}" unless @times.empty?
    end

    after do |example|
      next unless example.exception

      warn "\n===== shared state e2e failure: #{example.description}"
      SERVERS.each { |id| warn "----- #{id} runs.log:\n#{read(node_file(id, 'runs.log'))}\n----- #{id} puppet.log (this scenario):\n#{log_since(id)}" }
      %i[a b].each { |c| warn "----- compiler #{c}'s log (this scenario):\n#{server_log(c)}" } if @server_log_before
      warn "----- puppet kicker status:\n#{kicker(:a, 'status', '--render-as', 'json', allow_fail: true)}"
    end

    def longest_wait
      WAIT
    end

    def compiler_dir(which)
      File.join(@dir, "compiler-#{which}")
    end

    def server_log_path(which)
      File.join(compiler_dir(which), 'log', 'puppetserver.log')
    end

    # What a compiler logged in this scenario.
    def server_log(which)
      File.binread(server_log_path(which))[@server_log_before.fetch(which, 0)..].to_s.force_encoding('UTF-8')
    end

    # `puppet kicker ARGS` with a compiler's confdir and its puppet_kicker.yaml (the
    # default path there; spec_helper points PUPPET_KICKER_CONFIG elsewhere), as an
    # operator on that compiler.
    def kicker(which, *args, allow_fail: false)
      confdir = File.join(compiler_dir(which), 'etc')
      sh('puppet', 'kicker', *args, '--confdir', confdir, allow_fail: allow_fail,
                                                          env: { 'PUPPET_KICKER_CONFIG' => File.join(confdir, 'puppet_kicker.yaml') })
    end

    # The kick status document of `puppet kicker status` on that compiler.
    def shared_status(which)
      JSON.parse(kicker(which, 'status', '--render-as', 'json')).fetch('kicks').fetch('document')
    end

    # The agent of `id` asks `which` compiler for its catalogs (and reports there);
    # certificates come from compiler a's CA.
    def use_compiler(id, which)
      d = node_file(id, 'agent')
      FileUtils.mkdir_p(File.join(d, 'etc'))
      File.write(File.join(d, 'etc', 'puppet.conf'), <<~CONF)
        [main]
        certname = #{id}
        server = 127.0.0.1
        serverport = #{@ports.fetch(which)}
        ca_server = 127.0.0.1
        ca_port = #{@ports.fetch(:a)}
        vardir = #{d}/var
        ssldir = #{d}/ssl
        logdir = #{d}/log
        rundir = #{d}/run
        publicdir = #{d}/public
        codedir = #{d}/code
      CONF
    end

    # The code both compilers serve (compiler b's code directory is compiler a's).
    def site(node_pp:, haproxy_pp:)
      manifests = File.join(compiler_dir(:a), 'code', 'environments', 'production', 'manifests')
      File.write(File.join(manifests, 'site.pp'), <<~PUPPET)
        node default {
          case $facts['role'] {
            'node': {
        #{node_pp}
            }
            'haproxy': {
        #{KickWorld::HAPROXY_PP}
        #{haproxy_pp}
            }
            default: {}
          }
        }
      PUPPET
    end

    # A scenario: its code, which compiler each server's agent uses, and counts and
    # logs from here on.
    def scenario(name, compilers:, node_pp:, haproxy_pp: '')
      settle!
      @scenario = name
      @t0 = Time.now.to_f
      site(node_pp: node_pp, haproxy_pp: haproxy_pp)
      compilers.each { |id, which| use_compiler(id, which) }
      @runs_before = SERVERS.to_h { |id| [id, all_runs(id).size] }
      @log_before = SERVERS.to_h { |id| [id, File.exist?(node_file(id, 'puppet.log')) ? File.size(node_file(id, 'puppet.log')) : 0] }
      @server_log_before = %i[a b].to_h { |c| [c, File.size(server_log_path(c))] }
    end

    # `mco rpc puppet runonce` of these servers at once, as an operator would.
    def runonce(*ids)
      args = ids.flat_map { |id| ['-I', id] }
      out = sh('mco', 'rpc', 'puppet', 'runonce', *args, '--dt', '1', '--config', @client_cfg, '--json')
      replies = JSON.parse(out)
      expect(replies.map { |r| [r['sender'], r['statuscode']] }.sort).to eq(ids.sort.map { |id| [id, 0] }), "runonce #{ids}: #{out}"
    end

    # No run in progress, and the shared state has nothing pending or in flight.
    def idle?
      return false if SERVERS.any? { |id| running?(id) }

      status = shared_status(:a)
      status.fetch('pending').empty? && status.fetch('running').empty?
    end

    def settle!
      wait_for('every run to end and no kick to be pending') { idle? }
      counts = SERVERS.map { |id| all_runs(id).size }
      sleep QUIET
      expect(SERVERS.map { |id| all_runs(id).size }).to eq(counts), 'a run started after the system had settled'
    end

    # This scenario's kick outcomes in the shared state: [target, result, chain] each.
    def outcomes(status)
      status.fetch('recent_outcomes').select { |o| o['at'] / 1000.0 >= @t0 }
            .map { |o| o.values_at('target', 'result', 'chain') }
    end

    # A query of the kick state's PostgreSQL cluster, as its superuser (over its socket).
    # Its answer is stdout alone, run from / : as postgres, psql warns on stderr when
    # it cannot enter the working directory (a clone under /root).
    def psql(query)
      out, err, status = Open3.capture3(
        'runuser', '-u', 'postgres', '--', '/usr/lib/postgresql/15/bin/psql', '-X', '-tA', '-v', 'ON_ERROR_STOP=1',
        '-h', File.join(ENV.fetch('PK_PUPPETDB_DIR'), 'postgresql', 'run'), '-p', ENV.fetch('PK_PUPPETDB_PG_PORT'),
        '-U', 'postgres', '-d', 'puppet_kicker', '-c', query, chdir: '/'
      )
      raise "psql #{query.inspect} failed (#{status}):\n#{err}" unless status.success?

      out.strip
    end

    # The pid in a pid file of the compilers or of the stack.
    def pid_in(path)
      Integer(File.read(path).strip)
    end

    def compiler_pid(which)
      pid_in(File.join(compiler_dir(which), 'run', 'puppetserver.pid'))
    end

    def daemon_pid(id)
      pid_in(File.join(@stack, 'run', "#{id}.pid"))
    end

    # Sessions of the kick state's user inside a transaction (holding the row, perhaps).
    def sessions_in_transaction
      Integer(psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'puppet_kicker' AND state <> 'idle'"))
    end

    def haproxy_servers
      File.read(node_file(LB1, 'out/haproxy.cfg')).lines.grep(/^\s+server /).map(&:strip)
    end

    def expect_applied(id)
      runs(id).each { |r| expect([0, 2]).to include(r[:rc]), "#{id}'s run failed:\n#{log_since(id)}" }
    end

    # ---------------------------------------------------------------- scenarios

    it 'the compilers share one state in PostgreSQL, over TLS, and both say so' do
      store = "postgresql://puppet_kicker@127.0.0.1:#{ENV.fetch('PK_PUPPETDB_PG_PORT')}/puppet_kicker (schema puppet_kicker)"
      %i[a b].each do |which|
        expect(shared_status(which).fetch('state')).to eq('store' => store, 'shared' => true, 'outage' => nil), "compiler #{which}"
      end
    end

    it 'reports kicking one role reach both compilers within one window: the target runs once' do
      scenario('one window', compilers: { NODE1 => :a, NODE2 => :b, LB1 => :a, WEB1 => :a },
                             node_pp: "notify { 'kick -> haproxy': }")
      kicked_at = Time.now.to_f
      runonce(NODE1, NODE2)
      wait_for("#{LB1}'s kicked run to end") { runs(LB1).first&.key?(:end) }
      settle!

      counts = SERVERS.to_h { |id| [id, runs(id).size] }
      expect(counts).to eq(NODE1 => 1, NODE2 => 1, LB1 => 1, WEB1 => 0)
      SERVERS.each { |id| expect_applied(id) }
      expect(runs(LB1).first[:kicked]).to be(true), "lb1's run's options: #{runs(LB1).first[:options]}"
      # Each compiler processed one of the two reports: one queued the kick, the other
      # joined it (which one comes first is the race's).
      logs = { a: server_log(:a), b: server_log(:b) }
      queued = logs.select { |_, log| log.include?("puppet-kicker: kick queued for #{LB1}") }.keys
      joined = logs.select { |_, log| log.include?("puppet-kicker: kick of #{LB1} joins the one already queued") }.keys
      expect(queued.size).to eq(1), logs.values.join("\n")
      expect(joined).to eq(%i[a b] - queued), logs.values.join("\n")
      expect(runs(LB1).first[:start]).to be > [runs(NODE1).first[:end], runs(NODE2).first[:end]].max

      # One outcome, the same in both compilers' status.
      statuses = %i[a b].map { |c| shared_status(c) }
      expect(outcomes(statuses[0]).map { |t, r, _| [t, r] }).to eq([[LB1, 'started']])
      expect(outcomes(statuses[1])).to eq(outcomes(statuses[0]))
      expect(haproxy_servers).to eq([KickWorld::HAPROXY_LINE['node1', '127.0.0.11'], KickWorld::HAPROXY_LINE['node2', '127.0.0.12']])
      # The compilers' sessions are over TLS.
      sessions = psql("SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'puppet_kicker'")
      expect(sessions.lines.map(&:strip).uniq).to eq(['t']), sessions
      @times << "one window: lb1's kicked run started #{format('%.1f', runs(LB1).first[:start] - kicked_at)} s after the runonce " \
                "(coalesce #{COALESCE} s)"
    end

    it 'a loop through reports split across the compilers is cut' do
      # node1 -> compiler a, lb1 -> compiler b, node2 -> compiler a: each hop's report
      # is processed by the compiler that did not see the previous one.
      scenario('split loop', compilers: { NODE1 => :a, LB1 => :b, NODE2 => :a, WEB1 => :a },
                             node_pp: "notify { 'kick -> haproxy': }", haproxy_pp: "notify { 'kick -> node': }")
      runonce(NODE1)
      wait_for("#{NODE2}'s kicked run to end") { runs(NODE2).first&.key?(:end) }
      settle!

      counts = SERVERS.to_h { |id| [id, runs(id).size] }
      expect(counts).to eq(NODE1 => 1, NODE2 => 1, LB1 => 1, WEB1 => 0)
      SERVERS.each { |id| expect_applied(id) }
      expect([runs(LB1).first[:kicked], runs(NODE2).first[:kicked]]).to eq([true, true])
      # lb1's report, at compiler b, knows the chain compiler a started ...
      expect(server_log(:b)).to include("kick of #{NODE1} by #{LB1} (Notify[kick -> node]) suppressed: " \
                                        "it would close a loop: #{NODE1} -> #{LB1} -> #{NODE1}")
      # ... and node2's, back at compiler a, the chain compiler b extended.
      expect(server_log(:a)).to include("kick of #{LB1} by #{NODE2} (Notify[kick -> haproxy]) suppressed: " \
                                        "it would close a loop: #{NODE1} -> #{LB1} -> #{NODE2} -> #{LB1}")
      status = shared_status(:b)
      expect(outcomes(status)).to eq([[LB1, 'started', "#{NODE1} -> #{LB1}"], [NODE2, 'started', "#{NODE1} -> #{LB1} -> #{NODE2}"]])
      expect(status['role_cycles']).to eq([%w[haproxy node haproxy]])
      expect(shared_status(:a)['role_cycles']).to eq([%w[haproxy node haproxy]])
    end

    it 'PostgreSQL stopped: the kick waits, and is sent once when PostgreSQL is back' do
      scenario('outage', compilers: { NODE1 => :a, NODE2 => :a, LB1 => :b, WEB1 => :a },
                         node_pp: "notify { 'kick -> haproxy': }")
      sh('script/puppetdb', 'stop', 'postgresql')
      runonce(NODE1)
      wait_for("#{NODE1}'s run to end") { runs(NODE1).first&.key?(:end) }
      expect(server_log(:a)).to match(/shared kick state .* unreachable: .*kicks are kept in this host's cache dir/)
      # Past the coalescing window: the kick is due, and waits for the shared state.
      sleep COALESCE + 5
      expect(runs(LB1)).to eq([])
      back = Time.now.to_f
      sh('script/puppetdb', 'start', 'postgresql')
      wait_for("#{LB1}'s kicked run to end") { runs(LB1).first&.key?(:end) }
      settle!

      counts = SERVERS.to_h { |id| [id, runs(id).size] }
      expect(counts).to eq(NODE1 => 1, NODE2 => 0, LB1 => 1, WEB1 => 0)
      SERVERS.each { |id| expect_applied(id) }
      expect(runs(LB1).first[:kicked]).to be(true)
      status = shared_status(:b)
      expect(outcomes(status)).to eq([[LB1, 'started', "#{NODE1} -> #{LB1}"]])
      expect(status.fetch('state')).to include('outage' => nil)
      # Compiler b took no report during the outage: its first transaction after it,
      # on a pooled connection the restart closed, is not taken for an outage.
      expect(server_log(:b)).not_to include('unreachable')
      @times << "outage: lb1's kicked run started #{format('%.1f', runs(LB1).first[:start] - back)} s after PostgreSQL was started again"
    end

    # Last: compiler a does not come back.
    it 'a compiler SIGKILLed holding a claim: the other sends the kick after the lease, and lb1 runs once or twice' do
      scenario('killed compiler', compilers: { NODE1 => :a, NODE2 => :a, LB1 => :b, WEB1 => :a },
                                  node_pp: "notify { 'kick -> haproxy': }")
      runonce(NODE1)
      wait_for("#{NODE1}'s run to end") { runs(NODE1).first&.key?(:end) }
      expect(server_log(:a)).to include("puppet-kicker: kick queued for #{LB1}")
      # Compiler a is to claim the kick when it is due: compiler b is paused (SIGSTOP),
      # never inside a transaction; lb1's mcollectived is paused too, so that a's
      # runonce waits for its reply (kick.reply_timeout) holding the claim.
      Process.kill('STOP', daemon_pid(LB1))
      paused = 20.times.any? do
        Process.kill('STOP', compiler_pid(:b))
        next true if sessions_in_transaction.zero?

        Process.kill('CONT', compiler_pid(:b))
        sleep 0.2
        false
      end
      raise 'compiler b was inside a transaction each of 20 times it was paused' unless paused

      begin
        claimed = wait_for("compiler a to claim #{LB1}'s kick", COALESCE + 30) do
          shared_status(:a).fetch('pending').find { |p| p['target'] == LB1 && p['in_flight'] }
        end
        killed_at = Time.now.to_f
        Process.kill('KILL', compiler_pid(:a))
      ensure
        Process.kill('CONT', compiler_pid(:b))
        Process.kill('CONT', daemon_pid(LB1))
      end
      expect(claimed['attempts']).to eq(1), claimed.inspect
      wait_for("#{LB1}'s kick to be sent by compiler b", LEASE + WAIT) do
        outcomes(shared_status(:b)).any? { |target, result, _| target == LB1 && result == 'started' }
      end
      settle!
      # The claim of a, taken over (attempt 2). Logged by b's dispatcher; puppetserver's log
      # has it from lb1's next compile there.
      expect(server_log(:b)).to include("puppet-kicker: kicked #{LB1}: Puppet run started (attempt 2, chain #{NODE1} -> #{LB1})")

      # a's runonce may have reached lb1 before a died (its mcollectived took it in
      # when resumed): once or twice, never zero times.
      expect(runs(LB1).size).to be_between(1, 2), runs(LB1).inspect
      expect(runs(LB1).map { |r| r[:kicked] }.uniq).to eq([true])
      SERVERS.each { |id| expect_applied(id) }
      # Compiler b waited for the lease: a's claim was at most kick.reply_timeout old
      # when a was killed.
      expect(runs(LB1).last[:start]).to be >= killed_at + LEASE - REPLY_TIMEOUT - 2
      status = shared_status(:b)
      expect(outcomes(status).map { |t, r, _| [t, r] }).to eq([[LB1, 'started']])
      expect(runs(NODE1).size + runs(NODE2).size).to eq(1)
      @times << "killed compiler: lb1's runs started #{runs(LB1).map { |r| format('%.1f', r[:start] - killed_at) }.join(', ')} s " \
                "after compiler a was killed (lease #{LEASE} s)"
    end
  end
end
