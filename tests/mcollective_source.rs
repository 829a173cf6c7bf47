//! `source: mcollective`, through the whole service a compile talks to.
//!
//! Without a stack: a security provider other than psk is a configuration error,
//! an unreachable broker leaves the last snapshot serving with backoff, the snapshot
//! carries what the source reported beside the facts.
//!
//! Against the real stack (`script/mco-stack`: Debian's mcollectived daemons behind
//! RabbitMQ or ActiveMQ on 127.0.0.1): the `stack_` tests, ignored by a plain
//! `cargo test` and run by `script/test-mcollective`, which starts the stack and
//! sets `PK_STACK_CLIENT_CFG` to its client.cfg (`PK_STACK_TLS_CLIENT_CFG`: the same over
//! TLS, with the CA the script made). These tests stop and start
//! the broker and one daemon through `script/mco-stack down|up`, so they take turns.

use puppet_kicker::facts::Node;
use puppet_kicker::mcollective::connector::Connector;
use puppet_kicker::mcollective::marshal::{self, DecodeLimits, Value};
use puppet_kicker::mcollective::message::{Reply, Request, RpcStatus};
use puppet_kicker::mcollective::stomp::{Frame, FrameReader, FrameWriter, Limits, Version};
use puppet_kicker::mcollective::Overrides;
use puppet_kicker::mcollective::{Client, ConnectorKind};
use puppet_kicker::snapshot;
use puppet_kicker::{PuppetSettings, Selection, Service};
use serde_json::json;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

mod support;

// ------------------------------------------------------------------ helpers

/// A scratch master: confdir, vardir and a puppet_kicker.yaml.
struct Master {
    root: PathBuf,
}

impl Master {
    fn new(name: &str, yaml: &str) -> Master {
        let root = support::scratch_path(&format!("mco-source-{name}"));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/puppet_kicker.yaml"), yaml).unwrap();
        Master { root }
    }

    fn settings(&self) -> PuppetSettings {
        PuppetSettings { confdir: self.root.join("etc"), vardir: self.root.join("var"), ..Default::default() }
    }

    fn start(&self) -> Service {
        Service::start(self.settings()).unwrap()
    }

    fn snapshot_path(&self) -> PathBuf {
        snapshot::path_in(&self.root.join("var/puppet_kicker"))
    }

    fn snapshot(&self) -> snapshot::Snapshot {
        snapshot::read(&self.snapshot_path(), "role").unwrap().expect("a snapshot")
    }
}

fn certnames(selection: &Selection) -> Vec<String> {
    selection.servers().map(|s| s.certname().to_string()).collect()
}

fn role(kicker: &Service, role: &str, environment: &str) -> Vec<String> {
    certnames(&kicker.servers_with_role(&[role], environment).unwrap())
}

fn facts(kicker: &Service, clauses: &[&str], environment: &str) -> Vec<String> {
    certnames(&kicker.servers_with_facts(clauses, environment).unwrap())
}

/// The indexed server `certname`, whatever its environment.
fn node(kicker: &Service, certname: &str) -> Node {
    let all = kicker.servers_with_facts(&["environment=/./"], "production").unwrap();
    let found = all.servers().find(|s| s.certname() == certname).map(|s| s.to_node());
    found.unwrap_or_else(|| panic!("{certname} is not indexed"))
}

/// Refreshes now and fails with the service's own error if that refresh failed.
fn refresh(kicker: &Service) -> Duration {
    let started = Instant::now();
    assert!(kicker.refresh_and_wait(Duration::from_secs(60)), "the refresh did not finish within 60 s");
    let status = kicker.status();
    assert_eq!(status.last_error, None, "refresh failed; warnings: {:?}", kicker.take_warnings());
    started.elapsed()
}

/// Polls `check` every 100 ms for up to `secs`.
fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {secs}s");
        thread::sleep(Duration::from_millis(100));
    }
}

fn warnings_containing(warnings: &[String], needle: &str) -> usize {
    warnings.iter().filter(|w| w.contains(needle)).count()
}

// ------------------------------------------------------------------ without a stack

