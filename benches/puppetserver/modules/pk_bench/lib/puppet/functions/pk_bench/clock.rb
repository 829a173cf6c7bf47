# frozen_string_literal: true

# @summary
#   The monotonic clock in nanoseconds, for benches/puppetserver/run: a manifest
#   times an expression by calling this before and after it.
Puppet::Functions.create_function(:'pk_bench::clock') do
  # @return [Integer] nanoseconds since an arbitrary start.
  def clock
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  end
end
