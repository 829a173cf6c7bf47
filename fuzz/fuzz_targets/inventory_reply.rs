//! An mcollective reply through the whole inventory path: outer Marshal and its
//! psk signature, inner Marshal, `rpcutil#inventory` status, then the observation
//! the index is built from. The first byte picks the layer the input replaces: the
//! raw outer stream (most fail the signature), or the inner body, signed here as a
//! daemon would so that the layers behind the signature are reached. The facts the
//! observation put in the store must be what `to_json` reads from the reply.
//!
//! The borrowed reader (`marshal_reader`, `ReplyRef`, `observation_from_body`) is
//! held to the marshal-rs path at every layer: both refuse, or both give the same
//! value, reply, observation and store, id for id (unless the input is outside the
//! reader's subset, which then goes to marshal-rs). Its one pass over the inner body
//! is held to its two passes (`observation_two_passes`) the same way.
//!
//! And as the client and a refresh take it: in a batch of replies whose signatures
//! are checked together (`decode_replies_verified`, the MD5 lanes), each reply as
//! when decoded alone; in a broker's stream of MESSAGE frames among good replies,
//! through the client's own collect loop (`Client::collect_recorded`: its batches,
//! its verifier thread from the second full batch, the checks each reply passes):
//! every reply kept is one decoded alone, the good ones all kept, and this one kept
//! when it passes the checks; a discovery reply's pong; the refresh's observation
//! (`observe_since`), then again from the memo it left, without decoding, the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::mcollective::config::{BrokerHost, Config, Overrides};
use puppet_kicker::mcollective::marshal::{self, DecodeLimits};
use puppet_kicker::mcollective::marshal_reader;
use puppet_kicker::mcollective::message::{decode_replies_verified, is_pong, Reply, ReplyRef, Unread};
use puppet_kicker::mcollective::stomp::{self, Frame, Version};
use puppet_kicker::mcollective::{Client, RpcReply, Value};
use puppet_kicker::source::mcollective::{
    observation, observation_from_body, observation_two_passes, observe_since, to_json, BodyError, InnerBody, ReplyMemo,
};
use puppet_kicker::source::Observation;
use puppet_kicker_fuzz::pool;
use std::sync::OnceLock;

const PSK: &str = "fuzz";
const AT: i64 = 1_700_000_000;
const REQUEST: &str = "0123456789abcdef0123456789abcdef";
/// Good replies around this one in a recorded stream: a few, or enough for the
/// collect loop's verifier thread (it starts at the second full batch of 64).
const FEW: usize = 2;
const MANY: usize = 130;

/// A reply that decodes, signed: the rest of a batch.
fn good() -> &'static [u8] {
    static GOOD: OnceLock<Vec<u8>> = OnceLock::new();
    GOOD.get_or_init(|| reply(b"\x04\x08I\"\tpong\x06:\x06ET".to_vec()).encode(PSK).expect("a reply encodes"))
}

