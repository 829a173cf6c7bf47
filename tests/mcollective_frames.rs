//! Checks the mcollective codecs against real captured traffic
//! (mcollective 2.12.5 + ruby-stomp with RabbitMQ 3.10 and ActiveMQ 5.17,
//! PSK `feas-psk-secret`), and against hostile variations of it.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use support::Lcg;

use puppet_kicker::mcollective::config::{BrokerHost, ConnectorKind};
use puppet_kicker::mcollective::connector::{Connector, RequestRoute};
use puppet_kicker::mcollective::marshal::{self, DecodeLimits, Value};
use puppet_kicker::mcollective::message::{self, Reply, Request, RpcStatus};
use puppet_kicker::mcollective::psk;
use puppet_kicker::mcollective::stomp::{self, Frame, Limits, Version};
use puppet_kicker::mcollective::Error;

const PSK: &str = "feas-psk-secret";
const BROKERS: [&str; 2] = ["rabbitmq", "activemq"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frames")
}

// ---- a tiny JSON reader for index.json (keeps key order; no dependency) ----

#[derive(Debug, Clone)]
enum Json {
    Str(String),
    Num(f64),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
    Lit,
}

impl Json {
    fn get(&self, k: &str) -> &Json {
        match self {
            Json::Obj(o) => &o.iter().find(|(n, _)| n == k).unwrap().1,
            _ => panic!("not an object"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("not a string"),
        }
    }
}

fn parse_json(s: &str) -> Json {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn string(b: &[u8], i: &mut usize) -> String {
        assert_eq!(b[*i], b'"');
        *i += 1;
        let mut out = String::new();
        loop {
            let c = b[*i];
            *i += 1;
            match c {
                b'"' => return out,
                b'\\' => {
                    let e = b[*i];
                    *i += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'u' => {
                            let hex = std::str::from_utf8(&b[*i..*i + 4]).unwrap();
                            *i += 4;
                            out.push(char::from_u32(u32::from_str_radix(hex, 16).unwrap()).unwrap());
                        }
                        other => out.push(char::from(other)),
                    }
                }
                _ => {
                    // copy a UTF-8 sequence verbatim
                    let start = *i - 1;
                    let mut end = *i;
                    while end < b.len() && (b[end] & 0xC0) == 0x80 {
                        end += 1;
                    }
                    out.push_str(std::str::from_utf8(&b[start..end]).unwrap());
                    *i = end;
                }
            }
        }
    }
    fn value(b: &[u8], i: &mut usize) -> Json {
        ws(b, i);
        match b[*i] {
            b'"' => Json::Str(string(b, i)),
            b'[' => {
                *i += 1;
                let mut v = Vec::new();
                loop {
                    ws(b, i);
                    if b[*i] == b']' {
                        *i += 1;
                        return Json::Arr(v);
                    }
                    v.push(value(b, i));
                    ws(b, i);
                    if b[*i] == b',' {
                        *i += 1;
                    }
                }
            }
            b'{' => {
                *i += 1;
                let mut v = Vec::new();
                loop {
                    ws(b, i);
                    if b[*i] == b'}' {
                        *i += 1;
                        return Json::Obj(v);
                    }
                    let k = string(b, i);
                    ws(b, i);
                    assert_eq!(b[*i], b':');
                    *i += 1;
                    v.push((k, value(b, i)));
                    ws(b, i);
                    if b[*i] == b',' {
                        *i += 1;
                    }
                }
            }
            b't' | b'f' | b'n' => {
                while *i < b.len() && b[*i].is_ascii_alphabetic() {
                    *i += 1;
                }
                Json::Lit
            }
            _ => {
                let start = *i;
                while *i < b.len() && (b[*i] == b'-' || b[*i] == b'.' || b[*i].is_ascii_digit()) {
                    *i += 1;
                }
                Json::Num(std::str::from_utf8(&b[start..*i]).unwrap().parse().unwrap())
            }
        }
    }
    value(s.as_bytes(), &mut 0)
}

