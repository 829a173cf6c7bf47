//! `cargo bench --bench puppetdb`: what a refresh of `source: puppetdb` costs this
//! side of the wire, at 10,000 servers: the synthetic fleet (Facter-4-like facts,
//! about 10 KB of JSON each, plus trusted facts with `pp_role`) served by the
//! in-test PuppetDB of `tests/support/fake_puppetdb.rs` over HTTPS on 127.0.0.1,
//! a client certificate required, each node's entry rendered once beforehand.
//!
//! (1) A full read: the listing, pages of `puppetdb.page_size` (500) entries over
//! TLS, each decoded into the store as it arrives, then the index built. (2) An
//! incremental refresh after 10 nodes' facts changed: the listing since the newest
//! timestamp less the overlap, the inactive nodes, the 10 entries, the index from
//! the previous one. The fake server's own share (making answers from the rendered
//! entries) is measured apart; a real PuppetDB's share is not here (the stack's
//! benchmarks measure it). One warm-up, then at least five samples; medians.
//!
//! With `PK_BENCH_PUPPETDB_URL` set, against that real PuppetDB instead: see
//! `benches/puppetdb/real.rs` and bench/puppetdb.

#[path = "../tests/support/fake_puppetdb.rs"]
mod fake_puppetdb;
#[path = "puppetdb/real.rs"]
mod real;
#[path = "support/report.rs"]
mod report;

use fake_puppetdb::{server_config, Ca, Dir, FakePuppetdb, PdbNode};
use puppet_kicker::config::{Config, PuppetSettings};
use puppet_kicker::source::puppetdb::PuppetdbSource;
use puppet_kicker::source::Source;
use puppet_kicker::time::now;
use puppet_kicker::{synthetic, Index};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SERVERS: usize = 10_000;
const CHANGED: usize = 10;
const SAMPLES: usize = 5;
const ROLE_FACT: &str = "trusted.extensions.pp_role";

fn main() {
    report::print_machine("puppetdb");
    println!("Load average at the start: {}.\n", report::load_average());
    if let Some((url, files)) = real::from_env() {
        return real::run(url, files);
    }
    let dir = Dir::new("bench");
    let ca = Ca::new("Puppet CA: bench");
    let pdb = FakePuppetdb::start(server_config(&ca));
    let started = now() - 600;
    let nodes = synthetic::fleet(SERVERS, 1, started);
    let mut bytes = 0;
    for node in &nodes {
        let role = node.facts.get("role").cloned().unwrap_or(Value::Null);
        let facts = Value::Object(node.facts.clone());
        bytes += facts.to_string().len();
        let trusted = json!({"certname": node.certname, "authenticated": "remote", "extensions": {"pp_role": role}});
        let pdb_node = PdbNode {
            timestamp: node.timestamp,
            environment: Some(node.environment.clone()),
            facts,
            trusted,
            deactivated: None,
            expired: None,
        };
        pdb.set(&node.certname, pdb_node);
    }
    println!("Fleet: {SERVERS} servers, {:.1} MB of facts JSON.\n", bytes as f64 / 1e6);
    let (cert, key) = ca.issue(&["master.example.com"]);
    let puppet = PuppetSettings {
        hostcert: Some(dir.write("master.pem", &cert)),
        hostprivkey: Some(dir.write("master.key", &key)),
        localcacert: Some(dir.write("ca.pem", &ca.cert.pem())),
        ..Default::default()
    };
    let mut settings = Config::defaults(&puppet).sources.puppetdb;
    settings.server_urls = Some(vec![pdb.url.clone()]);

    let refresh = |source: &PuppetdbSource, previous: Option<&Index>| {
        let mut read = source.refresh(previous, now(), &Default::default()).expect("a refresh");
        let environments = read.environments.take().unwrap_or_default();
        let (index, base) = read.into_index_and_base(previous, &environments, ROLE_FACT, now());
        source.carry(base);
        index
    };

    let mut full = Vec::new();
    let mut full_server = Vec::new();
    let mut index = None;
    for sample in 0..=SAMPLES {
        let source = PuppetdbSource::open(&settings).unwrap();
        pdb.answering();
        let t = Instant::now();
        let built = refresh(&source, None);
        let elapsed = t.elapsed();
        assert_eq!(built.len(), SERVERS);
        if sample > 0 {
            full.push(elapsed);
            full_server.push(pdb.answering());
        }
        index = Some((source, built));
    }
    let (source, mut index) = index.unwrap();

    let (mut incremental, mut incremental_server) = (Vec::new(), Vec::new());
    for sample in 0..=SAMPLES {
        for i in 0..CHANGED {
            let certname = &nodes[(sample * 997 + i * 131) % SERVERS].certname;
            pdb.edit(certname, |n| {
                n.timestamp = started + 1 + sample as i64;
                n.facts["uptime_seconds"] = json!(sample);
            });
        }
        pdb.asked();
        pdb.answering();
        let t = Instant::now();
        let next = refresh(&source, Some(&index));
        let elapsed = t.elapsed();
        let asked = pdb.asked();
        assert!(asked.iter().all(|q| !q.ends_with("{}")), "incremental, not a full read: {asked:?}");
        assert_eq!(next.len(), SERVERS);
        if sample > 0 {
            incremental.push(elapsed);
            incremental_server.push(pdb.answering());
        }
        index = next;
    }
    let pages = SERVERS.div_ceil(settings.page_size);
    println!("| Refresh | Median | of which the fake PuppetDB's share | Samples |");
    println!("| --- | ---: | ---: | --- |");
    row(&format!("full read: the listing, {pages} pages over TLS, decode, index"), &full, &full_server);
    row(&format!("incremental, {CHANGED} nodes changed"), &incremental, &incremental_server);
    report::record("puppetdb_full", median(&full).as_secs_f64() * 1e9);
    report::record("puppetdb_incremental", median(&incremental).as_secs_f64() * 1e9);
    println!("\nLoad average at the end: {}.", report::load_average());
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn row(what: &str, samples: &[Duration], server: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (total, served) = (median(samples), median(server));
    println!(
        "| {what} | {:.1} ms | {:.1} ms | {} |",
        ms(total),
        ms(served),
        samples.iter().map(|d| format!("{:.1}", ms(*d))).collect::<Vec<_>>().join(", ")
    );
}
