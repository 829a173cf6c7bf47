//! The borrowed Marshal reader (`mcollective::marshal_reader`) and the inventory path
//! built on it, held to the marshal-rs path they replace: on every captured frame,
//! on a synthetic fleet's inventories, and on hostile input.

mod support;

use std::fs;
use std::path::Path;
use support::Lcg;

use puppet_kicker::mcollective::marshal::{self, DecodeLimits, Value};
use puppet_kicker::mcollective::marshal_reader::{self, Doc, Scan};
use puppet_kicker::mcollective::message::{Reply, ReplyRef, RpcStatus, Unread};
use puppet_kicker::mcollective::stomp::{self, Limits, Version};
use puppet_kicker::mcollective::RpcReply;
use puppet_kicker::source::mcollective::{observation, observation_from_body, observe_replies, BodyError, InnerBody};
use puppet_kicker::store::Builder;
use puppet_kicker::synthetic;
use serde_json::Value as Json;

const PSK: &str = "feas-psk-secret";

/// Every captured STOMP body, and the inner bodies of those that are replies.
fn captured_bodies() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for broker in ["rabbitmq", "activemq"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frames").join(broker);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "raw"))
            .collect();
        names.sort();
        for path in names {
            let frame = stomp::decode(&fs::read(&path).unwrap(), Version::V1_0, Limits::default()).unwrap();
            if frame.body.is_empty() {
                continue;
            }
            let name = format!("{broker}/{}", path.file_name().unwrap().to_string_lossy());
            if let Ok(reply) = Reply::decode_verified_via_values(&frame.body, PSK, DecodeLimits::default()) {
                out.push((format!("{name} (inner)"), reply.body.to_vec()));
            }
            out.push((name, frame.body));
        }
    }
    out
}

