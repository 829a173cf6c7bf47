# frozen_string_literal: true

require 'json'
require_relative '../puppet_kicker'

module PuppetKicker
  # What the actions of `puppet kicker` share (lib/puppet/face/kicker/): their
  # arguments, the exit code they ask for, and tables for people. The answers
  # themselves come from the core (PuppetKicker.command).
  module Face
    class << self
      # The code the process ends with when the action succeeded (nil: 0); see
      # Puppet::Application::Kicker#exit.
      attr_accessor :exit_code

      # The environment a compile would ask from: Puppet's `environment` setting,
      # which `--environment ENV` sets.
      def environment
        Puppet[:environment].to_s
      end

      # A comma-separated option as a list ("a,b.c" => ["a", "b.c"]); nil => [].
      def list(option)
        option.to_s.split(',').map(&:strip).reject(&:empty?)
      end

      # A value as a table cell: text as it is, missing as "-", anything else as JSON.
      def cell(value)
        case value
        when nil then '-'
        when String then value
        else JSON.generate(value)
        end
      end

      # Writes `text` to `path` as node_exporter's textfile collector needs it: the
      # whole file or nothing (a temporary file beside it, renamed over it), readable
      # by the exporter's user, named *.prom (the collector reads no other file).
      def write_textfile(path, text)
        unless File.basename(path).end_with?('.prom') && File.basename(path).length > 5
          raise PuppetKicker::QueryError, "--textfile #{path}: node_exporter's textfile collector reads only " \
                                          '*.prom files; name it so'
        end
        dir = File.dirname(path)
        raise PuppetKicker::QueryError, "--textfile #{path}: no directory #{dir}" unless File.directory?(dir)

        temporary = File.join(dir, ".#{File.basename(path)}.#{Process.pid}.tmp")
        File.open(temporary, File::WRONLY | File::CREAT | File::EXCL, 0o644) do |file|
          file.write(text)
          file.fsync
        end
        File.chmod(0o644, temporary) # whatever the umask
        File.rename(temporary, path)
      rescue SystemCallError => e
        File.unlink(temporary) if temporary && File.exist?(temporary)
        raise PuppetKicker::Error, "--textfile #{path}: #{e.message}"
      end

      # Rows of cells under a header, columns padded to their widest cell.
      def table(header, rows)
        widths = header.each_index.map { |i| ([header] + rows).map { |row| row[i].to_s.length }.max }
        ([header] + rows).map { |row| row.each_with_index.map { |c, i| c.to_s.ljust(widths[i]) }.join('  ').rstrip }
                         .join("\n")
      end
    end
  end
end
