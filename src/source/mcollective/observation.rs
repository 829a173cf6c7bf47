//! The servers' observations from their replies: decoded on up to
//! [`DECODE_THREADS`] threads into one store, id for id what one thread gives, and
//! the memo of each server's last reply body, so that a body unchanged since the
//! last refresh gives its observation again without being decoded.

use super::{observation, observation_from_body, BodyError, InnerBody};
use crate::mcollective::message::Reply;
use crate::mcollective::{self as mco, RpcReply};
use crate::source::Observation;
use crate::store::Builder;
use std::collections::HashMap;

/// Threads decoding inventories: two halves of the servers, merged in order (the
/// masters have few cores, shared with compiles).
pub const DECODE_THREADS: usize = 2;
/// Below this many servers one thread decodes them all: a thread costs more.
const MIN_SERVERS_PER_THREAD: usize = 256;
/// Servers per share of the decoding on several threads.
const SHARE_SERVERS: usize = 256;

/// Each server's last inventory body (by its verified PSK signature, else a fast
/// hash of its bytes) and what it gave, for [`observe_since`]: an identical body
/// gives the identical observation, so it is not decoded again.
#[derive(Clone, Debug, Default)]
pub struct ReplyMemo {
    /// Seeded per process, kept across refreshes so hashes compare.
    pub(super) hasher: hashbrown::DefaultHashBuilder,
    servers: HashMap<String, (BodyKey, Observation)>,
    /// Values in the store after the last refresh that decoded every server.
    pub(super) values_after_full: usize,
}

/// What tells a body from another: its signature, which the client checked anyway
/// (reading 139 MB of bodies again to hash them was most of a refresh with nothing
/// changed), or, for a reply without one, a hash of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyKey {
    Signed(u128),
    Hashed(u64),
}

