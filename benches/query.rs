//! `cargo bench --bench query`: puppet-kicker's index next to the alternatives it
//! replaces, on a synthetic fleet of 10,000 servers (`puppet_kicker::synthetic`;
//! `PK_BENCH_SERVERS=N` for another size; `PK_BENCH_ONLY=loading` for (d) and (e) alone;
//! `PK_BENCH_ONLY=scaling` for the figures `script/bench --report`'s scaling table
//! compares between fleet sizes).
//!
//! (a) `servers_with_role`: inverted index vs a scan of every server;
//! (b) `servers_with_facts` shapes: the store-backed index vs the serde_json index
//!     it replaced (`index::reference`) vs a scan with `Query::matches`;
//! (c) both through the whole `Service` a compile calls (clause cache included);
//! (d) building the index, the snapshot, vs re-reading the JSON (and the legacy
//!     YAML) fact cache.
//!
//! `PK_BENCH_ONLY=refresh` runs only what a refresh costs: `SourceRead::into_index` of
//! a full read and the incremental refreshes of table (d).
//!
//! No criterion: each case warms up, then runs batches for about a second (at least
//! three samples for slow cases) and reports the median and mean time per operation.
//! Markdown on stdout (the machine on stderr); with `PK_BENCH_RESULTS=FILE`, the figures
//! the report's summary and scaling table use are appended to FILE, a JSON object a line.

#[path = "support/report.rs"]
mod report;

use puppet_kicker::facts::Node;
use puppet_kicker::index::reference;
use puppet_kicker::query::ClauseCache;
use puppet_kicker::snapshot::{self, SnapshotRef};
use puppet_kicker::source::puppet_cache;
use puppet_kicker::time::now;
use puppet_kicker::{synthetic, Freshness, Index, PuppetSettings, Query, RoleSelector, Service};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use report::{load_average, record};

fn fleet_size() -> usize {
    std::env::var("PK_BENCH_SERVERS").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000)
}
/// Whether only the loading tables run (`PK_BENCH_ONLY=loading`): what a change to
/// the readers needs, in a fraction of the time.
fn loading_only() -> bool {
    only("loading")
}
/// Whether only the figures of the scaling table run (`PK_BENCH_ONLY=scaling`): one
/// query of each kind, the loading and refresh figures, the cold starts.
fn scaling_only() -> bool {
    only("scaling")
}
fn only(part: &str) -> bool {
    std::env::var("PK_BENCH_ONLY").is_ok_and(|only| only == part)
}
const SEED: u64 = 1;
const ENVIRONMENT: &str = "production";
const ROLE_FACT: &str = "role";
const CLAUSES: [&str; 3] = ["role=node", "processors.count>=4", "os.release.full>=11.2"];
const REGEX_CLAUSES: [&str; 2] = ["hostname=~^(node|web)0[0-4]", "kernelrelease!~/^4\\./"];
/// puppet_kicker.yaml's default `max_age`: servers with older facts are left out.
const MAX_AGE: u64 = 7 * 86_400;

const WARM_UP: Duration = Duration::from_millis(200);
const MEASURE: Duration = Duration::from_secs(1);
/// Samples per case: a batch of iterations each, so a fast case gets ~100 of them.
const SAMPLES: u32 = 100;
const MIN_SAMPLES: usize = 3;
/// Most samples of a case that needs a fresh input each time.
const MAX_EACH: usize = 30;

