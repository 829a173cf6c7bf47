# frozen_string_literal: true

# Ruby side of puppet-kicker: loads the native core and gives the Puppet functions
# one small API. Everything else (index, queries, refresh, snapshot) is in Rust.
require_relative 'puppet_kicker/version'

module PuppetKicker
  # Base of every error the core raises; the functions turn it into Puppet::ParseError.
  class Error < StandardError; end
  # A malformed clause or role argument.
  class QueryError < Error; end
  # puppet_kicker.yaml has an unknown key or a bad value.
  class ConfigError < Error; end
  # The index holds no server (see `on_no_data`).
  class NoDataError < Error; end

  # Next to this file in the module (pluginsynced) and in the gem (extconf.rb copies it).
  NATIVE_LIBRARY = File.join(__dir__, 'puppet_kicker', 'puppet_kicker.so')

  class << self
    # The native module, loaded once. A missing or broken library is a clear error
    # naming the file, not a bare LoadError from deep inside a compile.
    def native
      @native ||= begin
        require NATIVE_LIBRARY
        PuppetKicker::Native
      rescue LoadError => e
        raise Error, "cannot load puppet-kicker's native library #{NATIVE_LIBRARY}: #{e.message}. " \
                     'Install the module package built for this platform, or build it with `rake compile`.'
      end
    end

    # Configures the core from Puppet's own settings; a no-op while they are unchanged.
    def configure(settings = Puppet.settings)
      key = [settings[:confdir], settings[:vardir], server_datadir(settings), ENV.fetch('PUPPET_KICKER_CONFIG', nil)]
      return if key == @configured_with

      native.configure(*key)
      @configured_with = key
    end

    def servers_with_role(roles, environment)
      call { native.servers_with_role(Array(roles), environment) }
    end

    def server_with_role(roles, environment)
      call { native.server_with_role(Array(roles), environment) }
    end

    def servers_with_facts(clauses, environment)
      call { native.servers_with_facts(clauses, environment) }
    end

    # Remembers where a node compiles, for servers whose facts name no environment.
    def note_environment(certname, environment)
      call { native.note_environment(certname, environment) }
    end

    def status
      call { native.status }
    end

    private

    def call
      configure
      result = yield
      log_warnings
      result
    rescue Error
      log_warnings
      raise
    end

    def log_warnings
      native.take_warnings.each { |warning| Puppet.warning("puppet-kicker: #{warning}") }
    end

    def server_datadir(settings)
      settings[:server_datadir]
    rescue ArgumentError, Puppet::Settings::InterpolationError
      nil
    end
  end

  # What the Puppet functions share: the compiling node's environment and the
  # translation of core errors into compile errors.
  module Functions
    module_function

    # The environment a function answers for by default: the compiler's, never a fact.
    def environment_of(scope)
      scope.environment.name.to_s
    end

    def compile(scope, function)
      node = scope.compiler.node
      PuppetKicker.note_environment(node.name, environment_of(scope)) if node
      yield
    rescue PuppetKicker::Error => e
      raise Puppet::ParseError, "#{function}: #{e.message}"
    end
  end
end
