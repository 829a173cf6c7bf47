# frozen_string_literal: true

require 'English'
require 'pty'
require_relative 'face_helper'

describe 'puppet kicker refresh', type: :face do
  let(:dir) { ScratchMaster.create }
  let(:servers) { YAML.safe_load_file(File.join(ROOT, 'examples', 'haproxy', 'servers.yaml')).size }

  %w[magnus ffi].each do |backend|
    it "refreshes now and prints the servers, the counts and the time taken (#{backend} backend)" do
      run = kicker(dir, 'refresh', backend: backend)
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.stdout).to match(/\ARefresh done: #{servers} servers \(#{servers} added, 0 changed, 0 dropped\) in (\d+ms|[\d.]+s)\n\z/)
      again = kicker(dir, 'refresh', '--wait', backend: backend)
      expect(again.stdout).to match(/\ARefresh done: #{servers} servers \(0 added, 0 changed, 0 dropped\) in /)
    end
  end

  it 'gives the refresh record with --render-as json' do
    record = kicker(dir, 'refresh', '--render-as', 'json').json
    expect(record).to include('source' => 'puppet_cache', 'outcome' => 'ok', 'servers' => servers, 'added' => servers,
                              'changed' => 0, 'dropped' => 0, 'failures' => 0, 'error' => nil)
    expect(record['duration_ms']).to be >= 0
    expect(kicker(dir, 'status', '--render-as', 'json').json['last_refresh']).to eq(record)
  end

  it 'prints no progress line when its output is not a terminal' do
    run = kicker(dir, 'refresh', '--wait')
    expect(run.stdout).not_to include("\r")
  end

  it 'shows progress on a terminal with --wait, then clears it for the result' do
    puppet = %w[confdir vardir logdir rundir codedir].flat_map { |n| ["--#{n}", File.join(dir, 'puppet', n)] }
    env = { 'PUPPET_KICKER_CONFIG' => File.join(dir, 'puppet_kicker.yaml'), 'RUBYLIB' => File.join(ROOT, 'lib') }
    output = +''
    PTY.spawn(env, '/usr/bin/puppet', 'kicker', 'refresh', '--wait', *puppet, chdir: dir) do |out, _in, pid|
      begin
        out.each_char { |c| output << c }
      rescue Errno::EIO
        nil # the terminal closed: the process ended
      end
      Process.wait(pid)
    end
    expect($CHILD_STATUS.exitstatus).to eq(0), output
    expect(output).to include("\r\e[K").and match(/Refresh done: #{servers} servers/)
  end

  it 'fails with the source\'s reason and exit 1 when the fact cache is gone; the snapshot still serves' do
    expect(kicker(dir, 'refresh').exitstatus).to eq(0)
    FileUtils.mv(File.join(dir, 'master'), File.join(dir, 'gone'))
    run = kicker(dir, 'refresh', '--wait')
    expect(run.exitstatus).to eq(1), run.to_s
    expect(run.stderr).to match(%r{Error: puppet kicker refresh: the puppet_cache source \(.*master/server_data/facts\) failed })
      .and include("(1 in a row; the last index, #{servers} servers, still serves): no fact cache directory could be read")
    expect(run.stderr).not_to include('Warning')
    expect(run.stderr).not_to match(/\.rb:\d+:in/)
    status = kicker(dir, 'status', '--render-as', 'json').json
    expect(status['last_refresh']).to include('outcome' => 'failed', 'failures' => 1)
    expect(status['index']['servers']).to eq(servers)
    expect(status['backoff']['failures']).to eq(1)
    query = kicker(dir, 'query', '--role', 'node')
    expect(query.exitstatus).to eq(0), query.to_s
    # Each `puppet kicker` is a process of its own: the row is counted from the
    # cache dir's record, not from 1 again.
    again = kicker(dir, 'refresh', '--wait')
    expect(again.exitstatus).to eq(1), again.to_s
    expect(again.stderr).to include('(2 in a row; ')
    expect(kicker(dir, 'status', '--render-as', 'json').json['last_refresh']).to include('failures' => 2)
  end
end
