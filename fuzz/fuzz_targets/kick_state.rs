//! The kick planner's state (`kicks.msgpack` as found in the cache dir, or the row of
//! the shared state in PostgreSQL: the same bytes, the same decoder): decoded as the
//! kick service reads it, then given to a planner that plans from it, a round of
//! due kicks at a time; its role graph (edges and kick counts) read, grown and aged;
//! merged into a planner that holds unsaved changes (as after a full disk or an
//! outage of the shared state), which plans on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::kick::{decode_state, Planner};
use puppet_kicker::Config;
use std::path::Path;
use std::sync::OnceLock;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    static CONFIG: OnceLock<Config> = OnceLock::new();
    let config = CONFIG.get_or_init(|| Config::defaults(&puppet_kicker_fuzz::fleet_settings("")));
    let Ok(state) = decode_state(Path::new("kicks.msgpack"), input) else { return };
    let mut unsaved = Planner::new(config.kick.planner.clone(), state.clone());
    unsaved.merge_unsaved(state.clone());
    assert!(unsaved.state().outcomes.len() <= config.kick.planner.keep_outcomes);
    let (round, _) = unsaved.due_at_most(1_700_000_000_000, 2);
    assert!(round.len() <= 2);
    let _ = unsaved.due(1_700_000_000_000);
    let mut planner = Planner::new(config.kick.planner.clone(), state);
    std::hint::black_box((planner.undelivered(), planner.next_wakeup(), planner.state().counters));
    // The role graph as loaded (edges with their kick counts), then grown and aged.
    let mut graph = planner.state().graph.clone();
    std::hint::black_box(graph.counted_edges().count());
    graph.add("node", "haproxy", 1_700_000_000_000, 6);
    graph.age_out(1_600_000_000_000, 6);
    std::hint::black_box(graph.counted_edges().fold(0u64, |sum, (_, _, kicks)| sum.saturating_add(kicks)));
    let _ = planner.due(1_700_000_000_000);
    let _ = rmp_serde::to_vec_named(planner.state());
});