fn main() {
    if let Ok(cache_dir) = std::env::var(COLD_CHILD) {
        return cold_child(Path::new(&cache_dir));
    }
    let servers = fleet_size();
    // `cargo bench` passes `--bench`; a name filter is not supported, so ignore args.
    report::print_machine("query");
    println!("Load average at the start: {} (other processes make every figure slower and noisier).\n", load_average());
    let root = std::env::temp_dir().join(format!("pk-bench-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);

    let started = Instant::now();
    let built_at = now();
    let rss_before = rss_mb();
    let nodes = synthetic::fleet(servers, SEED, built_at);
    let in_memory = rss_mb() - rss_before;
    let facts_dir = root.join("var/server_data/facts");
    let cache_bytes = synthetic::write_puppet_cache(&facts_dir, &nodes).expect("write the synthetic fact cache");
    if only("refresh") {
        refresh_only(&facts_dir, &nodes, built_at);
        let _ = fs::remove_dir_all(&root);
        println!("Load average at the end: {}.", load_average());
        return;
    }
    let per_server = nodes.iter().map(|n| n.facts.len()).sum::<usize>() as f64 / nodes.len() as f64;
    record("servers", servers as f64);
    record("json_bytes", cache_bytes as f64);
    println!(
        "Fleet: {servers} servers (seed {SEED}), {per_server:.0} top-level facts each on average, \
         {in_memory:.0} MB as serde_json trees in memory (RSS growth), a JSON fact cache of {:.1} MB \
         (generated in {}).",
        cache_bytes as f64 / 1e6,
        human(started.elapsed().as_nanos() as f64)
    );
    let index = Index::build(nodes.clone(), ROLE_FACT, built_at);
    let before = reference::Index::build(nodes.clone(), ROLE_FACT, built_at);
    let fresh = Freshness { now: built_at, max_age: MAX_AGE };
    let in_env = index.servers().filter(|s| s.environment() == ENVIRONMENT).count();
    record("index_bytes", index.heap_bytes() as f64);
    println!(
        "The index holds {:.1} MB (its store {:.1} MB: {} strings, {} values), {:.2}x the JSON.",
        index.heap_bytes() as f64 / 1e6,
        index.store().heap_bytes() as f64 / 1e6,
        index.store().strings(),
        index.store().values(),
        index.heap_bytes() as f64 / cache_bytes as f64
    );
    println!(
        "Environment {ENVIRONMENT}: {in_env} servers; max_age {MAX_AGE} s; the queries below answer for \
         {ENVIRONMENT}. Speed-up: the alternative's median over the row's.\n"
    );

    let index_bytes = index.heap_bytes();
    if !loading_only() {
        role_queries(&index, &before, fresh);
        fact_queries(&index, &before, fresh);
        service_queries(&root, &index, &before, fresh);
    }
    drop((index, before));
    loading(&root, &facts_dir, nodes, built_at);
    cold_starts(&root, cache_bytes, index_bytes);

    let _ = fs::remove_dir_all(&root);
    println!("Load average at the end: {}; wall time {}.", load_average(), human(started.elapsed().as_nanos() as f64));
}

/// (a) `servers_with_role('node', 'production')`.
fn role_queries(index: &Index, before: &reference::Index, fresh: Freshness) {
    let servers = fleet_size();
    let roles = RoleSelector::names(["node"]);
    let by_index = index.with_role(&roles, ENVIRONMENT, fresh);
    assert_eq!(
        positions_to_names(index, &by_index),
        scan_role(before.nodes(), "node", fresh),
        "index and scan disagree"
    );
    let clause = Query::parse(&["role=node"]).unwrap();
    assert_eq!(scan_query(before.nodes(), &clause, fresh).len(), by_index.len());

    let mut table = Table::new(format!(
        "(a) servers_with_role('node', '{ENVIRONMENT}'): {} of {servers} servers selected",
        by_index.len()
    ));
    record("role_returned", by_index.len() as f64);
    table.ours(
        "Index::with_role: inverted index by environment and role",
        kept("with_role", measure(|| index.with_role(&roles, ENVIRONMENT, fresh))),
    );
    table.alternative(
        "linear scan: environment, freshness, role == \"node\" on every server",
        kept("scan_role", measure(|| scan_role(before.nodes(), "node", fresh))),
    );
    table.info(
        "linear scan with the compiled clause role=node instead",
        measure(|| scan_query(before.nodes(), &clause, fresh)),
    );
    table.print();
}

/// (b) query shapes: the store-backed index, the serde_json index it replaced, and
/// a scan; each checked to give the same servers first.
fn fact_queries(index: &Index, before: &reference::Index, fresh: Freshness) {
    let servers = fleet_size();
    let shapes: [&[&str]; 5] = [
        &CLAUSES,
        &["processors.count>=16", "os.family=Debian"],
        &["hostname=/^web0[0-4]/"],
        &REGEX_CLAUSES,
        &["networking.interfaces.eth0.mtu=1500", "kernelmajversion>=5"],
    ];
    for clauses in shapes {
        if scaling_only() && clauses != CLAUSES {
            continue;
        }
        let query = Query::parse(clauses).unwrap();
        let by_index = index.with_facts(&query, ENVIRONMENT, fresh);
        assert_eq!(by_index, before.with_facts(&query, ENVIRONMENT, ROLE_FACT, fresh), "old and new disagree");
        assert_eq!(
            positions_to_names(index, &by_index),
            scan_query(before.nodes(), &query, fresh),
            "index and scan disagree"
        );
        let mut table = Table::new(format!(
            "(b) servers_with_facts({}): {} of {servers} servers selected",
            quoted(clauses),
            by_index.len()
        ));
        let fresh_index = || Index::build_from(before.nodes(), ROLE_FACT, fresh.now);
        table.info(
            "first query of a generation: the path indexes built (excluded below)",
            measure_each(fresh_index, |i| i.with_facts(&query, ENVIRONMENT, fresh).len()),
        );
        let ours = measure(|| index.with_facts(&query, ENVIRONMENT, fresh));
        if clauses == CLAUSES {
            record("clauses_returned", by_index.len() as f64);
            record("with_facts", ours.median);
        }
        table.ours("Index::with_facts: per-path indexes, per-value results", ours);
        table.alternative(
            "before: the serde_json index (role list, then a scan)",
            measure(|| before.with_facts(&query, ENVIRONMENT, ROLE_FACT, fresh)),
        );
        table
            .info("linear scan: Query::matches on every server", measure(|| scan_query(before.nodes(), &query, fresh)));
        table.print();
    }
}

/// (c) the same through `Service`, the service the Ruby functions call.
fn service_queries(root: &Path, index: &Index, before: &reference::Index, fresh: Freshness) {
    let servers = fleet_size();
    let kicker = Service::start(scratch_master(root)).expect("start the service");
    let cold = Instant::now();
    assert!(kicker.refresh_and_wait(Duration::from_secs(300)), "the first refresh did not finish");
    let cold = cold.elapsed();
    assert_eq!(kicker.status().servers, servers);
    println!(
        "**(c) through `Service`, the service the Ruby bindings call** (answers not converted to Ruby); \
         its first refresh (read {servers} JSON files, build, write the snapshot) took {}.\n",
        human(cold.as_nanos() as f64)
    );

    let role_args = ["node".to_string()];
    let query = Query::parse(&CLAUSES).unwrap();
    let selected = kicker.servers_with_role(&role_args, ENVIRONMENT).unwrap();
    assert_eq!(selected.len(), index.with_role(&RoleSelector::names(["node"]), ENVIRONMENT, fresh).len());
    let mut table = Table::new(format!("(c) servers_with_role('node', '{ENVIRONMENT}'): {} servers", selected.len()));
    table.ours(
        "Service::servers_with_role, an identical call (the answer kept for this index generation)",
        kept("kept_answer", measure(|| kicker.servers_with_role(&role_args, ENVIRONMENT).unwrap())),
    );
    table.ours(
        "computing that answer: RoleSelector::parse + Index::with_role",
        measure(|| index.with_role(&RoleSelector::parse(&role_args).unwrap(), ENVIRONMENT, fresh)),
    );
    table.alternative(
        "linear scan: environment, freshness, role == \"node\" on every server",
        measure(|| scan_role(before.nodes(), "node", fresh)),
    );
    table.print();
    if scaling_only() {
        return;
    }

    let selected = kicker.servers_with_facts(&CLAUSES, ENVIRONMENT).unwrap();
    assert_eq!(selected.len(), index.with_facts(&query, ENVIRONMENT, fresh).len());
    let mut table = Table::new(format!("(c) servers_with_facts({}): {} servers", quoted(&CLAUSES), selected.len()));
    table.ours(
        "Service::servers_with_facts (clause cache hits)",
        measure(|| kicker.servers_with_facts(&CLAUSES, ENVIRONMENT).unwrap()),
    );
    table.alternative(
        "linear scan: Query::matches on every server",
        measure(|| scan_query(before.nodes(), &query, fresh)),
    );
    table.print();

    // What the clause cache saves per call: compiling, regexes above all.
    let cache = ClauseCache::new(1024);
    for clauses in [&CLAUSES[..], &REGEX_CLAUSES[..]] {
        cache.compile(clauses).unwrap();
        let mut table = Table::new(format!("(c) compiling the clauses of one call: {}", quoted(clauses)));
        table.ours("ClauseCache::compile (hit, as Service does)", measure(|| cache.compile(clauses).unwrap()));
        table.alternative("Query::parse (compiled on every call)", measure(|| Query::parse(clauses).unwrap()));
        table.print();
    }
    assert!(kicker.take_warnings().is_empty());
}

/// (d) what a refresh and a start cost: the index, the snapshot, the JSON cache.
fn loading(root: &Path, facts_dir: &Path, nodes: Vec<Node>, built_at: i64) {
    let servers = fleet_size();
    let snapshot_path = snapshot::path_in(&root.join("snapshot"));
    let seen = BTreeMap::new();
    let index = Index::build(nodes.clone(), ROLE_FACT, built_at);
    let write = |index: &Index| snapshot::write(&snapshot_path, &SnapshotRef::of(index, &seen)).unwrap();
    write(&index);
    let snapshot_bytes = fs::metadata(&snapshot_path).map(|m| m.len()).unwrap_or(0);
    record("snapshot_bytes", snapshot_bytes as f64);
    let dirs = [facts_dir.to_path_buf()];
    // The scaling table's rows, or every row.
    let full = !scaling_only();

    let mut table = Table::new(format!(
        "(d) loading {servers} servers: snapshot {:.1} MB (MessagePack, one file) vs JSON fact cache {:.1} MB ({servers} files); page cache warm",
        snapshot_bytes as f64 / 1e6,
        dir_bytes(facts_dir) as f64 / 1e6
    ));
    table.info(
        "Index::build_from parsed servers (sort, dedup, intern, role map)",
        kept("build_from", measure_each(|| (), |()| Index::build_from(&nodes, ROLE_FACT, built_at))),
    );
    if full {
        table.info(
            "  its floor: only walking the parsed servers' trees (every key, every leaf)",
            measure_each(
                || (),
                |()| nodes.iter().map(|n| n.facts.iter().map(|(k, v)| k.len() + walk(v)).sum::<usize>()).sum::<usize>(),
            ),
        );
        table.info(
            "  freeing the parsed servers afterwards (serde_json trees; after the index serves)",
            measure_each(|| nodes.clone(), drop),
        );
    }
    table.info(
        "snapshot::write (encode, write, fsync, rename)",
        kept("snapshot_write", measure_each(|| (), |()| write(&index))),
    );
    drop(index);
    if full {
        table.info(
            "before: reference::Index::build (serde_json trees)",
            measure_each(|| nodes.clone(), |n| reference::Index::build(n, ROLE_FACT, built_at)),
        );
    }
    let warm_start = |()| snapshot::read(&snapshot_path, ROLE_FACT).unwrap().unwrap().index;
    table.ours(
        "start from the snapshot: snapshot::read (checked, role maps built)",
        kept("snapshot_read", measure_each(|| (), warm_start)),
    );
    let seen = BTreeMap::new();
    if full {
        table.info(
            "SourceRead::into_index: servers already decoded into the store (dedup, order, role maps)",
            measure_each(|| puppet_cache::load(&dirs).unwrap(), |h| h.into_index(None, &seen, ROLE_FACT, built_at)),
        );
        for readers in [2, 1] {
            table.info(
                &format!("puppet_cache::load, {readers} reader{}: JSON files decoded into the store", plural(readers)),
                measure_each(|| (), |()| puppet_cache::load_with_readers(&dirs, readers).unwrap()),
            );
        }
    }
    let (dirs, seen) = (&dirs, &seen);
    let from_source = |readers: usize| {
        move |()| {
            let read = puppet_cache::load_with_readers(dirs, readers).unwrap();
            read.into_index(None, seen, ROLE_FACT, built_at)
        }
    };
    table.ours(
        "start from the JSON cache: puppet_cache::load + into_index (2 readers)",
        kept("json_to_index", measure_each(|| (), from_source(2))),
    );
    if !full {
        refreshes(&mut table, dirs, seen, &nodes, facts_dir, built_at);
        return table.print();
    }
    table.ours("  the same, 1 reader", measure_each(|| (), from_source(1)));
    // The legacy cache of older masters: the same servers as Ruby-tagged YAML.
    let yaml_dir = root.join("var/yaml/facts");
    let yaml_bytes = write_yaml_cache(&yaml_dir, &nodes);
    let yaml_dirs = [yaml_dir.clone()];
    let from_yaml = puppet_cache::load(&yaml_dirs).unwrap();
    assert!(from_yaml.warnings.is_empty(), "{:?}", from_yaml.warnings);
    assert_eq!(from_yaml.observations.len(), servers);
    drop(from_yaml);
    table.ours(
        &format!(
            "legacy YAML cache ({:.1} MB): puppet_cache::load, 2 readers (YAML events decoded into the store)",
            yaml_bytes as f64 / 1e6
        ),
        kept("yaml_load", measure_each(|| (), |()| puppet_cache::load_with_readers(&yaml_dirs, 2).unwrap())),
    );
    let _ = fs::remove_dir_all(&yaml_dir);
    table.alternative(
        "before: each file to a serde_json tree, Node::new, Index::build (1 thread)",
        measure_each(|| (), |()| Index::build(read_trees(facts_dir), ROLE_FACT, built_at)),
    );
    refreshes(&mut table, dirs, seen, &nodes, facts_dir, built_at);
    table.print();
}

/// `PK_BENCH_ONLY=refresh`: `SourceRead::into_index` of a full read, then the refreshes.
fn refresh_only(facts_dir: &Path, nodes: &[Node], built_at: i64) {
    // Files modified in the last seconds are read at every refresh.
    std::thread::sleep(Duration::from_secs(puppet_cache::RACY_SECONDS as u64 + 1));
    let (dirs, seen) = ([facts_dir.to_path_buf()], BTreeMap::new());
    let mut table = Table::new(format!("(d) refreshing {} servers from the JSON fact cache", fleet_size()));
    table.info(
        "SourceRead::into_index: servers already decoded into the store (dedup, order, role maps)",
        measure_each(|| puppet_cache::load(&dirs).unwrap(), |h| h.into_index(None, &seen, ROLE_FACT, built_at)),
    );
    refreshes(&mut table, &dirs, &seen, nodes, facts_dir, built_at);
    table.print();
}

/// A refresh after the last one, with no file changed, then with 10 changed.
fn refreshes(
    table: &mut Table,
    dirs: &[PathBuf],
    seen: &BTreeMap<String, String>,
    nodes: &[Node],
    facts_dir: &Path,
    built_at: i64,
) {
    let servers = fleet_size();
    // The files were written long enough ago for their stamps to be trusted. No change first:
    // files rewritten for the other case are read again for two seconds after.
    for changed in [0, 10] {
        let setup = || {
            let (read, memo) = puppet_cache::load_since(dirs, None).unwrap();
            let (index, tables) = read.into_index_and_tables(None, seen, ROLE_FACT, built_at);
            let mut rewritten = nodes[..changed].to_vec();
            for node in &mut rewritten {
                node.timestamp += 60;
                node.facts.insert("uptime_seconds".into(), Value::from(node.timestamp));
            }
            synthetic::write_puppet_cache(facts_dir, &rewritten).unwrap();
            (index, tables, memo)
        };
        // The index built from the previous one, or (as before) whole again.
        let refresh = |onto_previous: bool| {
            move |(index, tables, memo): (Index, _, _)| {
                let previous = puppet_cache::Previous { index: &index, tables, memo };
                let (read, _) = puppet_cache::load_since(dirs, Some(previous)).unwrap();
                assert_eq!(read.reused, servers - changed);
                let base = onto_previous.then_some(&index);
                (read.into_index(base, seen, ROLE_FACT, built_at), index)
            }
        };
        table.ours(
            &format!("a refresh after the last one, {changed} of {servers} files changed: load_since + into_index"),
            kept(&format!("refresh_{changed}"), measure_each(setup, refresh(true))),
        );
        table.info("  the same, the index built whole again (before)", measure_each(setup, refresh(false)));
    }
}

/// The fact cache read the way it was before the store: a serde_json tree per file.
fn read_trees(dir: &Path) -> Vec<Node> {
    let mut paths: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    let node = |path: &PathBuf| {
        let document: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
        let Value::Object(mut top) = document else { panic!("{} is not a mapping", path.display()) };
        let Some(Value::Object(facts)) = top.remove("values") else { panic!("{} has no values", path.display()) };
        let timestamp = top.get("timestamp").and_then(Value::as_str).and_then(puppet_kicker::time::parse_timestamp);
        let certname = top.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        Node::new(certname, facts, timestamp.unwrap_or(0), None)
    };
    paths.iter().map(node).collect()
}

/// Writes `nodes` as an older master's YAML fact cache (`$vardir/yaml/facts`), in
/// block style as Puppet wrote it; gives the bytes written.
fn write_yaml_cache(dir: &Path, nodes: &[Node]) -> u64 {
    fs::create_dir_all(dir).unwrap();
    let mut written = 0;
    for node in nodes {
        let text = synthetic::yaml_fact_file(node);
        fs::write(dir.join(format!("{}.yaml", node.certname)), &text).unwrap();
        written += text.len() as u64;
    }
    written
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Set in a child process: it starts the service on that cache dir, answers one
/// `servers_with_role`, prints what it took, and exits.
const COLD_CHILD: &str = "PK_BENCH_COLD_CHILD";
const COLD_RUNS: usize = 11;

/// (e) what a new process pays for its first answer (every `puppet apply`, every
/// restarted master): from the snapshot vs from the JSON fact cache, each in
/// `COLD_RUNS` new processes; and the resident memory the loaded index adds.
fn cold_starts(root: &Path, cache_bytes: u64, index_bytes: usize) {
    let servers = fleet_size();
    let child = |cache_dir: &Path| -> (f64, f64, f64) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env(COLD_CHILD, cache_dir)
            .env("PK_BENCH_ROOT", root)
            .output()
            .expect("run the cold-start child");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find_map(|l| l.strip_prefix("cold ")).unwrap_or_else(|| panic!("child: {text}"));
        let mut fields = line.split_whitespace().map(|f| f.parse::<f64>().unwrap());
        (fields.next().unwrap(), fields.next().unwrap(), fields.next().unwrap())
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let snapshot_dir = root.join("snapshot");
    let columns = |runs: Vec<(f64, f64, f64)>| {
        let (took, (rss, peak)): (Vec<f64>, (Vec<f64>, Vec<f64>)) =
            runs.into_iter().map(|(t, r, p)| (t, (r, p))).unzip();
        (median(took), median(rss), median(peak))
    };
    let (warm, warm_rss, _) = columns((0..COLD_RUNS).map(|_| child(&snapshot_dir)).collect());
    let (json, json_rss, json_peak) = columns(
        (0..COLD_RUNS)
            .map(|i| {
                let empty = root.join(format!("cold-json-{i}"));
                let result = child(&empty);
                let _ = fs::remove_dir_all(&empty);
                result
            })
            .collect(),
    );
    record("cold_snapshot", warm);
    record("cold_json", json);
    record("cold_snapshot_rss_mb", warm_rss);
    record("cold_json_peak_mb", json_peak);
    println!(
        "**(e) a new process's first `servers_with_role('node')`** ({servers} servers; the median of {COLD_RUNS} \
         processes each; resident memory is the growth of the process's RSS)\n"
    );
    println!("| Start | First answer | Resident memory added | Speed-up |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| puppet-kicker: from the snapshot | {} | +{warm_rss:.1} MB ({:.2}x the JSON fact cache's {:.1} MB) | {:.1}x faster |",
        human(warm),
        warm_rss * 1e6 / cache_bytes as f64,
        cache_bytes as f64 / 1e6,
        json / warm
    );
    println!(
        "| alternative: from the JSON fact cache (read, decode, build, write the snapshot) | {} | +{json_rss:.1} MB \
         (parsing leaves freed memory resident) | (alternative) |",
        human(json)
    );
    println!(
        "\nThe peak resident memory of that full refresh from JSON: +{json_peak:.1} MB, {:.2}x the index's own {:.1} MB.\n",
        json_peak * 1e6 / index_bytes as f64,
        index_bytes as f64 / 1e6
    );
}

/// The child of [`cold_starts`].
fn cold_child(cache_dir: &Path) {
    let root = PathBuf::from(std::env::var("PK_BENCH_ROOT").unwrap());
    let config = cache_dir.with_extension("yaml");
    let text = format!("cache:\n  ttl: 1d\n  cold_start_timeout: 5m\n  dir: {}\n", cache_dir.display());
    fs::write(&config, text).unwrap();
    let settings = PuppetSettings { config_file: Some(config.clone()), ..scratch_master(&root) };
    let rss = rss_mb();
    let started = Instant::now();
    let service = Service::start(settings).expect("start the service");
    let found = service.servers_with_role(&["node"], ENVIRONMENT).expect("the first answer").len();
    let took = started.elapsed();
    assert!(found > 0);
    // The peak since the process started, less what it held before the service.
    println!("cold {} {} {}", took.as_nanos(), rss_mb() - rss, status_mb("VmHWM:") - rss);
    let _ = fs::remove_file(config);
    std::process::exit(0);
}

/// Touches every key and leaf of a parsed fact (the least any build from trees does).
fn walk(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len() + usize::from(s.as_bytes().first().copied().unwrap_or(0)),
        Value::Array(items) => items.iter().map(walk).sum(),
        Value::Object(map) => {
            map.iter().map(|(k, v)| k.len() + usize::from(k.as_bytes().first().copied().unwrap_or(0)) + walk(v)).sum()
        }
        _ => 1,
    }
}

fn quoted(clauses: &[&str]) -> String {
    clauses.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", ")
}

/// The alternative to the role index: look at every server.
fn scan_role<'a>(nodes: &'a [Node], role: &str, fresh: Freshness) -> Vec<&'a str> {
    let is_role = |value: Option<&Value>| match value {
        Some(Value::String(s)) => s == role,
        Some(Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(role)),
        _ => false,
    };
    nodes
        .iter()
        .filter(|n| n.environment == ENVIRONMENT && admits(fresh, n) && is_role(n.facts.get(ROLE_FACT)))
        .map(|n| n.certname.as_str())
        .collect()
}

