//! The planner on a simulated fleet with a hand-driven clock.

use super::*;
use std::collections::BTreeMap;

const SECOND: Millis = 1000;

/// node1..3 (role node), lb1 (haproxy), db1 (db), all in production.
fn fleet() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([("node1", "node"), ("node2", "node"), ("node3", "node"), ("lb1", "haproxy"), ("db1", "db")])
}

struct Sim {
    planner: Planner,
    now: Millis,
    log: Vec<String>,
    /// Certname to role; [`fleet`] unless a test needs more servers.
    fleet: BTreeMap<String, String>,
}

impl Sim {
    fn new(config: KickConfig) -> Sim {
        let fleet = fleet().into_iter().map(|(n, r)| (n.to_string(), r.to_string())).collect();
        Sim { planner: Planner::new(config, PlannerState::default()), now: 1_000_000, log: Vec::new(), fleet }
    }

    fn report(&mut self, host: &str, kicks: &[&str]) -> Vec<Event> {
        self.report_started_at(host, self.now, false, kicks)
    }

    fn report_started_at(&mut self, host: &str, run_started: Millis, noop: bool, kicks: &[&str]) -> Vec<Event> {
        let report = ReportKicks {
            host: host.into(),
            environment: "production".into(),
            run_started,
            noop,
            reporter_pid: None,
            status: None,
            kicks: kicks
                .iter()
                .map(|role| KickSpec {
                    resource: format!("Notify[kick -> {role}]"),
                    selector: Selector::Roles(vec![role.to_string()]),
                    environment: None,
                })
                .collect(),
        };
        let fleet = &self.fleet;
        let events = self.planner.on_report(
            &report,
            self.now,
            |selector, _env| match selector {
                Selector::Roles(roles) => fleet
                    .iter()
                    .filter(|(_, r)| roles.iter().any(|x| x == *r))
                    .map(|(n, r)| Target { certname: n.clone(), role: Some(r.clone()) })
                    .collect(),
                Selector::Facts(_) => Vec::new(),
            },
            |host| fleet.get(host).cloned(),
        );
        self.log.extend(events.iter().map(ToString::to_string));
        events
    }

    fn advance(&mut self, ms: Millis) {
        self.now += ms;
    }

    /// Dispatches what is due, answering every runonce with `outcome`.
    fn dispatch(&mut self, outcome: impl Fn(&str) -> Outcome) -> Vec<String> {
        let (dispatches, events) = self.planner.due(self.now);
        self.log.extend(events.iter().map(ToString::to_string));
        let mut started = Vec::new();
        for d in dispatches {
            let result = outcome(&d.target);
            if result == Outcome::Started {
                started.push(d.target.clone());
            }
            let events = self.planner.on_outcome(&d.target, result, self.now);
            self.log.extend(events.iter().map(ToString::to_string));
        }
        started
    }

    fn logged(&self, needle: &str) -> bool {
        self.log.iter().any(|l| l.contains(needle))
    }
}

fn started(_: &str) -> Outcome {
    Outcome::Started
}

#[test]
fn kicks_within_the_window_coalesce_into_one_run() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(3 * SECOND);
    sim.report("node2", &["haproxy"]);
    sim.advance(3 * SECOND);
    assert!(sim.dispatch(started).is_empty(), "not due before the window closes");
    sim.advance(5 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    assert!(sim.logged("kick of lb1 joins the one already queued (chain node1 -> lb1 (also caused by node2))"));
    sim.advance(60 * SECOND);
    assert!(sim.dispatch(started).is_empty(), "exactly one run");
}

#[test]
fn a_kick_during_a_kicked_run_becomes_exactly_one_follow_up() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    let lb1_started = sim.now;
    for node in ["node2", "node3", "node2"] {
        sim.advance(SECOND);
        sim.report(node, &["haproxy"]);
    }
    sim.advance(60 * SECOND);
    assert!(sim.dispatch(started).is_empty(), "not while the kicked run is going");
    assert_eq!(sim.planner.undelivered(), 1);
    sim.report_started_at("lb1", lb1_started + 500, false, &[]);
    assert!(sim.logged("kicked run of lb1 reported"));
    assert_eq!(sim.dispatch(started), ["lb1"], "one follow-up, not zero and not three");
    sim.advance(60 * SECOND);
    assert!(sim.dispatch(started).is_empty());
}

#[test]
fn busy_and_silent_targets_are_retried_with_backoff_then_given_up_and_logged() {
    let config = KickConfig { max_attempts: 3, retry_base_ms: 30 * SECOND, ..KickConfig::default() };
    let mut sim = Sim::new(config);
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    let busy = |_: &str| Outcome::Busy("Puppet is currently applying a catalog, cannot run now".into());
    assert!(sim.dispatch(busy).is_empty());
    assert!(sim.logged("kick of lb1 not started (Puppet is currently applying a catalog, cannot run now); retrying"));
    sim.advance(29 * SECOND);
    assert!(sim.dispatch(busy).is_empty() && sim.planner.due(sim.now).0.is_empty(), "backoff not over");
    sim.advance(SECOND);
    sim.dispatch(|_| Outcome::NoReply);
    sim.advance(59 * SECOND);
    assert!(sim.planner.due(sim.now).0.is_empty(), "second backoff is twice as long");
    sim.advance(SECOND);
    sim.dispatch(|_| Outcome::Disabled("Puppet is disabled".into()));
    assert!(sim.logged("kick of lb1 FAILED after 3 attempts: Puppet is disabled (chain node1 -> lb1)"));
    assert_eq!(sim.planner.state().outcomes.back().unwrap().result, "failed: Puppet is disabled");
    assert_eq!(sim.planner.undelivered(), 0);
}

#[test]
fn a_busy_target_gets_its_run_afterwards() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(|_| Outcome::Busy("Puppet is currently applying a catalog".into()));
    sim.advance(30 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
}

