# frozen_string_literal: true

require_relative 'face_helper'

describe 'puppet kicker metrics', type: :face do
  # Sample lines as name => value, and every metric's TYPE.
  def samples(text)
    text.lines.grep_v(/\A#/).to_h { |line| line.split.then { |name, value| [name, value] } }
  end

  def types(text)
    text.lines.grep(/\A# TYPE /).to_h { |line| line.split[2..3] }
  end

  before(:all) do
    @dir = ScratchMaster.create
    @refresh = kicker(@dir, 'refresh')
  end

  it 'prints the index, refresh and kick metrics in Prometheus text, with HELP and TYPE for each' do
    expect(@refresh.exitstatus).to eq(0), @refresh.to_s
    run = kicker(@dir, 'metrics')
    expect(run.exitstatus).to eq(0), run.to_s
    values = samples(run.stdout)
    expect(types(run.stdout).keys).to eq(%w[index_servers index_age_seconds index_bytes snapshot_bytes refresh_failures
                                            last_refresh_success last_refresh_duration_seconds last_refresh_timestamp_seconds
                                            kicks_pending kicks_sent_total kicks_failed_total kicks_suppressed_total
                                            kicks_confirmed_total kicks_unconfirmed_total kick_to_report_seconds
                                            kick_state_reachable]
                                           .map { |name| "puppet_kicker_#{name}" })
    expect(values.keys.grep(/confirmed_total\{/)).to eq(%w[changed unchanged failed unknown].map { |o| %(puppet_kicker_kicks_confirmed_total{outcome="#{o}"}) })
    expect(values).to include('puppet_kicker_kick_to_report_seconds_bucket{le="+Inf"}' => '0',
                              'puppet_kicker_kick_to_report_seconds_count' => '0', 'puppet_kicker_kicks_unconfirmed_total' => '0')
    expect(values).to include('puppet_kicker_index_servers' => '6', 'puppet_kicker_refresh_failures' => '0',
                              'puppet_kicker_last_refresh_success' => '1', 'puppet_kicker_kicks_pending' => '0',
                              'puppet_kicker_kick_state_reachable' => '1')
    expect(Float(values['puppet_kicker_index_age_seconds'])).to be_between(0, 600)
    expect(Float(values['puppet_kicker_last_refresh_timestamp_seconds'])).to be_within(600).of(Time.now.to_f)
    expect(types(run.stdout).values.tally).to eq('gauge' => 10, 'counter' => 5, 'histogram' => 1)
    expect(run.stdout.lines.grep(/\A# HELP /).size).to eq(16)
  end

  it 'counts a kick that could not be sent (no mcollective here) among the pending' do
    kick = kicker(@dir, 'kick', '--role', 'haproxy', '--wait', '1')
    expect(kick.exitstatus).to eq(4), kick.to_s
    expect(samples(kicker(@dir, 'metrics').stdout)).to include('puppet_kicker_kicks_pending' => '1')
  end

  it 'writes them atomically to a .prom file readable by node_exporter, printing nothing' do
    path = File.join(@dir, 'textfile', 'puppet_kicker.prom')
    FileUtils.mkdir_p(File.dirname(path))
    run = kicker(@dir, 'metrics', '--textfile', path)
    expect([run.exitstatus, run.stdout]).to eq([0, '']), run.to_s
    expect(samples(File.read(path))).to include('puppet_kicker_index_servers' => '6')
    expect(File.stat(path).mode & 0o777).to eq(0o644)
    expect(Dir.children(File.dirname(path))).to eq(['puppet_kicker.prom'])
  end

  it 'refuses a textfile node_exporter would not read, or a missing directory, by name' do
    run = kicker(@dir, 'metrics', '--textfile', File.join(@dir, 'metrics.txt'))
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include("--textfile #{@dir}/metrics.txt: node_exporter's textfile collector reads only *.prom")
    expect(run.stderr).not_to include('Try ')
    run = kicker(@dir, 'metrics', '--textfile', File.join(@dir, 'nowhere', 'x.prom'))
    expect([run.exitstatus, run.stderr]).to match([1, include("no directory #{@dir}/nowhere")])
  end

  it 'says the data is infinitely old when there is none, and answers offline' do
    dir = ScratchMaster.create('puppet_cache' => { 'dirs' => ['nowhere/facts'] })
    run = kicker(dir, 'metrics')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(samples(run.stdout)).to include('puppet_kicker_index_servers' => '0', 'puppet_kicker_index_age_seconds' => '+Inf',
                                           'puppet_kicker_last_refresh_success' => '0')
  end
end
