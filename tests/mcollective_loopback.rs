//! The client against a tiny in-test STOMP broker on 127.0.0.1 that plays
//! the daemons too: handshake and version negotiation, failover across the
//! pool, reply collection with timeouts, and dropping of forged, foreign,
//! duplicate and garbage replies.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use puppet_kicker::mcollective::config::{BrokerHost, Config, ConnectorKind, Overrides};
use puppet_kicker::mcollective::marshal::{DecodeLimits, Value};
use puppet_kicker::mcollective::message::{Reply, Request, RpcStatus};
use puppet_kicker::mcollective::stomp::{Frame, FrameReader, FrameWriter, Limits, Version};
use puppet_kicker::mcollective::{Client, Error, FactFilter, Filter, ReplyLimits};

const PSK: &str = "loopback-psk";

#[derive(Clone)]
struct Node {
    identity: &'static str,
    role: &'static str,
    delay: Duration,
}

#[derive(Clone)]
struct Scenario {
    nodes: Vec<Node>,
    /// Answer CONNECT with ERROR (bad credentials).
    reject_login: bool,
    /// Never answer CONNECT.
    silent: bool,
    /// Before the real replies, send forged/foreign/duplicate/garbage ones.
    junk: bool,
    /// Answer a SEND with an ERROR frame.
    error_on_send: bool,
    /// Answer a SEND with a MESSAGE declaring a huge body.
    huge_message: bool,
    /// Answer CONNECT (or, after CONNECTED, a SEND) with a newline every 100 ms, forever.
    trickle_handshake: bool,
    trickle: bool,
    /// Answer a SEND with half a MESSAGE, then close the connection.
    close_mid_frame: bool,
    /// Answer a SEND with only the captured signed reply, rewritten each of these ways.
    replay: Vec<Rewrite>,
    /// Answer a SEND with this many replies from distinct senders (`usize::MAX`:
    /// until the client hangs up), each RPC reply padded with `flood_pad` bytes.
    flood: usize,
    flood_pad: usize,
}

/// A captured reply (signed with the capture's psk) with its unsigned outer
/// fields rewritten, as anyone on the broker can do without the psk.
#[derive(Clone)]
struct Rewrite {
    senderid: &'static str,
    requestid: RequestId,
    /// Seconds from the request's `:msgtime`, or an absolute epoch time.
    msgtime: Msgtime,
}

#[derive(Clone, Copy)]
enum RequestId {
    Current,
    Zero,
    Empty,
}

#[derive(Clone, Copy)]
enum Msgtime {
    FromRequest(i64),
    At(i64),
}

/// The psk of the captured traffic in tests/fixtures/frames.
const CAPTURE_PSK: &str = "feas-psk-secret";
/// 2100-01-01T00:00:00Z.
const YEAR_2100: i64 = 4_102_444_800;

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            nodes: vec![
                Node { identity: "node1.example.com", role: "node", delay: Duration::ZERO },
                Node { identity: "node2.example.com", role: "node", delay: Duration::from_millis(30) },
                Node { identity: "web1.example.com", role: "web", delay: Duration::from_millis(10) },
            ],
            reject_login: false,
            silent: false,
            junk: false,
            error_on_send: false,
            huge_message: false,
            trickle_handshake: false,
            trickle: false,
            close_mid_frame: false,
            replay: Vec::new(),
            flood: 0,
            flood_pad: 0,
        }
    }
}

struct Broker {
    addr: SocketAddr,
    frames: Arc<Mutex<Vec<Frame>>>,
}

