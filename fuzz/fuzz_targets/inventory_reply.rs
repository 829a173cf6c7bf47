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
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::mcollective::marshal::{self, DecodeLimits};
use puppet_kicker::mcollective::marshal_reader;
use puppet_kicker::mcollective::message::{Reply, ReplyRef, Unread};
use puppet_kicker::mcollective::RpcReply;
use puppet_kicker::source::mcollective::{
    observation, observation_from_body, observation_two_passes, to_json, BodyError, InnerBody,
};
use puppet_kicker::store::Builder;

const PSK: &str = "fuzz";

fuzz_target!(|input: &[u8]| {
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
        let reply = Reply {
            senderid: "node1.example.com".into(),
            requestid: "0123456789abcdef0123456789abcdef".into(),
            senderagent: "rpcutil".into(),
            msgtime: 1_700_000_000,
            body: rest.to_vec().into(),
            signature: None,
        };
        reply.encode(PSK).expect("a reply with fixed fields encodes")
    };
    let old = Reply::decode_verified_via_values(&outer, PSK, limits);
    match (&old, ReplyRef::decode_verified(&outer, PSK, limits)) {
        (Ok(old), Ok(new)) => assert_eq!(*old, new.to_owned()),
        (Err(_), Err(Unread::Error(_))) | (_, Err(Unread::Unsupported)) => {}
        (old, new) => panic!("marshal-rs {old:?}, in place {new:?}"),
    }
    let Ok(reply) = old else { return };

    let body = InnerBody {
        sender: &reply.senderid,
        msgtime: reply.msgtime,
        bytes: &reply.body,
        limits,
        at: 1_700_000_000,
        main_collective: "mcollective",
    };
    let mut in_place = Builder::new();
    let new = observation_from_body(body, &mut in_place);
    let mut two_passes = Builder::new();
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
    let Ok(rpc) = RpcReply::from_reply(reply, limits) else {
        assert!(matches!(new, Err(BodyError::Malformed(_) | BodyError::Unsupported)), "{new:?}");
        return;
    };
    let mut builder = Builder::new();
    let old = observation(&rpc, 1_700_000_000, "mcollective", &mut builder);
    match (&old, &new) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(BodyError::Inventory(b))) => assert_eq!(a, b),
        (_, Err(BodyError::Unsupported)) => {}
        (old, new) => panic!("through values {old:?}, in place {new:?}"),
    }
    if !matches!(new, Err(BodyError::Unsupported)) {
        assert!(builder.store() == in_place.store(), "the same store, id for id");
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
