//! `puppet kicker kick`: an operator's kick, through the planner a report's kick goes
//! through (policy, rate limit, loops, coalescing, the kick log), then a bounded
//! wait for each target's outcome. `--dry-run` shows what the planner would decide.
//!
//! The kick is taken as a report from this machine (`certname`, Puppet's setting):
//! the policy applies to it as to that server's reports (its role in the index,
//! else `kick.policy`'s `*` rule), and its rate limit is that server's.

use crate::error::{Error, Result};
use crate::kick::{now_ms, Event, KickSpec, Millis, Progress, ReportKicks, Resolved, ResolvedKick, Selector};
use crate::service::Service;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// Servers with any of these roles (`--role`).
    #[serde(default)]
    roles: Vec<String>,
    /// Servers matching every clause (`--facts`).
    #[serde(default)]
    clauses: Vec<String>,
    /// The targets' environment.
    environment: String,
    /// Who kicks: this machine's certname.
    certname: String,
    /// Decide, record nothing, send nothing.
    #[serde(default)]
    dry_run: bool,
    /// Longest wait for the outcomes, in seconds; `kick.exit_wait` when absent.
    wait: Option<u64>,
}

/// Longest `--wait` taken: an operator's command, not a daemon.
const MAX_WAIT_SECONDS: u64 = 3600;
/// How often the outcomes are looked at while waiting.
const POLL: Duration = Duration::from_millis(100);

/// The exit codes of `puppet kicker kick` (Puppet's own error is 1).
pub const EXIT_FAILED: i32 = 2;
pub const EXIT_NO_TARGET: i32 = 3;
pub const EXIT_NOT_STARTED: i32 = 4;

/// `{"certname", "environment", "resource", "dry_run", "targets": [{"certname", "role",
/// "outcome", "detail"}], "messages": [..], "exit_code"}`.
pub fn run(service: &Service, args: Args) -> Result<Value> {
    let report = report(&args)?;
    let since = now_ms();
    let kick = if args.dry_run { service.preview_operator(&report)? } else { service.kick_operator(&report)? };
    let events = &kick.events;
    let mut rows = rows(&kick.resolved, events, &report.host, args.dry_run);
    for row in rows.iter_mut().filter(|row| row.waiting.is_some()) {
        row.waiting = kick.attempts_before.get(&row.certname).copied().or(Some(0));
    }
    if !args.dry_run {
        let wait = match args.wait {
            Some(seconds) => Duration::from_secs(seconds),
            None => service.config().kick.exit_wait,
        };
        // An explicit --wait waits for each run's report too: confirmed, failed or not.
        let confirm = args.wait.is_some();
        wait_for_outcomes(service, &mut rows, since, wait, confirm)?;
        // The status file (what `status` and `metrics` read) shows what was waited
        // for before this process exits.
        service.kicks()?.flush(Duration::ZERO);
    }
    let messages: Vec<String> = events.iter().filter(|e| applies_to_all(e)).map(ToString::to_string).collect();
    Ok(json!({
        "certname": report.host,
        "environment": report.environment,
        "resource": report.kicks[0].resource,
        "dry_run": args.dry_run,
        "targets": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "messages": messages,
        "exit_code": exit_code(&rows),
    }))
}

/// The kick as a report from this machine would carry it.
fn report(args: &Args) -> Result<ReportKicks> {
    let bad = |what: &str| Error::Query(format!("puppet kicker kick: {what}"));
    let (selector, option) = match (args.roles.is_empty(), args.clauses.is_empty()) {
        (false, true) => (Selector::Roles(args.roles.clone()), format!("--role {}", args.roles.join(","))),
        (true, false) => (Selector::Facts(args.clauses.clone()), format!("--facts {}", args.clauses.join(" "))),
        _ => return Err(bad("give either --role ROLE or --facts CLAUSE...")),
    };
    if args.certname.is_empty() {
        return Err(bad("no certname (Puppet's certname setting) to kick as"));
    }
    if args.wait.is_some_and(|w| w > MAX_WAIT_SECONDS) {
        return Err(bad(&format!("--wait {} is more than {MAX_WAIT_SECONDS} seconds", args.wait.unwrap_or(0))));
    }
    Ok(ReportKicks {
        host: args.certname.clone(),
        environment: args.environment.clone(),
        run_started: now_ms(),
        noop: false,
        kicks: vec![KickSpec {
            resource: format!("puppet kicker kick {option} --environment {}", args.environment),
            selector,
            environment: None,
        }],
        reporter_pid: None,
        status: None,
    })
}