fn reply(body: Vec<u8>) -> Reply {
    Reply {
        senderid: "node1.example.com".into(),
        requestid: REQUEST.into(),
        senderagent: "rpcutil".into(),
        msgtime: AT,
        body: body.into(),
        signature: None,
    }
}

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Some((&mode, rest)) = input.split_first() else { return };
    // Tight limits now and then, so that the bounds are reached by both readers.
    let limits = if mode & 4 == 0 {
        DecodeLimits::default()
    } else {
        DecodeLimits { max_depth: 6, max_values: 300, max_bytes: 4000, ..DecodeLimits::default() }
    };
    same_values(rest, limits);
    let outer = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        reply(rest.to_vec()).encode(PSK).expect("a reply with fixed fields encodes")
    };
    let old = Reply::decode_verified_via_values(&outer, PSK, limits);
    match (&old, ReplyRef::decode_verified(&outer, PSK, limits)) {
        (Ok(old), Ok(new)) => assert_eq!(*old, new.to_owned()),
        (Err(_), Err(Unread::Error(_))) | (_, Err(Unread::Unsupported)) => {}
        (old, new) => panic!("marshal-rs {old:?}, in place {new:?}"),
    }
    // In a batch (AVX2 lanes from 4 replies; AVX-512 from 32, one input in 8: each
    // reply of a batch is decoded, and psk_lanes fuzzes the lanes), this reply first, last
    // and in the middle, between good ones, decodes as it does alone.
    let alone = Reply::decode_verified(&outer, PSK, limits);
    let size = if mode >> 3 & 7 == 7 { 33 } else { 5 };
    let ours = |i: usize| i == 0 || i == size / 2 || i == size - 1;
    let batch: Vec<Vec<u8>> = (0..size).map(|i| if ours(i) { outer.clone() } else { good().to_vec() }).collect();
    for (i, got) in decode_replies_verified(batch, PSK, limits).into_iter().enumerate() {
        match (ours(i), &got, &alone) {
            (true, Ok(got), Ok(alone)) => assert_eq!(got, alone),
            (true, Err(got), Err(alone)) => assert_eq!(got.to_string(), alone.to_string()),
            (true, got, alone) => panic!("in a batch {got:?}, alone {alone:?}"),
            (false, got, _) => assert!(got.is_ok(), "the good reply, in a batch: {got:?}"),
        }
    }
    collected(&outer, mode);
    let Ok(reply) = old else { return };
    if let Ok(inner) = reply.inner(limits) {
        std::hint::black_box(is_pong(&inner));
    }

    let body = InnerBody {
        sender: &reply.senderid,
        msgtime: reply.msgtime,
        bytes: &reply.body,
        limits,
        at: AT,
        main_collective: "mcollective",
    };
    let (mut in_place, mut two_passes) = (pool::builder(), pool::builder());
    let new = observation_from_body(body, &mut in_place);
    let old_way = observation_two_passes(body, &mut two_passes);
    match (&old_way, &new) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(BodyError::Inventory(a)), Err(BodyError::Inventory(b))) => assert_eq!(a, b),
        (Err(BodyError::Malformed(_)), Err(BodyError::Malformed(_)))
        | (Err(BodyError::Unsupported), Err(BodyError::Unsupported)) => {}
        (a, b) => panic!("two passes {a:?}, one pass {b:?}"),
    }
    if matches!((&old_way, &new), (Ok(_), Ok(_)) | (Err(BodyError::Inventory(_)), Err(BodyError::Inventory(_)))) {
        assert!(two_passes.store() == in_place.store(), "one pass and two, the same store, id for id");
    }
    let refreshed = Refreshed::of(&reply, limits);
    let Ok(rpc) = RpcReply::from_reply(reply, limits) else {
        assert!(matches!(new, Err(BodyError::Malformed(_) | BodyError::Unsupported)), "{new:?}");
        assert!(refreshed.observations.is_empty() && refreshed.malformed, "{refreshed:?}");
        return;
    };
    let mut builder = pool::builder();
    let old = observation(&rpc, AT, "mcollective", &mut builder);
    match (&old, &new) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(BodyError::Inventory(b))) => assert_eq!(a, b),
        (_, Err(BodyError::Unsupported)) => {}
        (old, new) => panic!("through values {old:?}, in place {new:?}"),
    }
    if !matches!(new, Err(BodyError::Unsupported)) {
        assert!(builder.store() == in_place.store(), "the same store, id for id");
    }
    // The refresh took the one pass, or the values where it is unsupported.
    match &old {
        Ok(o) => assert_eq!(refreshed.observations, std::slice::from_ref(o)),
        Err(_) => assert!(refreshed.observations.is_empty() && !refreshed.malformed, "{refreshed:?}"),
    }
    let Ok(o) = old else { return };
    // The facts went straight into the store: the same as the JSON they once became.
    let facts = rpc.data.get_sym("facts").expect("an observation has facts");
    assert_eq!(builder.store().view(o.facts).to_json(), to_json(facts));
});

/// Both Marshal readers refuse `bytes`, or give the same value.
fn same_values(bytes: &[u8], limits: DecodeLimits) {
    match (marshal::decode_with(bytes, limits), marshal_reader::decode_with(bytes, limits)) {
        // Debug text: a NaN is not equal to itself.
        (Ok(a), Ok(b)) => assert!(a == b || format!("{a:?}") == format!("{b:?}"), "{a:?} / {b:?}"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("marshal-rs {a:?}, borrowed reader {b:?}"),
    }
}

/// What a refresh made of the reply, the same twice (the second time from the memo).
#[derive(Debug)]
struct Refreshed {
    observations: Vec<Observation>,
    malformed: bool,
}

impl Refreshed {
    fn of(reply: &Reply, limits: DecodeLimits) -> Refreshed {
        let servers = vec![vec![(reply.clone(), AT)]];
        let mut builder = pool::builder();
        let (first, memo, reused) =
            observe_since(&servers, "mcollective", limits, 1, &mut builder, &ReplyMemo::default());
        assert_eq!(reused, 0);
        let (again, _, reused) = observe_since(&servers, "mcollective", limits, 1, &mut builder, &memo);
        assert_eq!(again.observations, first.observations, "from the memo");
        assert_eq!(reused, first.observations.len(), "an observation is given again, not decoded again");
        assert_eq!(first.accepted + first.malformed, 1);
        Refreshed { observations: first.observations, malformed: first.malformed == 1 }
    }
}

/// A client that reads recordings only (its broker is never connected to), with
/// client.cfg's defaults: a ttl of 60 s, no limit a few replies meet.
fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let broker = BrokerHost {
            host: "127.0.0.1".into(),
            port: 61613,
            user: String::new(),
            password: String::new(),
            tls: None,
        };
        let o =
            Overrides { no_config_file: true, psk: Some(PSK.into()), pool: Some(vec![broker]), ..Overrides::default() };
        Client::new(Config::resolve("", None, &o, None).expect("a client config"))
    })
}