impl Broker {
    fn start(scenario: Scenario) -> Broker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let frames = Arc::new(Mutex::new(Vec::new()));
        let log = frames.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (scenario, log) = (scenario.clone(), log.clone());
                thread::spawn(move || {
                    let _ = serve(stream, &scenario, &log);
                });
            }
        });
        Broker { addr, frames }
    }

    fn host(&self) -> BrokerHost {
        BrokerHost {
            host: "127.0.0.1".into(),
            port: self.addr.port(),
            user: "mcollective".into(),
            password: "marionette".into(),
            tls: None,
        }
    }

    /// Frames received so far, once the client's DISCONNECT arrived (or 3 s).
    fn received(&self) -> Vec<Frame> {
        let start = Instant::now();
        loop {
            let frames = self.frames.lock().unwrap().clone();
            let done = frames.last().is_some_and(|f| f.command == "DISCONNECT");
            if done || start.elapsed() > Duration::from_secs(3) {
                return frames;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A port with nothing listening on it.
fn dead_host() -> BrokerHost {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    BrokerHost { host: "127.0.0.1".into(), port, user: String::new(), password: String::new(), tls: None }
}

fn fact_filter_matches(req: &Request, node: &Node) -> bool {
    req.filter.fact.iter().all(|f| f.fact == "role" && f.operator == "==" && f.value == node.role)
        && (req.filter.identity.is_empty() || req.filter.identity.iter().any(|i| i == node.identity))
}

fn serve(stream: TcpStream, sc: &Scenario, log: &Mutex<Vec<Frame>>) -> Result<(), Error> {
    let mut reader = FrameReader::new(stream.try_clone().unwrap(), Limits::default());
    let mut raw = stream.try_clone().unwrap();
    let mut writer = FrameWriter::new(stream);
    loop {
        let frame = reader.read_frame()?;
        log.lock().unwrap().push(frame.clone());
        match frame.command.as_str() {
            "CONNECT" => {
                if sc.silent {
                    thread::sleep(Duration::from_secs(5));
                    return Ok(());
                }
                if sc.trickle_handshake {
                    return trickle(&mut raw);
                }
                if sc.reject_login {
                    writer.write_frame(
                        &Frame::new("ERROR")
                            .header("message", "Bad CONNECT")
                            .body(b"Access refused for user 'mcollective'".to_vec()),
                    )?;
                    return Ok(());
                }
                let offered = frame.get("accept-version").unwrap_or("1.0");
                let version = offered.split(',').filter_map(Version::parse).max().unwrap_or(Version::V1_0);
                writer.write_frame(
                    &Frame::new("CONNECTED")
                        .header("version", version.as_str())
                        .header("heart-beat", "0,0")
                        .header("server", "fake/1.0"),
                )?;
                reader.set_version(version);
                writer.set_version(version);
            }
            "DISCONNECT" => return Ok(()),
            "SEND" => answer(&frame, sc, &mut writer, &mut raw)?,
            _ => {}
        }
    }
}

fn message_frame(req_frame: &Frame, body: Vec<u8>) -> Frame {
    let reply_to = req_frame.get("reply-to").unwrap_or("/queue/none").to_string();
    Frame::new("MESSAGE")
        .header("subscription", reply_to.as_str())
        .header("destination", reply_to.as_str())
        .header("message-id", "m-1")
        .body(body)
}

/// A heart-beat newline every 100 ms until the client hangs up (at most 30 s).
fn trickle(raw: &mut TcpStream) -> Result<(), Error> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if raw.write_all(b"\n").is_err() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn answer(frame: &Frame, sc: &Scenario, w: &mut FrameWriter<TcpStream>, raw: &mut TcpStream) -> Result<(), Error> {
    if sc.trickle {
        return trickle(raw);
    }
    if sc.close_mid_frame {
        raw.write_all(b"MESSAGE\ncontent-length:100\n\nhalf a bo").map_err(|e| Error::InvalidInput(e.to_string()))?;
        raw.shutdown(std::net::Shutdown::Both).map_err(|e| Error::InvalidInput(e.to_string()))?;
        return Err(Error::InvalidInput("closed mid-frame".into()));
    }
    if sc.flood > 0 {
        return flood(frame, sc, w);
    }
    if !sc.replay.is_empty() {
        return replay(frame, &sc.replay, w);
    }
    if sc.error_on_send {
        return w.write_frame(&Frame::new("ERROR").header("message", "queue full"));
    }
    if sc.huge_message {
        // Declares 100 MB and sends two bytes: the client must refuse at once.
        raw.write_all(b"MESSAGE\ncontent-length:100000000\n\nxx").map_err(|e| Error::InvalidInput(e.to_string()))?;
        return Ok(());
    }
    let (req, hash) = Request::decode(&frame.body, DecodeLimits::default())?;
    if !puppet_kicker::mcollective::psk::verify(&req.body, PSK, &hash) {
        return Ok(()); // a daemon drops it silently
    }
    let dest = frame.get("destination").unwrap_or("");
    let target = frame
        .get("mc_identity")
        .map(str::to_string)
        .or_else(|| dest.split_once("_directed/").map(|(_, n)| n.to_string()));
    let inner = puppet_kicker::mcollective::marshal::decode(&req.body)?;
    let reply_body = if req.agent == "discovery" {
        puppet_kicker::mcollective::marshal::encode(&Value::str("pong"))?
    } else {
        let data = inner.get_sym("data").cloned().unwrap_or(Value::Nil);
        RpcStatus {
            statuscode: 0,
            statusmsg: "OK".into(),
            data: Value::Hash(vec![
                (Value::sym("echo"), data),
                (Value::sym("action"), inner.get_sym("action").cloned().unwrap_or(Value::Nil)),
            ]),
        }
        .encode()?
    };
    let reply_for = |sender: &str, requestid: &str, body: Vec<u8>, psk: &str| -> Result<Vec<u8>, Error> {
        Reply {
            senderid: sender.into(),
            requestid: requestid.into(),
            senderagent: req.agent.clone(),
            msgtime: puppet_kicker::time::now(),
            body: body.into(),
            signature: None,
        }
        .encode(psk)
    };
    if sc.junk {
        let forged = reply_for("evil.example.com", &req.requestid, reply_body.clone(), "wrong-psk")?;
        let foreign = reply_for("node1.example.com", "0123456789abcdef0123456789abcdef", reply_body.clone(), PSK)?;
        let wrong_agent = Reply {
            senderid: "node9.example.com".into(),
            requestid: req.requestid.clone(),
            senderagent: "other".into(),
            msgtime: 0,
            body: reply_body.clone().into(),
            signature: None,
        }
        .encode(PSK)?;
        for body in [forged, foreign, wrong_agent, b"\x04\x08garbage".to_vec()] {
            w.write_frame(&message_frame(frame, body))?;
        }
        w.write_frame(&Frame::new("RECEIPT").header("receipt-id", "77"))?;
        if target.is_some() {
            // Well signed, but from a node this directed request never went to.
            let stranger = reply_for("stranger.example.com", &req.requestid, reply_body.clone(), PSK)?;
            w.write_frame(&message_frame(frame, stranger))?;
        }
    }
    let mut nodes: Vec<&Node> = sc
        .nodes
        .iter()
        .filter(|n| match &target {
            Some(t) => n.identity == t,
            None => fact_filter_matches(&req, n),
        })
        .collect();
    nodes.sort_by_key(|n| n.delay);
    let start = Instant::now();
    for n in nodes {
        if let Some(wait) = n.delay.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        let body = reply_for(n.identity, &req.requestid, reply_body.clone(), PSK)?;
        w.write_frame(&message_frame(frame, body.clone()))?;
        if sc.junk {
            w.write_frame(&message_frame(frame, body))?; // duplicate
        }
    }
    Ok(())
}

/// rpcutil#get_fact's reply from node1 in the RabbitMQ capture: body and `:hash`.
fn captured_reply() -> (Vec<u8>, String) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/frames/rabbitmq/066-s04-s2c-MESSAGE.raw");
    let raw = std::fs::read(path).unwrap();
    let frame = puppet_kicker::mcollective::stomp::decode(&raw, Version::V1_0, Limits::default()).unwrap();
    let outer = puppet_kicker::mcollective::marshal::decode(&frame.body).unwrap();
    let body = outer.get_sym("body").and_then(Value::as_bytes).unwrap().to_vec();
    let hash = outer.get_sym("hash").and_then(Value::as_str).unwrap().to_string();
    (body, hash)
}

fn replay(frame: &Frame, rewrites: &[Rewrite], w: &mut FrameWriter<TcpStream>) -> Result<(), Error> {
    let (req, _) = Request::decode(&frame.body, DecodeLimits::default())?;
    let (body, hash) = captured_reply();
    for r in rewrites {
        let requestid = match r.requestid {
            RequestId::Current => req.requestid.clone(),
            RequestId::Zero => "0".repeat(32),
            RequestId::Empty => String::new(),
        };
        let msgtime = match r.msgtime {
            Msgtime::FromRequest(d) => req.msgtime + d,
            Msgtime::At(t) => t,
        };
        let outer = puppet_kicker::mcollective::marshal::encode(&Value::Hash(vec![
            (Value::sym("senderid"), Value::str(r.senderid)),
            (Value::sym("requestid"), Value::ascii(requestid)),
            (Value::sym("senderagent"), Value::str(req.agent.as_str())),
            (Value::sym("msgtime"), Value::Int(msgtime)),
            (Value::sym("body"), Value::binary(body.clone())),
            (Value::sym("hash"), Value::ascii(hash.as_str())),
        ]))?;
        w.write_frame(&message_frame(frame, outer))?;
    }
    Ok(())
}

/// Replies from `flood-0000001.example.com`, ... (equal sizes), as fast as the client reads.
fn flood(frame: &Frame, sc: &Scenario, w: &mut FrameWriter<TcpStream>) -> Result<(), Error> {
    let (req, _) = Request::decode(&frame.body, DecodeLimits::default())?;
    let pad = "x".repeat(sc.flood_pad);
    for i in 0..sc.flood {
        let body = if req.agent == "discovery" {
            puppet_kicker::mcollective::marshal::encode(&Value::str("pong"))?
        } else {
            let data = Value::Hash(vec![
                (Value::sym("pad"), Value::str(pad.as_str())),
                (Value::sym("n"), Value::Int(i as i64)),
            ]);
            RpcStatus { statuscode: 0, statusmsg: "OK".into(), data }.encode()?
        };
        let reply = Reply {
            senderid: format!("flood-{i:07}.example.com"),
            requestid: req.requestid.clone(),
            senderagent: req.agent.clone(),
            msgtime: puppet_kicker::time::now(),
            body: body.into(),
            signature: None,
        }
        .encode(PSK)?;
        if w.write_frame(&message_frame(frame, reply)).is_err() {
            return Ok(()); // the client hung up
        }
    }
    Ok(())
}

fn config(kind: ConnectorKind, pool: Vec<BrokerHost>, versions: Option<Vec<Version>>) -> Config {
    let o = Overrides {
        no_config_file: true,
        connector: Some(kind),
        pool: Some(pool),
        psk: Some(PSK.into()),
        identity: Some("master.example.com".into()),
        collectives: Some(vec!["mcollective".into(), "production".into()]),
        callerid: Some("uid=999".into()),
        connect_timeout: Some(Duration::from_millis(800)),
        stomp_versions: versions,
        ..Overrides::default()
    };
    Config::resolve("", None, &o, None).unwrap()
}

fn role(r: &str) -> Filter {
    Filter { fact: vec![FactFilter::eq("role", r)], ..Filter::default() }
}

#[test]
fn rabbitmq_discovery_waits_the_timeout_and_drops_junk() {
    let broker = Broker::start(Scenario { junk: true, ..Scenario::default() });
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None));
    let start = Instant::now();
    let nodes = client.discover("mcollective", &role("node"), Duration::from_millis(400), None).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(nodes, ["node1.example.com", "node2.example.com"]);
    assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let s = client.stats();
    assert_eq!(s.accepted, 2);
    assert_eq!(s.bad_hash, 1, "{s:?}");
    assert_eq!(s.foreign_requestid, 1, "{s:?}");
    assert_eq!(s.malformed, 2, "{s:?}"); // wrong agent + garbage
    assert_eq!(s.duplicate, 2, "{s:?}");
    assert_eq!(s.other_frames, 1, "{s:?}");

    let frames = broker.received();
    let cmds: Vec<&str> = frames.iter().map(|f| f.command.as_str()).collect();
    assert_eq!(cmds, ["CONNECT", "SEND", "DISCONNECT"]);
    assert_eq!(frames[0].get("accept-version"), Some("1.0,1.1,1.2"));
    assert_eq!(frames[0].get("host"), Some("/"));
    assert_eq!(frames[0].get("login"), Some("mcollective"));
    let send = &frames[1];
    assert_eq!(send.get("destination"), Some("/exchange/mcollective_broadcast/discovery"));
    assert_eq!(send.get("reply-to"), Some("/temp-queue/mcollective_reply_discovery"));
    assert_eq!(send.get("expiration"), Some("70000"));
    assert_eq!(send.get("mc_sender"), Some("master.example.com"));
    let (req, _) = Request::decode(&send.body, DecodeLimits::default()).unwrap();
    assert_eq!(req.filter.collective.as_deref(), Some("mcollective"));
    assert_eq!((req.callerid.as_str(), req.ttl), ("uid=999", 60));
    assert!((req.msgtime - puppet_kicker::time::now()).abs() < 5);
}