#[test]
fn pending_kicks_survive_a_restart_without_repeating() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    let (dispatches, _) = sim.planner.due(sim.now);
    assert_eq!(dispatches.len(), 1, "in flight when the master dies");

    let bytes = rmp_serde::to_vec_named(sim.planner.state()).unwrap();
    let state: PlannerState = rmp_serde::from_slice(&bytes).unwrap();
    let mut restarted = Planner::new(KickConfig::default(), state);
    assert!(restarted.due(sim.now + SECOND).0.is_empty(), "another process may still be sending it");
    let later = sim.now + 120 * SECOND;
    let (again, _) = restarted.due(later);
    assert_eq!(again.iter().map(|d| d.target.as_str()).collect::<Vec<_>>(), ["lb1"], "not lost");
    restarted.on_outcome("lb1", Outcome::Started, later);
    assert!(restarted.due(later + 600 * SECOND).0.is_empty(), "not repeated");
}

/// The seed's cycle: node kicks haproxy, haproxy kicks node. It must settle.
#[test]
fn a_two_role_cycle_settles_after_a_bounded_number_of_runs() {
    let mut sim = Sim::new(KickConfig::default());
    let mut runs = 0;
    let mut reporting = vec!["node1".to_string()];
    while let Some(host) = reporting.pop() {
        runs += 1;
        assert!(runs < 20, "kicks never settle: {:#?}", sim.log);
        let kicks = if fleet()[host.as_str()] == "node" { ["haproxy"] } else { ["node"] };
        let run_started = sim.now;
        sim.report_started_at(&host, run_started, false, &kicks);
        sim.advance(10 * SECOND);
        reporting.extend(sim.dispatch(started));
        sim.advance(5 * SECOND);
    }
    assert!(sim.logged(
        "kick of node1 by lb1 (Notify[kick -> node]) suppressed: it would close a loop: node1 -> lb1 -> node1"
    ));
    assert!(sim.logged("kick cycle between roles: haproxy -> node -> haproxy"));
    // node1, then lb1, then node2 and node3 (node1 suppressed), whose kicks of lb1 are
    // suppressed because lb1 is on their chains.
    assert_eq!(runs, 4, "{:#?}", sim.log);
}

#[test]
fn a_three_server_cycle_is_suppressed_with_the_whole_cycle_logged() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    let t = sim.now;
    sim.report_started_at("lb1", t, false, &["db"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    let t = sim.now;
    sim.report_started_at("db1", t, false, &["haproxy"]);
    assert!(sim.logged(
        "kick of lb1 by db1 (Notify[kick -> haproxy]) suppressed: it would close a loop: node1 -> lb1 -> db1 -> lb1"
    ));
}

#[test]
fn chains_longer_than_max_hops_stop() {
    let mut sim = Sim::new(KickConfig { max_hops: 1, ..KickConfig::default() });
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    let t = sim.now;
    sim.report_started_at("lb1", t, false, &["db"]);
    assert!(sim
        .logged("kick of db1 by lb1 (Notify[kick -> db]) suppressed: the chain exceeds max_hops: node1 -> lb1 -> db1"));
}

#[test]
fn kicks_coalesced_into_one_run_are_one_hop_for_max_hops() {
    // Three nodes kick the load balancer together; its run kicks the database: two
    // hops on every path, within max_hops 2 (the causes are not hops).
    let mut sim = Sim::new(KickConfig { max_hops: 2, ..KickConfig::default() });
    for node in ["node1", "node2", "node3"] {
        sim.report(node, &["haproxy"]);
    }
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    let t = sim.now;
    // Every cause named still counts for loops: lb1's run may not kick node3 back.
    sim.report_started_at("lb1", t, false, &["db", "node"]);
    assert!(
        sim.logged("kick queued for db1 (chain node1 -> lb1 -> db1 (also caused by node2, node3))"),
        "{:#?}",
        sim.log
    );
    assert!(sim.logged(
        "kick of node3 by lb1 (Notify[kick -> node]) suppressed: it would close a loop: node1 -> lb1 -> node3 (also caused by node2)"
    ), "{:#?}", sim.log);
}

#[test]
fn a_loop_through_a_cause_counted_but_not_named_stops_one_run_later() {
    // Thirty nodes kick lb1 in one window: its chain names the first sixteen other
    // causes and counts the rest. lb1's run kicks the nodes back: those named are
    // suppressed at once; one only counted runs, and its kick of lb1 closes the loop.
    let mut sim = Sim::new(KickConfig { max_hops: 10, ..KickConfig::default() });
    let nodes: Vec<String> = (1..=30).map(|n| format!("web{n:02}")).collect();
    for node in &nodes {
        sim.fleet.insert(node.clone(), "web".into());
    }
    for node in &nodes {
        sim.report(node, &["haproxy"]);
    }
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    let t = sim.now;
    sim.report_started_at("lb1", t, false, &["web"]);
    assert!(sim.logged(
        "kick of web17 by lb1 (Notify[kick -> web]) suppressed: it would close a loop: web01 -> lb1 -> web17 (also caused by web02, web03, web04 and 25 more)"
    ), "{:#?}", sim.log);
    assert!(
        sim.logged(
            "kick queued for web18 (chain web01 -> lb1 -> web18 (also caused by web02, web03, web04 and 26 more))"
        ),
        "{:#?}",
        sim.log
    );
    sim.advance(10 * SECOND);
    let kicked = sim.dispatch(started);
    assert_eq!(kicked, nodes[17..], "the nodes only counted as causes");
    let t = sim.now;
    sim.report_started_at("web18", t, false, &["haproxy"]);
    assert!(
        sim.logged("kick of lb1 by web18 (Notify[kick -> haproxy]) suppressed: it would close a loop"),
        "{:#?}",
        sim.log
    );
}

#[test]
fn policy_decides_which_roles_may_kick_which() {
    let rules = BTreeMap::from([("node".to_string(), vec!["haproxy".to_string()])]);
    let mut sim = Sim::new(KickConfig { policy: Policy::from_rules(rules), ..KickConfig::default() });
    sim.report("node1", &["haproxy", "db"]);
    assert!(sim.logged("kick queued for lb1"));
    assert!(
        sim.logged("kick of db1 by node1 (Notify[kick -> db]) suppressed: policy does not let role node kick role db")
    );
    sim.report("db1", &["haproxy"]);
    assert!(sim.logged("policy does not let role db kick role haproxy"));
}

#[test]
fn a_source_over_its_rate_limit_is_suppressed() {
    let config = KickConfig { rate_limit: RateLimit { max: 2, window_ms: 60 * SECOND }, ..KickConfig::default() };
    let mut sim = Sim::new(config);
    sim.report("node1", &["haproxy"]);
    sim.report("node1", &["haproxy"]);
    let events = sim.report("node1", &["haproxy"]);
    assert!(matches!(&events[..], [Event::Suppressed { reason: Suppression::RateLimited, .. }]), "{events:?}");
    assert!(sim.logged("node1 exceeded its kick rate limit"));
    sim.advance(60 * SECOND);
    assert!(!matches!(&sim.report("node1", &["haproxy"])[..], [Event::Suppressed { .. }]));
}

#[test]
fn noop_runs_and_dry_runs_kick_nothing() {
    let mut sim = Sim::new(KickConfig::default());
    let t = sim.now;
    sim.report_started_at("node1", t, true, &["haproxy"]);
    assert!(sim.logged("suppressed: the run was --noop"));

    let mut dry = Sim::new(KickConfig { dry_run: true, ..KickConfig::default() });
    dry.report("node1", &["haproxy"]);
    assert!(dry.logged("dry run: would kick lb1 (chain node1 -> lb1)"));
    dry.advance(60 * SECOND);
    assert!(dry.dispatch(started).is_empty());
}

#[test]
fn a_server_kicking_its_own_role_kicks_its_peers_once_and_not_itself() {
    let mut sim = Sim::new(KickConfig::default());
    let events = sim.report("node1", &["node"]);
    assert!(sim.logged("Notify[kick -> node] from node1 does not kick node1 itself: it has just run"));
    assert!(!events.iter().any(|e| matches!(e, Event::Queued { target, .. } if target == "node1")), "{events:?}");
    assert!(sim.logged("kick queued for node2 (chain node1 -> node2)"));
    assert!(sim.logged("kick queued for node3 (chain node1 -> node3)"));
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["node2", "node3"], "each peer once, node1 not again");
    // The peers' kicked runs report, with nothing changed: nothing more runs.
    sim.advance(SECOND);
    sim.report("node2", &[]);
    sim.report("node3", &[]);
    assert!(sim.logged("kicked run of node2 reported (chain node1 -> node2)"));
    sim.advance(60 * SECOND);
    assert!(sim.dispatch(started).is_empty(), "one change: three runs in all, not four");
    // Had a peer's kicked run changed and kicked the role too, node1 would close a loop.
    sim.advance(SECOND);
    let events = sim.report("node2", &["node"]);
    assert!(events.iter().any(|e| matches!(e, Event::NotItself { .. })), "{events:?}");
}