/// One target's line of the table.
struct Row {
    certname: String,
    role: Option<String>,
    outcome: &'static str,
    detail: String,
    /// Still to be looked at while waiting: the attempts its kick had made before
    /// this one (it may have joined a kick in backoff; those failures are not news).
    waiting: Option<u32>,
}

impl Row {
    fn to_json(&self) -> Value {
        json!({"certname": self.certname, "role": self.role, "outcome": self.outcome, "detail": self.detail})
    }

    fn settle(&mut self, outcome: &'static str, detail: String) {
        self.outcome = outcome;
        self.detail = detail;
        self.waiting = None;
    }
}

/// A row per target the kick resolved to, in the index's order, with what the
/// planner decided for it; a whole-kick refusal (rate limit, budget) fills every row
/// (or one `-` row when it stopped the kick before any target was found).
fn rows(resolved: &Resolved, events: &[Event], source: &str, dry_run: bool) -> Vec<Row> {
    let targets = match resolved.kicks.first() {
        Some((_, ResolvedKick::Targets(targets))) => targets.clone(),
        _ => Vec::new(),
    };
    let mut rows: Vec<Row> = targets
        .into_iter()
        .map(|t| Row { certname: t.certname, role: t.role, outcome: "unknown", detail: String::new(), waiting: None })
        .collect();
    for event in events {
        match event {
            Event::Suppressed { target: None, reason, .. } => {
                if rows.is_empty() {
                    rows.push(Row {
                        certname: "-".into(),
                        role: None,
                        outcome: "",
                        detail: String::new(),
                        waiting: None,
                    });
                }
                rows.iter_mut().for_each(|row| row.settle("suppressed", reason.why(source)));
            }
            Event::Suppressed { target: Some(target), reason, .. } => {
                for_target(&mut rows, target, |row| row.settle("suppressed", reason.why(source)));
            }
            Event::Queued { target, chain, .. } | Event::Coalesced { target, chain } => {
                let joined = matches!(event, Event::Coalesced { .. });
                for_target(&mut rows, target, |row| {
                    let (outcome, detail) = match (dry_run, joined) {
                        (true, false) => ("would kick", format!("chain {chain}")),
                        (true, true) => ("would kick", format!("joins the kick already queued (chain {chain})")),
                        (false, false) => ("queued", format!("chain {chain}")),
                        (false, true) => ("queued", format!("joined the kick already queued (chain {chain})")),
                    };
                    row.settle(outcome, detail);
                    row.waiting = (!dry_run).then_some(0);
                });
            }
            Event::FollowUp { target, chain } => for_target(&mut rows, target, |row| {
                let outcome = if dry_run { "would follow up" } else { "follow-up" };
                row.settle(outcome, format!("runs once its kicked run in progress reports (chain {chain})"));
            }),
            Event::WouldKick { target, chain } => for_target(&mut rows, target, |row| {
                row.settle("not sent", format!("kick.dry_run is on (chain {chain})"));
            }),
            _ => {}
        }
    }
    rows
}

fn for_target(rows: &mut [Row], target: &str, mut apply: impl FnMut(&mut Row)) {
    rows.iter_mut().filter(|row| row.certname == target).for_each(&mut apply);
}

/// Whole-kick lines the table cannot show per target: nothing matched, refusals.
fn applies_to_all(event: &Event) -> bool {
    matches!(event, Event::NoTargets { .. } | Event::Suppressed { target: None, .. })
}

