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

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use futures_util::StreamExt;
use puppet_kicker::config::Config;
use puppet_kicker::kick::choria::{runonce_inputs, ChoriaTransport};
use puppet_kicker::kick::{Chain, Dispatch, KickSpec, Outcome, ReportKicks, Selector, Transport};
use puppet_kicker::{PuppetSettings, Service};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/choria/nats").join(name)
}

// ------------------------------------------------------------------ the broker

/// A `nats-server` of this test's own, stopped (by its pid) when dropped.
struct NatsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl NatsServer {
    /// On a port the server picks, or on `port` (to bring a stopped broker back).
    fn start(name: &str, port: Option<u16>) -> NatsServer {
        NatsServer::start_with(name, port, "")
    }

    /// With Choria's broker ACLs: each client named by its certificate's subject
    /// (`verify_and_map`), the kicker allowed to publish requests and to hear the
    /// replies of the caller id `reply_caller` only, servers to hear requests and
    /// publish replies (go-choria's broker gives clients and servers these).
    fn with_acls(name: &str, reply_caller: &str) -> NatsServer {
        use md5::Digest;
        let md5: String = md5::Md5::digest(reply_caller.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let acls = format!(
            "authorization {{\n  users = [\n    {{user: \"CN=kicker.mcollective\", permissions: {{publish: [\"*.node.>\"], subscribe: [\"*.reply.{md5}.>\"]}}}}\n    {{user: \"CN=web1.example.com\", permissions: {{publish: [\"*.reply.>\"], subscribe: [\"*.node.>\"]}}}}\n  ]\n}}\n"
        );
        NatsServer::start_with(name, None, &acls)
    }

    fn start_with(name: &str, port: Option<u16>, acls: &str) -> NatsServer {
        let dir = std::env::temp_dir().join(format!("pk-choria-nats-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("nats.conf");
        let port_setting = port.map_or("-1".to_string(), |p| p.to_string());
        std::fs::write(
            &conf,
            format!(
                "host: \"127.0.0.1\"\nport: {port_setting}\nmax_payload: 1048576\ntls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  {}: true\n  timeout: 30\n}}\n{acls}",
                fixture("broker.pem"),
                fixture("broker.key"),
                fixture("ca.pem"),
                if acls.is_empty() { "verify" } else { "verify_and_map" },
            ),
        )
        .unwrap();
        let mut child = match Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "nats-server is not installed: run `script/bootstrap test` (it installs Debian's nats-server); \
                 these tests never pass without it"
            ),
            Err(e) => panic!("cannot start nats-server: {e}"),
        };
        // Its log says where it listens; read on, so it never blocks on a full pipe.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut log = Vec::new();
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some((_, addr)) = line.split_once("Listening for client connections on ") {
                        break addr.trim().rsplit_once(':').unwrap().1.parse::<u16>().unwrap();
                    }
                    log.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("nats-server did not listen within 20 s:\n{}", log.join("\n"));
                }
            }
        };
        NatsServer { child, port, dir }
    }

    fn broker(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------------ the responder

/// What one server identity does with a `runonce` (by the identity's first label).
fn behaviour(identity: &str) -> &str {
    identity.split('.').next().unwrap_or("")
}

/// A request the responder accepted: verified and for it.
#[derive(Clone, Debug)]
struct Seen {
    identity: String,
    callerid: String,
    collective: String,
    requestid: String,
    data: Value,
}

#[derive(Clone, Default)]
struct Log {
    seen: Arc<Mutex<Vec<Seen>>>,
    refused: Arc<Mutex<Vec<String>>>,
}

/// A Choria server's side of `puppet#runonce` for every identity of every collective
/// (`<collective>.node.<identity>`), written from the protocol's documents.
struct Responder {
    log: Log,
}

impl Responder {
    /// Connected and subscribed when this returns.
    fn start(broker: &str) -> Responder {
        let log = Log::default();
        let (ready, is_ready) = std::sync::mpsc::channel();
        let (address, kept) = (format!("tls://{broker}"), log.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let client = async_nats::ConnectOptions::new()
                    .require_tls(true)
                    .add_root_certificates(fixture("ca.pem"))
                    .add_client_certificate(fixture("responder.pem"), fixture("responder.key"))
                    .max_reconnects(1)
                    .connect(address.as_str())
                    .await
                    .expect("the responder connects to the broker");
                let mut requests = client.subscribe("*.node.>").await.unwrap();
                client.flush().await.unwrap();
                ready.send(()).unwrap();
                while let Some(message) = requests.next().await {
                    let (collective, identity) = message.subject.as_str().split_once(".node.").unwrap();
                    let identity = identity.to_string();
                    match check_request(&message.payload, collective, &identity) {
                        Ok((seen, reply_to)) => {
                            kept.seen.lock().unwrap().push(seen.clone());
                            if let Some(reply) = reply_for(&seen) {
                                client.publish(reply_to, reply.into()).await.unwrap();
                                client.flush().await.unwrap();
                            }
                        }
                        Err(why) => kept.refused.lock().unwrap().push(format!("{identity}: {why}")),
                    }
                }
            });
        });
        is_ready.recv_timeout(Duration::from_secs(20)).expect("the responder subscribed");
        Responder { log }
    }

    fn seen(&self) -> Vec<Seen> {
        self.log.seen.lock().unwrap().clone()
    }

    fn refused(&self) -> Vec<String> {
        self.log.refused.lock().unwrap().clone()
    }
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("required field {name} missing"))
}

