# frozen_string_literal: true

# The Puppet functions' native path next to pure Ruby, like for like, on a synthetic
# fleet written by `pk-synthetic-facts` as puppetserver's JSON fact cache:
#
#   ruby benches/ruby/functions.rb [SERVERS]    MRI: the magnus backend (`rake compile`)
#   jruby benches/ruby/functions.rb [SERVERS]   JRuby: the ffi backend and, when
#       native/puppet_kicker_jruby.jar is there (`rake jar`), the Java reader of its
#       replies, as puppetserver loads them
#
# For benches/ruby/compare_mri.rb, which runs it alternately with two builds of the
# magnus extension: `--native-only` (no pure-Ruby part; the first calls' samples in
# the results file), `--facts DIR` (the fleet already written there, shared by the
# runs), `--facade DIR` (the facade loaded from DIR/lib, so the extension from
# DIR/native).
#
# Each query shape is called through the PuppetKicker facade the functions call
# (configure, query, conversion to Ruby Hashes), in three ways, each next to the
# pure-Ruby alternative (every fact file parsed into Ruby Hashes once, then `select` +
# `sort_by` on every call: no cache, so every call of it is a full scan):
#   first call     the first call of a new index generation: the servers it returns
#                  are converted to Ruby, and the indexes of the paths it names built;
#   distinct call  a different query on every call (the shape's query plus a role no
#                  server has, or a bound or regex alternative that selects no other
#                  server), so that no kept answer can serve it, its servers already
#                  converted; pure Ruby runs the same queries;
#   identical call the same call again: the Array kept for it is returned.
# Before timing, each shape's native answer is checked to equal pure Ruby's (the same
# servers in the same order), its base query and distinct ones alike.
#
# Goals: a distinct call >= 100x pure Ruby's scan; a first call no slower than it.
# Markdown on stdout; with PK_BENCH_RESULTS=FILE, the figures as JSON in FILE too (for
# script/bench --report). Standard library only (and ffi under JRuby).

require 'json'
require 'time'
require_relative 'support'

ROOT = BenchSupport::ROOT
# The value of option `name` (removed from ARGV), if given.
def option(name)
  at = ARGV.index(name) or return nil
  ARGV.delete_at(at)
  ARGV.delete_at(at) || abort("benches/ruby/functions.rb: #{name} needs a value")
end
NATIVE_ONLY = !ARGV.delete('--native-only').nil?
SHARED_FACTS = option('--facts')
FACADE = option('--facade') || ROOT
SERVERS = Integer(ARGV.fetch(0, '10000'))
SEED = 1
ENVIRONMENT = 'production'
MAX_AGE = 7 * 86_400 # puppet_kicker.yaml's default max_age
MEASURE = 1.0 # seconds of samples per case
MIN_SAMPLES = 5
JRUBY = RUBY_ENGINE == 'jruby'
# First calls per shape, each in a fresh index generation: the median of FIRST_SAMPLES,
# after FIRST_WARM_UP generations of the same call (under JRuby: for its JIT, as a
# long-running puppetserver has compiled the path before any refresh).
FIRST_SAMPLES = 9
FIRST_WARM_UP = JRUBY ? 15 : 2
DISTINCT_GOAL = 100.0
FIRST_GOAL = 1.0

BenchSupport.require_facade(FACADE)
library = PuppetKicker::LIBRARIES.fetch(PuppetKicker.backend)
abort "benches/ruby/functions.rb: #{library} is missing; run `rake compile` first" unless File.exist?(library)

Server = Struct.new(:certname, :environment, :timestamp, :facts)

