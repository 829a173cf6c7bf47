# frozen_string_literal: true

require 'json'

# @summary
#   A value as JSON text, for the catalog benches/puppetserver/run reads.
Puppet::Functions.create_function(:'pk_bench::json') do
  dispatch :json do
    param 'Any', :value
  end

  def json(value)
    JSON.generate(value)
  end
end
