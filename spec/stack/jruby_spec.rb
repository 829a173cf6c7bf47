# frozen_string_literal: true

require 'json'
require 'open3'
require 'tmpdir'

# The ffi backend under JRuby, puppetserver's Ruby (no C extensions, no GVL): the
# facade picks it by itself, its answers and errors are those of MRI's backend (the
# magnus extension, or the ffi backend where the extension was built for another
# Ruby), object for object, and 8 threads calling at once all get them.
describe 'the ffi backend under JRuby' do
  before(:all) do
    @jruby = 'jruby' if system('sh', '-c', 'command -v jruby', out: File::NULL)
  end

  it "picks ffi, answers like MRI's backend, and holds under parallel calls" do
    raise 'no jruby: script/test-puppetserver installs it (with puppetserver) and runs this' unless @jruby

    master = ScratchMaster.create
    Dir.mktmpdir('puppet-kicker-jruby') do |dir|
      out = File.join(dir, 'answers.marshal')
      script = File.join(ROOT, 'spec', 'fixtures', 'jruby', 'ffi_check.rb')
      # The scratch master's own puppet_kicker.yaml is found as $confdir/puppet_kicker.yaml.
      stdout, stderr, status = Open3.capture3({ 'PUPPET_KICKER_BACKEND' => nil }, @jruby, script,
                                              File.join(ROOT, 'lib'), master, File.join(master, 'var'), out)
      expect(status).to be_success, "#{stdout}\n#{stderr}"
      expect(stdout).to include('parallel: 2400 calls from 8 threads, 0 mismatches')

      jruby = Marshal.load(File.binread(out)) # rubocop:disable Security/MarshalLoad
      expect(jruby['backend']).to eq('ffi')
      expect(jruby['engine']).to start_with('jruby 9.')
      # Servers read by the Java reader (native/puppet_kicker_jruby.jar, `rake jar`):
      # deep-frozen, and a value many servers have is one object.
      expect(jruby['reader']).to eq('java')
      expect(jruby['deep_frozen']).to be(true)
      expect(jruby['shared']).to be > 0
      expect(jruby['one_object_each']).to be(true)
      # Hand-made replies: one read whole; every malformed one refused, saying what is wrong.
      # Three Hashes of the same keys (copies of one template), each with its own values.
      array = [2.5, nil, 18_446_744_073_709_551_615]
      same_keys = [{ 'a' => 1, 'bc' => array }, { 'a' => 1, 'bc' => 2.5 }, { 'a' => nil, 'bc' => array }]
      expect(jruby['crafted']).to eq('servers' => [{ 'a' => 1, 'bc' => array }], 'table' => 8, 'frozen' => true,
                                     'same keys' => same_keys, 'distinct' => 3, 'table after a failed reply' => 0)
      expect(jruby['malformed']).to eq(
        'too short' => 'puppet-kicker: a malformed pk_fetch reply (its length)',
        'a length that is not its own' => 'puppet-kicker: a malformed pk_fetch reply (its length)',
        'a reply cut short' => 'puppet-kicker: a malformed pk_fetch reply (its length)',
        'an object it does not have' => 'puppet-kicker: a malformed pk_fetch reply (object 99 of 7)',
        'a string past the text' => 'puppet-kicker: a malformed pk_fetch reply (its strings)',
        'scalars that are not JSON scalars' => 'puppet-kicker: a malformed pk_fetch reply (its scalars at byte 3)',
        'fewer scalars than it says' => 'puppet-kicker: a malformed pk_fetch reply (its scalars)',
        'an unknown container tag' => 'puppet-kicker: a malformed pk_fetch reply (its words)',
        'words past the end' => 'puppet-kicker: a malformed pk_fetch reply (its words)',
        'a failed reply' => 'puppet-kicker: a malformed pk_fetch reply (status 2 is not OK)'
      )
      # A reply as production reads it, through the pointer pk_fetch returned (no size
      # of its own), bounded by the length pk_fetch handed over.
      length = 'puppet-kicker: a malformed pk_fetch reply (its length)'
      expect(jruby['guards']).to eq('a returned pointer' => 'FFI::Pointer', 'read whole' => true,
                                    'a length one short' => length, 'a length one more' => length,
                                    'its own length past the one handed over' => length,
                                    'words past the length handed over' => length)
      # 500 times with bytes overwritten at random: each read or refused, nothing else.
      expect(jruby['corrupted'].values.sum).to eq(500)
      expect(jruby['corrupted']['refused']).to be > 0
      # MRI's backend as the facade picks it: the magnus extension where it was built
      # for this Ruby (Debian 12), else the ffi backend (script/test-puppet8: the
      # package built on Debian 12, under Debian 13's Ruby 3.3).
      mri = PuppetKicker.with_backend(PuppetKicker.default_backend) do
        PuppetKicker.native.configure(master, File.join(master, 'var'), nil, nil, nil)
        calls = [
          -> { PuppetKicker.native.servers_with_role(%w[node haproxy], 'production') },
          -> { PuppetKicker.native.servers_with_role(['/^no/'], 'staging') },
          -> { PuppetKicker.native.server_with_role(['haproxy'], 'production') },
          -> { PuppetKicker.native.server_with_role(['nobody'], 'production') },
          -> { PuppetKicker.native.servers_with_facts(['role=node', 'processors.count>=4'], 'production') },
          -> { PuppetKicker.native.servers_with_facts(['role=node', 'uptime'], 'production') },
          -> { PuppetKicker.native.servers_with_role(['/(?=x)/'], 'production') },
        ]
        calls.map do |call|
          call.call
        rescue PuppetKicker::Error => e
          [:raised, e.class.name, e.message]
        end
      end
      expect(jruby['answers'].size).to eq(mri.size)
      # Equal, with the same classes, encodings and Hash key order at every level.
      # (Not compared: frozenness, which Marshal does not carry, and object identity:
      # JRuby's JSON shares equal frozen Strings.)
      shape = lambda do |value|
        case value
        when Hash then [Hash, value.map { |k, v| [k, k.encoding, shape.call(v)] }]
        when Array then [Array, value.map { |v| shape.call(v) }]
        when String then [String, value, value.encoding]
        when Float then [Float, value.to_s]
        else [value.class, value]
        end
      end
      jruby['answers'].zip(mri).each do |from_jruby, from_mri|
        expect(shape.call(from_jruby)).to eq(shape.call(from_mri))
      end
      expect(mri.first.map { |s| s['hostname'] }).to eq(%w[lb1 node1 node2 node3])
      expect(mri[5]).to match([:raised, 'PuppetKicker::QueryError', /\Aclause 'uptime': no operator/])
    end
  end

  # A Java reader that loads and then fails during a call (a LinkageError, as one
  # built for another JRuby would throw) must not fail the compile: one warning
  # naming the error, and the Ruby reader for the rest of the process.
  it 'falls back to the Ruby reader, with one warning, when the Java reader fails during a call' do
    raise 'no jruby: script/test-puppetserver installs it (with puppetserver) and runs this' unless @jruby

    master = ScratchMaster.create
    Dir.mktmpdir('puppet-kicker-jruby-reader') do |dir|
      FileUtils.cp_r(File.join(ROOT, 'lib'), dir)
      FileUtils.mkdir_p(File.join(dir, 'native'))
      FileUtils.cp(PuppetKicker::FFI_LIBRARY, File.join(dir, 'native'))
      # FetchReader compiled against one Layout, the jar shipping another: built here,
      # or handed over where there is no JDK (script/test-puppet8: built on Debian 12).
      jar = File.join(dir, 'native', 'puppet_kicker_jruby.jar')
      if ENV['PK_MISMATCHED_READER_JAR']
        FileUtils.cp(ENV['PK_MISMATCHED_READER_JAR'], jar)
      else
        jruby_jar, status = Open3.capture2(@jruby, '-e', 'print File.join(RbConfig::CONFIG["libdir"], "jruby.jar")')
        expect(status).to be_success
        system(File.join(ROOT, 'spec', 'fixtures', 'jruby', 'mismatched_reader', 'build-jar'), jruby_jar, jar,
               exception: true)
      end

      script = File.join(ROOT, 'spec', 'fixtures', 'jruby', 'reader_fallback.rb')
      stdout, stderr, status = Open3.capture3({ 'PUPPET_KICKER_BACKEND' => nil }, @jruby, script,
                                              File.join(dir, 'lib'), master, File.join(master, 'var'))
      expect(status).to be_success, "#{stdout}\n#{stderr}"
      result = JSON.parse(stdout.lines.last)
      expect(result).to eq('backend' => 'ffi', 'loaded' => 'PuppetKicker::JavaFetchReader', 'after' => nil,
                           'first' => %w[lb1 node1 node2 node3], 'again' => %w[node2 node3],
                           'one' => 'lb1')
      warnings = stderr.lines.grep(/Java reader/)
      expect(warnings.size).to eq(1), stderr
      expect(warnings.first).to include("puppet-kicker: the Java reader (#{File.join(dir, 'native', 'puppet_kicker_jruby.jar')}) " \
                                        'failed: Java::JavaLang::NoSuchMethodError:', 'headerBytes',
                                        'the slower Ruby reader for the rest of this process')
    ensure
      FileUtils.rm_rf(master)
    end
  end
end
