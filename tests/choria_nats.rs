//! The Choria kick transport against a real NATS broker: Debian's `nats-server`,
//! started here on 127.0.0.1 (a port the server picks) with TLS from the test CA
//! (tests/fixtures/choria/make-nats-fixtures.sh) and client certificates required,
//! stopped by pid when the test ends.
//!
//! No Choria server can be installed on these machines (none is packaged in any
//! registry they reach), so the server side is a responder written here from the
//! published protocol (choria-io/go-choria `protocol/v1`, its JSON schemas, and
//! choria-plugins/puppet-agent's DDL), without the codec under test: it reads the
//! layers with serde_json and base64, checks the request's required fields, verifies
//! the `pubcert` against the test CA and the signature with ring, requires the
//! caller's certificate to be its certname's and on Choria's default allow-list, and
//! answers on the request's `reply-to` with a `choria:secure:reply:1` whose `hash`
//! is the SHA-256 of the reply. So the test holds the codec to the protocol, not to
//! itself.
//!
//! Without `nats-server` these tests fail (they never pass without running): run
//! `script/bootstrap test`, which installs it.

use puppet_kicker::config::Config;
use puppet_kicker::kick::choria::{runonce_inputs, ChoriaTransport};
use puppet_kicker::kick::{Chain, Dispatch, Outcome, RunStatus, Server, Transport};
use puppet_kicker::{PuppetSettings, Service};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "support/nats_choria.rs"]
mod nats_choria;
mod support;
use nats_choria::*;

// ------------------------------------------------------------------ the kicker

/// `puppet_kicker.yaml` for the Choria transport to `broker`, with the keys of
/// `overrides` (`{section: {key: value}}`) set over the test's. Written as JSON, which
/// is YAML.
fn config(broker: &str, overrides: Value) -> Config {
    let mut yaml = json!({
        "kick": {"transport": "choria", "reply_timeout": 2},
        "choria": {
            "brokers": [broker],
            "certname": "kicker.mcollective",
            "ssl_ca": fixture("ca.pem"),
            "ssl_cert": fixture("kicker.mcollective.pem"),
            "ssl_key": fixture("kicker.mcollective.key"),
            // Generous: these tests share two cores with builds at a higher priority.
            "connect_timeout": 30,
        },
    });
    for (section, keys) in overrides.as_object().unwrap() {
        for (key, value) in keys.as_object().unwrap() {
            yaml[section][key] = value.clone();
        }
    }
    Config::parse(&yaml.to_string(), Path::new("/etc/puppet/puppet_kicker.yaml"), &PuppetSettings::default()).unwrap()
}

fn transport(config: &Config) -> ChoriaTransport {
    let kick = &config.kick;
    let inputs = runonce_inputs(&kick.agent).unwrap();
    ChoriaTransport::new(&kick.choria, &PuppetSettings::default(), inputs, kick.reply_timeout).unwrap()
}

fn kick(transport: &ChoriaTransport, target: &str) -> Outcome {
    let dispatch =
        Dispatch { target: target.into(), environment: "production".into(), chain: Chain::origin("node1"), attempt: 1 };
    transport.runonce(&dispatch)
}

fn failed(outcome: Outcome) -> String {
    match outcome {
        Outcome::Failed(why) => why,
        other => panic!("expected a failure, got {other:?}"),
    }
}

// ------------------------------------------------------------------ tests

#[test]
fn a_kick_reaches_its_server_once_signed_and_the_reply_is_read() {
    let nats = NatsServer::start("started", None);
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    assert_eq!(choria.caller_id(), "choria=kicker.mcollective");

    // The agent's clock (initiated_at) comes back with the outcome.
    assert_eq!(kick(&choria, "web1.example.com"), Outcome::StartedAt(1_700_000_000_000));
    let seen = responder.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].identity, "web1.example.com");
    assert_eq!((seen[0].callerid.as_str(), seen[0].collective.as_str()), ("choria=kicker.mcollective", "mcollective"));
    // kick.force defaults to true, splay to false; no environment unless asked.
    assert_eq!(seen[0].data, json!({"force": true, "splay": false}));

    // A run in progress is busy (the follow-up rule applies), on the same connection.
    match kick(&choria, "busy.example.com") {
        Outcome::Busy(why) => assert!(why.contains("currently applying a catalog"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(responder.seen().len(), 2);

    // The inputs as configured: the kick's environment when asked, a splay limit.
    let asked = transport(&config(
        &nats.broker(),
        json!({"choria": {"send_environment": true, "collectives": ["production"]}, "kick": {"splaylimit": 30}}),
    ));
    assert_eq!(kick(&asked, "web1.example.com"), Outcome::StartedAt(1_700_000_000_000));
    let seen = responder.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].data, json!({"environment": "production", "force": true, "splay": false, "splaylimit": 30}));
    // The environment is one of choria.collectives: the kick goes to its collective.
    assert_eq!(seen[2].collective, "production");
    assert!(responder.refused().is_empty(), "{:?}", responder.refused());
}