#[test]
fn a_security_provider_other_than_psk_is_a_configuration_error() {
    let master = Master::new("ssl", "");
    let cfg = master.root.join("etc/client.cfg");
    std::fs::write(
        &cfg,
        "connector = rabbitmq\nplugin.rabbitmq.pool.size = 1\nplugin.rabbitmq.pool.1.host = 127.0.0.1\nsecurityprovider = ssl\nplugin.ssl_server_public = /x.pem\n",
    )
    .unwrap();
    std::fs::write(
        master.root.join("etc/puppet_kicker.yaml"),
        "source: mcollective\nmcollective:\n  client_config: client.cfg\n",
    )
    .unwrap();
    let e = Service::start(master.settings()).err().expect("must fail").to_string();
    assert!(e.contains("source: mcollective"), "{e}");
    assert!(e.contains(&cfg.display().to_string()) && e.contains("line 4"), "{e}");
    assert!(e.contains("securityprovider") && e.contains("\"ssl\" is not supported (only psk)"), "{e}");

    std::fs::write(
        master.root.join("etc/puppet_kicker.yaml"),
        "source: mcollective\nmcollective:\n  client_config: missing.cfg\n",
    )
    .unwrap();
    let e = Service::start(master.settings()).err().expect("must fail").to_string();
    assert!(e.contains("missing.cfg") && e.contains("cannot read"), "{e}");
}

/// A snapshot written by the previous source, read back: the mcollective source's
/// data comes from the same file.
fn seed_snapshot(master: &Master, built_at: i64) {
    let facts = json!({"role": "node", "environment": "production", "fqdn": "node1.example.com"});
    let mut n = Node::new("node1.example.com".into(), facts.as_object().cloned().unwrap(), built_at, None);
    n.extra.insert("mcollective::classes".into(), json!(["role::node"]));
    n.answered_at = Some(built_at);
    let seen = Default::default();
    let index = puppet_kicker::Index::build(vec![n], "role", built_at);
    let snap = snapshot::SnapshotRef::of(&index, &seen);
    snapshot::write(&master.snapshot_path(), &snap).unwrap();
}

#[test]
fn an_unreachable_broker_leaves_the_last_snapshot_serving_and_backs_off() {
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let master = Master::new(
        "dead",
        &format!(
            "source: mcollective\nmcollective:\n  pool: ['127.0.0.1:{dead_port}']\n  psk: x\n  identity: master\n  collectives: [mcollective, production]\ncache:\n  ttl: 0\n  retry_min: 2\n  retry_max: 3\n"
        ),
    );
    seed_snapshot(&master, puppet_kicker::time::now() - 100);
    let kicker = master.start();
    let before = std::fs::read(master.snapshot_path()).unwrap();

    // The snapshot answers at once; the stale index queues a refresh, which fails.
    assert_eq!(role(&kicker, "node", "production"), ["node1.example.com"]);
    eventually(10, "the first refresh fails", || kicker.status().failures == 1);
    let status = kicker.status();
    let error = status.last_error.clone().unwrap();
    assert!(error.contains(&format!("no broker could be reached: 127.0.0.1:{dead_port}")), "{error}");
    let retry_at = status.retry_at.expect("backing off");
    assert!(retry_at > puppet_kicker::time::now(), "{status:?}");
    let warnings = kicker.take_warnings();
    assert_eq!(warnings_containing(&warnings, "still serving the last snapshot; next try in 2s"), 1, "{warnings:?}");

    // During the backoff, queries do not start refreshes; the snapshot keeps serving.
    for _ in 0..20 {
        assert_eq!(role(&kicker, "node", "production"), ["node1.example.com"]);
    }
    assert_eq!(kicker.status().failures, 1);
    assert_eq!(facts(&kicker, &["mcollective::classes=role::node"], "production"), ["node1.example.com"]);

    // After it, the next query retries; the delay doubles up to retry_max.
    eventually(10, "the second refresh fails", || {
        let _ = role(&kicker, "node", "production");
        kicker.status().failures == 2
    });
    assert!(kicker.take_warnings().iter().any(|w| w.contains("2 in a row") && w.contains("next try in 3s")));
    assert_eq!(std::fs::read(master.snapshot_path()).unwrap(), before, "a failed refresh leaves the snapshot alone");
}