#[test]
fn discovery_stops_early_at_the_expected_count() {
    let broker = Broker::start(Scenario::default());
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None));
    let start = Instant::now();
    let nodes = client.discover("mcollective", &Filter::default(), Duration::from_secs(5), Some(3)).unwrap();
    assert_eq!(nodes.len(), 3);
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn activemq_directed_rpc_reports_missing_nodes() {
    let broker = Broker::start(Scenario { junk: true, ..Scenario::default() });
    let client = Client::new(config(ConnectorKind::ActiveMq, vec![broker.host()], None));
    let nodes: Vec<String> =
        ["node2.example.com", "ghost.example.com", "node1.example.com"].iter().map(|s| s.to_string()).collect();
    let inputs = vec![("force".to_string(), Value::Bool(true))];
    let start = Instant::now();
    let out =
        client.rpc_directed("mcollective", "puppet", "runonce", &inputs, &nodes, Duration::from_millis(500)).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(500));
    let senders: Vec<&str> = out.replies.iter().map(|r| r.sender.as_str()).collect();
    assert_eq!(senders, ["node1.example.com", "node2.example.com"]);
    assert_eq!(out.missing, ["ghost.example.com"]);
    let r = &out.replies[0];
    assert_eq!((r.statuscode, r.statusmsg.as_str(), r.agent.as_str()), (0, "OK", "puppet"));
    let echo = r.data.get_sym("echo").unwrap();
    assert_eq!(echo.get_sym("force"), Some(&Value::Bool(true)));
    assert_eq!(echo.get_sym("process_results"), Some(&Value::Bool(true)));
    assert_eq!(r.data.get_sym("action").and_then(Value::as_str), Some("runonce"));

    let frames = broker.received();
    let cmds: Vec<&str> = frames.iter().map(|f| f.command.as_str()).collect();
    assert_eq!(cmds, ["CONNECT", "SUBSCRIBE", "SEND", "SEND", "SEND", "UNSUBSCRIBE", "DISCONNECT"]);
    assert_eq!(frames[0].get("host"), Some("mcollective"));
    let sub = &frames[1];
    let queue = sub.get("destination").unwrap();
    assert!(queue.starts_with("/queue/mcollective.reply.master.example.com_"), "{queue}");
    assert!(sub.get("id").is_some(), "STOMP 1.2 SUBSCRIBE needs an id");
    let mut targets = Vec::new();
    for send in &frames[2..5] {
        assert_eq!(send.get("destination"), Some("/queue/mcollective.nodes"));
        assert_eq!(send.get("reply-to"), Some(queue));
        let ts: u64 = send.get("timestamp").unwrap().parse().unwrap();
        let exp: u64 = send.get("expires").unwrap().parse().unwrap();
        assert_eq!(exp - ts, 70_000);
        targets.push(send.get("mc_identity").unwrap().to_string());
    }
    assert_eq!(targets, ["ghost.example.com", "node1.example.com", "node2.example.com"]);
    assert_eq!(frames[5].get("id"), sub.get("id"));
    // Junk came once per SEND; a node the request was not sent to is not trusted.
    let s = client.stats();
    assert_eq!((s.bad_hash, s.foreign_requestid, s.malformed), (3, 3, 6), "{s:?}");
    assert_eq!((s.duplicate, s.unexpected_sender, s.accepted), (2, 3, 2), "{s:?}");
}

