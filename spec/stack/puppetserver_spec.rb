# frozen_string_literal: true

require 'json'
require 'open3'
require 'fileutils'

# puppet-kicker on Debian's real puppetserver 7.9 (JRuby 9.3, so the ffi backend):
# agents (`puppet agent --test`, each with its own certname and facts, several at
# once) compile catalogs that call all three functions and render the haproxy
# template from the facts puppetserver itself cached; their reports go to the `kick`
# report processor (dry run), which runs in the server's JRuby too.
#
# script/test-puppetserver starts the server (script/puppetserver, own confdir,
# vardir, ssl, code dir, 2 JRuby instances, a non-default server_datadir), sets
# PK_PUPPETSERVER_TEST=1, runs this file and stops the server by pid (spec/stack/ is
# not in the default rspec run).
describe 'puppetserver (JRuby) with puppet-kicker' do
  # certname => facts the agent reports (FACTER_* variables override Facter's own).
  PS_AGENTS = {
    'node1.example.com' => { 'role' => 'node', 'hostname' => 'node1', 'ipaddress' => '10.0.0.11', 'kicker_cores' => '2' },
    'node2.example.com' => { 'role' => 'node', 'hostname' => 'node2', 'ipaddress' => '10.0.0.12', 'kicker_cores' => '4' },
    'node3.example.com' => { 'role' => 'node', 'hostname' => 'node3', 'ipaddress' => '10.0.0.13', 'kicker_cores' => '8' },
    'lb1.example.com' => { 'role' => 'haproxy', 'hostname' => 'lb1', 'ipaddress' => '10.0.0.2', 'kicker_cores' => '2' },
    'lb2.example.com' => { 'role' => 'haproxy', 'hostname' => 'lb2', 'ipaddress' => '10.0.0.3', 'kicker_cores' => '2' },
  }.freeze
  PS_LBS = %w[lb1.example.com lb2.example.com].freeze
  # puppetserver 7.9 runs JRuby 9.3; 8 (script/test-puppet8) runs 9.4.
  PS_JRUBY = Regexp.escape(ENV.fetch('PK_PUPPETSERVER_JRUBY', '9.3'))
  PS_NODES = PS_AGENTS.keys - PS_LBS
  PS_SERVER_LINES = [
    '      server node1 10.0.0.11:8080 check inter 2000',
    '      server node2 10.0.0.12:8080 check inter 2000',
    '      server node3 10.0.0.13:8080 check inter 2000',
  ].freeze

  before(:all) do
    raise 'needs a running puppetserver: run script/test-puppetserver' unless ENV['PK_PUPPETSERVER_TEST'] == '1'

    @env = `#{ROOT}/script/puppetserver env`.lines.to_h { |l| l.chomp.split('=', 2) }
    @runs = {}
  end

  def agent_dir(certname)
    File.join(@env.fetch('PK_PUPPETSERVER_AGENTS'), certname)
  end

  def out_dir(certname)
    File.join(agent_dir(certname), 'out')
  end

  def site(manifest)
    FileUtils.cp(File.join(ROOT, 'spec', 'fixtures', 'puppetserver', manifest),
                 File.join(@env.fetch('PK_PUPPETSERVER_ENVDIR'), 'manifests', 'site.pp'))
  end

  # `puppet agent --test` as certname; [output, exit status, seconds].
  def agent(certname)
    facts = PS_AGENTS.fetch(certname).merge('fqdn' => certname, 'kicker_out' => out_dir(certname))
    env = facts.transform_keys { |name| "FACTER_#{name}" }
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out, status = Open3.capture2e(env, File.join(ROOT, 'script', 'puppetserver'), 'agent', certname, '--color=false')
    [out, status.exitstatus, Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0]
  end

  # Runs agents at once, one thread each; certname => [output, exit status, seconds].
  def in_parallel(certnames)
    certnames.map { |c| Thread.new { [c, agent(c)] } }.map(&:value).to_h
  end

  def expect_applied(runs)
    runs.each do |certname, (out, code, _)|
      # --test: 0 = no changes, 2 = changes; anything else is a failed run.
      expect([0, 2]).to include(code), "#{certname} exited #{code}:\n#{out}"
      # (Facter, in a sandbox, cannot read /proc/1/environ: harmless.)
      errors = out.lines.grep(/^Error:/).reject { |l| l.include?('Facter: Permission denied') }
      expect(errors).to be_empty, "#{certname}:\n#{out}"
    end
  end

  def catalog(certname)
    JSON.parse(File.read(File.join(agent_dir(certname), 'var', 'client_data', 'catalog', "#{certname}.json")))
  end

  def resource(catalog, type, title)
    catalog['resources'].find { |r| r['type'] == type && r['title'] == title } or
      raise "no #{type}[#{title}] in the catalog of #{catalog['name']}"
  end

  def server_log
    File.read(@env.fetch('PK_PUPPETSERVER_LOG'))
  end

  it 'caches the facts of agents that register, several at once, in $server_datadir/facts' do
    site('register.pp')
    runs = in_parallel(PS_AGENTS.keys)
    expect_applied(runs)
    facts_dir = @env.fetch('PK_PUPPETSERVER_FACTSDIR')
    # A server_datadir that is not the default: the core must find it through Puppet's settings.
    expect(facts_dir).not_to eq(File.join(@env.fetch('PK_PUPPETSERVER_VARDIR'), 'server_data', 'facts'))
    PS_AGENTS.each_key do |certname|
      cached = JSON.parse(File.read(File.join(facts_dir, "#{certname}.json")))
      expect(cached['values']).to include('role' => PS_AGENTS[certname]['role'], 'fqdn' => certname)
    end
  end

  it 'compiles, for agents running in parallel, catalogs that call all three functions and render haproxy.cfg' do
    site('site.pp')
    @runs = in_parallel(PS_LBS + PS_NODES)
    expect_applied(@runs)
    PS_LBS.each do |lb|
      cat = catalog(lb)
      content = resource(cat, 'File', "#{out_dir(lb)}/haproxy.cfg")['parameters']['content']
      expect(content.lines.grep(/^\s+server /).map(&:chomp)).to eq(PS_SERVER_LINES)
      expect(content).to include("listen web\n")
      expect(resource(cat, 'Notify', 'puppet-kicker answers')['parameters']['message']).to eq(
        'nodes=node1.example.com,node2.example.com,node3.example.com lb=lb1.example.com ' \
        'big=node2.example.com,node3.example.com missing=the default'
      )
      # Answered by the server's JRuby, through the ffi backend.
      expect(resource(cat, 'Notify', 'puppet-kicker backend')['parameters']['message']).to match(/\Affi on jruby #{PS_JRUBY}\./)
      # Applied by the agent: the rendered file is the catalog's.
      expect(File.read(File.join(out_dir(lb), 'haproxy.cfg'))).to eq(content)
    end
  end

  it 'loads the C-ABI library in JRuby, keeps the index in $vardir, and logs no load error' do
    log = server_log
    # The module installed from its package (script/test-puppetserver), libraries in native/.
    native = File.join(File.realpath(File.join(@env.fetch('PK_PUPPETSERVER_MODULES'), 'kicker')), 'native')
    library = File.join(native, 'libpuppet_kicker_ffi.so')
    # Servers converted by the module's Java reader (native/puppet_kicker_jruby.jar).
    reader = ", servers read in Java from #{File.join(native, 'puppet_kicker_jruby.jar')}"
    expect(log).to match(/puppet-kicker: ffi backend loaded from #{Regexp.escape(library)} \(core [^)]+\), jruby #{PS_JRUBY}\.[^,)]*#{Regexp.escape(reader)}\)/)
    expect(log).not_to match(/LoadError|cannot load puppet-kicker|Evaluation Error/)
    expect(File).to exist(File.join(@env.fetch('PK_PUPPETSERVER_VARDIR'), 'puppet_kicker', 'index.msgpack'))
  end

  it "runs the kick report processor in the server's JRuby (dry run), for the nodes' reports" do
    # Dry-run kicks may be decided in the background, after the coalescing window,
    # and logged with a later report: one more node run brings any out.
    sleep 2
    expect_applied(node1: agent('node1.example.com'))
    log = server_log
    expect(log).to match(/puppet-kicker: dry run: would kick lb1\.example\.com \(chain node\d\.example\.com -> lb1\.example\.com\)/)
    expect(log).to match(/puppet-kicker: dry run: would kick lb2\.example\.com \(chain node\d\.example\.com -> lb2\.example\.com\)/)
    # Never the reporting server, never a node (only role haproxy was asked for).
    expect(log).not_to match(/would kick node\d/)
    expect(log).not_to match(/report from \S+ not processed|Report processor failed/)
  end

  it 'answers the same catalog again from the warm index, in the same order' do
    out, code, seconds = agent('lb1.example.com')
    expect([0, 2]).to include(code), out
    content = resource(catalog('lb1.example.com'), 'File', "#{out_dir('lb1.example.com')}/haproxy.cfg")['parameters']['content']
    expect(content.lines.grep(/^\s+server /).map(&:chomp)).to eq(PS_SERVER_LINES)
    puts "  (lb1's second run: #{seconds.round(1)} s)"
  end
end
