# frozen_string_literal: true

require 'spec_helper'
require 'open3'
require 'rbconfig'
require 'tmpdir'

# The module package's magnus extension is built for one Ruby (Debian 12's 3.1) and
# run by others (Debian 13's 3.3, puppet-agent's 3.2, Puppet 7's 2.7): loaded into a
# Ruby it was not compiled for, it reads that Ruby's objects with the wrong layouts.
# It records the Ruby it was built for inside itself, and the facade, the helper and
# `PUPPET_KICKER_BACKEND=magnus` read that record before loading it. Here a copy of
# the package's lib/ and native/ whose extension's record names another Ruby.
describe PuppetKicker::RubyABI do
  let(:native) { PuppetKicker::NATIVE_LIBRARY }

  # The extension's record with `ruby_version` (and `ruby`) changed to another Ruby's,
  # of the same length, so the library stays the same size and loadable.
  def other_ruby(record)
    other = record['ruby_version'] == '3.3.0' ? '3.2.0' : '3.3.0'
    { 'ruby_version' => other, 'ruby' => "#{other[0, 3]}.9" }
  end

  # A copy of lib/ and native/ in `dir`, its extension's record edited by `edit`
  # (the file's bytes in, the edited bytes out).
  def package_copy(dir)
    FileUtils.cp_r(File.join(ROOT, 'lib'), dir)
    FileUtils.mkdir_p(File.join(dir, 'native'))
    FileUtils.cp(PuppetKicker::FFI_LIBRARY, File.join(dir, 'native'))
    bytes = File.binread(native)
    edited = yield bytes
    expect(edited.bytesize).to eq(bytes.bytesize)
    File.binwrite(File.join(dir, 'native', 'puppet_kicker.so'), edited)
    File.join(dir, 'native', 'puppet_kicker.so')
  end

  # The record's text in the library: `ruby_version=3.1.0 arch=... ruby=3.1.2`.
  def record_text(bytes)
    at = bytes.index(described_class::MARK.b) + described_class::MARK.bytesize
    bytes.byteslice(at, bytes.index("\0".b, at) - at)
  end

  def built_for_another_ruby(dir)
    package_copy(dir) do |bytes|
      text = record_text(bytes)
      record = described_class.record(native)
      other = other_ruby(record)
      edited = text.sub("ruby_version=#{record['ruby_version']}", "ruby_version=#{other['ruby_version']}")
                   .sub("ruby=#{record['ruby']}", "ruby=#{other['ruby']}")
      bytes.sub(text, edited)
    end
  end

  # Runs `script` in a fresh Ruby with the copy's lib/ first on the load path.
  def ruby_in(dir, script, env = {})
    Open3.capture3({ 'PUPPET_KICKER_BACKEND' => nil, 'PUPPET_KICKER_CONFIG' => nil }.merge(env), RbConfig.ruby, '-I', File.join(dir, 'lib'),
                   '-e', script)
  end

  it 'finds in the built extension the Ruby it was built for: this one' do
    record = described_class.record(native)
    expect(record).to include('ruby_version' => RbConfig::CONFIG['ruby_version'], 'arch' => RbConfig::CONFIG['arch'],
                              'ruby' => RUBY_VERSION)
    expect(described_class.unfit(native)).to be_nil
  end

  it 'does not load an extension without a record, or one built for another Ruby' do
    Dir.mktmpdir('puppet-kicker-abi') do |dir|
      unrecorded = package_copy(dir) { |bytes| bytes.sub(described_class::MARK.b, "\0PUPPET_KICKER_NO_RECORD".b) }
      expect(described_class.record(unrecorded)).to be_nil
      expect(described_class.unfit(unrecorded)).to start_with('carries no record of the Ruby it was built for')
    end
    Dir.mktmpdir('puppet-kicker-abi') do |dir|
      other = built_for_another_ruby(dir)
      record = described_class.record(other)
      expect(record['ruby_version']).to eq(other_ruby(described_class.record(native))['ruby_version'])
      expect(described_class.unfit(other)).to eq(
        "was built for Ruby #{record['ruby']} (ABI #{record['ruby_version']}, #{record['arch']}), not for this Ruby " \
        "#{RUBY_VERSION} (ABI #{RbConfig::CONFIG['ruby_version']}, #{RbConfig::CONFIG['arch']})"
      )
    end
  end

  context 'when the package was built for another Ruby' do
    around do |example|
      @dir = Dir.mktmpdir('puppet-kicker-abi')
      @master = ScratchMaster.create('cache' => { 'dir' => 'cache', 'ttl' => 60 })
      @library = built_for_another_ruby(@dir)
      example.run
    ensure
      FileUtils.rm_rf([@dir, @master].compact)
    end

    it 'uses the ffi backend, with one notice naming both Rubies, and answers' do
      script = <<~RUBY
        require 'puppet_kicker'
        3.times { PuppetKicker.default_backend }
        native = PuppetKicker.native
        native.configure(#{@master.inspect}, #{File.join(@master, 'var').inspect}, nil,
                         #{File.join(@master, 'puppet_kicker.yaml').inspect}, nil)
        puts PuppetKicker.backend, native.name
        puts native.servers_with_role(['node'], 'production').map { |server| server['hostname'] }.sort.join(',')
        puts defined?(PuppetKicker::Native).inspect
      RUBY
      out, err, status = ruby_in(@dir, script)
      expect(status).to be_success, "#{out}\n#{err}"
      expect(out.lines.map(&:chomp)).to eq(['ffi', 'PuppetKicker::FFIBackend', 'node1,node2,node3', 'nil'])
      record = described_class.record(@library)
      notices = err.lines.grep(/puppet-kicker: the magnus extension/)
      expect(notices.size).to eq(1), err
      expect(notices.first).to include(@library, "was built for Ruby #{record['ruby']} (ABI #{record['ruby_version']}",
                                       "not for this Ruby #{RUBY_VERSION} (ABI #{RbConfig::CONFIG['ruby_version']}",
                                       'using the ffi backend')
    end

    it 'refuses PUPPET_KICKER_BACKEND=magnus, naming the file and both Rubies, and never loads it' do
      script = <<~RUBY
        require 'puppet_kicker'
        begin
          PuppetKicker.native
        rescue PuppetKicker::Error => e
          puts e.message
        end
        puts defined?(PuppetKicker::Native).inspect
      RUBY
      out, err, status = ruby_in(@dir, script, 'PUPPET_KICKER_BACKEND' => 'magnus')
      expect(status).to be_success, "#{out}\n#{err}"
      message, loaded = out.lines.map(&:chomp)
      record = described_class.record(@library)
      expect(message).to start_with("cannot load puppet-kicker's native library #{@library} (magnus backend): it " \
                                    "was built for Ruby #{record['ruby']} (ABI #{record['ruby_version']}, " \
                                    "#{record['arch']}), not for this Ruby #{RUBY_VERSION} " \
                                    "(ABI #{RbConfig::CONFIG['ruby_version']}, #{RbConfig::CONFIG['arch']})")
      expect(loaded).to eq('nil')
    end

    it 'runs the masterless helper through the ffi backend' do
      helper = File.join(@dir, 'lib', 'puppet_kicker', 'helper.rb')
      out, err, status = Open3.capture3({ 'PUPPET_KICKER_BACKEND' => nil }, RbConfig.ruby, helper, @master,
                                        File.join(@master, 'var'), '', File.join(@master, 'puppet_kicker.yaml'))
      expect(status).to be_success, "#{out}\n#{err}"
      expect(File.exist?(File.join(@master, 'cache', 'index.msgpack'))).to be(true), "#{out}\n#{err}"
      expect(File.exist?(File.join(@master, 'cache', 'refresh.wanted'))).to be(false)
    end
  end
end
