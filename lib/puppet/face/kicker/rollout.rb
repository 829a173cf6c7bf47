# frozen_string_literal: true

require_relative '../../../puppet_kicker/face'
require_relative '../../../puppet_kicker/face_rollout'

Puppet::Face.define(:kicker, '1.0.0') do
  action(:rollout) do
    summary "Ordered rollouts: `plan` shows in which order servers would run, by the kick graph's roles."
    arguments 'plan [--roles ROLES | --facts CLAUSE [CLAUSE ...]] [--batch N] [--order graph|given]'
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

      `run` and `status` are not available yet. See docs/rollouts.md.
    DESCRIPTION
    examples <<-EXAMPLES
      $ puppet kicker rollout plan
      $ puppet kicker rollout plan --roles db,node,haproxy --batch 10
      $ puppet kicker rollout plan --roles haproxy,node --order given
      $ puppet kicker rollout plan --facts 'os.family=Debian' 'os.release.major=12' --environment staging
      $ puppet kicker rollout plan --render-as json
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

    # (|*args|: Puppet's wrapper passes the options last, and needs arity -1 for that.)
    when_invoked do |*args|
      options = args.pop
      request = PuppetKicker::FaceRollout.request(args, options, PuppetKicker::Face.environment)
      PuppetKicker.command('rollout_plan', request)
    end

    when_rendering :console do |answer|
      PuppetKicker::FaceRollout.text(answer).join("\n")
    end
  end
end