#[test]
fn a_rollout_disables_runs_reads_the_last_run_and_enables_through_the_puppet_agent() {
    let nats = NatsServer::start("control", None);
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    assert!(choria.controls_agents());
    let web1 = Server { certname: "web1.example.com", environment: "production" };

    // Never ran: no time.
    assert_eq!(choria.last_run(&web1).unwrap().at, None);
    choria.disable(&web1, "puppet kicker rollout 42").unwrap();
    assert_eq!(responder.agent("web1.example.com").disabled.as_deref(), Some("puppet kicker rollout 42"));
    // Someone else's hold is not taken over: a second disable is the agent's refusal.
    let again = choria.disable(&web1, "puppet kicker rollout 43").unwrap_err();
    assert_eq!(again, "Could not disable Puppet: Already disabled (status 1)");
    // Disabled, a kick is refused with the rollout's message.
    match kick(&choria, "web1.example.com") {
        Outcome::Disabled(why) => assert!(why.contains("puppet kicker rollout 42"), "{why}"),
        other => panic!("{other:?}"),
    }
    choria.enable(&web1).unwrap();
    assert_eq!(kick(&choria, "web1.example.com"), Outcome::StartedAt(1_700_000_000_000));
    let last = choria.last_run(&web1).unwrap();
    assert_eq!(last.status, RunStatus::Unchanged);
    assert!(last.at.is_some_and(|at| at > 1_700_000_000_000), "{last:?}");
    assert_eq!(choria.enable(&web1).unwrap_err(), "Could not enable Puppet: Already enabled (status 1)");

    let actions: Vec<_> = responder.seen().into_iter().map(|s| (s.action, s.data)).collect();
    let message = |m: &str| json!({"message": m});
    assert_eq!(
        actions,
        [
            ("last_run_summary".to_string(), json!({})),
            ("disable".to_string(), message("puppet kicker rollout 42")),
            ("disable".to_string(), message("puppet kicker rollout 43")),
            ("runonce".to_string(), json!({"force": true, "splay": false})),
            ("enable".to_string(), json!({})),
            ("runonce".to_string(), json!({"force": true, "splay": false})),
            ("last_run_summary".to_string(), json!({})),
            ("enable".to_string(), json!({})),
        ]
    );
    // A silent server: the reason, within the reply timeout.
    let silent = Server { certname: "silent.example.com", environment: "production" };
    let why = choria.disable(&silent, "puppet kicker rollout 42").unwrap_err();
    assert!(why.contains("no reply from silent.example.com within 2 s"), "{why}");
    assert!(responder.refused().is_empty(), "{:?}", responder.refused());
}

#[test]
fn a_silent_server_fails_within_the_reply_timeout() {
    let nats = NatsServer::start("silent", None);
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    let started = Instant::now();
    let why = failed(kick(&choria, "silent.example.com"));
    let took = started.elapsed();
    // Within the reply timeout, give or take a starved scheduler.
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(10), "{took:?}");
    let broker = nats.broker();
    assert!(why.contains(&format!("no reply from silent.example.com within 2 s via broker {broker}")), "{why}");
    assert_eq!(responder.seen().len(), 1, "the request did arrive");
}

#[test]
fn kicks_sent_at_once_share_requests_and_each_gets_its_own_servers_outcome() {
    let nats = NatsServer::start("batched", None);
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    // Whether kicks share a request depends on how the threads are scheduled: on a
    // loaded machine each may take the signing turn before the next one queues. A
    // round where none shared proves nothing about shared requests, so it is run
    // again (with other servers), up to ROUNDS times; every round's outcomes are
    // checked all the same.
    const ROUNDS: usize = 5;
    let shared = (0..ROUNDS).any(|round| {
        let requests = kick_at_once(&choria, &responder, round);
        eprintln!("round {round}: {requests} requests for {KICKS_AT_ONCE} kicks");
        requests < KICKS_AT_ONCE
    });
    assert!(shared, "in {ROUNDS} rounds of {KICKS_AT_ONCE} kicks at once, no request was shared");
    assert!(responder.refused().is_empty(), "{:?}", responder.refused());
}

