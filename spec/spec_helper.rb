# frozen_string_literal: true

require 'fileutils'
require 'tmpdir'
require 'yaml'

ROOT = File.expand_path('..', __dir__)

# rspec-puppet finds the module under test through spec/fixtures/modules/kicker; the
# link must exist before module_spec_helper is loaded.
fixture_modules = File.join(__dir__, 'fixtures', 'modules')
FileUtils.mkdir_p(fixture_modules)
FileUtils.ln_sf(ROOT, File.join(fixture_modules, 'kicker')) unless File.exist?(File.join(fixture_modules, 'kicker'))

RSpec.configure { |c| c.mock_with :rspec }
require 'puppetlabs_spec_helper/module_spec_helper'
# Ruby's ffi, for the ffi backend, loaded now: inside an example rspec-puppet runs with
# a $LOAD_PATH that no longer holds the paths of gems activated later.
require 'ffi'
require_relative '../lib/puppet_kicker'

# A scratch master whose fact cache holds examples/haproxy/servers.yaml, submitted
# through Puppet's own JSON terminus with current timestamps.
module ScratchMaster
  module_function

  def create(config = {})
    dir = Dir.mktmpdir('puppet-kicker-spec')
    submit = File.join(ROOT, 'examples', 'haproxy', 'submit_facts.rb')
    servers = File.join(ROOT, 'examples', 'haproxy', 'servers.yaml')
    system('ruby', submit, servers, File.join(dir, 'master'), 'json', out: File::NULL, exception: true)
    settings = { 'puppet_cache' => { 'dirs' => ['master/server_data/facts'] }, 'cache' => { 'dir' => 'cache' } }
    File.write(File.join(dir, 'puppet_kicker.yaml'), settings.merge(config).to_yaml)
    dir
  end
end

RSpec.configure do |c|
  c.before(:suite) { ENV['PUPPET_KICKER_CONFIG'] = File.join(ScratchMaster.create, 'puppet_kicker.yaml') }
end

# Both bindings of the core, magnus (MRI's) and ffi (puppetserver's JRuby), load in
# one MRI process, each with its own core. `each_backend { ... }` defines the
# examples once per backend; the `backend` fact keeps rspec-puppet's catalogue cache
# (keyed on facts) from handing one backend's catalogue to the other.
module EachBackend
  def each_backend(&examples)
    PuppetKicker::BACKENDS.each do |name|
      context "through the #{name} backend", backend: name do
        let(:facts) { { 'puppet_kicker_backend' => name } }
        class_exec(&examples)
      end
    end
  end
end

RSpec.configure do |c|
  c.extend EachBackend
  c.around do |example|
    backend = example.metadata[:backend]
    backend ? PuppetKicker.with_backend(backend) { example.run } : example.run
  end
end

# Points PUPPET_KICKER_CONFIG at a scratch master configured with `settings` for one
# example. The path also goes into a fact, so rspec-puppet's catalogue cache (keyed
# on facts, not on the environment variable) compiles afresh.
RSpec.shared_context 'with its own puppet_kicker.yaml' do
  let(:config_file) { File.join(ScratchMaster.create(settings), 'puppet_kicker.yaml') }
  let(:facts) { { 'puppet_kicker_config' => config_file, 'puppet_kicker_backend' => PuppetKicker.backend } }

  around do |example|
    saved = ENV.fetch('PUPPET_KICKER_CONFIG', nil)
    example.run
  ensure
    ENV['PUPPET_KICKER_CONFIG'] = saved
  end

  before { ENV['PUPPET_KICKER_CONFIG'] = config_file }
end
