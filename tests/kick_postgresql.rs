//! `kick.state: postgresql` against a real PostgreSQL 15 (tests/support/postgres.rs:
//! a cluster of the test's own on 127.0.0.1, TLS from a test CA, a password): two
//! kick services with two cache dirs stand for two compilers sharing one state.

use puppet_kicker::config::{Config, PuppetSettings};
use puppet_kicker::kick::postgresql::{PgStore, SharedStore};
use puppet_kicker::kick::{Dispatch, KickConfig, KickService, Outcome, RateLimit, Transport};
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};
use support::postgres::{self, Postgres};

mod support;

use support::Recorder;

fn cache_dir(name: &str) -> PathBuf {
    support::scratch_path(&format!("pgkick-{name}"))
}

/// The `kick.postgresql.*` keys for `pg`, read as puppet_kicker.yaml is.
fn yaml(pg: &Postgres, schema: &str, ca: &Path, password_file: &Path) -> String {
    format!(
        "kick:\n  state: postgresql\n  postgresql:\n    host: 127.0.0.1\n    port: {}\n    database: {}\n    user: {}\n    schema: {schema}\n    ca: {}\n    cert: {}\n    key: {}\n    password_file: {}\n    statement_timeout: 5s\n    connect_timeout: 2s\n",
        pg.port,
        postgres::DATABASE,
        postgres::USER,
        ca.display(),
        pg.cert.display(),
        pg.key.display(),
        password_file.display()
    )
}

fn store_with(pg: &Postgres, schema: &str, ca: &Path, password_file: &Path, dir: &Path) -> (PgStore, PathBuf) {
    let settings = PuppetSettings::default();
    let config =
        Config::parse(&yaml(pg, schema, ca, password_file), Path::new("/etc/puppet/puppet_kicker.yaml"), &settings)
            .expect("the configuration");
    let connection = config.kick.postgresql.connection(&settings).expect("the connection settings");
    std::fs::create_dir_all(dir).unwrap();
    (PgStore::new(connection, schema, 2, "test"), dir.to_path_buf())
}

/// One compiler: a kick service over the shared state in `pg`'s `schema`.
fn compiler(pg: &Postgres, schema: &str, name: &str, config: KickConfig, recorder: &Recorder) -> KickService {
    let dir = cache_dir(name);
    let (mut pg_store, dir) = store_with(pg, schema, &pg.ca, &pg.password_file, &dir);
    pg_store.check().expect("the shared state is reachable");
    let store = SharedStore::new(pg_store, &dir, config.keep_outcomes);
    KickService::start_with(config, &dir, Box::new(store), Vec::new(), Ok(Box::new(recorder.clone())), Box::new(|| {}))
        .unwrap()
}

/// The servers the compilers know: two nodes, two load balancers.
const FLEET: &[(&str, &str)] = &[("node1", "node"), ("node2", "node"), ("lb1", "haproxy"), ("lb2", "haproxy")];

fn fleet_report(service: &KickService, host: &str, role: &str) -> Vec<String> {
    support::fleet_report(service, FLEET, host, role)
}