fn text<'a>(v: &'a Value, name: &str) -> Result<&'a str, String> {
    field(v, name)?.as_str().ok_or_else(|| format!("{name} is not a string"))
}

fn unbase64(s: &str, what: &str) -> Result<Vec<u8>, String> {
    BASE64.decode(s).map_err(|e| format!("{what} is not base64: {e}"))
}

/// What a Choria server checks of a request (go-choria's `protocol/v1` and the
/// schemas' required fields), and the reply subject it answers on.
fn check_request(payload: &[u8], collective: &str, identity: &str) -> Result<(Seen, String), String> {
    let transport: Value = serde_json::from_slice(payload).map_err(|e| format!("transport not JSON: {e}"))?;
    if text(&transport, "protocol")? != "choria:transport:1" {
        return Err("transport protocol".into());
    }
    let reply_to = text(field(&transport, "headers")?, "reply-to")?.to_string();
    let secure: Value = serde_json::from_slice(&unbase64(text(&transport, "data")?, "data")?)
        .map_err(|e| format!("secure request not JSON: {e}"))?;
    if text(&secure, "protocol")? != "choria:secure:request:1" {
        return Err("secure request protocol".into());
    }
    let message = text(&secure, "message")?;
    let signature = unbase64(text(&secure, "signature")?, "signature")?;
    let pubcert = text(&secure, "pubcert")?;

    // The pubcert: issued by our CA, named as the caller, on the default allow-list.
    let (_, pem) = x509_parser::pem::parse_x509_pem(pubcert.as_bytes()).map_err(|e| format!("pubcert: {e}"))?;
    let cert = pem.parse_x509().map_err(|e| format!("pubcert: {e}"))?;
    let ca_pem = std::fs::read(fixture("ca.pem")).unwrap();
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(&ca_pem).unwrap();
    let ca = ca_pem.parse_x509().unwrap();
    cert.verify_signature(Some(ca.public_key())).map_err(|e| format!("pubcert not from the CA: {e}"))?;
    let cn = cert.subject().iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or("").to_string();

    // The signature: RSA PKCS#1 v1.5 SHA-256 over the request's JSON text, as sent.
    let key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        cert.public_key().subject_public_key.data.as_ref(),
    );
    key.verify(message.as_bytes(), &signature).map_err(|_| "bad signature".to_string())?;

    let request: Value = serde_json::from_str(message).map_err(|e| format!("request not JSON: {e}"))?;
    if text(&request, "protocol")? != "choria:request:1" {
        return Err("request protocol".into());
    }
    let envelope = field(&request, "envelope")?;
    for name in ["requestid", "senderid", "callerid", "collective", "agent", "ttl", "time", "filter"] {
        field(envelope, name)?;
    }
    let filter = field(envelope, "filter")?;
    for name in ["fact", "cf_class", "agent", "identity", "compound"] {
        if !field(filter, name)?.is_array() {
            return Err(format!("filter.{name} is not a list"));
        }
    }
    let requestid = text(envelope, "requestid")?;
    if requestid.len() != 32 {
        return Err("requestid is not 32 characters".into());
    }
    let callerid = text(envelope, "callerid")?;
    if callerid != format!("choria={cn}") {
        return Err(format!("callerid {callerid} is not the pubcert's name {cn}"));
    }
    if !(cn.ends_with(".mcollective") || cn.ends_with(".choria")) {
        return Err(format!("{cn} is not on the allow-list"));
    }
    let ttl = field(envelope, "ttl")?.as_i64().ok_or("ttl")?;
    let time = field(envelope, "time")?.as_i64().ok_or("time")?;
    if ttl < 30 || time + ttl < unix_now() {
        return Err("expired or ttl below 30".into());
    }
    if text(envelope, "collective")? != collective {
        return Err(format!("published to {collective}, but for collective {}", text(envelope, "collective")?));
    }
    let for_me = |list: &Value, me: &str| list.as_array().is_some_and(|l| l.is_empty() || l.iter().any(|v| v == me));
    if !for_me(field(filter, "identity")?, identity) || !for_me(field(filter, "agent")?, "puppet") {
        return Err("the filter does not select this server's puppet agent".into());
    }
    let rpc: Value = serde_json::from_slice(&unbase64(text(&request, "message")?, "message")?)
        .map_err(|e| format!("RPC request not JSON: {e}"))?;
    if text(&rpc, "agent")? != "puppet" || text(&rpc, "action")? != "runonce" || text(envelope, "agent")? != "puppet" {
        return Err("not puppet#runonce".into());
    }
    let seen = Seen {
        identity: identity.to_string(),
        callerid: callerid.to_string(),
        collective: text(envelope, "collective")?.to_string(),
        requestid: requestid.to_string(),
        data: field(&rpc, "data")?.clone(),
    };
    Ok((seen, reply_to))
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn sha256_base64(text: &str) -> String {
    BASE64.encode(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()))
}

