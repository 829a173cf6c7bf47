# frozen_string_literal: true

require 'open3'
require 'tmpdir'
require 'yaml'

# `source: mcollective` inside a real `puppet apply`: the functions answer from an
# index refreshed by rpcutil#inventory of the real mcollectived daemons of
# script/mco-stack, whose client.cfg PK_STACK_CLIENT_CFG names. Run by
# script/test-mcollective, which starts the stack (spec/stack/ is not in the default run).
describe 'source: mcollective in puppet apply' do
  client_cfg = ENV.fetch('PK_STACK_CLIENT_CFG') { raise 'PK_STACK_CLIENT_CFG is not set: run script/test-mcollective' }

  before(:all) do
    @work = Dir.mktmpdir('puppet-kicker-mco-apply')
    FileUtils.mkdir_p(File.join(@work, 'modules'))
    File.symlink(ROOT, File.join(@work, 'modules', 'kicker'))
    File.write(File.join(@work, 'puppet_kicker.yaml'), {
      'source' => 'mcollective',
      'mcollective' => { 'client_config' => client_cfg, 'discovery_timeout' => 1 },
      'cache' => { 'dir' => 'cache' },
    }.to_yaml)
    File.write(File.join(@work, 'site.pp'), <<~'PUPPET')
      $nodes = servers_with_facts('role=node')
      $balancers = servers_with_facts('mcollective::classes=haproxy')
      $staging = servers_with_facts('environment=staging', 'processorcount>=4')
      notice("nodes: ${nodes.map |$n| { "${n['certname']} ${n['ipaddress']} os ${n['os']['release']['full']}" }.join(', ')}")
      notice("haproxy class: ${balancers.map |$n| { $n['hostname'] }.join(', ')}")
      notice("staging: ${staging.map |$n| { "${n['fqdn']} in ${n['mcollective::collectives'].join('+')}" }.join(', ')}")
      notice(inline_template("puppet agent on: <%= scope.call_function('servers_with_role', ['node']).select { |s| s['mcollective::agents'].include?('puppet') }.map { |s| s['hostname'] }.join(',') %>"))
    PUPPET
  end

  def apply
    env = { 'PUPPET_KICKER_CONFIG' => File.join(@work, 'puppet_kicker.yaml') }
    dirs = %w[confdir codedir vardir logdir rundir].flat_map { |d| ["--#{d}", File.join(@work, 'puppet', d)] }
    started = Time.now
    stdout, stderr, status = Open3.capture3(env, 'puppet', 'apply', '--color=false', '--modulepath', File.join(@work, 'modules'),
                                            *dirs, File.join(@work, 'site.pp'))
    [stdout.lines.grep(/Notice: Scope/).map { |l| l.sub(/.*Scope\(Class\[main\]\): /, '').strip },
     stderr.lines.reject { |l| l.include?('Facter: Permission denied') }.join, status, Time.now - started,]
  end

  it 'answers servers_with_facts from the index the daemons filled, and from its snapshot the next time' do
    notices, stderr, status, took = apply
    expect(status).to be_success, stderr
    expect(stderr).to eq('')
    expect(notices).to eq([
                            'nodes: node1.example.com 127.0.0.11 os 12.5, node2.example.com 127.0.0.12 os 12.5',
                            'haproxy class: lb1',
                            'staging: web1.staging.example.com in mcollective+staging',
                            'puppet agent on: node1,node2',
                          ])
    snapshot = File.join(@work, 'cache', 'index.msgpack')
    expect(File).to exist(snapshot)
    mtime = File.mtime(snapshot)

    again, stderr, status, warm = apply
    expect(status).to be_success, stderr
    expect(again).to eq(notices)
    expect(File.mtime(snapshot)).to eq(mtime) # answered from the snapshot, no refresh (cache.ttl 60 s)
    warn format('puppet apply with source: mcollective: cold %.1f s, warm %.1f s', took, warm)
  end
end
