# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:kick) do
    summary 'Kick servers now, through the planner, policy, rate limit and log a report goes through.'
    arguments '(--role ROLE | --facts CLAUSE [CLAUSE ...])'
    description <<-DESCRIPTION
      Makes the servers of a role (`--role`, as `servers_with_role`) or matching
      every clause (`--facts`, as `servers_with_facts`) in the environment given by
      `--environment` run Puppet, as a report from this machine (Puppet's `certname`)
      with a kick would: the same policy (`kick.policy`, as this certname's role in
      the index, else its `*` rule), rate limit (this certname's), loop and hop
      checks, coalescing with kicks already queued, and log lines (through Puppet's
      log: the console, or `--logdest`). Unlike a report's, the kick is due at once
      and adds no edge to the role graph. It then waits (`--wait SECONDS`, else
      `kick.exit_wait`) for each target's outcome and prints TARGET, ROLE, OUTCOME,
      DETAIL: started, retry scheduled, failed, suppressed (and why), follow-up (after
      a kicked run in progress), or queued (no outcome within the wait: the kick stays
      in the kick state and is sent by the next dispatcher that looks).

      `--dry-run` prints what the planner would decide now, and records, sends and
      logs nothing.

      Exit codes: 0 every target started (or follows a kicked run in progress; with
      `--dry-run`: would be kicked); 1 an error (a bad clause or role); 2 a target
      failed or was suppressed; 3 nothing matched; 4 a target is not started yet
      (retry scheduled, or no outcome within the wait).
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker kick --role haproxy --dry-run
      $ puppet kicker kick --role haproxy
      $ puppet kicker kick --facts 'role=node' 'os.release.major=12' --environment staging --wait 60
    EXAMPLES
    returns 'The targets and their outcomes, and the exit code (with --render-as json or yaml).'

    option '--role ROLE' do
      summary 'Servers of this role (a name or /regex/; several separated by commas).'
    end
    option '--facts CLAUSE' do
      summary 'Servers matching this clause; more clauses may follow as arguments (all must match).'
    end
    option '--dry-run' do
      summary 'Show what the planner would decide; record and send nothing.'
    end
    option '--wait SECONDS' do
      summary 'Wait at most this long for the outcomes (default: kick.exit_wait).'
    end

    when_invoked do |*args|
      options = args.pop
      clauses = options[:facts] ? [options[:facts]] + args : args
      unless args.empty? || options[:facts]
        raise PuppetKicker::QueryError, "puppet kicker kick: #{args.first.inspect} is not an option: give clauses " \
                                        'after --facts'
      end
      request = { 'roles' => PuppetKicker::Face.list(options[:role]), 'clauses' => clauses,
                  'environment' => PuppetKicker::Face.environment, 'certname' => Puppet[:certname].to_s,
                  'dry_run' => options[:dry_run] ? true : false, }
      if options[:wait]
        wait = options[:wait].to_s
        raise PuppetKicker::QueryError, "puppet kicker kick: --wait #{wait.inspect}: give whole seconds" unless
          /\A\d{1,9}\z/.match?(wait)

        request['wait'] = wait.to_i
      end
      answer = PuppetKicker.command('kick', request)
      PuppetKicker::Face.exit_code = answer['exit_code'] unless answer['exit_code'].zero?
      answer
    end

    # (The whole-kick messages, e.g. nothing matched, are in the log already.)
    when_rendering :console do |answer|
      rows = answer['targets'].map do |t|
        [t['certname'], PuppetKicker::Face.cell(t['role']), t['outcome'], t['detail']]
      end
      counts = answer['targets'].group_by { |t| t['outcome'] }.map { |outcome, ts| "#{ts.size} #{outcome}" }
      lines = if rows.empty?
                ['No server matches.']
              else
                [PuppetKicker::Face.table(%w[TARGET ROLE OUTCOME DETAIL], rows),
                 "#{rows.size} #{rows.size == 1 ? 'target' : 'targets'}: #{counts.join(', ')}",]
              end
      lines << 'Dry run: nothing recorded or sent.' if answer['dry_run']
      lines.join("\n")
    end
  end
end