#[test]
fn directed_rpc_returns_once_all_nodes_answered() {
    let broker = Broker::start(Scenario::default());
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None));
    let nodes = vec!["node1.example.com".to_string(), "web1.example.com".to_string()];
    let start = Instant::now();
    let out = client.rpc_directed("production", "rpcutil", "ping", &[], &nodes, Duration::from_secs(5)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(out.replies.len(), 2);
    assert!(out.missing.is_empty());
    let frames = broker.received();
    let dests: Vec<&str> =
        frames.iter().filter(|f| f.command == "SEND").map(|f| f.get("destination").unwrap()).collect();
    assert_eq!(
        dests,
        ["/exchange/production_directed/node1.example.com", "/exchange/production_directed/web1.example.com"]
    );
}

#[test]
fn broadcast_rpc_with_filter_and_expected_count() {
    let broker = Broker::start(Scenario::default());
    let client = Client::new(config(ConnectorKind::ActiveMq, vec![broker.host()], None));
    let out = client
        .rpc_broadcast(
            "mcollective",
            "rpcutil",
            "get_fact",
            &[("fact".into(), Value::str("role"))],
            &role("web"),
            Some(1),
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(out.replies.len(), 1);
    assert_eq!(out.replies[0].sender, "web1.example.com");
    let frames = broker.received();
    let send = frames.iter().find(|f| f.command == "SEND").unwrap();
    assert_eq!(send.get("destination"), Some("/topic/mcollective.rpcutil.agent"));
    assert!(send.get("mc_identity").is_none());
}

#[test]
fn failover_skips_dead_and_refusing_hosts() {
    let refusing = Broker::start(Scenario { reject_login: true, ..Scenario::default() });
    let good = Broker::start(Scenario::default());
    let pool = vec![dead_host(), refusing.host(), good.host()];
    let client = Client::new(config(ConnectorKind::RabbitMq, pool, None));
    let nodes = client.discover("mcollective", &role("web"), Duration::from_millis(200), None).unwrap();
    assert_eq!(nodes, ["web1.example.com"]);
    assert_eq!(refusing.received().len(), 1); // only its CONNECT
}

#[test]
fn when_every_host_fails_the_error_lists_each() {
    let refusing = Broker::start(Scenario { reject_login: true, ..Scenario::default() });
    let silent = Broker::start(Scenario { silent: true, ..Scenario::default() });
    let dead = dead_host();
    let pool = vec![dead.clone(), refusing.host(), silent.host()];
    let client = Client::new(config(ConnectorKind::ActiveMq, pool, None));
    let start = Instant::now();
    let err = client.discover("mcollective", &Filter::default(), Duration::from_millis(200), None).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3), "connect timeout bounds the wait");
    let Error::NoBroker(attempts) = &err else { panic!("{err}") };
    assert_eq!(attempts.len(), 3);
    let text = err.to_string();
    assert!(text.contains(&dead.address()), "{text}");
    assert!(text.contains("Access refused"), "{text}");
    assert!(text.contains("no CONNECTED"), "{text}");
}

