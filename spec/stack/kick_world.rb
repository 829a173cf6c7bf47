# frozen_string_literal: true

require 'fileutils'
require 'json'
require 'open3'
require 'yaml'
require_relative 'node_runs'

# The world of the end-to-end kick scenarios, whatever carries the kicks (the
# mcollective stack of kick_e2e_spec.rb, the sshd of kick_ssh_e2e_spec.rb): four
# servers whose every Puppet run is a real `puppet apply --reports kick` of the
# manifest of their role (spec/fixtures/kick_e2e/run-puppet), a load balancer whose
# haproxy.cfg lists the servers of role `node`, and each scenario's own kick state.
#
# The including spec sets `@stack` (the stack's directory, with nodes/<id>/) and
# `@e2e` (`@stack`/kick_e2e, which run-puppet reads), calls `prepare_world` in
# before(:all), and defines `kicker_settings(name)`: the puppet_kicker.yaml keys
# that say where the facts come from and how kicks are carried.
module KickWorld
  include NodeRuns

  NODE1 = 'node1.example.com'
  NODE2 = 'node2.example.com'
  LB1 = 'lb1.example.com'
  WEB1 = 'web1.staging.example.com'
  SERVERS = [NODE1, NODE2, LB1, WEB1].freeze
  # Longest wait for any one thing: a run, a kick, the system settling.
  WAIT = Integer(ENV.fetch('PK_KICK_E2E_WAIT', '90'))
  # After settling: this long without any new run or kick means nothing more comes.
  # Longer than coalesce + retry_max + a run's start, so a straggling kick would show.
  QUIET = Integer(ENV.fetch('PK_KICK_E2E_QUIET', '8'))
  HAPROXY_LINE = ->(host, ip) { "server #{host} #{ip}:8080 check inter 2000" }
  # The kick keys every scenario shares: quick coalescing and retries.
  KICK = { 'coalesce' => 1, 'retry_base' => 2, 'retry_max' => 4, 'exit_wait' => 60 }.freeze

  # Every role `haproxy` server renders its haproxy.cfg from the servers of role `node`.
  HAPROXY_PP = <<~'PUPPET'
    $out = $facts['kick_e2e_out']
    $nodes = servers_with_role('node')
    $listen = 'web'
    file { $out: ensure => directory }
    file { "${out}/haproxy.cfg": ensure => file, content => template('kicker/haproxy.cfg.erb') }
  PUPPET

  # The kick e2e directory, emptied, with this checkout's module copied in: a `rake
  # compile` elsewhere in the checkout must not replace the library under a running
  # `puppet apply`.
  def prepare_world
    FileUtils.rm_rf(@e2e)
    FileUtils.mkdir_p(%w[manifests slow out cache modules/kicker].map { |d| File.join(@e2e, d) })
    %w[lib native templates metadata.json].each { |f| FileUtils.cp_r(File.join(ROOT, f), File.join(@e2e, 'modules', 'kicker')) }
    @times = []
  end

  def longest_wait
    WAIT
  end

  # What every server ran and logged in the failed scenario, and the kick status.
  def dump_failure(example)
    warn "\n===== kick e2e failure: #{example.description}"
    SERVERS.each do |id|
      warn "----- #{id} runs.log:\n#{read(node_file(id, 'runs.log'))}"
      warn "----- #{id} puppet.log (this scenario):\n#{log_since(id)}"
    end
    warn "----- kick-status.json:\n#{read(status_file)}" if @scenario
  end

  # A scenario: its own kick state and snapshot (cache.dir), its manifests, and
  # counts and logs from here on.
  def scenario(name, node_pp:, haproxy_pp:)
    settle!
    @scenario = name
    @t0 = Time.now.to_f
    settings = { 'cache' => { 'dir' => File.join(@e2e, 'cache', name), 'ttl' => 0 } }.merge(kicker_settings(name))
    settings['kick'] = KICK.merge(settings.fetch('kick', {}))
    File.write(File.join(@e2e, 'puppet_kicker.yaml'), settings.to_yaml)
    File.write(File.join(@e2e, 'manifests', 'node.pp'), node_pp)
    File.write(File.join(@e2e, 'manifests', 'haproxy.pp'), HAPROXY_PP + haproxy_pp)
    @runs_before = SERVERS.to_h { |id| [id, all_runs(id).size] }
    @log_before = SERVERS.to_h { |id| [id, File.exist?(node_file(id, 'puppet.log')) ? File.size(node_file(id, 'puppet.log')) : 0] }
  end

  def status_file
    File.join(@e2e, 'cache', @scenario, 'kick-status.json')
  end

  def kick_status
    JSON.parse(File.read(status_file))
  rescue Errno::ENOENT
    {}
  end

  # The kicks' outcomes of this scenario: [target, result, chain] each.
  def outcomes
    kick_status.fetch('recent_outcomes', []).map { |o| o.values_at('target', 'result', 'chain') }
  end

  def haproxy_servers
    File.read(File.join(@e2e, 'out', LB1, 'haproxy.cfg')).lines.grep(/^\s+server /).map(&:strip)
  end

  # Nothing runs and no kick is pending or running.
  def idle?
    status = @scenario ? kick_status : {}
    SERVERS.none? { |id| running?(id) } && Array(status['pending']).empty? && Array(status['running']).empty?
  end

  # Waits until idle, then QUIET seconds more, and checks that nothing started meanwhile.
  def settle!
    wait_for('every run to end and no kick to be pending') { idle? }
    counts = SERVERS.map { |id| all_runs(id).size }
    sleep QUIET
    expect(SERVERS.map { |id| all_runs(id).size }).to eq(counts), 'a run started after the system had settled'
    expect(idle?).to be(true)
  end

  def timing(text)
    @times << "#{@scenario}: #{text}"
  end

  def ago(time)
    format('%.1f s', time - @t0)
  end

  # The manifest of a node whose change (its backend.conf) refreshes a kick of the
  # load balancers: it kicks only when something changed.
  NODE_PP = <<~'PUPPET'
    $out = $facts['kick_e2e_out']
    file { $out: ensure => directory }
    file { "${out}/backend.conf":
      ensure  => file,
      content => "backend ${facts['fqdn']} ${facts['ipaddress']}:8080\n",
      notify  => Kick['load balancers'],
    }
    kick { 'load balancers': role => 'haproxy' }
  PUPPET
end
