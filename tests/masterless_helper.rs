//! The masterless helper: one per cache dir, its refresh, its lifetime, and kicks it
//! holds back until the reporting process exits. Files on disk as processes share
//! them; `kick.dry_run` so no kick leaves the machine (a dispatch fails with "dry run",
//! which is logged as a retry: proof of when it was tried).

use puppet_kicker::kick::{KickConfig, PlannerState, STATE_FILE};
use puppet_kicker::masterless_helper::{self as helper, Ending, Options};
use puppet_kicker::{PuppetSettings, Service};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A confdir with `puppet_kicker.yaml` (`extra` appended), a fact cache holding
/// `servers`, and the cache dir `root/cache`.
fn setup(name: &str, servers: &[&str], extra: &str) -> (PathBuf, PuppetSettings) {
    let root = std::env::temp_dir().join(format!("pk-helper-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let facts = root.join("var/server_data/facts");
    fs::create_dir_all(&facts).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    for server in servers {
        write_facts(&facts, server);
    }
    let config = format!("cache:\n  dir: {}\n  ttl: 60\nkick:\n  dry_run: true\n{extra}", root.join("cache").display());
    fs::write(root.join("etc/puppet_kicker.yaml"), config).unwrap();
    let settings = PuppetSettings { confdir: root.join("etc"), vardir: root.join("var"), ..Default::default() };
    (root, settings)
}

fn write_facts(dir: &Path, server: &str) {
    let document = format!(
        r#"{{"name":"{server}","values":{{"role":"web"}},"timestamp":"2099-01-01T00:00:00.000000000+00:00","expiration":"2099-01-01T00:00:00.000000000+00:00"}}"#
    );
    fs::write(dir.join(format!("{server}.json")), document).unwrap();
}

fn quick(lifetime: Duration) -> Options {
    Options { poll: Duration::from_millis(100), lifetime: Some(lifetime) }
}

fn log_of(root: &Path) -> String {
    fs::read_to_string(root.join("cache").join(helper::HELPER_LOG)).unwrap_or_default()
}

/// Kick state with one kick of `target`, due at `due` (an operator's, since a report
/// never kicks its own server); with `hold_pid`, `target`'s own run (a process with
/// that pid) has reported since, and holds the kick until it exits.
fn pending_kick(root: &Path, target: &str, due: i64, hold_pid: Option<u32>) {
    use puppet_kicker::kick::{parse_report, Planner};
    let now = puppet_kicker::kick::now_ms();
    let report = |host: &str, kicks: serde_json::Value, pid: Option<u32>| {
        let json =
            serde_json::json!({"host": host, "environment": "production", "time": now, "kicks": kicks, "pid": pid});
        parse_report(json.to_string().as_bytes()).unwrap()
    };
    let config = KickConfig::default();
    let mut planner = Planner::new(config.clone(), PlannerState::default());
    let web = puppet_kicker::kick::Target { certname: target.into(), role: Some("web".into()) };
    let operator =
        report("master", serde_json::json!([{"resource": "puppet kicker kick --role web", "roles": ["web"]}]), None);
    let resolved = Planner::resolve(&config, &operator, |_, _| vec![web.clone()], |_| Some("web".into()));
    planner.on_operator(&operator, resolved, now);
    if let Some(pid) = hold_pid {
        planner.on_report(&report(target, serde_json::json!([]), Some(pid)), now, |_, _| Vec::new(), |_| None);
        assert_eq!(planner.holds().count(), 1);
    }
    let mut state = planner.state().clone();
    for t in state.targets.values_mut() {
        if let Some(p) = t.pending.as_mut() {
            p.due = due;
        }
    }
    fs::create_dir_all(root.join("cache")).unwrap();
    fs::write(root.join("cache").join(STATE_FILE), rmp_serde::to_vec_named(&state).unwrap()).unwrap();
}

#[test]
fn a_second_helper_exits_at_once_and_leaves_its_refresh_wanted() {
    let (root, settings) = setup("second", &["web1"], "");
    fs::create_dir_all(root.join("cache")).unwrap();
    let held = puppet_kicker::process::try_lock(&root.join("cache").join(helper::HELPER_LOCK)).unwrap().unwrap();
    let started = Instant::now();
    assert_eq!(helper::run_with(settings.clone(), &quick(Duration::from_secs(30))).unwrap(), Ending::AlreadyRunning);
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(root.join("cache").join(helper::REFRESH_WANTED).exists(), "no snapshot yet: a refresh is wanted");
    assert!(!root.join("cache/index.msgpack").exists(), "the other helper refreshes, not this one");

    drop(held);
    assert_eq!(helper::run_with(settings, &quick(Duration::from_secs(30))).unwrap(), Ending::Done);
    assert!(root.join("cache/index.msgpack").exists());
    assert!(!root.join("cache").join(helper::REFRESH_WANTED).exists());
    assert!(!root.join("cache").join(helper::HELPER_FILE).exists(), "helper.json goes with the helper");
    let log = log_of(&root);
    assert!(log.contains("refresh done: 1 servers"), "{log}");
    assert!(log.contains("helper exits after"), "{log}");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_kick_it_cannot_deliver_stays_for_the_next_run_when_its_lifetime_is_over() {
    let (root, settings) = setup("lifetime", &["web1"], "");
    let far = puppet_kicker::kick::now_ms() + 3_600_000;
    pending_kick(&root, "web2", far, None);
    let started = Instant::now();
    let ending = helper::run_with(settings, &quick(Duration::from_secs(2))).unwrap();
    assert_eq!(ending, Ending::LifetimeOver { undelivered: 1 });
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let log = log_of(&root);
    assert!(log.contains("waiting for: kick of web2: due at"), "{log}");
    assert!(log.contains("lifetime of 2s over; 1 kick(s) stay in"), "{log}");
    let status: serde_json::Value =
        serde_json::from_slice(&fs::read(root.join("cache/kick-status.json")).unwrap()).unwrap();
    assert_eq!(status["pending"][0]["target"], "web2");
    assert!(status["helper"].is_null(), "no helper runs any more: {status}");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn the_default_lifetime_covers_a_run_timeout_and_every_retry() {
    let (root, settings) = setup("max-lifetime", &[], "");
    let config = puppet_kicker::Config::load(&settings).unwrap();
    let lifetime = helper::max_lifetime(&config, Duration::from_secs(60));
    // 2 x 60 s refresh + 1 h run_timeout + 30+60+120+240+480 s backoff + sends, in flight, coalesce
    assert!(lifetime >= Duration::from_secs(120 + 3600 + 930), "{lifetime:?}");
    assert!(lifetime <= Duration::from_secs(2 * 3600), "{lifetime:?}");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_kick_of_a_server_whose_run_is_still_a_process_waits_for_it_to_exit() {
    let (root, settings) = setup("hold", &["web1"], "");
    let mut run = std::process::Command::new("sleep").arg("3").spawn().unwrap();
    pending_kick(&root, "web1", 0, Some(run.id()));
    let waiter = std::thread::spawn(move || {
        run.wait().unwrap();
        Instant::now()
    });
    let ending = helper::run_with(settings, &quick(Duration::from_secs(8))).unwrap();
    let exited = waiter.join().unwrap();
    // Tried once the process exited ("dry run" refuses it), then retried later: the
    // helper's lifetime ends first.
    assert_eq!(ending, Ending::LifetimeOver { undelivered: 1 });
    let log = log_of(&root);
    assert!(log.contains("waiting for: kick of web1: process"), "{log}");
    assert!(log.contains("kick of web1 not started (dry run); retrying (attempt 1 failed)"), "{log}");
    assert!(exited.elapsed() < Duration::from_secs(8));
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_refresh_waits_for_another_process_refreshing_and_takes_its_fresher_snapshot() {
    let (root, settings) = setup("refresh-lock", &["web1"], "");
    let cache = root.join("cache");
    fs::create_dir_all(&cache).unwrap();
    let kicker = Service::start(settings).unwrap();
    let held = puppet_kicker::process::try_lock(&cache.join(puppet_kicker::service::REFRESH_LOCK)).unwrap().unwrap();
    assert!(!kicker.refresh_and_wait(Duration::from_millis(500)), "waits while another process refreshes");

    // The other process writes what it read (two servers) and lets go.
    let nodes: Vec<puppet_kicker::Node> = ["web1", "web2"]
        .iter()
        .map(|n| puppet_kicker::Node::new(n.to_string(), serde_json::Map::new(), puppet_kicker::time::now(), None))
        .collect();
    let index = puppet_kicker::Index::build(nodes, "role", puppet_kicker::time::now());
    let seen = Default::default();
    let snap = puppet_kicker::snapshot::SnapshotRef::of(&index, &seen);
    puppet_kicker::snapshot::write(&puppet_kicker::snapshot::path_in(&cache), &snap).unwrap();
    drop(held);
    assert!(kicker.refresh_and_wait(Duration::from_secs(10)));
    assert_eq!(kicker.status().servers, 2, "the fresher snapshot, not a second read of the source (one server)");
    let _ = fs::remove_dir_all(&root);
}
