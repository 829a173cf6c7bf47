//! The service a compile talks to: cold start, warm start from the snapshot, the
//! no-data policy, and queries racing refreshes.

use puppet_kicker::error::Error;
use puppet_kicker::{PuppetSettings, Service};
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod support;

fn fixture(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/puppet_cache").join(dir)
}

/// A scratch master: its own confdir/vardir and a copy of the fixture fact caches.
struct Master {
    root: PathBuf,
}

impl Master {
    fn new(name: &str, config: &str) -> Master {
        let root = support::scratch_path(&format!("service-{name}"));
        for dir in ["server_data/facts", "yaml/facts"] {
            support::copy_facts_as_of_now(&fixture(dir), &root.join("var").join(dir));
        }
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/puppet_kicker.yaml"), config).unwrap();
        Master { root }
    }

    fn settings(&self) -> PuppetSettings {
        PuppetSettings { confdir: self.root.join("etc"), vardir: self.root.join("var"), ..Default::default() }
    }

    fn kicker(&self) -> Service {
        Service::start(self.settings()).unwrap()
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }
}

fn role(name: &str) -> [&str; 1] {
    [name]
}

fn certnames(selection: puppet_kicker::Selection) -> Vec<String> {
    selection.servers().map(|s| s.certname().to_string()).collect()
}

#[test]
fn a_cold_start_reads_the_cache_answers_in_order_and_writes_a_snapshot() {
    let master = Master::new("cold", "");
    let kicker = master.kicker();
    let nodes = certnames(kicker.servers_with_role(&role("node"), "production").unwrap());
    assert_eq!(
        nodes,
        ["node1.example.com", "node2.example.com", "node3.example.com"],
        "node0 is a month stale; node9 is in staging"
    );
    assert_eq!(certnames(kicker.servers_with_role(&role("node"), "staging").unwrap()), ["node9.staging.example.com"]);
    assert!(master.path("var/puppet_kicker/index.msgpack").is_file());
    let warnings = kicker.take_warnings();
    assert!(warnings.iter().any(|w| w.contains("broken.example.com.json")), "{warnings:?}");
}

#[test]
fn a_warm_start_answers_from_the_snapshot_without_the_source() {
    let master = Master::new("warm", "cache:\n  ttl: 1h\n");
    master.kicker().servers_with_role(&role("haproxy"), "production").unwrap();
    fs::remove_dir_all(master.path("var/server_data")).unwrap();
    fs::remove_dir_all(master.path("var/yaml")).unwrap();
    let restarted = master.kicker();
    let lbs = certnames(restarted.servers_with_role(&role("haproxy"), "production").unwrap());
    assert_eq!(lbs, ["lb1.example.com"]);
}

#[test]
fn a_stale_snapshot_is_served_while_a_background_refresh_replaces_it() {
    let master = Master::new("stale", "cache:\n  ttl: 0\n");
    let kicker = master.kicker();
    assert_eq!(certnames(kicker.servers_with_role(&role("node"), "production").unwrap()).len(), 3);
    fs::remove_file(master.path("var/server_data/facts/node2.example.com.json")).unwrap();
    // This query answers from the old index and queues a refresh.
    assert_eq!(certnames(kicker.servers_with_role(&role("node"), "production").unwrap()).len(), 3);
    assert!(kicker.refresh_and_wait(Duration::from_secs(10)));
    assert_eq!(
        certnames(kicker.servers_with_role(&role("node"), "production").unwrap()),
        ["node1.example.com", "node3.example.com"]
    );
}

#[test]
fn no_data_fails_loudly_unless_configured_to_return_empty() {
    let master =
        Master::new("nodata", "puppet_cache:\n  dirs: [/nonexistent/facts]\ncache:\n  cold_start_timeout: 5\n");
    let err = master.kicker().servers_with_role(&role("node"), "production").err().unwrap();
    assert!(matches!(err, Error::NoData(_)));
    let text = err.to_string();
    assert!(
        text.contains("no fact data")
            && text.contains("/nonexistent/facts (not found)")
            && text.contains("on_no_data: empty"),
        "{text}"
    );

    let empty_dir = Master::new("nodata-empty", "puppet_cache:\n  dirs: [empty]\n");
    fs::create_dir_all(empty_dir.path("etc/empty")).unwrap();
    let text = empty_dir.kicker().servers_with_facts(&["role=node"], "production").err().unwrap().to_string();
    assert!(text.contains("holds no server"), "{text}");

    let lenient = Master::new("nodata-lenient", "puppet_cache:\n  dirs: [/nonexistent/facts]\non_no_data: empty\n");
    assert!(lenient.kicker().servers_with_role(&role("node"), "production").unwrap().is_empty());
}

#[test]
fn an_empty_answer_on_a_healthy_index_is_empty_not_an_error() {
    let master = Master::new("healthy-empty", "");
    assert!(master.kicker().servers_with_role(&role("nosuchrole"), "production").unwrap().is_empty());
    assert!(master.kicker().servers_with_facts(&["role=node"], "nosuchenv").unwrap().is_empty());
}

#[test]
fn a_corrupt_snapshot_is_ignored_with_a_warning_and_rebuilt() {
    let master = Master::new("corrupt", "");
    fs::create_dir_all(master.path("var/puppet_kicker")).unwrap();
    fs::write(master.path("var/puppet_kicker/index.msgpack"), b"PKINDEX\0\x02\0\0\0garbage").unwrap();
    let kicker = master.kicker();
    assert!(kicker.take_warnings().iter().any(|w| w.contains("corrupt snapshot")));
    assert_eq!(certnames(kicker.servers_with_role(&role("node"), "production").unwrap()).len(), 3);
    assert!(puppet_kicker::snapshot::read(&master.path("var/puppet_kicker/index.msgpack"), "role").unwrap().is_some());
}

#[test]
fn bad_configuration_names_the_key() {
    let master = Master::new("badconfig", "cache:\n  tll: 5\n");
    let err = Service::start(master.settings()).err().unwrap().to_string();
    assert!(err.contains("puppet_kicker.yaml") && err.contains("unknown key 'cache.tll'"), "{err}");
}

#[test]
fn the_compiling_environment_is_remembered_for_servers_whose_facts_name_none() {
    let master = Master::new("seen", "");
    let facts = master.path("var/server_data/facts/bare.example.com.json");
    fs::write(&facts, r#"{"name":"bare.example.com","values":{"role":"db"},"timestamp":"2099-01-01T00:00:00+00:00"}"#)
        .unwrap();
    let kicker = master.kicker();
    assert_eq!(certnames(kicker.servers_with_role(&role("db"), "production").unwrap()), ["bare.example.com"]);
    kicker.note_environment("bare.example.com", "canary");
    assert!(kicker.refresh_and_wait(Duration::from_secs(10)));
    assert_eq!(certnames(kicker.servers_with_role(&role("db"), "canary").unwrap()), ["bare.example.com"]);
}

#[test]
fn queries_from_many_threads_race_refreshes_safely() {
    let master = Master::new("threads", "cache:\n  ttl: 0\n");
    let kicker = Arc::new(master.kicker());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let kicker = kicker.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let nodes = certnames(
                        kicker.servers_with_facts(&["role=node", "processors.count>=2"], "production").unwrap(),
                    );
                    assert_eq!(nodes, ["node1.example.com", "node2.example.com", "node3.example.com"]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
