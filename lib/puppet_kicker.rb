# frozen_string_literal: true

# Ruby side of puppet-kicker: loads the native core and gives the Puppet functions
# one small API. Everything else (index, queries, refresh, snapshot) is in Rust.
#
# Two bindings of the same core, with the same results and errors:
# - magnus: the C extension puppet_kicker.so, for MRI (`puppet apply`, agents);
# - ffi: libpuppet_kicker_ffi.so, a C ABI loaded with Ruby's ffi, for JRuby
#   (puppetserver), which cannot load C extensions.
# The backend is magnus on an MRI the extension was built for (RubyABI: its record
# of the Ruby it was compiled for, read before it is loaded), and ffi on any other
# Ruby; PUPPET_KICKER_BACKEND=magnus|ffi (or PuppetKicker.backend = ...) overrides
# it. Ruby 2.6 syntax (puppetserver's JRuby).
require_relative 'puppet_kicker/version'
require_relative 'puppet_kicker/errors'
require_relative 'puppet_kicker/libraries'
require_relative 'puppet_kicker/ruby_abi'
require_relative 'puppet_kicker/helper'
require_relative 'puppet_kicker/kick'

module PuppetKicker
  # The certificate settings the core is given (the PuppetDB source's defaults).
  SSL_SETTINGS = %w[hostcert hostprivkey localcacert hostcrl].freeze

  LIBRARIES = { 'magnus' => NATIVE_LIBRARY, 'ffi' => FFI_LIBRARY }.freeze
  BACKENDS = LIBRARIES.keys.freeze
  WHERE_LIBRARIES_ARE = "puppet-kicker looks for its libraries only in #{LIBRARY_DIR}/ (native/ beside the " \
                        "module's or gem's lib/). Install the module package built for this platform, or build " \
                        'them there with `rake compile`.'

  class << self
    # PUPPET_KICKER_BACKEND when it is set; else 'magnus' on MRI when the extension
    # was built for this Ruby, and 'ffi' otherwise. An MRI whose extension was built
    # for another Ruby (the module package built on Debian 12's Ruby 3.1, run by Ruby
    # 3.3 or puppet-agent's 3.2), or that has none, gets the ffi backend, which gives
    # the same answers (its C ABI does not depend on Ruby), with one notice per
    # process saying why.
    def default_backend
      chosen = ENV.fetch('PUPPET_KICKER_BACKEND', '').strip
      return chosen unless chosen.empty?
      return 'ffi' unless RUBY_ENGINE == 'ruby'

      unfit = RubyABI.unfit(NATIVE_LIBRARY)
      return 'magnus' unless unfit

      @magnus_unfit = unfit
      notice_once("puppet-kicker: the magnus extension #{NATIVE_LIBRARY} #{unfit}: using the ffi backend " \
                  "(#{FFI_LIBRARY}, through Ruby's ffi), which gives the same answers. `rake compile` under this " \
                  'Ruby builds the extension for it.')
      'ffi'
    end

    # The backend in use: 'magnus' or 'ffi'.
    def backend
      @backend ||= checked_backend(default_backend)
    end

    # Switches backend (tests, benchmarks); nil goes back to the default. Both can
    # be loaded in one MRI process: each library holds its own core.
    def backend=(name)
      @backend = name.nil? ? nil : checked_backend(name.to_s)
    end

    # Runs the block with `name` as the backend, then restores the previous one.
    def with_backend(name)
      saved = @backend
      self.backend = name
      yield
    ensure
      @backend = saved
    end

    # The loaded backend: PuppetKicker::Native (magnus) or PuppetKicker::FFIBackend,
    # loaded once. A missing or broken library is a clear error naming the file and
    # why it failed, not a bare LoadError from deep inside a compile.
    def native
      name = backend
      (@natives ||= {})[name] ||= load_backend(name)
    end

    # Configures the core from Puppet's own settings; a no-op while they are unchanged.
    # Reading them (seven settings, through Puppet's interpolation) costs more than a
    # kept answer: a function's call reaches this only as the first call of a compile
    # (see Compile).
    def configure(settings = Puppet.settings)
      key = [settings[:confdir], settings[:vardir], server_datadir(settings), ENV.fetch('PUPPET_KICKER_CONFIG', nil),
             ssl_settings(settings),]
      configured = (@configured_with ||= {})
      return if key == configured[backend]

      native.configure(*key)
      configured[backend] = key
      finish_in_helper_at_exit(key)
    end

    # Masterless (`puppet apply`): at exit, hands what this process leaves undone (a
    # refresh in flight, kicks not yet delivered) to the helper (see Helper). Once
    # per process; a forked child never runs it.
    def finish_in_helper_at_exit(settings)
      return if @exit_hook_pid == Process.pid || !Helper.masterless?

      @exit_hook_pid = Process.pid
      at_exit { start_helper(settings) if Process.pid == @exit_hook_pid }
    end

    # Starts the helper when work is left; returns its pid, or nil.
    def start_helper(settings)
      status = native.status
      return nil unless Helper.wanted?(status, masterless: true)

      pid = Helper.spawn(settings, status['cache_dir'])
      Puppet.info("puppet-kicker: helper (pid #{pid}) finishes #{status['work_left'].join(' and ')} in the " \
                  "background; it logs to #{File.join(status['cache_dir'], Helper::LOG)}")
      pid
    rescue StandardError => e
      Puppet.warning("puppet-kicker: cannot start the helper: #{e.message}") rescue nil # rubocop:disable Style/RescueModifier
      nil
    end

    # The queries. `compile` is the Compile of the function call (Functions),
    # which configured the core for it; without one (any other caller), each call
    # configures the core first.
    def servers_with_role(roles, environment, compile = nil)
      call(compile) { native.servers_with_role(Array(roles), environment) }
    end

    def server_with_role(roles, environment, compile = nil)
      call(compile) { native.server_with_role(Array(roles), environment) }
    end

    def servers_with_facts(clauses, environment, compile = nil)
      call(compile) { native.servers_with_facts(clauses, environment) }
    end

    # Remembers where a node compiles, for servers whose facts name no environment.
    # Called right after a query, whose call configured the core already.
    def note_environment(certname, environment)
      native.note_environment(certname, environment)
    end

    # The Compile of the compile `scope` belongs to: the one made by this compile's
    # first call, or a new one, made after configuring the core. Puppet's settings do
    # not change within a compile, so its other calls skip reading them; the next
    # compile (another compiler) reads them again, so a setting changed between
    # compiles is picked up. A compile runs on one thread; compiles on other threads
    # at once each keep their own Compile (the last one made is remembered), so each
    # configures the core for itself.
    def compile(scope)
      id = scope.compiler.object_id
      current = @compile
      return current if current && current.id == id && current.backend.equal?(@backend)

      begin
        configure
      rescue Error
        log_warnings
        raise
      end
      @compile = Compile.new(id, backend, native, -Functions.environment_of(scope))
    end

    def status
      call { native.status }
    end

    # The `kick` report processor's work: hand the report's kicks (Kicks) to the
    # core, which records them and dispatches in the background, and log what it
    # decided. Every report goes through, kicks or not: it may end a kicked run.
    def process_report(report)
      call do
        pid = Helper.masterless? ? Process.pid : nil
        log_lines(native.kick_report(Kicks.payload(report, Kicks.from_report(report), pid: pid)))
        # A short-lived process (puppet apply) waits, bounded, for due kicks to be sent
        # (what remains goes to the helper at exit); a master dispatches in the background.
        log_lines(native.kick_flush) unless Puppet.run_mode.name == :server
      end
    end

    # The kick status document (pending kicks, recent outcomes, role cycles).
    def kick_status
      configure
      JSON.parse(native.kick_status)
    end

    # A `puppet kicker` subcommand's core part (src/command/): its answer, parsed.
    def command(name, args = {})
      call { JSON.parse(native.command(JSON.generate('name' => name.to_s, 'args' => args))) }
    end

    private

    # Runs a call into the core, configured first unless `compile` (a Compile) says
    # it is, and logs what the core has to log: after every call outside a compile,
    # after the first call of each compile, and after any call that failed. The other
    # calls of a compile, most of them kept answers, skip the question (a C call
    # under ffi): what the core logs then comes from its background work (refreshes,
    # kicks), which the next compile's first call logs.
    def call(compile = nil)
      configure unless compile
      result = yield
      log_warnings if compile.nil? || compile.log_once
      result
    rescue Error
      log_warnings
      raise
    end

    # The core's one log drain: refresh warnings and kick lines. Asking whether any
    # wait costs no JSON, so most calls (nothing to log) skip taking them.
    def log_warnings
      log_lines(native.take_log) unless native.log_pending.zero?
    end

    def log_lines(lines)
      lines.each { |level, message| Puppet.send(level.to_sym, "puppet-kicker: #{message}") }
    end

    # puppetserver's fact cache lives in $server_datadir/facts; the setting comes from
    # Puppet (its default is $vardir/server_data), never from a hard-coded path.
    def server_datadir(settings)
      optional_setting(settings, :server_datadir)
    end

    # Puppet's own certificate, key, CA and CRL: what the PuppetDB source presents and
    # trusts unless puppet_kicker.yaml says otherwise.
    def ssl_settings(settings)
      SSL_SETTINGS.to_h { |name| [name, optional_setting(settings, name.to_sym)] }
    end

    # A setting this Puppet may not have, or cannot interpolate here: nil.
    def optional_setting(settings, name)
      value = settings[name]
      value.nil? || value.to_s.empty? ? nil : value.to_s
    rescue ArgumentError, Puppet::Settings::InterpolationError
      nil
    end

    def checked_backend(name)
      return name if BACKENDS.include?(name)

      raise Error, "unknown puppet-kicker backend #{name.inspect} (from PUPPET_KICKER_BACKEND or " \
                   "PuppetKicker.backend=): use #{BACKENDS.join(' or ')}"
    end

    def load_backend(name)
      path = LIBRARIES.fetch(name)
      loaded = name == 'ffi' ? load_ffi(path) : load_magnus(path)
      if defined?(Puppet) && Puppet.respond_to?(:info)
        reader = loaded.respond_to?(:java_reader) && loaded.java_reader ? ", servers read in Java from #{JRUBY_READER}" : ''
        Puppet.info("puppet-kicker: #{name} backend loaded from #{path} " \
                    "(core #{loaded.version}, #{RUBY_ENGINE} #{RUBY_ENGINE_VERSION}#{reader})")
      end
      loaded
    end

    # Notices to the operator, each once per process.
    def notice_once(message)
      return if (@noticed ||= {})[message]

      @noticed[message] = true
      if defined?(Puppet) && Puppet.respond_to?(:notice)
        Puppet.notice(message)
      else
        Kernel.warn(message)
      end
    end

    # The extension, only when it was built for this Ruby (RubyABI): one built for
    # another reads this Ruby's objects with the wrong layouts, and nothing in Ruby
    # refuses to load it.
    def load_magnus(path)
      unfit = RubyABI.unfit(path)
      if unfit
        raise Error, "cannot load puppet-kicker's native library #{path} (magnus backend): it #{unfit}, so it is " \
                     'not loaded. Leave PUPPET_KICKER_BACKEND unset to use the ffi backend, which gives the same ' \
                     "answers, or build the extension for this Ruby with `rake compile`. #{WHERE_LIBRARIES_ARE}"
      end
      require path
      PuppetKicker::Native
    rescue LoadError => e
      raise Error, "cannot load puppet-kicker's native library #{path} (magnus backend): #{e.message}. " \
                   "#{WHERE_LIBRARIES_ARE}"
    end

    def load_ffi(path)
      require_relative 'puppet_kicker/ffi_backend'
      PuppetKicker::FFIBackend.load(path)
    rescue LoadError => e
      why = @magnus_unfit ? " (It is used because the magnus extension #{NATIVE_LIBRARY} #{@magnus_unfit}.)" : ''
      raise Error, "cannot load puppet-kicker's native library #{path} (ffi backend): #{e.message}.#{why} " \
                   "#{WHERE_LIBRARIES_ARE}"
    end
  end

  # What the function calls of one compile share, made by its first call
  # (PuppetKicker.compile), which configured the core for it: the compiler it is for
  # (by object_id, unique for the life of the process, so that a finished compile is
  # not kept alive), the backend (and, once log and note are done, the one that holds
  # answers: #holder), the compile's environment, and whether the core's log was taken
  # and the node's environment noted in it.
  class Compile
    # The backend to ask for the answers it holds (#kept) once this compile's log
    # was taken and its node noted, when it holds answers (the ffi backend); else nil.
    attr_reader :id, :backend, :environment, :holder

    def initialize(id, backend, native, environment)
      @id = id
      @backend = backend
      @native = native
      @environment = environment
      @logged = false
      @noted = false
      @holder = nil
    end

    # True the first time only: this call takes the core's log.
    def log_once
      return false if @logged

      @logged = true
      settle
      true
    end

    # True the first time only: this call notes the node's environment.
    def note_once
      return false if @noted

      @noted = true
      settle
      true
    end

    private

    def settle
      @holder = @native if @logged && @noted && @native.respond_to?(:kept)
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

    # The functions' bodies (lib/puppet/functions), here rather than in their files:
    # Puppet loads those again for each compile of an environment whose
    # environment_timeout is 0 (its default), so their code is always new to JRuby,
    # which interprets it; this module's code is loaded once, and compiled once hot.
    # Each answers with the answer the backend holds while it still is the answer
    # (Compile#holder: nothing else to do, so the least code), else with its query.
    def servers_with_role(scope, role, environment)
      compile = PuppetKicker.compile(scope)
      environment ||= compile.environment
      holder = compile.holder
      holder&.kept('servers_with_role', role, environment) ||
        query(scope, compile) { PuppetKicker.servers_with_role(role, environment, compile) }
    rescue PuppetKicker::Error => e
      raise compile_error('servers_with_role', e)
    end

    # (The backend holds server_with_role's answer as an Array of its one server, or
    # of none.)
    def server_with_role(scope, role, default)
      compile = PuppetKicker.compile(scope)
      holder = compile.holder
      kept = holder&.kept('server_with_role', role, compile.environment)
      server = if kept
                 kept.first
               else
                 query(scope, compile) { PuppetKicker.server_with_role(role, compile.environment, compile) }
               end
      server.nil? ? default : server
    rescue PuppetKicker::Error => e
      raise compile_error('server_with_role', e)
    end

    def servers_with_facts(scope, clauses)
      compile = PuppetKicker.compile(scope)
      holder = compile.holder
      holder&.kept('servers_with_facts', clauses, compile.environment) ||
        query(scope, compile) { PuppetKicker.servers_with_facts(clauses, compile.environment, compile) }
    rescue PuppetKicker::Error => e
      raise compile_error('servers_with_facts', e)
    end

    # Asks a function's query (the block) for the node being compiled, and notes the
    # node's environment, once per compile.
    def query(scope, compile)
      result = yield
      if compile.note_once
        node = scope.compiler.node
        PuppetKicker.note_environment(node.name, compile.environment) if node
      end
      result
    end

    # A core error as the compile error Puppet reports.
    def compile_error(function, error)
      Puppet::ParseError.new("#{function}: #{error.message}")
    end
  end
end