#[test]
fn a_format_1_snapshot_is_refused_by_its_version_and_the_source_fields_round_trip() {
    // Format 1: the nodes as serde trees. This version reads format 2 only.
    #[derive(serde::Serialize)]
    struct OldSnapshot {
        built_at: i64,
        nodes: Vec<Node>,
        seen_environments: std::collections::BTreeMap<String, String>,
    }
    let master = Master::new("compat", "");
    let facts = json!({"role": "x"}).as_object().cloned().unwrap();
    let old = OldSnapshot {
        built_at: 5,
        nodes: vec![Node::new("a".into(), facts, 4, None)],
        seen_environments: Default::default(),
    };
    let mut bytes = b"PKINDEX\0".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend(rmp_serde::to_vec_named(&old).unwrap());
    std::fs::create_dir_all(master.snapshot_path().parent().unwrap()).unwrap();
    std::fs::write(master.snapshot_path(), bytes).unwrap();
    let err = snapshot::read(&master.snapshot_path(), "role").unwrap_err();
    assert!(matches!(err, snapshot::SnapshotError::FormatVersion { found: 1, .. }), "{err:?}");

    seed_snapshot(&master, 77);
    let read = master.snapshot();
    let node1 = read.index.server(0);
    assert_eq!(node1.answered_at(), Some(77));
    assert_eq!(node1.extra().get("mcollective::classes").map(|v| v.to_json()), Some(json!(["role::node"])));
}

// ------------------------------------------------------------------ the real stack

/// The running stack, when there is one.
struct Stack {
    client_cfg: PathBuf,
    dir: PathBuf,
    broker: String,
}

/// One real-stack test at a time: some stop the broker or a daemon.
static STACK: Mutex<()> = Mutex::new(());

fn stack() -> Option<(Stack, MutexGuard<'static, ()>)> {
    let client_cfg = std::env::var_os("PK_STACK_CLIENT_CFG")
        .map(PathBuf::from)
        .expect("PK_STACK_CLIENT_CFG is not set: run script/test-mcollective");
    let guard = STACK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = client_cfg.parent().unwrap().to_path_buf();
    let env = std::fs::read_to_string(dir.join("stack.env"))
        .unwrap_or_else(|e| panic!("{}: {e}: is the stack running?", dir.join("stack.env").display()));
    let broker = env.lines().find_map(|l| l.strip_prefix("PK_STACK_BROKER=")).unwrap().to_string();
    let stack = Stack { client_cfg, dir, broker };
    // Whatever an earlier test did, every daemon and the broker run again.
    stack.wait_for_all_daemons();
    Some((stack, guard))
}

/// The filter mco discovers with for rpcutil calls. (An empty filter would not do:
/// the client adds the collective to it, and a daemon then finds it neither empty
/// nor matching.)
fn rpcutil() -> puppet_kicker::mcollective::Filter {
    puppet_kicker::mcollective::Filter { agent: vec!["rpcutil".into()], ..Default::default() }
}

const ALL: [&str; 4] = ["lb1.example.com", "node1.example.com", "node2.example.com", "web1.staging.example.com"];

impl Stack {
    /// A master reading the stack's client.cfg; `extra` adds puppet_kicker.yaml lines.
    fn master(&self, name: &str, extra: &str) -> Master {
        Master::new(
            &format!("{name}-{}", self.broker),
            &format!(
                "source: mcollective\nmcollective:\n  client_config: {}\n  discovery_timeout: 1\n  timeout: 5\n{extra}",
                self.client_cfg.display()
            ),
        )
    }

    fn client(&self) -> Client {
        let overrides = Overrides { config_path: Some(self.client_cfg.clone()), ..Default::default() };
        Client::new(puppet_kicker::mcollective::Config::load(&overrides).unwrap())
    }