#[test]
fn stomp_1_0_only_subscribes_without_id() {
    let broker = Broker::start(Scenario::default());
    let client = Client::new(config(ConnectorKind::ActiveMq, vec![broker.host()], Some(vec![Version::V1_0])));
    let nodes = client.discover("mcollective", &Filter::default(), Duration::from_millis(200), None).unwrap();
    assert_eq!(nodes.len(), 3);
    let frames = broker.received();
    assert_eq!(frames[0].get("accept-version"), Some("1.0"));
    assert!(frames[0].get("heart-beat").is_none());
    assert!(frames[1].get("id").is_none());
}

#[test]
fn broker_errors_and_oversized_frames_are_errors() {
    let broker = Broker::start(Scenario { error_on_send: true, ..Scenario::default() });
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None));
    let err = client.discover("mcollective", &Filter::default(), Duration::from_secs(2), None).unwrap_err();
    assert!(matches!(&err, Error::Broker { message, .. } if message.contains("queue full")), "{err}");

    let broker = Broker::start(Scenario { huge_message: true, ..Scenario::default() });
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None));
    let start = Instant::now();
    let err = client.discover("mcollective", &Filter::default(), Duration::from_secs(5), None).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(matches!(&err, Error::Frame(m) if m.contains("exceeds")), "{err}");
}

