//! `cargo bench --bench shared_state`: what `kick.state: postgresql` costs, side by
//! side with the local state, in one run, against a real PostgreSQL 15 started for
//! the run (tests/support/postgres.rs: 127.0.0.1, TLS, a password; fsync on).
//!
//! (1) **Per report, at 100 reports/s over two compilers.** Two kick services stand
//!     for two compilers; reports arrive at 50 a second at each on average, at random
//!     (a Poisson process with a fixed seed, so every run has the same times), on its
//!     own thread, for 30 seconds. A tenth of the reports kick (a load balancer role of 10
//!     servers, as a new web node does; each from a host of its own); the rest kick
//!     nothing (most reports). The time is that of `KickService::report` on the
//!     report's thread (the planner's resolve included), p50 and p99 of each kind.
//!     Local: each compiler with its own `kicks.msgpack` (what two compilers had
//!     before); shared: both on one state in PostgreSQL. Three runs of each, local
//!     and shared alternating, each from an empty state, their times pooled (the
//!     p99 of one run is its third-slowest kicking report; each run's is printed
//!     too). The goal: p99 ≤ 2 ms. The load balancers never report, so each kick
//!     keeps the servers that kicked it as causes (16 named, the rest counted): the
//!     shared state's size at the end is printed, and how PostgreSQL stores it.
//! (2) **10,000 due kicks claimed and dispatched by two compilers.** One report
//!     kicks a role of 10,000 servers (the budget raised for it), due one second
//!     later; both compilers' dispatchers wake for them. The time from the due time
//!     to every kick's outcome saved, and how many each compiler sent (each kick
//!     once: checked). Local: one compiler alone, its own file, for comparison.
//!
//! Markdown on stdout; with `PK_BENCH_RESULTS`, the figures for `script/bench --report`.
//! `PK_BENCH_ONLY=report` runs (1) alone, `PK_BENCH_ONLY=due` (2) alone.
//! `PK_BENCH_ONLY=store` runs neither: the PostgreSQL store's own transactions, one
//! thread, no other compiler (what a transaction costs without waiting for the row):
//! 2,000 that change nothing (`begin`, `release`: a dispatcher's wakeup) and 300 that
//! save (`begin`, `commit`, the commit synced to disk).

#[path = "support/report.rs"]
mod report;
#[path = "../tests/support/mod.rs"]
mod support;

