//! `cargo bench --bench confirm`: what confirming kicks costs the `kick` report
//! processor, per report. Every report of a server that compiles against the master
//! passes through it; one of a kicked server's run confirms the kick.
//!
//! Side by side, in one run, on the same fleet of 1,000 servers (each kicked once
//! by one report, each `runonce` answered "started" at once):
//!
//! (1) **The planner** (`Planner::on_resolved`, the state machine the report's
//!     thread runs under the kick state's lock): a report of each server that
//!     confirms its kick, then a report of each with no kick pending (nothing to
//!     confirm: the lookup only). Pure CPU, in memory.
//! (2) **The report's whole path in the core** (`parse_report` of the JSON the Ruby
//!     processor sends, then `KickService::report`: the kick state's file lock, its
//!     check for another process's write, the planner, and the state's save when
//!     something changed): the same two kinds of report. A report that ends a
//!     kicked run was saved (with an fsync) before confirmations existed too, to end
//!     that run. Such a report (no kick of its own) is now queued for the kick
//!     dispatcher's next transaction, which takes in all that arrived meanwhile and
//!     saves them in one write: the report's thread waits for neither. So the
//!     section also times (3) until every one of the 1,000 confirmations is saved.
//!
//! Medians and 99th percentiles per report; the goal is 50 µs per report.
//! Markdown on stdout; with `PK_BENCH_RESULTS`, the figures for `script/bench --report`.

#[path = "support/report.rs"]
mod report;

use puppet_kicker::kick::{
    parse_report, Dispatch, KickConfig, KickService, Outcome, Planner, PlannerState, ReportKicks, Selector, Target,
    Transport,
};
use std::time::{Duration, Instant};

const SERVERS: usize = 1_000;
const ROUNDS: usize = 5;

fn server(i: usize) -> String {
    format!("web-{i:04}.example.com")
}

/// Answers every `runonce`: started.
struct Started;

impl Transport for Started {
    fn runonce(&self, _: &Dispatch) -> Outcome {
        Outcome::Started
    }
}

fn fleet() -> Vec<Target> {
    (0..SERVERS).map(|i| Target { certname: server(i), role: Some("web".into()) }).collect()
}

/// The kick of every server, from node1's report.
fn kick_all() -> ReportKicks {
    let json = format!(
        r#"{{"host":"node1.example.com","environment":"production","time":{},"status":"changed",
            "kicks":[{{"resource":"Kick[web]","roles":["web"]}}]}}"#,
        puppet_kicker::kick::now_ms()
    );
    parse_report(json.as_bytes()).unwrap()
}