#[test]
fn a_report_kicking_only_its_own_server_queues_nothing_and_says_why() {
    let mut sim = Sim::new(KickConfig::default());
    let events = sim.report("lb1", &["haproxy"]);
    assert!(matches!(&events[..], [Event::NotItself { source, .. }] if source == "lb1"), "{events:?}");
    assert_eq!(sim.planner.undelivered(), 0);
    assert!(!sim.logged("matches no server"), "it matched one: itself");
}

#[test]
fn a_masterless_report_holds_its_servers_kick_until_its_process_exits() {
    // An operator's kick of this machine (the only way it kicks itself) is pending
    // when its own `puppet apply` reports: that kick waits for the process to exit.
    let mut sim = Sim::new(KickConfig { coalesce_ms: 10 * SECOND, ..KickConfig::default() });
    sim.operator("node1", "node");
    let report = ReportKicks {
        host: "node1".into(),
        environment: "production".into(),
        run_started: sim.now,
        noop: false,
        reporter_pid: Some(4242),
        status: None,
        kicks: Vec::new(),
    };
    let none = |_: &Selector, _: &str| Vec::new();
    let fleet = fleet();
    sim.planner.on_report(&report, sim.now, none, |h| fleet.get(h).map(|r| r.to_string()));
    assert_eq!(sim.planner.holds().collect::<Vec<_>>(), [(&"node1".to_string(), 4242)]);
    assert_eq!(sim.dispatch(started), ["node2", "node3"], "node1 waits for its own run's process");
    let confirm_within = KickConfig::default().confirm_within_ms;
    assert_eq!(sim.planner.next_wakeup(), Some(sim.now + confirm_within), "the runs' confirmation windows only");
    assert!(!sim.planner.release_exited(sim.now, |pid| pid == 4242), "still running");
    assert!(sim.dispatch(started).is_empty());
    assert!(sim.planner.release_exited(sim.now, |_| false), "the process exited");
    assert_eq!(sim.dispatch(started), ["node1"]);

    // A hold outlives no run_timeout, whatever the pid (reused) says.
    let mut sim = Sim::new(KickConfig::default());
    sim.operator("node1", "node");
    sim.planner.on_report(&report, sim.now, none, |_| None);
    assert_eq!(sim.planner.holds().count(), 1);
    sim.advance(KickConfig::default().run_timeout_ms);
    assert!(sim.planner.release_exited(sim.now, |_| true));

    // A report whose server has nothing pending holds nothing, even one kicking its
    // own role: it leaves itself out.
    let mut sim = Sim::new(KickConfig::default());
    let own_role = ReportKicks {
        kicks: vec![kick_of("Notify[kick -> node]", Selector::Roles(vec!["node".into()]), None)],
        ..report
    };
    let node1 = |_: &Selector, _: &str| vec![Target { certname: "node1".into(), role: Some("node".into()) }];
    sim.planner.on_report(&own_role, sim.now, node1, |_| None);
    assert_eq!(sim.planner.holds().count(), 0);
}