// ---- captured frames ----

struct Captured {
    broker: &'static str,
    name: String,
    dir: String,
    raw: Vec<u8>,
    frame: Frame,
}

fn all_frames() -> Vec<Captured> {
    let mut out = Vec::new();
    for broker in BROKERS {
        let dir = fixtures().join(broker);
        let index = parse_json(&fs::read_to_string(dir.join("index.json")).unwrap());
        let Json::Arr(entries) = index else { panic!("index") };
        let raw_files = fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "raw"))
            .count();
        assert_eq!(raw_files, entries.len(), "{broker}: every .raw is indexed");
        for e in entries {
            let name = e.get("file").str().to_string();
            let raw = fs::read(dir.join(format!("{name}.raw"))).unwrap();
            let frame = stomp::decode(&raw, Version::V1_0, Limits::default())
                .unwrap_or_else(|err| panic!("{broker}/{name}: {err}"));
            assert_eq!(frame.command, e.get("command").str(), "{broker}/{name}");
            let Json::Obj(headers) = e.get("headers") else { panic!() };
            let expected: Vec<(String, String)> =
                headers.iter().map(|(k, v)| (k.clone(), v.str().to_string())).collect();
            assert_eq!(frame.headers, expected, "{broker}/{name}");
            let Json::Num(body_len) = e.get("body_len") else { panic!() };
            assert_eq!(frame.body.len(), *body_len as usize, "{broker}/{name}");
            // Re-encoding reproduces the captured bytes.
            assert_eq!(stomp::encode(&frame, Version::V1_0).unwrap(), raw, "{broker}/{name}");
            out.push(Captured { broker, name, dir: e.get("dir").str().to_string(), raw, frame });
        }
    }
    out
}

#[test]
fn every_captured_frame_decodes_to_its_index_entry() {
    let frames = all_frames();
    assert_eq!(frames.len(), 107 + 65);
}

/// Requests are bodies carrying `:filter`; replies carry `:senderagent`.
fn is_request(v: &Value) -> bool {
    v.get_sym("filter").is_some()
}

#[test]
fn every_body_decodes_and_every_hash_verifies() {
    let (mut requests, mut replies, mut inner_bodies) = (0, 0, 0);
    for c in all_frames() {
        if c.frame.body.is_empty() {
            continue;
        }
        let id = format!("{}/{}", c.broker, c.name);
        let outer = marshal::decode(&c.frame.body).unwrap_or_else(|e| panic!("{id}: {e}"));
        if is_request(&outer) {
            let (req, hash) = Request::decode(&c.frame.body, DecodeLimits::default()).unwrap();
            assert!(psk::verify(&req.body, PSK, &hash), "{id}");
            assert_eq!(req.requestid.len(), 32, "{id}");
            message::check_callerid(&req.callerid).unwrap();
            let inner = marshal::decode(&req.body).unwrap_or_else(|e| panic!("{id}: {e}"));
            if req.agent == "discovery" {
                assert_eq!(inner, Value::str("ping"), "{id}");
            } else {
                assert_eq!(inner.get_sym("agent").unwrap().as_str(), Some(req.agent.as_str()));
                assert!(inner.get_sym("action").unwrap().as_str().is_some(), "{id}");
                let data = inner.get_sym("data").unwrap();
                assert_eq!(data.get_sym("process_results"), Some(&Value::Bool(true)), "{id}");
            }
            requests += 1;
        } else {
            let reply = Reply::decode_verified(&c.frame.body, PSK, DecodeLimits::default())
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            let inner = reply.inner(DecodeLimits::default()).unwrap();
            if reply.senderagent == "discovery" {
                assert!(message::is_pong(&inner), "{id}");
            } else {
                let status = RpcStatus::from_value(&inner).unwrap();
                assert!((0..=5).contains(&status.statuscode), "{id}");
            }
            // A wrong PSK is refused.
            assert!(matches!(
                Reply::decode_verified(&c.frame.body, "wrong", DecodeLimits::default()),
                Err(Error::Signature(_))
            ));
            replies += 1;
        }
        inner_bodies += 1;
    }
    assert_eq!(requests + replies, 126);
    assert!(requests > 30 && replies > 60, "{requests} {replies}");
    assert_eq!(inner_bodies, 126);
}