/// Waits, up to `wait`, until every queued row has an outcome: its run started, a
/// retry was scheduled, it failed; what is left says where it stands.
fn wait_for_outcomes(service: &Service, rows: &mut [Row], since: Millis, wait: Duration, confirm: bool) -> Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        let waiting: Vec<usize> = (0..rows.len()).filter(|i| rows[*i].waiting.is_some()).collect();
        if waiting.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = waiting.iter().map(|i| rows[*i].certname.clone()).collect();
        let progress = service.kick_progress(&names, since)?;
        let last = Instant::now() >= deadline;
        for (i, progress) in waiting.into_iter().zip(progress) {
            observe(&mut rows[i], progress, last, confirm);
        }
        if last {
            return Ok(());
        }
        std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// Settles `row` when `progress` is an outcome, or at the `last` look, where it stands.
/// With `confirm`, a started run is an outcome only once its report confirms it.
fn observe(row: &mut Row, progress: Progress, last: bool, confirm: bool) {
    let before = row.waiting.unwrap_or(0);
    match progress {
        Progress::Started if confirm && !last => {}
        Progress::Started if confirm => {
            row.settle("started", "Puppet run started; no report of it yet (unconfirmed so far)".into())
        }
        Progress::Started => row.settle("started", "Puppet run started (runonce accepted)".into()),
        Progress::Confirmed { outcome, after_ms } => {
            let after = after_ms.map_or(String::new(), |ms| format!(", {} s after the kick", ms / 1000));
            match outcome.as_str() {
                "failed" => row.settle("run failed", format!("its report says the run failed{after}")),
                "changed" => row.settle("confirmed", format!("reported: changed{after}")),
                "unchanged" => row.settle("confirmed", format!("reported: unchanged{after}")),
                _ => row.settle("confirmed", format!("reported{after}")),
            }
        }
        Progress::Unconfirmed => row.settle("unconfirmed", "no report within kick.confirm_within".into()),
        Progress::Failed { why } => row.settle("failed", why),
        Progress::FollowUp => {
            row.settle("follow-up", "runs once its kicked run in progress reports".into());
        }
        Progress::Queued { due, in_flight: false, attempts, last_error: Some(why), .. } if attempts > before => {
            row.settle("retry scheduled", format!("{why}; attempt {} in {}s", attempts + 1, seconds_until(due)));
        }
        Progress::Queued { due, in_flight, held_by, .. } if last => {
            let detail = match (held_by, in_flight) {
                (Some(pid), _) => format!("waits for process {pid} (its run) to exit"),
                (None, true) => "runonce sent, no answer yet".into(),
                (None, false) => format!("due in {}s", seconds_until(due)),
            };
            row.settle("queued", detail);
        }
        Progress::Unknown if last => row.settle("unknown", "no longer in the kick state".into()),
        _ => {}
    }
}

/// Whole seconds from now until `at`, rounded up; 0 when past.
fn seconds_until(at: Millis) -> i64 {
    ((at - now_ms()).max(0) as u64).div_ceil(1000) as i64
}