#[test]
fn a_request_the_agent_refuses_is_given_up_at_once() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(|_| Outcome::Refused("Input forcerun is not a boolean (status 4)".into()));
    assert!(sim.logged(
        "kick of lb1 FAILED after 1 attempts: the agent refused the request: Input forcerun is not a boolean (status 4)"
    ));
    assert_eq!(sim.planner.undelivered(), 0);
}

#[test]
fn a_kicked_run_that_never_reports_times_out_and_frees_its_follow_up() {
    let mut sim = Sim::new(KickConfig { run_timeout_ms: 600 * SECOND, ..KickConfig::default() });
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    sim.report("node2", &["haproxy"]);
    assert_eq!(sim.planner.next_wakeup(), Some(sim.now + 600 * SECOND));
    sim.advance(600 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    assert!(sim.logged("kicked run of lb1 sent no report within run_timeout"));
}

#[test]
fn a_kick_matching_nobody_is_logged() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["nosuchrole"]);
    assert!(sim.logged("Notify[kick -> nosuchrole] from node1 matches no server in environment production"));
}

fn kick_of(resource: &str, selector: Selector, environment: Option<&str>) -> KickSpec {
    KickSpec { resource: resource.into(), selector, environment: environment.map(str::to_string) }
}

fn report_of(host: &str, now: Millis, kicks: Vec<KickSpec>) -> ReportKicks {
    ReportKicks {
        host: host.into(),
        environment: "production".into(),
        run_started: now,
        noop: false,
        reporter_pid: None,
        status: None,
        kicks,
    }
}

#[test]
fn a_report_over_its_budget_is_cut_where_it_exceeds_and_says_so() {
    let budget = ReportBudget { kicks: 2, clauses: 3, targets: 2 };
    let config = KickConfig { budget, ..KickConfig::default() };
    let roles = |n: usize| Selector::Roles(vec!["haproxy".to_string(); n]);
    let resolved_calls = std::cell::Cell::new(0);
    let mut resolve = |_: &Selector, _: &str| {
        resolved_calls.set(resolved_calls.get() + 1);
        vec![Target { certname: "lb1".into(), role: Some("haproxy".into()) }]
    };
    // kicks: the third is over; clauses: 2 + 2 > 3.
    let report = report_of(
        "node1",
        0,
        vec![kick_of("K[a]", roles(2), None), kick_of("K[b]", roles(2), None), kick_of("K[c]", roles(1), None)],
    );
    let resolved = Planner::resolve(&config, &report, &mut resolve, |_| Some("node".into()));
    let refused = |what: &str| ResolvedKick::Refused(Suppression::OverBudget { what: what.into() });
    assert_eq!(resolved.kicks[1].1, refused("more than 3 roles and clauses (kick.budget.clauses)"));
    assert_eq!(resolved.kicks[2].1, refused("more than 2 kicks (kick.budget.kicks)"));
    assert_eq!(resolved_calls.get(), 1, "kicks over the budget are not resolved");
    // targets: at the limit passes, one over is refused.
    let report = report_of("node1", 0, vec![kick_of("K[a]", roles(1), None), kick_of("K[b]", roles(1), None)]);
    let resolved = Planner::resolve(&config, &report, &mut resolve, |_| None);
    assert!(resolved.kicks.iter().all(|(_, k)| matches!(k, ResolvedKick::Targets(_))));
    let config = KickConfig { budget: ReportBudget { targets: 1, ..budget }, ..config };
    let mut planner = Planner::new(config.clone(), PlannerState::default());
    let resolved = Planner::resolve(&config, &report, &mut resolve, |_| None);
    let events = planner.on_resolved(&report, resolved, 0);
    let lines: Vec<String> = events.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "kick queued for lb1 (chain node1 -> lb1)",
            "kick of all targets by node1 (K[b]) suppressed: the report exceeds its budget: more than 1 targets (kick.budget.targets)"
        ]
    );
}

#[test]
fn a_kick_of_another_environment_needs_kick_environments_to_allow_it() {
    let environments = Policy::from_rules(BTreeMap::from([("production".to_string(), vec!["staging".to_string()])]));
    let mut sim = Sim::new(KickConfig { environments, ..KickConfig::default() });
    let any = |_: &Selector, env: &str| vec![Target { certname: format!("lb-{env}"), role: None }];
    let report = report_of(
        "node1",
        0,
        vec![
            kick_of("K[same]", Selector::Roles(vec!["x".into()]), Some("production")),
            kick_of("K[staging]", Selector::Roles(vec!["x".into()]), Some("staging")),
            kick_of("K[dev]", Selector::Roles(vec!["x".into()]), Some("dev")),
        ],
    );
    let events = sim.planner.on_report(&report, sim.now, any, |_| None);
    let lines: Vec<String> = events.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "kick queued for lb-production (chain node1 -> lb-production)",
            "kick queued for lb-staging (chain node1 -> lb-staging)",
            "kick of all targets by node1 (K[dev]) suppressed: kick.environments does not let a server in environment production kick environment dev"
        ]
    );
}

#[test]
fn only_kicks_the_policy_allows_shape_the_role_graph() {
    let rules = BTreeMap::from([("node".to_string(), vec!["haproxy".to_string()])]);
    let mut sim = Sim::new(KickConfig { policy: Policy::from_rules(rules), ..KickConfig::default() });
    sim.report("node1", &["haproxy", "db"]);
    sim.report("db1", &["node"]);
    let edges: Vec<(&str, &str)> = sim.planner.state().graph.edges().collect();
    assert_eq!(edges, [("node", "haproxy")]);
}

#[test]
fn role_edges_age_out_after_the_ttl() {
    let mut sim = Sim::new(KickConfig { role_graph_ttl_ms: 3600 * SECOND, ..KickConfig::default() });
    sim.report("node1", &["haproxy"]);
    sim.advance(3600 * SECOND);
    sim.report("db1", &["haproxy"]);
    assert_eq!(sim.planner.state().graph.edge_count(), 2, "at the ttl: kept");
    sim.advance(SECOND);
    sim.report("db1", &["haproxy"]);
    assert_eq!(sim.planner.state().graph.edges().collect::<Vec<_>>(), [("db", "haproxy")]);
}

