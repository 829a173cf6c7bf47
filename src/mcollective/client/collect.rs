//! The collect loop: frames read until the replies expected are in or the deadline
//! passes; each reply kept only when it passes every check (signed, for this
//! request and agent, dated within the ttl, from an expected sender, not a
//! duplicate, within the limits), in arrival order, what is refused counted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::session::{error_text, Session};
use super::verify::Verifier;
use super::{bump, deadline_after, Client, Collected, Counters, RawOutcome};
use crate::mcollective::config::ReplyLimits;
use crate::mcollective::error::{Error, Result};
use crate::mcollective::message::Reply;
use crate::mcollective::stomp::{Frame, FrameReader};

/// Replies in hand are checked in batches of up to this many (a burst of
/// replies fills them; a trickle is checked one by one, as it arrives).
pub const VERIFY_BATCH: usize = 64;

/// What a collect kept so far.
#[derive(Default)]
pub(super) struct AcceptedReplies {
    replies: BTreeMap<String, Reply>,
    ambiguous: BTreeSet<String>,
    /// The senders of each body signature; bodies are compared in full when
    /// signatures agree, so a crafted MD5 collision makes nobody ambiguous.
    by_signature: HashMap<u128, Vec<String>>,
    bytes: usize,
}

impl AcceptedReplies {
    /// Keeps `reply` when it passes every check (each refusal counted); true once
    /// `expect.count` senders are kept.
    pub(super) fn accept(
        &mut self,
        reply: Result<Reply>,
        size: usize,
        expect: &Expect<'_>,
        counters: &Counters,
        limits: ReplyLimits,
    ) -> bool {
        let reply = match reply {
            Ok(r) => r,
            Err(Error::Signature(_)) => {
                bump(&counters.bad_hash);
                return false;
            }
            Err(_) => {
                bump(&counters.malformed);
                return false;
            }
        };
        if reply.requestid != expect.requestid {
            bump(&counters.foreign_requestid);
            return false;
        }
        if reply.senderagent != expect.agent {
            bump(&counters.malformed);
            return false;
        }
        let oldest = expect.sent.saturating_sub(expect.ttl);
        let newest = crate::time::now().max(expect.sent).saturating_add(expect.ttl);
        if !(oldest..=newest).contains(&reply.msgtime) {
            bump(&counters.bad_msgtime);
            return false;
        }
        if expect.only.is_some_and(|only| !only.contains(&reply.senderid)) {
            bump(&counters.unexpected_sender);
            return false;
        }
        if self.replies.contains_key(&reply.senderid) {
            bump(&counters.duplicate);
            return false;
        }
        if self.replies.len() >= limits.max_replies || self.bytes.saturating_add(size) > limits.max_bytes {
            bump(&counters.over_limit);
            return false;
        }
        self.bytes += size;
        self.note_body(&reply);
        self.replies.insert(reply.senderid.clone(), reply);
        expect.count.is_some_and(|n| self.replies.len() >= n)
    }

    /// Marks `reply`'s sender, and the first to send the same body, ambiguous.
    fn note_body(&mut self, reply: &Reply) {
        // Every verified reply carries its signature; the full compare below
        // decides either way.
        let senders = self.by_signature.entry(reply.signature.unwrap_or_default()).or_default();
        let twin = senders.iter().find(|s| self.replies.get(*s).is_some_and(|r| r.body == reply.body));
        if let Some(first) = twin {
            self.ambiguous.insert(first.clone());
            self.ambiguous.insert(reply.senderid.clone());
        }
        senders.push(reply.senderid.clone());
    }

    /// Senders kept so far.
    pub(super) fn len(&self) -> usize {
        self.replies.len()
    }

    fn collected(self) -> Collected {
        Collected { replies: self.replies, ambiguous: self.ambiguous }
    }
}

/// What the collector waits for.
pub(super) struct Expect<'a> {
    pub(super) requestid: &'a str,
    pub(super) agent: &'a str,
    /// The request's `:msgtime` and ttl: a reply's `:msgtime` must lie within
    /// `sent - ttl ..= now + ttl` (clocks may differ by up to the ttl, as
    /// daemons allow for requests).
    pub(super) sent: i64,
    pub(super) ttl: i64,
    /// Stop once this many distinct senders answered.
    pub(super) count: Option<usize>,
    /// Directed: only these senders are accepted.
    pub(super) only: Option<&'a [String]>,
    pub(super) deadline: Instant,
}