#[test]
fn requests_we_build_are_byte_identical_to_mco() {
    let mut checked = 0;
    for c in all_frames() {
        if c.frame.body.is_empty() || !is_request(&marshal::decode(&c.frame.body).unwrap()) {
            continue;
        }
        let id = format!("{}/{}", c.broker, c.name);
        let (req, hash) = Request::decode(&c.frame.body, DecodeLimits::default()).unwrap();
        // Inner body, rebuilt from its parts.
        let inner = marshal::decode(&req.body).unwrap();
        let rebuilt_inner = if req.agent == "discovery" {
            message::discovery_body().unwrap()
        } else {
            let data = inner.get_sym("data").unwrap().as_hash().unwrap();
            let inputs: Vec<(String, Value)> = data
                .iter()
                .filter(|(k, _)| k.as_sym() != Some("process_results"))
                .map(|(k, v)| (k.as_sym().unwrap().to_string(), v.clone()))
                .collect();
            message::rpc_body(
                inner.get_sym("agent").unwrap().as_str().unwrap(),
                inner.get_sym("action").unwrap().as_str().unwrap(),
                inner.get_sym("caller").unwrap().as_str().unwrap(),
                &inputs,
                true,
            )
            .unwrap()
        };
        assert_eq!(rebuilt_inner, req.body, "{id} inner");
        // Outer: same bytes, same signature.
        let rebuilt = Request { body: rebuilt_inner, ..req.clone() };
        let bytes = rebuilt.encode(PSK).unwrap();
        assert_eq!(bytes, c.frame.body, "{id} outer");
        assert_eq!(psk::sign(&rebuilt.body, PSK), hash);
        checked += 1;
    }
    assert!(checked >= 40, "{checked}");
}

#[test]
fn replies_re_encode_like_the_daemons() {
    let (mut exact, mut total) = (0, 0);
    for c in all_frames() {
        if c.frame.body.is_empty() || is_request(&marshal::decode(&c.frame.body).unwrap()) {
            continue;
        }
        let reply = Reply::decode_verified(&c.frame.body, PSK, DecodeLimits::default()).unwrap();
        assert_eq!(reply.encode(PSK).unwrap(), c.frame.body, "{}/{}", c.broker, c.name);
        // Inner bodies: the same value and, with hash-key sharing, the same bytes.
        let inner = reply.inner(DecodeLimits::default()).unwrap();
        let again = marshal::encode(&inner).unwrap();
        assert_eq!(marshal::decode(&again).unwrap(), inner);
        if again[..] == *reply.body {
            exact += 1;
        }
        total += 1;
    }
    assert_eq!(exact, total, "inner bodies byte-exact");
}

fn captured_connector(broker: &str) -> Connector {
    Connector {
        kind: ConnectorKind::parse(broker).unwrap(),
        identity: "mco-client".into(),
        vhost: if broker == "rabbitmq" { "/mcollective" } else { "mcollective" }.into(),
    }
}

