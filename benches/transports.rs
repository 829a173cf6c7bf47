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
//!     acknowledged, with the default concurrency (`ssh.max_parallel` 16) and
//!     connection reuse (`ssh.control_master`, the default): first each through a
//!     new connection, then, from a second role on the same 200 addresses, each
//!     over the connection the first kick left open. Every server has an address
//!     of its own (`target-0000.example.com` and on, sent to 127.0.0.1 by the
//!     bench's ssh config), hence a connection of its own. The far side is an
//!     `sshd` of the bench's own (`tests/support/sshd.rs`) running the real runonce
//!     script with a stand-in `puppet` that records the run.
//!     Then, for comparison, the same new connections with the bench's ssh config
//!     choosing `KexAlgorithms curve25519-sha256`: Debian 12's OpenSSH 9.2 defaults
//!     to `sntrup761x25519-sha512@openssh.com`, whose key generation is most of a new
//!     connection's cost on the master.
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
//! `PK_BENCH_ONLY=choria|ssh|ssh-kex|mcollective` runs one part.

#[path = "transports/mco_broker.rs"]
mod mco_broker;
#[path = "../tests/support/nats_choria.rs"]
mod nats_choria;
#[path = "support/report.rs"]
mod report;
#[path = "../tests/support/sshd.rs"]
mod sshd;
#[path = "../tests/support/mod.rs"]
mod support;

use puppet_kicker::kick::SshSettings;
use puppet_kicker::{PuppetSettings, Service};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CHORIA_TARGETS: usize = 1_000;
const SSH_TARGETS: usize = 200;
const SAMPLES: usize = 3;
const REPORTS: usize = 200;

/// The servers a scratch master knows, besides the reporting node1.
#[derive(Clone, Copy)]
enum Fleet {
    /// `target-0000.example.com` and on, role `haproxy`.
    Role(usize),
    /// The same, each a role of its own (`solo-0000` and on).
    Solo(usize),
    /// `Role`, and as many more, `again-0000.example.com` and on, role
    /// `haproxy-again`, each with the fqdn of the `target-` of its number.
    Twice(usize),
}

impl Fleet {
    /// `(certname, role, fqdn)` of each server.
    fn servers(self) -> Vec<(String, String, String)> {
        let (n, solo, twice) = match self {
            Fleet::Role(n) => (n, false, false),
            Fleet::Solo(n) => (n, true, false),
            Fleet::Twice(n) => (n, false, true),
        };
        let mut servers = Vec::new();
        for i in 0..n {
            let role = if solo { format!("solo-{i:04}") } else { "haproxy".to_string() };
            servers.push((target(i), role, target(i)));
            if twice {
                servers.push((format!("again-{i:04}.example.com"), "haproxy-again".to_string(), target(i)));
            }
        }
        servers
    }
}

/// A scratch master: a fact cache of `fleet` (address 127.0.0.1 in `ipaddress`),
/// `puppet_kicker.yaml` from `yaml`, and Puppet's own TLS files from `tls` (the
/// Choria transport uses them).
struct Master {
    root: PathBuf,
    service: Service,
}