#[test]
fn bad_arguments_are_refused_before_connecting() {
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![dead_host()], None));
    let t = Duration::from_millis(10);
    assert!(matches!(client.discover("nope", &Filter::default(), t, None), Err(Error::InvalidInput(_))));
    assert!(matches!(
        client.rpc_directed("mcollective", "a/b", "x", &[], &["n".into()], t),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        client.rpc_directed("mcollective", "puppet", "runonce", &[], &["bad node".into()], t),
        Err(Error::InvalidInput(_))
    ));
    let bad = Filter { fact: vec![FactFilter::new("role", "~=", "x")], ..Filter::default() };
    assert!(matches!(client.discover("mcollective", &bad, t, None), Err(Error::InvalidInput(_))));
}

/// Runs `f` on a thread and fails the test if it has not returned within `limit`
/// (a hang must fail the test, not stall the suite).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => (v, start.elapsed()),
        Err(_) => panic!("still running after {limit:?}: the deadline is not enforced"),
    }
}

#[test]
fn a_trickling_broker_cannot_stretch_discovery_inventory_or_runonce_past_their_deadline() {
    let broker = Broker::start(Scenario { trickle: true, ..Scenario::default() });
    let client = Arc::new(Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None)));
    let timeout = Duration::from_secs(1);

    let c = client.clone();
    let (nodes, took) =
        within(Duration::from_secs(6), move || c.discover("mcollective", &Filter::default(), timeout, None));
    assert_eq!(nodes.unwrap(), Vec::<String>::new());
    assert!(took < timeout + Duration::from_secs(1), "discovery took {took:?}");

    let c = client.clone();
    let (outcome, took) = within(Duration::from_secs(6), move || {
        c.rpc_broadcast("mcollective", "rpcutil", "inventory", &[], &Filter::default(), Some(3), timeout)
    });
    assert!(outcome.unwrap().replies.is_empty());
    assert!(took < timeout + Duration::from_secs(1), "inventory took {took:?}");

    let c = client.clone();
    let (outcome, took) = within(Duration::from_secs(6), move || {
        c.rpc_directed("mcollective", "puppet", "runonce", &[], &["node1.example.com".into()], timeout)
    });
    assert_eq!(outcome.unwrap().missing, ["node1.example.com"]);
    assert!(took < timeout + Duration::from_secs(1), "runonce took {took:?}");
}

#[test]
fn a_broker_trickling_instead_of_connected_is_bounded_by_the_connect_timeout() {
    let broker = Broker::start(Scenario { trickle_handshake: true, ..Scenario::default() });
    let client = Client::new(config(ConnectorKind::ActiveMq, vec![broker.host()], None));
    let connect_timeout = client.config().connect_timeout;
    let (err, took) = within(Duration::from_secs(6), move || {
        client.discover("mcollective", &Filter::default(), Duration::from_millis(100), None)
    });
    let err = err.unwrap_err().to_string();
    assert!(err.contains("no CONNECTED frame within the connect timeout"), "{err}");
    assert!(took < connect_timeout + Duration::from_secs(1), "handshake took {took:?}");
}

