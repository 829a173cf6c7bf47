# frozen_string_literal: true

module PuppetKicker
  VERSION = '0.1.0'
end