/// Waits until `done` holds, at most `timeout`.
fn wait_for(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn reports_at_both_compilers_within_one_window_make_one_run_of_each_target() {
    let pg = Postgres::start("window");
    let recorder = Recorder::default();
    let config = KickConfig { coalesce_ms: 2_000, ..KickConfig::default() };
    let a = compiler(&pg, "window", "window-a", config.clone(), &recorder);
    let b = compiler(&pg, "window", "window-b", config, &recorder);
    fleet_report(&a, "node1", "haproxy");
    fleet_report(&b, "node2", "haproxy");
    let left = a.flush(Duration::from_secs(20));
    assert_eq!(left, 0, "{:?} {:?} {}", a.take_log(), a.waiting_for(), a.status());
    assert_eq!(b.flush(Duration::from_secs(20)), 0);
    assert_eq!(recorder.kicked(), ["lb1", "lb2"], "each target once, by one compiler");
    // Both compilers see the same state: the other's report is in the chain.
    let status = b.status();
    assert_eq!(status["state"]["shared"], true);
    assert!(status["state"]["outage"].is_null(), "{}", status["state"]);
    a.sync();
    assert_eq!(a.status()["counters"]["sent"], 2);
}

#[test]
fn a_rate_limit_holds_across_both_compilers() {
    let pg = Postgres::start("rate");
    let recorder = Recorder::default();
    let config =
        KickConfig { coalesce_ms: 0, rate_limit: RateLimit { max: 2, window_ms: 60_000 }, ..KickConfig::default() };
    let a = compiler(&pg, "rate", "rate-a", config.clone(), &recorder);
    let b = compiler(&pg, "rate", "rate-b", config, &recorder);
    fleet_report(&a, "node1", "haproxy");
    fleet_report(&b, "node1", "haproxy");
    let third = fleet_report(&a, "node1", "haproxy");
    assert!(
        third.iter().any(|l| l.contains("rate limit")),
        "the third kicking report of node1 within the window: {third:?}"
    );
    let fourth = fleet_report(&b, "node1", "haproxy");
    assert!(fourth.iter().any(|l| l.contains("rate limit")), "and at the other compiler: {fourth:?}");
    a.sync();
    assert_eq!(a.status()["counters"]["suppressed"], 2);
}

#[test]
fn a_loop_through_reports_split_across_compilers_is_stopped() {
    let pg = Postgres::start("loop");
    let recorder = Recorder::default();
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let a = compiler(&pg, "loop", "loop-a", config.clone(), &recorder);
    let b = compiler(&pg, "loop", "loop-b", config, &recorder);
    // node1 (its report at compiler a) kicks the load balancers.
    fleet_report(&a, "node1", "haproxy");
    assert_eq!(a.flush(Duration::from_secs(10)), 0);
    // lb1's kicked run reports to compiler b, and would kick node1 back.
    let lines = fleet_report(&b, "lb1", "node");
    assert!(lines.iter().any(|l| l.contains("kicked run of lb1 reported (chain node1 -> lb1)")), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains(
            "kick of node1 by lb1 (Notify[kick -> node]) suppressed: it would close a loop: node1 -> lb1 -> node1"
        )),
        "the loop is seen across compilers: {lines:?}"
    );
    assert_eq!(b.flush(Duration::from_secs(10)), 0);
    assert_eq!(recorder.kicked(), ["lb1", "lb2", "node2"]);
    a.sync();
    assert_eq!(a.status()["role_cycles"], serde_json::json!([["haproxy", "node", "haproxy"]]), "one role graph");
}

