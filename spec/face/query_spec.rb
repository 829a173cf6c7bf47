# frozen_string_literal: true

require_relative 'face_helper'

describe 'puppet kicker query', type: :face do
  before(:all) { @dir = ScratchMaster.create }

  %w[magnus ffi].each do |backend|
    context "through the #{backend} backend" do
      it 'prints a table of certname, environment and the chosen facts, in the functions\' order' do
        run = kicker(@dir, 'query', '--role', 'node', '--facts', 'ipaddress,os.release.full,nope', backend: backend)
        expect(run.exitstatus).to eq(0), run.to_s
        expect(run.stdout).to eq(<<~TABLE)
          CERTNAME           ENVIRONMENT  ipaddress  os.release.full  nope
          node1.example.com  production   10.0.0.11  12.5             -
          node2.example.com  production   10.0.0.12  12.5             -
          node3.example.com  production   10.0.0.13  11.10            -
          3 servers
        TABLE
      end

      it 'gives with --render-as json exactly the Hashes a compile gets, in the same order' do
        run = kicker(@dir, 'query', 'processors.count>2', '--render-as', 'json', backend: backend)
        expect(run.exitstatus).to eq(0), run.to_s
        out = File.join(@dir, "compiled-#{backend}.json")
        template = '<%= require "json"; JSON.generate(scope.call_function("servers_with_facts", ["processors.count>2"])) %>'
        manifest = "file { '#{out}': content => inline_template('#{template}') }"
        applied = Open3.capture3({ 'PUPPET_KICKER_CONFIG' => File.join(@dir, 'puppet_kicker.yaml'),
                                   'PUPPET_KICKER_BACKEND' => backend, },
                                 'puppet', 'apply', '--modulepath', File.join(ROOT, 'spec', 'fixtures', 'modules'),
                                 '--confdir', File.join(@dir, 'puppet', 'confdir'),
                                 '--vardir', File.join(@dir, 'puppet', 'vardir'), '-e', manifest)
        expect(applied[2]).to be_success, applied[1]
        expect(run.json).to eq(JSON.parse(File.read(out)))
        expect(run.json.map { |s| s['certname'] }).to eq(%w[node2.example.com node3.example.com])
      end
    end
  end

  it 'combines clauses and --role, and asks in the environment --environment names' do
    run = kicker(@dir, 'query', 'os.release.major=12', '--role', 'node', '--render-as', 'json')
    expect(run.json.map { |s| s['certname'] }).to eq(%w[node1.example.com node2.example.com])
    run = kicker(@dir, 'query', '--role', 'node', '--environment', 'staging')
    expect(run.stdout.lines.map { |l| l.split.first }).to eq(%w[CERTNAME node9.staging.example.com 1])
    run = kicker(@dir, 'query', '--role', '/^no/', '--render-as', 'yaml')
    expect(YAML.safe_load(run.stdout).size).to eq(3)
  end

  it 'says when nothing matches, which is not an error' do
    run = kicker(@dir, 'query', 'hostname=/^web/')
    expect([run.exitstatus, run.stdout]).to eq([0, "No server matches.\n"])
  end

  it 'names a bad clause and its column, without a backtrace, and exits 1' do
    run = kicker(@dir, 'query', 'uptime')
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include("clause 'uptime': no operator").and include('(at column 7)')
    expect(run.stderr).not_to match(/\.rb:\d+:in/)
  end

  it 'asks for a clause or a role when given neither' do
    run = kicker(@dir, 'query')
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include('give a CLAUSE or --role ROLE')
  end

  it 'refuses to answer from no data at all, saying why, rather than print an empty list' do
    dir = ScratchMaster.create('puppet_cache' => { 'dirs' => ['nowhere/facts'] })
    run = kicker(dir, 'query', '--role', 'node')
    expect(run.exitstatus).to eq(1)
    expect(run.stdout).to be_empty
    expect(run.stderr).to include('puppet-kicker has no fact data').and include("#{dir}/nowhere/facts (not found)")
  end
end
