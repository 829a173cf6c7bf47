# frozen_string_literal: true

# `ruby benches/ruby/functions.rb [SERVERS]`, after `rake compile`: the Puppet functions'
# native path (PuppetKicker.servers_with_role / servers_with_facts, results converted
# to Ruby hashes) next to the pure-Ruby alternative (every fact file parsed into Ruby
# hashes once, then `select` + `sort_by` on every call), on a synthetic fleet written
# by `pk-synthetic-facts` as puppetserver's JSON fact cache. Standard library only.

require 'json'
require 'time'
require_relative 'support'

ROOT = BenchSupport::ROOT
SERVERS = Integer(ARGV.fetch(0, '10000'))
SEED = 1
ENVIRONMENT = 'production'
CLAUSES = ['role=node', 'processors.count>=4', 'os.release.full>=11.2'].freeze
MAX_AGE = 7 * 86_400 # puppet_kicker.yaml's default max_age
MEASURE = 1.0 # seconds of samples per case
MIN_SAMPLES = 3
# First calls measured per query shape, each in a fresh index generation (median).
FIRST_SAMPLES = 9

# Puppet.settings, set below, is what PuppetKicker.configure reads on every call (a
# Hash of confdir/vardir/server_datadir, like Puppet's).
BenchSupport.require_facade

abort "benches/ruby/functions.rb: #{PuppetKicker::NATIVE_LIBRARY} is missing; run `rake compile` first" unless File.exist?(PuppetKicker::NATIVE_LIBRARY)

Server = Struct.new(:certname, :environment, :timestamp, :facts)

# The pure-Ruby alternative, written for this one query shape (no clause parser),
# which is the cheapest a Ruby implementation could be.
module PureRuby
  module_function

  def load(dir)
    Dir.glob(File.join(dir, '*.json')).map do |path|
      document = JSON.parse(File.read(path))
      facts = document['values']
      facts['certname'] ||= document['name']
      environment = facts['environment'] || facts['agent_specified_environment'] || 'production'
      Server.new(document['name'], environment, Time.iso8601(document['timestamp']).to_i, facts)
    end
  end

  def servers_with_role(servers, role, environment)
    oldest = Time.now.to_i - MAX_AGE
    servers.select do |s|
      next false unless s.environment == environment && s.timestamp >= oldest

      value = s.facts['role']
      value == role || (value.is_a?(Array) && value.include?(role))
    end.sort_by { |s| s.facts['fqdn'] || s.certname }.map(&:facts)
  end

  # processors.count>=16, os.family=Debian.
  def big_debian(servers, environment)
    oldest = Time.now.to_i - MAX_AGE
    servers.select do |s|
      next false unless s.environment == environment && s.timestamp >= oldest

      count = s.facts.dig('processors', 'count')
      count.is_a?(Integer) && count >= 16 && s.facts.dig('os', 'family') == 'Debian'
    end.sort_by { |s| s.facts['fqdn'] || s.certname }.map(&:facts)
  end

  # hostname=/^web0001/.
  def hostname_matches(servers, pattern, environment)
    oldest = Time.now.to_i - MAX_AGE
    servers.select do |s|
      s.environment == environment && s.timestamp >= oldest && s.facts['hostname'].is_a?(String) &&
        pattern.match?(s.facts['hostname'])
    end.sort_by { |s| s.facts['fqdn'] || s.certname }.map(&:facts)
  end

  MIN_RELEASE = [11, 2].freeze

  # role=node, processors.count>=4, os.release.full>=11.2 (as a version).
  def servers_with_facts(servers, environment)
    oldest = Time.now.to_i - MAX_AGE
    servers.select do |s|
      next false unless s.environment == environment && s.timestamp >= oldest

      facts = s.facts
      count = facts.dig('processors', 'count')
      release = facts.dig('os', 'release', 'full')
      facts['role'] == 'node' && count.is_a?(Integer) && count >= 4 &&
        release.is_a?(String) && (release.split('.').map(&:to_i) <=> MIN_RELEASE) >= 0
    end.sort_by { |s| s.facts['fqdn'] || s.certname }.map(&:facts)
  end
end

