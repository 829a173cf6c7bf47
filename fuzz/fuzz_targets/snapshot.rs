//! The index snapshot (`index.msgpack`) as found in the cache dir, decoded as
//! `snapshot::read` decodes a file's content (blobs aligned in the buffer are read in
//! place, others copied); what decodes is then read as a query would: every server,
//! every value, and a query over a dotted path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::{snapshot, Freshness, Query};
use std::path::Path;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Ok(snap) = snapshot::decode(input.to_vec(), Path::new("index.msgpack"), "role") else { return };
    let index = &snap.index;
    for server in index.servers() {
        std::hint::black_box(serde_json::to_vec(&server.facts().iter().collect::<Vec<_>>()).ok());
        std::hint::black_box(server.entries().count());
    }
    let query = Query::parse(&["os.release.full>=1", "role=/./"]).expect("a valid query");
    let fresh = Freshness { now: 0, max_age: u64::MAX / 2 };
    std::hint::black_box(index.with_facts(&query, "production", fresh));
});
