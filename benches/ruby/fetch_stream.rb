# frozen_string_literal: true

# Does pk_fetch_stream (C ABI 9, 10) lower the CPU time of a generation's first call
# under JRuby, or only its wall time? The ffi backend fetched more than
# STREAMED_ABOVE servers as a stream of replies the core encoded on a thread of its
# own while this thread built the objects of the reply before; else with one pk_fetch.
# Both ways in one process, alternating, on one synthetic fleet:
#
#   jruby benches/ruby/fetch_stream.rb [SERVERS] [--facts DIR]
#
# A first call is servers_with_role('node') of a fresh index generation (a changed
# configuration makes a new core, which loads the snapshot: nothing converted yet),
# through the backend (PuppetKicker.native), with the Java reader when
# native/puppet_kicker_jruby.jar is there. For each: the process's CPU time (every
# thread's, the core's encoder included: what puppetserver's cores pay) and wall time.
# Markdown on stdout. Needs a library that still has pk_fetch_stream (ABI 10).

require 'json'
require_relative 'support'

def option(name)
  at = ARGV.index(name) or return nil
  ARGV.delete_at(at)
  ARGV.delete_at(at) || abort("benches/ruby/fetch_stream.rb: #{name} needs a value")
end
SHARED_FACTS = option('--facts')
SERVERS = Integer(ARGV.fetch(0, '10000'))
WARM_UP = 15 # generations of each way first, for JRuby's JIT
SAMPLES = Integer(ENV.fetch('PK_BENCH_SAMPLES', '25')) # then this many of each, alternating

BenchSupport.require_facade
PuppetKicker.backend = 'ffi'
backend = PuppetKicker.native
streams = backend.instance_variable_get(:@lib).respond_to?(:pk_fetch_stream)
abort 'benches/ruby/fetch_stream.rb: this library has no pk_fetch_stream' unless streams

dir = BenchSupport.scratch_dir('pk-bench-fetch-stream')
facts = SHARED_FACTS || File.join(dir, 'var', 'server_data', 'facts')
BenchSupport.synthetic_fleet(facts, SERVERS, 1, out: $stderr) unless SHARED_FACTS
configs = %w[a b].map do |name|
  path = File.join(dir, "puppet_kicker_#{name}.yaml")
  File.write(path, "cache:\n  dir: #{File.join(dir, 'cache')}\n  ttl: 1d\n  cold_start_timeout: 5m\n" \
                   "puppet_cache:\n  dirs: [#{facts}]\n")
  path
end

# Streams above this many servers: as shipped (64), or never.
def stream(streamed)
  PuppetKicker::FFIBackend.send(:remove_const, :STREAMED_ABOVE)
  PuppetKicker::FFIBackend.const_set(:STREAMED_ABOVE, streamed ? 64 : Float::INFINITY)
end

first_call = lambda do |streamed|
  configs.rotate!
  backend.configure(File.join(dir, 'etc'), File.join(dir, 'var'), nil, configs.first, nil)
  raise 'a role no server has selected servers' unless backend.servers_with_role(['pk-bench-none'], 'production').empty?

  stream(streamed)
  BenchSupport.collect_garbage
  cpu = BenchSupport.process_cpu_seconds
  wall = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  returned = backend.servers_with_role(['node'], 'production').size
  [BenchSupport.process_cpu_seconds - cpu, Process.clock_gettime(Process::CLOCK_MONOTONIC) - wall, returned]
end

engine = RUBY_ENGINE == 'jruby' ? "JRuby #{JRUBY_VERSION} on Java #{ENV_JAVA['java.version']}" : "MRI #{RUBY_VERSION}"
reader = backend.java_reader ? 'the Java reader' : 'the Ruby reader'
warn "==> #{engine}, ffi backend, #{reader}: #{SERVERS} servers"
WARM_UP.times { [true, false].each { |way| first_call.call(way) } }
samples = { true => [], false => [] }
returned = nil
SAMPLES.times do |i|
  # Alternating, and which goes first alternates too.
  (i.even? ? [true, false] : [false, true]).each do |way|
    cpu, wall, returned = first_call.call(way)
    samples[way] << [cpu, wall]
  end
end
stream(true)

median = lambda do |values|
  sorted = values.sort
  sorted[sorted.size / 2]
end
puts "# pk_fetch_stream against pk_fetch: a generation's first call under #{engine}"
puts
puts "#{SERVERS} servers, servers_with_role('node') returns #{returned}; ffi backend, #{reader}; " \
     "#{SAMPLES} first calls of each, alternating, after #{WARM_UP} of each; load #{BenchSupport.load_average}."
puts
puts '| First call | process CPU (median) | wall (median) |'
puts '| --- | --- | --- |'
{ true => 'pk_fetch_stream (replies of up to 512)', false => 'pk_fetch (one reply)' }.each do |way, label|
  puts "| #{label} | #{BenchSupport.human(median.call(samples[way].map(&:first)))} | " \
       "#{BenchSupport.human(median.call(samples[way].map(&:last)))} |"
end
# Pairs of calls made one after the other: the stream's minus one reply's.
[[0, 'process CPU'], [1, 'wall']].each do |index, what|
  differences = samples[true].zip(samples[false]).map { |streamed, one| streamed[index] - one[index] }
  lower = differences.count(&:negative?)
  sign = median.call(differences).negative? ? '-' : '+'
  puts "| stream minus one reply, #{what}, pair by pair | median #{sign}#{BenchSupport.human(median.call(differences).abs)}; " \
       "lower in #{lower} of #{differences.size} pairs | |"
end