#[test]
fn a_kicked_run_is_matched_by_the_agents_clock_whatever_the_skew() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    // lb1's clock is 5 minutes behind: its reply and its report say so alike.
    let agent_now = sim.now - 300 * SECOND;
    let (dispatches, _) = sim.planner.due(sim.now);
    assert_eq!(dispatches.len(), 1);
    sim.planner.on_outcome("lb1", Outcome::StartedAt(agent_now), sim.now);
    sim.report_started_at("lb1", agent_now - 2 * SECOND, false, &[]);
    assert!(!sim.logged("kicked run of lb1 reported"), "a run started before the kick is not the kicked one");
    sim.report_started_at("lb1", agent_now - SECOND + 1, false, &[]);
    assert!(sim.logged("kicked run of lb1 reported"), "whole seconds: one second of slack");
}

#[test]
fn without_the_agents_clock_the_configured_skew_is_tolerated() {
    let mut sim = Sim::new(KickConfig { clock_skew_ms: 30 * SECOND, ..KickConfig::default() });
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    let kicked = sim.now;
    sim.report_started_at("lb1", kicked - 30 * SECOND - 1, false, &[]);
    assert!(!sim.logged("kicked run of lb1 reported"), "one over the skew");
    sim.report_started_at("lb1", kicked - 30 * SECOND, false, &[]);
    assert!(sim.logged("kicked run of lb1 reported"), "at the skew");
}

#[test]
fn a_claim_renews_the_in_flight_time_and_fails_once_another_took_over() {
    let config = KickConfig { in_flight_timeout_ms: 60 * SECOND, ..KickConfig::default() };
    let mut sim = Sim::new(config);
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    let (dispatches, _) = sim.planner.due(sim.now);
    let generation = sim.planner.state().clone();
    sim.advance(14 * SECOND);
    assert_eq!(sim.planner.claim(&dispatches[0], sim.now), Claim::Held, "under a quarter of the timeout: as it was");
    assert_eq!(sim.planner.state(), &generation, "nothing to save");
    sim.advance(36 * SECOND);
    assert_eq!(sim.planner.claim(&dispatches[0], sim.now), Claim::Renewed);
    sim.advance(50 * SECOND);
    assert!(sim.planner.due(sim.now).0.is_empty(), "the timeout counts from the renewal");
    sim.advance(10 * SECOND);
    let (again, _) = sim.planner.due(sim.now);
    assert_eq!(again.len(), 1, "then it is stale and sent again");
    assert_eq!(sim.planner.claim(&dispatches[0], sim.now), Claim::Lost, "the first dispatch is no longer the kick's");
}

#[test]
fn a_kick_left_in_flight_wakes_the_dispatcher_when_it_turns_stale() {
    let config = KickConfig { in_flight_timeout_ms: 60 * SECOND, ..KickConfig::default() };
    let mut sim = Sim::new(config.clone());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    assert_eq!(sim.planner.due(sim.now).0.len(), 1, "in flight when its process dies");
    let restarted = Planner::new(config, sim.planner.state().clone());
    assert_eq!(restarted.next_wakeup(), Some(sim.now + 60 * SECOND));
}

