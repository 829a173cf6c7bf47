# frozen_string_literal: true

require 'open3'
require_relative '../puppet_kicker'

module PuppetKicker
  # How `puppet kicker graph` (lib/puppet/face/kicker/graph.rb) shows the role graph
  # the core describes (src/command/graph.rs): aligned text, or SVG through Graphviz.
  module FaceGraph
    module_function

    # One line per edge, `from -> to  (N kicks)`, those on a cycle marked; then the cycles.
    def text(answer)
      edges = answer['edges']
      return ['No kicks between roles seen yet.'] if edges.empty?

      kicks = edges.map { |e| "(#{e['kicks']} #{e['kicks'] == 1 ? 'kick' : 'kicks'})" }
      columns = edges.zip(kicks).map { |e, k| [e['from'], '->', e['to'], k, e['in_cycle'] ? 'on a cycle' : ''] }
      widths = (0...5).map { |i| columns.map { |c| c[i].length }.max }
      lines = columns.map do |c|
        from, arrow, to, count, mark = c.each_with_index.map { |cell, i| cell.ljust(widths[i]) }
        "#{from} #{arrow} #{to}  #{count}  #{mark}".rstrip
      end
      lines + cycle_lines(answer)
    end

    def cycle_lines(answer)
      cycles = answer['cycles']
      left_out = answer['cycles_left_out']
      return ['', 'No cycles.'] if cycles.empty? && left_out.zero?

      lines = ['', "Cycles (#{cycles.size}):"] + cycles.map { |cycle| "  #{cycle.join(' -> ')}" }
      lines << "  and at least #{left_out} more, not listed" if left_out.positive?
      lines
    end

    # `dot` rendered as SVG by Graphviz's `dot`; a clear error when it is missing or fails.
    def svg(dot)
      out, err, status = Open3.capture3('dot', '-Tsvg', stdin_data: dot)
      raise Error, "puppet kicker graph: Graphviz's dot failed (#{status}): #{err.strip}" unless status.success?

      out
    rescue Errno::ENOENT
      raise Error, "puppet kicker graph --format svg needs Graphviz's `dot`, which is not installed (or not " \
                   'on PATH): apt install graphviz (the Debian package graphviz), or use --format dot'
    end
  end
end
