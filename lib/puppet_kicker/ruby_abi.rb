# frozen_string_literal: true

require 'rbconfig'

module PuppetKicker
  # Whether the magnus extension (native/puppet_kicker.so) was compiled for the
  # running Ruby, read from the file before it is loaded. A C extension compiled
  # against one MRI's headers reads another's objects with the wrong layouts (an
  # RString of Ruby 3.3 read by code compiled for 3.1 is an empty String, or worse),
  # and nothing in Ruby refuses to load it. So the extension records the Ruby it was
  # compiled for inside itself (ext/puppet_kicker/build.rs: rb-sys's own RbConfig, as
  # `\0PUPPET_KICKER_RUBY_ABI ruby_version=3.1.0 arch=x86_64-linux-gnu ruby=3.1.2\0`),
  # and the facade loads it only when that record is this Ruby's `ruby_version` (the
  # ABI, the same for every 3.1.x) and `arch`. A library without the record, or with
  # it twice, is not loaded: being inside the file, the record cannot be copied or
  # lost apart from the library. The facade uses the ffi backend instead (its C ABI
  # does not depend on Ruby's version).
  #
  # Ruby 2.6 syntax (puppetserver's JRuby 9.3 loads the facade).
  module RubyABI
    MARK = "\0PUPPET_KICKER_RUBY_ABI "
    # What a record must name, and the running Ruby must match.
    MATCHED = %w[ruby_version arch].freeze

    module_function

    # This Ruby's: {'ruby_version' => '3.1.0', 'arch' => 'x86_64-linux-gnu', 'ruby' => '3.1.2'}.
    def running
      { 'ruby_version' => RbConfig::CONFIG['ruby_version'], 'arch' => RbConfig::CONFIG['arch'],
        'ruby' => RUBY_VERSION, }
    end

    # The record of the library at `path` as a Hash of its fields; nil when the file
    # holds none (or more than one, which no build makes). Raises SystemCallError when
    # the file cannot be read.
    def record(path)
      bytes = File.binread(path)
      at = bytes.index(MARK.b)
      return nil if at.nil? || bytes.index(MARK.b, at + 1)

      text = bytes.byteslice(at + MARK.bytesize, 512)
      finish = text.index("\0".b)
      return nil if finish.nil?

      fields = text.byteslice(0, finish).force_encoding(Encoding::UTF_8).split.map { |pair| pair.split('=', 2) }
      return nil unless fields.all? { |pair| pair.size == 2 }

      fields = fields.to_h
      MATCHED.all? { |name| fields.key?(name) } ? fields : nil
    end

    # nil when the extension at `path` may be loaded into this Ruby; else why not, as
    # words that follow the path ("was built for Ruby 3.1.0 ..."). Memoized per file
    # (its path, inode, size and time), so the facade's two questions read it once.
    def unfit(path)
      return "is a C extension for MRI; this is #{RUBY_ENGINE} #{RUBY_ENGINE_VERSION}" unless RUBY_ENGINE == 'ruby'

      stat = File.stat(path)
      key = [path, stat.ino, stat.size, stat.mtime]
      memo = (@unfit ||= {})
      memo.fetch(key) { memo[key] = judge(record(path)) }
    rescue SystemCallError => e
      "cannot be read (#{e.message})"
    end

    def judge(record)
      here = running
      if record.nil?
        'carries no record of the Ruby it was built for (a library not built by `rake compile` or the gem ' \
          "of this version); this is Ruby #{describe(here)}"
      elsif MATCHED.any? { |name| record[name] != here[name] }
        "was built for Ruby #{describe(record)}, not for this Ruby #{describe(here)}"
      end
    end

    # "3.1.2 (ABI 3.1.0, x86_64-linux-gnu)".
    def describe(fields)
      "#{fields['ruby'] || fields['ruby_version']} (ABI #{fields['ruby_version']}, #{fields['arch']})"
    end
  end
end