/// The JSON the Ruby processor sends for server `i`'s run, with no kick of its own.
fn run_report(i: usize, started: i64) -> Vec<u8> {
    format!(r#"{{"host":"{}","environment":"production","time":{started},"status":"changed","kicks":[]}}"#, server(i))
        .into_bytes()
}

fn percentile(mut values: Vec<Duration>, p: f64) -> Duration {
    values.sort();
    values[((values.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// (1): per-report times of confirming reports, then of reports with nothing pending.
fn planner() -> (Vec<Duration>, Vec<Duration>) {
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let (mut confirming, mut nothing) = (Vec::new(), Vec::new());
    let targets = fleet();
    for _ in 0..ROUNDS {
        let mut planner = Planner::new(config.clone(), PlannerState::default());
        let now = puppet_kicker::kick::now_ms();
        let role_of = |_: &str| Some("web".to_string());
        planner.on_report(&kick_all(), now, |_: &Selector, _: &str| targets.clone(), role_of);
        let (dispatches, _) = planner.due(now);
        assert_eq!(dispatches.len(), SERVERS);
        for d in &dispatches {
            planner.on_outcome(&d.target, Outcome::Started, now);
        }
        assert_eq!(planner.awaiting().count(), SERVERS);
        for round in [&mut confirming, &mut nothing] {
            for i in 0..SERVERS {
                let report = parse_report(&run_report(i, now + 1_000)).unwrap();
                let resolved = Planner::resolve(planner.config(), &report, |_, _| Vec::new(), role_of);
                let started = Instant::now();
                let events = planner.on_resolved(&report, resolved, now + 2_000);
                round.push(started.elapsed());
                std::hint::black_box(events);
            }
        }
        assert_eq!(planner.awaiting().count(), 0, "every kick confirmed");
        assert_eq!(planner.state().counters.confirmed_changed, SERVERS as u64);
    }
    (confirming, nothing)
}

/// (2): the same through `parse_report` and `KickService::report`, state on disk.
fn service() -> (Vec<Duration>, Vec<Duration>, Vec<Duration>) {
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let (mut confirming, mut nothing, mut drained) = (Vec::new(), Vec::new(), Vec::new());
    let targets = fleet();
    for round in 0..ROUNDS {
        let dir = std::env::temp_dir().join(format!("pk-bench-confirm-{}-{round}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let kicks = KickService::start(config.clone(), &dir, Ok(Box::new(Started)), Box::new(|| {})).unwrap();
        let role_of = |_: &str| Some("web".to_string());
        kicks.report(&kick_all(), |_: &Selector, _: &str| targets.clone(), role_of);
        assert_eq!(kicks.flush(Duration::from_secs(60)), 0, "every kick sent");
        let awaiting = || kicks.status()["awaiting_confirmation"].as_array().map_or(0, Vec::len);
        let deadline = Instant::now() + Duration::from_secs(60);
        while awaiting() < SERVERS {
            assert!(Instant::now() < deadline, "{} of {SERVERS} kicks started", awaiting());
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = puppet_kicker::kick::now_ms();
        let mut first = true;
        for times in [&mut confirming, &mut nothing] {
            let since = Instant::now();
            for i in 0..SERVERS {
                let json = run_report(i, started);
                let t0 = Instant::now();
                let report = parse_report(&json).unwrap();
                let lines = kicks.report(&report, |_, _| Vec::new(), role_of);
                times.push(t0.elapsed());
                std::hint::black_box(lines);
            }
            if std::mem::take(&mut first) {
                let state_file = dir.join(puppet_kicker::kick::STATE_FILE);
                let saved = || puppet_kicker::kick::load_state(&dir).map_or(0, |s| s.counters.confirmed_changed);
                while saved() < SERVERS as u64 {
                    assert!(since.elapsed() < Duration::from_secs(120), "{} not saved", state_file.display());
                    std::thread::sleep(Duration::from_millis(1));
                }
                drained.push(since.elapsed());
            }
        }
        assert_eq!(awaiting(), 0, "every kick confirmed");
        drop(kicks);
        let _ = std::fs::remove_dir_all(&dir);
    }
    (confirming, nothing, drained)
}

fn main() {
    report::print_machine("confirm");
    let (planner_confirming, planner_nothing) = planner();
    let (service_confirming, service_nothing, drained) = service();
    println!(
        "{SERVERS} servers, each kicked once; {ROUNDS} rounds of a report of each; load average {}.\n",
        report::load_average()
    );
    println!("| Per report | Confirms its kick: median | p99 | Nothing pending: median | p99 | Goal |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    let rows = [
        ("The planner (`Planner::on_resolved`)", "planner", planner_confirming, planner_nothing),
        (
            "The core's report path (`parse_report` + `KickService::report`)",
            "service",
            service_confirming,
            service_nothing,
        ),
    ];
    for (name, key, confirming, nothing) in rows {
        let (c50, c99) = (percentile(confirming.clone(), 0.5), percentile(confirming, 0.99));
        let (n50, n99) = (percentile(nothing.clone(), 0.5), percentile(nothing, 0.99));
        println!("| {name} | {} | {} | {} | {} | ≤ 50 µs |", us(c50), us(c99), us(n50), us(n99));
        report::record(&format!("confirm_{key}_confirming"), c50.as_nanos() as f64);
        report::record(&format!("confirm_{key}_nothing"), n50.as_nanos() as f64);
    }
    let all: Vec<String> = drained.iter().map(|d| format!("{:.1} ms", d.as_secs_f64() * 1e3)).collect();
    println!(
        "\n(3) From the first of the {SERVERS} confirming reports until all {SERVERS} confirmations are saved: \
         {:.1} ms median ({}).",
        percentile(drained.clone(), 0.5).as_secs_f64() * 1e3,
        all.join(", ")
    );
    report::record("confirm_drain", percentile(drained, 0.5).as_nanos() as f64);
}
