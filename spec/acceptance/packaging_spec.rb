# frozen_string_literal: true

require 'open3'
require 'tmpdir'

# What operators install: the module package (`rake build`, then `puppet module
# install`) and the gem (`gem build`, then `gem install --local`, compiled by
# extconf.rb with cargo).
describe 'packaging' do
  def run(*cmd, **opts)
    out, status = Open3.capture2e(*cmd, chdir: ROOT, **opts)
    expect(status).to be_success, "#{cmd.join(' ')}:\n#{out}"
    out
  end

  describe 'the module package' do
    before(:all) { @tmp = Dir.mktmpdir('puppet-kicker-module') }

    let(:tarball) { run('rake', 'build').lines.last.strip }

    it 'carries metadata, docs, the functions and the linux-x86_64 libraries outside lib/, and puppet module install accepts it' do
      listing = run('tar', 'tzf', tarball).lines.map(&:chomp)
      expect(listing).to include('puppetkicker-kicker-0.1.0/metadata.json',
                                 'puppetkicker-kicker-0.1.0/REFERENCE.md',
                                 'puppetkicker-kicker-0.1.0/CHANGELOG.md',
                                 'puppetkicker-kicker-0.1.0/docs/kicks.md',
                                 'puppetkicker-kicker-0.1.0/native/puppet_kicker.so',
                                 'puppetkicker-kicker-0.1.0/native/libpuppet_kicker_ffi.so',
                                 'puppetkicker-kicker-0.1.0/native/puppet_kicker_jruby.jar',
                                 'puppetkicker-kicker-0.1.0/lib/puppet/functions/servers_with_role.rb',
                                 'puppetkicker-kicker-0.1.0/lib/puppet/face/kicker/query.rb',
                                 'puppetkicker-kicker-0.1.0/lib/puppet/application/kicker.rb')
      # lib/ is what pluginsync copies to every agent: no native code there.
      expect(listing.grep(%r{\Apuppetkicker-kicker-0.1.0/lib/.*\.(so|jar)\z})).to be_empty
      run('puppet', 'module', 'install', '--target-dir', File.join(@tmp, 'modules'), '--ignore-dependencies', tarball)
      expect(File).to exist(File.join(@tmp, 'modules', 'kicker', 'native', 'puppet_kicker.so'))
      expect(File).to exist(File.join(@tmp, 'modules', 'kicker', 'native', 'libpuppet_kicker_ffi.so'))
    end

    it 'carries stripped libraries (no symbol table, no debug info)' do
      run('tar', 'tzf', tarball)
      %w[puppet_kicker.so libpuppet_kicker_ffi.so].each do |name|
        sections = run('readelf', '--section-headers', '--wide', File.join(ROOT, 'native', name))
        expect(sections).not_to match(/\.symtab|\.debug_/), "#{name} is not stripped"
        expect(sections).to include('.dynsym')
      end
    end

    it 'renders the haproxy example from the installed module' do
      out = run({ 'KICKER_MODULEPATH' => File.join(@tmp, 'modules') }, File.join(ROOT, 'script', 'example'), File.join(@tmp, 'work'))
      expect(out).to include("      server node1 10.0.0.11:8080 check inter 2000\n      server node2 10.0.0.12:8080")
    end

    it 'gives `puppet kicker` from the installed module, found on the modulepath' do
      dir = ScratchMaster.create
      out = run({ 'PUPPET_KICKER_CONFIG' => File.join(dir, 'puppet_kicker.yaml'), 'RUBYLIB' => nil },
                'puppet', 'kicker', 'query', '--role', 'node', '--modulepath', File.join(@tmp, 'modules'),
                '--confdir', File.join(dir, 'puppet'), '--vardir', File.join(dir, 'var'))
      expect(out.lines.map { |line| line.split.first }).to eq(%w[CERTNAME node1.example.com node2.example.com
                                                                 node3.example.com 3])
    end
  end

  describe 'the gem' do
    it 'builds, installs with its native extension compiled by extconf.rb, and loads', :gem_build do
      build = GemBuild.finish
      expect(build.status).to be_success, "gem build and gem install:\n#{build.log.lines.last(60).join}"
      dir = build.dir
      # The system's gems stay on the path: the ffi backend needs Ruby's ffi gem.
      loaded = run({ 'GEM_PATH' => [File.join(dir, 'gems'), *Gem.path].join(File::PATH_SEPARATOR) }, 'ruby', '-e',
                   'require "puppet_kicker"; puts PuppetKicker::NATIVE_LIBRARY; puts PuppetKicker.native.version; ' \
                   'PuppetKicker.backend = "ffi"; puts PuppetKicker::FFI_LIBRARY; puts PuppetKicker.native.version')
      expect(loaded).to include("#{dir}/gems/gems/puppet_kicker-0.1.0/native/puppet_kicker.so", '0.1.0 (index format 2)')
      expect(loaded).to include("#{dir}/gems/gems/puppet_kicker-0.1.0/native/libpuppet_kicker_ffi.so")
      expect(loaded.scan('0.1.0 (index format 2)').size).to eq(2)
    end
  end
end

# `gem build` and `gem install` of the gem, started in the background when the suite
# starts (if its example is to run), at the lowest priority: its cargo build (both
# libraries, about two minutes of both cores in a clean checkout) then runs on the core
# the other specs' Puppet processes leave idle, and its example, the suite's last,
# only waits for what is left.
module GemBuild
  Result = Struct.new(:dir, :status, :log)

  module_function

  def start
    @dir = Dir.mktmpdir('puppet-kicker-gem')
    @log = File.join(@dir, 'build.log')
    gem = File.join(@dir, 'puppet_kicker.gem')
    # A kept target directory of its own, so this stays fast; extconf.rb's default
    # (a temporary target directory, removed after install) is the same Makefile.
    # Not the checkout's: cargo gives the gem's crates the same hashes as the
    # checkout's (same workspace layout, another path), so each build would throw
    # away the other's and relink both libraries with LTO again.
    # Without LTO, in 16 codegen units: this proves that the gem builds from its own
    # files and loads; the shipped LTO build of the same sources is what `rake
    # compile` made and every other spec loads (a fresh LTO build here took twice as long).
    env = {
      'CARGO_TARGET_DIR' => File.join(ROOT, 'target', 'gem-install'),
      'CARGO_PROFILE_RELEASE_LTO' => 'false',
      'CARGO_PROFILE_RELEASE_CODEGEN_UNITS' => '16',
    }
    script = 'gem build puppet_kicker.gemspec --output "$1" && ' \
             'gem install --local --install-dir "$2" --no-document "$1"'
    @pid = Process.spawn(env, 'nice', '-n', '19', 'sh', '-c', script, 'gem-build', gem, File.join(@dir, 'gems'),
                         chdir: ROOT, out: @log, err: %i[child out], pgroup: true)
  end

  # Waits for the build; its directory (the installed gem under gems/), status and log.
  def finish
    _, status = Process.wait2(@pid)
    @pid = nil
    Result.new(@dir, status, File.read(@log))
  end

  def stop
    Process.kill('TERM', -@pid) if @pid
    Process.wait(@pid) if @pid
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  ensure
    FileUtils.rm_rf(@dir) if @dir
  end
end

RSpec.configure do |c|
  c.before(:suite) do
    world = RSpec.world
    wanted = world.all_example_groups.any? { |group| world.filtered_examples[group].any? { |e| e.metadata[:gem_build] } }
    GemBuild.start if wanted
  end
  c.after(:suite) { GemBuild.stop }
end
