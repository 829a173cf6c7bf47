//! Where [`Client`]'s collect loop has its batches of replies decoded and their
//! PSK signatures checked, several at a time: on the collecting thread for the
//! first batches, then on a thread of its own (started at the second full batch),
//! which gives each batch back in the order sent.

use super::collect::{AcceptedReplies, Expect, VERIFY_BATCH};
use super::Client;
use crate::mcollective::error::Result;
use crate::mcollective::message::{self, Reply};

/// Where [`Client::collect`]'s batches are decoded and verified
/// ([`message::decode_replies_verified`]): on the collecting thread for the first,
/// then on a thread of its own, started at the second full batch (a collect of a
/// few replies starts none), which gives each batch back in the order sent.
pub(super) struct Verifier<'scope, 'env> {
    client: &'env Client,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    worker: Option<VerifyWorker>,
    /// Batches decoded on this thread, not kept yet.
    ready: std::collections::VecDeque<Decoded>,
    /// Batches sent to the worker and not yet back, and their replies.
    in_flight: usize,
    replies_in_flight: usize,
    /// Full batches seen, to start the worker at the second.
    full_batches: usize,
}

struct VerifyWorker {
    batches: crossbeam_channel::Sender<Vec<Vec<u8>>>,
    decoded: crossbeam_channel::Receiver<Decoded>,
}

/// A batch's replies, decoded and verified, with each one's size.
type Decoded = Vec<(Result<Reply>, usize)>;

impl<'scope, 'env> Verifier<'scope, 'env> {
    pub(super) fn new(client: &'env Client, scope: &'scope std::thread::Scope<'scope, 'env>) -> Self {
        Verifier {
            client,
            scope,
            worker: None,
            ready: std::collections::VecDeque::new(),
            in_flight: 0,
            replies_in_flight: 0,
            full_batches: 0,
        }
    }

    /// Replies sent and not kept yet.
    pub(super) fn replies_in_flight(&self) -> usize {
        self.replies_in_flight
    }

    fn decode(client: &Client, outers: Vec<Vec<u8>>) -> Decoded {
        let sizes: Vec<usize> = outers.iter().map(Vec::len).collect();
        let decoded = message::decode_replies_verified(outers, &client.config.psk, client.config.marshal_limits);
        decoded.into_iter().zip(sizes).collect()
    }

    /// Hands over what is held (emptying it), to be decoded and verified.
    pub(super) fn send(&mut self, held: &mut Vec<Vec<u8>>) {
        if held.is_empty() {
            return;
        }
        let outers = std::mem::replace(held, Vec::with_capacity(VERIFY_BATCH));
        self.replies_in_flight += outers.len();
        if outers.len() >= VERIFY_BATCH {
            self.full_batches += 1;
        }
        if self.worker.is_none() && self.full_batches >= 2 {
            self.worker = self.start_worker();
        }
        let unsent = match &self.worker {
            Some(worker) => worker.batches.send(outers).err().map(|unsent| unsent.into_inner()),
            None => Some(outers),
        };
        match unsent {
            None => self.in_flight += 1,
            Some(outers) => self.ready.push_back(Self::decode(self.client, outers)),
        }
    }

    /// A thread decoding batches in order; None if it cannot be started (the
    /// batches are then decoded here).
    fn start_worker(&self) -> Option<VerifyWorker> {
        // Unbounded: what waits in them is replies already received, and neither
        // side may block on the other (the collecting thread takes what is decoded
        // only between frames).
        let (batches, to_decode) = crossbeam_channel::unbounded::<Vec<Vec<u8>>>();
        let (done, decoded) = crossbeam_channel::unbounded::<Decoded>();
        let client = self.client;
        std::thread::Builder::new()
            .name("puppet-kicker-verify".into())
            .spawn_scoped(self.scope, move || {
                for outers in to_decode {
                    if done.send(Self::decode(client, outers)).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(VerifyWorker { batches, decoded })
    }

    /// Keeps the batches already decoded, in order, without waiting; true once the
    /// count is met.
    pub(super) fn keep_ready(&mut self, kept: &mut AcceptedReplies, expect: &Expect<'_>) -> bool {
        self.keep(kept, expect, false)
    }

    /// Keeps every batch sent, in order, waiting for those under way; true once the
    /// count is met (the rest is then dropped, as replies after the last expected).
    pub(super) fn keep_all(&mut self, kept: &mut AcceptedReplies, expect: &Expect<'_>) -> bool {
        self.keep(kept, expect, true)
    }

    fn keep(&mut self, kept: &mut AcceptedReplies, expect: &Expect<'_>, wait: bool) -> bool {
        loop {
            // Decoded here only before the worker started: all of them come first.
            let batch = match self.ready.pop_front() {
                Some(batch) => batch,
                None if self.in_flight == 0 => return false,
                None => {
                    let worker = self.worker.as_ref().expect("batches in flight have a worker");
                    let next = if wait { worker.decoded.recv().ok() } else { worker.decoded.try_recv().ok() };
                    match next {
                        Some(batch) => {
                            self.in_flight -= 1;
                            batch
                        }
                        None if wait => {
                            // The worker is gone (it panicked): its batches are lost.
                            (self.in_flight, self.replies_in_flight) = (0, 0);
                            return false;
                        }
                        None => return false,
                    }
                }
            };
            self.replies_in_flight -= batch.len();
            let client = self.client;
            for (reply, size) in batch {
                if kept.accept(reply, size, expect, &client.counters, client.config.reply_limits) {
                    return true;
                }
            }
        }
    }
}
