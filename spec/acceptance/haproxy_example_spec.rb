# frozen_string_literal: true

require 'open3'
require 'tmpdir'

# The README's first command, for real: agents' facts in the master's cache, then
# `puppet apply` of examples/haproxy/site.pp renders haproxy.cfg.
describe 'script/example (puppet apply of the haproxy example)' do
  before(:all) do
    @work = Dir.mktmpdir('puppet-kicker-example')
    @stdout, @stderr, @status = Open3.capture3(File.join(ROOT, 'script', 'example'), @work)
  end

  let(:rendered) { File.read(File.join(@work, 'out', 'haproxy.cfg')) }

  it 'runs puppet apply successfully and prints the rendered haproxy.cfg' do
    expect(@status).to be_success, @stderr
    expect(@stdout).to eq(rendered)
  end

  it 'lists every production server of role node, in fqdn order, and nothing else' do
    servers = rendered.lines.grep(/^\s+server /).map(&:strip)
    expect(servers).to eq([
                            'server node1 10.0.0.11:8080 check inter 2000',
                            'server node2 10.0.0.12:8080 check inter 2000',
                            'server node3 10.0.0.13:8080 check inter 2000',
                          ])
  end

  it 'renders the same file from the EPP template' do
    expect(File.read(File.join(@work, 'out', 'haproxy-epp.cfg'))).to eq(rendered)
  end

  it 'answers the other functions too' do
    expect(@stderr).to include('load balancer: lb1 (10.0.0.2); nodes with 4+ CPUs: [node2, node3]')
  end

  it 'writes the snapshot, and a second run from it renders the same bytes without changing the file' do
    expect(File).to exist(File.join(@work, 'master', 'puppet_kicker', 'index.msgpack'))
    stdout, stderr, status = Open3.capture3(File.join(ROOT, 'script', 'example'), @work)
    expect(status).to be_success, stderr
    expect(stdout).to eq(rendered)
    expect(stderr).not_to match(%r{haproxy\.cfg\]/content: content changed})
  end
end
