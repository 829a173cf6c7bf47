//! `cargo bench --bench transports`: what a kick costs through each transport, on
//! 127.0.0.1, through the same path a master takes (`Service::kick_report`, the call
//! the `kick` report processor makes, then the dispatcher's threads):
//!
//! (1) **Choria**: a report whose kick resolves to 1,000 servers, until each
//!     `runonce` is acknowledged (every target shows a started run). The broker is
//!     Debian's `nats-server` with TLS; the servers' side is the responder of the
//!     tests (`tests/support/nats_choria.rs`), which verifies each request's
//!     certificate and signature and answers as a Choria server would, for every
//!     identity. No Choria server is packaged for these machines.
//! (2) **SSH**: a report whose kick resolves to 200 servers, until each is
//!     acknowledged, with the default concurrency (`ssh.max_parallel` 16) and a
//!     connection per kick (`ssh.control_master: false`, the default). The far side
//!     is an `sshd` of the bench's own (`tests/support/sshd.rs`) running the real
//!     runonce script with a stand-in `puppet` that records the run. Shared
//!     connections (`ssh.control_master: true`) are not timed yet: see `main`.
//! (3) **mcollective**, for comparison: the same 1,000 as (1), `puppet#runonce`
//!     directed to each through the mcollective client, against an in-bench STOMP
//!     broker that answers as 1,000 daemons would (each request decoded and its PSK
//!     signature verified, a signed reply sent). Unlike (1), the broker is not a real
//!     one: see the section's note.
//! (4) **The report's own cost**: `Service::kick_report` for a report with one
//!     kick, per transport, with its far side up and the dispatch happening on the
//!     dispatcher's threads meanwhile. 200 reports, each kicking a server of its own
//!     (so none is coalesced away); medians.
//!
//! Markdown on stdout; with `PK_BENCH_RESULTS`, the figures for `script/bench --report`.
//! `PK_BENCH_ONLY=choria|ssh|mcollective` runs one part.

#[path = "support/report.rs"]
mod report;
#[path = "../tests/support/nats_choria.rs"]
mod nats_choria;
#[path = "../tests/support/sshd.rs"]
mod sshd;
#[path = "transports/mco_broker.rs"]
mod mco_broker;

use puppet_kicker::kick::{KickSpec, ReportKicks, Selector, SshSettings};
use puppet_kicker::{PuppetSettings, Service};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CHORIA_TARGETS: usize = 1_000;
const SSH_TARGETS: usize = 200;
const SAMPLES: usize = 3;
const REPORTS: usize = 200;

/// A scratch master: a fact cache of `servers` servers (`target-0000.example.com`
/// and on, address 127.0.0.1; role `haproxy`, or with `solo` each a role of its own,
/// `solo-0000` and on), `puppet_kicker.yaml` from `yaml`, `files` beside it, and
/// Puppet's own TLS files from `tls` (the Choria transport uses them).
struct Master {
    root: PathBuf,
    service: Service,
}