# The pure-Ruby alternative, written for each query shape (no clause parser): the
# cheapest a Ruby implementation could be. Each takes the parameter its distinct
# calls vary.
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

  def sorted(servers)
    servers.sort_by { |s| s.facts['fqdn'] || s.certname }.map(&:facts)
  end

  def current(servers)
    oldest = Time.now.to_i - MAX_AGE
    servers.select { |s| s.environment == ENVIRONMENT && s.timestamp >= oldest && yield(s.facts) }
  end

  # role is one of `roles`.
  def with_role(servers, roles)
    sorted(current(servers) do |facts|
      value = facts['role']
      value.is_a?(Array) ? value.any? { |v| roles.include?(v) } : roles.include?(value)
    end)
  end

  MIN_RELEASE = [11, 2].freeze

  # role=node, processors.count>=min, os.release.full>=11.2 (as a version).
  def node_release(servers, min)
    sorted(current(servers) do |facts|
      count = facts.dig('processors', 'count')
      release = facts.dig('os', 'release', 'full')
      facts['role'] == 'node' && count.is_a?(Integer) && count >= min &&
        release.is_a?(String) && (release.split('.').map(&:to_i) <=> MIN_RELEASE) >= 0
    end)
  end

  # processors.count>=min, os.family=Debian.
  def big_debian(servers, min)
    sorted(current(servers) do |facts|
      count = facts.dig('processors', 'count')
      count.is_a?(Integer) && count >= min && facts.dig('os', 'family') == 'Debian'
    end)
  end

  # hostname=/pattern/.
  def hostname(servers, pattern)
    sorted(current(servers) { |facts| facts['hostname'].is_a?(String) && pattern.match?(facts['hostname']) })
  end
end

# A query shape: its base call (`nil`) and its distinct calls (`i` = 0, 1, ...), both
# native (`native[i]`) and pure Ruby (`ruby[servers, i]`), each selecting the same
# servers. Distinct values end in 1 so that no two are the same number.
Shape = Struct.new(:label, :distinct, :native, :ruby, keyword_init: true)
role = lambda do |name|
  roles = ->(i) { i.nil? ? [name] : [name, "pk-bench-absent-#{i}"] }
  Shape.new(label: "servers_with_role('#{name}')", distinct: "`servers_with_role(['#{name}', 'pk-bench-absent-N'])`",
            native: ->(i) { PuppetKicker.servers_with_role(roles[i], ENVIRONMENT) },
            ruby: ->(servers, i) { PureRuby.with_role(servers, roles[i]) })
end
SHAPES = [
  role['node'],
  role['haproxy'],
  # Processor counts are 2, 4, 8, 16 and 32: any bound above 3 and up to 4 selects the same.
  Shape.new(label: "servers_with_facts('role=node', 'processors.count>=4', 'os.release.full>=11.2')",
            distinct: "`'processors.count>=3.N1'` in place of `>=4`",
            native: lambda { |i|
              bound = i.nil? ? '4' : "3.#{i}1"
              PuppetKicker.servers_with_facts(['role=node', "processors.count>=#{bound}", 'os.release.full>=11.2'], ENVIRONMENT)
            },
            ruby: ->(servers, i) { PureRuby.node_release(servers, i.nil? ? 4 : Float("3.#{i}1")) }),
  Shape.new(label: "servers_with_facts('processors.count>=16', 'os.family=Debian')",
            distinct: "`'processors.count>=8.N1'` in place of `>=16`",
            native: lambda { |i|
              bound = i.nil? ? '16' : "8.#{i}1"
              PuppetKicker.servers_with_facts(["processors.count>=#{bound}", 'os.family=Debian'], ENVIRONMENT)
            },
            ruby: ->(servers, i) { PureRuby.big_debian(servers, i.nil? ? 16 : Float("8.#{i}1")) }),
  Shape.new(label: "servers_with_facts('hostname=/^web0[0-4]/')",
            distinct: "`servers_with_facts('hostname=/^web0[0-4]|^pk-bench-absent-N/')`",
            native: lambda { |i|
              pattern = i.nil? ? '^web0[0-4]' : "^web0[0-4]|^pk-bench-absent-#{i}"
              PuppetKicker.servers_with_facts(["hostname=/#{pattern}/"], ENVIRONMENT)
            },
            ruby: lambda { |servers, i|
              PureRuby.hostname(servers, i.nil? ? /^web0[0-4]/ : Regexp.new("^web0[0-4]|^pk-bench-absent-#{i}"))
            }),
].freeze

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

# A Markdown table cell: a `|` escaped, even in code.
def cell(text)
  text.gsub('|', '\\|')
end

# A number with thousands separators.
def count(number)
  number.to_s.reverse.scan(/\d{1,3}/).join(',').reverse
end

def names(servers)
  servers.map { |facts| facts['certname'] }
end

# How many times faster than pure Ruby (below 1: slower).
def times(ratio)
  digits = if ratio < 10 then 2
           elsif ratio < 100 then 1
           else
             0
           end
  text = format("%.#{digits}f", ratio)
  text = text.reverse.scan(/\d{1,3}/).join(',').reverse if digits.zero?
  "#{text}x"
