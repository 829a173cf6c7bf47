# frozen_string_literal: true

module PuppetKicker
  # Base of every error the core raises; the functions turn it into Puppet::ParseError.
  class Error < StandardError; end
  # A malformed clause or role argument.
  class QueryError < Error; end
  # puppet_kicker.yaml has an unknown key or a bad value.
  class ConfigError < Error; end
  # The index holds no server (see `on_no_data`).
  class NoDataError < Error; end
  # A kick report the `kick` processor cannot read.
  class ReportError < Error; end

  # The one list of error kinds (the core's error::Kind) and the class each raises;
  # both backends look kinds up here. Any other kind (io, request, internal) raises
  # PuppetKicker::Error.
  ERRORS = {
    'query' => QueryError,
    'config' => ConfigError,
    'no_data' => NoDataError,
    'report' => ReportError,
  }.freeze
end
