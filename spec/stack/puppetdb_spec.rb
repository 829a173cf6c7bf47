# frozen_string_literal: true

require 'json'
require 'open3'
require 'fileutils'
require 'net/http'
require 'openssl'
require 'time'
require 'tmpdir'
require 'uri'
require 'yaml'

# puppet-kicker answering from a real PuppetDB 7.12 (on its own PostgreSQL 15), fed
# by a real puppetserver 7.9 through puppet-terminus-puppetdb: agents' runs store
# their facts and trusted facts in PuppetDB, and the server's puppet_kicker.yaml says
# `source: puppetdb` with `role_fact: trusted.extensions.pp_role`. One agent has its
# role only in its certificate (a pp_role extension request), one server only in
# PuppetDB (a replace_facts command, never an agent run): answers that name it come
# from PuppetDB. Then a deactivated node, PuppetDB stopped and started again, and a
# wrong CA.
#
# script/test-puppetdb starts puppetserver and PuppetDB (script/puppetserver,
# script/puppetdb), sets PK_PUPPETDB_TEST=1, runs this file and stops both by pid
# (spec/stack/ is not in the default rspec run).
describe 'PuppetDB as the fact source, on puppetserver (JRuby)' do
  # certname => [facts the agent reports (FACTER_*), its pp_role extension request].
  PDB_AGENTS = {
    'web1.example.com' => [{ 'role' => 'node', 'kicker_cores' => '2' }, 'node'],
    'web2.example.com' => [{ 'role' => 'node', 'kicker_cores' => '8' }, 'node'],
    'db1.example.com' => [{ 'role' => 'db', 'kicker_cores' => '4' }, 'db'],
    'lb1.example.com' => [{ 'role' => 'haproxy', 'kicker_cores' => '2' }, 'haproxy'],
    # No role fact: its role is only in its certificate.
    'lb2.example.com' => [{ 'kicker_cores' => '2' }, 'haproxy'],
  }.freeze
  # Only in PuppetDB (script/puppetdb submit, as for the synthetic fleet).
  PDB_SUBMITTED = 'web9.example.com'
  PDB_ANSWERS = 'haproxy=lb1.example.com,lb2.example.com ' \
                'nodes=web1.example.com,web2.example.com,web9.example.com db=db1.example.com ' \
                'big=web2.example.com,web9.example.com by_extension=lb1.example.com,lb2.example.com ' \
                'missing=the default'
  PDB_WITHOUT_WEB2 = 'haproxy=lb1.example.com,lb2.example.com ' \
                     'nodes=web1.example.com,web9.example.com db=db1.example.com ' \
                     'big=web9.example.com by_extension=lb1.example.com,lb2.example.com ' \
                     'missing=the default'
  # How long a change may take to reach a compile: PuppetDB's queue, then a refresh
  # (cache.ttl 1 s in the test's puppet_kicker.yaml) that a compile starts and a
  # later compile sees.
  PDB_CONVERGE = 90

  before(:all) do
    raise 'needs puppetserver and PuppetDB: run script/test-puppetdb' unless ENV['PK_PUPPETDB_TEST'] == '1'

    @ps = `#{ROOT}/script/puppetserver env`.lines.to_h { |l| l.chomp.split('=', 2) }
    @pdb = `#{ROOT}/script/puppetdb env`.lines.to_h { |l| l.chomp.split('=', 2) }
  end

  def agent_dir(certname)
    File.join(@ps.fetch('PK_PUPPETSERVER_AGENTS'), certname)
  end

  def site(manifest)
    FileUtils.cp(File.join(ROOT, 'spec', 'fixtures', 'puppetdb', manifest),
                 File.join(@ps.fetch('PK_PUPPETSERVER_ENVDIR'), 'manifests', 'site.pp'))
  end

  # `puppet agent --test` as certname; [output, exit status]. Before its first run,
  # csr_attributes.yaml asks for its pp_role extension.
  def agent(certname)
    facts, pp_role = PDB_AGENTS.fetch(certname)
    attributes = File.join(agent_dir(certname), 'etc', 'csr_attributes.yaml')
    unless File.exist?(attributes)
      FileUtils.mkdir_p(File.dirname(attributes))
      File.write(attributes, { 'extension_requests' => { 'pp_role' => pp_role } }.to_yaml)
    end
    env = facts.merge('fqdn' => certname).transform_keys { |name| "FACTER_#{name}" }
    out, status = Open3.capture2e(env, File.join(ROOT, 'script', 'puppetserver'), 'agent', certname, '--color=false')
    [out, status.exitstatus]
  end

  def expect_applied(certname, (out, code))
    # --test: 0 = no changes, 2 = changes; anything else is a failed run.
    expect([0, 2]).to include(code), "#{certname} exited #{code}:\n#{out}"
    errors = out.lines.grep(/^Error:/).reject { |l| l.include?('Facter: Permission denied') }
    expect(errors).to be_empty, "#{certname}:\n#{out}"
  end

  def in_parallel(certnames)
    certnames.map { |c| Thread.new { [c, agent(c)] } }.map(&:value).to_h
  end

  def catalog(certname)
    JSON.parse(File.read(File.join(agent_dir(certname), 'var', 'client_data', 'catalog', "#{certname}.json")))
  end

  def notify_message(certname, title)
    resource = catalog(certname)['resources'].find { |r| r['type'] == 'Notify' && r['title'] == title }
    raise "no Notify[#{title}] in the catalog of #{certname}" unless resource

    resource['parameters']['message']
  end

  # lb1's run, and what the functions answered in its catalog.
  def lb1_answers
    run = agent('lb1.example.com')
    expect_applied('lb1.example.com', run)
    notify_message('lb1.example.com', 'puppet-kicker answers')
  end

  # Runs lb1 until its answers are `expected` (a refresh is started by one compile
  # and seen by a later one), within PDB_CONVERGE seconds; the answers seen.
  def lb1_answers_until(expected)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + PDB_CONVERGE
    seen = []
    loop do
      seen << lb1_answers
      return seen if seen.last == expected || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    end
  end

  # GET from PuppetDB with its own certificate (PuppetDB asks every client for one).
  def pdb_get(path)
    uri = URI(@pdb.fetch('PK_PUPPETDB_URL') + path)
    http = Net::HTTP.new(uri.host, uri.port)
    http.use_ssl = true
    http.verify_mode = OpenSSL::SSL::VERIFY_PEER
    http.ca_file = @pdb.fetch('PK_PUPPETDB_CA')
    http.cert = OpenSSL::X509::Certificate.new(File.read(@pdb.fetch('PK_PUPPETDB_CERT')))
    http.key = OpenSSL::PKey.read(File.read(@pdb.fetch('PK_PUPPETDB_KEY')))
    response = http.start { |h| h.get(uri.request_uri) }
    raise "GET #{path}: HTTP #{response.code} #{response.body}" unless response.is_a?(Net::HTTPSuccess)

    JSON.parse(response.body)
  end

  def inventory
    pdb_get('/pdb/query/v4/inventory').to_h { |node| [node['certname'], node] }
  end

  def wait_for(what, seconds = PDB_CONVERGE)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    until (value = yield)
      raise "#{what}: not within #{seconds} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.5
    end
    value
  end

  def server_log
    File.read(@ps.fetch('PK_PUPPETSERVER_LOG'))
  end

  # The server's log from byte `offset` on.
  def server_log_since(offset)
    server_log.byteslice(offset..) || ''
  end

  # Refreshes that failed, as the server logged them from byte `offset` on: none may,
  # full or incremental, while PuppetDB is up.
  def refresh_failures_since(offset)
    server_log_since(offset).lines.grep(/puppet-kicker refresh failed/)
  end

  def script(*args)
    out, status = Open3.capture2e(File.join(ROOT, 'script', args.first), *args.drop(1))
    raise "script/#{args.join(' ')} failed:\n#{out}" unless status.success?

    out
  end

  it "stores the agents' facts and trusted facts in PuppetDB through the terminus, and a submitted server's" do
    site('register.pp')
    in_parallel(PDB_AGENTS.keys).each { |certname, run| expect_applied(certname, run) }
    Dir.mktmpdir('pk-pdb-submit') do |dir|
      # puppetserver's JSON fact cache format, as pk-synthetic-facts writes it.
      values = { 'role' => 'node', 'kicker_cores' => '16', 'environment' => 'production', 'fqdn' => PDB_SUBMITTED }
      File.write(File.join(dir, "#{PDB_SUBMITTED}.json"),
                 JSON.generate('name' => PDB_SUBMITTED, 'values' => values, 'timestamp' => Time.now.utc.iso8601(3)))
      expect(script('puppetdb', 'submit', dir)).to match(/\A1 replace_facts sent .*, 1 stored by PuppetDB/)
    end
    # The terminus submits commands; PuppetDB stores them from its queue.
    nodes = wait_for('every agent in the inventory') { (n = inventory).size == PDB_AGENTS.size + 1 && n }
    expect(nodes.keys.sort).to eq((PDB_AGENTS.keys + [PDB_SUBMITTED]).sort)
    expect(nodes['lb2.example.com']['trusted']['extensions']).to include('pp_role' => 'haproxy')
    expect(nodes['lb2.example.com']['facts']).not_to have_key('role')
    expect(nodes['web1.example.com']['facts']).to include('role' => 'node', 'kicker_cores' => '2')
    expect(nodes['web1.example.com']['environment']).to eq('production')
  end

  it 'compiles catalogs that call all three functions with answers from PuppetDB, trusted roles included' do
    site('site.pp')
    log_before = server_log.bytesize
    runs = in_parallel(%w[lb1.example.com lb2.example.com])
    runs.each { |certname, run| expect_applied(certname, run) }
    %w[lb1.example.com lb2.example.com].each do |lb|
      expect(notify_message(lb, 'puppet-kicker answers')).to eq(PDB_ANSWERS)
      expect(notify_message(lb, 'puppet-kicker lb2')).to eq('role= pp_role=haproxy authenticated=remote')
    end
    expect(server_log).not_to match(/LoadError|cannot load puppet-kicker|Evaluation Error/)
    expect(refresh_failures_since(log_before)).to be_empty
  end

  it 'leaves out a node deactivated with `puppet node deactivate` after the next refresh' do
    out, status = Open3.capture2e('puppet', 'node', 'deactivate', 'web2.example.com',
                                  '--confdir', @ps.fetch('PK_PUPPETSERVER_CONFDIR'), '--color=false')
    expect(status).to be_success, out
    log_before = server_log.bytesize
    wait_for('web2 out of the inventory') { !inventory.key?('web2.example.com') }
    seen = lb1_answers_until(PDB_WITHOUT_WEB2)
    expect(seen.last).to eq(PDB_WITHOUT_WEB2), "answers seen:\n#{seen.join("\n")}"
    expect(refresh_failures_since(log_before)).to be_empty
  end

  it 'goes on compiling from the snapshot while PuppetDB is stopped, with a warning naming its URL' do
    script('puppetdb', 'stop', 'puppetdb')
    url = Regexp.escape(@pdb.fetch('PK_PUPPETDB_URL'))
    log_before = server_log.bytesize
    # The failed refresh a compile starts is logged by a later compile.
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + PDB_CONVERGE
    warning = nil
    until warning
      expect(lb1_answers).to eq(PDB_WITHOUT_WEB2)
      warning = refresh_failures_since(log_before).grep(/#{url}/).first
      raise "no warning naming #{url} within #{PDB_CONVERGE} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    end
    expect(warning).to match(/WARN .*still serving the last snapshot.*Connection refused/)
  end

  it 'refreshes again once PuppetDB is back' do
    script('puppetdb', 'start')
    # web2's run stores its facts again, which makes it active again.
    expect_applied('web2.example.com', agent('web2.example.com'))
    wait_for('web2 back in the inventory') { inventory.key?('web2.example.com') }
    seen = lb1_answers_until(PDB_ANSWERS)
    expect(seen.last).to eq(PDB_ANSWERS), "answers seen:\n#{seen.join("\n")}"
    # (A failure while PuppetDB was down may be logged by a compile after it is back.)
    # Two more compiles, each starting a refresh (cache.ttl 1 s), the second logging
    # how the first one's went: full or incremental, neither fails.
    log_before = server_log.bytesize
    2.times { expect(lb1_answers).to eq(PDB_ANSWERS) }
    expect(refresh_failures_since(log_before)).to be_empty
  end

  it 'refuses a PuppetDB whose certificate a wrong CA does not sign, with a clear error' do
    Dir.mktmpdir('pk-pdb-wrong-ca') do |dir|
      # Another CA, of the same shape as Puppet's own.
      key = OpenSSL::PKey::RSA.new(2048)
      ca = OpenSSL::X509::Certificate.new
      ca.version = 2
      ca.serial = 1
      ca.subject = ca.issuer = OpenSSL::X509::Name.parse('/CN=Not the Puppet CA')
      ca.public_key = key.public_key
      ca.not_before = Time.now - 60
      ca.not_after = Time.now + 3600
      extensions = OpenSSL::X509::ExtensionFactory.new(ca, ca)
      ca.add_extension(extensions.create_extension('basicConstraints', 'CA:TRUE', true))
      ca.add_extension(extensions.create_extension('keyUsage', 'keyCertSign, cRLSign', true))
      ca.sign(key, OpenSSL::Digest.new('SHA256'))
      File.write(File.join(dir, 'wrong-ca.pem'), ca.to_pem)
      # The server's own puppetdb.conf and certificate, only the CA changed; masterless
      # (`puppet apply` in MRI), a cache of its own, no snapshot: a cold start.
      File.write(File.join(dir, 'puppet_kicker.yaml'), {
        'source' => 'puppetdb',
        'puppetdb' => { 'ca' => 'wrong-ca.pem' },
        'cache' => { 'dir' => File.join(dir, 'cache'), 'cold_start_timeout' => 20 },
      }.to_yaml)
      out, status = Open3.capture2e(
        { 'PUPPET_KICKER_CONFIG' => File.join(dir, 'puppet_kicker.yaml') },
        'puppet', 'apply', '--confdir', @ps.fetch('PK_PUPPETSERVER_CONFDIR'), '--vardir', File.join(dir, 'var'),
        '--modulepath', @ps.fetch('PK_PUPPETSERVER_MODULES'), '--color=false',
        '-e', "notice(servers_with_role('node').map |$s| { $s['certname'] })"
      )
      expect(status).not_to be_success, out
      error = out.lines.grep(/Error/).join
      expect(error).to include(@pdb.fetch('PK_PUPPETDB_URL')), out
      expect(error).to match(/certificate|CA/i), out
      expect(error).to include('puppetdb.ca'), out
    end
  end
end
