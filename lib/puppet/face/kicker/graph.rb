# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'
require_relative '../../../puppet_kicker/face_graph'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:graph) do
    summary 'The role-to-role kick graph seen in reports, with kick counts and cycles.'
    arguments '[--format text|dot|svg]'
    description <<-DESCRIPTION
      Which roles' reports kicked which roles (as the planner saw them, policy
      allowing; edges unseen for `kick.role_graph_ttl` are forgotten), how many kicks
      went along each edge, and the cycles among them (each a loop the planner stops
      with `max_hops` and loop suppression). Read from the saved kick state: it works
      offline and starts nothing. `--format text` (the default) prints one aligned
      line per edge and the cycles; `dot` prints Graphviz DOT with the cycles' edges
      red and bold; `svg` renders that DOT with Graphviz's `dot -Tsvg` (Debian
      package `graphviz`).
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker graph
      $ puppet kicker graph --format dot | dot -Tpng > kicks.png
      $ puppet kicker graph --format svg > kicks.svg
    EXAMPLES
    returns 'The edges with their kick counts, the cycles, and the DOT (with --render-as json or yaml).'

    option '--format FORMAT' do
      summary 'text (default), dot or svg.'
    end

    when_invoked do |*args|
      options = args.pop
      format = (options[:format] || 'text').to_s
      raise PuppetKicker::QueryError, "puppet kicker graph: --format #{format.inspect}: use text, dot or svg" unless %w[text dot svg].include?(format)

      answer = PuppetKicker.command('graph')
      case format
      when 'dot' then answer['dot']
      when 'svg' then PuppetKicker::FaceGraph.svg(answer['dot'])
      else answer
      end
    end

    when_rendering :console do |answer|
      next answer if answer.is_a?(String)

      PuppetKicker::FaceGraph.text(answer).join("\n")
    end
  end
end