/// 0: every target started or will run (a follow-up); `EXIT_FAILED`: one failed or
/// was suppressed; `EXIT_NO_TARGET`: nothing matched; `EXIT_NOT_STARTED`: one is
/// still queued (a retry scheduled, or no outcome within the wait). A dry run: 0,
/// `EXIT_FAILED` when one would be suppressed, `EXIT_NO_TARGET`.
fn exit_code(rows: &[Row]) -> i32 {
    let any = |outcomes: &[&str]| rows.iter().any(|row| outcomes.contains(&row.outcome));
    if rows.is_empty() {
        EXIT_NO_TARGET
    } else if any(&["failed", "run failed", "unconfirmed", "suppressed", "unknown"]) {
        EXIT_FAILED
    } else if any(&["queued", "retry scheduled", "not sent"]) {
        EXIT_NOT_STARTED
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kick::{Chain, Suppression, Target};

    fn target(name: &str, role: &str) -> Target {
        Target { certname: name.into(), role: Some(role.into()) }
    }

    fn resolved(targets: Vec<Target>) -> Resolved {
        Resolved { source_role: None, kicks: vec![("production".into(), ResolvedKick::Targets(targets))] }
    }

    fn outcomes(rows: &[Row]) -> Vec<(&str, &str)> {
        rows.iter().map(|r| (r.certname.as_str(), r.outcome)).collect()
    }

    #[test]
    fn each_target_gets_the_planners_decision_and_the_exit_code_follows() {
        let chain = Chain::origin("master").then("lb1");
        let events = vec![
            Event::Queued { target: "lb1".into(), chain: chain.clone(), due: 0 },
            Event::Suppressed {
                source: "master".into(),
                target: Some("lb2".into()),
                resource: "r".into(),
                reason: Suppression::Policy { source_role: None, target_role: Some("haproxy".into()) },
            },
        ];
        let rows = rows(&resolved(vec![target("lb1", "haproxy"), target("lb2", "haproxy")]), &events, "master", true);
        assert_eq!(outcomes(&rows), [("lb1", "would kick"), ("lb2", "suppressed")]);
        assert_eq!(rows[1].detail, "policy does not let role (none) kick role haproxy");
        assert_eq!(exit_code(&rows), EXIT_FAILED);
        assert_eq!(exit_code(&rows[..1]), 0);
        assert_eq!(exit_code(&[]), EXIT_NO_TARGET);
    }

    #[test]
    fn a_rate_limited_kick_suppresses_every_target() {
        let events = vec![Event::Suppressed {
            source: "master".into(),
            target: None,
            resource: "r".into(),
            reason: Suppression::RateLimited,
        }];
        let rows = rows(&resolved(vec![target("a", "x"), target("b", "x")]), &events, "master", false);
        assert_eq!(outcomes(&rows), [("a", "suppressed"), ("b", "suppressed")]);
        assert_eq!(rows[0].detail, "master exceeded its kick rate limit");
        assert!(applies_to_all(&events[0]));
    }

    #[test]
    fn a_queued_row_settles_on_its_outcome_or_says_where_it_stands_at_the_end() {
        let mut row =
            Row { certname: "a".into(), role: None, outcome: "queued", detail: String::new(), waiting: Some(1) };
        let queued = |attempts, last_error: Option<&str>| Progress::Queued {
            due: now_ms() + 30_000,
            in_flight: false,
            attempts,
            last_error: last_error.map(str::to_string),
            held_by: None,
        };
        observe(&mut row, queued(1, Some("an older failure")), false, false);
        assert_eq!((row.outcome, row.waiting), ("queued", Some(1)), "that attempt was before this kick");
        observe(&mut row, queued(2, Some("no reply")), false, false);
        assert_eq!(row.outcome, "retry scheduled");
        assert!(row.detail.starts_with("no reply; attempt 3 in "), "{}", row.detail);
        let mut row =
            Row { certname: "a".into(), role: None, outcome: "queued", detail: String::new(), waiting: Some(0) };
        observe(&mut row, queued(0, None), true, false);
        assert_eq!((row.outcome, row.detail.as_str()), ("queued", "due in 30s"));
        assert_eq!(exit_code(std::slice::from_ref(&row)), EXIT_NOT_STARTED);
    }

    #[test]
    fn a_kick_needs_one_selector_and_a_certname() {
        let args = |roles: &[&str], clauses: &[&str], certname: &str| Args {
            roles: roles.iter().map(|s| s.to_string()).collect(),
            clauses: clauses.iter().map(|s| s.to_string()).collect(),
            environment: "production".into(),
            certname: certname.into(),
            dry_run: false,
            wait: None,
        };
        let error = |a: Args| report(&a).unwrap_err().to_string();
        assert!(error(args(&[], &[], "m")).contains("give either --role ROLE or --facts CLAUSE"));
        assert!(error(args(&["a"], &["b=c"], "m")).contains("give either"));
        assert!(error(args(&["a"], &[], "")).contains("no certname"));
        let kick = report(&args(&["haproxy"], &[], "master")).unwrap();
        assert_eq!(kick.kicks[0].resource, "puppet kicker kick --role haproxy --environment production");
        assert_eq!(kick.kicks[0].selector, Selector::Roles(vec!["haproxy".into()]));
    }
}