#[test]
fn client_frames_we_build_match_captured_c2s_frames() {
    let mut checked = 0;
    let broker_login = BrokerHost {
        host: "127.0.0.1".into(),
        port: 61613,
        user: "mcollective".into(),
        password: "marionette".into(),
        tls: None,
    };
    for c in all_frames() {
        if c.dir != "c2s" {
            continue;
        }
        let conn = captured_connector(c.broker);
        let f = &c.frame;
        let sender = f.get("mc_sender");
        let built = match f.command.as_str() {
            "CONNECT" => conn.connect(&broker_login, &[Version::V1_0]),
            "DISCONNECT" => conn.disconnect(),
            "SUBSCRIBE" => conn.subscribe(f.get("destination").unwrap(), Version::V1_0).unwrap(),
            "UNSUBSCRIBE" => conn.unsubscribe(f.get("destination").unwrap(), Version::V1_0).unwrap(),
            "SEND" if sender == Some("mco-client") => {
                let (req, _) = Request::decode(&f.body, DecodeLimits::default()).unwrap();
                let dest = f.get("destination").unwrap();
                let directed = dest.contains("_directed/") || dest.ends_with(".nodes");
                let node = if directed {
                    Some(f.get("mc_identity").unwrap_or_else(|| dest.rsplit('/').next().unwrap()))
                } else {
                    None
                };
                let now_secs = f.get("timestamp").map(|t| t.parse::<u64>().unwrap() / 1000).unwrap_or(0);
                let reply_to = f.get("reply-to").unwrap();
                if c.broker == "rabbitmq" {
                    assert_eq!(reply_to, conn.reply_queue(&req.collective, &req.agent));
                }
                let route = RequestRoute {
                    collective: &req.collective,
                    agent: &req.agent,
                    node,
                    reply_to,
                    ttl: u32::try_from(req.ttl).unwrap(),
                    now_secs,
                };
                conn.request(&route, f.body.clone())
            }
            _ => continue, // daemon replies
        };
        assert_eq!(stomp::encode(&built, Version::V1_0).unwrap(), c.raw, "{}/{}", c.broker, c.name);
        checked += 1;
    }
    assert!(checked >= 50, "{checked}");
}

#[test]
fn tampered_or_foreign_replies_are_refused() {
    let raw = fs::read(fixtures().join("rabbitmq/066-s04-s2c-MESSAGE.raw")).unwrap();
    let frame = stomp::decode(&raw, Version::V1_0, Limits::default()).unwrap();
    let mut reply = Reply::decode_verified(&frame.body, PSK, DecodeLimits::default()).unwrap();
    // Change the inner body, keep the old hash: signature fails.
    let original = reply.clone();
    reply.body = RpcStatus {
        statuscode: 0,
        statusmsg: "OK".into(),
        data: Value::Hash(vec![(Value::sym("value"), Value::str("evil"))]),
    }
    .encode()
    .unwrap()
    .into();
    let forged = reply.encode("attacker-key").unwrap();
    assert!(matches!(Reply::decode_verified(&forged, PSK, DecodeLimits::default()), Err(Error::Signature(_))));
    // Swap the hash string bytes in the captured stream: signature fails.
    let mut bytes = frame.body.clone();
    let pos = bytes.windows(32).position(|w| w == b"e35c002d834bdd579b694f2b4dc501b3").unwrap();
    bytes[pos] = b'f';
    assert!(matches!(Reply::decode_verified(&bytes, PSK, DecodeLimits::default()), Err(Error::Signature(_))));
    // Flipping a byte of the signed inner body (same length) also fails.
    // (The outer :senderid is not covered by psk; that is the protocol.)
    let mut bytes = frame.body.clone();
    let pos = bytes.windows(4).rposition(|w| w == b"node").unwrap();
    bytes[pos] = b'm';
    assert!(Reply::decode_verified(&bytes, PSK, DecodeLimits::default()).is_err());
    assert_eq!(original.requestid, "a0235d01852e53ed99a4a7bac78ba54c");
}

/// One answer of `decode_replies_verified`'s or `Reply::decode_verified`'s, comparable.
fn answer(r: Result<Reply, Error>) -> Result<Reply, String> {
    r.map_err(|e| format!("{}: {e}", if matches!(e, Error::Signature(_)) { "signature" } else { "other" }))
}