# The Ruby engine's own floor for a first conversion (MRI's, or JRuby's): building, from objects that already
# exist, only what the servers' Hashes need that no earlier server had (Hashes through
# rb_hash_bulk_insert, as the magnus binding does; Arrays; Strings), each frozen, for
# the servers a native call returned. Median seconds a server of 5 runs, and the
# Hashes and Hash entries made a server.
def first_conversion_floor(facts_dir, certnames)
  seen = {}
  jobs = certnames.map do |certname|
    facts = JSON.parse(File.read(File.join(facts_dir, "#{certname}.json")), freeze: true)['values']
    job = []
    walk = lambda do |value|
      case value
      when Hash then value.each_value(&walk)
      when Array then value.each(&walk)
      when String then nil
      else next
      end
      next if seen[value]

      seen[value] = true
      job << case value
             when Hash then [:hash, value.flat_map { |k, v| [k, v] }]
             when Array then [:array, value]
             else [:string, value]
             end
    end
    facts.each_value(&walk)
    job << [:hash, facts.flat_map { |k, v| [k, v] } + (facts.key?('certname') ? [] : ['certname', certname])]
  end
  runs = Array.new(5) do
    GC.start
    GC.disable
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    jobs.each do |job|
      job.each do |kind, made|
        case kind
        when :hash then Hash[*made].freeze
        when :array then Array.new(made).freeze
        else String.new(made).freeze
        end
      end
    end
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  ensure
    GC.enable
  end
  hashes = jobs.sum { |job| job.count { |kind, _| kind == :hash } }
  entries = jobs.sum { |job| job.sum { |kind, made| kind == :hash ? made.size / 2 : 0 } }
  { per_server: runs.sort[2] / certnames.size, hashes: hashes.fdiv(certnames.size), entries: entries.fdiv(certnames.size) }
end

def measure(&block)
  BenchSupport.measure(seconds: MEASURE, min_samples: MIN_SAMPLES, &block)
end

def human(seconds)
  BenchSupport.human(seconds)
end

def rss_mb
  File.read('/proc/self/status')[/^VmRSS:\s+(\d+)/, 1].to_i / 1024.0
rescue SystemCallError
  0.0
end

def ratio(base, row)
  row <= base ? format('%.1fx faster', base / row) : format('%.1fx slower', row / base)
end

# rows: [name, :ours | :alternative | :info, stats]; speed-up compares the row's
# median with the alternative's (none for :info rows, which answer another question).
def print_table(title, rows)
  baseline = rows.find { |_, kind, _| kind == :alternative }[2][:median]
  width = [rows.map { |name, _, _| name.size + 2 }.max, 16].max
  puts title
  puts format("  %-#{width}s  %10s  %10s  %7s  %15s", 'implementation', 'median', 'mean', 'samples', 'speed-up')
  rows.each do |name, kind, stats|
    marker, relative = { alternative: ['* ', '(alternative)'], ours: ['> ', ratio(baseline, stats[:median])],
                         info: ['  ', ratio(baseline, stats[:median])], }.fetch(kind)
    puts format("  %-#{width}s  %10s  %10s  %7d  %15s",
                marker + name, human(stats[:median]), human(stats[:mean]), stats[:samples], relative)
  end
  puts
end

def names(servers)
  servers.map { |facts| facts['certname'] }
end

cpu = (File.exist?('/proc/cpuinfo') && File.read('/proc/cpuinfo')[/^model name\s*:\s*(.+)$/, 1]) || 'unknown'
puts "puppet-kicker #{PuppetKicker::VERSION} Ruby benchmark (ruby benches/ruby/functions.rb)"
puts "machine: nproc #{`nproc`.strip}, CPU #{cpu}, #{RUBY_DESCRIPTION}"
puts "load average at start: #{File.read('/proc/loadavg').split.first(3).join(' ')}"

dir = BenchSupport.scratch_dir('pk-bench-functions')
facts_dir = File.join(dir, 'var', 'server_data', 'facts')
BenchSupport.synthetic_fleet(facts_dir, SERVERS, SEED)
# A long ttl, so that no background refresh competes with the measurements.
config = File.join(dir, 'puppet_kicker.yaml')
File.write(config, "cache:\n  ttl: 1d\n  cold_start_timeout: 5m\n")
ENV['PUPPET_KICKER_CONFIG'] = config
Puppet.settings = { confdir: File.join(dir, 'etc'), vardir: File.join(dir, 'var'), server_datadir: nil }
puts "native library: #{PuppetKicker.native.version} (#{PuppetKicker.backend} backend" \
     "#{if PuppetKicker.native.respond_to?(:java_reader)
          ", #{PuppetKicker.native.java_reader ? 'Java' : 'Ruby'} reader"
        else
          ''
        end})"
puts

# The native path is measured first, before the pure-Ruby data exists: 10,000
# preloaded fact hashes on the Ruby heap would slow every garbage collection the
# native results trigger, which a real compile using the native path never has.
rss = rss_mb
first = nil
cold = Benchmark.realtime do
  PuppetKicker.configure(Puppet.settings)
  first = PuppetKicker.servers_with_role('node', ENVIRONMENT).size