use puppet_kicker::config::{Config, PuppetSettings};
use puppet_kicker::kick::postgresql::{PgStore, SharedStore};
use puppet_kicker::kick::{
    Dispatch, KickConfig, KickService, Outcome, ReportBudget, ReportKicks, Selector, StateStore, Target, Transport,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::postgres::{self, Postgres};

const RATE_PER_COMPILER: u64 = 50;
const SECONDS: u64 = 30;
/// Runs of (1) for each state, local and shared alternating, their times pooled: the
/// p99 of one run is its third-slowest kicking report of 300, which moves from run
/// to run by more than the difference between the states.
const RUNS: usize = 3;
const BALANCERS: usize = 10;
const DUE_KICKS: usize = 10_000;

/// One state's times over the runs of (1): its kicking and other reports' pooled,
/// and each run's kicking p99.
#[derive(Default)]
struct Pooled {
    kicking: Vec<Duration>,
    quiet: Vec<Duration>,
    each_p99: Vec<Duration>,
}

/// Answers every `runonce` at once, "started", and counts them by target.
#[derive(Clone, Default)]
struct Counting(Arc<Mutex<BTreeMap<String, u32>>>);

impl Transport for Counting {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        *self.0.lock().unwrap().entry(dispatch.target.clone()).or_default() += 1;
        Outcome::Started
    }

    fn max_parallel(&self) -> usize {
        32
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pk-bench-shared-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn connection_of(pg: &Postgres, schema: &str) -> puppet_kicker::kick::postgresql::Connection {
    let yaml = format!(
        "kick:\n  state: postgresql\n  postgresql:\n    host: 127.0.0.1\n    port: {}\n    database: {}\n    user: {}\n    schema: {schema}\n    ca: {}\n    cert: {}\n    key: {}\n    password_file: {}\n",
        pg.port,
        postgres::DATABASE,
        postgres::USER,
        pg.ca.display(),
        pg.cert.display(),
        pg.key.display(),
        pg.password_file.display()
    );
    let settings = PuppetSettings::default();
    let parsed = Config::parse(&yaml, Path::new("/etc/puppet/puppet_kicker.yaml"), &settings).unwrap();
    parsed.kick.postgresql.connection(&settings).unwrap()
}

fn shared(pg: &Postgres, schema: &str, dir: &Path, config: KickConfig, transport: &Counting) -> KickService {
    let mut store = PgStore::new(connection_of(pg, schema), schema, 2, "bench");
    store.check().unwrap();
    let store = SharedStore::new(store, dir, config.keep_outcomes);
    KickService::start_with(config, dir, Box::new(store), Vec::new(), Ok(Box::new(transport.clone())), Box::new(|| {}))
        .unwrap()
}

fn local(dir: &Path, config: KickConfig, transport: &Counting) -> KickService {
    KickService::start(config, dir, Ok(Box::new(transport.clone())), Box::new(|| {})).unwrap()
}

fn report_of(host: &str, kicks: bool) -> ReportKicks {
    let kicks = if kicks { r#"[{"resource":"Kick[lb]","roles":["lb"]}]"# } else { "[]" };
    let json = format!(
        r#"{{"host":"{host}","environment":"production","time":{},"status":"changed","kicks":{kicks}}}"#,
        puppet_kicker::kick::now_ms()
    );
    puppet_kicker::kick::parse_report(json.as_bytes()).unwrap()
}

fn targets(role: &str, n: usize) -> Vec<Target> {
    (0..n).map(|i| Target { certname: format!("{role}-{i:05}.example.com"), role: Some(role.into()) }).collect()
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    values[((values.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// When reports arrive at a compiler: at random, at `RATE_PER_COMPILER` a second on
/// average (a Poisson process: agents' runs are spread by `splay` and their own
/// run times, not in step), the same times at every run (a fixed seed per compiler).
struct Arrivals {
    state: u64,
    at: Duration,
}

impl Arrivals {
    fn new(compiler: u64) -> Arrivals {
        Arrivals { state: 0x5eed_0000 + compiler, at: Duration::ZERO }
    }

    /// The next arrival, from the start: an exponential gap after the last
    /// (splitmix64 for the uniform draw).
    fn next_after(&mut self) -> Duration {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let uniform = ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        self.at += Duration::from_secs_f64(-uniform.ln() / RATE_PER_COMPILER as f64);
        self.at
    }
}

/// The size of the state saved in `schema`, encoded as the store writes it.
fn state_size(pg: &Postgres, schema: &str, config: &KickConfig) -> usize {
    let dir = scratch("size");
    let mut store =
        SharedStore::new(PgStore::new(connection_of(pg, schema), schema, 1, "bench"), &dir, config.keep_outcomes);
    let state = store.load().unwrap();
    let _ = std::fs::remove_dir_all(dir);
    rmp_serde::to_vec_named(&state).unwrap().len()
}

/// (1): each compiler's reports at its rate on a thread of its own; the times of the
/// kicking reports and of the others.
fn per_report(compilers: &[KickService; 2]) -> (Vec<Duration>, Vec<Duration>) {
    let balancers = targets("lb", BALANCERS);
    let times = std::thread::scope(|scope| {
        let threads: Vec<_> = compilers
            .iter()
            .enumerate()
            .map(|(c, service)| {
                let balancers = &balancers;
                scope.spawn(move || {
                    let mut kicking = Vec::new();
                    let mut quiet = Vec::new();
                    let mut arrivals = Arrivals::new(c as u64);
                    let start = Instant::now();
                    for i in 0..(RATE_PER_COMPILER * SECONDS) as usize {
                        let at = start + arrivals.next_after();
                        if let Some(wait) = at.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let kicks = i % 10 == 0;
                        let report = report_of(&format!("web-{c}-{i:05}.example.com"), kicks);
                        let resolve = |_: &Selector, _: &str| balancers.clone();
                        let t0 = Instant::now();
                        let lines = service.report(&report, resolve, |_| Some("web".into()));
                        let took = t0.elapsed();
                        std::hint::black_box(lines);
                        if kicks {
                            kicking.push(took)
                        } else {
                            quiet.push(took)
                        }
                    }
                    (kicking, quiet)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    });
    let mut kicking = Vec::new();
    let mut quiet = Vec::new();
    for (k, q) in times {
        kicking.extend(k);
        quiet.extend(q);
    }
    (kicking, quiet)
}

/// (2): one report queues `DUE_KICKS` kicks due in a second; the time from then
/// until every outcome is saved, and the kicks each compiler sent.
fn due_kicks(compilers: &[&KickService], counters: &[&Counting]) -> (Duration, Vec<u32>) {
    let fleet = targets("app", DUE_KICKS);
    let report = {
        let json = format!(
            r#"{{"host":"deployer.example.com","environment":"production","time":{},"kicks":[{{"resource":"Kick[app]","roles":["app"]}}]}}"#,
            puppet_kicker::kick::now_ms()
        );
        puppet_kicker::kick::parse_report(json.as_bytes()).unwrap()
    };
    compilers[0].report(&report, |_, _| fleet.clone(), |_| Some("deployer".into()));
    let queued = Instant::now();
    // Every compiler knows of them before they are due (its dispatcher wakes then).
    for c in compilers {
        c.sync();
        c.wake();
    }
    let due = queued + Duration::from_secs(1);
    for c in compilers {
        assert_eq!(c.flush(Duration::from_secs(600)), 0, "every due kick sent");
    }
    let took = Instant::now().saturating_duration_since(due);
    let sent: Vec<u32> = counters.iter().map(|c| c.0.lock().unwrap().values().sum()).collect();
    let mut each: BTreeMap<String, u32> = BTreeMap::new();
    for c in counters {
        for (target, n) in c.0.lock().unwrap().iter() {
            *each.entry(target.clone()).or_default() += n;
        }
    }
    assert_eq!(each.len(), DUE_KICKS, "every kick sent");
    assert!(each.values().all(|n| *n == 1), "each kick once");
    (took, sent)
}

/// `PK_BENCH_ONLY=store`: the store's transactions alone (see the header).
fn store_transactions(pg: &Postgres, config: &KickConfig) {
    use puppet_kicker::kick::StateStore;
    let dir = scratch("store");
    let service = shared(pg, "store_only", &dir, config.clone(), &Counting::default());
    // A state of the size (1) reaches: a role of 10 kicked, a few hundred reporters.
    for i in 0..300 {
        service.report(
            &report_of(&format!("web-{i:05}.example.com"), i % 10 == 0),
            |_, _| targets("lb", 10),
            |_| Some("web".into()),
        );
    }
    drop(service);
    let store_dir = scratch("store-b");
    let mut pg_store = PgStore::new(connection_of(pg, "store_only"), "store_only", 2, "bench");
    pg_store.check().unwrap();
    let mut store = SharedStore::new(pg_store, &store_dir, config.keep_outcomes);
    let mut state = store.load().unwrap();
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for _ in 0..2_000 {
        let t0 = Instant::now();
        let begun = store.begin(state.generation);
        assert!(begun.theirs.is_none());
        store.release();
        reads.push(t0.elapsed());
    }
    for _ in 0..300 {
        let t0 = Instant::now();
        let _ = store.begin(state.generation);
        state.generation += 1;
        store.commit(&state).unwrap();
        writes.push(t0.elapsed());
    }
    println!(
        "PostgreSQL store alone, one thread ({} bytes of state):\n",
        rmp_serde::to_vec_named(&state).unwrap().len()
    );
    println!("| Transaction | p50 | p90 | p99 |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, times) in [("begin, release", &mut reads), ("begin, commit", &mut writes)] {
        let (p50, p90, p99) = (percentile(times, 0.5), percentile(times, 0.9), percentile(times, 0.99));
        println!("| {name} | {} | {} | {} |", ms(p50), ms(p90), ms(p99));
    }
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(store_dir);
}

fn main() {
    report::print_machine("shared_state");
    let pg = Postgres::start("bench");
    let config =
        KickConfig { budget: ReportBudget { kicks: 32, clauses: 128, targets: DUE_KICKS }, ..KickConfig::default() };
    println!("### Shared kick state: PostgreSQL next to the local state\n");
    println!(
        "PostgreSQL 15 on 127.0.0.1 (TLS, scram password, fsync on), started for this run. Load average at start: {}.\n",
        report::load_average()
    );

    // (1)
    println!(
        "Per report, at {} reports/s over two compilers, at random times, for {SECONDS} s, {RUNS} runs of each state (one in ten kicks a role of {BALANCERS}):\n",
        RATE_PER_COMPILER * 2
    );
    println!("| State | Kicking reports p50 | p99 | Other reports p50 | p99 |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let only = std::env::var("PK_BENCH_ONLY").ok();
    if only.as_deref() == Some("store") {
        store_transactions(&pg, &config);
        return;
    }
    let only_due = only.as_deref() == Some("due");
    let mut shared_size = None;
    let kinds: &[&str] = if only_due { &[] } else { &["local", "postgresql"] };
    let mut pooled: BTreeMap<&str, Pooled> = BTreeMap::new();
    for run in 0..RUNS {
        for &kind in kinds {
            let (a_dir, b_dir) = (scratch(&format!("{kind}-a")), scratch(&format!("{kind}-b")));
            let counting = Counting::default();
            // A schema of its own per run: each starts from an empty state, as the local files do.
            let schema = format!("per_report_{run}");
            let compilers = match kind {
                "local" => [local(&a_dir, config.clone(), &counting), local(&b_dir, config.clone(), &counting)],
                _ => [
                    shared(&pg, &schema, &a_dir, config.clone(), &counting),
                    shared(&pg, &schema, &b_dir, config.clone(), &counting),
                ],
            };
            let (mut kicking, quiet) = per_report(&compilers);
            let this_run = percentile(&mut kicking, 0.99);
            let entry = pooled.entry(kind).or_default();
            entry.kicking.extend(kicking);
            entry.quiet.extend(quiet);
            entry.each_p99.push(this_run);
            drop(compilers);
            let _ = std::fs::remove_dir_all(a_dir);
            let _ = std::fs::remove_dir_all(b_dir);
            if kind == "postgresql" && run + 1 == RUNS {
                // As PostgreSQL keeps it: compressed; in the row, unless its TOAST
                // table ever took a chunk of it.
                let stored = pg.psql(&format!(
                    "SELECT pg_column_size(state) || ' bytes, ' || CASE WHEN pg_relation_size(c.reltoastrelid) = 0 \
                     THEN 'in the row' ELSE 'out of line (at least once during the run)' END \
                     FROM {schema}.kick_state, pg_class c WHERE c.oid = '{schema}.kick_state'::regclass"
                ));
                shared_size = Some((state_size(&pg, &schema, &config), stored));
            }
        }
    }
    for &kind in kinds {
        let Pooled { kicking, quiet, .. } = pooled.get_mut(kind).expect("each state ran");
        let (k50, k99) = (percentile(kicking, 0.5), percentile(kicking, 0.99));
        let (q50, q99) = (percentile(quiet, 0.5), percentile(quiet, 0.99));
        println!("| {kind} | {} | {} | {} | {} |", ms(k50), ms(k99), ms(q50), ms(q99));
        for (key, d) in [("kicking_p50", k50), ("kicking_p99", k99), ("other_p50", q50), ("other_p99", q99)] {
            report::record(&format!("shared_{kind}_{key}"), d.as_nanos() as f64);
        }
    }
    if !kinds.is_empty() {
        let each = |kind: &str| pooled[kind].each_p99.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ");
        println!(
            "\nThe times of {RUNS} runs of {SECONDS} s each, local and shared alternating (each from an empty state), pooled. \
             The kicking reports' p99 of each run alone: local {}; postgresql {}.",
            each("local"),
            each("postgresql")
        );
    }
    if let Some((bytes, stored)) = shared_size {
        println!(
            "\nThe shared state after the run: {bytes} bytes of MessagePack, stored by PostgreSQL in {stored}; each transaction reads it (when another compiler changed it) and writes it whole."
        );
        report::record("shared_state_bytes", bytes as f64);
    }

    // (2)
    if only.as_deref() == Some("report") {
        return;
    }
    println!("\n{DUE_KICKS} due kicks (one report), claimed and dispatched (32 at a time per compiler):\n");
    println!("| State | Compilers | From due to every outcome saved | Sent by each |");
    println!("| --- | ---: | ---: | --- |");
    {
        let dir = scratch("due-local");
        let counting = Counting::default();
        let only = local(&dir, config.clone(), &counting);
        let (took, sent) = due_kicks(&[&only], &[&counting]);
        println!("| local | 1 | {} | {sent:?} |", ms(took));
        let size = std::fs::metadata(dir.join(puppet_kicker::kick::STATE_FILE)).map_or(0, |m| m.len());
        eprintln!("kick state after: {size} bytes, generation {}", only.status()["generation"]);
        report::record("shared_due_local", took.as_nanos() as f64);
        drop(only);
        let _ = std::fs::remove_dir_all(dir);
    }
    {
        let (a_dir, b_dir) = (scratch("due-a"), scratch("due-b"));
        let (ca, cb) = (Counting::default(), Counting::default());
        let a = shared(&pg, "due_kicks", &a_dir, config.clone(), &ca);
        let b = shared(&pg, "due_kicks", &b_dir, config.clone(), &cb);
        let (took, sent) = due_kicks(&[&a, &b], &[&ca, &cb]);
        println!("| postgresql | 2 | {} | {sent:?} |", ms(took));
        report::record("shared_due_postgresql", took.as_nanos() as f64);
        drop((a, b));
        let _ = std::fs::remove_dir_all(a_dir);
        let _ = std::fs::remove_dir_all(b_dir);
    }
}