end

reader = if PuppetKicker.native.respond_to?(:java_reader)
           PuppetKicker.native.java_reader ? 'the Java reader' : 'the Ruby reader'
         end
engine = JRUBY ? "JRuby #{JRUBY_VERSION} (Ruby #{RUBY_VERSION}) on Java #{ENV_JAVA['java.version']}" : "MRI #{RUBY_VERSION}"
backend = "#{PuppetKicker.backend} backend#{reader ? ", #{reader}" : ''}"
warn "==> #{engine}, #{backend}: #{SERVERS} servers"

dir = BenchSupport.scratch_dir('pk-bench-functions')
facts_dir = SHARED_FACTS || File.join(dir, 'var', 'server_data', 'facts')
BenchSupport.synthetic_fleet(facts_dir, SERVERS, SEED, out: $stderr) unless SHARED_FACTS
# A long ttl, so that no background refresh competes with the measurements.
config = File.join(dir, 'puppet_kicker.yaml')
File.write(config, "cache:\n  ttl: 1d\n  cold_start_timeout: 5m\n")
ENV['PUPPET_KICKER_CONFIG'] = config
Puppet.settings = { confdir: File.join(dir, 'etc'), vardir: File.join(dir, 'var'),
                    server_datadir: SHARED_FACTS && File.dirname(SHARED_FACTS), }

# The native path is measured first, before the pure-Ruby data exists: 10,000
# preloaded fact Hashes on the Ruby heap would slow every garbage collection the
# native results trigger, which a real compile using the native path never has.
rss = rss_mb
cold_returned = nil
cold = Benchmark.realtime do
  PuppetKicker.configure(Puppet.settings)
  cold_returned = PuppetKicker.servers_with_role('node', ENVIRONMENT).size
end
native_rss = rss_mb - rss
held = PuppetKicker.status['servers']
raise "the index holds #{held} servers, not #{SERVERS}" unless held == SERVERS

# A new index generation: a changed configuration makes a new core, which loads the
# snapshot the first one wrote (the same servers, nothing converted yet).
configs = [config, File.join(dir, 'puppet_kicker_b.yaml')]
File.write(configs[1], File.read(config))
fresh_generation = lambda do
  configs.rotate!
  ENV['PUPPET_KICKER_CONFIG'] = configs.first
  PuppetKicker.configure(Puppet.settings)
  raise 'a role no server has selected servers' unless PuppetKicker.servers_with_role('pk-bench-none', ENVIRONMENT).empty?
end

results = SHAPES.map do |shape|
  warn "==> #{shape.label}"
  call = shape.native
  samples = Array.new(FIRST_WARM_UP + FIRST_SAMPLES) do
    fresh_generation.call
    BenchSupport.collect_garbage
    Benchmark.realtime { call[nil] }
  end
  first = BenchSupport.stats(samples.last(FIRST_SAMPLES)).merge(values: samples.last(FIRST_SAMPLES))
  fresh_generation.call
  base = names(call[nil])
  raise "#{shape.label}: selects no server" if base.empty?

  # Distinct calls checked past the numbers the timing uses.
  [10_000_000, 10_000_001].each do |i|
    raise "#{shape.label}: distinct call #{i} selects other servers" unless names(call[i]) == base
  end
  distinct = measure { |i| call[i] }
  identical = measure { call[nil] }
  { shape: shape, names: base, first: first, distinct: distinct, identical: identical }
end
overhead = measure { PuppetKicker.servers_with_role('pk-bench-none', ENVIRONMENT) }

