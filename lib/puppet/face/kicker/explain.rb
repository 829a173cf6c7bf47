# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:explain) do
    summary 'Why a server is, or is not, returned by the functions.'
    arguments '[CLAUSE ...]'
    description <<-DESCRIPTION
      Tells, for the server `--node` names, what each clause of
      `servers_with_facts(CLAUSE, ...)` found at its fact path (or that it is
      missing), the comparison made (string, integer, decimal, version, regex,
      boolean) and its result; a list fact element by element. Then the environment
      rule (the server's environment, how it was decided, against the compile's from
      `--environment`) and its age against `max_age`. With `--role`, the role match
      of `servers_with_role(ROLE)` too. The first line says whether the functions
      return the server, and the first reason when they do not: their own answer,
      from the same index.
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker explain 'os.release.full>=12' --node node3.example.com
      $ puppet kicker explain --role node --node node9.staging.example.com
      $ puppet kicker explain 'tags=canary' --node web3.example.com --render-as json
    EXAMPLES
    returns 'The verdict and each of its parts (a Hash with --render-as json or yaml).'

    option '--node CERTNAME' do
      summary 'The certname of the server to explain.'
      required
    end
    option '--role ROLE' do
      summary 'Explain servers_with_role(ROLE) too (a name or /regex/; several separated by commas).'
    end

    # (|*args|: Puppet's wrapper passes the options last, and needs arity -1 for that.)
    when_invoked do |*args|
      options = args.pop
      PuppetKicker.command('explain', 'clauses' => args, 'roles' => PuppetKicker::Face.list(options[:role]),
                                      'node' => options[:node].to_s,
                                      'environment' => PuppetKicker::Face.environment)
    end

    %i[json yaml].each do |format|
      when_rendering(format) { |answer| answer }
    end

    when_rendering :console do |answer|
      verdict = answer['returned'] ? 'IS' : 'IS NOT'
      lines = ["#{answer['certname']} #{verdict} returned by #{answer['call']} " \
               "in environment #{answer['environment']['asked']}"]
      lines << "  because #{answer['reason']}" if answer['reason']
      clauses = answer['clauses']
      unless clauses.empty?
        rows = clauses.flat_map do |clause|
          found = clause['missing'] ? 'missing' : PuppetKicker::Face.cell(clause['found'])
          [[clause['clause'], found, clause['comparison'] || '-', clause['holds'] ? 'holds' : 'fails']] +
            (clause['elements'] || []).each_with_index.map do |element, i|
              ["  [#{i}]", PuppetKicker::Face.cell(element['value']), element['comparison'],
               element['matched'] ? 'match' : 'no match',]
            end
        end
        lines << '' << PuppetKicker::Face.table(%w[CLAUSE FOUND COMPARISON RESULT], rows)
      end
      lines << ''
      lines += [answer['environment'], answer['max_age'], answer['role']].compact.map { |part| part['says'] }
      lines.join("\n")
    end
  end
end
