//! The far side of the Choria transport's tests and benchmark: Debian's
//! `nats-server` of the test's own, on 127.0.0.1 with TLS from the test CA
//! (tests/fixtures/choria/make-nats-fixtures.sh), stopped by pid when dropped; and a
//! Choria server's side of `puppet#runonce`, written from the published protocol
//! (choria-io/go-choria `protocol/v1`, its JSON schemas, and choria-plugins/puppet-agent's
//! DDL) without the codec under test. Included with `#[path]` by tests/choria_nats.rs
//! and benches/transports.rs.
#![allow(dead_code)]

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/choria/nats").join(name)
}

// ------------------------------------------------------------------ the broker

/// A `nats-server` of this test's own, stopped (by its pid) when dropped.
pub struct NatsServer {
    pub child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl NatsServer {
    /// On a port the server picks, or on `port` (to bring a stopped broker back).
    pub fn start(name: &str, port: Option<u16>) -> NatsServer {
        NatsServer::start_with(name, port, "")
    }

    /// With Choria's broker ACLs: each client named by its certificate's subject
    /// (`verify_and_map`), the kicker allowed to publish requests and to hear the
    /// replies of the caller id `reply_caller` only, servers to hear requests and
    /// publish replies (go-choria's broker gives clients and servers these).
    pub fn with_acls(name: &str, reply_caller: &str) -> NatsServer {
        use md5::Digest;
        let md5: String = md5::Md5::digest(reply_caller.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let acls = format!(
            "authorization {{\n  users = [\n    {{user: \"CN=kicker.mcollective\", permissions: {{publish: [\"*.node.>\"], subscribe: [\"*.reply.{md5}.>\"]}}}}\n    {{user: \"CN=web1.example.com\", permissions: {{publish: [\"*.reply.>\"], subscribe: [\"*.node.>\"]}}}}\n  ]\n}}\n"
        );
        NatsServer::start_with(name, None, &acls)
    }

    pub fn start_with(name: &str, port: Option<u16>, acls: &str) -> NatsServer {
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

    pub fn broker(&self) -> String {
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
pub fn behaviour(identity: &str) -> &str {
    identity.split('.').next().unwrap_or("")
}

/// A request the responder accepted: verified and for it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub identity: String,
    /// `runonce`, or a rollout's `disable`, `enable`, `last_run_summary`.
    pub action: String,
    pub callerid: String,
    pub collective: String,
    pub requestid: String,
    pub data: Value,
}

#[derive(Clone, Default)]
pub struct Log {
    seen: Arc<Mutex<Vec<Seen>>>,
    refused: Arc<Mutex<Vec<String>>>,
    agents: Arc<Mutex<std::collections::HashMap<String, Agent>>>,
}

/// One server's puppet agent, as the `puppet` agent's actions see it.
#[derive(Clone, Debug, Default)]
pub struct Agent {
    /// The `disable` message while disabled.
    pub disabled: Option<String>,
    /// When its last run (a `runonce` taken) ended, Unix seconds; 0: never ran.
    pub last_run: i64,
}

/// A Choria server's side of `puppet#runonce` for every identity of every collective
/// (`<collective>.node.<identity>`), written from the protocol's documents.
pub struct Responder {
    log: Log,
}

impl Responder {
    /// Connected and subscribed when this returns.
    pub fn start(broker: &str) -> Responder {
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
                            // Not flushed one by one: the client writes out what it
                            // buffered at once, as a fleet's servers answer in parallel.
                            if let Some(reply) = kept.reply_for(&seen) {
                                client.publish(reply_to, reply.into()).await.unwrap();
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

    pub fn seen(&self) -> Vec<Seen> {
        self.log.seen.lock().unwrap().clone()
    }

    pub fn refused(&self) -> Vec<String> {
        self.log.refused.lock().unwrap().clone()
    }

    /// The puppet agent of `identity` as the actions left it.
    pub fn agent(&self, identity: &str) -> Agent {
        self.log.agents.lock().unwrap().get(identity).cloned().unwrap_or_default()
    }
}

pub fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("required field {name} missing"))
}

pub fn text<'a>(v: &'a Value, name: &str) -> Result<&'a str, String> {
    field(v, name)?.as_str().ok_or_else(|| format!("{name} is not a string"))
}

pub fn unbase64(s: &str, what: &str) -> Result<Vec<u8>, String> {
    BASE64.decode(s).map_err(|e| format!("{what} is not base64: {e}"))
}

/// What a Choria server checks of a request (go-choria's `protocol/v1` and the
/// schemas' required fields), and the reply subject it answers on.
pub fn check_request(payload: &[u8], collective: &str, identity: &str) -> Result<(Seen, String), String> {
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
    static CA_PEM: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let ca_pem = CA_PEM.get_or_init(|| std::fs::read(fixture("ca.pem")).unwrap());
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca_pem).unwrap();
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
    let action = text(&rpc, "action")?;
    let actions = ["runonce", "disable", "enable", "last_run_summary"];
    if text(&rpc, "agent")? != "puppet" || !actions.contains(&action) || text(envelope, "agent")? != "puppet" {
        return Err(format!("not one of the puppet agent's {actions:?}"));
    }
    let seen = Seen {
        identity: identity.to_string(),
        action: action.to_string(),
        callerid: callerid.to_string(),
        collective: text(envelope, "collective")?.to_string(),
        requestid: requestid.to_string(),
        data: field(&rpc, "data")?.clone(),
    };
    Ok((seen, reply_to))
}

pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

pub fn sha256_base64(text: &str) -> String {
    BASE64.encode(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()))
}