#[test]
fn replies_checked_in_a_batch_get_the_answers_they_get_one_by_one() {
    let mut outers: Vec<Vec<u8>> = Vec::new();
    for c in all_frames() {
        if c.frame.body.is_empty() || Request::decode(&c.frame.body, DecodeLimits::default()).is_ok() {
            continue;
        }
        outers.push(c.frame.body.clone());
        // Its hash with one hex digit changed, upper-cased, and cut short.
        let body = &c.frame.body;
        if let Some(pos) = body.windows(34).position(|w| w[0] == b'%' && w[1..33].iter().all(u8::is_ascii_hexdigit)) {
            let mut changed = body.clone();
            changed[pos + 1] = if changed[pos + 1] == b'0' { b'1' } else { b'0' };
            outers.push(changed);
            let mut upper = body.clone();
            upper[pos + 1..pos + 33].make_ascii_uppercase();
            outers.push(upper);
        }
        outers.push(body[..body.len() / 2].to_vec());
    }
    let mut rng = Lcg(0xba7c);
    let captured = outers.len();
    for _ in 0..2000 {
        let mut body = outers[(rng.next() as usize) % captured].clone();
        for _ in 0..1 + rng.next() % 3 {
            let i = (rng.next() as usize) % body.len();
            body[i] = rng.next() as u8;
        }
        outers.push(body);
    }
    let refs: Vec<&[u8]> = outers.iter().map(Vec::as_slice).collect();
    for psk in [PSK, "wrong"] {
        let one_by_one: Vec<_> =
            refs.iter().map(|o| answer(Reply::decode_verified(o, psk, DecodeLimits::default()))).collect();
        // Batches of every size the client forms, and one batch of everything.
        for size in [1, 7, 8, 9, 64, refs.len()] {
            let batched: Vec<_> = refs
                .chunks(size)
                .flat_map(|chunk| {
                    message::decode_replies_verified(
                        chunk.iter().map(|o| o.to_vec()).collect(),
                        psk,
                        DecodeLimits::default(),
                    )
                })
                .map(answer)
                .collect();
            assert_eq!(batched, one_by_one, "batches of {size}, psk {psk}");
        }
        let accepted = one_by_one.iter().filter(|a| a.is_ok()).count();
        let refused = one_by_one.iter().filter(|a| a.as_ref().is_err_and(|e| e.starts_with("signature"))).count();
        if psk == PSK {
            assert!(accepted > 100 && refused > 50, "{accepted} accepted, {refused} refused on the signature");
        } else {
            assert_eq!(accepted, 0);
        }
    }
}

