# frozen_string_literal: true

require 'benchmark'
require 'fileutils'
require 'tmpdir'

# What the Ruby benchmarks share: the repository, the synthetic fleet, timing.
module BenchSupport
  ROOT = File.expand_path('../..', __dir__)

  module_function

  # Loads the PuppetKicker facade from `root`/lib (which loads its libraries from
  # `root`/native). Outside Puppet, a stand-in Puppet module gives it what it reads
  # there: `Puppet.settings` (set by the benchmark) and warnings, to stderr.
  def require_facade(root = ROOT)
    unless defined?(::Puppet)
      puppet = Object.const_set(:Puppet, Module.new)
      puppet.singleton_class.send(:attr_accessor, :settings)
      puppet.define_singleton_method(:warning) { |message| warn("warning: #{message}") }
    end
    require File.join(root, 'lib', 'puppet_kicker')
  end

  # A full collection, as GC.start is on MRI. JRuby's GC.start does nothing (no
  # "Pause Full" in -Xlog:gc), so under JRuby the JVM is asked for one.
  def collect_garbage
    if RUBY_ENGINE == 'jruby'
      require 'java'
      Java::JavaLang::System.gc
    else
      GC.start
    end
  end

  # Seconds of CPU this process has used, every thread's. JRuby has no
  # CLOCK_PROCESS_CPUTIME_ID, and the JVM's process CPU time counts in 10 ms ticks:
  # libc's clock_gettime through ffi instead (Linux: the clock is 2).
  def process_cpu_seconds
    return Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) unless RUBY_ENGINE == 'jruby'

    @libc ||= begin
      require 'ffi'
      Module.new.tap do |libc|
        libc.extend(FFI::Library)
        libc.ffi_lib(FFI::Library::LIBC)
        libc.attach_function(:clock_gettime, %i[int pointer], :int)
      end
    end
    @timespec ||= FFI::MemoryPointer.new(:long, 2)
    raise 'clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed' unless @libc.clock_gettime(2, @timespec).zero?

    seconds, nanoseconds = @timespec.read_array_of_long(2)
    seconds + (nanoseconds / 1e9)
  end

  # A new temporary directory, removed when the benchmark exits.
  def scratch_dir(name)
    dir = Dir.mktmpdir(name)
    at_exit { FileUtils.rm_rf(dir) }
    dir
  end

  # Writes a synthetic fleet of `servers` as puppetserver's JSON fact cache into
  # `facts_dir`, with the generator built (release, `synthetic` feature) by cargo.
  def synthetic_fleet(facts_dir, servers, seed, out: $stdout)
    system('cargo', 'run', '--quiet', '--release', '--locked', '-p', 'puppet-kicker', '--features', 'synthetic',
           '--bin', 'pk-synthetic-facts', '--', facts_dir, servers.to_s, seed.to_s, chdir: ROOT, out: out, exception: true)
  end

  # Seconds of warm-up calls before a case is sampled: under JRuby, long enough for
  # its JIT (and the JVM's) to compile the path; under MRI, one call's caches.
  WARM_UP = RUBY_ENGINE == 'jruby' ? 3.0 : 0.2

  # Warm-up calls for `warm_up` seconds, then one call per sample until `seconds` have
  # passed (at least `min_samples`): median and mean seconds per call. The block is
  # given the call's number, counted from 0 across warm-up and samples (so that a
  # case can make every call a different query). Garbage collection is included: it
  # is part of what a compile pays.
  def measure(seconds: 1.0, min_samples: 3, warm_up: WARM_UP)
    calls = 0
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    loop do
      yield calls
      calls += 1
      break if Process.clock_gettime(Process::CLOCK_MONOTONIC) - started >= warm_up
    end
    GC.start
    samples = []
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    while samples.size < min_samples || Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < seconds
      number = calls
      samples << Benchmark.realtime { yield number }
      calls += 1
    end
    stats(samples)
  end

  # Median, mean and count of `samples` (seconds).
  def stats(samples)
    sorted = samples.sort
    middle = sorted.size / 2
    median = sorted.size.odd? ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    { median: median, mean: sorted.sum / sorted.size, samples: sorted.size }
  end

  def load_average
    File.read('/proc/loadavg').split.first(3).join(' ')
  rescue SystemCallError
    'unknown'
  end

  def human(seconds)
    if seconds < 1e-3 then format('%.1f µs', seconds * 1e6)
    elsif seconds < 1 then format('%.2f ms', seconds * 1e3)
    else
      format('%.2f s', seconds)
    end
  end
end
