# frozen_string_literal: true

require 'fileutils'
require 'json'
require 'open3'
require 'tmpdir'
require 'yaml'
require_relative 'node_runs'

# `puppet kicker kick` on the kick e2e stack (see kick_e2e_spec.rb): an operator's
# kick of a role makes its servers' mcollectived run a real `puppet apply` (through
# spec/fixtures/kick_e2e/run-puppet), and the table says started.
#
# Run by script/test-kick-e2e after kick_e2e_spec.rb, on the same stack (its
# PK_KICK_E2E_STACK_DIR).
module KickFaceE2E
  RSpec.describe 'puppet kicker kick on the mcollective stack', order: :defined do
    include NodeRuns

    stack = ENV.fetch('PK_KICK_E2E_STACK_DIR') { raise 'PK_KICK_E2E_STACK_DIR is not set: run script/test-kick-e2e' }
    LB1 = 'lb1.example.com'
    NODES = %w[node1.example.com node2.example.com].freeze
    SERVERS = ([LB1] + NODES + ['web1.staging.example.com']).freeze
    MASTER = 'master.example.com'
    WAIT = Integer(ENV.fetch('PK_KICK_E2E_WAIT', '90'))

    before(:all) do
      @stack = stack
      @e2e = File.join(stack, 'kick_e2e')
      FileUtils.mkdir_p(%w[manifests slow out cache modules/kicker].map { |d| File.join(@e2e, d) })
      # The module, copied as kick_e2e_spec does: runs must not load a library a
      # `rake compile` may be replacing.
      %w[lib native templates metadata.json].each do |f|
        FileUtils.cp_r(File.join(ROOT, f), File.join(@e2e, 'modules', 'kicker'))
      end
      # No kicks in the runs themselves: only the operator's.
      %w[node haproxy].each { |role| File.write(File.join(@e2e, 'manifests', "#{role}.pp"), "notify { 'ran': }\n") }
      FileUtils.rm_rf(File.join(@e2e, 'cache', 'face')) # this spec's kick state and snapshot, from scratch
      @config = File.join(@e2e, 'puppet_kicker.yaml')
      File.write(@config, {
        'source' => 'mcollective',
        'mcollective' => { 'client_config' => File.join(stack, 'client.cfg'), 'discovery_timeout' => 1 },
        'cache' => { 'dir' => File.join(@e2e, 'cache', 'face'), 'ttl' => 0 },
        'kick' => { 'coalesce' => 1, 'retry_base' => 2, 'retry_max' => 4, 'exit_wait' => 60 },
      }.to_yaml)
      @puppet = Dir.mktmpdir('puppet-kicker-face-e2e')
      NODES.each { |id| sh('script/mco-stack', 'up', id) }
      wait_for('every run to end') { SERVERS.none? { |id| running?(id) } }
      @runs_before = SERVERS.to_h { |id| [id, all_runs(id).size] }
    end

    def longest_wait
      WAIT
    end

    def sh(*cmd)
      out, status = Open3.capture2e(*cmd, chdir: ROOT)
      raise "#{cmd.join(' ')} failed (#{status}):\n#{out}" unless status.success?

      out
    end

    # The table's rows (after the kick's log lines, before the count), split in cells.
    def rows(out)
      out.lines.drop_while { |l| !l.start_with?('TARGET') }.drop(1).first(2).map(&:split)
    end

    def kicker(*args)
      dirs = %w[confdir vardir logdir rundir codedir].flat_map { |name| ["--#{name}", File.join(@puppet, name)] }
      env = { 'PUPPET_KICKER_CONFIG' => @config, 'RUBYLIB' => File.join(ROOT, 'lib'), 'PUPPET_KICKER_HELPER' => '0' }
      Open3.capture3(env, '/usr/bin/puppet', 'kicker', *args, '--certname', MASTER, *dirs, chdir: @puppet)
    end

    it 'shows with --dry-run the servers of the role and that it would kick them, and runs nothing' do
      out, err, status = kicker('kick', '--role', 'node', '--dry-run')
      expect(status.exitstatus).to eq(0), "#{out}\n#{err}"
      expect(rows(out).map { |r| r.first(4) }).to eq(NODES.map { |id| [id, 'node', 'would', 'kick'] })
      sleep 3
      expect(SERVERS.map { |id| runs(id).size }).to eq([0, 0, 0, 0])
    end

    # The kicked runs are `puppet apply --reports kick` with this same configuration and
    # cache dir: their reports confirm the kicks, and an explicit --wait waits for that.
    it "makes the role's servers run Puppet, and with --wait the table says their reports confirmed it" do
      out, err, status = kicker('kick', '--role', 'node', '--wait', '60', '--color', 'false')
      expect(status.exitstatus).to eq(0), "#{out}\n#{err}"
      expect(rows(out).map { |r| r.first(3) }).to eq(NODES.map { |id| [id, 'node', 'confirmed'] })
      expect(out).to include('2 targets: 2 confirmed')
      NODES.each do |id|
        # Log lines on stderr, the table alone on stdout.
        expect(err).to include("Notice: puppet-kicker: kicked #{id}: Puppet run started (attempt 1, chain #{MASTER} -> #{id})")
        wait_for("#{id}'s kicked run to end") { runs(id).first&.key?(:end) }
        expect(runs(id).size).to eq(1)
        expect(runs(id).first).to include(rc: 0, kicked: true)
        expect(log_since(id)).to include("Notice: ran\n").or include('defined \'message\' as \'ran\'')
      end
      expect(runs(LB1)).to eq([])
      status_file = JSON.parse(File.read(File.join(@e2e, 'cache', 'face', 'kick-status.json')))
      expect(status_file['recent_outcomes'].map { |o| o.values_at('target', 'result', 'chain') })
        .to eq(NODES.map { |id| [id, 'started', "#{MASTER} -> #{id}"] })
      expect(status_file['counters']).to include('sent' => 2)
    end
  end
end
