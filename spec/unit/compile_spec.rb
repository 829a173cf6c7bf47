# frozen_string_literal: true

require 'spec_helper'
require 'json'
require 'timeout'
require 'tmpdir'

# What the functions use of Puppet's scope: its compiler (and its node) and environment.
module CompileSpec
  Environment = Struct.new(:name)
  Node = Struct.new(:name)
  Compiler = Struct.new(:node)
  Scope = Struct.new(:compiler, :environment)
end

# The functions' calls within one compile (PuppetKicker::Functions, the bodies of the
# functions in lib/puppet/functions): the first configures the core from
# Puppet's settings, takes the core's log and notes the node's environment; the others,
# most of them kept answers, skip all three. A setting changed between compiles is
# picked up by the next compile, and a kept answer still expires within a compile.
describe 'function calls within a compile' do
  # A master's fact cache with `servers` (certname => facts, each optionally
  # `age` seconds old), and its puppet_kicker.yaml; returns the yaml's path.
  def master(servers, config = {})
    dir = Dir.mktmpdir('puppet-kicker-compile', @dir)
    facts = File.join(dir, 'facts')
    FileUtils.mkdir_p(facts)
    servers.each { |certname, values| write_facts(facts, certname, values) }
    File.write(File.join(dir, 'puppet_kicker.yaml'),
               YAML.dump({ 'puppet_cache' => { 'dirs' => [facts] }, 'cache' => { 'dir' => File.join(dir, 'cache') } }
                         .merge(config)))
    File.join(dir, 'puppet_kicker.yaml')
  end

  def write_facts(dir, certname, values)
    values = values.dup
    stamp = (Time.now - values.delete('age').to_i).utc.strftime('%Y-%m-%dT%H:%M:%S.%N+00:00')
    document = { 'name' => certname, 'values' => values, 'timestamp' => stamp, 'expiration' => stamp }
    File.write(File.join(dir, "#{certname}.json"), JSON.generate(document))
  end

  def web(name, extra = {})
    { "#{name}.example.com" => { 'fqdn' => "#{name}.example.com", 'hostname' => name, 'role' => 'web',
                                 'environment' => 'production', }.merge(extra) }
  end

  # A compile of node lb1.example.com in production: a new compiler each time.
  def new_compile
    CompileSpec::Scope.new(CompileSpec::Compiler.new(CompileSpec::Node.new('lb1.example.com')),
                           CompileSpec::Environment.new(:production))
  end

  # servers_with_role(role), the body of lib/puppet/functions/servers_with_role.rb.
  def servers_with_role(scope, role)
    PuppetKicker::Functions.servers_with_role(scope, role, nil)
  end

  def hostnames(servers)
    servers.map { |s| s['hostname'] }
  end

  # Starts a refresh and waits for its end: a new index generation.
  def refresh
    ticket = PuppetKicker.command('refresh')['ticket']
    Timeout.timeout(60) do
      sleep 0.01 until PuppetKicker.command('refresh_progress', 'ticket' => ticket, 'wait_ms' => 500)['done']
    end
  end

  around do |example|
    @dir = Dir.mktmpdir('puppet-kicker-compile')
    saved = ENV.fetch('PUPPET_KICKER_CONFIG', nil)
    example.run
  ensure
    ENV['PUPPET_KICKER_CONFIG'] = saved
    FileUtils.rm_rf(@dir)
  end

  each_backend do
    it 'configures the core once per compile, from the settings as they are at its first call' do
      first = master(web('web1'))
      second = master(web('web2').merge(web('web3')))
      checks = 0
      allow(PuppetKicker).to receive(:configure).and_wrap_original do |original, *args|
        checks += 1
        original.call(*args)
      end
      configured = []
      allow(PuppetKicker.native).to receive(:configure).and_wrap_original do |original, *args|
        configured << args[3]
        original.call(*args)
      end

      ENV['PUPPET_KICKER_CONFIG'] = first
      compile = new_compile
      4.times { expect(hostnames(servers_with_role(compile, 'web'))).to eq(['web1']) }
      expect([checks, configured]).to eq([1, [first]])

      # Changed between compiles (here PUPPET_KICKER_CONFIG, one of what configure reads):
      # the next compile's first call reconfigures the core.
      ENV['PUPPET_KICKER_CONFIG'] = second
      expect(hostnames(servers_with_role(compile, 'web'))).to eq(['web1']) # the same compile: its settings
      later = new_compile
      2.times { expect(hostnames(servers_with_role(later, 'web'))).to eq(%w[web2 web3]) }
      expect([checks, configured]).to eq([2, [first, second]])
      # Each compile checks Puppet's settings; unchanged, the core is not configured again.
      servers_with_role(new_compile, 'web')
      expect([checks, configured]).to eq([3, [first, second]])
    end

    it "takes the core's log at a compile's first call and after a failure, and notes the node once per compile" do
      ENV['PUPPET_KICKER_CONFIG'] = master(web('web1'))
      native = PuppetKicker.native
      allow(native).to receive(:log_pending).and_return(1)
      allow(native).to receive(:take_log).and_return([%w[warning from-the-core]])
      allow(native).to receive(:note_environment).and_call_original
      warnings = []
      allow(Puppet).to receive(:warning) { |message| warnings << message }

      compile = new_compile
      3.times { servers_with_role(compile, 'web') }
      expect(warnings).to eq(['puppet-kicker: from-the-core'])
      expect(native).to have_received(:note_environment).once.with('lb1.example.com', 'production')
      # A failed call logs, whatever call of its compile it is.
      expect { servers_with_role(compile, '/(?=x)/') }.to raise_error(Puppet::ParseError, /servers_with_role: role/)
      expect(warnings.size).to eq(2)

      later = new_compile
      2.times { servers_with_role(later, 'web') }
      expect(warnings.size).to eq(3)
      expect(native).to have_received(:note_environment).twice
    end

    it 'still gives a new answer within a compile when the index is replaced or a server passes max_age' do
      # web1's facts reach max_age (20 s) 8 s after this example starts.
      config = master(web('web1', 'age' => 12).merge(web('web2')), 'max_age' => 20)
      ENV['PUPPET_KICKER_CONFIG'] = config
      compile = new_compile
      kept = servers_with_role(compile, 'web')
      expect(hostnames(kept)).to eq(%w[web1 web2])
      expect(servers_with_role(compile, 'web')).to equal(kept)

      # A new index generation, with a new server.
      write_facts(File.join(File.dirname(config), 'facts'), 'web3.example.com', web('web3').values.first)
      refresh
      renewed = servers_with_role(compile, 'web')
      expect(hostnames(renewed)).to eq(%w[web1 web2 web3])
      expect(servers_with_role(compile, 'web')).to equal(renewed)

      # web1 passes max_age: the answer holds no longer, with the same index.
      sleep 0.1 until hostnames(servers_with_role(compile, 'web')) == %w[web2 web3] || Time.now > @started + 30
      expect(hostnames(servers_with_role(compile, 'web'))).to eq(%w[web2 web3])
    end
  end

  before { @started = Time.now }

  it 'makes one C call for a kept answer of each function of the ffi backend in a compile: pk_answer_holds' do
    PuppetKicker.with_backend('ffi') do
      ENV['PUPPET_KICKER_CONFIG'] = master(web('web1').merge(web('web2')))
      compile = new_compile
      clauses = ['role=web', 'hostname=/^web/']
      calls = {
        'servers_with_role' => -> { PuppetKicker::Functions.servers_with_role(compile, 'web', nil) },
        'servers_with_facts' => -> { PuppetKicker::Functions.servers_with_facts(compile, clauses.map(&:dup)) },
        'server_with_role' => -> { PuppetKicker::Functions.server_with_role(compile, 'web', nil) },
      }
      call = ->(function) { calls[function].call }
      kept = calls.keys.to_h { |function| [function, call.call(function)] }
      expect(hostnames(kept['servers_with_role'])).to eq(%w[web1 web2])
      expect(kept['servers_with_facts']).to eq(kept['servers_with_role'])
      expect(kept['server_with_role']).to equal(kept['servers_with_role'].first)

      lib = PuppetKicker.native.instance_variable_get(:@lib)
      made = []
      %i[pk_answer_holds pk_log_pending pk_configure pk_select pk_note_environment pk_fetch].each do |function|
        allow(lib).to receive(function).and_wrap_original do |original, *args|
          made << function
          original.call(*args)
        end
      end
      # Straight from the answer the backend holds: not through the facade's query.
      %i[servers_with_role servers_with_facts server_with_role].each do |query|
        allow(PuppetKicker).to receive(query).and_call_original
      end
      calls.each_key { |function| expect(call.call(function)).to equal(kept[function]) }
      expect(made).to eq(%i[pk_answer_holds] * 3)
      %i[servers_with_role servers_with_facts server_with_role].each do |query|
        expect(PuppetKicker).not_to have_received(query)
      end
    end
  end

  it "converts only the first server for the ffi backend's server_with_role, and holds it" do
    PuppetKicker.with_backend('ffi') do
      ENV['PUPPET_KICKER_CONFIG'] = master(web('web1').merge(web('web2')).merge(web('web3')))
      PuppetKicker.configure
      ffi = PuppetKicker.native
      first = ffi.server_with_role(['web'], 'production')
      expect(first['hostname']).to eq('web1')
      expect(ffi.instance_variable_get(:@cache).size).to eq(1)
      expect(ffi.server_with_role(['web'], 'production')).to equal(first)
      expect(ffi.server_with_role(['nobody'], 'production')).to be_nil
      # The same server when servers_with_role converts them all.
      expect(ffi.servers_with_role(['web'], 'production').first).to equal(first)
    end
  end

  it 'keeps each answer of the ffi backend under its own query, whatever the callers do with their arguments' do
    PuppetKicker.with_backend('ffi') do
      ENV['PUPPET_KICKER_CONFIG'] = master(web('web1').merge(web('web2')).merge(
                                             'db1.example.com' => { 'fqdn' => 'db1.example.com', 'hostname' => 'db1', 'role' => 'db',
                                                                    'environment' => 'production', }
                                           ))
      PuppetKicker.configure
      ffi = PuppetKicker.native
      role = +'web'
      web = ffi.servers_with_role([role], 'production')
      role << 'x' # the caller's String, changed: the answer is kept under a copy
      expect(ffi.servers_with_role(['web'], 'production')).to equal(web)
      expect(ffi.servers_with_role(['webx'], 'production')).to eq([])
      # Queries that share a prefix, or the same arguments in another op, are told apart.
      both = ffi.servers_with_role(%w[web db], 'production')
      expect(hostnames(both)).to eq(%w[db1 web1 web2])
      expect(ffi.servers_with_role(['web'], 'production')).to equal(web)
      expect(hostnames(ffi.servers_with_facts(['role=web'], 'production'))).to eq(%w[web1 web2])
      expect(ffi.servers_with_role(%w[web db], 'production')).to equal(both)
      expect(ffi.server_with_role(%w[web db], 'production')).to equal(both.first)
      expect(ffi.servers_with_role(['web'], 'staging')).to eq([])
      # Arguments the core refuses are refused each time, never kept.
      2.times { expect { ffi.servers_with_role([nil], 'production') }.to raise_error(PuppetKicker::Error) }
      2.times { expect { ffi.servers_with_facts('role=web', 'production') }.to raise_error(PuppetKicker::Error) }
    end
  end
end