/// A small deterministic generator (xorshift64*), so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One random history: reports (kicks by role, noop, nodes changing their role),
/// runonce outcomes (including answers lost with their process), clock steps both
/// ways, and restarts through the serialized state; then time runs on until every
/// kick is settled.
fn random_history(seed: u64) {
    const SERVERS: usize = 12;
    const ROLES: u64 = 6;
    let config = KickConfig {
        coalesce_ms: 5 * SECOND,
        retry_base_ms: 10 * SECOND,
        retry_max_ms: 60 * SECOND,
        max_attempts: 3,
        run_timeout_ms: 300 * SECOND,
        in_flight_timeout_ms: 30 * SECOND,
        rate_limit: RateLimit { max: 50, window_ms: 600 * SECOND },
        ..KickConfig::default()
    };
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut roles: Vec<String> = (0..SERVERS).map(|i| format!("r{}", i as u64 % ROLES)).collect();
    let mut planner = Planner::new(config.clone(), PlannerState::default());
    let mut now: Millis = 1_000_000;
    let mut log: Vec<Event> = Vec::new();
    // Dispatches sent and not answered: target -> when sent.
    let mut unanswered: BTreeMap<String, Millis> = BTreeMap::new();
    let mut answer = |planner: &mut Planner, rng: &mut Rng, now: Millis, log: &mut Vec<Event>, lose: bool| {
        let (dispatches, events) = planner.due(now);
        log.extend(events);
        for d in dispatches {
            if let Some(sent) = unanswered.get(&d.target) {
                assert!(now - sent >= config.in_flight_timeout_ms, "seed {seed}: {} sent twice at once", d.target);
            }
            let outcome = match rng.below(if lose { 7 } else { 5 }) {
                0 | 1 => Outcome::Started,
                2 => Outcome::StartedAt(now - 90 * SECOND),
                3 => Outcome::Busy("Puppet is currently applying a catalog".into()),
                4 => Outcome::NoReply,
                _ => {
                    unanswered.insert(d.target.clone(), now);
                    continue;
                }
            };
            unanswered.remove(&d.target);
            log.extend(planner.on_outcome(&d.target, outcome, now));
        }
    };
    for _ in 0..200 {
        match rng.below(10) {
            0..=3 => {
                let host = rng.below(SERVERS as u64) as usize;
                if rng.below(8) == 0 {
                    roles[host] = format!("r{}", rng.below(ROLES + 2));
                }
                let kicks = (0..rng.below(4))
                    .map(|k| {
                        let role = if rng.below(5) == 0 { "/./".to_string() } else { format!("r{}", rng.below(ROLES)) };
                        kick_of(&format!("Kick[{k}]"), Selector::Roles(vec![role]), None)
                    })
                    .collect();
                let skew = rng.below(20 * SECOND as u64) as Millis - 10 * SECOND;
                let mut report = report_of(&format!("s{host}"), now + skew, kicks);
                report.noop = rng.below(10) == 0;
                let fleet = roles.clone();
                let resolve = |selector: &Selector, _: &str| {
                    let Selector::Roles(wanted) = selector else { return Vec::new() };
                    let hit = |role: &String| wanted.iter().any(|w| w == "/./" || w == role);
                    let servers = fleet.iter().enumerate().filter(|(_, role)| hit(role));
                    servers.map(|(i, role)| Target { certname: format!("s{i}"), role: Some(role.clone()) }).collect()
                };
                let role_of = |host: &str| host[1..].parse::<usize>().ok().map(|i| fleet[i].clone());
                let events = planner.on_report(&report, now, resolve, role_of);
                // A report never queues a kick of its own server.
                let itself = |t: &String| t == &report.host;
                assert!(
                    !events.iter().any(|e| matches!(e, Event::Queued { target, .. } | Event::Coalesced { target, .. }
                        | Event::FollowUp { target, .. } if itself(target))),
                    "seed {seed}: {} kicked itself: {events:?}",
                    report.host
                );
                // Every kick is decided: queued, joined, suppressed (with why) or found no target.
                for kick in &report.kicks {
                    let decided = events.iter().any(|e| match e {
                        Event::Suppressed { resource, .. }
                        | Event::NoTargets { resource, .. }
                        | Event::NotItself { resource, .. } => resource == &kick.resource,
                        _ => false,
                    }) || events
                        .iter()
                        .any(|e| matches!(e, Event::Queued { .. } | Event::Coalesced { .. } | Event::FollowUp { .. }));
                    assert!(decided, "seed {seed}: {} left undecided: {events:?}", kick.resource);
                }
                log.extend(events);
            }
            4..=6 => {
                let lose = true;
                answer(&mut planner, &mut rng, now, &mut log, lose);
            }
            7 => {
                // A restart: only what was serialized survives.
                let bytes = rmp_serde::to_vec_named(planner.state()).unwrap();
                planner = Planner::new(config.clone(), rmp_serde::from_slice(&bytes).unwrap());
            }
            8 => now -= rng.below(5 * SECOND as u64) as Millis, // the clock steps back
            _ => now += rng.below(120 * SECOND as u64) as Millis,
        }
        now += rng.below(3 * SECOND as u64) as Millis;
        // Every kick started is confirmed, unconfirmed, or still awaiting its report.
        let c = planner.state().counters;
        assert_eq!(c.sent, c.confirmed_total() + c.unconfirmed + planner.awaiting().count() as u64, "seed {seed}");
        let graph = &planner.state().graph;
        assert!(graph.cycles().count() <= MAX_ROLE_CYCLES_LISTED, "seed {seed}");
        assert!(graph.cycles().all(|c| c.len() <= config.max_hops + 2), "seed {seed}");
    }
    // Time runs on with no answer lost: everything settles.
    for _ in 0..200 {
        if planner.undelivered() == 0 && planner.state().targets.values().all(|t| t.running.is_none()) {
            break;
        }
        now += config.run_timeout_ms;
        answer(&mut planner, &mut rng, now, &mut log, false);
    }
    assert_eq!(planner.undelivered(), 0, "seed {seed}: kicks never settled: {:?}", planner.state().targets);
    // Every kick taken in ends started or failed-and-logged, after it was taken in.
    let mut ended_later = std::collections::BTreeSet::new();
    for event in log.iter().rev() {
        match event {
            Event::Started { target, .. } | Event::GaveUp { target, .. } => {
                ended_later.insert(target.clone());
            }
            Event::Queued { target, .. } | Event::Coalesced { target, .. } | Event::FollowUp { target, .. } => {
                assert!(ended_later.contains(target), "seed {seed}: a kick of {target} never ended");
            }
            _ => {}
        }
    }
}

#[test]
fn random_histories_keep_the_planners_promises() {
    for seed in 0..100 {
        random_history(seed);
    }
}

impl Sim {
    /// An operator's `puppet kicker kick --role ROLE` from `host`, as the service takes it.
    fn operator(&mut self, host: &str, role: &str) -> Vec<Event> {
        let report = report_of(
            host,
            self.now,
            vec![kick_of(&format!("puppet kicker kick --role {role}"), Selector::Roles(vec![role.into()]), None)],
        );
        let fleet = fleet();
        let resolve = |selector: &Selector, _: &str| match selector {
            Selector::Roles(roles) => fleet
                .iter()
                .filter(|(_, r)| roles.iter().any(|x| x == *r))
                .map(|(n, r)| Target { certname: n.to_string(), role: Some(r.to_string()) })
                .collect(),
            Selector::Facts(_) => Vec::new(),
        };
        let resolved =
            Planner::resolve(self.planner.config(), &report, resolve, |h| fleet.get(h).map(|r| r.to_string()));
        let events = self.planner.on_operator(&report, resolved, self.now);
        self.log.extend(events.iter().map(ToString::to_string));
        events
    }
}

#[test]
fn an_operators_kick_is_due_at_once_and_draws_no_role_edge() {
    let mut sim = Sim::new(KickConfig::default());
    let events = sim.operator("node1", "haproxy");
    assert_eq!(
        events,
        [Event::Queued { target: "lb1".into(), chain: Chain::origin("node1").then("lb1"), due: sim.now }]
    );
    assert_eq!(sim.dispatch(started), ["lb1"], "no coalescing window to wait for");
    assert_eq!(sim.planner.state().graph.edge_count(), 0, "an operator is no role kicking a role");
    assert_eq!(sim.planner.state().counters, Counters { sent: 1, failed: 0, suppressed: 0, ..Counters::default() });
}