    fn script(&self, args: &[&str]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("script/mco-stack");
        let out = Command::new(script).args(args).env("PK_STACK_DIR", &self.dir).output().unwrap();
        assert!(out.status.success(), "mco-stack {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn wait_for_all_daemons(&self) {
        let client = self.client();
        let mut last = Vec::new();
        for _ in 0..30 {
            match client.discover("mcollective", &rpcutil(), Duration::from_millis(700), Some(4)) {
                Ok(found) if found == ALL => return,
                Ok(found) => last = found,
                Err(_) => thread::sleep(Duration::from_millis(300)),
            }
        }
        panic!("the stack does not answer with every daemon: {last:?}");
    }
}

/// Brings a stopped broker or daemon back even when the test fails halfway.
struct Restore<'a> {
    stack: &'a Stack,
    name: &'a str,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        self.stack.script(&["up", self.name]);
    }
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_discovery_and_inventory_return_every_daemon_with_its_facts() {
    let Some((stack, _guard)) = stack() else { return };

    let client = stack.client();
    let timeout = Duration::from_secs(1);
    assert_eq!(client.discover("mcollective", &rpcutil(), timeout, None).unwrap(), ALL);
    assert_eq!(client.discover("production", &rpcutil(), timeout, None).unwrap(), &ALL[..3]);
    assert_eq!(client.discover("staging", &rpcutil(), timeout, None).unwrap(), ["web1.staging.example.com"]);

    let master = stack.master("inventory", "");
    let kicker = master.start();
    let took = refresh(&kicker);
    eprintln!("{}: cold refresh (every collective) in {took:?}", stack.broker);
    assert_eq!(kicker.status().servers, 4);
    assert_eq!(role(&kicker, "node", "production"), ["node1.example.com", "node2.example.com"]);
    assert_eq!(role(&kicker, "haproxy", "production"), ["lb1.example.com"]);
    assert_eq!(role(&kicker, "node", "staging"), ["web1.staging.example.com"]);

    // Facts as each daemon's facts.yaml has them: leaves as strings, structure kept.
    let node1 = node(&kicker, "node1.example.com");
    assert_eq!(node1.environment, "production");
    for (fact, value) in [
        ("fqdn", json!("node1.example.com")),
        ("hostname", json!("node1")),
        ("ipaddress", json!("127.0.0.11")),
        ("role", json!("node")),
        ("processorcount", json!("4")),
        ("is_virtual", json!("true")),
        (
            "os",
            json!({"name": "Debian", "family": "Debian", "architecture": "amd64",
                      "release": {"full": "12.5", "major": "12", "minor": "5"}}),
        ),
    ] {
        assert_eq!(node1.facts.get(fact), Some(&value), "fact {fact}");
    }
    assert_eq!(node1.extra["mcollective::classes"], json!(["nginx", "ntp", "profile::base", "role::node", "settings"]));
    assert_eq!(node1.extra["mcollective::collectives"], json!(["mcollective", "production"]));
    let agents = node1.extra["mcollective::agents"].as_array().unwrap();
    for agent in ["discovery", "puppet", "puppetd", "rpcutil"] {
        assert!(agents.contains(&json!(agent)), "{agents:?}");
    }
    let web1 = node(&kicker, "web1.staging.example.com");
    assert_eq!(web1.extra["mcollective::collectives"], json!(["mcollective", "staging"]));

    // Queries: numeric strings compare numerically, classes are queryable.
    assert_eq!(facts(&kicker, &["processorcount>=4"], "production"), ["node1.example.com", "node2.example.com"]);
    assert_eq!(facts(&kicker, &["mcollective::classes=haproxy"], "production"), ["lb1.example.com"]);
    assert_eq!(
        facts(&kicker, &["os.release.full>=12.4", "memorysize_mb>4000"], "staging"),
        ["web1.staging.example.com"]
    );

    // The snapshot holds it all, with when each server last answered.
    let snap = master.snapshot();
    let nodes: Vec<Node> = snap.index.servers().map(|s| s.to_node()).collect();
    assert_eq!(nodes.len(), 4);
    for n in &nodes {
        let answered = n.answered_at.unwrap_or_else(|| panic!("{} has no answered_at", n.certname));
        assert!(answered >= snap.built_at, "{}: {answered} < {}", n.certname, snap.built_at);
        assert!(n.extra.contains_key("mcollective::agents"));
    }

    // A warm refresh asks the environments' collectives plus the main one.
    let took = refresh(&kicker);
    eprintln!("{}: warm refresh in {took:?}", stack.broker);
    assert_eq!(kicker.status().servers, 4);
    assert!(kicker.take_warnings().is_empty());
}