const KICKS_AT_ONCE: usize = 24;

/// One round of [`KICKS_AT_ONCE`] sending threads at once, as the dispatcher's are:
/// started, busy, silent and forged servers mixed, so that requests shared by
/// several of them carry them all. Asserts each kick's outcome and that each server
/// got its kick once; returns how many requests carried them.
fn kick_at_once(choria: &ChoriaTransport, responder: &Responder, round: usize) -> usize {
    let targets: Vec<String> = (0..KICKS_AT_ONCE)
        .map(|i| match i % 8 {
            0 | 4 => format!("busy.rack{i}-{round}.example.com"),
            3 => format!("silent.rack{i}-{round}.example.com"),
            6 => format!("badhash.rack{i}-{round}.example.com"),
            _ => format!("web{i}-{round}.example.com"),
        })
        .collect();
    let start = std::sync::Barrier::new(targets.len());
    let outcomes: Vec<(String, Outcome)> = std::thread::scope(|s| {
        let threads: Vec<_> = targets
            .iter()
            .map(|target| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    (target.clone(), kick(choria, target))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (target, outcome) in &outcomes {
        match (behaviour(target), outcome) {
            ("busy", Outcome::Busy(why)) => assert!(why.contains("currently applying a catalog"), "{why}"),
            ("silent", Outcome::Failed(why)) => {
                // Not blamed on another server's forged reply in the same request.
                assert!(why.contains(&format!("no reply from {target} within 2 s")), "{target}: {why}")
            }
            ("badhash", Outcome::Failed(why)) => {
                assert!(why.contains(&format!("reply for {target} via broker")) && why.contains("hash"), "{why}")
            }
            (_, Outcome::StartedAt(at)) => assert_eq!(*at, 1_700_000_000_000, "{target}"),
            (_, other) => panic!("{target}: {other:?}"),
        }
    }
    // Each server got its kick once.
    let seen: Vec<_> = responder.seen().into_iter().filter(|s| targets.contains(&s.identity)).collect();
    let mut identities: Vec<&str> = seen.iter().map(|s| s.identity.as_str()).collect();
    identities.sort_unstable();
    let mut expected: Vec<&str> = targets.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(identities, expected, "round {round}");
    seen.iter().map(|s| s.requestid.as_str()).collect::<std::collections::BTreeSet<_>>().len()
}

#[test]
fn forged_replies_are_refused_with_the_reason() {
    let nats = NatsServer::start("forged", None);
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    let why = failed(kick(&choria, "badhash.example.com"));
    assert!(why.contains("reply for badhash.example.com via broker") && why.contains("refused"), "{why}");
    assert!(why.contains("hash is not the SHA-256 of its message"), "{why}");
    let why = failed(kick(&choria, "otherid.example.com"));
    assert!(why.contains("answers request \"0123456789abcdef0123456789abcdef\", not ours"), "{why}");
    assert_eq!(responder.seen().len(), 2);
}

#[test]
fn a_broker_whose_certificate_is_not_from_the_ca_is_refused() {
    let nats = NatsServer::start("untrusted", None);
    let responder = Responder::start(&nats.broker());
    // The kicker trusts only another CA.
    let config = config(&nats.broker(), json!({"choria": {"ssl_ca": fixture("rogue-ca.pem")}}));
    let choria = transport(&config);
    let why = failed(kick(&choria, "web1.example.com"));
    let broker = nats.broker();
    assert!(why.contains("kick of web1.example.com not sent: no Choria broker reachable"), "{why}");
    assert!(why.contains(&broker) && why.to_lowercase().contains("certificate"), "{why}");
    assert!(responder.seen().is_empty(), "nothing was sent to an unverified broker");
}

#[test]
fn a_lost_broker_fails_the_kick_and_the_next_kick_connects_again() {
    let nats = NatsServer::start("lost", None);
    let port = nats.port;
    let broker = nats.broker();
    let _responder = Responder::start(&broker);
    let choria = transport(&config(&broker, json!({})));
    assert_eq!(kick(&choria, "web1.example.com"), Outcome::StartedAt(1_700_000_000_000));

    drop(nats);
    let started = Instant::now();
    let why = failed(kick(&choria, "web1.example.com"));
    assert!(why.contains(&broker), "{why}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());

    // The broker comes back (on its port): the next kick connects again.
    let nats = NatsServer::start("lost-again", Some(port));
    let responder = Responder::start(&nats.broker());
    assert_eq!(kick(&choria, "web1.example.com"), Outcome::StartedAt(1_700_000_000_000));
    assert_eq!(responder.seen().len(), 1);
}

#[test]
fn the_brokers_acls_let_the_kicker_hear_only_its_own_replies() {
    // Choria's broker lets a client hear `*.reply.<md5(its caller id)>.>` only: the
    // subjects the transport uses are those.
    let nats = NatsServer::with_acls("acls", "choria=kicker.mcollective");
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    assert_eq!(kick(&choria, "web1.example.com"), Outcome::StartedAt(1_700_000_000_000));
    assert_eq!(responder.seen().len(), 1);

    // A broker whose ACLs are for another caller id: the kick fails, and says why.
    let nats = NatsServer::with_acls("acls-other", "choria=someone.mcollective");
    let responder = Responder::start(&nats.broker());
    let choria = transport(&config(&nats.broker(), json!({})));
    let why = failed(kick(&choria, "web1.example.com"));
    assert!(why.contains("no reply from web1.example.com within 2 s"), "{why}");
    assert!(why.contains("the broker said") && why.contains("Permissions Violation"), "{why}");
    // The request did go out (publishing to *.node.> is allowed); its reply could not come back.
    assert_eq!(responder.seen().len(), 1);
}

#[test]
fn a_certificate_that_is_not_the_certnames_is_refused_at_start() {
    let config = config("127.0.0.1:4222", json!({"choria": {"certname": "other.mcollective"}}));
    let kick = &config.kick;
    let e = ChoriaTransport::new(
        &kick.choria,
        &PuppetSettings::default(),
        runonce_inputs(&kick.agent).unwrap(),
        kick.reply_timeout,
    )
    .err()
    .expect("refused")
    .to_string();
    let file = fixture("kicker.mcollective.pem");
    assert!(e.contains(&file.display().to_string()), "{e}");
    assert!(
        e.contains(r#"is the certificate of "kicker.mcollective", not of the certname "other.mcollective""#),
        "{e}"
    );
    assert!(!e.contains("PRIVATE KEY"), "{e}");
}

// ------------------------------------------------------------------ through the service

/// A scratch master whose fact cache is the fixtures' (lb1.example.com has role
/// haproxy), kicking through Choria with Puppet's own files: its hostcert, key and CA
/// are the kicker's (as on a master whose certname is kicker.mcollective), so no
/// `choria.certname` or `choria.ssl_*` key is set.
fn master(name: &str, choria: Value) -> (Service, PathBuf) {
    let yaml = json!({"kick": {"transport": "choria", "coalesce": 0, "reply_timeout": 2}, "choria": choria});
    let (settings, root) = support::scratch_master(&format!("pk-choria-master-{name}"), &yaml.to_string());
    let settings = PuppetSettings {
        hostcert: Some(fixture("kicker.mcollective.pem")),
        hostprivkey: Some(fixture("kicker.mcollective.key")),
        localcacert: Some(fixture("ca.pem")),
        ..settings
    };
    (Service::start(settings).unwrap(), root)
}

fn kick_haproxy(service: &Service) -> Vec<String> {
    let report = support::role_kick("node1.example.com", "Notify[kick -> haproxy]", "haproxy");
    let mut lines: Vec<String> = service.kick_report(&report).unwrap().into_iter().map(|l| l.message).collect();
    lines.extend(service.kick_flush().into_iter().map(|l| l.message));
    lines.extend(service.take_kick_log().into_iter().map(|l| l.message));
    lines
}

#[test]
fn a_reports_kick_reaches_the_target_through_the_service() {
    let nats = NatsServer::start("service", None);
    let responder = Responder::start(&nats.broker());
    let (service, root) = master("started", json!({"brokers": [nats.broker()]}));
    let lines = kick_haproxy(&service);
    let seen = responder.seen();
    assert_eq!(seen.len(), 1, "{seen:?} {lines:?}");
    assert_eq!(
        (seen[0].identity.as_str(), seen[0].callerid.as_str()),
        ("lb1.example.com", "choria=kicker.mcollective")
    );
    let status = service.kick_status().unwrap().to_string();
    assert!(status.contains("lb1.example.com") && status.contains("started"), "{status} {lines:?}");
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn without_brokers_every_kick_fails_with_the_reason() {
    let (service, root) = master("no-brokers", json!({}));
    let lines = kick_haproxy(&service).join("\n");
    assert!(lines.contains("Choria is not usable for kicks: 'choria.brokers' is not set"), "{lines}");
    let _ = std::fs::remove_dir_all(root);
}