#[test]
fn the_database_stopped_and_started_again_loses_no_kick() {
    let pg = Postgres::start("outage");
    let recorder = Recorder::default();
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let a = compiler(&pg, "outage", "outage-a", config, &recorder);
    a.sync();
    pg.stop();
    // A report during the outage is still taken in; its kicks wait.
    let started = Instant::now();
    let lines = fleet_report(&a, "node1", "haproxy");
    assert!(started.elapsed() < Duration::from_secs(4), "the report waited {:?}", started.elapsed());
    let log: Vec<String> = lines.into_iter().chain(a.take_log().into_iter().map(|l| l.message)).collect();
    assert!(log.iter().any(|l| l.contains("kick queued for lb1")), "{log:?}");
    assert!(
        log.iter()
            .any(|l| l.contains("unreachable") && l.contains("merged when it is back") && l.contains("next try in")),
        "{log:?}"
    );
    let status = a.status();
    assert!(status["state"]["outage"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{}", status["state"]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(recorder.kicked().is_empty(), "nothing sent during the outage");
    pg.run();
    wait_for(Duration::from_secs(60), "the kicks kept during the outage sent", || recorder.kicked().len() == 2);
    assert_eq!(recorder.kicked(), ["lb1", "lb2"]);
    wait_for(Duration::from_secs(10), "the outage's end", || a.status()["state"]["outage"].is_null());
    // What was kept is in the shared state: another compiler sees it.
    let b = compiler(&pg, "outage", "outage-b", KickConfig::default(), &Recorder::default());
    assert_eq!(b.status()["counters"]["sent"], 2);
}

#[test]
fn a_wrong_password_or_ca_is_a_clear_error_not_an_outage() {
    let pg = Postgres::start("refused");
    let dir = cache_dir("refused");
    let wrong = pg.dir.join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let (mut store, _) = store_with(&pg, "refused", &pg.ca, &wrong, &dir);
    let e = store.check().unwrap_err();
    assert!(!e.outage, "{e:?}");
    assert!(e.reason.contains("password authentication failed for user \"kicker\""), "{}", e.reason);
    assert!(!e.reason.contains("not-the-password"), "{}", e.reason);

    let (mut store, _) = store_with(&pg, "refused", &pg.other_ca, &pg.password_file, &dir);
    let e = store.check().unwrap_err();
    assert!(!e.outage, "{e:?}");
    assert!(e.reason.contains("invalid peer certificate") && e.reason.contains("UnknownIssuer"), "{}", e.reason);

    // The right ones work; a schema newer than this module is refused.
    let (mut store, _) = store_with(&pg, "refused", &pg.ca, &pg.password_file, &dir);
    store.check().expect("the right password and CA");
    pg.psql("INSERT INTO refused.schema_version (version, applied_by) VALUES (99, 'a newer module')");
    let (mut store, _) = store_with(&pg, "refused", &pg.ca, &pg.password_file, &dir);
    let e = store.check().unwrap_err();
    assert!(!e.outage);
    assert!(e.reason.contains("schema refused is at version 99, newer than this puppet-kicker's (1)"), "{}", e.reason);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_schema_is_created_once_and_only_in_its_schema() {
    let pg = Postgres::start("schema");
    let before = pg.psql("SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')");
    assert_eq!(before, "0");
    let recorder = Recorder::default();
    let a = compiler(&pg, "kicks_here", "schema-a", KickConfig::default(), &recorder);
    let b = compiler(&pg, "kicks_here", "schema-b", KickConfig::default(), &recorder);
    drop((a, b));
    let tables = pg.psql(
        "SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    );
    assert_eq!(tables, "kicks_here.kick_state,kicks_here.schema_version");
    assert_eq!(pg.psql("SELECT string_agg(version::text, ',') FROM kicks_here.schema_version"), "1");
    // PostgreSQL 15 as Debian builds it has lz4: the state is compressed with it, and
    // kept in the row while it fits in a page.
    let storage =
        "SELECT attstorage::text || attcompression::text || ' ' || coalesce(array_to_string(reloptions, ','), '') \
                   FROM pg_attribute JOIN pg_class ON attrelid = pg_class.oid \
                   WHERE attrelid = 'kicks_here.kick_state'::regclass AND attname = 'state'";
    assert_eq!(pg.psql(storage), "ml toast_tuple_target=8160", "main storage, lz4, in the row up to a page");
    // A schema made before (stored out of line, uncompressed) is set so at the next start.
    pg.psql(
        "ALTER TABLE kicks_here.kick_state ALTER COLUMN state SET STORAGE EXTERNAL, \
         ALTER COLUMN state SET COMPRESSION DEFAULT, RESET (toast_tuple_target)",
    );
    assert_eq!(pg.psql(storage), "e");
    drop(compiler(&pg, "kicks_here", "schema-c", KickConfig::default(), &recorder));
    assert_eq!(pg.psql(storage), "ml toast_tuple_target=8160");
    assert_eq!(pg.psql("SELECT string_agg(version::text, ',') FROM kicks_here.schema_version"), "1");
}

/// Records the kick in a file, then never answers: a compiler that hangs mid-send
/// until it is killed.
struct Hangs(PathBuf);

impl Transport for Hangs {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        std::fs::write(&self.0, &dispatch.target).unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

#[test]
fn a_compiler_killed_holding_claims_loses_none_and_each_target_runs_once_or_twice() {
    // The child: this same test, re-run with PK_PG_CHILD set, as compiler a.
    if let Ok(spec) = std::env::var("PK_PG_CHILD") {
        let (port, pg_dir, claimed) = {
            let mut parts = spec.splitn(3, ' ');
            (
                parts.next().unwrap().parse::<u16>().unwrap(),
                parts.next().unwrap().to_string(),
                parts.next().unwrap().to_string(),
            )
        };
        let pg = Postgres::attach(port, Path::new(&pg_dir));
        let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
        let dir = cache_dir("killed-a");
        let (mut store, dir) = store_with(&pg, "killed", &pg.ca, &pg.password_file, &dir);
        store.check().unwrap();
        let store = SharedStore::new(store, &dir, config.keep_outcomes);
        let hangs = Box::new(Hangs(PathBuf::from(claimed)));
        let a = KickService::start_with(config, &dir, Box::new(store), Vec::new(), Ok(hangs), Box::new(|| {})).unwrap();
        fleet_report(&a, "node1", "haproxy");
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    let pg = Postgres::start("killed");
    // The schema exists before the child starts.
    let (mut store, _) = store_with(&pg, "killed", &pg.ca, &pg.password_file, &cache_dir("killed-setup"));
    store.check().unwrap();
    let claimed = pg.dir.join("claimed-by-a");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_compiler_killed_holding_claims_loses_none_and_each_target_runs_once_or_twice",
            "--exact",
            "--nocapture",
        ])
        .env("PK_PG_CHILD", format!("{} {} {}", pg.port, pg.dir.display(), claimed.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(30), "compiler a sending its first kick", || claimed.exists());
    // Killed mid-send: lb1's runonce sent (and maybe run), lb2 claimed but not sent.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let first = std::fs::read_to_string(&claimed).unwrap();

    let recorder = Recorder::default();
    let lease_ms = 3_000;
    let config = KickConfig { coalesce_ms: 0, in_flight_timeout_ms: lease_ms, ..KickConfig::default() };
    let b = compiler(&pg, "killed", "killed-b", config, &recorder);
    let started = Instant::now();
    assert_eq!(b.flush(Duration::from_secs(30)), 0, "{:?}", b.waiting_for());
    let mut runs: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    *runs.entry(first.clone()).or_default() += 1;
    for target in recorder.kicked() {
        *runs.entry(target).or_default() += 1;
    }
    assert_eq!(runs.keys().collect::<Vec<_>>(), ["lb1", "lb2"], "no kick lost: {runs:?}");
    assert!(runs.values().all(|n| (1..=2).contains(n)), "each target once or twice: {runs:?}");
    assert_eq!(runs[&first], 2, "the one a sent is sent again after the lease: {runs:?}");
    assert!(started.elapsed() >= Duration::from_millis(lease_ms as u64 / 2), "not before the lease ran out");
}

#[test]
fn kicks_kept_during_an_outage_survive_a_restart_of_the_compiler() {
    let pg = Postgres::start("restart");
    let recorder = Recorder::default();
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let dir = cache_dir("restart-a");
    let start = |recorder: &Recorder| {
        let (store, dir) = store_with(&pg, "restart", &pg.ca, &pg.password_file, &dir);
        let store = SharedStore::new(store, &dir, config.keep_outcomes);
        KickService::start_with(
            config.clone(),
            &dir,
            Box::new(store),
            Vec::new(),
            Ok(Box::new(recorder.clone())),
            Box::new(|| {}),
        )
        .unwrap()
    };
    {
        let a = start(&recorder);
        a.sync();
        pg.stop();
        fleet_report(&a, "node1", "haproxy");
        // The compiler exits during the outage: what it kept is in its cache dir.
        assert_eq!(a.flush(Duration::from_millis(300)), 2);
    }
    assert!(dir.join(puppet_kicker::kick::postgresql::UNSHARED_MARKER).exists());
    assert!(recorder.kicked().is_empty());
    pg.run();
    // Started again (the database back): the kept kicks are merged and sent.
    let a = start(&recorder);
    assert_eq!(a.flush(Duration::from_secs(30)), 0, "{:?}", a.waiting_for());
    assert_eq!(recorder.kicked(), ["lb1", "lb2"]);
    assert!(!dir.join(puppet_kicker::kick::postgresql::UNSHARED_MARKER).exists(), "merged: no longer marked");
    let b = compiler(&pg, "restart", "restart-b", KickConfig::default(), &Recorder::default());
    assert_eq!(b.status()["counters"]["sent"], 2, "in the shared state");
}

/// A scratch master whose fact cache is the fixtures' (lb1.example.com has role
/// haproxy), its kick state in `pg`: Puppet's own certificate, key and CA (here the
/// test CA's) are the connection's, as the keys' defaults say.
fn master(pg: &Postgres, name: &str) -> (puppet_kicker::service::Service, PathBuf) {
    let yaml = format!(
        "kick:\n  dry_run: true\n  coalesce: 0\n  state: postgresql\n  postgresql:\n    host: 127.0.0.1\n    port: {}\n    database: {}\n    user: {}\n    password_file: {}\n    connect_timeout: 2s\n",
        pg.port,
        postgres::DATABASE,
        postgres::USER,
        pg.password_file.display()
    );
    let (settings, root) = support::scratch_master(&format!("pk-pg-master-{name}"), &yaml);
    let settings = PuppetSettings {
        hostcert: Some(pg.cert.clone()),
        hostprivkey: Some(pg.key.clone()),
        localcacert: Some(pg.ca.clone()),
        ..settings
    };
    (puppet_kicker::service::Service::start(settings).unwrap(), root)
}

#[test]
fn the_service_keeps_its_kicks_in_the_shared_state_and_its_status_says_so() {
    let pg = Postgres::start("service");
    let (service, root) = master(&pg, "service");
    let report = support::role_kick("node1.example.com", "Notify[kick -> haproxy]", "haproxy");
    let lines: Vec<String> = service.kick_report(&report).unwrap().into_iter().map(|l| l.message).collect();
    assert!(lines.iter().any(|l| l.contains("lb1.example.com")), "{lines:?}");
    service.kick_flush();
    // Another compiler's view: the shared state, read now.
    let (other, other_root) = master(&pg, "service-other");
    // (`puppet kicker status` puts this document under kicks.document, as the local one.)
    let status = other.shared_kick_status().expect("a shared state");
    assert_eq!(status["state"]["shared"], true, "{status}");
    assert!(status["state"]["store"].as_str().unwrap().starts_with("postgresql://kicker@127.0.0.1:"));
    assert!(status["state"]["outage"].is_null());
    assert_eq!(status["role_edges"], serde_json::json!([["node", "haproxy"]]), "{status}");
    let graph = other.kick_state().unwrap();
    assert_eq!(graph.graph.edges().map(|(a, b)| format!("{a}->{b}")).collect::<Vec<_>>(), ["node->haproxy"]);

    // The database down: the status says so, with the reason.
    pg.stop();
    let status = other.shared_kick_status().unwrap();
    let reason = status["unreadable"].as_str().unwrap_or_default();
    assert!(reason.starts_with("shared kick state postgresql://kicker@127.0.0.1:"), "{status}");
    assert!(status["document"]["state"]["outage"]["reason"].is_string(), "{status}");
    drop((service, other));
    let _ = std::fs::remove_dir_all(root);
    let _ = std::fs::remove_dir_all(other_root);
}

#[test]
fn a_compiler_started_during_an_outage_does_not_take_an_old_local_file_for_the_state() {
    let pg = Postgres::start("stale");
    let dir = cache_dir("stale-a");
    let recorder = Recorder::default();
    {
        // Long ago, on the local state: kicks of the nodes, left pending.
        let config = KickConfig { coalesce_ms: 3_600_000, ..KickConfig::default() };
        let local = KickService::start(config, &dir, Ok(Box::new(recorder.clone())), Box::new(|| {})).unwrap();
        fleet_report(&local, "lb1", "node");
        assert_eq!(local.flush(Duration::ZERO), 2);
    }
    let (mut store, _) = store_with(&pg, "stale", &pg.ca, &pg.password_file, &dir);
    store.check().unwrap();
    pg.stop();
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let store = SharedStore::new(store, &dir, config.keep_outcomes);
    let a = KickService::start_with(
        config,
        &dir,
        Box::new(store),
        Vec::new(),
        Ok(Box::new(recorder.clone())),
        Box::new(|| {}),
    )
    .unwrap();
    fleet_report(&a, "node1", "haproxy");
    pg.run();
    assert_eq!(a.flush(Duration::from_secs(30)), 0, "{:?}", a.waiting_for());
    assert_eq!(recorder.kicked(), ["lb1", "lb2"], "the old file's kicks are not the shared state's");
}

/// The servers whose kicked run the status shows under way.
fn running(service: &KickService) -> Vec<String> {
    service.sync();
    let status = service.status();
    status["running"].as_array().unwrap().iter().map(|r| r["target"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_compiler_idle_through_an_outage_does_not_bring_back_what_it_last_saw() {
    let pg = Postgres::start("idle-outage");
    let recorder = Recorder::default();
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let a = compiler(&pg, "idle_outage", "idle-outage-a", config.clone(), &recorder);
    let b = compiler(&pg, "idle_outage", "idle-outage-b", config, &recorder);
    fleet_report(&a, "node1", "haproxy");
    assert_eq!(a.flush(Duration::from_secs(20)), 0);
    assert_eq!(recorder.kicked(), ["lb1", "lb2"]);
    // b last sees both load balancers' kicked runs under way ...
    assert_eq!(running(&b), ["lb1", "lb2"]);
    // ... which then report, at a.
    support::report_without_kicks(&a, "lb1");
    support::report_without_kicks(&a, "lb2");
    assert_eq!(running(&a), Vec::<String>::new());
    // The database goes away; a report at b kicks another role meanwhile.
    pg.stop();
    let lines = fleet_report(&b, "node2", "node");
    assert!(lines.iter().any(|l| l.contains("kick queued for node1")), "{lines:?}");
    pg.run();
    wait_for(Duration::from_secs(60), "b's kick sent after the outage", || recorder.kicked().contains(&"node1".into()));
    // The shared state has b's kick, and not b's old view of the load balancers.
    assert_eq!(running(&a), ["node1"]);
    assert_eq!(running(&b), ["node1"]);
    assert_eq!(recorder.kicked(), ["lb1", "lb2", "node1"]);
}

#[test]
fn a_restart_of_the_database_between_two_transactions_is_not_an_outage() {
    use puppet_kicker::kick::StateStore;
    let pg = Postgres::start("db-restart");
    let dir = cache_dir("db-restart");
    let (mut pg_store, dir) = store_with(&pg, "db_restart", &pg.ca, &pg.password_file, &dir);
    pg_store.check().expect("the shared state is reachable");
    let mut store = SharedStore::new(pg_store, &dir, 10);
    store.begin(u64::MAX);
    store.release();
    // The pooled connection dies with the server; the next transaction finds it dead.
    pg.stop();
    pg.run();
    let begun = store.begin(u64::MAX);
    store.release();
    assert!(begun.warnings.is_empty(), "{:?}", begun.warnings);
    assert!(store.health().outage.is_none(), "{:?}", store.health().outage);
}
