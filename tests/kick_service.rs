//! The kick service as processes use it: state shared through the cache directory,
//! dispatch on the background thread, the status file.

use puppet_kicker::kick::{
    Dispatch, KickConfig, KickService, Outcome, ReportKicks, Selector, Target, Transport, STATUS_FILE,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::Tmpfs;

mod support;

use support::Recorder;

fn cache_dir(name: &str) -> PathBuf {
    support::scratch_path(&format!("kick-{name}"))
}

fn process(dir: &Path, recorder: &Recorder) -> KickService {
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    KickService::start(config, dir, Ok(Box::new(recorder.clone())), Box::new(|| {})).unwrap()
}

/// The servers the processes know: two nodes, a load balancer.
const FLEET: &[(&str, &str)] = &[("node1", "node"), ("node2", "node"), ("lb1", "haproxy")];

fn report(service: &KickService, host: &str, role: &str) -> Vec<String> {
    support::fleet_report(service, FLEET, host, role)
}

#[test]
fn two_processes_share_kicks_and_still_see_the_loop() {
    let dir = cache_dir("shared");
    let recorder = Recorder::default();
    let node1_apply = process(&dir, &recorder);
    report(&node1_apply, "node1", "haproxy");
    assert_eq!(node1_apply.flush(Duration::from_secs(5)), 0);
    assert_eq!(*recorder.0.lock().unwrap(), ["lb1"]);

    // lb1's kicked run is another process; it inherits node1 -> lb1 from the shared state.
    let lb1_apply = process(&dir, &recorder);
    let lines = report(&lb1_apply, "lb1", "node");
    assert!(lines.iter().any(|l| l.contains("kicked run of lb1 reported (chain node1 -> lb1)")), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains(
            "kick of node1 by lb1 (Notify[kick -> node]) suppressed: it would close a loop: node1 -> lb1 -> node1"
        )),
        "{lines:?}"
    );
    let undelivered = lb1_apply.flush(Duration::from_secs(5));
    assert_eq!(
        *recorder.0.lock().unwrap(),
        ["lb1", "node2"],
        "undelivered {undelivered}; lb1's report logged {lines:#?}; its process's status {:#}",
        lb1_apply.status()
    );

    let status: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(STATUS_FILE)).unwrap()).unwrap();
    let outcomes: Vec<&str> =
        status["recent_outcomes"].as_array().unwrap().iter().map(|o| o["target"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["lb1", "node2"]);
    assert_eq!(status["role_cycles"], serde_json::json!([["haproxy", "node", "haproxy"]]));
}

#[test]
fn a_kick_survives_a_process_that_exits_before_sending_it() {
    let dir = cache_dir("survive");
    let recorder = Recorder::default();
    {
        let config = KickConfig { coalesce_ms: 60_000, ..KickConfig::default() };
        let first = KickService::start(config, &dir, Ok(Box::new(recorder.clone())), Box::new(|| {})).unwrap();
        report(&first, "node1", "haproxy");
        assert_eq!(first.flush(Duration::from_millis(200)), 1, "not due yet: left for the next process");
    }
    assert!(recorder.0.lock().unwrap().is_empty());
    let status: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(STATUS_FILE)).unwrap()).unwrap();
    assert_eq!(status["pending"][0]["target"], "lb1");
}

/// Refuses every runonce as a busy agent does.
struct Busy;

impl Transport for Busy {
    fn runonce(&self, _: &Dispatch) -> Outcome {
        Outcome::Busy("Puppet is currently applying a catalog, cannot run now (status 1)".into())
    }
}

#[test]
fn a_run_does_not_wait_at_exit_for_a_kick_of_its_own_host() {
    // node1's apply kicked lb1 while lb1 was busy: the kick waits for its retry.
    let dir = cache_dir("own-host");
    let config = KickConfig {
        coalesce_ms: 0,
        retry_base_ms: 300,
        retry_max_ms: 300,
        max_attempts: 100,
        ..KickConfig::default()
    };
    let node1_apply = KickService::start(config.clone(), &dir, Ok(Box::new(Busy)), Box::new(|| {})).unwrap();
    report(&node1_apply, "node1", "haproxy");
    assert_eq!(node1_apply.flush(Duration::from_millis(200)), 1);
    // lb1's busy run ends: its process must not wait exit_wait for a kick of lb1,
    // which cannot start before that very process (holding lb1's lock) exits.
    let lb1_apply = KickService::start(config, &dir, Ok(Box::new(Busy)), Box::new(|| {})).unwrap();
    report(&lb1_apply, "lb1", "nobody");
    let started = std::time::Instant::now();
    assert_eq!(lb1_apply.flush(Duration::from_secs(5)), 1, "the kick of lb1 stays for later");
    assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
}

