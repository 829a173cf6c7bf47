# frozen_string_literal: true

require 'benchmark'

# Timing shared by the Ruby benchmarks.
module BenchSupport
  module_function

  # A warm-up call, then one call per sample until `seconds` have passed (at least
  # `min_samples`): median and mean seconds per call. Garbage collection is included:
  # it is part of what a compile pays.
  def measure(seconds: 1.0, min_samples: 3, &block)
    yield
    GC.start
    samples = []
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    samples << Benchmark.realtime(&block) while samples.size < min_samples || Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < seconds
    samples.sort!
    middle = samples.size / 2
    median = samples.size.odd? ? samples[middle] : (samples[middle - 1] + samples[middle]) / 2
    { median: median, mean: samples.sum / samples.size, samples: samples.size }
  end

  def human(seconds)
    if seconds < 1e-3 then format('%.1f µs', seconds * 1e6)
    elsif seconds < 1 then format('%.2f ms', seconds * 1e3)
    else
      format('%.2f s', seconds)
    end
  end
end
