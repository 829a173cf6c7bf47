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

# Points PUPPET_KICKER_CONFIG at a scratch master configured with `settings` for one
# example. The path also goes into a fact, so rspec-puppet's catalogue cache (keyed
# on facts, not on the environment variable) compiles afresh.
RSpec.shared_context 'with its own puppet_kicker.yaml' do
  let(:config_file) { File.join(ScratchMaster.create(settings), 'puppet_kicker.yaml') }
  let(:facts) { { 'puppet_kicker_config' => config_file } }

  around do |example|
    saved = ENV.fetch('PUPPET_KICKER_CONFIG', nil)
    example.run
  ensure
    ENV['PUPPET_KICKER_CONFIG'] = saved
  end

  before { ENV['PUPPET_KICKER_CONFIG'] = config_file }
end
