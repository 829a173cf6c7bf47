# frozen_string_literal: true

# `ruby benches/ruby/puppetdb_query.rb`, with PuppetDB running as bench/puppetdb starts
# it (its `script/puppetdb env` read from PK_PUPPETDB_* variables) and the extension
# built: the same question asked in one real compile (Puppet's PAL catalog compiler,
# environment production) both ways, each call timed from the compiler:
#   puppetdb_query('inventory[certname, facts] { facts.role = "haproxy" and environment = "production" }')
#     (Debian's puppet-terminus-puppetdb, configured by a puppetdb.conf and Puppet's
#     ssl settings pointing at the stack's certificates), live from PuppetDB;
#   servers_with_role('haproxy'), source: puppetdb, the index warm.
# Asserts that both give the same set of certnames. Median per call of each.

require 'fileutils'
require 'set'
require 'yaml'
require 'puppet'
require 'puppet_pal'
require_relative 'support'

ROOT = BenchSupport::ROOT
CALLS = Integer(ENV.fetch('PK_BENCH_CALLS', '20'))
PQL = 'inventory[certname, facts] { facts.role = "haproxy" and environment = "production" }'

pdb = `#{ROOT}/script/puppetdb env`.lines.to_h { |l| l.chomp.split('=', 2) }
dir = BenchSupport.scratch_dir('pk-bench-puppetdb-query')
confdir = File.join(dir, 'etc')
modules = File.join(dir, 'modules')
FileUtils.mkdir_p([confdir, modules])
File.symlink(ROOT, File.join(modules, 'puppet_kicker'))
# What a master with storeconfigs has: puppetdb.conf, and its own certificate.
File.write(File.join(confdir, 'puppetdb.conf'), "[main]\nserver_urls = #{pdb.fetch('PK_PUPPETDB_URL')}\n")
File.write(File.join(confdir, 'puppet_kicker.yaml'), { 'source' => 'puppetdb', 'cache.dir' => File.join(dir, 'cache') }.to_yaml)

Puppet.initialize_settings(['--confdir', confdir, '--vardir', File.join(dir, 'var'), '--codedir', File.join(dir, 'code'),
                            '--certname', pdb.fetch('PK_PUPPETDB_CERTNAME'), '--hostcert', pdb.fetch('PK_PUPPETDB_CERT'),
                            '--hostprivkey', pdb.fetch('PK_PUPPETDB_KEY'), '--localcacert', pdb.fetch('PK_PUPPETDB_CA'),
                            '--certificate_revocation', 'false',])

def median(samples)
  s = samples.sort
  s.size.odd? ? s[s.size / 2] : (s[(s.size / 2) - 1] + s[s.size / 2]) / 2
end

# One warm-up call, then CALLS calls, each timed: the answer and the median seconds.
def timed_calls(compiler, name, *args)
  answer = compiler.call_function(name, *args)
  samples = Array.new(CALLS) do
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    compiler.call_function(name, *args)
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  end
  [answer, median(samples)]
end

puts "Puppet #{Puppet.version}, Ruby #{RUBY_VERSION}; #{CALLS} calls each after one warm-up; load average #{File.read('/proc/loadavg').split[0, 3].join(' ')}."
puts
Puppet[:tasks] = false
Puppet::Pal.in_tmp_environment('production', modulepath: [modules], facts: { 'fqdn' => 'bench.example.com' }) do |pal|
  pal.with_catalog_compiler do |compiler|
    ours, ours_median = timed_calls(compiler, 'servers_with_role', 'haproxy')
    theirs, theirs_median = timed_calls(compiler, 'puppetdb_query', PQL)
    ours_names = ours.map { |h| h.fetch('trusted').fetch('certname') }.to_set
    theirs_names = theirs.map { |h| h.fetch('certname') }.to_set
    raise "different servers: #{(ours_names ^ theirs_names).first(5).inspect}" unless ours_names == theirs_names && !ours_names.empty?

    puts format('- `puppetdb_query` (%<n>d servers, live from PuppetDB): median %<t>s per call', n: theirs.size, t: BenchSupport.human(theirs_median))
    puts format('- `servers_with_role` (%<n>d servers, index warm): median %<t>s per call', n: ours.size, t: BenchSupport.human(ours_median))
    puts format('- `servers_with_role` is %<x>.0fx faster, the same %<n>d certnames', x: theirs_median / ours_median, n: ours_names.size)
  end
end

# Where servers_with_role's time goes: the facade alone, outside the compiler (the
# compiler's dispatch checks the arguments and the returned Array[Hash]).
facade = Array.new(CALLS) do
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  PuppetKicker.servers_with_role('haproxy', 'production')
  Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
end
puts format('  - of which `PuppetKicker.servers_with_role` alone (no compiler): median %<t>s per call', t: BenchSupport.human(median(facade)))