end
native_rss = rss_mb - rss
status = PuppetKicker.status
raise "the index holds #{status['servers']} servers, not #{SERVERS}" unless status['servers'] == SERVERS

role_call = ->(role) { "servers_with_role('#{role}', '#{ENVIRONMENT}')" }
facts_call = "servers_with_facts(#{CLAUSES.map { |c| "'#{c}'" }.join(', ')})"
cases = %w[node haproxy].map do |role|
  { title: role_call[role],
    native: ['native: PuppetKicker.servers_with_role (index + conversion to Ruby)',
             -> { PuppetKicker.servers_with_role(role, ENVIRONMENT) },],
    info: ['native: PuppetKicker.server_with_role (same lookup, converts 1 server)',
           -> { PuppetKicker.server_with_role(role, ENVIRONMENT) },],
    ruby: ['pure Ruby: select + sort_by over preloaded hashes',
           ->(servers) { PureRuby.servers_with_role(servers, role, ENVIRONMENT) },], }
end
# `paths`: queries that build, in a fresh generation, the indexes of the paths a
# case's clauses name and select no server, so that a first call after them
# measures the conversion (and the clauses' evaluation), not the indexes' build
# (issue 11 counts that separately).
cases << { title: facts_call,
           paths: [['processors.count>=1000000'], ['os.release.full>=999']],
           native: ['native: PuppetKicker.servers_with_facts (index + conversion to Ruby)',
                    -> { PuppetKicker.servers_with_facts(CLAUSES, ENVIRONMENT) },],
           ruby: ['pure Ruby: select (hand-written test) + sort_by over preloaded hashes',
                  ->(servers) { PureRuby.servers_with_facts(servers, ENVIRONMENT) },], }
big_debian = ['processors.count>=16', 'os.family=Debian']
cases << { title: "servers_with_facts(#{big_debian.map { |c| "'#{c}'" }.join(', ')})",
           paths: [['processors.count>=1000000'], ['os.family=pk-bench-none']],
           native: ['native: PuppetKicker.servers_with_facts (index + conversion to Ruby)',
                    -> { PuppetKicker.servers_with_facts(big_debian, ENVIRONMENT) },],
           ruby: ['pure Ruby: select (hand-written test) + sort_by over preloaded hashes',
                  ->(servers) { PureRuby.big_debian(servers, ENVIRONMENT) },], }
cases << { title: "servers_with_facts('hostname=/^web0001/')",
           paths: [['hostname=pk-bench-none']],
           native: ['native: PuppetKicker.servers_with_facts (index + conversion to Ruby)',
                    -> { PuppetKicker.servers_with_facts(['hostname=/^web0001/'], ENVIRONMENT) },],
           ruby: ['pure Ruby: select (regex on every hostname) + sort_by over preloaded hashes',
                  ->(servers) { PureRuby.hostname_matches(servers, /^web0001/, ENVIRONMENT) },], }

# The first call of an index generation (after a refresh, or in a new process)
# converts what it returns: measured in fresh generations, one shape at a time (a
# new configuration makes a new core, which loads the snapshot as a new generation).
configs = [config, File.join(dir, 'puppet_kicker_b.yaml')]
File.write(configs[1], File.read(config))
fresh_generation = lambda do
  configs.rotate!
  ENV['PUPPET_KICKER_CONFIG'] = configs.first
  PuppetKicker.configure(Puppet.settings)
  PuppetKicker.servers_with_role('no-such-role', ENVIRONMENT)
end
cases.each do |c|
  samples = Array.new(FIRST_SAMPLES) do
    fresh_generation.call
    GC.start
    Benchmark.realtime(&c[:native][1])
  end.sort
  c[:first] = samples[samples.size / 2]
  # The same, the paths' indexes built first: the conversion of the servers.
  samples = Array.new(FIRST_SAMPLES) do
    fresh_generation.call
    (c[:paths] || []).each { |clauses| raise 'a path query selected servers' unless PuppetKicker.servers_with_facts(clauses, ENVIRONMENT).empty? }
    GC.start
    Benchmark.realtime(&c[:native][1])
  end.sort
  c[:conversion] = samples[samples.size / 2]