impl Client {
    /// Replies until `expect` is met or its deadline passes. Frames that arrive
    /// together are held (up to [`VERIFY_BATCH`]) and checked as one batch, their
    /// PSK signatures several at a time; what is held is checked before waiting on
    /// the broker, so a reply is never held back by a quiet connection.
    ///
    /// From the second full batch on, batches are decoded and their signatures
    /// checked on a second thread ([`Verifier`]) while this one reads the next
    /// frames: a fleet's burst of replies costs the receiving thread the reading
    /// only. Replies are still kept one by one here, in arrival order, each batch
    /// the answer it gets alone; and no frame is read past a batch that may meet
    /// `expect.count` before that batch has been kept, as without the thread.
    pub(super) fn collect(&self, session: &mut impl Frames, expect: &Expect<'_>) -> Result<Collected> {
        let mut kept = AcceptedReplies::default();
        if expect.count == Some(0) {
            return Ok(kept.collected());
        }
        std::thread::scope(|scope| {
            let mut verifier = Verifier::new(self, scope);
            let mut held: Vec<Vec<u8>> = Vec::with_capacity(VERIFY_BATCH);
            loop {
                // Batches under way that may meet the count are kept before any
                // further frame is read.
                if expect.count.is_some_and(|count| kept.len() + verifier.replies_in_flight() >= count)
                    && verifier.keep_all(&mut kept, expect)
                {
                    return Ok(kept.collected());
                }
                let frame = match session.frame_if_ready(expect.deadline)? {
                    Some(frame) => frame,
                    None => {
                        verifier.send(&mut held);
                        if verifier.keep_all(&mut kept, expect) {
                            return Ok(kept.collected());
                        }
                        match session.next_frame(expect.deadline)? {
                            Some(frame) => frame,
                            None => break,
                        }
                    }
                };
                match frame.command.as_str() {
                    "MESSAGE" => held.push(frame.body),
                    "ERROR" => {
                        // Replies that came before it may already meet the count, as
                        // when each was checked on arrival.
                        verifier.send(&mut held);
                        if verifier.keep_all(&mut kept, expect) {
                            return Ok(kept.collected());
                        }
                        return Err(Error::Broker { host: session.host().to_string(), message: error_text(&frame) });
                    }
                    _ => bump(&self.counters.other_frames),
                }
                if held.len() >= VERIFY_BATCH {
                    verifier.send(&mut held);
                    if verifier.keep_ready(&mut kept, expect) {
                        return Ok(kept.collected());
                    }
                }
            }
            verifier.send(&mut held);
            verifier.keep_all(&mut kept, expect);
            Ok(kept.collected())
        })
    }

    /// What [`Client::rpc_broadcast_raw`] keeps of the replies in `recorded` (STOMP
    /// frames as a broker delivered them) to request `requestid` for `agent`, sent
    /// at `sent`: the same collect loop, reading the recording in place of a
    /// broker; its end is the deadline. For benchmarks and recorded traffic.
    pub fn collect_recorded(
        &self,
        recorded: &[u8],
        requestid: &str,
        agent: &str,
        sent: i64,
        expected: Option<usize>,
    ) -> Result<RawOutcome> {
        let expect = Expect {
            requestid,
            agent,
            sent,
            ttl: i64::from(self.config.ttl),
            count: expected,
            only: None,
            deadline: deadline_after(Duration::from_secs(3600)),
        };
        let mut reader = FrameReader::new(recorded, self.config.stomp_limits);
        Ok(self.collect(&mut reader, &expect)?.into())
    }
}

/// Where [`Client::collect`] reads frames: a broker's session, or a recording.
pub(super) trait Frames {
    /// The next frame if it is already here, without waiting.
    fn frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>>;
    /// The next frame, or `None` once `deadline` has passed.
    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>>;
    /// Who sent the frames, for errors.
    fn host(&self) -> &str;
}

impl Frames for Session {
    fn frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        Session::frame_if_ready(self, deadline)
    }

    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        Session::next_frame(self, deadline)
    }

    fn host(&self) -> &str {
        &self.host
    }
}

/// A recording: every frame is here at once, and its end is the deadline.
impl Frames for FrameReader<&[u8]> {
    fn frame_if_ready(&mut self, _deadline: Instant) -> Result<Option<Frame>> {
        self.read_frame_or_end()
    }

    fn next_frame(&mut self, _deadline: Instant) -> Result<Option<Frame>> {
        self.read_frame_or_end()
    }

    fn host(&self) -> &str {
        "the recording"
    }
}