/// The alternative to the index for fact queries: every clause on every server.
fn scan_query<'a>(nodes: &'a [Node], query: &Query, fresh: Freshness) -> Vec<&'a str> {
    nodes
        .iter()
        .filter(|n| n.environment == ENVIRONMENT && admits(fresh, n) && query.matches(n))
        .map(|n| n.certname.as_str())
        .collect()
}

fn admits(fresh: Freshness, node: &Node) -> bool {
    fresh.now.saturating_sub(node.timestamp) <= fresh.max_age as i64
}

fn positions_to_names<'a>(index: &'a Index, positions: &[u32]) -> Vec<&'a str> {
    positions.iter().map(|p| index.server(*p).certname()).collect()
}

/// A confdir and vardir whose default fact cache dir holds the synthetic fleet.
fn scratch_master(root: &Path) -> PuppetSettings {
    let confdir = root.join("etc");
    fs::create_dir_all(&confdir).unwrap();
    // A long ttl, so no background refresh competes with the measurements for the CPU.
    fs::write(confdir.join("puppet_kicker.yaml"), "cache:\n  ttl: 1d\n  cold_start_timeout: 5m\n").unwrap();
    PuppetSettings { confdir, vardir: root.join("var"), ..Default::default() }
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir).map(|e| e.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

// ---- the harness ------------------------------------------------------------

struct Stats {
    median: f64,
    mean: f64,
    samples: usize,
}

/// Times `op` in batches: warm up, pick a batch size for ~`SAMPLES` samples in
/// `MEASURE`, then sample until `MEASURE` has passed. Nanoseconds per operation.
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
    stats(samples)
}

