//! An mcollective reply through the whole inventory path: outer Marshal and its
//! psk signature, inner Marshal, `rpcutil#inventory` status, then the observation
//! the index is built from. The first byte picks the layer the input replaces: the
//! raw outer stream (most fail the signature), or the inner body, signed here as a
//! daemon would so that the layers behind the signature are reached. The facts the
//! observation put in the store must be what `to_json` reads from the reply.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::mcollective::marshal::DecodeLimits;
use puppet_kicker::mcollective::message::Reply;
use puppet_kicker::mcollective::RpcReply;
use puppet_kicker::source::mcollective::{observation, to_json};
use puppet_kicker::store::Builder;

const PSK: &str = "fuzz";

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    let limits = DecodeLimits::default();
    let outer = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        let reply = Reply {
            senderid: "node1.example.com".into(),
            requestid: "0123456789abcdef0123456789abcdef".into(),
            senderagent: "rpcutil".into(),
            msgtime: 1_700_000_000,
            body: rest.to_vec(),
        };
        reply.encode(PSK).expect("a reply with fixed fields encodes")
    };
    let Ok(reply) = Reply::decode_verified(&outer, PSK, limits) else { return };
    let Ok(rpc) = RpcReply::from_reply(reply, limits) else { return };
    let mut builder = Builder::new();
    let Ok(o) = observation(&rpc, 1_700_000_000, "mcollective", &mut builder) else { return };
    // The facts went straight into the store: the same as the JSON they once became.
    let facts = rpc.data.get_sym("facts").expect("an observation has facts");
    assert_eq!(builder.store().view(o.facts).to_json(), to_json(facts));
});