impl Master {
    fn start(name: &str, fleet: Fleet, yaml: Value, tls: Option<(PathBuf, PathBuf, PathBuf)>) -> Master {
        let root = std::env::temp_dir().join(format!("pk-bench-transports-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let facts = root.join("var/server_data/facts");
        std::fs::create_dir_all(&facts).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        for (certname, role, fqdn) in fleet.servers() {
            let values = json!({"fqdn": fqdn, "ipaddress": "127.0.0.1", "role": role, "environment": "production"});
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
        let report = support::role_kick("node1.example.com", &format!("Notify[kick -> {role}]"), role);
        let started = Instant::now();
        let lines = self.service.kick_report(&report).unwrap();
        let took = started.elapsed();
        let refused: Vec<_> =
            lines.iter().filter(|l| l.message.contains("budget") || l.message.contains("suppress")).collect();
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
    /// from `since`, or a panic naming what is missing. Polls the planner's count of
    /// undelivered kicks (a walk of its targets), and builds the status document only
    /// once that is zero: building it for a thousand targets at every poll would take
    /// the planner's lock from the dispatch it measures.
    fn wait_started(&self, want: usize, since: Instant, limit: Duration) -> Duration {
        let kicks = self.service.kicks().unwrap();
        loop {
            if kicks.undelivered() == 0 {
                let started = self.started();
                if started >= want {
                    return since.elapsed();
                }
            }
            if since.elapsed() > limit {
                let started = self.started();
                let status = self.service.kick_status().unwrap().to_string();
                panic!(
                    "{started} of {want} kicks acknowledged after {limit:?}; status: {}",
                    &status[..status.len().min(2_000)]
                );
            }
            std::thread::sleep(Duration::from_millis(1));
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
    /// The same number again, over the connections the bulk kicks left open (SSH).
    again: Vec<Duration>,
    report_bulk: Vec<Duration>,
    /// Writes of the kick state during each bulk sample.
    writes: Vec<u64>,
    one: Vec<Duration>,
    goal: &'static str,
}

/// (1) to (4) for one transport: `SAMPLES` fresh masters each kicking every target
/// once (and, with `again`, the second role on the same addresses), then one
/// master sending `REPORTS` one-kick reports (unless `reports` is false).
/// `master(name, fleet)` starts a master (see [`Master::start`]); `between()` runs
/// after each sample.
#[allow(clippy::too_many_arguments)]
fn run(
    transport: &'static str,
    key: &'static str,
    targets: usize,
    again: bool,
    reports: bool,
    goal: &'static str,
    master: &dyn Fn(&str, Fleet) -> Master,
    between: &dyn Fn(),
) -> Figures {
    let (mut bulk, mut again_bulk, mut report_bulk, mut writes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for sample in 0..SAMPLES {
        let fleet = if again { Fleet::Twice(targets) } else { Fleet::Role(targets) };
        let m = master(&format!("{key}-bulk-{sample}"), fleet);
        let before = m.writes();
        let since = Instant::now();
        report_bulk.push(m.report("haproxy"));
        bulk.push(m.wait_started(targets, since, Duration::from_secs(120)));
        writes.push(m.writes() - before);
        if again {
            let since = Instant::now();
            m.report("haproxy-again");
            again_bulk.push(m.wait_started(2 * targets, since, Duration::from_secs(120)));
        }
        drop(m);
        between();
    }
    let mut one = Vec::new();
    if reports {
        let m = master(&format!("{key}-one"), Fleet::Solo(REPORTS));
        one = (0..REPORTS).map(|i| m.report(&format!("solo-{i:04}"))).collect();
        m.wait_started(REPORTS, Instant::now(), Duration::from_secs(120));
        drop(m);
        between();
    }
    Figures { transport, key, targets, bulk, again: again_bulk, report_bulk, writes, one, goal }
}

fn choria() -> Figures {
    use nats_choria::{fixture, NatsServer, Responder};
    let nats = NatsServer::start("bench", None);
    let responder = Responder::start(&nats.broker());
    let broker = nats.broker();
    let master = move |name: &str, fleet: Fleet| {
        let yaml = json!({"kick": kick_keys("choria"), "choria": {"brokers": [broker], "connect_timeout": 30}});
        let tls = (fixture("kicker.mcollective.pem"), fixture("kicker.mcollective.key"), fixture("ca.pem"));
        Master::start(name, fleet, yaml, Some(tls))
    };
    let figures = run("Choria", "choria", CHORIA_TARGETS, false, true, "≤ 1 s", &master, &|| {});
    let refused = responder.refused();
    assert!(refused.is_empty(), "the responder refused requests: {:?}", &refused[..refused.len().min(5)]);
    assert_eq!(responder.seen().len(), SAMPLES * CHORIA_TARGETS + REPORTS, "every kick reached the responder once");
    figures
}

/// Connection reuse on (the default): each server's first kick opens its
/// connection, the second role's kicks reuse them. The sessions are ended after
/// each sample, so that no sample's connections serve the next. With `kex`, the
/// bench's ssh config chooses that key exchange, and only the new connections are
/// timed (a comparison).
fn ssh(kex: Option<&'static str>) -> Figures {
    let sshd = sshd::Sshd::start(if kex.is_some() { "bench-kex" } else { "bench" });
    let settings = sshd.settings();
    // Every target's name leads to this sshd, each name a connection of its own.
    let config_file = sshd.dir.join("ssh_config-bench");
    let kex_line = kex.map(|k| format!("  KexAlgorithms {k}\n")).unwrap_or_default();
    std::fs::write(&config_file, format!("Host *.example.com\n  HostName 127.0.0.1\n{kex_line}")).unwrap();
    let master = move |name: &str, fleet: Fleet| {
        let ssh = json!({
            "user": settings.user, "port": settings.port, "identity_file": settings.identity_file,
            "known_hosts": settings.known_hosts, "config_file": config_file, "connect_timeout": 10,
            "command": SshSettings::script_command(), "address_fact": "fqdn",
        });
        Master::start(name, fleet, json!({"kick": kick_keys("ssh"), "ssh": ssh}), None)
    };
    match kex {
        None => {
            let figures = run("SSH", "ssh", SSH_TARGETS, true, true, "≤ 10 s", &master, &|| sshd.end_sessions());
            assert_eq!(sshd.runs().len(), SAMPLES * 2 * SSH_TARGETS + REPORTS, "every kick started one run");
            figures
        }
        Some(_) => {
            let name = "SSH with `KexAlgorithms curve25519-sha256`";
            let figures =
                run(name, "ssh_kex", SSH_TARGETS, false, false, "(comparison)", &master, &|| sshd.end_sessions());
            assert_eq!(sshd.runs().len(), SAMPLES * SSH_TARGETS, "every kick started one run");
            figures
        }
    }
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
    let master = move |name: &str, fleet: Fleet| {
        let yaml = json!({"kick": kick_keys("mcollective"), "mcollective": {"client_config": config_file}});
        Master::start(name, fleet, yaml, None)
    };
    let figures = run("mcollective", "mcollective", CHORIA_TARGETS, false, true, "(comparison)", &master, &|| {});
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
        all.push(ssh(None));
    }
    if wanted("ssh-kex") {
        all.push(ssh(Some("curve25519-sha256")));
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
        let samples = |d: &[Duration]| d.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ");
        let name = if f.key.starts_with("ssh") {
            format!("{}, each a new connection", f.transport)
        } else {
            f.transport.to_string()
        };
        let one = if f.one.is_empty() { "–".to_string() } else { ms(median(f.one.clone())) };
        println!(
            "| {name} | {} | {} ({}) | {} | {} | {} | {} |",
            f.targets,
            ms(median(f.bulk.clone())),
            samples(&f.bulk),
            f.goal,
            {
                let mut w = f.writes.clone();
                w.sort();
                w[w.len() / 2]
            },
            ms(median(f.report_bulk.clone())),
            one
        );
        let key = f.key;
        report::record(&format!("{key}_bulk"), median(f.bulk.clone()).as_nanos() as f64);
        if !f.one.is_empty() {
            report::record(&format!("{key}_one_report"), median(f.one.clone()).as_nanos() as f64);
        }
        if !f.again.is_empty() {
            println!(
                "| {}, the same servers again over the open connections | {} | {} ({}) | {} | | | |",
                f.transport,
                f.targets,
                ms(median(f.again.clone())),
                samples(&f.again),
                f.goal
            );
            report::record(&format!("{key}_again"), median(f.again.clone()).as_nanos() as f64);
        }
    }
}