impl Log {
    /// The server's reply, as go-choria builds one; `None`: this server stays silent.
    /// The agent's state is kept as choria-plugins/puppet-agent keeps it: a disabled
    /// agent refuses `runonce` and a second `disable`; a `runonce` is a run that ends
    /// at once, unchanged.
    fn reply_for(&self, seen: &Seen) -> Option<Vec<u8>> {
        let mut agents = self.agents.lock().unwrap();
        let agent = agents.entry(seen.identity.clone()).or_default();
        let (statuscode, statusmsg, data) = match (behaviour(&seen.identity), seen.action.as_str()) {
            ("silent", _) => return None,
            ("busy", "runonce") => (1, "Puppet is currently applying a catalog, cannot run now".into(), json!({})),
            (_, "runonce") => match &agent.disabled {
                Some(why) => (
                    1,
                    format!("Puppet is disabled: '{why}'"),
                    json!({"summary": format!("Puppet is disabled: '{why}'")}),
                ),
                None => {
                    agent.last_run = unix_now();
                    (
                        0,
                        "OK".into(),
                        json!({"summary": "Signalled the running Puppet Daemon", "initiated_at": 1_700_000_000}),
                    )
                }
            },
            (_, "disable") => match &agent.disabled {
                Some(_) => (
                    1,
                    "Could not disable Puppet: Already disabled".into(),
                    json!({"status": "Could not disable Puppet: Already disabled", "enabled": false}),
                ),
                None => {
                    let message = seen.data["message"].as_str().unwrap_or("").to_string();
                    agent.disabled = Some(message.clone());
                    (
                        0,
                        "OK".into(),
                        json!({"status": format!("Succesfully locked the Puppet agent: {message}"), "enabled": false}),
                    )
                }
            },
            (_, "enable") => match agent.disabled.take() {
                Some(_) => (0, "OK".into(), json!({"status": "Succesfully enabled the Puppet agent", "enabled": true})),
                None => (
                    1,
                    "Could not enable Puppet: Already enabled".into(),
                    json!({"status": "Could not enable Puppet: Already enabled", "enabled": true}),
                ),
            },
            _ => (
                0,
                "OK".into(),
                json!({
                    "lastrun": agent.last_run, "failed_resources": 0, "changed_resources": 0, "total_resources": 3,
                    "summary": {"resources": {"total": 3, "failed": 0, "changed": 0}, "events": {"failure": 0},
                                "time": {"last_run": agent.last_run}},
                }),
            ),
        };
        drop(agents);
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
}