#[test]
fn a_new_cache_dir_is_created_before_the_first_kick_transaction() {
    let dir = cache_dir("fresh").join("not").join("yet");
    let service = process(&dir, &Recorder::default());
    let mut lines = report(&service, "node1", "haproxy");
    assert_eq!(service.flush(Duration::from_secs(5)), 0);
    lines.extend(service.take_log().into_iter().map(|l| l.message));
    assert!(!lines.iter().any(|l| l.contains("cannot lock")), "{lines:?}");
}

#[test]
fn flush_returns_only_once_the_outcome_is_in_the_log() {
    // A `puppet apply` takes the log right after flush and exits: the "kicked" line
    // must be there as soon as the outcome is (it was logged after the transaction,
    // and lost when flush woke up in between).
    for attempt in 0..40 {
        let dir = cache_dir(&format!("log-{attempt}"));
        let service = process(&dir, &Recorder::default());
        let mut lines = report(&service, "node1", "haproxy");
        assert_eq!(service.flush(Duration::from_secs(5)), 0);
        lines.extend(service.take_log().into_iter().map(|l| l.message));
        assert!(lines.iter().any(|l| l.starts_with("kicked lb1: Puppet run started")), "attempt {attempt}: {lines:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A runonce that takes a while, like a real round trip to a busy broker.
#[derive(Clone, Default)]
struct SlowRecorder(Recorder);

impl Transport for SlowRecorder {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        std::thread::sleep(Duration::from_millis(400));
        self.0.runonce(dispatch)
    }
}

#[test]
fn a_second_process_does_not_resend_a_kick_the_first_is_sending() {
    let dir = cache_dir("inflight");
    let slow = SlowRecorder::default();
    let start = |dir: &Path| {
        let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
        KickService::start(config, dir, Ok(Box::new(slow.clone())), Box::new(|| {})).unwrap()
    };
    let first = start(&dir);
    report(&first, "node1", "haproxy");
    std::thread::sleep(Duration::from_millis(150));
    let second = start(&dir);
    second.flush(Duration::from_secs(2));
    first.flush(Duration::from_secs(5));
    assert_eq!(*slow.0 .0.lock().unwrap(), ["lb1"], "sent exactly once");
}

/// A fleet of `roles` roles, one server each (`r0`..), and a report from `host`
/// kicking every role (`/./`), as any node may send by changing its own role fact.
fn complete_graph_report(service: &KickService, host: &str, roles: usize) -> Vec<String> {
    let fleet: Vec<(String, String)> = (0..roles).map(|i| (format!("r{i}"), format!("role{i:02}"))).collect();
    let report = support::role_kick(host, "Notify[kick -> /./]", "/./");
    let resolve = |_: &Selector, _: &str| {
        fleet.iter().map(|(n, r)| Target { certname: n.clone(), role: Some(r.clone()) }).collect::<Vec<_>>()
    };
    let role_of = |host: &str| fleet.iter().find(|(n, _)| n == host).map(|(_, r)| r.clone());
    service.report(&report, resolve, role_of).into_iter().map(|l| l.message).collect()
}

#[test]
fn a_complete_role_graph_is_reported_in_bounded_time_and_size() {
    const ROLES: usize = 14;
    let dir = cache_dir("complete-graph");
    let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
    let service = KickService::start(config, &dir, Ok(Box::new(Recorder::default())), Box::new(|| {})).unwrap();
    let mut all_lines = Vec::new();
    for i in 0..ROLES {
        let started = std::time::Instant::now();
        let lines = complete_graph_report(&service, &format!("r{i}"), ROLES);
        let took = started.elapsed();
        // Correctness first: the kicks are queued or coalesced, each other server once.
        assert!(lines.iter().any(|l| l.contains("kick queued for") || l.contains("joins the one already queued")));
        assert!(lines.len() <= puppet_kicker::kick::MAX_LOG_LINES_PER_REPORT + 1, "{} lines", lines.len());
        assert!(took < Duration::from_secs(5), "report {i} took {took:?}");
        all_lines.extend(lines);
    }
    assert!(all_lines.iter().any(|l| l.starts_with("kick cycle between roles: role00 -> role01 -> role00")));
    let (status, status_len) = status_file(&service, &dir);
    assert!(status_len < 1 << 20, "status file is {status_len} bytes");
    let cycles = status["role_cycles"].as_array().unwrap();
    assert_eq!(cycles.len(), puppet_kicker::kick::MAX_ROLE_CYCLES_LISTED);
    assert!(status["role_cycles_left_out"].as_u64().unwrap() > 0);
    assert!(cycles.iter().all(|c| c.as_array().unwrap().len() <= KickConfig::default().max_hops + 2));
    // Every role kicks every other role; with one server per role, a role's only
    // server never kicks itself, so no role draws an edge to itself.
    assert_eq!(status["role_edges"].as_array().unwrap().len(), ROLES * (ROLES - 1));
}

/// `kick-status.json` (and its size) once it shows at least the generation of the
/// state the service holds now: the dispatcher writes it, off the report's thread,
/// within moments of a change.
fn status_file(service: &KickService, dir: &std::path::Path) -> (serde_json::Value, usize) {
    let generation = service.status()["generation"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let bytes = std::fs::read(dir.join(STATUS_FILE)).unwrap_or_default();
        if let Ok(status) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            if status["generation"].as_u64().is_some_and(|g| g >= generation) {
                return (status, bytes.len());
            }
        }
        assert!(std::time::Instant::now() < deadline, "{STATUS_FILE} did not reach generation {generation} in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_report_logs_at_most_the_cap_and_counts_the_rest() {
    let dir = cache_dir("log-cap");
    // Not due during the test: only the report's own lines are logged.
    let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
    let service = KickService::start(config, &dir, Ok(Box::new(Recorder::default())), Box::new(|| {})).unwrap();
    let cap = puppet_kicker::kick::MAX_LOG_LINES_PER_REPORT;
    let report_kicking = |servers: usize| {
        let report = support::role_kick("node1", "Kick[web]", "web");
        let resolve = |_: &Selector, _: &str| {
            (0..servers).map(|i| Target { certname: format!("web{i}"), role: Some("web".into()) }).collect()
        };
        service.report(&report, resolve, |_: &str| Some("node".to_string()))
    };
    // One line per target: exactly the cap is logged whole.
    let lines = report_kicking(cap);
    assert_eq!(lines.len(), cap, "{:?}", lines.last());
    assert!(!lines.iter().any(|l| l.message.contains("left out")));
    let lines = report_kicking(cap + 7);
    assert_eq!(lines.len(), cap + 1);
    assert!(lines[cap].message.starts_with("7 more kick log lines about this report left out"), "{:?}", lines[cap]);
}

fn quiet_report(service: &KickService, host: &str) -> Vec<String> {
    let report = support::role_kick(host, "Kick[nobody]", "nobody");
    service.report(&report, |_: &Selector, _: &str| Vec::new(), |_: &str| None).into_iter().map(|l| l.message).collect()
}

fn pending_targets(service: &KickService) -> Vec<String> {
    let status = service.status();
    status["pending"].as_array().unwrap().iter().map(|p| p["target"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_report_ending_a_kick_another_process_sent_is_taken_in_within_a_second() {
    // b has not seen a's kick of lb1 when lb1's report reaches it: it does not wake
    // its dispatcher for a report that ends nothing it knows of, but takes it in
    // within a second, so that a sees lb1's kicked run reported.
    let dir = cache_dir("late-ending");
    let recorder = Recorder::default();
    let b = process(&dir, &recorder);
    let a = process(&dir, &recorder);
    report(&a, "node1", "haproxy");
    assert_eq!(a.flush(Duration::from_secs(5)), 0);
    assert_eq!(a.status()["awaiting_confirmation"][0]["target"], "lb1");
    std::thread::sleep(Duration::from_millis(20));
    let reported = std::time::Instant::now();
    support::report_without_kicks(&b, "lb1");
    let confirmed = loop {
        a.sync();
        let status = a.status();
        if status["awaiting_confirmation"].as_array().unwrap().is_empty() {
            break status;
        }
        assert!(reported.elapsed() < Duration::from_secs(3), "not taken in: {status:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(confirmed["running"], serde_json::json!([]));
    assert_eq!(confirmed["confirmations"][0]["target"], "lb1", "{confirmed:#}");
    assert_eq!(confirmed["confirmations"][0]["outcome"], "changed", "{confirmed:#}");
}

#[test]
fn another_process_write_is_seen_even_with_the_same_length_and_mtime() {
    // A coarse-mtime file system: another process's write keeps length and mtime,
    // and (written in place here, or a reused inode) the inode: the generation tells.
    let dir = cache_dir("generation");
    let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
    let first = KickService::start(config, &dir, Ok(Box::new(Recorder::default())), Box::new(|| {})).unwrap();
    report(&first, "node1", "haproxy");
    let path = dir.join(puppet_kicker::kick::STATE_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let mut theirs: puppet_kicker::kick::PlannerState = rmp_serde::from_slice(&bytes).unwrap();
    let lb1 = theirs.targets.remove("lb1").unwrap();
    theirs.targets.insert("lb2".into(), lb1);
    theirs.generation += 1;
    let written = rmp_serde::to_vec_named(&theirs).unwrap();
    assert_eq!(written.len(), bytes.len());
    std::fs::write(&path, &written).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();

    quiet_report(&first, "db1");
    assert_eq!(pending_targets(&first), ["lb2"], "the other process's state was read");
}

#[test]
fn a_failed_save_keeps_the_change_merges_the_others_and_retries() {
    let dir = cache_dir("full-disk");
    let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
    let start =
        || KickService::start(config.clone(), &dir, Ok(Box::new(Recorder::default())), Box::new(|| {})).unwrap();
    let first = start();
    // Saving fails (a directory where the file goes, as a full disk would fail it).
    let path = dir.join(puppet_kicker::kick::STATE_FILE);
    std::fs::create_dir_all(&path).unwrap();
    let lines = report(&first, "node1", "haproxy");
    assert!(lines.iter().any(|l| l.starts_with("cannot save kick state") && l.contains("kept in memory")), "{lines:?}");
    std::fs::remove_dir(&path).unwrap();

    // Meanwhile another process saves its own kicks.
    let second = start();
    report(&second, "lb1", "node");
    // (The first one's dispatcher may have saved already: then lb1 is here too.)
    assert!(pending_targets(&second).ends_with(&["node1".to_string(), "node2".into()]));

    // The first one's next step merges, and saves both.
    let lines = quiet_report(&first, "db1");
    assert!(lines.iter().any(|l| l.contains("again, after") && l.contains("failed attempt(s)")), "{lines:?}");
    assert_eq!(pending_targets(&first), ["lb1", "node1", "node2"]);
    let third = start();
    assert_eq!(pending_targets(&third), ["lb1", "node1", "node2"], "on disk");
}

#[test]
fn a_failed_save_is_retried_by_the_dispatcher_without_a_new_report() {
    let dir = cache_dir("retry-save");
    let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
    let service = KickService::start(config, &dir, Ok(Box::new(Recorder::default())), Box::new(|| {})).unwrap();
    let path = dir.join(puppet_kicker::kick::STATE_FILE);
    std::fs::create_dir_all(&path).unwrap();
    report(&service, "node1", "haproxy");
    std::fs::remove_dir(&path).unwrap();
    let waited = std::time::Instant::now();
    while !path.is_file() {
        assert!(waited.elapsed() < Duration::from_secs(20), "never saved again");
        std::thread::sleep(Duration::from_millis(100));
    }
    let saved: puppet_kicker::kick::PlannerState = rmp_serde::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(saved.targets.contains_key("lb1"));
}

#[test]
fn a_hostile_report_over_a_large_fleet_is_cut_to_its_budget_quickly() {
    // 2,000 servers; a report with 256 kicks of 64 regex roles each (3.1 s under the
    // kick lock before the budget).
    let root = cache_dir("hostile-fleet");
    let facts = root.join("var/server_data/facts");
    std::fs::create_dir_all(&facts).unwrap();
    for i in 0..2000 {
        let name = format!("n{i}.example.com");
        let doc = serde_json::json!({"name": name, "values": {"role": format!("role{}", i % 40), "environment": "production"}});
        std::fs::write(facts.join(format!("{name}.json")), doc.to_string()).unwrap();
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/puppet_kicker.yaml"), "kick:\n  dry_run: true\n").unwrap();
    let settings =
        puppet_kicker::PuppetSettings { confdir: root.join("etc"), vardir: root.join("var"), ..Default::default() };
    let kicker = puppet_kicker::Service::start(settings).unwrap();
    let roles: Vec<String> = (0..64).map(|i| format!("/^(role{}|r.*o.*l.*e.*x)$/", i % 16)).collect();
    let kicks: Vec<serde_json::Value> =
        (0..256).map(|k| serde_json::json!({"resource": format!("Kick[k{k}]"), "roles": roles})).collect();
    let report = serde_json::json!({"host": "n1.example.com", "environment": "production",
                                    "time": puppet_kicker::kick::now_ms(), "kicks": kicks});
    let report = puppet_kicker::kick::parse_report(report.to_string().as_bytes()).unwrap();
    kicker.kick_report(&ReportKicks { kicks: Vec::new(), ..report.clone() }).unwrap(); // warm the index

    let started = std::time::Instant::now();
    let lines: Vec<String> = kicker.kick_report(&report).unwrap().into_iter().map(|l| l.message).collect();
    let took = started.elapsed();
    // Each kick selects roles 0..15: 800 servers. The first is resolved; the second
    // would make 1,600 targets; the third would make 192 roles and clauses.
    let status = kicker.kick_status().unwrap();
    assert_eq!(status["dry_run"], true);
    let cap = puppet_kicker::kick::MAX_LOG_LINES_PER_REPORT;
    assert_eq!(lines.len(), cap + 1);
    // The budget cuts come first (warnings before routine lines), one line per limit.
    let over = |kick: &str, what: &str| {
        format!("kick of all targets by n1.example.com ({kick}) suppressed: the report exceeds its budget: {what}")
    };
    assert!(lines.contains(&over("Kick[k1]", "more than 1000 targets (kick.budget.targets)")), "{lines:?}");
    assert!(
        lines.contains(&over("Kick[k2] and 29 more kicks", "more than 128 roles and clauses (kick.budget.clauses)"))
    );
    assert!(lines.contains(&over("Kick[k32] and 223 more kicks", "more than 32 kicks (kick.budget.kicks)")));
    assert!(lines.iter().any(|l| l.starts_with("kick cycle between roles: role1 -> role1")));
    assert!(lines.iter().filter(|l| l.starts_with("dry run: would kick n")).count() > 90);
    // 799 would-kick lines, the line leaving n1 itself out, the role1 -> role1 cycle and the 3 cuts.
    let left_out = format!("{} more kick log lines about this report left out", 799 + 1 + 1 + 3 - cap);
    assert!(lines[cap].starts_with(&left_out), "{}", lines[cap]);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    eprintln!("hostile report over 2,000 servers: {took:?}");
}

#[test]
fn index_warnings_beyond_the_pending_limit_are_counted_in_one_line() {
    // 300 unreadable fact files: one warning each, more than the 256 kept.
    let root = cache_dir("warnings");
    let facts = root.join("var/server_data/facts");
    std::fs::create_dir_all(&facts).unwrap();
    std::fs::write(facts.join("good.example.com.json"), r#"{"name":"good.example.com","values":{"role":"x"}}"#)
        .unwrap();
    for i in 0..300 {
        std::fs::write(facts.join(format!("bad{i}.example.com.json")), "{not json").unwrap();
    }
    let settings =
        puppet_kicker::PuppetSettings { confdir: root.join("etc"), vardir: root.join("var"), ..Default::default() };
    let kicker = puppet_kicker::Service::start(settings).unwrap();
    assert!(kicker.refresh_and_wait(Duration::from_secs(30)));
    let warnings = kicker.take_warnings();
    assert_eq!(warnings.len(), 256 + 1, "{:?}", warnings.last());
    assert!(warnings[256].starts_with("44 more puppet-kicker warnings left out"), "{}", warnings[256]);
    assert!(kicker.take_warnings().is_empty(), "counted once");
}

#[test]
#[ignore = "needs root"]
fn a_full_disk_loses_no_kick_and_the_save_succeeds_once_space_is_back() {
    let dir = cache_dir("enospc");
    std::fs::create_dir_all(&dir).unwrap();
    let tmpfs = Tmpfs::mount(&dir, 256 << 10);
    let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
    let start =
        || KickService::start(config.clone(), &dir, Ok(Box::new(Recorder::default())), Box::new(|| {})).unwrap();
    let service = start();
    quiet_report(&service, "db1"); // kicks.lock and a first state file exist

    // Fill the file system to the last byte.
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut file, &chunk).is_ok() {}
    while std::io::Write::write_all(&mut file, &chunk[..1]).is_ok() {}
    drop(file);

    let lines = report(&service, "node1", "haproxy");
    assert!(
        lines.iter().any(|l| l.starts_with("cannot save kick state")
            && l.contains("No space left on device")
            && l.contains("kept in memory")),
        "{lines:?}"
    );
    assert_eq!(pending_targets(&service), ["lb1"], "the kick is kept in memory");

    std::fs::remove_file(&filler).unwrap();
    let waited = std::time::Instant::now();
    loop {
        if pending_targets(&start()) == ["lb1"] {
            break; // another process sees it on disk
        }
        assert!(waited.elapsed() < Duration::from_secs(20), "the dispatcher never saved again");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(service);
    drop(tmpfs);
}

/// Answers "started" once three kicks were sent (waiting up to 10 s for that, so
/// that the first three overlap however slow the machine), counting how many
/// answer at once.
#[derive(Default)]
struct Slow {
    now: std::sync::atomic::AtomicUsize,
    begun: std::sync::atomic::AtomicUsize,
    most: Arc<std::sync::atomic::AtomicUsize>,
    sent: Arc<Mutex<Vec<String>>>,
}

impl Transport for Slow {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        self.begun.fetch_add(1, SeqCst);
        let waited = std::time::Instant::now();
        while self.begun.load(SeqCst) < 3 && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        self.sent.lock().unwrap().push(dispatch.target.clone());
        self.now.fetch_sub(1, SeqCst);
        Outcome::Started
    }

    fn max_parallel(&self) -> usize {
        3
    }
}

#[test]
fn the_dispatcher_sends_up_to_the_transports_max_parallel_at_once() {
    let dir = cache_dir("parallel");
    let slow = Slow::default();
    let (most, sent) = (slow.most.clone(), slow.sent.clone());
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let service = KickService::start(config, &dir, Ok(Box::new(slow)), Box::new(|| {})).unwrap();
    let report = support::role_kick("node1", "Notify[kick -> web]", "web");
    let targets: Vec<Target> =
        (1..=9).map(|i| Target { certname: format!("web{i}"), role: Some("web".into()) }).collect();
    service.report(&report, |_, _| targets.clone(), |_| Some("node".into()));
    assert_eq!(service.flush(Duration::from_secs(60)), 0);
    let mut sent = sent.lock().unwrap().clone();
    sent.sort();
    assert_eq!(sent, (1..=9).map(|i| format!("web{i}")).collect::<Vec<_>>(), "each once");
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 3);
    let status = service.status();
    assert_eq!(status["counters"]["sent"], 9, "{status}");
}

/// Answers after a pause, up to 32 at once.
struct Pausing;

impl Transport for Pausing {
    fn runonce(&self, _: &Dispatch) -> Outcome {
        std::thread::sleep(Duration::from_millis(20));
        Outcome::Started
    }

    fn max_parallel(&self) -> usize {
        32
    }
}

#[test]
fn kicks_sent_at_once_share_their_state_writes_and_each_is_saved() {
    let dir = cache_dir("group-commit");
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let service = KickService::start(config, &dir, Ok(Box::new(Pausing)), Box::new(|| {})).unwrap();
    let report = support::role_kick("node1", "Notify[kick -> web]", "web");
    let targets: Vec<Target> =
        (0..256).map(|i| Target { certname: format!("web{i:03}"), role: Some("web".into()) }).collect();
    service.report(&report, |_, _| targets.clone(), |_| Some("node".into()));
    let generation_before = service.status()["generation"].as_u64().unwrap();
    assert_eq!(service.flush(Duration::from_secs(60)), 0);
    // Each kick is claimed and its outcome saved: 512 changes. One transaction each
    // would be 512 writes of the state file; saved together, far fewer.
    let writes = service.status()["generation"].as_u64().unwrap() - generation_before;
    assert!(writes < 256, "{writes} writes of the state for 256 kicks");
    // What is on disk has every kick's outcome: another process reads them all.
    let saved = puppet_kicker::kick::load_state(&dir).unwrap();
    let started = saved.targets.values().filter(|t| t.running.is_some()).count();
    assert_eq!(started, 256);
    let _ = std::fs::remove_dir_all(dir);
}

/// lb1's report of its kicked run, with no kick of its own, ending as `status`.
fn run_report(status: &str) -> ReportKicks {
    let json = format!(
        r#"{{"host":"lb1","environment":"production","time":{},"status":"{status}"}}"#,
        puppet_kicker::kick::now_ms()
    );
    puppet_kicker::kick::parse_report(json.as_bytes()).unwrap()
}

#[test]
fn a_kicked_servers_report_confirms_its_kick_in_the_background_and_another_process_sees_it() {
    let dir = cache_dir("confirm");
    let recorder = Recorder::default();
    let master = process(&dir, &recorder);
    report(&master, "node1", "haproxy");
    assert_eq!(master.flush(Duration::from_secs(5)), 0);
    assert_eq!(master.status()["awaiting_confirmation"][0]["target"], "lb1");

    // The report's call neither takes the state's file lock nor confirms: with the
    // lock held by another process (here, this test), it returns at once, and the
    // dispatcher takes the report in once the lock is free.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(puppet_kicker::kick::STATE_FILE).with_extension("lock"))
        .unwrap();
    lock.lock().unwrap();
    let lines = master.report(&run_report("failed"), |_, _| Vec::new(), |_| None);
    assert!(lines.iter().all(|l| !l.message.contains("reported")), "not on the report's thread: {lines:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert!(puppet_kicker::kick::load_state(&dir).unwrap().confirmations.is_empty(), "saved under another's lock");
    drop(lock);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let saved = loop {
        let state = puppet_kicker::kick::load_state(&dir).unwrap();
        if !state.confirmations.is_empty() {
            break state;
        }
        assert!(std::time::Instant::now() < deadline, "the confirmation was not saved within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(saved.confirmations[0].outcome, "failed");
    assert_eq!(saved.counters.confirmed_failed, 1);
    assert!(saved.awaiting.is_empty());
    let log: Vec<String> = master.take_log().into_iter().map(|l| format!("{:?} {}", l.level, l.message)).collect();
    assert!(
        log.iter()
            .any(|l| l.starts_with("Warning kicked run of lb1 reported (chain node1 -> lb1): FAILED, the run of ")),
        "{log:?}"
    );

    // Another process (an operator's `puppet kicker status`) reads it from the file.
    let operator = process(&dir, &Recorder::default());
    assert_eq!(operator.status()["confirmations"][0]["outcome"], "failed");
}

#[test]
fn a_short_lived_process_takes_its_reports_in_before_it_exits() {
    let dir = cache_dir("confirm-flush");
    let recorder = Recorder::default();
    let node1 = process(&dir, &recorder);
    report(&node1, "node1", "haproxy");
    assert_eq!(node1.flush(Duration::from_secs(5)), 0);
    drop(node1);
    // lb1's own `puppet apply`: its report, then the flush at exit, then gone.
    let lb1 = process(&dir, &recorder);
    lb1.report(&run_report("changed"), |_, _| Vec::new(), |_| None);
    lb1.flush(Duration::ZERO);
    let state = puppet_kicker::kick::load_state(&dir).unwrap();
    assert_eq!(state.counters.confirmed_changed, 1, "saved by the flush, before the process exits");
}