if NATIVE_ONLY
  puts "#{engine}, #{backend} from #{library}; #{count(SERVERS)} servers. Medians."
  puts
  puts '| Query shape (servers returned) | first call | distinct call | identical call |'
  puts '| --- | ---: | ---: | ---: |'
  results.each do |r|
    figures = %i[first distinct identical].map { |k| human(r[k][:median]) }
    puts "| #{cell("`#{r[:shape].label}` (#{count(r[:names].size)})")} | #{figures.join(' | ')} |"
  end
  if (file = ENV.fetch('PK_BENCH_RESULTS', nil))
    shapes = results.map do |r|
      { 'shape' => r[:shape].label, 'returned' => r[:names].size, 'first_samples' => r[:first][:values],
        **%i[first distinct identical].to_h { |k| [k.to_s, { 'native' => r[k][:median], 'samples' => r[k][:samples] }] }, }
    end
    File.write(file, JSON.pretty_generate('engine' => engine, 'backend' => PuppetKicker.backend, 'library' => library,
                                          'servers' => SERVERS, 'shapes' => shapes, 'overhead' => overhead[:median]))
  end
  exit
end

BenchSupport.collect_garbage
rss = rss_mb
servers = nil
load = Benchmark.realtime { servers = PureRuby.load(facts_dir) }
ruby_rss = rss_mb - rss
results.each do |r|
  scan = r[:shape].ruby
  raise "#{r[:shape].label}: native and pure Ruby disagree" unless names(scan[servers, nil]) == r[:names]
  raise "#{r[:shape].label}: distinct calls disagree with pure Ruby" unless names(scan[servers, 10_000_000]) == r[:names]

  r[:ruby] = measure { scan[servers, nil] }
  r[:ruby_distinct] = measure { |i| scan[servers, i] }
end

puts "#{engine}, #{backend}; #{count(SERVERS)} servers (synthetic fleet, seed #{SEED}), environment #{ENVIRONMENT}. " \
     "Medians. Each case is called for #{BenchSupport::WARM_UP} s before it is sampled for #{MEASURE} s (at least " \
     "#{MIN_SAMPLES} samples); first calls: the median of #{FIRST_SAMPLES} fresh index generations, after " \
     "#{FIRST_WARM_UP} of the same call#{JRUBY ? ' (JRuby default JIT, warm)' : ''}, each after a full garbage " \
     'collection. The pure-Ruby scans run after the native calls, with their Hashes on the heap.'
puts
puts '| Query shape (servers returned) | Call | puppet-kicker | pure Ruby | pure Ruby ÷ puppet-kicker | Goal |'
puts '| --- | --- | ---: | ---: | ---: | --- |'
json = []
results.each do |r|
  rows = [
    ['first call of a new index generation (converts the servers)', r[:first], r[:ruby], FIRST_GOAL],
    ["distinct call: #{r[:shape].distinct}", r[:distinct], r[:ruby_distinct], DISTINCT_GOAL],
    ['identical repeated call (the kept answer)', r[:identical], r[:ruby], nil],
  ]
  entry = { 'shape' => r[:shape].label, 'returned' => r[:names].size }
  rows.each_with_index do |(what, ours, theirs, goal), row|
    ratio = theirs[:median] / ours[:median]
    verdict = if goal.nil? then ''
              elsif ratio >= goal then "≥ #{goal.to_i}x: met"
              else
                "≥ #{goal.to_i}x: **missed**"
              end
    shape = row.zero? ? "`#{r[:shape].label}` (#{count(r[:names].size)})" : ''
    puts "| #{cell(shape)} | #{cell(what)} | #{human(ours[:median])} | #{human(theirs[:median])} | #{times(ratio)} | #{verdict} |"
    key = %w[first distinct identical][row]
    entry[key] = { 'native' => ours[:median], 'ruby' => theirs[:median], 'ratio' => ratio, 'goal' => goal,
                   'met' => goal.nil? ? nil : ratio >= goal, 'samples' => ours[:samples], }
  end
  json << entry
end
puts
# Under JRuby the resident memory says nothing: the JVM's heap is reserved up front.
memory = ->(mb) { JRUBY ? '' : format(', resident memory +%.0f MB', mb) }
puts "One-time cost at #{count(SERVERS)} servers: the native path's configure and first call (read the JSON files, build " \
     "the index, write the snapshot, convert #{count(cold_returned)} servers) #{human(cold)}#{memory[native_rss]}; pure " \
     "Ruby reading and parsing every file into Hashes #{human(load)}#{memory[ruby_rss]}. A call that selects no " \
     "server (the cost of the call itself): #{human(overhead[:median])}."

if (file = ENV.fetch('PK_BENCH_RESULTS', nil))
  File.write(file, JSON.pretty_generate('engine' => engine, 'backend' => backend, 'ruby_engine' => RUBY_ENGINE,
                                        'servers' => SERVERS, 'shapes' => json,
                                        'one_time' => { 'native' => cold, 'native_rss_mb' => native_rss,
                                                        'ruby' => load, 'ruby_rss_mb' => ruby_rss, },
                                        'overhead' => overhead[:median], 'load_average' => BenchSupport.load_average))
end