#[test]
fn an_operators_kick_brings_a_queued_kick_forward_and_ends_no_kicked_run() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["db"]);
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["db1"]);
    // db1's kicked run is going; an operator on db1 kicking haproxy does not end it.
    sim.report("node2", &["haproxy"]);
    assert!(sim.dispatch(started).is_empty(), "inside the coalescing window");
    let events = sim.operator("db1", "haproxy");
    assert!(matches!(&events[..], [Event::Coalesced { target, .. }] if target == "lb1"), "{events:?}");
    assert_eq!(sim.dispatch(started), ["lb1"], "brought forward to now");
    assert!(sim.planner.state().targets["db1"].running.is_some(), "db1's kicked run still going");
}

#[test]
fn the_policy_applies_to_an_operators_kick_as_to_its_machines_reports() {
    let rules = BTreeMap::from([("db".to_string(), vec!["haproxy".to_string()]), ("*".to_string(), vec![])]);
    let mut sim = Sim::new(KickConfig { policy: Policy::from_rules(rules), ..KickConfig::default() });
    assert!(matches!(&sim.operator("db1", "haproxy")[..], [Event::Queued { .. }]));
    let refused = sim.operator("master", "haproxy");
    let policy = Suppression::Policy { source_role: None, target_role: Some("haproxy".into()) };
    assert!(matches!(&refused[..], [Event::Suppressed { reason, .. }] if *reason == policy), "{refused:?}");
    assert_eq!(sim.planner.state().counters.suppressed, 1);
}

#[test]
fn counters_count_started_given_up_and_suppressed_kicks_and_only_grow() {
    let config = KickConfig { max_attempts: 1, max_hops: 1, ..KickConfig::default() };
    let mut sim = Sim::new(config);
    sim.report("node1", &["haproxy", "db"]);
    sim.advance(10 * SECOND);
    sim.dispatch(|target| if target == "lb1" { Outcome::Started } else { Outcome::NoReply });
    sim.report_started_at("lb1", sim.now, false, &["db"]);
    let counters = sim.planner.state().counters;
    // lb1's report (no status given) confirms its kick, in the first bucket (0 s).
    let mut expected = Counters { sent: 1, failed: 1, suppressed: 1, confirmed_unknown: 1, ..Counters::default() };
    expected.confirm_buckets[0] = 1;
    assert_eq!(counters, expected, "{:?}", sim.log);
    let mut theirs = sim.planner.state().clone();
    theirs.counters = Counters { sent: 0, failed: 5, suppressed: 0, confirmed_changed: 2, ..Counters::default() };
    theirs.counters.confirm_buckets[3] = 2;
    sim.planner.merge_unsaved(theirs);
    expected.failed = 5;
    expected.confirmed_changed = 2;
    expected.confirm_buckets[3] = 2;
    assert_eq!(sim.planner.state().counters, expected);
}

#[test]
fn a_state_saved_before_counters_and_edge_counts_is_read_with_zeros_and_one_kick_per_edge() {
    let old = serde_json::json!({
        "generation": 3, "targets": {}, "outcomes": [], "rate": {"seen": {}},
        "graph": {"role_edges": {"node": {"haproxy": 5}}, "cycles": [], "cycles_left_out": 0}, "holds": {},
    });
    let bytes = rmp_serde::to_vec_named(&old).unwrap();
    let mut state = decode_state(std::path::Path::new(STATE_FILE), &bytes).unwrap();
    assert_eq!((state.generation, state.counters), (3, Counters::default()));
    assert_eq!(state.graph.counted_edges().collect::<Vec<_>>(), [("node", "haproxy", 1)]);
    state.graph.add("node", "haproxy", 6, 6);
    assert_eq!(state.graph.counted_edges().collect::<Vec<_>>(), [("node", "haproxy", 2)]);
}

impl Sim {
    /// A report of `host`'s run started `started_ago` before now, ending as `status`.
    fn report_ended(&mut self, host: &str, started_ago: Millis, status: RunStatus) -> Vec<Event> {
        let report = ReportKicks { status: Some(status), ..report_of(host, self.now - started_ago, Vec::new()) };
        let events = self.planner.on_report(&report, self.now, |_, _| Vec::new(), |_| None);
        self.log.extend(events.iter().map(ToString::to_string));
        events
    }
}

#[test]
fn the_first_report_of_a_run_started_after_the_kick_confirms_it_with_its_outcome() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    assert_eq!(sim.dispatch(started), ["lb1"]);
    assert_eq!(sim.planner.awaiting().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["lb1"]);
    // A report of a run that started before the kick (its clock within the skew
    // aside) confirms nothing.
    sim.advance(5 * SECOND);
    sim.report_ended("lb1", 5 * SECOND + KickConfig::default().clock_skew_ms + SECOND, RunStatus::Changed);
    assert_eq!(sim.planner.awaiting().count(), 1, "an earlier run's report");
    sim.advance(37 * SECOND);
    let events = sim.report_ended("lb1", 40 * SECOND, RunStatus::Changed);
    assert!(
        matches!(&events[..], [Event::Confirmed { target, status: Some(RunStatus::Changed), after_ms: 42_000, .. }] if target == "lb1"),
        "one line, not a RunFinished beside it: {events:?}"
    );
    assert!(sim.logged(
        "kicked run of lb1 reported (chain node1 -> lb1): changed, the run of 1970-01-01T00:16:52Z 42 s after the kick"
    ));
    let counters = sim.planner.state().counters;
    assert_eq!((counters.confirmed_changed, counters.confirmed_total(), counters.unconfirmed), (1, 1, 0));
    assert_eq!(counters.confirm_buckets[CONFIRM_BUCKETS.iter().position(|le| *le == 60).unwrap()], 1);
    assert_eq!(counters.confirm_ms_sum, 42_000);
    let confirmation = sim.planner.state().confirmations.back().unwrap().clone();
    assert_eq!((confirmation.target.as_str(), confirmation.outcome.as_str()), ("lb1", "changed"));
    assert_eq!(confirmation.after_ms, Some(42_000));
    assert_eq!(sim.planner.awaiting().count(), 0);
    // The next report confirms nothing more.
    sim.advance(SECOND);
    assert!(sim.report_ended("lb1", 0, RunStatus::Unchanged).is_empty());
}

