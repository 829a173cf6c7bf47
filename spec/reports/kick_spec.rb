# frozen_string_literal: true

require 'spec_helper'
require 'puppet/reports'
require_relative '../../lib/puppet_kicker/kick'

# Reports built the way Puppet builds them: a real catalog applied in-process.
describe 'the kick report processor' do
  # Through both bindings: the processor runs in puppetserver's JRuby through ffi.
  each_backend do
    let(:host) { 'node1.example.com' }
    let(:settings) { { 'kick' => { 'dry_run' => true } } }
    let(:config_file) { File.join(ScratchMaster.create(settings), 'puppet_kicker.yaml') }
    let(:logs) { [] }

    around do |example|
      saved = ENV.fetch('PUPPET_KICKER_CONFIG', nil)
      ENV['PUPPET_KICKER_CONFIG'] = config_file
      example.run
    ensure
      ENV['PUPPET_KICKER_CONFIG'] = saved
    end

    before do
      # A real apply writes Puppet's state files; the spec helper points them at /dev/null.
      state = Dir.mktmpdir('puppet-kicker-state')
      Puppet[:statedir] = state
      Puppet[:transactionstorefile] = File.join(state, 'transactionstore.yaml')
      Puppet[:noop] = false
      # The report's host and environment come from these, as on an agent.
      Puppet[:certname] = host
      Puppet[:environment] = 'production'
      Puppet::Util::Log.newdestination(Puppet::Test::LogCollector.new(logs))
      Puppet::Util::Log.level = :info
    end

    after { Puppet::Util::Log.close_all }

    def apply(manifest_resources, noop: false)
      Puppet[:noop] = noop
      catalog = Puppet::Resource::Catalog.new(host, Puppet::Node::Environment.create(:production, []))
      manifest_resources.each { |r| catalog.add_resource(r) }
      catalog.apply.report.tap(&:finalize_report)
    end

    def process(report)
      report.extend(Puppet::Reports.report(:kick))
      report.process
      logs.map(&:message)
    end

    def notify(title)
      Puppet::Type.type(:notify).new(title: title)
    end

    def kick_on_change(dir, content, params)
      file = Puppet::Type.type(:file).new(path: File.join(dir, 'trigger'), content: content, notify: 'Kick[lbs]')
      [file, Puppet::Type.type(:kick).new({ title: 'lbs' }.merge(params))]
    end

    it "kicks the target role for a changed 'kick -> ROLE' notify, never the reporting server itself" do
      messages = process(apply([notify('kick -> haproxy'), notify('kick->node')]))
      expect(messages).to include('puppet-kicker: dry run: would kick lb1.example.com (chain node1.example.com -> lb1.example.com)')
      expect(messages).to include('puppet-kicker: dry run: would kick node2.example.com (chain node1.example.com -> node2.example.com)')
      # node1 has just run: it is left out of its own role's kick, and says so.
      expect(messages).to include('puppet-kicker: Notify[kick->node] from node1.example.com does not kick node1.example.com itself: it has just run')
      expect(messages.grep(/would kick node1\.example\.com/)).to be_empty
    end

    it 'takes a regex and a list of roles in the notify title' do
      messages = process(apply([notify('kick -> /^hap|^db/')]))
      expect(messages.grep(/would kick/)).to eq(['puppet-kicker: dry run: would kick lb1.example.com (chain node1.example.com -> lb1.example.com)'])
      logs.clear
      messages = process(apply([notify('kick -> /^hap/,  node')]))
      expect(messages.grep(/would kick/).size).to eq(3) # lb1, node2, node3 (not node1 itself)
    end

    it 'kicks for a kick resource only in the run where it was refreshed' do
      Dir.mktmpdir do |dir|
        first = process(apply(kick_on_change(dir, 'v1', role: 'haproxy')))
        expect(first).to include(match(/would kick lb1\.example\.com/))
        logs.clear
        unchanged = process(apply(kick_on_change(dir, 'v1', role: 'haproxy')))
        expect(unchanged.grep(/would kick/)).to be_empty
        logs.clear
        by_facts = process(apply(kick_on_change(dir, 'v2', facts: ['role=node', 'processors.count>=4'])))
        expect(by_facts.grep(/would kick/)).to eq([
                                                    'puppet-kicker: dry run: would kick node2.example.com (chain node1.example.com -> node2.example.com)',
                                                    'puppet-kicker: dry run: would kick node3.example.com (chain node1.example.com -> node3.example.com)',
                                                  ])
      end
    end

    it 'kicks nothing under --noop' do
      Dir.mktmpdir do |dir|
        messages = process(apply([notify('kick -> haproxy')] + kick_on_change(dir, 'v1', role: 'haproxy'), noop: true))
        expect(messages.grep(/would kick/)).to be_empty
      end
    end

    context 'with a policy' do
      let(:settings) { { 'kick' => { 'dry_run' => true, 'policy' => { 'node' => ['db'] } } } }

      it 'suppresses and logs kicks the policy does not allow' do
        messages = process(apply([notify('kick -> haproxy')]))
        expect(messages).to include(match(/kick of lb1\.example\.com by node1\.example\.com \(Notify\[kick -> haproxy\]\) suppressed: policy does not let role node kick role haproxy/))
      end
    end

    context 'when mcollective cannot be used' do
      let(:settings) do
        { 'mcollective' => { 'client_config' => '/nonexistent/client.cfg' },
          'kick' => { 'coalesce' => 0, 'exit_wait' => 2, 'retry_base' => 60 }, }
      end

      it 'keeps the kick, logs why it was not sent, and shows it in the status' do
        messages = process(apply([notify('kick -> haproxy')]))
        expect(messages).to include(match(/kick queued for lb1\.example\.com/))
        expect(messages).to include(match(%r{kick of lb1\.example\.com not started \(mcollective is not usable for kicks: .*/nonexistent/client\.cfg}))
        status = PuppetKicker.kick_status
        expect(status['pending']).to contain_exactly(include('target' => 'lb1.example.com', 'attempts' => 1, 'chain' => 'node1.example.com -> lb1.example.com'))
      end
    end
  end
end