/// A responder on the real broker that answers every discovery and inventory request
/// in the main collective, as `identities`, signing with `psk`.
struct Rogue {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Rogue {
    fn start(stack: &Stack, psk: &'static str, identities: &'static [(&'static str, &'static str)]) -> Rogue {
        let overrides = Overrides {
            config_path: Some(stack.client_cfg.clone()),
            identity: Some("rogue.example.com".into()),
            ..Default::default()
        };
        let config = puppet_kicker::mcollective::Config::load(&overrides).unwrap();
        let broker = config.pool[0].clone();
        let stream = TcpStream::connect((broker.host.as_str(), broker.port)).unwrap();
        let mut reader = FrameReader::new(stream.try_clone().unwrap(), Limits::default());
        let mut writer = FrameWriter::new(stream.try_clone().unwrap());
        writer.write_frame(&Connector::new(&config).connect(&broker, &[Version::V1_0])).unwrap();
        assert_eq!(reader.read_frame().unwrap().command, "CONNECTED");
        for agent in ["discovery", "rpcutil"] {
            let destination = match config.connector {
                ConnectorKind::RabbitMq => format!("/exchange/mcollective_broadcast/{agent}"),
                ConnectorKind::ActiveMq => format!("/topic/mcollective.{agent}.agent"),
            };
            writer
                .write_frame(&Frame::new("SUBSCRIBE").header("destination", destination).header("receipt", agent))
                .unwrap();
            assert_eq!(reader.read_frame().unwrap().command, "RECEIPT");
        }
        stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let (stop2, answered2) = (stop.clone(), answered.clone());
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                let frame = match reader.read_frame() {
                    Ok(f) if f.command == "MESSAGE" => f,
                    Ok(_) => continue,
                    Err(e) if e.is_timeout() => continue,
                    Err(e) => panic!("rogue: {e}"),
                };
                let (request, _) = Request::decode(&frame.body, DecodeLimits::default()).unwrap();
                let reply_to = frame.get("reply-to").unwrap().to_string();
                for (identity, role) in identities {
                    let body = if request.agent == "discovery" {
                        marshal::encode(&Value::str("pong")).unwrap()
                    } else {
                        let facts = Value::Hash(vec![
                            (Value::str("role"), Value::str(*role)),
                            (Value::str("environment"), Value::str("production")),
                            (Value::str("fqdn"), Value::str(*identity)),
                        ]);
                        let data = Value::Hash(vec![
                            (Value::sym("facts"), facts),
                            (Value::sym("classes"), Value::Array(vec![])),
                            (Value::sym("agents"), Value::Array(vec![Value::str("rpcutil")])),
                            (Value::sym("collectives"), Value::Array(vec![Value::str("mcollective")])),
                        ]);
                        RpcStatus { statuscode: 0, statusmsg: "OK".into(), data }.encode().unwrap()
                    };
                    let reply = Reply {
                        senderid: identity.to_string(),
                        requestid: request.requestid.clone(),
                        senderagent: request.agent.clone(),
                        msgtime: puppet_kicker::time::now(),
                        body: body.into(),
                        signature: None,
                    };
                    let bytes = reply.encode(psk).unwrap();
                    let send = Frame::new("SEND")
                        .header("destination", reply_to.as_str())
                        .header("content-length", bytes.len().to_string())
                        .body(bytes);
                    writer.write_frame(&send).unwrap();
                    answered2.fetch_add(1, Ordering::SeqCst);
                }
            }
            let _ = writer.write_frame(&Frame::new("DISCONNECT"));
        });
        Rogue { stop, answered, thread: Some(thread) }
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let result = t.join();
            if !thread::panicking() {
                result.unwrap();
            }
        }
    }
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_a_reply_signed_with_a_wrong_key_is_ignored() {
    let Some((stack, _guard)) = stack() else { return };
    let master = stack.master("forged", "");
    let kicker = master.start();

    // Forged: a stranger of role node, and node1 claiming another role.
    static FORGED: [(&str, &str); 2] = [("evil.example.com", "node"), ("node1.example.com", "evil")];
    let rogue = Rogue::start(&stack, "not-the-psk", &FORGED);
    refresh(&kicker);
    assert!(rogue.answered.load(Ordering::SeqCst) >= 4, "the forged replies were sent");
    drop(rogue);
    assert_eq!(role(&kicker, "node", "production"), ["node1.example.com", "node2.example.com"]);
    assert!(role(&kicker, "evil", "production").is_empty());
    assert_eq!(kicker.status().servers, 4);
    let warnings = kicker.take_warnings();
    assert_eq!(warnings_containing(&warnings, "with a bad psk signature"), 1, "{warnings:?}");

    // Control: the same replies signed with the right key are taken, so the test above
    // did reach the client.
    static GENUINE: [(&str, &str); 1] = [("evil.example.com", "node")];
    let rogue = Rogue::start(&stack, "pk-test-psk", &GENUINE);
    refresh(&kicker);
    drop(rogue);
    assert_eq!(role(&kicker, "node", "production"), ["evil.example.com", "node1.example.com", "node2.example.com"]);
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_wrong_password_and_wrong_psk_fail_the_refresh_with_the_reason() {
    let Some((stack, _guard)) = stack() else { return };

    let master = stack.master("password", "  password: not-the-password\n");
    let kicker = master.start();
    assert!(kicker.refresh_and_wait(Duration::from_secs(30)));
    let error = kicker.status().last_error.expect("refused");
    assert!(error.contains("no broker could be reached") && error.contains("127.0.0.1:"), "{error}");
    eprintln!("{}: wrong password: {error}", stack.broker);

    // The daemons drop requests with a bad signature, without a word: no replies.
    let master = stack.master("psk", "  psk: not-the-psk\n");
    let kicker = master.start();
    assert!(kicker.refresh_and_wait(Duration::from_secs(30)));
    let error = kicker.status().last_error.expect("no replies");
    assert!(error.contains("no mcollective server answered rpcutil#inventory"), "{error}");
    assert!(error.contains("plugin.psk"), "{error}");
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_a_silent_daemon_is_kept_for_the_grace_period_then_dropped() {
    let Some((stack, _guard)) = stack() else { return };
    let master = stack.master("grace", "  grace: 4s\n");
    let kicker = master.start();
    refresh(&kicker);
    assert_eq!(role(&kicker, "haproxy", "production"), ["lb1.example.com"]);
    let answered = node(&kicker, "lb1.example.com").answered_at.unwrap();

    stack.script(&["down", "lb1.example.com"]);
    let restore = Restore { stack: &stack, name: "lb1.example.com" };

    refresh(&kicker);
    assert_eq!(role(&kicker, "haproxy", "production"), ["lb1.example.com"], "kept during the grace period");
    let warnings = kicker.take_warnings();
    assert_eq!(warnings_containing(&warnings, "no answer from lb1.example.com; kept"), 1, "{warnings:?}");
    // The snapshot carries the grace state: lb1 last answered before this refresh.
    let snap = master.snapshot();
    let lb1 = snap.index.by_certname("lb1.example.com").unwrap();
    assert_eq!(lb1.answered_at(), Some(answered));

    // A restarted master (a new process) reads that state from the snapshot.
    drop(kicker);
    let kicker = master.start();
    assert_eq!(role(&kicker, "haproxy", "production"), ["lb1.example.com"]);
    eventually(10, "the grace period ends", || puppet_kicker::time::now() > answered + 4);
    refresh(&kicker);
    assert!(role(&kicker, "haproxy", "production").is_empty(), "dropped after the grace period");
    assert_eq!(kicker.status().servers, 3);
    assert_eq!(warnings_containing(&kicker.take_warnings(), "dropped lb1.example.com"), 1);

    drop(restore); // mco-stack up lb1.example.com
    refresh(&kicker);
    assert_eq!(role(&kicker, "haproxy", "production"), ["lb1.example.com"]);
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_killing_the_broker_leaves_the_last_snapshot_serving_until_it_is_back() {
    let Some((stack, _guard)) = stack() else { return };
    let master = stack.master("outage", "cache:\n  ttl: 1\n  retry_min: 1\n  retry_max: 2\n");
    let kicker = master.start();
    refresh(&kicker);
    let built = kicker.status().built_at.unwrap();
    let snapshot_before = std::fs::read(master.snapshot_path()).unwrap();

    stack.script(&["down", "broker"]);
    let restore = Restore { stack: &stack, name: "broker" };
    thread::sleep(Duration::from_millis(1100)); // the index is now older than cache.ttl

    // Compiles keep answering from the last index while refreshes fail.
    let started = Instant::now();
    assert_eq!(role(&kicker, "node", "production"), ["node1.example.com", "node2.example.com"]);
    assert!(started.elapsed() < Duration::from_millis(200), "a query waited for the refresh");
    eventually(20, "a refresh fails", || kicker.status().failures >= 1);
    let error = kicker.status().last_error.unwrap();
    assert!(error.contains("no broker could be reached"), "{error}");
    let warnings = kicker.take_warnings();
    assert!(
        warnings.iter().any(|w| w.contains("refresh failed") && w.contains("still serving the last snapshot")),
        "{warnings:?}"
    );
    eprintln!("{}: broker down: {}", stack.broker, warnings[0]);
    for _ in 0..3 {
        assert_eq!(role(&kicker, "node", "production"), ["node1.example.com", "node2.example.com"]);
        assert_eq!(facts(&kicker, &["role=haproxy"], "production"), ["lb1.example.com"]);
        thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(std::fs::read(master.snapshot_path()).unwrap(), snapshot_before);
    assert_eq!(kicker.status().built_at, Some(built));

    // Back: the next refresh a compile starts succeeds.
    let down_for = Instant::now();
    drop(restore); // mco-stack up broker: waits until every daemon reconnected
    eprintln!("{}: broker restarted in {:?}", stack.broker, down_for.elapsed());
    eventually(30, "a refresh succeeds once the broker is back", || {
        let _ = role(&kicker, "node", "production");
        let status = kicker.status();
        status.failures == 0 && status.built_at > Some(built)
    });
    assert_eq!(kicker.status().last_error, None);
    assert_eq!(kicker.status().servers, 4);
    assert_ne!(std::fs::read(master.snapshot_path()).unwrap(), snapshot_before);
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_discovery_and_inventory_over_verified_tls() {
    let Some((stack, _guard)) = stack() else { return };
    let tls_cfg = std::env::var_os("PK_STACK_TLS_CLIENT_CFG")
        .map(PathBuf::from)
        .expect("PK_STACK_TLS_CLIENT_CFG is not set: run script/test-mcollective");
    let load = |path: &Path| {
        let overrides = Overrides { config_path: Some(path.to_path_buf()), ..Default::default() };
        puppet_kicker::mcollective::Config::load(&overrides)
    };
    let config = load(&tls_cfg).unwrap();
    assert!(config.pool[0].tls.is_some(), "{}: pool.1.ssl is not on", tls_cfg.display());

    let client = Client::new(config);
    assert_eq!(client.discover("mcollective", &rpcutil(), Duration::from_secs(1), None).unwrap(), ALL);

    let master = Master::new(
        &format!("tls-{}", stack.broker),
        &format!(
            "source: mcollective\nmcollective:\n  client_config: {}\n  discovery_timeout: 1\n  timeout: 5\n",
            tls_cfg.display()
        ),
    );
    let kicker = master.start();
    let took = refresh(&kicker);
    eprintln!("{}: cold refresh over TLS in {took:?}", stack.broker);
    assert_eq!(kicker.status().servers, 4);
    assert_eq!(role(&kicker, "node", "production"), ["node1.example.com", "node2.example.com"]);
    assert_eq!(node(&kicker, "node1.example.com").facts.get("ipaddress"), Some(&json!("127.0.0.11")));

    // The broker's certificate checked against another CA is refused, and the broker
    // refuses a client without a certificate: each failure names the broker.
    let text = std::fs::read_to_string(&tls_cfg).unwrap();
    let tls_dir = tls_cfg.parent().unwrap().join("tls");
    let variant = |name: &str, edit: &dyn Fn(&str) -> Option<String>| -> String {
        let path = master.root.join(name);
        std::fs::write(&path, text.lines().filter_map(edit).collect::<Vec<_>>().join("\n")).unwrap();
        let client = Client::new(load(&path).unwrap());
        client.discover("mcollective", &rpcutil(), Duration::from_secs(1), None).unwrap_err().to_string()
    };
    let other_ca = tls_dir.join("other-ca.pem").display().to_string();
    let e = variant("other-ca.cfg", &|l| {
        Some(if l.contains(".ssl.ca =") {
            format!("{} = {other_ca}", l.split(" = ").next().unwrap())
        } else {
            l.into()
        })
    });
    assert!(e.contains("127.0.0.1:") && e.contains("not signed by a CA of ssl.ca"), "{e}");
    let e = variant("no-client-cert.cfg", &|l| (!l.contains(".ssl.cert") && !l.contains(".ssl.key")).then(|| l.into()));
    assert!(e.contains("127.0.0.1:") && e.contains("TLS"), "{e}");
}

/// A real `puppet apply` of `manifest` whose last_run_summary.yaml lands where the
/// node's `puppet` agent reads it (its statedir's `puppet/var/public`, as
/// spec/fixtures/kick_e2e/run-puppet's runs put it).
fn apply_as(stack: &Stack, identity: &str, manifest: &str) {
    let var = stack.dir.join("nodes").join(identity).join("puppet/var");
    let etc = stack.dir.join("nodes").join(identity).join("puppet/etc");
    std::fs::create_dir_all(&var).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let out = Command::new("puppet")
        .args(["apply", "--color=false", "--certname", identity])
        .arg("--vardir")
        .arg(&var)
        // Debian's Puppet keeps publicdir (last_run_summary.yaml) outside vardir.
        .arg("--publicdir")
        .arg(var.join("public"))
        .arg("--confdir")
        .arg(&etc)
        .args(["-e", manifest])
        .output()
        .unwrap();
    eprintln!("puppet apply {manifest:?}: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
#[ignore = "needs the real mcollective stack: script/test-mcollective runs it"]
fn stack_the_puppet_agent_is_disabled_enabled_and_asked_for_its_last_run() {
    use puppet_kicker::kick::{Agent, Dispatch, McoTransport, Outcome, RunStatus, Server, Transport};
    let Some((stack, _guard)) = stack() else { return };
    let agent = Agent::Puppet { force: true, splay: false, splaylimit: None };
    let mco = McoTransport::new(stack.client(), agent, Duration::from_secs(5));
    assert!(mco.controls_agents());
    let lb1 = Server { certname: "lb1.example.com", environment: "production" };
    let message = "puppet kicker rollout 20261129-040500 by root";

    mco.disable(&lb1, message).unwrap();
    let again = mco.disable(&lb1, "another").unwrap_err();
    assert!(again.contains("Already disabled"), "someone's hold is not taken over: {again}");
    let dispatch = Dispatch {
        target: lb1.certname.into(),
        environment: lb1.environment.into(),
        chain: puppet_kicker::kick::Chain::origin("test"),
        attempt: 1,
    };
    match mco.runonce(&dispatch) {
        Outcome::Disabled(why) => assert!(why.contains("disabled"), "{why}"),
        other => panic!("a disabled agent ran: {other:?}"),
    }
    mco.enable(&lb1).unwrap();
    assert!(mco.enable(&lb1).unwrap_err().contains("Already enabled"));

    // The last run, from the summary Puppet itself wrote.
    let before = puppet_kicker::kick::now_ms() / 1000 * 1000;
    apply_as(&stack, lb1.certname, "notify { 'a change': }");
    let changed = mco.last_run(&lb1).unwrap();
    assert_eq!(changed.status, RunStatus::Changed);
    assert!(changed.at.is_some_and(|at| at >= before), "{changed:?} ended before {before}");
    apply_as(&stack, lb1.certname, "exec { '/bin/false': }");
    assert_eq!(mco.last_run(&lb1).unwrap().status, RunStatus::Failed);
    apply_as(&stack, lb1.certname, "file { '/nonexistent/dir/x': ensure => file }");
    assert_eq!(mco.last_run(&lb1).unwrap().status, RunStatus::Failed);
    apply_as(&stack, lb1.certname, "");
    assert_eq!(mco.last_run(&lb1).unwrap().status, RunStatus::Unchanged);

    // The legacy agent cannot: said before anything is sent.
    let legacy = McoTransport::new(stack.client(), Agent::Puppetd, Duration::from_secs(5));
    assert!(!legacy.controls_agents());
    assert!(legacy.disable(&lb1, message).unwrap_err().contains("kick.agent puppet"));
}