/// Good replies to REQUEST, each from its own sender with its own body: their
/// MESSAGE frames, and each decoded alone.
fn goods() -> &'static [(Vec<u8>, Reply)] {
    static GOODS: OnceLock<Vec<(Vec<u8>, Reply)>> = OnceLock::new();
    GOODS.get_or_init(|| {
        (0..MANY)
            .map(|i| {
                let body = marshal::encode(&Value::str(format!("v{i}").as_str())).expect("a body");
                let outer =
                    Reply { senderid: format!("good{i:03}.example.com"), ..reply(body) }.encode(PSK).expect("a reply");
                let alone = Reply::decode_verified(&outer, PSK, DecodeLimits::default()).expect("a good reply");
                (message_frame(outer), alone)
            })
            .collect()
    })
}

fn message_frame(outer: Vec<u8>) -> Vec<u8> {
    let frame = Frame::new("MESSAGE")
        .header("destination", "/reply-queue/fuzz")
        .header("content-length", outer.len().to_string())
        .body(outer);
    stomp::encode(&frame, Version::V1_0).expect("a frame")
}

/// `outer` in a recorded stream among good replies (first, in the middle or last, by
/// `mode`; few or many), through the client's collect loop, sent at AT.
fn collected(outer: &[u8], mode: u8) {
    // Many (a thread, 131 replies decoded) for one input in about 64: it doubled the
    // target's time at one in 8.
    let many = mode >> 3 & 7 == 6 && outer.len().is_multiple_of(8);
    let goods = &goods()[..if many { MANY } else { FEW }];
    let at = match mode >> 6 {
        0 => 0,
        1 => goods.len() / 2,
        _ => goods.len(),
    };
    let mut stream: Vec<u8> = goods[..at].iter().flat_map(|(frame, _)| frame.iter().copied()).collect();
    stream.extend(message_frame(outer.to_vec()));
    stream.extend(goods[at..].iter().flat_map(|(frame, _)| frame.iter().copied()));
    let got = client().collect_recorded(&stream, REQUEST, "rpcutil", AT, None).expect("whole frames collect");
    let alone = Reply::decode_verified(outer, PSK, DecodeLimits::default()).ok();
    for kept in &got.replies {
        let good = goods.iter().find(|(_, good)| good.senderid == kept.senderid).map(|(_, good)| good);
        assert!(Some(kept) == alone.as_ref() || Some(kept) == good, "kept {kept:?}, alone {alone:?}");
    }
    let kept = |sender: &str| got.replies.iter().any(|r| r.senderid == sender);
    let ours = alone.as_ref().filter(|r| !goods.iter().any(|(_, good)| good.senderid == r.senderid));
    if alone.is_none() || ours.is_some() {
        assert!(goods.iter().all(|(_, good)| kept(&good.senderid)), "a good reply was dropped");
    }
    let ttl = 60;
    match ours {
        Some(r)
            if r.requestid == REQUEST && r.senderagent == "rpcutil" && (AT - ttl..=AT + ttl).contains(&r.msgtime) =>
        {
            assert!(got.replies.contains(r), "{r:?} passes every check")
        }
        Some(r) if r.requestid != REQUEST || r.senderagent != "rpcutil" || r.msgtime < AT - ttl => {
            assert!(!kept(&r.senderid), "{r:?} was kept")
        }
        _ => {}
    }
    if alone.is_none() {
        assert_eq!(got.replies.len(), goods.len(), "only the good replies");
    }
}