/// Times one `op` per sample on a fresh input from `setup`, neither of which (nor
/// dropping the output) is timed: for slow operations that consume their input.
fn measure_each<S, T>(mut setup: impl FnMut() -> S, mut op: impl FnMut(S) -> T) -> Stats {
    drop(black_box(op(setup()))); // warm-up
    let mut samples = Vec::new();
    let mut measured = Duration::ZERO;
    // Bounded by count too: a setup (a whole index, say) can cost far more than the op.
    while samples.len() < MIN_SAMPLES || (measured < MEASURE && samples.len() < MAX_EACH) {
        let input = setup();
        let t = Instant::now();
        let output = black_box(op(input));
        let elapsed = t.elapsed();
        drop(output);
        measured += elapsed;
        samples.push(elapsed.as_nanos() as f64);
    }
    stats(samples)
}

fn stats(mut samples: Vec<f64>) -> Stats {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 { samples[n / 2] } else { (samples[n / 2 - 1] + samples[n / 2]) / 2.0 };
    let mean = samples.iter().sum::<f64>() / n as f64;
    Stats { median, mean, samples: n }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// puppet-kicker's way.
    Ours,
    /// What it replaces: the speed-up column compares every row with this one.
    Alternative,
    /// A figure for context.
    Info,
}

struct Table {
    title: String,
    rows: Vec<(String, Kind, Stats)>,
}

