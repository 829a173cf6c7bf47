# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'
require_relative '../../../puppet_kicker/face_rollout'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:rollout) do
    summary "Ordered rollouts: `plan` shows in which order servers would run, by the kick graph's roles."
    arguments '(plan | run | status) [--roles ROLES | --facts CLAUSE [CLAUSE ...]] [--batch N] [--order graph|given] ' \
              '[--continue-on-failure] [--timeout-per-batch S] [--resume]'
    description <<-DESCRIPTION
      `plan` shows the order in which the servers of the environment given by
      `--environment` (Puppet's `environment` setting) would run Puppet, and changes
      nothing. Servers are selected as the functions select them: `--roles` as
      `servers_with_role` (names or /regex/, separated by commas), `--facts` as
      `servers_with_facts` (more clauses may follow as arguments), neither: every
      server of the environment.

      The servers are grouped by role. With `--order graph` (the default) the groups
      come in the kick graph's dependency order (`puppet kicker graph`, read from the
      saved kick state): a role that kicks another comes before it, ties by role name.
      Roles in a kick cycle run together as one group, after every role that kicks into
      the cycle; the plan lists each cycle and that rule. With `--order given` the
      groups come in the order `--roles` names them. A server with several roles runs
      once, in the latest group of its roles; servers with no role run last, as the
      group "(no role)". Within a group, certnames are sorted and cut into batches of
      `--batch N` (default: the whole group in one batch).

      `run` carries the plan out through `kick.transport` (a transport that can
      disable, enable and read the last run: the `puppet` agent over mcollective or
      Choria, or SSH's runonce script): it
      disables Puppet on every server with a message naming the rollout, then per
      batch enables each server, runs it once and waits until its last-run summary
      shows the run ended (changed, unchanged or failed), and stops at the first batch
      with a failure unless `--continue-on-failure`. At the end, on an error, Ctrl-C
      or SIGTERM, it enables every server it disabled and did not run. Its state is
      saved in the cache dir after each step: `run --resume` continues a rollout a
      crash interrupted, and `status` shows it. See docs/rollouts.md.
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker rollout plan
      $ puppet kicker rollout plan --roles db,node,haproxy --batch 10
      $ puppet kicker rollout plan --roles haproxy,node --order given
      $ puppet kicker rollout plan --facts 'os.family=Debian' 'os.release.major=12' --environment staging
      $ puppet kicker rollout plan --render-as json
      $ puppet kicker rollout run --roles db,node,haproxy --batch 5 --timeout-per-batch 900
      $ puppet kicker rollout run --resume
      $ puppet kicker rollout status
    EXAMPLES
    returns 'The groups in order with their batches, the kick cycles and how each was broken, and totals ' \
            '(with --render-as json or yaml).'

    option '--roles ROLES' do
      summary 'Servers of these roles (names or /regex/, separated by commas).'
    end
    option '--facts CLAUSE' do
      summary 'Servers matching this clause; more clauses may follow as arguments (all must match).'
    end
    option '--batch N' do
      summary 'Servers per batch within a group (default: the whole group in one batch).'
    end
    option '--order ORDER' do
      summary 'graph (default: the kick graph\'s dependency order) or given (the order of --roles).'
    end
    option '--continue-on-failure' do
      summary 'run: go on past a batch with a failure.'
    end
    option '--timeout-per-batch SECONDS' do
      summary 'run: how long a batch may take until each of its runs is confirmed (default 1800).'
    end
    option '--resume' do
      summary 'run: continue the saved rollout (after a crash) instead of planning a new one.'
    end

    # (|*args|: Puppet's wrapper passes the options last, and needs arity -1 for that.)
    when_invoked do |*args|
      options = args.pop
      rollout = PuppetKicker::FaceRollout
      case rollout.subcommand(args.first)
      when 'plan'
        PuppetKicker.command('rollout_plan', rollout.request(args, options, PuppetKicker::Face.environment))
      when 'status'
        PuppetKicker.command('rollout_status', {})
      else
        command = ->(name, request) { PuppetKicker.command(name, request) }
        start = command.call('rollout_run', rollout.run_request(args, options, PuppetKicker::Face.environment))
        log = ->(warning, text) { warning ? Puppet.warning("rollout: #{text}") : Puppet.notice("rollout: #{text}") }
        answer = rollout.run_loop(command, start, log: log, tty: $stderr.tty? ? $stderr : nil)
        failed = answer['progress']['failed'].positive? || answer['rollout']['phase']['phase'] != 'finished'
        PuppetKicker::Face.exit_code = 2 if failed
        answer
      end
    end

    when_rendering :console do |answer|
      if answer.key?('rollout')
        PuppetKicker::FaceRollout.rollout_text(answer).join("\n")
      else
        PuppetKicker::FaceRollout.text(answer).join("\n")
      end
    end
  end
end
