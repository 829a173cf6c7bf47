# frozen_string_literal: true

require 'spec_helper'
require 'open3'
require 'rbconfig'
require 'tmpdir'

# The masterless helper, from the Ruby side: when a process starts it, and that what
# it starts is a detached process of its own that does the work and exits.
describe PuppetKicker::Helper do
  # Whether a fresh Ruby that loaded Puppet (and `puppet apply`'s application, or not)
  # counts as masterless.
  def masterless_in(setup, env = {})
    script = "require 'puppet'; #{setup}; require 'puppet_kicker'; print PuppetKicker::Helper.masterless?"
    out, status = Open3.capture2e(env, RbConfig.ruby, '-I', File.join(ROOT, 'lib'), '-e', script)
    expect(status).to be_success, out
    out.lines.last
  end

  it 'counts `puppet apply` as masterless, and not a master, a test, or PUPPET_KICKER_HELPER=0' do
    expect(masterless_in("require 'puppet/application/apply'")).to eq('true')
    expect(masterless_in("require 'puppet/application/apply'", 'PUPPET_KICKER_HELPER' => '0')).to eq('false')
    expect(masterless_in("require 'puppet/application/apply'; Puppet.settings.preferred_run_mode = :server")).to eq('false')
    expect(masterless_in('nil')).to eq('false'), 'Puppet loaded by another tool (or rspec)'
    expect(described_class.masterless?).to be(false), 'this rspec process never starts helpers'
  end

  it 'is wanted only by a masterless process with work left' do
    expect(described_class.wanted?({ 'work_left' => ['refresh'] }, masterless: true)).to be(true)
    expect(described_class.wanted?({ 'work_left' => %w[refresh kicks] }, masterless: true)).to be(true)
    expect(described_class.wanted?({ 'work_left' => [] }, masterless: true)).to be(false)
    expect(described_class.wanted?({}, masterless: true)).to be(false)
    expect(described_class.wanted?({ 'work_left' => ['kicks'] }, masterless: false)).to be(false)
  end

  it 'status says what this process leaves undone, and which helper runs' do
    status = PuppetKicker.status
    expect(status['work_left']).to eq([])
    expect(status).to have_key('helper')
  end

  context 'spawned for real' do
    around do |example|
      @dir = ScratchMaster.create('cache' => { 'dir' => 'cache', 'ttl' => 60 })
      example.run
    ensure
      FileUtils.rm_rf(@dir)
    end

    let(:settings) { [@dir, File.join(@dir, 'var'), '', File.join(@dir, 'puppet_kicker.yaml')] }
    let(:cache) { File.join(@dir, 'cache') }

    def wait_for_exit(pid)
      deadline = Time.now + 60
      loop do
        Process.kill(0, pid)
        raise "helper #{pid} still runs after 60 s" if Time.now > deadline

        sleep 0.1
      rescue Errno::ESRCH
        return
      end
    end

    it 'runs detached in its own process group, refreshes the stale index, logs and exits; one at a time' do
      FileUtils.mkdir_p(cache, mode: 0o750)
      # Held: another helper runs, so this one exits at once and leaves the refresh wanted.
      File.open(File.join(cache, 'helper.lock'), File::RDWR | File::CREAT, 0o600) do |lock|
        lock.flock(File::LOCK_EX)
        pid = described_class.spawn(settings, cache)
        wait_for_exit(pid)
        expect(File.read(File.join(cache, 'helper.log'))).to include('AlreadyRunning')
        expect(File.exist?(File.join(cache, 'refresh.wanted'))).to be(true)
        expect(File.exist?(File.join(cache, 'index.msgpack'))).to be(false)
      end

      pid = described_class.spawn(settings, cache)
      expect(Process.getpgid(pid)).to eq(pid)
      wait_for_exit(pid)
      log = File.read(File.join(cache, 'helper.log'))
      expect(log).to match(/helper\[#{pid}\]: helper started for #{Regexp.escape(cache)}/)
      expect(log).to match(/helper\[#{pid}\]: refresh done: \d+ servers/)
      expect(log).to match(/helper\[#{pid}\]: helper exits after \d+s: Done/)
      expect(File.exist?(File.join(cache, 'index.msgpack'))).to be(true)
      expect(File.exist?(File.join(cache, 'refresh.wanted'))).to be(false)
      expect(File.exist?(File.join(cache, 'helper.json'))).to be(false)
      expect(File.stat(File.join(cache, 'helper.log')).mode & 0o777).to eq(0o600)
    end
  end
end
