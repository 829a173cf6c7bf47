# frozen_string_literal: true

require_relative 'face_helper'

describe 'puppet kicker status', type: :face do
  let(:dir) { ScratchMaster.create }
  let(:servers) { YAML.safe_load_file(File.join(ROOT, 'examples', 'haproxy', 'servers.yaml')).size }

  it 'says there is no data yet, and with --max-age exits 2, without starting a refresh' do
    run = kicker(dir, 'status', '--max-age', '60')
    expect(run.exitstatus).to eq(2), run.to_s
    expect(run.stdout).to match(/^index: +no data$/)
      .and match(/^last refresh: +none recorded$/)
      .and match(/^max age: +60s: no data \(exit 2\)$/)
    expect(run.stderr).to eq('')
    expect(File).not_to exist(File.join(dir, 'cache', 'refresh.json'))
    expect([kicker(dir, 'status').exitstatus, kicker(dir, 'status').stdout]).to eq([0, run.stdout.sub(/^max age.*\n/, '')])
  end

  context 'after a refresh' do
    before { expect(kicker(dir, 'refresh').exitstatus).to eq(0) }

    %w[magnus ffi].each do |backend|
      it "shows the index, the last refresh and its counts (#{backend} backend)" do
        run = kicker(dir, 'status', backend: backend)
        expect(run.exitstatus).to eq(0), run.to_s
        lines = run.stdout.lines.map { |l| l.split(':', 2).first }
        expect(lines).to eq(['source', 'index', 'memory', 'snapshot', 'last refresh', 'backoff', 'kicks', 'helper'])
        expect(run.stdout).to match(/^source: +the puppet_cache source \(.*master/)
          .and match(/^index: +#{servers} servers, generation \d+, built \d{4}-\d\d-\d\dT[\d:]+Z \((\d+ms|[\d.]+s) ago\)$/)
          .and match(%r{^snapshot: +#{Regexp.escape(dir)}/cache/\S+ \([\d.]+ KiB\)$})
          .and match(/^last refresh: +ok, .* pid \d+: #{servers} added, 0 changed, 0 dropped$/)
          .and match(/^backoff: +none$/)
          .and match(/^kicks: +none recorded$/)
          .and match(/^helper: +none running$/)
        # Aligned: every value starts in the same column.
        expect(run.stdout.lines.map { |l| l[/\A[^:]+:\s+/].length }.uniq.size).to eq(1)
      end
    end

    it 'gives with --render-as json stable keys, times in Unix ms and counts as numbers' do
      status = kicker(dir, 'status', '--render-as', 'json').json
      # Stable: sorted, as the core writes every object.
      expect(status.keys).to eq(%w[now_ms source source_description config_file cache_dir index last_refresh
                                   last_refresh_unreadable backoff kicks helper max_age_seconds stale exit_code].sort)
      expect(status['index'].keys).to eq(%w[generation servers built_at_ms age_ms bytes snapshot].sort)
      expect(status['index']).to include('servers' => servers, 'bytes' => be > 0)
      expect(status['index']['snapshot']['bytes']).to be > 0
      record = status['last_refresh']
      expect(record.keys).to eq(%w[source pid generation servers started_ms finished_ms duration_ms outcome error added
                                   changed dropped failures retry_at_ms index_bytes].sort)
      expect(record).to include('source' => 'puppet_cache', 'outcome' => 'ok', 'error' => nil, 'servers' => servers,
                                'added' => servers, 'changed' => 0, 'dropped' => 0, 'failures' => 0)
      expect(record['finished_ms']).to be_between(record['started_ms'], status['now_ms'])
      expect(status['index']['built_at_ms']).to be <= record['finished_ms']
      expect(status['backoff']).to eq('failures' => 0, 'retry_at_ms' => nil)
      expect(YAML.safe_load(kicker(dir, 'status', '--render-as', 'yaml').stdout).keys).to eq(status.keys)
    end

    it 'counts what a second refresh changed: a fact file rewritten, one removed, one added' do
      facts = File.join(dir, 'master', 'server_data', 'facts')
      files = Dir.children(facts).sort
      node = JSON.parse(File.read(File.join(facts, files[0])))
      # Facts collected at another second (the index keeps whole seconds).
      node['timestamp'] = (Time.now - 7200).utc.iso8601
      File.write(File.join(facts, files[0]), JSON.generate(node))
      added = node.merge('name' => 'new.example.com')
      added['values'] = node['values'].merge('fqdn' => 'new.example.com', 'hostname' => 'new')
      File.write(File.join(facts, 'new.example.com.json'), JSON.generate(added))
      File.delete(File.join(facts, files[1]))
      run = kicker(dir, 'refresh', '--render-as', 'json')
      expect(run.json).to include('added' => 1, 'changed' => 1, 'dropped' => 1, 'servers' => servers)
    end

    it 'is a monitoring check with --max-age: 2 when older, 0 when fresh, printed either way' do
      sleep 1.1
      old = kicker(dir, 'status', '--max-age', '0')
      expect(old.exitstatus).to eq(2), old.to_s
      expect(old.stdout).to match(/^max age: +0s: exceeded, the data is [\d.]+s old \(exit 2\)$/)
      fresh = kicker(dir, 'status', '--max-age', '86400', '--render-as', 'json')
      expect(fresh.exitstatus).to eq(0)
      expect(fresh.json).to include('max_age_seconds' => 86_400, 'stale' => false, 'exit_code' => 0)
    end

    it 'answers offline, from the snapshot, when the fact cache is gone' do
      FileUtils.mv(File.join(dir, 'master'), File.join(dir, 'gone'))
      run = kicker(dir, 'status', '--max-age', '3600')
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.stdout).to match(/^index: +#{servers} servers/).and match(/^last refresh: +ok/)
    end
  end

  it 'refuses a --max-age that is not whole seconds, without a backtrace' do
    run = kicker(dir, 'status', '--max-age', 'soon')
    expect(run.exitstatus).to eq(1)
    expect(run.stderr).to include('--max-age takes whole seconds (0 or more), not "soon"')
    expect(run.stderr).not_to match(/\.rb:\d+:in/)
  end

  it 'says so when the refresh record is corrupt, and still answers' do
    expect(kicker(dir, 'refresh').exitstatus).to eq(0)
    File.write(File.join(dir, 'cache', 'refresh.json'), '{"source":')
    run = kicker(dir, 'status')
    expect(run.exitstatus).to eq(0), run.to_s
    expect(run.stdout).to match(%r{^last refresh: +unknown \(.*/refresh\.json: not a refresh record: })
  end
end
