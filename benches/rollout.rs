//! `cargo bench --bench rollout`: planning an ordered rollout (`puppet kicker rollout
//! plan`) over the synthetic fleet of 10,000 servers (`PK_BENCH_SERVERS=N` for another
//! size), every one of them in production, given 50 roles of skewed sizes (role00 the
//! largest), 1 % with no role and 2 % with two, under a role graph of realistic shape:
//! a chain role00 -> role01 -> ... -> role49, cross edges from every fifth role to
//! the seventh after it, one cycle (role30 -> role27, closing role27 .. role30), a role
//! that kicks itself, and edges to roles no server has.
//!
//! Timed: (1) `rollout::plan` alone, from the servers and edges in memory; (2) the
//! whole command as the face calls it (`command::run`: the request parsed, every server
//! of the environment selected from the index as the functions select them, their roles
//! read, the kick state read from `kicks.msgpack`, the plan made and answered as JSON),
//! once a first call has made the index's kept answer, and that first call once.
//! Goal: the whole command within 100 ms.
//!
//! No criterion, as the other benches: each case warms up, then runs batches for about
//! a second and reports the median and mean. Markdown on stdout (the machine on
//! stderr); with `PK_BENCH_RESULTS=FILE`, `rollout_plan`, `rollout_command` and
//! `rollout_first` (nanoseconds) are appended to FILE for `script/bench --report`.

#[path = "support/report.rs"]
mod report;

use puppet_kicker::kick::{PlannerState, STATE_FILE};
use puppet_kicker::rollout::{self, Member, Options, Order};
use puppet_kicker::time::now;
use puppet_kicker::{command, synthetic, Index, PuppetSettings, Service};
use serde_json::{json, Value};
use std::fs;
use std::hint::black_box;
use std::time::{Duration, Instant};

use report::{load_average, record};

const SEED: u64 = 1;
const ROLES: usize = 50;
const ENVIRONMENT: &str = "production";
const WARM_UP: Duration = Duration::from_millis(200);
const MEASURE: Duration = Duration::from_secs(1);
const SAMPLES: u32 = 50;
const MIN_SAMPLES: usize = 5;
/// The goal of the whole command, in milliseconds.
const GOAL_MS: f64 = 100.0;