#[test]
fn a_kicked_servers_failed_run_is_a_warning_with_its_certname_and_the_runs_time() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    sim.advance(90 * SECOND);
    let events = sim.report_ended("lb1", 80 * SECOND, RunStatus::Failed);
    let line = events.iter().map(ToString::to_string).next().unwrap();
    assert_eq!(
        line,
        "kicked run of lb1 reported (chain node1 -> lb1): FAILED, the run of 1970-01-01T00:17:00Z 1 min 30 s after the kick"
    );
    assert_eq!(sim.planner.state().counters.confirmed_failed, 1);
}

#[test]
fn a_kick_with_no_report_within_confirm_within_is_unconfirmed_once() {
    let config = KickConfig { confirm_within_ms: 1_800 * SECOND, ..KickConfig::default() };
    let mut sim = Sim::new(config);
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    let kicked = sim.now;
    assert_eq!(sim.planner.next_wakeup(), Some(kicked + 1_800 * SECOND), "the window ends before run_timeout");
    sim.advance(1_800 * SECOND - 1);
    sim.dispatch(started);
    assert_eq!(sim.planner.awaiting().count(), 1, "not yet");
    sim.advance(1);
    sim.dispatch(started);
    assert!(sim.logged(
        "kick of lb1 UNCONFIRMED: no report of a run started after it within 30 min (kick.confirm_within; chain node1 -> lb1)"
    ));
    assert_eq!(sim.planner.state().counters.unconfirmed, 1);
    assert_eq!(sim.planner.state().confirmations.back().unwrap().outcome, "unconfirmed");
    // Its report, late, ends the run (a follow-up may go) but confirms nothing twice.
    sim.advance(SECOND);
    sim.report_ended("lb1", 1_000 * SECOND, RunStatus::Changed);
    assert!(sim.logged("kicked run of lb1 reported (chain node1 -> lb1)"));
    let counters = sim.planner.state().counters;
    assert_eq!((counters.confirmed_total(), counters.unconfirmed), (0, 1));
}

#[test]
fn a_noop_run_confirms_no_kick_and_confirmations_survive_a_restart() {
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    sim.advance(SECOND);
    let noop = ReportKicks { noop: true, status: Some(RunStatus::Unchanged), ..report_of("lb1", sim.now, Vec::new()) };
    sim.planner.on_report(&noop, sim.now, |_, _| Vec::new(), |_| None);
    assert_eq!(sim.planner.awaiting().count(), 1, "a --noop run is not the kicked one");
    let bytes = rmp_serde::to_vec_named(sim.planner.state()).unwrap();
    sim.planner = Planner::new(KickConfig::default(), rmp_serde::from_slice(&bytes).unwrap());
    sim.advance(SECOND);
    sim.report_ended("lb1", SECOND, RunStatus::Unchanged);
    assert_eq!(sim.planner.state().counters.confirmed_unchanged, 1);
    // A state written before confirmations existed reads as none awaiting.
    let old = rmp_serde::to_vec_named(&serde_json::json!({"targets": {}, "outcomes": [], "rate": {"by_source": {}},
        "graph": {"edges": {}}}))
    .unwrap();
    let state: PlannerState = rmp_serde::from_slice(&old).unwrap_or_default();
    assert_eq!(state.awaiting.len() + state.confirmations.len(), 0);
}

#[test]
fn a_masterless_reports_kicks_are_confirmed_by_the_targets_last_run_summary() {
    let mut sim = Sim::new(KickConfig::default());
    let report = ReportKicks {
        reporter_pid: Some(4242),
        ..report_of("node1", sim.now, vec![kick_of("Kick[lb]", Selector::Roles(vec!["haproxy".into()]), None)])
    };
    let lb1 = |_: &Selector, _: &str| vec![Target { certname: "lb1".into(), role: Some("haproxy".into()) }];
    sim.planner.on_report(&report, sim.now, lb1, |_| None);
    sim.advance(10 * SECOND);
    let kicked = sim.now;
    assert_eq!(sim.dispatch(started), ["lb1"]);
    assert!(sim.planner.to_ask(sim.now).is_empty(), "not before CONFIRM_POLL_MS");
    assert_eq!(sim.planner.next_wakeup(), Some(kicked + CONFIRM_POLL_MS));
    sim.advance(CONFIRM_POLL_MS);
    assert_eq!(sim.planner.to_ask(sim.now), [("lb1".to_string(), "production".to_string())]);
    assert!(sim.planner.to_ask(sim.now).is_empty(), "asked once per poll");
    // A summary of the run before the kick confirms nothing; the kicked run's does.
    let before = kicked - KickConfig::default().clock_skew_ms - SECOND;
    assert!(sim.planner.on_last_run("lb1", Some(before), RunStatus::Unchanged, sim.now).is_empty());
    let events = sim.planner.on_last_run("lb1", Some(kicked + 12 * SECOND), RunStatus::Failed, sim.now);
    assert!(
        matches!(&events[..], [Event::Confirmed { status: Some(RunStatus::Failed), after_ms: 15_000, .. }]),
        "{events:?}"
    );
    assert_eq!(sim.planner.state().counters.confirmed_failed, 1);
    assert_eq!(sim.planner.awaiting().count(), 0);

    // On a master (no pid: puppetserver's reports), the target's report confirms.
    let mut sim = Sim::new(KickConfig::default());
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    sim.advance(CONFIRM_POLL_MS);
    assert!(sim.planner.to_ask(sim.now).is_empty(), "confirm_by auto: reports");
    let mut sim = Sim::new(KickConfig { confirm_by: ConfirmBy::Transport, ..KickConfig::default() });
    sim.report("node1", &["haproxy"]);
    sim.advance(10 * SECOND);
    sim.dispatch(started);
    sim.advance(CONFIRM_POLL_MS);
    assert_eq!(sim.planner.to_ask(sim.now).len(), 1, "confirm_by transport");
}