/// Both readers refuse, or both give the same value.
fn same_as_marshal_rs(bytes: &[u8], limits: DecodeLimits) -> bool {
    match (marshal::decode_with(bytes, limits), marshal_reader::decode_with(bytes, limits)) {
        (Ok(a), Ok(b)) => a == b || format!("{a:?}") == format!("{b:?}"), // NaN != NaN
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

#[test]
fn every_captured_body_reads_as_marshal_rs_reads_it_without_falling_back() {
    let bodies = captured_bodies();
    assert!(bodies.len() > 180, "{}", bodies.len());
    for (name, body) in &bodies {
        let doc = Doc::scan(body, DecodeLimits::default());
        assert!(doc.is_ok(), "{name}: {:?}", doc.err());
        let doc = doc.unwrap();
        assert_eq!(doc.value(doc.root()).unwrap(), marshal::decode(body).unwrap(), "{name}");
    }
}

#[test]
fn captured_replies_decode_in_place_as_through_values() {
    let mut replies = 0;
    for (name, body) in captured_bodies() {
        let old = Reply::decode_verified_via_values(&body, PSK, DecodeLimits::default());
        let new = ReplyRef::decode_verified(&body, PSK, DecodeLimits::default());
        match (&old, &new) {
            (Ok(old), Ok(new)) => {
                assert_eq!(*old, new.to_owned(), "{name}");
                replies += 1;
                // The inner body, through the inventory path: the same refusal or observation.
                let (mut a, mut b) = (Builder::new(), Builder::new());
                let via_values = RpcReply::from_reply(old.clone(), DecodeLimits::default())
                    .map(|rpc| observation(&rpc, 1_700_000_000, "mcollective", &mut a));
                let body = InnerBody {
                    sender: new.senderid,
                    msgtime: new.msgtime,
                    bytes: new.body,
                    limits: DecodeLimits::default(),
                    at: 1_700_000_000,
                    main_collective: "mcollective",
                };
                let in_place = observation_from_body(body, &mut b);
                match (via_values, in_place) {
                    (Ok(Ok(x)), Ok(y)) => assert_eq!(x, y, "{name}"),
                    (Ok(Err(x)), Err(BodyError::Inventory(y))) => assert_eq!(x, y, "{name}"),
                    (Err(_), Err(BodyError::Malformed(_))) => {}
                    (x, y) => panic!("{name}: {x:?} / {y:?}"),
                }
                assert_eq!(a.finish(), b.finish(), "{name}");
            }
            (Err(_), Err(Unread::Error(_))) => {}
            _ => panic!("{name}: {old:?} / {new:?}"),
        }
        // A wrong psk is refused by both.
        assert!(ReplyRef::decode_verified(&body, "wrong", DecodeLimits::default()).is_err());
    }
    assert!(replies > 60, "{replies}");
}

/// `rpcutil#inventory`'s data for a synthetic server, as mcollective 2.12 sends it
/// (the same generator as benches/inventory.rs).
fn inventory(facts: &serde_json::Map<String, Json>, environment: &str, i: usize) -> Value {
    let strings = |items: &[&str]| Value::Array(items.iter().map(|s| Value::str(*s)).collect());
    let role = facts.get("role").and_then(Json::as_str).unwrap_or("node");
    let mut classes = vec!["settings".to_string(), format!("role::{role}"), "profile::base".into()];
    classes.extend((0..37).map(|c| format!("profile::component{}::part{}", c, (i + c) % 7)));
    Value::Hash(vec![
        (Value::sym("agents"), strings(&["discovery", "package", "puppet", "rpcutil", "service"])),
        (Value::sym("facts"), stringified(&Json::Object(facts.clone()))),
        (Value::sym("classes"), Value::Array(classes.into_iter().map(Value::str).collect())),
        (Value::sym("version"), Value::str("2.12.5")),
        (Value::sym("main_collective"), Value::str("mcollective")),
        (Value::sym("collectives"), strings(&["mcollective", environment])),
    ])
}

fn stringified(v: &Json) -> Value {
    match v {
        Json::Array(items) => Value::Array(items.iter().map(stringified).collect()),
        Json::Object(map) => Value::Hash(map.iter().map(|(k, v)| (Value::str(k.as_str()), stringified(v))).collect()),
        Json::Null => Value::str(""),
        Json::String(s) => Value::str(s.as_str()),
        other => Value::str(other.to_string()),
    }
}

/// Signed outer replies of a synthetic fleet, with a few odd ones among them.
fn fleet_replies(count: usize) -> Vec<Vec<u8>> {
    let nodes = synthetic::fleet(count, 7, 1_700_000_000);
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let mut data = inventory(&node.facts, &node.environment, i);
            if i % 97 == 5 {
                // Values of every kind among the facts, raw (not stringified).
                if let Value::Hash(pairs) = &mut data {
                    pairs[1].1 = Value::Hash(vec![
                        (Value::sym("a"), Value::Int(-3)),
                        (Value::Int(1), Value::Float(0.5)),
                        (Value::str("big"), Value::Int(i64::MAX)),
                        (Value::str("n"), Value::Nil),
                        (Value::Array(vec![Value::Int(1), Value::str("x")]), Value::Float(f64::INFINITY)),
                        (Value::str("bin"), Value::binary(vec![0xff, b'a'])),
                        (Value::str("b"), Value::Bool(true)),
                        (Value::str("b"), Value::str("the last of a repeated key")),
                    ]);
                }
            }
            let (statuscode, data) = match i % 211 {
                7 => (5, data),
                8 => (0, Value::Hash(vec![])),
                _ => (0, data),
            };
            let inner = RpcStatus { statuscode, statusmsg: "OK".into(), data }.encode().unwrap();
            let inner = if i % 301 == 9 { b"\x04\x08[\x06@\x00".to_vec() } else { inner };
            Reply {
                senderid: node.certname.clone(),
                requestid: "0123456789abcdef0123456789abcdef".into(),
                senderagent: "rpcutil".into(),
                msgtime: 1_700_000_000,
                body: inner.into(),
                signature: None,
            }
            .encode(PSK)
            .unwrap()
        })
        .collect()
}

