# frozen_string_literal: true

require 'spec_helper'
require 'json'
require 'socket'
require 'tmpdir'

# The magnus binding waits in Rust (a cold start up to `cache.cold_start_timeout`, a
# kick flush up to `kick.exit_wait`) with MRI's GVL released: other Ruby threads of
# the master keep running meanwhile instead of stopping for the whole wait.
describe 'the magnus binding while the core waits' do
  # A "broker" that accepts connections and never answers: the mcollective source
  # and the kick transport wait on it until their deadlines.
  before(:all) do
    @silent_broker = TCPServer.new('127.0.0.1', 0)
    @accepted = []
    @acceptor = Thread.new { loop { @accepted << @silent_broker.accept } }
  end

  after(:all) do
    @acceptor.kill
    @accepted.each(&:close)
    @silent_broker.close
  end

  around do |example|
    @dir = Dir.mktmpdir('puppet-kicker-gvl')
    saved = ENV.fetch('PUPPET_KICKER_CONFIG', nil)
    ENV['PUPPET_KICKER_CONFIG'] = File.join(@dir, 'puppet_kicker.yaml')
    PuppetKicker.with_backend('magnus') { example.run }
  ensure
    ENV['PUPPET_KICKER_CONFIG'] = saved
    FileUtils.rm_rf(@dir)
  end

  def write_config(settings)
    File.write(File.join(@dir, 'client.cfg'), '')
    mcollective = {
      'client_config' => File.join(@dir, 'client.cfg'), 'connector' => 'rabbitmq',
      'pool' => ["127.0.0.1:#{@silent_broker.addr[1]}"], 'user' => 'u', 'password' => 'p', 'psk' => 'k',
      'identity' => 'master', 'main_collective' => 'mcollective', 'collectives' => ['mcollective'],
      'connect_timeout' => 30,
    }
    File.write(ENV.fetch('PUPPET_KICKER_CONFIG'), YAML.dump({ 'mcollective' => mcollective }.merge(settings)))
    PuppetKicker.configure(confdir: @dir, vardir: @dir, server_datadir: File.join(@dir, 'server_data'))
  end

  # Runs the block in this thread while another counts; returns how long the block
  # took and how often the other thread counted meanwhile.
  def counting_while
    count = 0
    counter = Thread.new do
      loop do
        count += 1
        sleep 0.01
      end
    end
    sleep 0.05 until count.positive?
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    before = count
    yield
    [Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, count - before]
  ensure
    counter&.kill
  end

  it 'lets other threads run during a cold start wait' do
    write_config('source' => 'mcollective', 'cache' => { 'dir' => File.join(@dir, 'cache'), 'cold_start_timeout' => 2 })
    error = nil
    waited, counted = counting_while do
      PuppetKicker.native.servers_with_role(['web'], 'production')
    rescue PuppetKicker::NoDataError => e
      error = e
    end
    expect(error.message).to include('did not answer within 2s')
    expect(waited).to be >= 1.9
    # ~100 a second when the counter runs freely; 1 when the wait holds the GVL.
    expect(counted).to be > 50
  end

  it 'lets other threads run while a kick flush waits for its kicks to go out' do
    facts = File.join(@dir, 'server_data', 'facts')
    FileUtils.mkdir_p(facts)
    stamp = Time.now.utc.strftime('%Y-%m-%dT%H:%M:%S.%N+00:00')
    { 'node1.example.com' => 'node', 'web1.example.com' => 'web' }.each do |certname, role|
      document = { 'name' => certname, 'values' => { 'role' => role }, 'timestamp' => stamp, 'expiration' => stamp }
      File.write(File.join(facts, "#{certname}.json"), JSON.generate(document))
    end
    write_config('cache' => { 'dir' => File.join(@dir, 'cache') },
                 'kick' => { 'coalesce' => '0s', 'exit_wait' => '2s' })
    report = { 'host' => 'node1.example.com', 'environment' => 'production', 'time' => (Time.now.to_f * 1000).to_i,
               'kicks' => [{ 'resource' => 'Notify[kick -> web]', 'roles' => ['web'] }], }
    PuppetKicker.native.kick_report(JSON.generate(report))
    lines = nil
    waited, counted = counting_while { lines = PuppetKicker.native.kick_flush }
    expect(lines.map(&:last).join("\n")).to include('1 kick(s) not yet delivered')
    expect(waited).to be >= 1.9
    expect(counted).to be > 50
  end

  it 'answers every call while other Ruby threads run (a pending thread switch is not an error)' do
    facts = File.join(@dir, 'server_data', 'facts')
    FileUtils.mkdir_p(facts)
    stamp = Time.now.utc.strftime('%Y-%m-%dT%H:%M:%S.%N+00:00')
    document = { 'name' => 'web1.example.com', 'values' => { 'role' => 'web' }, 'timestamp' => stamp, 'expiration' => stamp }
    File.write(File.join(facts, 'web1.example.com.json'), JSON.generate(document))
    write_config('cache' => { 'dir' => File.join(@dir, 'cache') })
    # A thread that never sleeps: MRI's timer asks the running thread to switch
    # every 100 ms, and a call into the core can find that request pending.
    busy = Thread.new { loop { Math.sqrt(2) } }
    calls = 0
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 2
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      expect(PuppetKicker.native.servers_with_facts(['role=web'], 'production').size).to eq(1)
      calls += 1
    end
    expect(calls).to be > 10
  ensure
    busy&.kill
  end
end
