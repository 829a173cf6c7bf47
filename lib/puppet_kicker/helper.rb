# frozen_string_literal: true

require 'rbconfig'
require_relative 'libraries'
require_relative 'ruby_abi'

module PuppetKicker
  # The masterless helper. A `puppet apply` exits seconds after it starts; what it
  # leaves undone (a refresh in flight, kicks to retry, follow-ups, a kick of its own
  # server) is finished by this file run as a detached process: `ruby helper.rb
  # CONFDIR VARDIR SERVER_DATADIR CONFIG_FILE`, which loads the magnus library (the
  # C-ABI one when the extension was not built for this Ruby, see RubyABI, or
  # PUPPET_KICKER_BACKEND is ffi) and calls the core's `run_helper` (one per cache
  # dir, under `helper.lock`; see src/masterless_helper.rs). A master (puppetserver)
  # never starts it: its threads do the work.
  module Helper
    SCRIPT = File.expand_path(__FILE__)
    LOG = 'helper.log'
    # The core rotates the log too; this keeps Ruby's own output (a load error) bounded.
    MAX_LOG_BYTES = 1 << 20

    module_function

    # A masterless `puppet apply` under MRI: not a master (run mode `server`), not a
    # test or another tool that loaded Puppet, and not turned off with
    # PUPPET_KICKER_HELPER=0.
    def masterless?
      return false if ENV['PUPPET_KICKER_HELPER'] == '0' || RUBY_ENGINE != 'ruby'
      return false unless defined?(Puppet) && Puppet.respond_to?(:run_mode)

      Puppet.run_mode.name != :server && defined?(Puppet::Application::Apply) ? true : false
    end

    # Whether a process about to exit should start the helper: masterless, with work
    # left (the core's status says which: `refresh`, `kicks`).
    def wanted?(status, masterless: masterless?)
      masterless && !Array(status['work_left']).empty?
    end

    # Starts the helper for `settings` (the four values `configure` passes to the
    # core), detached: its own process group, stdin closed, output appended to
    # `cache_dir/helper.log`. Returns its pid. Never forks this (threaded) process.
    def spawn(settings, cache_dir)
      log = File.join(cache_dir, LOG)
      rotate(log)
      pid = Process.spawn(RbConfig.ruby, SCRIPT, *argv(settings),
                          in: File::NULL, out: [log, File::WRONLY | File::APPEND | File::CREAT, 0o600],
                          err: %i[child out], pgroup: true, chdir: '/', close_others: true)
      Process.detach(pid)
      pid
    end

    # The helper's command line: Puppet's four paths, then `name=path` for each
    # certificate setting Puppet gave.
    def argv(settings)
      paths = settings.first(4).map(&:to_s)
      paths + (settings[4] || {}).filter_map { |name, path| "#{name}=#{path}" if path }
    end

    # The backend the helper runs: the facade's choice, without its notice (the
    # `puppet apply` that started it gave that).
    def library
      require_relative 'errors'
      if ENV['PUPPET_KICKER_BACKEND'].to_s.strip != 'ffi' && RubyABI.unfit(PuppetKicker::NATIVE_LIBRARY).nil?
        require PuppetKicker::NATIVE_LIBRARY
        PuppetKicker::Native
      else
        require_relative 'ffi_backend'
        PuppetKicker::FFIBackend.load(PuppetKicker::FFI_LIBRARY)
      end
    end

    def rotate(log)
      File.rename(log, "#{log}.1") if File.size?(log).to_i > MAX_LOG_BYTES
    rescue SystemCallError
      nil
    end

    # The helper process itself.
    def main(argv)
      confdir, vardir, server_datadir, config_file, *ssl = argv
      ssl = ssl.to_h { |pair| pair.split('=', 2) }
      # The library alone: not Puppet, not the facade.
      ending = library.run_helper(confdir.to_s, vardir.to_s, server_datadir, config_file, ssl)
      $stdout.puts "#{Time.now.utc.strftime('%FT%TZ')} helper[#{Process.pid}]: #{ending}" if ending == 'AlreadyRunning'
      0
    rescue StandardError, LoadError => e
      warn "#{Time.now.utc.strftime('%FT%TZ')} helper[#{Process.pid}]: #{e.class}: #{e.message}"
      1
    end
  end
end

exit(PuppetKicker::Helper.main(ARGV)) if $PROGRAM_NAME == __FILE__
