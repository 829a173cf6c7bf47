# frozen_string_literal: true

require 'json'
require_relative 'fetch_reader'

module PuppetKicker
  # The core through its C ABI (ext/puppet_kicker_ffi, libpuppet_kicker_ffi.so) and
  # Ruby's `ffi`: what JRuby, so puppetserver, uses, since it cannot load a C
  # extension. Same methods, results and errors as the magnus extension's
  # PuppetKicker::Native. Requests go in as JSON; each reply is a JSON document the
  # library allocates and this code frees with pk_free right after copying it,
  # except servers, which pk_fetch gives as one binary buffer (read by FetchReader).
  #
  # Ruby 2.6 syntax (puppetserver's JRuby 9.3).
  module FFIBackend
    # The ABI this code speaks (the library's pk_abi_version must match).
    ABI_VERSION = 12
    # Selections retried when the index changes between selecting and fetching.
    SELECT_ATTEMPTS = 3
    # Answers kept per generation before they are all dropped (the core keeps 256).
    MAX_ANSWERS = 512
    # Functions asked of the core as another (see server_with_role).
    ASKED_AS = { 'server_with_role' => 'servers_with_role' }.freeze
    # The key of an answer in the nested Hashes answers are held in (#held): no
    # argument is this object.
    ANSWER = Object.new.freeze
    # Notes (certname => environment) remembered before they are all forgotten.
    MAX_NOTED = 100_000
    # Raised by #read when the Java reader failed and was dropped: the call starts
    # again, with the Ruby reader.
    class JavaReaderDropped < StandardError; end
    private_constant :JavaReaderDropped

    # JSON.parse options: no depth limit (facts can nest deeply), no object creation.
    PARSE = FetchReader::PARSE

    class << self
      # The Java reader of pk_fetch replies, under JRuby when its jar loaded (and it
      # has not failed since); else nil.
      attr_reader :library, :java_reader

      # Opens the library at `path` and checks its ABI version. Raises LoadError,
      # with the reason, when Ruby's ffi is missing or the file cannot be used.
      def load(path)
        require_ffi
        raise LoadError, 'no such file' unless File.file?(path)

        lib = Module.new
        lib.extend(::FFI::Library)
        begin
          lib.ffi_lib(path)
        rescue LoadError, ::FFI::NotFoundError => e
          raise LoadError, e.message
        end
        # The version first: a library of another ABI may lack functions this one attaches.
        lib.attach_function :pk_abi_version, [], :uint32
        abi = lib.pk_abi_version
        raise LoadError, "it implements C ABI version #{abi}, this Ruby code needs #{ABI_VERSION}" unless abi == ABI_VERSION

        attach(lib)

        @lib = lib
        @library = path
        # What this backend's table holds, for pk_fetch: freed with the backend.
        @session = ::FFI::AutoPointer.new(lib.pk_session_new, lib.method(:pk_session_free))
        @cache_lock = Mutex.new
        @java_reader = FetchReader.java_reader(PuppetKicker::JRUBY_READER) do |reason|
          warn_operator("puppet-kicker: cannot load #{PuppetKicker::JRUBY_READER} (#{reason}); servers are converted " \
                        'by the slower Ruby reader')
        end
        fresh_generation(:none) # no index generation seen yet
        @noted_lock = Mutex.new
        @noted = {}
        self
      end

      # A configure may replace the core, and what it was told with it: the notes
      # remembered are forgotten, whatever the outcome.
      def configure(confdir, vardir, server_datadir, config_file, ssl)
        @noted_lock.synchronize do
          request(:pk_configure, settings(confdir, vardir, server_datadir, config_file, ssl))
        ensure
          @noted = {}
        end
      end

      # The masterless helper (lib/puppet_kicker/helper.rb), run in this process: how
      # it ended, once it has.
      def run_helper(confdir, vardir, server_datadir, config_file, ssl)
        request(:pk_run_helper, settings(confdir, vardir, server_datadir, config_file, ssl))
      end

      def servers_with_role(roles, environment)
        servers('servers_with_role', 'roles', roles, environment)
      end

      # The core's answer to server_with_role has no id (0: its one position is not
      # the answer's list), so it could not be held: every call asked the core, with
      # JSON both ways. It is asked as servers_with_role instead, whose answer has
      # one, and only its first server is converted and held, under that id, for
      # pk_answer_holds to check as it checks the others'. The price, once per
      # answer: every position of the role's servers in the reply.
      def server_with_role(roles, environment)
        servers('server_with_role', 'roles', roles, environment).first
      end

      def servers_with_facts(clauses, environment)
        servers('servers_with_facts', 'clauses', clauses, environment)
      end

      # Every function call notes its node's environment, nearly always the one noted
      # last time, and the core only records it (certname => environment): a note
      # this backend already made since its last configure is not sent again, which
      # saves a JSON round trip per call. Only successful notes are remembered (so
      # always a String environment), at most MAX_NOTED; the lock keeps the memo the
      # core's own when threads note the same certname at once.
      def note_environment(certname, environment)
        @noted_lock.synchronize do
          return nil if environment.is_a?(String) && @noted[certname] == environment

          request(:pk_note_environment, 'certname' => certname, 'environment' => environment)
          @noted.clear if @noted.size >= MAX_NOTED
          @noted[certname] = -environment
        end
        nil
      end

      # The answer held for the call of `function` with `arguments` (the role, a
      # String, or the roles or clauses, an Array) about `environment`, while the
      # core says it still is the answer; else nil. What a function's call in a
      # compile tries first (PuppetKicker::Compile#holder).
      def kept(function, arguments, environment)
        # (lock and unlock: a block less than synchronize, on the path of every call)
        @cache_lock.lock
        begin
          if arguments.is_a?(String) # one role: #held, inline
            held = @answers[function]
            held &&= held[environment]
            held &&= held[arguments]
            held &&= held[ANSWER]
          else
            held = held(function, environment, arguments)
          end
        ensure
          @cache_lock.unlock
        end
        held[1] if held && @lib.pk_answer_holds(held[0]) == 1
      end

      # The kick report processor: `report` is the JSON text lib/puppet_kicker/kick.rb
      # builds; returns [[level, message], ...] to log.
      def kick_report(report)
        decode(@lib.pk_kick(report, report.bytesize))
      end

      def kick_flush
        decode(@lib.pk_kick_flush)
      end

      # The kick status document's JSON text.
      def kick_status
        decode(@lib.pk_kick_status)
      end

      # A `puppet kicker` subcommand: the request's JSON text in, the answer's out.
      def command(request)
        decode(@lib.pk_command(request, request.bytesize))
      end

      # Refresh warnings and kick lines: [[level, message], ...] to log.
      def take_log
        decode(@lib.pk_take_log)
      end

      # How many lines take_log would give now: one cheap call, no JSON.
      def log_pending
        @lib.pk_log_pending
      end

      def status
        decode(@lib.pk_status)
      end

      def version
        decode(@lib.pk_version)
      end

      private

      def warn_operator(message)
        if defined?(::Puppet) && ::Puppet.respond_to?(:warning)
          ::Puppet.warning(message)
        else
          Kernel.warn(message)
        end
      end

      def require_ffi
        require 'ffi'
      rescue LoadError => e
        raise LoadError, "Ruby's ffi library is not available (#{e.message}): install the ffi gem (Debian's " \
                         'ruby-ffi; the agent packages of Puppet and OpenVox have it)'
      end

      # pk_configure's (and pk_run_helper's) request.
      def settings(confdir, vardir, server_datadir, config_file, ssl)
        (ssl || {}).merge('confdir' => confdir, 'vardir' => vardir, 'server_datadir' => server_datadir,
                          'config_file' => config_file)
      end

      def attach(lib)
        lib.attach_function :pk_log_pending, [], :uint32
        lib.attach_function :pk_answer_holds, [:uint64], :uint32
        # :strptr returns [copy of the NUL-terminated reply, pointer to free].
        lib.attach_function :pk_version, [], :strptr
        lib.attach_function :pk_status, [], :strptr
        lib.attach_function :pk_take_log, [], :strptr
        lib.attach_function :pk_kick_flush, [], :strptr
        lib.attach_function :pk_kick_status, [], :strptr
        %i[pk_configure pk_select pk_note_environment pk_kick pk_command].each do |name|
          lib.attach_function name, %i[string size_t], :strptr
        end
        # Blocking: runs until the helper's work is done (the GVL is let go meanwhile).
        lib.attach_function :pk_run_helper, %i[string size_t], :strptr, blocking: true
        lib.attach_function :pk_free, [:pointer], :void
        lib.attach_function :pk_session_new, [], :pointer
        lib.attach_function :pk_session_free, [:pointer], :void
        # The last argument, a size_t out: the reply's length in bytes.
        lib.attach_function :pk_fetch, %i[pointer uint64 uint64 buffer_in size_t pointer], :pointer
        lib.attach_function :pk_free_fetch, [:pointer], :void
      end

      def request(function, payload, options = PARSE)
        json = JSON.generate(payload)
        decode(@lib.send(function, json, json.bytesize), options)
      end

      # A query's servers, each deep-frozen, in a frozen Array, as the magnus
      # extension returns them. Converting a server costs far more than finding it, so
      # what was converted is kept per index generation, as the magnus extension keeps
      # it (`converted`, `VALUES`, `KEYS`, `ANSWERS`): each server's Hash, each fact
      # name and each distinct value at any depth (pk_fetch gives each once per reply,
      # by id: a value many servers share, like `os`, is built once), and each whole
      # answer by its query (pk_select is told the answer held as `known` and, when
      # it is still the answer, sends no positions). These caches hold Ruby objects,
      # the frozen Hashes JRuby hands to templates, so they cannot live in Rust. The
      # lock covers multithreaded JRuby.
      #
      # A held answer the core says is still the answer (pk_answer_holds: no JSON;
      # it queues a refresh of a stale index as the query would) is returned as it
      # is; else the query is asked with pk_select.
      def servers(function, field, arguments, environment)
        # (Arguments other than an Array are the core's to refuse.)
        kept = kept(function, arguments, environment) if arguments.is_a?(Array)
        return kept if kept

        query = { 'op' => ASKED_AS.fetch(function, function), field => arguments, 'environment' => environment }
        SELECT_ATTEMPTS.times do
          held = @cache_lock.synchronize { held(function, environment, arguments) }
          selected = request(:pk_select, held ? query.merge('known' => held[0]) : query)
          found = @cache_lock.synchronize { answer([function, environment, arguments], selected, held) }
          return found if found
        end
        raise PuppetKicker::Error, 'puppet-kicker: the index kept changing while it was read; try again'
      rescue JavaReaderDropped
        retry # with the Ruby reader (only once: the Java one is gone)
      end

      # Answers are held by their query: in nested Hashes, one level per string of
      # the query (function, environment, each argument), the answer under the key ANSWER.
      # Looking a query up is then a few lookups by String, which cost a fraction of
      # hashing an Array of them (JRuby guards Array#hash against recursion) or of
      # writing the query as JSON, which only a call the core answers needs. The
      # caller holds @cache_lock.
      def held(function, environment, arguments)
        node = @answers[function]
        node &&= node[environment]
        case arguments
        when String # one argument: as [arguments]
          node &&= node[arguments]
        when Array
          i = 0
          while node && i < arguments.size
            node = node[arguments[i]]
            i += 1
          end
        else
          return nil
        end
        node && node[ANSWER]
      end

      # Holds `answer` ([id, servers]) for the query; the Hash copies each String key
      # it is given, frozen, so no caller can change one. Queries with arguments of
      # other types than the functions pass are the core's to refuse: never held.
      def hold(query, answer)
        function, environment, arguments = query
        return unless arguments.is_a?(Array) && arguments.all?(String) && environment.is_a?(String)

        # The core keeps at most a few hundred answers per generation.
        fresh_answers if @held >= MAX_ANSWERS
        node = (@answers[function] ||= {})
        node = (node[environment] ||= {})
        arguments.each { |argument| node = (node[argument] ||= {}) }
        @held += 1 unless node.key?(ANSWER)
        node[ANSWER] = answer
      end

      def fresh_answers
        @answers = {}
        @held = 0
      end

      # The answer's Array: the one held when the reply says it is still the answer,
      # else built from the cache (and kept when the core gave it an id); nil if the
      # index has been replaced since the selection.
      def answer(query, selected, held)
        generation = selected['generation']
        id = selected['answer']
        fresh_generation(generation)
        return held[1] if !selected.key?('positions') && held && held[0] == id && held(*query).equal?(held)

        positions = selected['positions']
        return nil if positions.nil?

        positions = positions.first(1) if query[0] == 'server_with_role'
        servers = cached(generation, positions)
        return nil if servers.nil?

        servers.freeze
        hold(query, [id, servers]) unless id.zero?
        servers
      end

      # Forgets what was converted for an earlier index generation.
      def fresh_generation(generation)
        return if @cache_generation == generation

        @cache = {}
        fresh_answers
        # What pk_fetch sent in this generation, numbered as it sent it: the Java
        # reader's own table (with the Hashes it copies), else an Array.
        @table = @java_reader ? java_table : []
        @cache_generation = generation
      end

      def java_table
        @java_reader.table
      rescue *reader_failures => e
        drop_java_reader(e)
        []
      end

      # The servers at `positions`, from the cache or fetched; nil if the index has
      # been replaced since the selection.
      def cached(generation, positions)
        missing = @cache.empty? ? positions : positions.reject { |p| @cache.key?(p) }
        unless missing.empty?
          fetched = fetch(generation, missing)
          return nil if fetched.nil?
          raise PuppetKicker::Error, "puppet-kicker: #{fetched.size} servers fetched for #{missing.size} positions" unless
            fetched.size == missing.size

          missing.each_with_index { |p, i| @cache[p] = fetched[i] }
          # None was converted before (a generation's first call): the reply, in
          # order, is the answer (a new Array).
          return fetched if missing.size == positions.size
        end
        positions.map { |p| @cache[p] }
      end

      # The servers at `positions` built from pk_fetch's reply and what earlier
      # replies of this generation sent; nil when the index has been replaced.
      def fetch(generation, positions)
        length = ::FFI::MemoryPointer.new(:size_t)
        pointer = @lib.pk_fetch(@session, generation, @table.size, positions.pack('L*'), positions.size, length)
        # (size_t is an unsigned long on Linux)
        read(pointer, length.get_ulong(0))
      end

      # The servers of the pk_fetch reply at `pointer`, of `length` bytes (freed
      # here), nil when it is stale. A reply the reader refuses is a
      # PuppetKicker::Error; any other failure of the Java reader drops it
      # (#drop_java_reader) and raises JavaReaderDropped, for the call to start again.
      def read(pointer, length)
        java = @java_reader
        begin
          FetchReader.servers(pointer, length, @table, java: java) { |error| decode_document(error) }
        rescue PuppetKicker::Error
          raise
        rescue *reader_failures => e
          raise unless java

          drop_java_reader(e)
          raise JavaReaderDropped
        end
      ensure
        @lib.pk_free_fetch(pointer)
      end

      # What a reader raises when it fails rather than refuses a reply: any Ruby
      # error and, under JRuby, any Java Throwable (a LinkageError such as
      # NoSuchMethodError from a JRuby the jar was not built for).
      def reader_failures
        @reader_failures ||= RUBY_ENGINE == 'jruby' ? [StandardError, ::Java::JavaLang::Throwable] : [StandardError]
      end

      # The Java reader failed during a call (it loaded, but, say, does not link with
      # this JRuby): one warning, naming the error, and the Ruby reader for the rest
      # of the process. What was converted is forgotten, so the session starts over
      # with the Ruby reader's table. The caller holds @cache_lock.
      def drop_java_reader(error)
        @java_reader = nil
        warn_operator("puppet-kicker: the Java reader (#{PuppetKicker::JRUBY_READER}) failed: #{error.class}: " \
                      "#{error.message}; servers are converted by the slower Ruby reader for the rest of this process")
        @cache_generation = nil
        fresh_generation(:none)
      end

      # The reply's value, or its error raised as the magnus extension raises it.
      def decode(reply, options = PARSE)
        text, pointer = reply
        @lib.pk_free(pointer)
        decode_document(JSON.parse(text.force_encoding(Encoding::UTF_8), options))
      end

      def decode_document(document)
        return document['ok'] if document.key?('ok')

        error = document['error'] || {}
        raise PuppetKicker::ERRORS.fetch(error['kind'], PuppetKicker::Error), error['message'].to_s.dup
      end
    end
  end
end