impl ReplyMemo {
    /// No server remembered, but the same hasher (a full decode's fresh memo).
    pub(super) fn forget_servers(self) -> ReplyMemo {
        ReplyMemo { hasher: self.hasher, ..ReplyMemo::default() }
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

/// [`observe_replies`] into a builder resumed on the store of the refresh that left
/// `memo` (its ids still valid there): a server whose chosen reply has the body it
/// had then gets its observation again, dated by the new reply, without decoding.
/// Returns the memo for the next refresh, and how many servers were given again.
pub fn observe_since(
    servers: &[Vec<(Reply, i64)>],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    threads: usize,
    builder: &mut Builder,
    memo: &ReplyMemo,
) -> (Observed, ReplyMemo, usize) {
    use std::hash::BuildHasher;
    let hasher = memo.hasher;
    // Per server: its newest body's hash, and its observation when that body is unchanged.
    let mut again: Vec<(BodyKey, Option<Observation>)> = Vec::with_capacity(servers.len());
    let mut changed: Vec<&[(Reply, i64)]> = Vec::new();
    for replies in servers {
        let Some((reply, at)) = replies.first() else {
            again.push((BodyKey::Hashed(0), None));
            continue;
        };
        let hash = match reply.signature {
            Some(signature) => BodyKey::Signed(signature),
            None => BodyKey::Hashed(hasher.hash_one(&*reply.body)),
        };
        let hit = memo.servers.get(&reply.senderid).filter(|(last, _)| *last == hash).map(|(_, o)| Observation {
            timestamp: if reply.msgtime > 0 { reply.msgtime.min(*at) } else { *at },
            answered_at: Some(*at),
            ..o.clone()
        });
        if hit.is_none() {
            changed.push(replies);
        }
        again.push((hash, hit));
    }
    let reused = again.iter().filter(|(_, o)| o.is_some()).count();
    let decoded = observe_slices(&changed, main_collective, limits, threads, builder);
    let mut decoded_observations = decoded.observations.into_iter().zip(decoded.chosen).peekable();
    let mut next =
        ReplyMemo { hasher, servers: HashMap::with_capacity(servers.len()), values_after_full: memo.values_after_full };
    let (mut observations, mut chosen) = (Vec::with_capacity(servers.len()), Vec::with_capacity(servers.len()));
    for (replies, (hash, hit)) in servers.iter().zip(again) {
        let Some((newest, _)) = replies.first() else { continue };
        let (o, candidate) = match hit {
            Some(o) => (o, 0),
            None => match decoded_observations.next_if(|(o, _)| o.certname == newest.senderid) {
                Some(decoded) => decoded,
                None => continue,
            },
        };
        // Only an observation of the newest reply stands for its body next time.
        if candidate == 0 {
            next.servers.insert(o.certname.clone(), (hash, o.clone()));
        }
        observations.push(o);
        chosen.push(candidate);
    }
    let observed = Observed {
        observations,
        chosen,
        warnings: decoded.warnings,
        accepted: decoded.accepted + reused,
        malformed: decoded.malformed,
    };
    (observed, next, reused)
}

/// What [`observe_replies`] made of the servers' replies.
#[derive(Debug, Default)]
pub struct Observed {
    /// In the order of the servers given.
    pub observations: Vec<Observation>,
    /// For each observation, which of its server's replies it came from (0: the newest).
    pub chosen: Vec<usize>,
    pub warnings: Vec<String>,
    /// Inner bodies read as RPC replies, and those that were not.
    pub accepted: usize,
    pub malformed: usize,
}

/// Each server's observation from its replies (newest first: the first well-formed
/// one counts, as when malformed ones were dropped before choosing), its facts in
/// `builder`. Up to `threads` threads (at most the cores) decode contiguous shares
/// into builders of their own, merged in order by [`Builder::absorb`]: the store is
/// the same, id for id, whatever the number of threads.
pub fn observe_replies(
    servers: &[Vec<(Reply, i64)>],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    threads: usize,
    builder: &mut Builder,
) -> Observed {
    let servers: Vec<&[(Reply, i64)]> = servers.iter().map(Vec::as_slice).collect();
    observe_slices(&servers, main_collective, limits, threads, builder)
}

fn observe_slices(
    servers: &[&[(Reply, i64)]],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    threads: usize,
    builder: &mut Builder,
) -> Observed {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = threads.min(cores).min(servers.len() / MIN_SERVERS_PER_THREAD).max(1);
    if threads == 1 {
        return observe_share(servers, main_collective, limits, builder);
    }
    // Shares handed out in order and merged while the other thread reads
    // (store::pool), as fact files are: the merge is off the critical path.
    let shares: Vec<&[&[(Reply, i64)]]> = servers.chunks(SHARE_SERVERS).collect();
    let read = |i: usize, own: &mut Builder| observe_share(shares[i], main_collective, limits, own);
    let remap = |observed: &mut Observed, remap: &crate::store::Remap| {
        for o in &mut observed.observations {
            o.facts = remap.values[o.facts as usize];
            o.extra = remap.values[o.extra as usize];
        }
    };
    let target = std::mem::take(builder);
    // A panic fails the refresh, as it did on one thread.
    let (target, results) = crate::store::pool::read_in_order(target, shares.len(), threads, read, remap)
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    *builder = target;
    let mut all = Observed::default();
    for observed in results {
        all.chosen.extend(observed.chosen);
        all.observations.extend(observed.observations);
        all.warnings.extend(observed.warnings);
        all.accepted += observed.accepted;
        all.malformed += observed.malformed;
    }
    all
}

fn observe_share(
    servers: &[&[(Reply, i64)]],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    builder: &mut Builder,
) -> Observed {
    let mut out = Observed::default();
    for replies in servers {
        for (candidate, (reply, at)) in replies.iter().enumerate() {
            let body = InnerBody {
                sender: &reply.senderid,
                msgtime: reply.msgtime,
                bytes: &reply.body,
                limits,
                at: *at,
                main_collective,
            };
            let got = observation_from_body(body, builder);
            let got = match got {
                Err(BodyError::Unsupported) => match RpcReply::from_reply(reply.clone(), limits) {
                    Ok(rpc) => observation(&rpc, *at, main_collective, builder).map_err(BodyError::Inventory),
                    Err(e) => Err(BodyError::Malformed(e)),
                },
                other => other,
            };
            match got {
                Ok(o) => {
                    out.observations.push(o);
                    out.chosen.push(candidate);
                }
                Err(BodyError::Malformed(_) | BodyError::Unsupported) => {
                    out.malformed += 1;
                    continue;
                }
                Err(BodyError::Inventory(why)) => {
                    out.warnings.push(format!("mcollective: ignored the inventory of {}: {why}", reply.senderid));
                }
            }
            out.accepted += 1;
            break;
        }
    }
    out
}
