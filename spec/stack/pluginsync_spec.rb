# frozen_string_literal: true

require 'find'
require 'open3'

# pluginsync copies every module's lib/ (and facts.d, ...) to every agent; the
# native libraries are in the module's native/, which it does not copy: an agent
# never loads them (only the master and `puppet apply` compile). A real `puppet
# agent --test` against the test puppetserver, with the module installed from its
# package (script/test-puppetserver), then a look at what the agent received.
describe 'pluginsync of the installed module' do
  before(:all) do
    raise 'needs a running puppetserver: run script/test-puppetserver' unless ENV['PK_PUPPETSERVER_TEST'] == '1'

    @env = `#{ROOT}/script/puppetserver env`.lines.to_h { |l| l.chomp.split('=', 2) }
  end

  def elf?(path)
    File.open(path, 'rb') { |f| f.read(4) } == "\x7FELF".b
  end

  it "gives the agent the module's Ruby code and no native library" do
    module_dir = File.join(@env.fetch('PK_PUPPETSERVER_MODULES'), 'kicker')
    # The server's module holds the libraries, outside lib/ ...
    expect(File).to exist(File.join(module_dir, 'native', 'libpuppet_kicker_ffi.so'))
    expect(File).to exist(File.join(module_dir, 'native', 'puppet_kicker.so'))

    certname = 'pluginsync.example.com'
    out, status = Open3.capture2e(File.join(ROOT, 'script', 'puppetserver'), 'agent', certname, '--color=false')
    expect([0, 2]).to include(status.exitstatus), "agent exited #{status.exitstatus}:\n#{out}"

    # ... and the agent's pluginsync directory ($vardir/lib) has the module's Ruby
    # code, so the sync did happen, and not one native library.
    plugins = File.join(@env.fetch('PK_PUPPETSERVER_AGENTS'), certname, 'var', 'lib')
    expect(File).to exist(File.join(plugins, 'puppet_kicker.rb'))
    expect(File).to exist(File.join(plugins, 'puppet', 'functions', 'servers_with_role.rb'))
    synced = Find.find(plugins).select { |path| File.file?(path) }
    expect(synced.size).to be > 5
    expect(synced.select { |path| path.end_with?('.so') || elf?(path) }).to be_empty
  end
end
