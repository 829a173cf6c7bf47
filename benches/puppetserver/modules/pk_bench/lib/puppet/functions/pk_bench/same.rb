# frozen_string_literal: true

# @summary
#   Whether two values are the very same object: a repeated call that returns the
#   warm-up call's object returned a kept answer (benches/puppetserver/run).
Puppet::Functions.create_function(:'pk_bench::same') do
  dispatch :same do
    param 'Any', :first
    param 'Any', :second
  end

  def same(first, second)
    first.equal?(second)
  end
end
