# frozen_string_literal: true

require 'spec_helper'
require 'json'
require 'tmpdir'

# The magnus extension and the C-ABI library loaded through ffi must be
# interchangeable: the same Ruby objects (classes, values, Hash key order) and the
# same exceptions (class and message) for every call. Both load in this MRI process,
# each with its own core, over one fact cache that holds every kind of JSON value.
describe 'the two backends' do
  exotic = {
    'fqdn' => 'odd.example.com', 'role' => 'odd', 'hostname' => 'odd',
    'integers' => [0, -1, 2**31, (2**63) - 1, -2**63, (2**64) - 1], 'beyond_u64' => 2**70,
    'floats' => [0.1, -2.5, 3.0, 1.0e300, 5.0e-324, -0.0, 123_456_789.123],
    'booleans' => [true, false], 'nothing' => nil, 'empty_string' => '', 'empty_array' => [], 'empty_hash' => {},
    'strings' => ['quote " backslash \\ slash /', "tab\tnewline\ncr\r", "nul\u0000bell\u0007", 'é ü ß 漢字 🎉',
                  "\u2028\u2029", '<script>&amp;',],
    'json_class' => 'String', 'dotted.name' => 'x', 'unicode_ключ' => 'значение',
    # As deep as a fact file may nest: 64 levels, counting the document and `values`.
    'deep' => (1..61).reduce('bottom') { |inner, i| { "level#{i}" => inner } },
    'os' => { 'family' => 'Debian', 'release' => { 'full' => '12.5', 'major' => '12' } },
    'certname' => 'odd-certname-from-a-fact',
  }
  servers = {
    'odd.example.com' => exotic,
    'web2.example.com' => { 'fqdn' => 'web2.example.com', 'role' => 'web', 'hostname' => 'web2', 'uptime_days' => 3 },
    'web1.example.com' => { 'fqdn' => 'web1.example.com', 'role' => 'web', 'hostname' => 'web1', 'uptime_days' => 30 },
    'api1.example.com' => { 'role' => 'api', 'hostname' => 'api1', 'environment' => 'staging' },
  }
  # Servers with the same fact names, more than 8 (MRI's array tables), at the top and
  # nested, but db3's `networking`, which has one name more.
  db = lambda do |n|
    networking = (1..10).to_h { |i| ["field#{i}", i == 5 ? n * 10 : "#{n}-#{i}"] }
    networking['extra'] = { 'nested' => n } if n == 3
    { 'fqdn' => "db#{n}.example.com", 'role' => 'db', 'hostname' => "db#{n}", 'uptime_days' => n * 7,
      'memorysize_mb' => 1024.5 * n, 'is_virtual' => n.odd?, 'kernel' => 'Linux', 'timezone' => nil,
      'ipaddress' => "10.0.0.#{n}", 'mounts' => ['/', "/srv/#{n}"], 'networking' => networking, }
  end
  (1..3).each { |n| servers["db#{n}.example.com"] = db.call(n) }

  before(:all) do
    @dir = Dir.mktmpdir('puppet-kicker-backends')
    facts = File.join(@dir, 'var', 'server_data', 'facts')
    FileUtils.mkdir_p([facts, File.join(@dir, 'etc')])
    stamp = Time.now.utc.strftime('%Y-%m-%dT%H:%M:%S.%N+00:00')
    servers.each do |certname, values|
      document = { 'name' => certname, 'values' => values, 'timestamp' => stamp, 'expiration' => stamp }
      File.write(File.join(facts, "#{certname}.json"), JSON.generate(document, max_nesting: false))
    end
    File.write(File.join(@dir, 'etc', 'puppet_kicker.yaml'), "cache:\n  dir: cache\n")
    PuppetKicker::BACKENDS.each do |name|
      PuppetKicker.with_backend(name) do
        PuppetKicker.native.configure(File.join(@dir, 'etc'), File.join(@dir, 'var'), nil, nil, nil)
      end
    end
  end

  after(:all) { FileUtils.rm_rf(@dir) }

  # What a call gives through each backend: its value, or its exception's class
  # and message.
  def through_each(&call)
    PuppetKicker::BACKENDS.map do |name|
      PuppetKicker.with_backend(name) do
        call.call(PuppetKicker.native)
      rescue StandardError => e
        [:raised, e.class, e.message]
      end
    end
  end

  # Equal, and equal in shape: classes at every level, Hash key order.
  def shape(value)
    case value
    when Hash then [Hash, value.map { |k, v| [k, k.encoding, shape(v)] }]
    when Array then [Array, value.map { |v| shape(v) }]
    when String then [String, value, value.encoding, value.frozen?]
    when Float then [Float, value.to_s]
    else [value.class, value]
    end
  end

  def expect_identical(&call)
    magnus, ffi = through_each(&call)
    expect(shape(ffi)).to eq(shape(magnus))
    magnus
  end

  it 'returns every kind of fact value identically, in the same key order' do
    odd = expect_identical { |n| n.servers_with_role(['odd'], 'production') }
    expect(odd.size).to eq(1)
    expect(odd.first.keys.sort).to eq(exotic.keys.sort)
    expect(odd.first['integers']).to eq(exotic['integers'])
    expect(odd.first['strings']).to eq(exotic['strings'])
    expect(odd.first['certname']).to eq('odd-certname-from-a-fact')
    expect(odd.first['deep'].to_s).to include('bottom')
  end

  it 'builds servers with the same fact names alike, each the Hash of its facts, every name found by lookup' do
    dbs = expect_identical { |n| n.servers_with_role(['db'], 'production') }
    expect(dbs.map { |s| s['hostname'] }).to eq(%w[db1 db2 db3])
    dbs.each.with_index(1) do |server, n|
      facts = db.call(n).merge('certname' => "db#{n}.example.com")
      expect(server).to eq(facts)
      expect(server.keys).to eq(facts.keys.sort - ['certname'] + ['certname'])
      server.each { |name, value| expect(server[name]).to equal(value) }
      server['networking'].each { |name, value| expect(server['networking'][name]).to equal(value) }
      expect(server.key?('field1')).to be(false)
      expect(server).to be_frozen
      expect(server['networking']).to be_frozen
    end
  end

  it 'answers every query identically' do
    expect_identical { |n| n.servers_with_role(%w[web odd], 'production') }
    expect_identical { |n| n.servers_with_role(['/^w/'], 'production') }
    expect_identical { |n| n.servers_with_role(['api'], 'staging') }
    expect_identical { |n| n.servers_with_role(['nobody'], 'production') }
    expect_identical { |n| n.server_with_role(['web'], 'production') }
    expect_identical { |n| n.server_with_role(['nobody'], 'production') }
    expect_identical { |n| n.servers_with_facts(['uptime_days>10'], 'production') }
    expect_identical { |n| n.servers_with_facts(['os.release.full>=12', 'role=odd'], 'production') }
    expect_identical { |n| n.servers_with_facts(['environment=staging'], 'production') }
    expect(expect_identical { |n| n.servers_with_role(['web'], 'production') }.map { |s| s['hostname'] }).to eq(%w[web1 web2])
  end

  it 'returns the same frozen Array for an identical call, on both backends' do
    PuppetKicker::BACKENDS.each do |name|
      PuppetKicker.with_backend(name) do
        native = PuppetKicker.native
        web = native.servers_with_role(['web'], 'production')
        expect(web).to be_frozen
        expect(native.servers_with_role(['web'], 'production')).to equal(web)
        by_fact = native.servers_with_facts(['role=web'], 'production')
        expect(by_fact).to eq(web)
        expect(by_fact).not_to equal(web)
        expect(native.servers_with_facts(['role=web'], 'production')).to equal(by_fact)
        expect(native.servers_with_role(['web'], 'staging')).to eq([])
        expect(native.servers_with_role(['web'], 'production')).to equal(web)
        expect(by_fact.map(&:object_id)).to eq(web.map(&:object_id)), 'the servers themselves are shared'
      end
    end
  end

  it 'deep-freezes every server and shares fact names and equal values between servers, on both backends' do
    frozen_through = lambda do |value|
      value.frozen? && case value
                       when Hash then value.all? { |k, v| frozen_through.call(k) && frozen_through.call(v) }
                       when Array then value.all? { |v| frozen_through.call(v) }
                       else true
                       end
    end
    PuppetKicker::BACKENDS.each do |name|
      PuppetKicker.with_backend(name) do
        web1, web2 = PuppetKicker.native.servers_with_role(['web'], 'production')
        odd = PuppetKicker.native.server_with_role(['odd'], 'production')
        [web1, web2, odd].each { |server| expect(frozen_through.call(server)).to be(true), "#{name}: #{server['fqdn']}" }
        expect(web1['role']).to equal(web2['role']), "#{name}: one 'web' String for both servers"
        expect(web1.keys.zip(web2.keys)).to all(satisfy { |a, b| a.equal?(b) }), "#{name}: one String per fact name"
      end
    end
  end

  it 'answers `puppet kicker query` identically, each server the Hash the functions return' do
    request = JSON.generate('name' => 'query', 'args' => { 'roles' => %w[odd web], 'environment' => 'production' })
    # The same but for the index generation: each backend's core counts its own.
    answers = through_each { |n| JSON.parse(n.command(request)).reject { |key, _| key == 'generation' } }
    expect(shape(answers[1])).to eq(shape(answers[0]))
    answer = answers[0]
    functions = PuppetKicker.native.servers_with_role(%w[odd web], 'production')
    expect(answer['servers'].map { |s| s['hash'] }).to eq(functions)
    expect(answer['servers'].map { |s| s['hash'].keys }).to eq(functions.map(&:keys))
    expect(expect_identical { |n| n.command('{"name":"nope"}') }).to eq([:raised, PuppetKicker::QueryError,
                                                                         'puppet kicker: no subcommand "nope"',])
  end

  it 'raises the same exceptions with the same messages' do
    errors = [
      ->(n) { n.servers_with_facts(['role=web', 'uptime'], 'production') },
      ->(n) { n.servers_with_facts(['hostname=/^(?!db)/'], 'production') },
      ->(n) { n.servers_with_role(['/(?=x)/'], 'production') },
      ->(n) { n.servers_with_role([], 'production') },
      ->(n) { n.servers_with_role([''], 'production') },
    ]
    errors.each do |call|
      magnus = expect_identical(&call)
      expect(magnus.first(2)).to eq([:raised, PuppetKicker::QueryError])
    end
    # A malformed kick report is the report's fault, not a query's.
    magnus = expect_identical { |n| n.kick_report('{"host": 1}') }
    expect(magnus.first(2)).to eq([:raised, PuppetKicker::ReportError])
    expect(magnus.last).to start_with('kick report: ')
    bad = File.join(@dir, 'bad.yaml')
    File.write(bad, "cache:\n  ttl: soon\n")
    magnus = expect_identical { |n| n.configure(File.join(@dir, 'etc'), File.join(@dir, 'var'), nil, bad, nil) }
    expect(magnus.first(2)).to eq([:raised, PuppetKicker::ConfigError])
    expect(magnus.last).to include("bad.yaml: 'cache.ttl' must be a duration")
  end

  it "takes Puppet's certificate settings, and refuses a name that is not one of them, naming it" do
    etc = File.join(@dir, 'etc')
    var = File.join(@dir, 'var')
    ssl = PuppetKicker.send(:ssl_settings, Puppet.settings)
    expect(ssl.keys).to eq(%w[hostcert hostprivkey localcacert hostcrl])
    expect(ssl['hostcert']).to eq(Puppet[:hostcert])
    expect(ssl['localcacert']).to eq(Puppet[:localcacert])
    expect(through_each { |n| n.configure(etc, var, nil, nil, ssl) }).to eq([nil, nil])
    magnus = PuppetKicker.with_backend('magnus') { PuppetKicker.native }
    expect { magnus.configure(etc, var, nil, nil, 'hostcrt' => '/x.pem') }
      .to raise_error(ArgumentError, /unknown certificate setting "hostcrt": use hostcert, hostprivkey/)
    ffi = PuppetKicker.with_backend('ffi') { PuppetKicker.native }
    expect { ffi.configure(etc, var, nil, nil, 'hostcrt' => '/x.pem') }
      .to raise_error(PuppetKicker::Error, /malformed request: unknown field `hostcrt`/)
  end

  it 'gives the same status, warnings and version' do
    magnus, ffi = through_each(&:status)
    expect(ffi.keys).to eq(magnus.keys)
    # Each backend has a core of its own: when it was built, and what it has built
    # lazily since (path indexes, kept answers), are its own.
    own = %w[built_at index_bytes]
    expect(ffi.reject { |k, _| own.include?(k) }).to eq(magnus.reject { |k, _| own.include?(k) })
    expect([ffi['built_at'], magnus['built_at']]).to all(be_a(Integer))
    expect([ffi['index_bytes'], magnus['index_bytes']]).to all(be > 1000)
    expect_identical(&:take_log)
    # Nothing waits once taken: the facade skips take_log while log_pending is 0.
    expect(expect_identical(&:log_pending)).to eq(0)
    expect_identical(&:version)
    expect_identical { |n| n.note_environment('web9.example.com', 'staging') }
  end

  it 'sends a note to the ffi core only when it changes what this backend noted since its configure' do
    ffi = PuppetKicker.with_backend('ffi') { PuppetKicker.native }
    lib = ffi.instance_variable_get(:@lib)
    sent = []
    allow(lib).to receive(:pk_note_environment).and_wrap_original do |original, json, size|
      sent << JSON.parse(json).values_at('certname', 'environment')
      original.call(json, size)
    end
    etc = File.join(@dir, 'etc')
    var = File.join(@dir, 'var')
    ffi.configure(etc, var, nil, nil, nil)
    3.times { expect(ffi.note_environment('memo1.example.com', 'production')).to be_nil }
    ffi.note_environment('memo2.example.com', 'production')
    ffi.note_environment('memo1.example.com', 'staging')
    ffi.note_environment('memo1.example.com', 'production')
    expect(sent).to eq([%w[memo1.example.com production], %w[memo2.example.com production],
                        %w[memo1.example.com staging], %w[memo1.example.com production],])
    # A configure may be a new core: every note is sent again.
    ffi.configure(etc, var, nil, nil, nil)
    ffi.note_environment('memo1.example.com', 'production')
    expect(sent.size).to eq(5)
    # A note the core refuses is refused each time, never remembered.
    2.times { expect { ffi.note_environment('memo3.example.com', nil) }.to raise_error(PuppetKicker::Error, /malformed request/) }
    expect(sent.size).to eq(7)
    # Bounded: past MAX_NOTED notes, all are forgotten.
    stub_const('PuppetKicker::FFIBackend::MAX_NOTED', 2)
    ffi.note_environment('memo4.example.com', 'production') # the memo holds memo1 and memo4: full
    ffi.note_environment('memo5.example.com', 'production') # cleared, then memo5
    ffi.note_environment('memo1.example.com', 'production')
    ffi.note_environment('memo5.example.com', 'production')
    expect(sent.drop(7).map(&:first)).to eq(%w[memo4.example.com memo5.example.com memo1.example.com])
  end

  it 'returns a kept answer of the ffi backend with pk_answer_holds alone while the core says it holds' do
    ffi = PuppetKicker.with_backend('ffi') { PuppetKicker.native }
    lib = ffi.instance_variable_get(:@lib)
    first = ffi.servers_with_role(['web'], 'production')
    allow(lib).to receive(:pk_select).and_call_original
    allow(lib).to receive(:pk_answer_holds).and_call_original
    expect(ffi.servers_with_role(['web'], 'production')).to equal(first)
    expect(lib).to have_received(:pk_answer_holds).once
    expect(lib).not_to have_received(:pk_select)
    # Not held: the query is asked, and the answer, still the same, is the same Array.
    allow(lib).to receive(:pk_answer_holds).and_return(0)
    expect(ffi.servers_with_role(['web'], 'production')).to equal(first)
    expect(lib).to have_received(:pk_select).once
    # Nothing held yet for a new query, an error, or a first server_with_role: no pk_answer_holds.
    allow(lib).to receive(:pk_answer_holds).and_call_original
    expect(ffi.servers_with_role(%w[api held-nowhere], 'staging').map { |s| s['hostname'] }).to eq(['api1'])
    expect(ffi.server_with_role(['web'], 'production')).to eq(first.first)
    expect { ffi.servers_with_role(['/(?=x)/'], 'production') }.to raise_error(PuppetKicker::QueryError)
    expect(lib).to have_received(:pk_answer_holds).twice
  end

  it 'gives the ffi backend every server again when its table missed a reply (pk_fetch starts its session over)' do
    ffi = PuppetKicker.with_backend('ffi') { PuppetKicker.native }
    ffi.servers_with_role(['web'], 'production')
    table = ffi.instance_variable_get(:@table)
    expect(table).not_to be_empty
    table.pop(2) # as a reply read only in part would leave it
    odd = expect_identical { |n| n.servers_with_role(['odd'], 'production') }
    expect(odd.map { |s| s['hostname'] }).to eq(['odd'])
    # The servers converted before are still kept, and still the same objects.
    web = ffi.servers_with_role(['web'], 'production')
    expect(ffi.servers_with_facts(['role=web'], 'production').map(&:object_id)).to eq(web.map(&:object_id))
  end

  it "reads pk_fetch's replies only whole and within the length pk_fetch hands over: else a PuppetKicker::Error" do
    ffi = PuppetKicker.with_backend('ffi') { PuppetKicker.native }
    reply = lambda do |length, counts|
      bytes = ([length] + counts).pack('QL9') # native byte order, as the library writes
      FFI::MemoryPointer.new(:uint8, bytes.bytesize).tap { |pointer| pointer.put_bytes(0, bytes) }
    end
    servers = ->(pointer, length = pointer.size) { PuppetKicker::FetchReader.servers(pointer, length, []) }
    malformed = ->(what) { raise_error(PuppetKicker::Error, /malformed pk_fetch reply \(#{what}/) }
    expect(servers.call(reply.call(44, [0] * 9))).to eq([])
    expect(servers.call(reply.call(44, [1] + ([0] * 8)))).to be_nil
    expect { servers.call(reply.call(45, [0] * 9)) }.to malformed.call('its length')
    expect { servers.call(reply.call(44, [0, 3] + ([0] * 7))) }.to malformed.call('base 3')
    expect { servers.call(reply.call(44, [0] * 9), 43) }.to malformed.call('its length')

    # As production reads them: a pointer the attached pk_fetch returned (it carries
    # no size of its own) and the length pk_fetch handed over beside it.
    lib = ffi.instance_variable_get(:@lib)
    selected = ffi.send(:request, :pk_select, 'op' => 'servers_with_role', 'roles' => ['web'], 'environment' => 'production')
    positions = selected['positions']
    session = lib.pk_session_new
    length = FFI::MemoryPointer.new(:size_t)
    pointer = lib.pk_fetch(session, selected['generation'], 0, positions.pack('L*'), positions.size, length)
    begin
      expect(pointer).not_to be_a(FFI::MemoryPointer)
      size = length.get_ulong(0)
      expect(servers.call(pointer, size).map { |server| server['hostname'] }).to eq(%w[web1 web2])
      # Handed another length than the reply's own: refused before any part is read.
      [size - 1, size + 1, 43].each { |other| expect { servers.call(pointer, other) }.to malformed.call('its length') }
      # The reply's own length, or its parts, made to claim more than it has: refused.
      own = pointer.get_uint64(0)
      pointer.put_uint64(0, own + (1 << 40))
      expect { servers.call(pointer, size) }.to malformed.call('its length')
      pointer.put_uint64(0, own)
      words = pointer.get_uint32(8 + (4 * 6))
      pointer.put_uint32(8 + (4 * 6), words + 1_000_000)
      expect { servers.call(pointer, size) }.to malformed.call('its length')
      pointer.put_uint32(8 + (4 * 6), words)
      expect(servers.call(pointer, size).map { |server| server['hostname'] }).to eq(%w[web1 web2])
    ensure
      lib.pk_free_fetch(pointer)
      lib.pk_session_free(session)
    end
  end

  it 'fails to load with an error that names the file and why' do
    expect { PuppetKicker.send(:load_ffi, '/nonexistent/libpuppet_kicker_ffi.so') }.to raise_error(
      PuppetKicker::Error, %r{cannot load puppet-kicker's native library /nonexistent/libpuppet_kicker_ffi.so \(ffi backend\): no such file}
    )
    Dir.mktmpdir do |dir|
      broken = File.join(dir, 'broken.so')
      File.write(broken, 'not an ELF file')
      expect { PuppetKicker.send(:load_ffi, broken) }.to raise_error(
        PuppetKicker::Error, /library #{Regexp.escape(broken)} \(ffi backend\): .*(invalid ELF header|file too short)/
      )
      # Refused before it is loaded: it does not say which Ruby it was built for.
      expect { PuppetKicker.send(:load_magnus, broken) }.to raise_error(
        PuppetKicker::Error, /library #{Regexp.escape(broken)} \(magnus backend\): it carries no record of the Ruby it was built for/
      )
    end
  end

  it 'picks magnus on MRI, and takes PUPPET_KICKER_BACKEND or an unknown name as a clear error' do
    expect(RUBY_ENGINE).to eq('ruby')
    saved = ENV.fetch('PUPPET_KICKER_BACKEND', nil)
    ENV.delete('PUPPET_KICKER_BACKEND')
    expect(PuppetKicker.default_backend).to eq('magnus')
    ENV['PUPPET_KICKER_BACKEND'] = 'ffi'
    expect(PuppetKicker.default_backend).to eq('ffi')
    expect { PuppetKicker.with_backend('jni') {} }.to raise_error(PuppetKicker::Error, /unknown puppet-kicker backend "jni".*magnus or ffi/)
  ensure
    saved ? ENV['PUPPET_KICKER_BACKEND'] = saved : ENV.delete('PUPPET_KICKER_BACKEND')
  end
end
