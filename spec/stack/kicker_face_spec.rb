# frozen_string_literal: true

require 'open3'
require 'tmpdir'
require 'yaml'
require_relative '../face/face_helper'

# `puppet kicker` with `source: mcollective`, against the real mcollectived daemons of
# script/mco-stack (PK_STACK_CLIENT_CFG names its client.cfg): refresh, status, query,
# explain, metrics; then with the broker stopped: all but refresh answer from the
# snapshot, refresh fails with the reason. Run by script/test-mcollective, after the other stack specs (it stops
# the broker and starts it again).
describe 'puppet kicker with source: mcollective', type: :face do
  client_cfg = ENV.fetch('PK_STACK_CLIENT_CFG') { raise 'PK_STACK_CLIENT_CFG is not set: run script/test-mcollective' }
  # The four daemons of script/mco-stack.
  daemons = 4

  before(:all) do
    @dir = Dir.mktmpdir('puppet-kicker-mco-face')
    File.write(File.join(@dir, 'puppet_kicker.yaml'), {
      'source' => 'mcollective',
      'mcollective' => { 'client_config' => client_cfg, 'discovery_timeout' => 1 },
      'cache' => { 'dir' => 'cache' },
    }.to_yaml)
  end

  it 'refreshes from the daemons, then shows it in status' do
    run = kicker(@dir, 'refresh', '--wait')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(run.stdout).to match(/\ARefresh done: #{daemons} servers \(#{daemons} added, 0 changed, 0 dropped\) in /)
    status = kicker(@dir, 'status', '--max-age', '600')
    expect(status.exitstatus).to eq(0), status.to_s
    expect(status.stdout).to match(/^source: +the mcollective source \(#{Regexp.escape(client_cfg)}; /)
      .and match(/^index: +#{daemons} servers, /)
      .and match(/^last refresh: +ok, .*: #{daemons} added, 0 changed, 0 dropped$/)
    record = kicker(@dir, 'status', '--render-as', 'json').json['last_refresh']
    expect(record).to include('source' => 'mcollective', 'outcome' => 'ok', 'servers' => daemons)
  end

  it 'answers query as the functions would, with what mcollective reports beside the facts' do
    run = kicker(@dir, 'query', '--role', 'node', '--facts', 'ipaddress,mcollective::collectives')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(run.stdout.lines.map { |line| line.split.first(3) }).to eq([%w[CERTNAME ENVIRONMENT ipaddress],
                                                                       %w[node1.example.com production 127.0.0.11],
                                                                       %w[node2.example.com production 127.0.0.12],
                                                                       %w[2 servers],])
    staging = kicker(@dir, 'query', 'processorcount>=4', '--environment', 'staging', '--render-as', 'json')
    expect(staging.json.map { |s| [s['certname'], s['mcollective::agents'].include?('rpcutil')] })
      .to eq([['web1.staging.example.com', true]])
  end

  it 'explains why a daemon is not in a pool' do
    run = kicker(@dir, 'explain', 'role=node', '--node', 'lb1.example.com')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(run.stdout).to start_with("lb1.example.com IS NOT returned by servers_with_facts('role=node') " \
                                     'in environment production')
    expect(run.stdout).to match(/^role=node +haproxy +string +fails$/)
  end

  it 'gives the metrics of the refresh it did' do
    run = kicker(@dir, 'metrics')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(run.stdout).to include("puppet_kicker_index_servers #{daemons}\n", "puppet_kicker_last_refresh_success 1\n",
                                  "puppet_kicker_refresh_failures 0\n")
  end

  it 'answers status from the snapshot with the broker stopped; refresh fails with the reason' do
    system(File.join(ROOT, 'script', 'mco-stack'), 'down', 'broker', exception: true, out: File::NULL)
    begin
      status = kicker(@dir, 'status', '--max-age', '600')
      expect(status.exitstatus).to eq(0), status.to_s
      expect(status.stdout).to match(/^index: +#{daemons} servers, /)
      refresh = kicker(@dir, 'refresh')
      expect(refresh.exitstatus).to eq(1), refresh.to_s
      expect(refresh.stderr).to include('Error: puppet kicker refresh: the mcollective source (')
        .and include("failed (1 in a row; the last index, #{daemons} servers, still serves): ")
      failed = kicker(@dir, 'status', '--render-as', 'json').json
      expect(failed['last_refresh']).to include('outcome' => 'failed', 'failures' => 1)
      expect(failed['index']['servers']).to eq(daemons)
      offline = [kicker(@dir, 'query', '--role', 'node'), kicker(@dir, 'explain', 'role=node', '--node', 'node1.example.com'),
                 kicker(@dir, 'metrics'), kicker(@dir, 'graph'),]
      expect(offline.map(&:exitstatus)).to eq([0, 0, 0, 0]), offline.join("\n")
      expect(offline[0].stdout).to end_with("2 servers\n")
      expect(offline[2].stdout).to include("puppet_kicker_last_refresh_success 0\n", "puppet_kicker_refresh_failures 1\n")
    ensure
      system(File.join(ROOT, 'script', 'mco-stack'), 'up', 'broker', out: File::NULL)
    end
  end
end