#[test]
fn a_synthetic_fleet_gives_the_same_servers_facts_and_store_ids_on_either_path() {
    let outers = fleet_replies(700);
    let limits = DecodeLimits::default();
    // The old path: values, then observation, one server after the other.
    let mut old = Builder::new();
    let mut old_observations = Vec::new();
    let mut old_refused = Vec::new();
    for outer in &outers {
        let reply = Reply::decode_verified_via_values(outer, PSK, limits).unwrap();
        let sender = reply.senderid.clone();
        match RpcReply::from_reply(reply, limits) {
            Ok(rpc) => match observation(&rpc, 1_700_000_005, "mcollective", &mut old) {
                Ok(o) => old_observations.push(o),
                Err(e) => old_refused.push((sender, e.to_string())),
            },
            Err(_) => old_refused.push((sender, "malformed".into())),
        }
    }
    assert!(old_observations.len() > 680 && old_refused.len() >= 5, "{} {old_refused:?}", old_observations.len());
    let old = old.finish();

    let servers: Vec<Vec<(Reply, i64)>> = outers
        .iter()
        .map(|o| vec![(ReplyRef::decode_verified(o, PSK, limits).unwrap().to_owned(), 1_700_000_005)])
        .collect();
    for threads in [1, 2] {
        let mut new = Builder::new();
        let observed = observe_replies(&servers, "mcollective", limits, threads, &mut new);
        assert_eq!(observed.observations, old_observations, "{threads} threads");
        assert_eq!(observed.accepted + observed.malformed, outers.len());
        assert_eq!(observed.warnings.len() + observed.malformed, old_refused.len(), "{:?}", observed.warnings);
        assert_eq!(new.finish(), old, "{threads} threads: the same store, id for id");
    }
}

#[test]
fn hostile_input_is_refused_by_the_reader_itself() {
    let mut deep = b"\x04\x08".to_vec();
    deep.extend(std::iter::repeat_n([b'[', 0x06], 100_000).flatten());
    deep.push(b'0');
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("deep nesting", deep),
        ("cycle", b"\x04\x08[\x06@\x00".to_vec()),
        ("huge declared string", b"\x04\x08\"\x04\xff\xff\xff\x7fabc".to_vec()),
        ("huge declared array", b"\x04\x08[\x04\xff\xff\xff\x7f0".to_vec()),
        ("huge declared hash", b"\x04\x08{\x04\xff\xff\xff\x7f00".to_vec()),
        ("empty", b"".to_vec()),
        ("bad version", b"\x04\x09[\x00".to_vec()),
        ("truncated", b"\x04\x08{\x06:\x06a".to_vec()),
        ("bad symbol link", b"\x04\x08;\x05".to_vec()),
        ("trailing data", b"\x04\x080T".to_vec()),
        ("link ahead", b"\x04\x08[\x07@\x06\"\x06x".to_vec()),
    ];
    for (what, bytes) in &cases {
        let scan = Doc::scan(bytes, DecodeLimits::default());
        assert!(matches!(scan, Err(Scan::Invalid(_))), "{what}: {:?}", scan.map(|_| ()));
        assert!(marshal::decode(bytes).is_err(), "{what}: marshal-rs refuses it too");
    }
    let limits = DecodeLimits { max_input: 4, ..DecodeLimits::default() };
    assert!(matches!(Doc::scan(b"\x04\x08[\x000", limits), Err(Scan::Invalid(_))), "input size");

    // Links that would expand to 2^30 strings: refused by the value budget.
    let mut b = b"\x04\x08".to_vec();
    for _ in 0..30 {
        b.extend_from_slice(b"[\x07");
    }
    b.extend_from_slice(b"I\"\x06x\x06:\x06ET");
    for level in (0..30u8).rev() {
        b.push(b'@');
        b.push(level + 1 + 5);
    }
    let limits = DecodeLimits { max_depth: 64, max_values: 10_000, ..DecodeLimits::default() };
    assert!(matches!(Doc::scan(&b, limits), Err(Scan::Invalid(_))), "link expansion");
    assert!(marshal::decode_with(&b, limits).is_err());
    let small = DecodeLimits { max_bytes: 3, ..DecodeLimits::default() };
    assert!(Doc::scan(b"\x04\x08[\x07\"\x06x@\x06", small).is_ok());
    assert!(matches!(Doc::scan(b"\x04\x08[\x08\"\x06x@\x06@\x06@\x06", small), Err(Scan::Invalid(_))), "bytes budget");
}