#[test]
fn frames_already_here_are_read_without_waiting_and_the_rest_is_waited_for() {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut broker = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (client, _) = listener.accept().unwrap();
    let mut reader = stomp::FrameReader::new(client, Limits::default());
    let frame = |i: usize| stomp::encode(&Frame::new("MESSAGE").body(format!("reply {i}").into_bytes()), Version::V1_0);
    let mut burst = Vec::new();
    for i in 0..20 {
        burst.extend(frame(i).unwrap());
    }
    broker.write_all(&burst).unwrap();
    let far = Instant::now() + Duration::from_secs(30);
    // Every frame of the burst, then none: the socket is empty and nothing is waited for.
    let mut bodies = Vec::new();
    let started = Instant::now();
    while bodies.len() < 20 {
        match reader.read_frame_if_ready(far).unwrap() {
            Some(f) => bodies.push(String::from_utf8(f.body).unwrap()),
            // The burst may still be on its way through the loopback.
            None => std::thread::sleep(Duration::from_millis(5)),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{} frames of 20", bodies.len());
    }
    assert_eq!(bodies, (0..20).map(|i| format!("reply {i}")).collect::<Vec<_>>());
    let t = Instant::now();
    assert!(reader.read_frame_if_ready(far).unwrap().is_none());
    assert!(t.elapsed() < Duration::from_secs(1), "waited {:?} on an empty socket", t.elapsed());
    // Half a frame is kept, not waited for; the rest completes it.
    let next = frame(20).unwrap();
    broker.write_all(&next[..next.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(reader.read_frame_if_ready(far).unwrap().is_none());
    broker.write_all(&next[next.len() / 2..]).unwrap();
    let f = reader.read_frame_before(far).unwrap().unwrap();
    assert_eq!(f.body, b"reply 20");
    // A passed deadline reads nothing new.
    broker.write_all(&frame(21).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(reader.read_frame_if_ready(Instant::now() - Duration::from_millis(1)).unwrap().is_none());
    assert_eq!(reader.read_frame_if_ready(far).unwrap().unwrap().body, b"reply 21");
    // A closed connection is reported, not taken for a quiet one.
    drop(broker);
    std::thread::sleep(Duration::from_millis(50));
    assert!(reader.read_frame_if_ready(far).is_err());
}

// ---- hostile input: errors, never panics ----

#[test]
fn truncated_frames_and_bodies_are_errors() {
    for c in all_frames() {
        // Every strict prefix of a frame is incomplete.
        for cut in 0..c.raw.len() {
            let r = stomp::decode(&c.raw[..cut], Version::V1_0, Limits::default());
            assert!(r.is_err(), "{}/{} cut at {cut}", c.broker, c.name);
        }
        // Every strict prefix of a Marshal body is an error.
        for cut in 0..c.frame.body.len() {
            assert!(marshal::decode(&c.frame.body[..cut]).is_err(), "{} cut {cut}", c.name);
        }
    }
}

#[test]
fn mutated_frames_and_bodies_never_panic() {
    let frames = all_frames();
    let mut rng = Lcg(0x5eed);
    let tiny = Limits { max_header_bytes: 256, max_headers: 8, max_body: 300 };
    for round in 0..4000 {
        let c = &frames[(rng.next() as usize) % frames.len()];
        let mut raw = c.raw.clone();
        for _ in 0..1 + rng.next() % 4 {
            let i = (rng.next() as usize) % raw.len();
            raw[i] = match rng.next() % 4 {
                0 => 0,
                1 => b'\n',
                2 => b':',
                _ => rng.next() as u8,
            };
        }
        let limits = if round % 2 == 0 { Limits::default() } else { tiny };
        let _ = stomp::decode(&raw, Version::V1_2, limits);
        let _ = stomp::decode(&raw, Version::V1_0, limits);
        if !c.frame.body.is_empty() {
            let mut body = c.frame.body.clone();
            for _ in 0..1 + rng.next() % 3 {
                let i = (rng.next() as usize) % body.len();
                body[i] = rng.next() as u8;
            }
            let _ = marshal::decode(&body);
            let _ = Reply::decode_verified(&body, PSK, DecodeLimits::default());
            let _ = Request::decode(&body, DecodeLimits::default());
        }
    }
}

#[test]
fn oversized_frames_are_refused_before_buffering() {
    let raw = fs::read(fixtures().join("activemq/057-s05-s2c-MESSAGE.raw")).unwrap();
    let small = Limits { max_body: 100, ..Limits::default() };
    let err = stomp::decode(&raw, Version::V1_0, small).unwrap_err();
    assert!(err.to_string().contains("exceeds"), "{err}");
    let few = Limits { max_headers: 3, ..Limits::default() };
    assert!(stomp::decode(&raw, Version::V1_0, few).is_err());
    let limits = DecodeLimits { max_input: 100, ..DecodeLimits::default() };
    let frame = stomp::decode(&raw, Version::V1_0, Limits::default()).unwrap();
    assert!(marshal::decode_with(&frame.body, limits).is_err());
    let shallow = DecodeLimits { max_depth: 0, ..DecodeLimits::default() };
    assert!(marshal::decode_with(&frame.body, shallow).is_err());
}

#[test]
fn heartbeats_between_captured_frames_are_skipped() {
    let frames = all_frames();
    let mut stream = Vec::new();
    for c in frames.iter().filter(|c| c.broker == "activemq") {
        stream.extend_from_slice(b"\n\r\n");
        stream.extend_from_slice(&c.raw);
    }
    stream.extend_from_slice(b"\n\n");
    let mut r = stomp::FrameReader::new(&stream[..], Limits::default());
    for c in frames.iter().filter(|c| c.broker == "activemq") {
        assert_eq!(r.read_frame().unwrap(), c.frame);
    }
    assert!(r.read_frame().is_err());
}

/// A client that reads recordings only (its broker is never connected to).
fn recording_client() -> puppet_kicker::mcollective::Client {
    use puppet_kicker::mcollective::config::{Config, Overrides};
    let broker =
        BrokerHost { host: "127.0.0.1".into(), port: 61613, user: String::new(), password: String::new(), tls: None };
    let o = Overrides { no_config_file: true, psk: Some(PSK.into()), pool: Some(vec![broker]), ..Overrides::default() };
    puppet_kicker::mcollective::Client::new(Config::resolve("", None, &o, None).unwrap())
}

/// One MESSAGE frame of a reply, as a broker delivers it.
fn reply_frame(senderid: &str, requestid: &str, msgtime: i64, data: &str, psk: &str) -> Vec<u8> {
    let inner = RpcStatus {
        statuscode: 0,
        statusmsg: "OK".into(),
        data: Value::Hash(vec![(Value::sym("value"), Value::str(data))]),
    }
    .encode()
    .unwrap();
    let outer = Reply {
        senderid: senderid.into(),
        requestid: requestid.into(),
        senderagent: "rpcutil".into(),
        msgtime,
        body: inner.into(),
        signature: None,
    }
    .encode(psk)
    .unwrap();
    let frame = Frame::new("MESSAGE")
        .header("destination", "/reply-queue/amq.gen-test")
        .header("content-length", outer.len().to_string())
        .body(outer);
    stomp::encode(&frame, Version::V1_0).unwrap()
}

/// `Client::collect_recorded` runs the client's own collect loop over recorded
/// frames: three batches and more, forged, foreign, duplicate and ambiguous
/// replies among them, each refused and counted as on a socket; the count stops
/// it; an ERROR frame ends it unless the count is met; a recording cut inside a
/// frame is an error.
#[test]
fn a_recorded_burst_is_collected_as_the_client_collects_one() {
    const REQUEST: &str = "0123456789abcdef0123456789abcdef";
    let sent = puppet_kicker::time::now();
    // Frames (and heart-beats) one by one, so a recording can be cut between two.
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut good = Vec::new();
    for i in 0..150 {
        let sender = format!("node{i:03}.example.com");
        frames.push(reply_frame(&sender, REQUEST, sent, &format!("v{i}"), PSK));
        good.push(sender);
        if i % 50 == 7 {
            frames.push(b"\n".to_vec());
        }
    }
    frames.push(reply_frame("forged.example.com", REQUEST, sent, "x", "another-psk"));
    frames.push(reply_frame("foreign.example.com", "ffffffffffffffffffffffffffffffff", sent, "x", PSK));
    frames.push(reply_frame("node001.example.com", REQUEST, sent, "again", PSK));
    frames.push(reply_frame("old.example.com", REQUEST, sent - 3600, "x", PSK));
    // The same signed body under a second sender: the psk cannot say who sent it.
    frames.push(reply_frame("twin.example.com", REQUEST, sent, "v3", PSK));
    let stream = frames.concat();

    let client = recording_client();
    let got = client.collect_recorded(&stream, REQUEST, "rpcutil", sent, None).unwrap();
    let mut expected = good.clone();
    expected.push("twin.example.com".into());
    expected.sort();
    let senders: Vec<&str> = got.replies.iter().map(|r| r.senderid.as_str()).collect();
    assert_eq!(senders, expected);
    assert_eq!(got.ambiguous, ["node003.example.com", "twin.example.com"]);
    let node7 = got.replies.iter().find(|r| r.senderid == "node007.example.com").unwrap();
    let alone = Reply::decode_verified(
        &stomp::decode(&reply_frame("node007.example.com", REQUEST, sent, "v7", PSK), Version::V1_0, Limits::default())
            .unwrap()
            .body,
        PSK,
        DecodeLimits::default(),
    )
    .unwrap();
    assert_eq!(node7, &alone, "kept with its frame's bytes, the reply it is alone");
    let stats = client.stats();
    assert_eq!((stats.bad_hash, stats.foreign_requestid, stats.duplicate, stats.bad_msgtime), (1, 1, 1, 1));

    let first_100 = client.collect_recorded(&stream, REQUEST, "rpcutil", sent, Some(100)).unwrap();
    assert_eq!(first_100.replies.len(), 100);

    let mut erred = frames[..frames.len() / 2].concat();
    erred.extend(stomp::encode(&Frame::new("ERROR").header("message", "queue deleted"), Version::V1_0).unwrap());
    let met = client.collect_recorded(&erred, REQUEST, "rpcutil", sent, Some(10)).unwrap();
    assert_eq!(met.replies.len(), 10, "the count was met before the ERROR");
    let unmet = client.collect_recorded(&erred, REQUEST, "rpcutil", sent, None).unwrap_err().to_string();
    assert!(unmet.contains("queue deleted") && unmet.contains("the recording"), "{unmet}");

    let cut_short = &stream[..stream.len() - 10];
    assert!(client.collect_recorded(cut_short, REQUEST, "rpcutil", sent, None).is_err());
}

/// A burst of many batches: from the second on, batches are verified on a second
/// thread while the collect loop reads on. The replies kept, their order of
/// acceptance and the counters are those of checking each reply in arrival order;
/// a count met in the middle of a batch keeps exactly the first replies to meet it.
#[test]
fn a_burst_of_many_batches_is_kept_in_arrival_order_while_verified_beside() {
    const REQUEST: &str = "0123456789abcdef0123456789abcdef";
    let sent = puppet_kicker::time::now();
    // Each frame, and what it is: a good reply, a forged one, a duplicate.
    let (mut frames, mut kinds, mut good) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..1000 {
        let sender = format!("node{i:04}.example.com");
        if i % 97 == 13 {
            frames.push(reply_frame(&sender, REQUEST, sent, "x", "another-psk"));
            kinds.push('f');
            continue;
        }
        frames.push(reply_frame(&sender, REQUEST, sent, &format!("v{i}"), PSK));
        kinds.push('g');
        good.push(sender);
        if i % 131 == 5 {
            frames.push(reply_frame(&format!("node{:04}.example.com", i / 2), REQUEST, sent, "again", PSK));
            kinds.push('d');
        }
    }
    let stream = frames.concat();
    let count_of = |kind: char, before: usize| kinds[..before].iter().filter(|k| **k == kind).count() as u64;

    let client = recording_client();
    let got = client.collect_recorded(&stream, REQUEST, "rpcutil", sent, None).unwrap();
    let mut expected = good.clone();
    expected.sort();
    let senders: Vec<&str> = got.replies.iter().map(|r| r.senderid.as_str()).collect();
    assert_eq!(senders, expected);
    let stats = client.stats();
    assert_eq!((stats.bad_hash, stats.duplicate), (count_of('f', kinds.len()), count_of('d', kinds.len())));

    // Counts met in the first batch, at a batch's end, just past it, and inside
    // later batches verified on the second thread: exactly the first good replies
    // are kept, and only the frames checked before the one that met the count are
    // counted, as when each batch is checked where it is read.
    for count in [1, 64, 65, 129, 700, good.len()] {
        let client = recording_client();
        let got = client.collect_recorded(&stream, REQUEST, "rpcutil", sent, Some(count)).unwrap();
        let mut first: Vec<String> = good[..count].to_vec();
        first.sort();
        let senders: Vec<&str> = got.replies.iter().map(|r| r.senderid.as_str()).collect();
        assert_eq!(senders, first, "the first {count} good replies");
        let meets = kinds.iter().enumerate().filter(|(_, k)| **k == 'g').nth(count - 1).unwrap().0;
        let stats = client.stats();
        assert_eq!((stats.bad_hash, stats.duplicate), (count_of('f', meets), count_of('d', meets)), "count {count}");
    }
}