/// The server's reply, as go-choria builds one; `None`: this server stays silent.
fn reply_for(seen: &Seen) -> Option<Vec<u8>> {
    let (statuscode, statusmsg, data) = match behaviour(&seen.identity) {
        "silent" => return None,
        "busy" => (1, "Puppet is currently applying a catalog, cannot run now", json!({})),
        _ => (0, "OK", json!({"summary": "Signalled the running Puppet Daemon", "initiated_at": 1_700_000_000})),
    };
    let rpc = json!({"statuscode": statuscode, "statusmsg": statusmsg, "data": data}).to_string();
    let requestid = match behaviour(&seen.identity) {
        "otherid" => "0123456789abcdef0123456789abcdef".to_string(),
        _ => seen.requestid.clone(),
    };
    let reply = json!({
        "protocol": "choria:reply:1",
        "message": rpc,
        "envelope": {"requestid": requestid, "senderid": seen.identity, "agent": "puppet", "time": unix_now()},
    })
    .to_string();
    let hash = match behaviour(&seen.identity) {
        "badhash" => sha256_base64(&format!("{reply} ")),
        _ => sha256_base64(&reply),
    };
    let secure = json!({"protocol": "choria:secure:reply:1", "message": reply, "hash": hash}).to_string();
    let transport = json!({
        "protocol": "choria:transport:1",
        "data": BASE64.encode(secure),
        "headers": {"mc_sender": seen.identity},
    });
    Some(transport.to_string().into_bytes())
}

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
    let root = std::env::temp_dir().join(format!("pk-choria-master-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let facts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/puppet_cache/server_data/facts");
    let target = root.join("var/server_data/facts");
    std::fs::create_dir_all(&target).unwrap();
    for entry in std::fs::read_dir(facts).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let yaml = json!({"kick": {"transport": "choria", "coalesce": 0, "reply_timeout": 2}, "choria": choria});
    std::fs::write(root.join("etc/puppet_kicker.yaml"), yaml.to_string()).unwrap();
    let settings = PuppetSettings {
        confdir: root.join("etc"),
        vardir: root.join("var"),
        hostcert: Some(fixture("kicker.mcollective.pem")),
        hostprivkey: Some(fixture("kicker.mcollective.key")),
        localcacert: Some(fixture("ca.pem")),
        ..Default::default()
    };
    (Service::start(settings).unwrap(), root)
}

fn kick_haproxy(service: &Service) -> Vec<String> {
    let report = ReportKicks {
        host: "node1.example.com".into(),
        environment: "production".into(),
        run_started: puppet_kicker::kick::now_ms(),
        noop: false,
        reporter_pid: None,
        kicks: vec![KickSpec {
            resource: "Notify[kick -> haproxy]".into(),
            selector: Selector::Roles(vec!["haproxy".into()]),
            environment: None,
        }],
    };
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