fn main() {
    let servers = std::env::var("PK_BENCH_SERVERS").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    report::print_machine("rollout");
    println!("Load average at the start: {}.\n", load_average());
    let root = std::env::temp_dir().join(format!("pk-bench-rollout-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let built_at = now();
    let nodes = fleet(servers, built_at);
    let edges = graph();

    // (1) the plan alone, from an index's servers read once.
    let index = Index::build(nodes.clone(), "role", built_at);
    let members: Vec<Member> = index
        .servers()
        .map(|server| Member { certname: server.certname(), roles: server.roles("role").collect() })
        .collect();
    let options = Options { order: Order::Graph, given: &[], batch: Some(50) };
    let planned = rollout::plan(&members, edges.iter().map(|(a, b)| (a.as_str(), b.as_str())), &options).unwrap();
    let plan = measure(|| rollout::plan(&members, edges.iter().map(|(a, b)| (a.as_str(), b.as_str())), &options));

    // (2) the whole command, through the process-wide service a face call uses.
    let facts = root.join("facts");
    let cache = root.join("cache");
    let etc = root.join("etc");
    fs::create_dir_all(&cache).unwrap();
    fs::create_dir_all(&etc).unwrap();
    synthetic::write_puppet_cache(&facts, &nodes).expect("write the synthetic fact cache");
    let config = format!("puppet_cache:\n  dirs: [{}]\ncache:\n  dir: {}\n", facts.display(), cache.display());
    fs::write(etc.join("puppet_kicker.yaml"), config).unwrap();
    let mut state = PlannerState::default();
    for (from, to) in &edges {
        state.graph.add(from, to, puppet_kicker::kick::now_ms(), 6);
    }
    fs::write(cache.join(STATE_FILE), rmp_serde::to_vec_named(&state).unwrap()).unwrap();
    Service::configure(PuppetSettings { confdir: etc, vardir: root.join("var"), ..Default::default() }).unwrap();
    let request = json!({"name": "rollout_plan", "args": {"environment": ENVIRONMENT, "batch": 50}}).to_string();
    let run = || command::run(request.as_bytes()).expect("rollout plan");
    // The cold start (the fact cache read into an index) is not the rollout's: done first.
    Service::global().unwrap().servers_with_role(&["role00"], ENVIRONMENT).unwrap();
    let first_started = Instant::now();
    let answer: Value = serde_json::from_str(&run()).unwrap();
    let first = first_started.elapsed().as_nanos() as f64;
    let whole = measure(run);

    let totals = &answer["totals"];
    assert_eq!(totals["groups"].as_u64(), Some(planned.totals.groups as u64), "the command plans what the core does");
    assert_eq!(answer["cycles"].as_array().map(Vec::len), Some(planned.cycles.len()));
    println!(
        "Fleet: {servers} servers in {ENVIRONMENT}, {ROLES} roles; graph of {} edges. The plan: {} servers (those \
         within max_age), {} groups, {} batches of at most 50, {} cycles ({}).\n",
        edges.len(),
        totals["servers"],
        totals["groups"],
        totals["batches"],
        planned.cycles.len(),
        planned.cycles.iter().map(|c| c.roles.join(", ")).collect::<Vec<_>>().join("; "),
    );
    println!("| Case | Median | Mean | Samples | Goal |");
    println!("| --- | ---: | ---: | ---: | --- |");
    row("`rollout::plan` alone (servers and edges in memory)", plan, "");
    let met = if whole.median <= GOAL_MS * 1e6 { "≤ 100 ms: met" } else { "≤ 100 ms: **missed**" };
    row("the whole command (`command::run`: select, kick state, plan, JSON)", whole, met);
    println!("| ↳ its first call in an index generation (no kept answer) | {} | | 1 | |", human(first));
    println!();
    record("rollout_plan", plan.median);
    record("rollout_command", whole.median);
    record("rollout_first", first);
    let _ = fs::remove_dir_all(&root);
    println!("Load average at the end: {}.", load_average());
}

/// The synthetic fleet, all in production, its roles replaced: 50 roles of skewed
/// sizes (about 1/(k+1)), 1 % of servers with no role, 2 % with two.
fn fleet(servers: usize, built_at: i64) -> Vec<puppet_kicker::Node> {
    let weights: Vec<f64> = (0..ROLES).map(|k| 1.0 / (k as f64 + 1.0)).collect();
    let total: f64 = weights.iter().sum();
    let mut rng = synthetic::Rng::new(SEED);
    let mut nodes = synthetic::fleet(servers, SEED, built_at);
    for node in &mut nodes {
        node.environment = ENVIRONMENT.to_string();
        node.facts.insert("environment".into(), json!(ENVIRONMENT));
        let pick = |rng: &mut synthetic::Rng| {
            let mut at = rng.unit() * total;
            weights.iter().position(|w| {
                at -= w;
                at <= 0.0
            })
        };
        let first = pick(&mut rng).unwrap_or(ROLES - 1);
        let role = |k: usize| format!("role{k:02}");
        match rng.below(100) {
            0 => {
                node.facts.remove("role");
            }
            1 | 2 => {
                let second = pick(&mut rng).unwrap_or(0);
                node.facts.insert("role".into(), json!([role(first), role(second)]));
            }
            _ => {
                node.facts.insert("role".into(), json!(role(first)));
            }
        }
    }
    nodes
}

/// The role graph: the chain, cross edges, one cycle, a self-kick and strangers.
fn graph() -> Vec<(String, String)> {
    let role = |k: usize| format!("role{k:02}");
    let mut edges: Vec<(String, String)> = (1..ROLES).map(|k| (role(k - 1), role(k))).collect();
    edges.extend((0..ROLES - 7).step_by(5).map(|k| (role(k), role(k + 7))));
    edges.push((role(30), role(27)));
    edges.push((role(12), role(12)));
    edges.push((role(3), "retired".to_string()));
    edges.push(("legacy".to_string(), role(40)));
    edges
}

#[derive(Clone, Copy)]
struct Stats {
    median: f64,
    mean: f64,
    samples: usize,
}

fn measure<T>(mut op: impl FnMut() -> T) -> Stats {
    let warm = Instant::now();
    let mut warm_iterations = 0u64;
    while warm_iterations == 0 || warm.elapsed() < WARM_UP {
        black_box(op());
        warm_iterations += 1;
    }
    let per_op = warm.elapsed().as_nanos() as f64 / warm_iterations as f64;
    let batch = ((MEASURE.as_nanos() as f64 / f64::from(SAMPLES) / per_op) as u64).max(1);
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < MIN_SAMPLES || start.elapsed() < MEASURE {
        let t = Instant::now();
        for _ in 0..batch {
            black_box(op());
        }
        samples.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 { samples[n / 2] } else { (samples[n / 2 - 1] + samples[n / 2]) / 2.0 };
    Stats { median, mean: samples.iter().sum::<f64>() / n as f64, samples: n }
}

fn row(name: &str, stats: Stats, goal: &str) {
    println!("| {name} | {} | {} | {} | {goal} |", human(stats.median), human(stats.mean), stats.samples);
}

fn human(nanos: f64) -> String {
    match nanos {
        n if n < 1e3 => format!("{n:.0} ns"),
        n if n < 1e6 => format!("{:.2} µs", n / 1e3),
        n if n < 1e9 => format!("{:.2} ms", n / 1e6),
        n => format!("{:.2} s", n / 1e9),
    }
}
