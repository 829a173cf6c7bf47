# frozen_string_literal: true

require 'json'

module PuppetKicker
  # Reads a pk_fetch reply (layout: ext/puppet_kicker_ffi/src/fetch.rs) into the
  # caller's table of objects, in the reply's order: strings, slices of its text;
  # other scalars, one JSON.parse; then each Hash or Array from objects already in
  # the table, with `values_at` and `Hash[]`; all frozen. Ruby code runs once per
  # object, and the work per object is in Ruby's own methods (Java under JRuby,
  # fast before its JIT has compiled any Ruby code).
  #
  # Ruby 2.6 syntax (puppetserver's JRuby 9.3).
  module FetchReader
    OK = 0
    STALE = 1
    OBJECT = 2
    HEADER_BYTES = 44
    # JSON.parse options: no depth limit (facts can nest deeply), no object creation.
    PARSE = { max_nesting: false, create_additions: false }.freeze

    module_function

    # The servers' frozen Hashes, in the order asked, of the reply at `pointer` (an
    # FFI::Pointer, as pk_fetch returned it: unbounded) of `length` bytes (as pk_fetch
    # handed it over: no byte past them is read), their objects added to `table`; nil
    # when the index has been replaced. A failed reply's JSON error document is
    # yielded (the caller raises it). `java`, under JRuby, is
    # PuppetKicker::JavaFetchReader (FetchReader.java_reader), and `table` then one of
    # its tables (`java.table`): it reads an OK reply's objects in Java instead of the
    # loop below.
    def servers(pointer, length, table, java: nil)
      malformed('its length') unless length.is_a?(Integer) && length >= HEADER_BYTES
      status, base, strings, scalars, containers, servers, word_count, text_bytes, json_bytes = pointer.get_array_of_uint32(8, 9)
      words_at = HEADER_BYTES
      text_at = words_at + (4 * word_count)
      json_at = text_at + text_bytes
      # Every part below is read inside the reply's own `length` bytes.
      malformed('its length') unless json_at + json_bytes == length && pointer.get_uint64(0) == length
      case status
      when OK then nil
      when STALE then return nil
      else
        yield JSON.parse(utf8(pointer.get_bytes(json_at, json_bytes)), PARSE)
        malformed('a failure without an error')
      end
      return java.servers(pointer, length, table) if java

      # The session started over (a reply this table missed): so does the table.
      table.clear unless base == table.size
      malformed("base #{base} for a table of #{table.size}") unless base == table.size
      # Native byte order: the library's, in this process.
      words = pointer.get_array_of_uint32(words_at, word_count)
      # The strings share this one text (a slice is not a copy).
      text = utf8(pointer.get_bytes(text_at, text_bytes))
      at = 0
      offset = 0
      strings.times do
        length = words[at]
        table << text.byteslice(offset, length).freeze
        offset += length
        at += 1
      end
      table.concat(JSON.parse(utf8(pointer.get_bytes(json_at, json_bytes)), PARSE)) unless scalars.zero?
      malformed('its scalars') unless table.size == base + strings + scalars
      containers.times do
        tag = words[at]
        count = words[at + 1]
        at += 2
        if tag == OBJECT
          table << Hash[*table.values_at(*words[at, 2 * count])].freeze
          at += 2 * count
        else
          table << table.values_at(*words[at, count]).freeze
          at += count
        end
      end
      malformed('its words') unless at + servers == word_count
      table.values_at(*words[at, servers])
    end

    # Under JRuby: the Java reader (ext/puppet_kicker_jruby) from `jar`, defined in this
    # JRuby, or nil, with the reason yielded, when it cannot be loaded (FetchReader's
    # loop then reads every reply: the same objects, built more slowly).
    def java_reader(jar)
      return nil unless RUBY_ENGINE == 'jruby'
      raise LoadError, 'no such file' unless File.file?(jar)

      require 'jruby'
      require jar
      Java::Puppetkicker::FetchReader.define(JRuby.runtime)
      PuppetKicker::JavaFetchReader
    rescue LoadError, StandardError => e
      yield "#{e.class}: #{e.message}" if block_given?
      nil
    end

    def utf8(bytes)
      bytes.force_encoding(Encoding::UTF_8)
    end

    def malformed(what)
      raise PuppetKicker::Error, "puppet-kicker: a malformed pk_fetch reply (#{what})"
    end
  end
end