#[test]
fn every_shape_of_a_strings_encoding_flag_reads_as_marshal_rs_reads_it() {
    // The reader takes `\x06 ; link flag` at once; every neighbour of that shape
    // must still give marshal-rs's answer (value or refusal).
    let mut checked = 0;
    // At the depth limit too: the Strings inside the Array are one level down.
    let limited = [DecodeLimits::default(), DecodeLimits { max_depth: 0, ..DecodeLimits::default() }];
    for limits in limited {
        for count in [0u8, 5, 6, 7] {
            for link in [0u8, 1, 4, 5, 6, 7, 0x7f, 0x80, 0xfb, 0xff] {
                for flag in [b'T', b'F', b'0', b'i', b'"'] {
                    for sep in [b';', b':'] {
                        // Two strings: the first names `E`, the second links to a symbol.
                        let mut b = b"\x04\x08[\x07I\"\x06a\x06:\x06ETI\"\x06b".to_vec();
                        b.extend([count, sep, link, flag]);
                        b.extend(b"\x06x");
                        for cut in [b.len(), b.len() - 2, b.len() - 4] {
                            assert!(same_as_marshal_rs(&b[..cut], limits), "{:?}", &b[..cut]);
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(checked, 2 * 4 * 10 * 5 * 2 * 3);
    // Both readers take the first and refuse the second, whose Strings are too deep.
    let two = b"\x04\x08[\x07I\"\x06a\x06:\x06ETI\"\x06b\x06;\x00T";
    assert!(marshal_reader::decode_with(two, DecodeLimits::default()).is_ok());
    assert!(marshal_reader::decode_with(two, limited[1]).is_err());
    // Links to Strings read the quick way find them in the object table.
    for link in [0u8, 6, 7, 8] {
        let mut b = b"\x04\x08[\x08I\"\x06a\x06:\x06ETI\"\x06b\x06;\x00T@".to_vec();
        b.push(link);
        assert!(same_as_marshal_rs(&b, DecodeLimits::default()), "link {link}");
    }
    let linked = b"\x04\x08[\x08I\"\x06a\x06:\x06ETI\"\x06b\x06;\x00T@\x07";
    assert!(marshal_reader::decode_with(linked, DecodeLimits::default()).is_ok());
}

#[test]
fn values_outside_the_subset_go_to_marshal_rs() {
    // [/ab/, Object Foo]
    let bytes = b"\x04\x08[\x07I/\x07ab\x00\x06:\x06EFo:\x08Foo\x00";
    assert!(matches!(Doc::scan(bytes, DecodeLimits::default()), Err(Scan::Unsupported(_))));
    assert_eq!(marshal_reader::decode_with(bytes, DecodeLimits::default()).unwrap(), marshal::decode(bytes).unwrap());
}

#[test]
fn truncated_and_mutated_bodies_read_as_marshal_rs_reads_them() {
    let bodies = captured_bodies();
    for (name, body) in &bodies {
        for cut in 0..body.len() {
            let scan = Doc::scan(&body[..cut], DecodeLimits::default());
            assert!(matches!(scan, Err(Scan::Invalid(_))), "{name} cut at {cut}");
        }
    }
    let mut rng = Lcg(0x5eed);
    let tight = DecodeLimits { max_depth: 4, max_values: 200, max_bytes: 2000, ..DecodeLimits::default() };
    for round in 0..20_000 {
        let (name, body) = &bodies[(rng.next() as usize) % bodies.len()];
        let mut body = body.clone();
        for _ in 0..1 + rng.next() % 3 {
            let i = (rng.next() as usize) % body.len();
            body[i] = match rng.next() % 3 {
                0 => b"0TFi:;\"@[{Ilf"[(rng.next() % 13) as usize],
                1 => (rng.next() % 12) as u8,
                _ => rng.next() as u8,
            };
        }
        let limits = if round % 3 == 0 { tight } else { DecodeLimits::default() };
        assert!(same_as_marshal_rs(&body, limits), "{name} round {round}: {body:?}");
        let old = Reply::decode_verified_via_values(&body, PSK, limits);
        match ReplyRef::decode_verified(&body, PSK, limits) {
            Ok(new) => assert_eq!(old.unwrap(), new.to_owned(), "{name} round {round}"),
            Err(Unread::Error(_)) => assert!(old.is_err(), "{name} round {round}"),
            Err(Unread::Unsupported) => {}
        }
    }
}

#[test]
fn an_unchanged_body_is_not_decoded_again_and_gives_what_a_full_read_gives() {
    unchanged_bodies_are_given_again(true);
}

#[test]
fn a_reply_without_a_signature_is_known_unchanged_by_its_bytes() {
    unchanged_bodies_are_given_again(false);
}

/// Verified replies are told apart by their PSK signatures; replies without one
/// (built in this process) by a hash of their bodies.
fn unchanged_bodies_are_given_again(signed: bool) {
    use puppet_kicker::source::mcollective::{observe_since, ReplyMemo};
    use puppet_kicker::source::SourceRead;
    let limits = DecodeLimits::default();
    let servers = |outers: &[Vec<u8>], at: i64| -> Vec<Vec<(Reply, i64)>> {
        outers
            .iter()
            .map(|o| {
                let reply = Reply::decode_verified(o, PSK, limits).unwrap();
                assert!(reply.signature.is_some(), "a verified reply carries its signature");
                vec![(Reply { signature: reply.signature.filter(|_| signed), ..reply }, at)]
            })
            .collect()
    };
    let facts = |builder: &Builder,
                 observed: &[puppet_kicker::source::Observation]|
     -> Vec<(String, Json, Json, i64)> {
        let store = builder.store();
        observed
            .iter()
            .map(|o| (o.certname.clone(), store.view(o.facts).to_json(), store.view(o.extra).to_json(), o.timestamp))
            .collect()
    };
    let mut outers = fleet_replies(600);
    let mut first = SourceRead::default();
    let (observed, memo, reused) = observe_since(
        &servers(&outers, 1_700_000_005),
        "mcollective",
        limits,
        2,
        &mut first.builder,
        &ReplyMemo::default(),
    );
    assert_eq!(reused, 0);
    assert_eq!(memo.len(), observed.observations.len());
    first.observations = observed.observations;
    let (index, tables) = first.into_index_and_tables(None, &std::collections::BTreeMap::new(), "role", 1_700_000_005);

    // Three servers changed: one's facts, one now refused, one's inventory garbage.
    let other = fleet_replies(601);
    for (i, from) in [(10, 600), (20, 8 + 211 * 2), (30, 9 + 301)] {
        let theirs = ReplyRef::decode_verified(&other[from], PSK, limits).unwrap();
        let mine = ReplyRef::decode_verified(&outers[i], PSK, limits).unwrap();
        outers[i] = Reply { body: theirs.body.to_vec().into(), ..mine.to_owned() }.encode(PSK).unwrap();
    }
    let later = servers(&outers, 1_700_000_100);
    let mut resumed = Builder::resume(index.store(), tables);
    let (again, _, reused) = observe_since(&later, "mcollective", limits, 2, &mut resumed, &memo);
    assert_eq!(reused, memo.len() - 3);
    let mut full = Builder::new();
    let (fresh, _, _) = observe_since(&later, "mcollective", limits, 1, &mut full, &ReplyMemo::default());
    assert_eq!(facts(&resumed, &again.observations), facts(&full, &fresh.observations));
    assert_eq!(again.warnings, fresh.warnings);
    assert_eq!((again.accepted, again.malformed), (fresh.accepted, fresh.malformed));
    assert!(again.observations.iter().all(|o| o.answered_at == Some(1_700_000_100)));
}

/// `observation_from_body` (one pass, or two when the status follows the facts) and
/// the path through marshal-rs's values: the same refusal, or the same observation
/// and the same store, id for id.
fn same_observation(sender: &str, body: &[u8], limits: DecodeLimits, what: &str) {
    let (mut old_store, mut new_store) = (Builder::new(), Builder::new());
    let inner = InnerBody {
        sender,
        msgtime: 1_700_000_000,
        bytes: body,
        limits,
        at: 1_700_000_005,
        main_collective: "mcollective",
    };
    let new = observation_from_body(inner, &mut new_store);
    let reply = Reply {
        senderid: sender.into(),
        requestid: "0123456789abcdef0123456789abcdef".into(),
        senderagent: "rpcutil".into(),
        msgtime: 1_700_000_000,
        body: body.to_vec().into(),
        signature: None,
    };
    let Ok(rpc) = RpcReply::from_reply(reply, limits) else {
        assert!(matches!(new, Err(BodyError::Malformed(_) | BodyError::Unsupported)), "{what}: {new:?}");
        return;
    };
    let old = observation(&rpc, 1_700_000_005, "mcollective", &mut old_store);
    match (&old, &new) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}"),
        (Err(a), Err(BodyError::Inventory(b))) => assert_eq!(a, b, "{what}"),
        (_, Err(BodyError::Unsupported)) => return,
        (old, new) => panic!("{what}: through values {old:?}, in place {new:?}"),
    }
    assert!(old_store.finish() == new_store.finish(), "{what}: the same store, id for id");
}

#[test]
fn mutated_inventories_read_in_one_pass_as_through_values() {
    let limits = DecodeLimits::default();
    let mut bodies: Vec<Vec<u8>> = fleet_replies(211 * 2)
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 97 == 5 || i % 211 == 7 || i % 211 == 8 || i % 10 == 0)
        .map(|(_, o)| Reply::decode_verified(o, PSK, limits).unwrap().body.to_vec())
        .collect();
    // The facts before the status: read in two passes, with the same result.
    let facts = Value::Hash(vec![(Value::str("role"), Value::str("node"))]);
    for (code, data) in [(0, facts.clone()), (1, facts.clone()), (0, Value::Array(vec![]))] {
        let data = Value::Hash(vec![(Value::sym("facts"), data)]);
        bodies.push(
            marshal::encode(&Value::Hash(vec![
                (Value::sym("data"), data),
                (Value::sym("statuscode"), Value::Int(code)),
                (Value::sym("statusmsg"), Value::str("OK")),
            ]))
            .unwrap(),
        );
    }
    for (i, body) in bodies.iter().enumerate() {
        same_observation("node1.example.com", body, limits, &format!("body {i}"));
        same_observation("bad identity", body, limits, &format!("body {i}, bad identity"));
    }
    let mut rng = Lcg(0xfac7);
    let tight = DecodeLimits { max_depth: 4, max_values: 200, max_bytes: 2000, ..DecodeLimits::default() };
    for round in 0..4_000 {
        let mut body = bodies[(rng.next() as usize) % bodies.len()].clone();
        for _ in 0..1 + rng.next() % 3 {
            let i = (rng.next() as usize) % body.len();
            body[i] = match rng.next() % 3 {
                0 => b"0TFi:;\"@[{Ilf"[(rng.next() % 13) as usize],
                1 => (rng.next() % 12) as u8,
                _ => rng.next() as u8,
            };
        }
        let limits = if round % 3 == 0 { tight } else { limits };
        same_observation("node1.example.com", &body, limits, &format!("round {round}"));
    }
}