impl Table {
    fn new(title: String) -> Table {
        Table { title, rows: Vec::new() }
    }

    fn ours(&mut self, name: &str, stats: Stats) {
        self.rows.push((name.to_string(), Kind::Ours, stats));
    }

    fn alternative(&mut self, name: &str, stats: Stats) {
        self.rows.push((name.to_string(), Kind::Alternative, stats));
    }

    fn info(&mut self, name: &str, stats: Stats) {
        self.rows.push((name.to_string(), Kind::Info, stats));
    }

    /// A Markdown table; `speed-up` compares medians with the alternative's.
    fn print(&self) {
        let baseline = self.rows.iter().find(|(_, kind, _)| *kind == Kind::Alternative).map(|(_, _, s)| s.median);
        println!("**{}**\n", cell(&self.title));
        println!("| | Implementation | Median | Mean | Samples | Speed-up |");
        println!("| --- | --- | ---: | ---: | ---: | ---: |");
        for (name, kind, s) in &self.rows {
            let (what, relative) = match (kind, baseline) {
                (Kind::Alternative, _) => ("alternative", "(alternative)".to_string()),
                (Kind::Ours, Some(base)) => ("puppet-kicker", ratio(base, s.median)),
                (Kind::Ours, None) => ("puppet-kicker", String::new()),
                (Kind::Info, Some(base)) => ("", ratio(base, s.median)),
                (Kind::Info, None) => ("", String::new()),
            };
            // Sub-rows are indented in the name; Markdown would drop the spaces.
            let name = match name.strip_prefix("  ") {
                Some(rest) => format!("↳ {rest}"),
                None => name.clone(),
            };
            let (median, mean) = (human(s.median), human(s.mean));
            println!("| {what} | {} | {median} | {mean} | {} | {relative} |", cell(&name), s.samples);
        }
        println!();
    }
}

/// Text for a Markdown table cell: a `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// Records a case's median (nanoseconds) under `key`, and gives the case back.
fn kept(key: &str, stats: Stats) -> Stats {
    record(key, stats.median);
    stats
}

/// How much faster than the alternative (`base`) a row is, or how much slower.
fn ratio(base: f64, row: f64) -> String {
    if row <= base {
        format!("{:.1}x faster", base / row)
    } else {
        format!("{:.1}x slower", row / base)
    }
}

fn human(nanos: f64) -> String {
    match nanos {
        n if n < 1e3 => format!("{n:.0} ns"),
        n if n < 1e6 => format!("{:.2} µs", n / 1e3),
        n if n < 1e9 => format!("{:.2} ms", n / 1e6),
        n => format!("{:.2} s", n / 1e9),
    }
}

fn rss_mb() -> f64 {
    status_mb("VmRSS:")
}

/// A size line of /proc/self/status (VmRSS, VmHWM), in MB.
fn status_mb(field: &str) -> f64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kb.unwrap_or(0.0) / 1024.0
}