#[test]
fn a_listener_that_never_answers_connect_is_bounded_by_the_connect_timeout() {
    // Accepts (the kernel does, from the backlog) and never reads or writes.
    let blackhole = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = BrokerHost {
        host: "127.0.0.1".into(),
        port: blackhole.local_addr().unwrap().port(),
        user: String::new(),
        password: String::new(),
        tls: None,
    };
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![host], None));
    let connect_timeout = client.config().connect_timeout;
    let (err, took) = within(Duration::from_secs(6), move || {
        client.discover("mcollective", &Filter::default(), Duration::from_secs(1), None)
    });
    assert!(matches!(err, Err(Error::NoBroker(_))), "{err:?}");
    assert!(took < connect_timeout + Duration::from_secs(1), "handshake took {took:?}");
    drop(blackhole);
}

#[test]
fn a_broker_closing_mid_frame_is_a_clean_error_within_the_deadline() {
    let broker = Broker::start(Scenario { close_mid_frame: true, ..Scenario::default() });
    let client = Client::new(config(ConnectorKind::RabbitMq, vec![broker.host()], None));
    let (err, took) = within(Duration::from_secs(6), move || {
        client.discover("mcollective", &Filter::default(), Duration::from_secs(2), None)
    });
    let err = err.unwrap_err().to_string();
    assert!(err.contains("closed in the middle of a frame"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

fn capture_config(broker: &Broker) -> Config {
    let mut c = config(ConnectorKind::RabbitMq, vec![broker.host()], None);
    c.psk = CAPTURE_PSK.into();
    c
}

fn get_fact(client: &Client) -> puppet_kicker::mcollective::RpcOutcome {
    let inputs = [("fact".to_string(), Value::str("role"))];
    client
        .rpc_broadcast(
            "mcollective",
            "rpcutil",
            "get_fact",
            &inputs,
            &Filter::default(),
            None,
            Duration::from_millis(500),
        )
        .unwrap()
}

#[test]
fn a_replayed_reply_with_another_request_id_or_a_msgtime_outside_the_ttl_is_dropped_and_counted() {
    use Msgtime::*;
    use RequestId::*;
    let rewrites = vec![
        // ttl is 60: the oldest msgtime a reply to this request may carry.
        Rewrite { senderid: "node1.example.com", requestid: Current, msgtime: FromRequest(-60) },
        Rewrite { senderid: "node2.example.com", requestid: Current, msgtime: FromRequest(-61) },
        Rewrite { senderid: "node3.example.com", requestid: Current, msgtime: At(YEAR_2100) },
        Rewrite { senderid: "node4.example.com", requestid: Zero, msgtime: FromRequest(0) },
        Rewrite { senderid: "node5.example.com", requestid: Empty, msgtime: FromRequest(0) },
    ];
    let broker = Broker::start(Scenario { replay: rewrites, ..Scenario::default() });
    let client = Client::new(capture_config(&broker));
    let out = get_fact(&client);
    let senders: Vec<&str> = out.replies.iter().map(|r| r.sender.as_str()).collect();
    assert_eq!(senders, ["node1.example.com"]);
    let s = client.stats();
    assert_eq!((s.accepted, s.bad_msgtime, s.foreign_requestid, s.bad_hash), (1, 2, 2, 0), "{s:?}");
}

#[test]
fn one_signed_body_under_two_sender_ids_is_trusted_for_neither() {
    use Msgtime::*;
    use RequestId::*;
    let rewrites = vec![
        Rewrite { senderid: "node1.example.com", requestid: Current, msgtime: FromRequest(0) },
        Rewrite { senderid: "impostor.example.com", requestid: Current, msgtime: FromRequest(0) },
    ];
    let broker = Broker::start(Scenario { replay: rewrites, ..Scenario::default() });
    let client = Client::new(capture_config(&broker));
    let out = get_fact(&client);
    // Kept (a kick's runonce replies are alike by nature) but named, for callers
    // whose replies must differ per server to drop.
    assert_eq!(out.replies.len(), 2);
    assert_eq!(out.ambiguous, ["impostor.example.com", "node1.example.com"]);
}

fn flood_client(broker: &Broker, limits: ReplyLimits) -> Client {
    let mut config = config(ConnectorKind::RabbitMq, vec![broker.host()], None);
    config.reply_limits = limits;
    Client::new(config)
}

#[test]
fn replies_over_max_replies_are_dropped_and_counted() {
    for (sent, kept) in [(50, 50), (51, 50)] {
        let broker = Broker::start(Scenario { flood: sent, ..Scenario::default() });
        let client = flood_client(&broker, ReplyLimits { max_replies: 50, ..ReplyLimits::default() });
        let nodes = client.discover("mcollective", &Filter::default(), Duration::from_millis(500), None).unwrap();
        assert_eq!(nodes.len(), kept);
        assert_eq!(nodes.last().map(String::as_str), Some("flood-0000049.example.com"));
        assert_eq!(client.stats().over_limit, (sent - kept) as u64, "{:?}", client.stats());
    }
}

#[test]
fn a_burst_is_kept_in_arrival_order_up_to_the_expected_count_and_no_further() {
    // 300 replies as fast as the client reads: checked in batches, yet the first 200
    // to arrive are kept, the call ends there, and nothing after them is counted.
    let broker = Broker::start(Scenario { flood: 300, ..Scenario::default() });
    let client = flood_client(&broker, ReplyLimits::default());
    let start = Instant::now();
    let nodes = client.discover("mcollective", &Filter::default(), Duration::from_secs(20), Some(200)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    let expected: Vec<String> = (0..200).map(|i| format!("flood-{i:07}.example.com")).collect();
    assert_eq!(nodes, expected);
    let s = client.stats();
    assert_eq!((s.accepted, s.duplicate, s.over_limit, s.bad_hash, s.malformed), (200, 0, 0, 0, 0), "{s:?}");
}

/// The size of one flood reply, as the broker builds it (every one is the same size).
fn flood_reply_size(pad: usize) -> usize {
    let data = Value::Hash(vec![(Value::sym("pad"), Value::str("x".repeat(pad))), (Value::sym("n"), Value::Int(0))]);
    let body = RpcStatus { statuscode: 0, statusmsg: "OK".into(), data }.encode().unwrap();
    let reply = Reply {
        senderid: "flood-0000000.example.com".into(),
        requestid: "0".repeat(32),
        senderagent: "rpcutil".into(),
        msgtime: puppet_kicker::time::now(),
        body: body.into(),
        signature: None,
    };
    reply.encode(PSK).unwrap().len()
}

#[test]
fn replies_over_max_reply_bytes_are_dropped_and_counted() {
    let size = flood_reply_size(100);
    for (budget, kept) in [(10 * size, 10), (10 * size - 1, 9)] {
        let broker = Broker::start(Scenario { flood: 15, flood_pad: 100, ..Scenario::default() });
        let client = flood_client(&broker, ReplyLimits { max_bytes: budget, ..ReplyLimits::default() });
        let out = client
            .rpc_broadcast("mcollective", "rpcutil", "x", &[], &Filter::default(), None, Duration::from_millis(500))
            .unwrap();
        assert_eq!(out.replies.len(), kept, "budget {budget}");
        assert_eq!(client.stats().over_limit, (15 - kept) as u64, "{:?}", client.stats());
    }
}

/// `VmHWM` (peak resident set) of this process, in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `test` again in a process of its own and asserts it passed; true in that
/// process. A peak-RSS figure means nothing while other tests share the process.
fn in_own_process(test: &str) -> bool {
    if std::env::var_os("PK_TEST_ALONE").is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("PK_TEST_ALONE", "1")
        .output()
        .expect("running the test binary again");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{test} in its own process:\n{text}");
    eprintln!("{text}");
    false
}

#[test]
fn an_endless_flood_from_distinct_senders_ends_at_the_deadline_with_bounded_memory() {
    if !in_own_process("an_endless_flood_from_distinct_senders_ends_at_the_deadline_with_bounded_memory") {
        return;
    }
    let broker = Broker::start(Scenario { flood: usize::MAX, flood_pad: 4096, ..Scenario::default() });
    let client = Arc::new(flood_client(&broker, ReplyLimits { max_replies: 1000, ..ReplyLimits::default() }));
    let before = peak_rss_kib();
    let c = client.clone();
    let timeout = Duration::from_secs(2);
    let (out, took) = within(Duration::from_secs(10), move || {
        c.rpc_broadcast("mcollective", "rpcutil", "inventory", &[], &Filter::default(), None, timeout)
    });
    let out = out.unwrap();
    assert!(took < timeout + Duration::from_secs(1), "took {took:?}");
    assert_eq!(out.replies.len(), 1000);
    let dropped = client.stats().over_limit;
    assert!(dropped > 0, "{:?}", client.stats());
    if let (Some(before), Some(after)) = (before, peak_rss_kib()) {
        let growth = after.saturating_sub(before);
        eprintln!("flood: kept 1000, dropped {dropped} (~{} MiB sent), peak RSS grew {growth} KiB", dropped * 4 / 1024);
        // 1000 replies of ~4 KiB kept; the dropped ones must not accumulate.
        assert!(growth < 64 * 1024, "peak RSS grew {growth} KiB");
    }
}
