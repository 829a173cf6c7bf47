# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:query) do
    summary 'The servers the functions would return, in the order they return them.'
    arguments '[CLAUSE ...]'
    description <<-DESCRIPTION
      Answers as `servers_with_facts(CLAUSE, ...)` would in a compile in the
      environment given by `--environment` (Puppet's `environment` setting), or as
      `servers_with_role(ROLE)` with `--role`; both together give the servers the
      clauses select that have one of the roles. The same index, the same order, the
      same errors. People get a table of certname, environment and the facts
      `--facts` names; `--render-as json` gives the full Hashes the functions return.
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker query --role node --facts ipaddress,os.release.full
      $ puppet kicker query 'os.family=Debian' 'uptime_days>10' --environment staging
      $ puppet kicker query --role haproxy --render-as json
    EXAMPLES
    returns 'The servers, each the Hash of its facts the functions return (with --render-as json or yaml).'

    option '--role ROLE' do
      summary 'Servers of this role (a name or /regex/; several separated by commas).'
    end
    option '--facts PATHS' do
      summary 'Facts to show as columns, separated by commas (dotted paths into structured facts).'
    end

    # (|*args|: Puppet's wrapper passes the options last, and needs arity -1 for that.)
    when_invoked do |*args|
      options = args.pop
      clauses = args
      PuppetKicker.command('query', 'clauses' => clauses, 'roles' => PuppetKicker::Face.list(options[:role]),
                                    'environment' => PuppetKicker::Face.environment,
                                    'facts' => PuppetKicker::Face.list(options[:facts]))
    end

    # Machine output: the Hashes themselves, as the functions return them.
    %i[json yaml].each do |format|
      when_rendering(format) { |answer| answer['servers'].map { |server| server['hash'] } }
    end

    when_rendering :console do |answer|
      rows = answer['servers'].map do |server|
        [server['certname'], server['environment']] + server['columns'].map { |v| PuppetKicker::Face.cell(v) }
      end
      next 'No server matches.' if rows.empty?

      header = %w[CERTNAME ENVIRONMENT] + answer['facts']
      "#{PuppetKicker::Face.table(header, rows)}\n#{rows.size} #{rows.size == 1 ? 'server' : 'servers'}"
    end
  end
end