impl Master {
    fn start(name: &str, servers: usize, solo: bool, yaml: Value, tls: Option<(PathBuf, PathBuf, PathBuf)>) -> Master {
        let root = std::env::temp_dir().join(format!("pk-bench-transports-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let facts = root.join("var/server_data/facts");
        std::fs::create_dir_all(&facts).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        for i in 0..servers {
            let certname = target(i);
            let role = if solo { format!("solo-{i:04}") } else { "haproxy".to_string() };
            let values = json!({"fqdn": certname, "ipaddress": "127.0.0.1", "role": role, "environment": "production"});
            let file = json!({"name": certname, "values": values, "timestamp": "2026-11-28T12:00:00.000000000+00:00"});
            std::fs::write(facts.join(format!("{certname}.json")), file.to_string()).unwrap();
        }
        let reporter = json!({"name": "node1.example.com", "values": {"role": "node", "environment": "production"},
                              "timestamp": "2026-11-28T12:00:00.000000000+00:00"});
        std::fs::write(facts.join("node1.example.com.json"), reporter.to_string()).unwrap();
        std::fs::write(root.join("etc/puppet_kicker.yaml"), yaml.to_string()).unwrap();
        let (hostcert, hostprivkey, localcacert) = match tls {
            Some((c, k, ca)) => (Some(c), Some(k), Some(ca)),
            None => (None, None, None),
        };
        let settings = PuppetSettings {
            confdir: root.join("etc"),
            vardir: root.join("var"),
            hostcert,
            hostprivkey,
            localcacert,
            ..Default::default()
        };
        Master { service: Service::start(settings).unwrap(), root }
    }

    /// Sends `role`'s kick from node1's report; the time the call took.
    fn report(&self, role: &str) -> Duration {
        let report = ReportKicks {
            host: "node1.example.com".into(),
            environment: "production".into(),
            run_started: puppet_kicker::kick::now_ms(),
            noop: false,
            reporter_pid: None,
            kicks: vec![KickSpec {
                resource: format!("Notify[kick -> {role}]"),
                selector: Selector::Roles(vec![role.into()]),
                environment: None,
            }],
        };
        let started = Instant::now();
        let lines = self.service.kick_report(&report).unwrap();
        let took = started.elapsed();
        let refused: Vec<_> = lines.iter().filter(|l| l.message.contains("budget") || l.message.contains("suppress")).collect();
        assert!(refused.is_empty(), "the bench's report was cut: {refused:?}");
        took
    }

    /// How many times the kick state was written so far (its generation).
    fn writes(&self) -> u64 {
        self.service.kick_status().unwrap()["generation"].as_u64().unwrap_or(0)
    }

    /// Targets whose kicked run started (acknowledged), from the status document.
    fn started(&self) -> usize {
        self.service.kick_status().unwrap()["running"].as_array().map_or(0, Vec::len)
    }

    /// Waits until `want` kicks are acknowledged (at most `limit`); how long it took
    /// from `since`, or a panic naming what is missing.
    fn wait_started(&self, want: usize, since: Instant, limit: Duration) -> Duration {
        loop {
            let started = self.started();
            if started >= want {
                return since.elapsed();
            }
            if since.elapsed() > limit {
                let status = self.service.kick_status().unwrap();
                let outcomes = status["recent_outcomes"].to_string();
                panic!("{started} of {want} kicks acknowledged after {limit:?}; outcomes: {}", &outcomes[..outcomes.len().min(2_000)]);
            }
            // Not more often: the status document is built under the planner's lock,
            // and building it for a thousand targets at every millisecond would slow
            // the dispatch it measures.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn target(i: usize) -> String {
    format!("target-{i:04}.example.com")
}

/// The keys every bench master shares: kicks at once (no coalescing window), a
/// budget and rate limit that let the whole role through.
fn kick_keys(transport: &str) -> Value {
    json!({"transport": transport, "coalesce": 0, "reply_timeout": 30, "budget": {"targets": 2_000},
           "rate_limit": {"max": 1_000_000}})
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_secs(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// One transport's figures: the bulk kicks, then the per-report cost.
struct Figures {
    transport: &'static str,
    /// The results file's key prefix.
    key: &'static str,
    targets: usize,
    bulk: Vec<Duration>,
    report_bulk: Vec<Duration>,
    /// Writes of the kick state during each bulk sample.
    writes: Vec<u64>,
    one: Vec<Duration>,
    goal: &'static str,
}

/// (1) to (4) for one transport: `SAMPLES` fresh masters each kicking every target
/// once, then one master sending `REPORTS` one-kick reports. `master(name, servers,
/// solo)` starts a master (see [`Master::start`]).
fn run(
    transport: &'static str,
    key: &'static str,
    targets: usize,
    goal: &'static str,
    master: &dyn Fn(&str, usize, bool) -> Master,
) -> Figures {
    let mut bulk = Vec::new();
    let mut report_bulk = Vec::new();
    let mut writes = Vec::new();
    for sample in 0..SAMPLES {
        let m = master(&format!("{transport}-bulk-{sample}"), targets, false);
        let before = m.writes();
        let since = Instant::now();
        report_bulk.push(m.report("haproxy"));
        bulk.push(m.wait_started(targets, since, Duration::from_secs(120)));
        writes.push(m.writes() - before);
    }
    let m = master(&format!("{transport}-one"), REPORTS, true);
    let one: Vec<Duration> = (0..REPORTS).map(|i| m.report(&format!("solo-{i:04}"))).collect();
    m.wait_started(REPORTS, Instant::now(), Duration::from_secs(120));
    Figures { transport, key, targets, bulk, report_bulk, writes, one, goal }
}

fn choria() -> Figures {
    use nats_choria::{fixture, NatsServer, Responder};
    let nats = NatsServer::start("bench", None);
    let responder = Responder::start(&nats.broker());
    let broker = nats.broker();
    let master = move |name: &str, servers: usize, solo: bool| {
        let yaml = json!({"kick": kick_keys("choria"), "choria": {"brokers": [broker], "connect_timeout": 30}});
        let tls = (fixture("kicker.mcollective.pem"), fixture("kicker.mcollective.key"), fixture("ca.pem"));
        Master::start(name, servers, solo, yaml, Some(tls))
    };
    let figures = run("Choria", "choria", CHORIA_TARGETS, "≤ 1 s", &master);
    let refused = responder.refused();
    assert!(refused.is_empty(), "the responder refused requests: {:?}", &refused[..refused.len().min(5)]);
    assert_eq!(responder.seen().len(), SAMPLES * CHORIA_TARGETS + REPORTS, "every kick reached the responder once");
    figures
}

/// A connection per kick (`ssh.control_master: false`, the default). Shared
/// connections are not timed yet: with `ControlPersist` the backgrounded master keeps
/// ssh's stderr open, so a kick's reader waits for it until the kick's deadline
/// (docs/ssh.md, "Connection reuse").
fn ssh() -> Figures {
    let sshd = sshd::Sshd::start("bench");
    let settings = sshd.settings();
    let master = move |name: &str, servers: usize, solo: bool| {
        let ssh = json!({
            "user": settings.user, "port": settings.port, "identity_file": settings.identity_file,
            "known_hosts": settings.known_hosts, "config_file": settings.config_file, "connect_timeout": 10,
            "command": SshSettings::script_command(), "address_fact": "ipaddress",
        });
        Master::start(name, servers, solo, json!({"kick": kick_keys("ssh"), "ssh": ssh}), None)
    };
    let figures = run("SSH, a connection per kick", "ssh", SSH_TARGETS, "≤ 10 s", &master);
    assert_eq!(sshd.runs().len(), SAMPLES * SSH_TARGETS + REPORTS, "every kick started one run on the far side");
    figures
}

fn mcollective() -> Figures {
    let broker = mco_broker::Broker::start();
    let client_cfg = std::env::temp_dir().join(format!("pk-bench-transports-client-{}.cfg", std::process::id()));
    std::fs::write(
        &client_cfg,
        format!(
            "main_collective = mcollective\ncollectives = mcollective\nconnector = rabbitmq\nsecurityprovider = psk\n\
             plugin.psk = {}\nidentity = master.example.com\nplugin.rabbitmq.pool.size = 1\n\
             plugin.rabbitmq.pool.1.host = 127.0.0.1\nplugin.rabbitmq.pool.1.port = {}\n\
             plugin.rabbitmq.pool.1.user = mcollective\nplugin.rabbitmq.pool.1.password = marionette\n",
            mco_broker::PSK,
            broker.port()
        ),
    )
    .unwrap();
    let config_file = client_cfg.clone();
    let master = move |name: &str, servers: usize, solo: bool| {
        let yaml = json!({"kick": kick_keys("mcollective"), "mcollective": {"client_config": config_file}});
        Master::start(name, servers, solo, yaml, None)
    };
    let figures = run("mcollective", "mcollective", CHORIA_TARGETS, "(comparison)", &master);
    let _ = std::fs::remove_file(&client_cfg);
    assert_eq!(broker.answered(), SAMPLES * CHORIA_TARGETS + REPORTS, "every kick was answered once");
    figures
}

fn main() {
    report::print_machine("transports");
    let only = std::env::var("PK_BENCH_ONLY").unwrap_or_default();
    let wanted = |part: &str| only.is_empty() || only == part;
    let mut all = Vec::new();
    if wanted("choria") {
        all.push(choria());
    }
    if wanted("ssh") {
        all.push(ssh());
    }
    if wanted("mcollective") {
        all.push(mcollective());
    }
    println!(
        "{SAMPLES} samples of each bulk kick, each from a new master process state (a new connection); \
         {REPORTS} one-kick reports; load average {}.\n",
        report::load_average()
    );
    println!("| Transport | Targets | Until each is acknowledged (median; all samples) | Goal | Writes of the kick state (median) | `kick_report` of that report | `kick_report` of a one-kick report (median) |");
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
    for f in &all {
        let samples: Vec<String> = f.bulk.iter().map(|d| ms(*d)).collect();
        println!(
            "| {} | {} | {} ({}) | {} | {} | {} | {} |",
            f.transport,
            f.targets,
            ms(median(f.bulk.clone())),
            samples.join(", "),
            f.goal,
            { let mut w = f.writes.clone(); w.sort(); w[w.len() / 2] },
            ms(median(f.report_bulk.clone())),
            ms(median(f.one.clone()))
        );
        let key = f.key;
        report::record(&format!("{key}_bulk"), median(f.bulk.clone()).as_nanos() as f64);
        report::record(&format!("{key}_one_report"), median(f.one.clone()).as_nanos() as f64);
    }
}
