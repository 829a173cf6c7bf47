# frozen_string_literal: true

require_relative 'face_helper'
require 'fileutils'
require 'tmpdir'
require 'yaml'

describe 'puppet kicker explain', type: :face do
  # The example's fact cache, plus a server the example lacks: a list fact, and no
  # fact naming its environment (so the default rule decides it).
  def self.scratch_master
    dir = ScratchMaster.create
    extra = File.join(dir, 'extra-servers.yaml')
    File.write(extra, { 'web3.example.com' => { 'fqdn' => 'web3.example.com', 'hostname' => 'web3', 'role' => 'web',
                                                'tags' => %w[blue canary], 'ports' => [80, 443], } }.to_yaml)
    submit = File.join(ROOT, 'examples', 'haproxy', 'submit_facts.rb')
    system('ruby', submit, extra, File.join(dir, 'master'), 'json', out: File::NULL, exception: true)
    dir
  end

  before(:all) { @dir = self.class.scratch_master }

  # What the run printed, the date of the facts taken out (and their age, unless
  # days): they depend on when the scratch master was made.
  def body(run)
    run.stdout.gsub(/facts of \d{4}-\d\d-\d\d \d\d:\d\d UTC/, 'facts of DATE').gsub(/, \d+[smh] old/, ', AGE old')
  end

  %w[magnus ffi].each do |backend|
    it "explains a server in the pool, clause by clause, through the #{backend} backend" do
      run = kicker(@dir, 'explain', 'role=node', 'hostname=~/^node/', 'processors.count>=2', '--node',
                   'node3.example.com', backend: backend)
      expect(run.exitstatus).to eq(0), run.to_s
      expect(body(run)).to eq(<<~OUT)
        node3.example.com IS returned by servers_with_facts('role=node', 'hostname=~/^node/', 'processors.count>=2') in environment production

        CLAUSE               FOUND  COMPARISON  RESULT
        role=node            node   string      holds
        hostname=~/^node/    node3  regex       holds
        processors.count>=2  8      integer     holds

        environment production (its `environment` fact), the compile's
        facts of DATE, AGE old, within max_age 7d
      OUT
    end
  end

  it 'names the environment rule when the server is in another environment (node9: staging)' do
    run = kicker(@dir, 'explain', 'role=node', '--node', 'node9.staging.example.com')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(run.stdout.lines.first(2).join).to eq(<<~OUT)
      node9.staging.example.com IS NOT returned by servers_with_facts('role=node') in environment production
        because environment staging (its `environment` fact), not the compile's production
    OUT
    staging = kicker(@dir, 'explain', 'role=node', '--node', 'node9.staging.example.com', '--environment', 'staging')
    expect(staging.stdout.lines.first).to start_with('node9.staging.example.com IS returned')
  end

  it 'gives max_age as the reason for a server that stopped reporting (node0), with --role' do
    run = kicker(@dir, 'explain', '--role', 'node', '--node', 'node0.example.com')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(body(run)).to eq(<<~OUT)
      node0.example.com IS NOT returned by servers_with_role('node') in environment production
        because facts of DATE, 30d old, older than max_age 7d

      environment production (its `environment` fact), the compile's
      facts of DATE, 30d old, older than max_age 7d
      role fact `role` is node, one of node
    OUT
  end

  it 'shows a version comparison, a missing fact and the first clause that fails' do
    run = kicker(@dir, 'explain', 'os.release.full>=12', 'kernel=Linux', '--node', 'node3.example.com')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(body(run)).to eq(<<~OUT)
      node3.example.com IS NOT returned by servers_with_facts('os.release.full>=12', 'kernel=Linux') in environment production
        because 'os.release.full>=12' does not hold on 11.10

      CLAUSE               FOUND    COMPARISON  RESULT
      os.release.full>=12  11.10    version     fails
      kernel=Linux         missing  -           fails

      environment production (its `environment` fact), the compile's
      facts of DATE, AGE old, within max_age 7d
    OUT
  end

  it 'tells a list fact element by element, and the default environment rule' do
    run = kicker(@dir, 'explain', 'tags!=canary', 'ports>100', '--node', 'web3.example.com')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(body(run)).to eq(<<~OUT)
      web3.example.com IS NOT returned by servers_with_facts('tags!=canary', 'ports>100') in environment production
        because 'tags!=canary' does not hold on ["blue","canary"]

      CLAUSE        FOUND              COMPARISON  RESULT
      tags!=canary  ["blue","canary"]  string      fails
        [0]         blue               string      no match
        [1]         canary             string      match
      ports>100     [80,443]           integer     holds
        [0]         80                 integer     no match
        [1]         443                integer     match

      environment production (the default, production: no fact names one, the master has not seen it), the compile's
      facts of DATE, AGE old, within max_age 7d
    OUT
  end

  it 'gives the structured answer with --render-as json' do
    run = kicker(@dir, 'explain', 'os.release.full>=12', '--node', 'node3.example.com', '--render-as', 'json')
    expect(run.exitstatus).to eq(0), run.to_s
    answer = run.json
    expect(answer.keys).to eq(%w[call certname clauses environment generation max_age reason returned role])
    expect(answer.values_at('certname', 'returned', 'role')).to eq(['node3.example.com', false, nil])
    expect(answer['clauses']).to eq([{ 'clause' => 'os.release.full>=12', 'path' => 'os.release.full',
                                       'missing' => false, 'found' => '11.10', 'comparison' => 'version',
                                       'negated' => false, 'elements' => nil, 'holds' => false,
                                       'says' => "'os.release.full>=12' does not hold on 11.10", }])
    expect(answer['environment']).to include('server' => 'production', 'asked' => 'production', 'rule' => 'fact',
                                             'scoped' => true, 'holds' => true)
    expect(answer['max_age']).to include('max_age' => 604_800, 'holds' => true)
    yaml = kicker(@dir, 'explain', 'os.release.full>=12', '--node', 'node3.example.com', '--render-as', 'yaml')
    expect(YAML.safe_load(yaml.stdout).except('max_age')).to eq(answer.except('max_age'))
  end

  it 'names an unknown node and the closest certnames, without a backtrace, and exits 1' do
    run = kicker(@dir, 'explain', 'role=node', '--node', 'node3')
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include('Error: puppet kicker explain: no server node3 in the index (7 servers); ' \
                                  'did you mean node3.example.com?')
    expect(run.stderr).not_to match(/\.rb:\d+:in/)
    expect(kicker(@dir, 'explain', 'role=node', '--node', 'mystery.example.com').stderr)
      .to include('no server mystery.example.com in the index (7 servers)')
  end

  it 'names a bad clause and its column, and asks for --node or for a clause' do
    run = kicker(@dir, 'explain', 'uptime', '--node', 'node3.example.com')
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include("clause 'uptime': no operator").and include('(at column 7)')
    expect(run.stderr).not_to match(/\.rb:\d+:in/)
    no_node = kicker(@dir, 'explain', 'role=node')
    expect([no_node.exitstatus, no_node.stderr]).to match([1, /options are required: node/])
    nothing = kicker(@dir, 'explain', '--node', 'node3.example.com')
    expect([nothing.exitstatus, nothing.stderr]).to match([1, /give a CLAUSE or --role ROLE/])
  end

  it 'answers from the snapshot when the fact cache is gone' do
    dir = self.class.scratch_master
    first = kicker(dir, 'explain', 'role=node', '--node', 'node1.example.com')
    expect(first.exitstatus).to eq(0), first.to_s
    FileUtils.rm_rf(File.join(dir, 'master'))
    again = kicker(dir, 'explain', 'role=node', '--node', 'node1.example.com')
    expect(again.exitstatus).to eq(0), again.to_s
    expect(body(again)).to eq(body(first))
  ensure
    FileUtils.rm_rf(dir)
  end

  it 'gives the no-data error when there is no data yet' do
    dir = Dir.mktmpdir('puppet-kicker-spec')
    File.write(File.join(dir, 'puppet_kicker.yaml'),
               { 'puppet_cache' => { 'dirs' => ['missing'] }, 'cache' => { 'dir' => 'cache' } }.to_yaml)
    run = kicker(dir, 'explain', 'role=node', '--node', 'node1.example.com')
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include('puppet-kicker has no fact data')
    expect(run.stderr).not_to match(/\.rb:\d+:in/)
  ensure
    FileUtils.rm_rf(dir)
  end
end