end
# A long-running master (puppetserver) converts after every refresh: the same first
# call once the engine has run it many times (JRuby's JIT, the JVM's warm), the
# median of the last 5 of WARM_GENERATIONS fresh generations, for the first case;
# the mean of the last 20, with whatever collections fell into them (under JRuby,
# whose GC.start does nothing, a young collection of the objects the call keeps
# falls into about every other call); then the median of 5 more, each after a full
# collection (BenchSupport.collect_garbage): the call's own cost, as MRI's figures
# are measured. Next to the mean and that median, the process's CPU time in the call
# (every thread's: the core's encoder thread overlaps JRuby's reader).
WARM_GENERATIONS = 25
timed = lambda do
  cpu = BenchSupport.process_cpu_seconds
  [Benchmark.realtime(&cases.first[:native][1]), BenchSupport.process_cpu_seconds - cpu]
end
warm = Array.new(WARM_GENERATIONS) do
  fresh_generation.call
  GC.start
  timed.call
end
warm_first = warm.last(5).map(&:first).sort[2]
warm_mean = warm.last(20).sum(&:first) / 20
warm_cpu = warm.last(20).sum(&:last) / 20
warm_collected, warm_collected_cpu = Array.new(5) do
  fresh_generation.call
  BenchSupport.collect_garbage
  timed.call
end.sort[2]
fresh_generation.call
cases.each do |c|
  c[:names] = names(c[:native][1].call)
  c[:native_stats] = measure(&c[:native][1])
  c[:info_stats] = measure(&c[:info][1]) if c[:info]
end
overhead = measure { PuppetKicker.servers_with_role('no-such-role', ENVIRONMENT) }

GC.start
rss = rss_mb
servers = nil
load = Benchmark.realtime { servers = PureRuby.load(facts_dir) }
ruby_rss = rss_mb - rss
cases.each do |c|
  raise "#{c[:title]}: native and pure Ruby disagree" unless names(c[:ruby][1].call(servers)) == c[:names]

  c[:ruby_stats] = measure { c[:ruby][1].call(servers) }
end

puts "one-time cost for #{SERVERS} servers (JSON fact cache, warm page cache; RSS growth includes allocator slack):"
puts format('  > native: configure + first call (read JSON files, build index, snapshot, convert %d servers) %8s, RSS +%.0f MB',
            first, human(cold), native_rss)
puts format('  * pure Ruby: read and JSON.parse every file into hashes                                      %8s, RSS +%.0f MB',
            human(load), ruby_rss)
puts
puts format('native call overhead (servers_with_role of a role no server has, empty result): median %s, mean %s',
            human(overhead[:median]), human(overhead[:mean]))
puts
cases.each do |c|
  first = { median: c[:first], mean: c[:first], samples: FIRST_SAMPLES }
  rows = [[c[:native][0].sub('(index + conversion to Ruby)', '(again: the kept answer)'), :ours, c[:native_stats]],
          ['native: the first call of an index generation (converts the servers)', :info, first],
          [c[:ruby][0], :alternative, c[:ruby_stats]],]
  rows << [c[:info][0], :info, c[:info_stats]] if c[:info]
  per_server = c[:names].empty? ? '' : format(' (%.1f µs a server)', c[:first] * 1e6 / c[:names].size)
  conversion = if c[:names].empty? || !c[:paths] then ''
               else
                 format('; with the paths\' indexes built before it %s (%.1f µs a server)',
                        human(c[:conversion]), c[:conversion] * 1e6 / c[:names].size)
               end
  print_table("#{c[:title]}: #{c[:names].size} of #{SERVERS} servers, returned as Ruby hashes; " \
              "first call of a generation #{human(c[:first])}#{per_server}#{conversion}", rows)
end

node = cases.first
floor = first_conversion_floor(facts_dir, node[:names])
engine = RUBY_ENGINE == 'ruby' ? 'MRI' : RUBY_ENGINE
puts format("%s's floor for %s's first call: only the Hashes (%.1f, %.0f entries), Arrays and Strings each " \
            'server has that no earlier one had, built from existing objects: %.1f µs a server ' \
            '(the native first call: %.1f µs a server; after %d earlier generations: %.1f µs a server, ' \
            '%.1f on average over the last 20 (CPU %.1f), %.1f after a full collection (CPU %.1f))', engine,
            node[:title], floor[:hashes], floor[:entries], floor[:per_server] * 1e6, node[:first] * 1e6 / node[:names].size,
            WARM_GENERATIONS, warm_first * 1e6 / node[:names].size, warm_mean * 1e6 / node[:names].size,
            warm_cpu * 1e6 / node[:names].size, warm_collected * 1e6 / node[:names].size,
            warm_collected_cpu * 1e6 / node[:names].size)
puts
puts "load average at end: #{File.read('/proc/loadavg').split.first(3).join(' ')}"
puts 'Not measured: the original puppet-kicker ran a live mcollective discovery (rpcutil#inventory with fact'
puts 'filters, 2 s discovery timeout) on every function call (README, "Differences from the original").'
