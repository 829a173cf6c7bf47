//! Feeds N messages at a time to a kernel that hashes one block in each of N lanes:
//! a lane that finishes takes the next message (longest first, so that the lanes
//! run dry at about the same time), as ISA-L's md5_mb schedules its lanes.

use super::rounds::IV;
use std::cmp::Reverse;

/// What an idle lane hashes while the others finish; its result is thrown away.
static IDLE: [u8; 64] = [0; 64];

/// One lane's message: its whole blocks read in place, then its last one or more
/// blocks (the message's rest, the suffix, MD5's padding) from the lane's buffer.
struct Lane<'m> {
    message: Option<usize>,
    whole: &'m [u8],
    last: Vec<u8>,
    last_at: usize,
}

impl<'m> Lane<'m> {
    fn start(&mut self, message: Option<(usize, &'m [u8])>, suffix: &[u8]) {
        self.message = message.map(|(m, _)| m);
        let Some((_, bytes)) = message else { return };
        let (whole, rest) = bytes.split_at(bytes.len() - bytes.len() % 64);
        self.whole = whole;
        self.last.clear();
        self.last.extend_from_slice(rest);
        self.last.extend_from_slice(suffix);
        self.last.push(0x80);
        self.last.resize((self.last.len() + 8).next_multiple_of(64) - 8, 0);
        let bits = (bytes.len() as u64).wrapping_add(suffix.len() as u64).wrapping_mul(8);
        self.last.extend_from_slice(&bits.to_le_bytes());
        self.last_at = 0;
    }

    fn block(&self) -> &[u8; 64] {
        if self.message.is_none() {
            return &IDLE;
        }
        match self.whole.first_chunk() {
            Some(block) => block,
            None => self.last[self.last_at..].first_chunk().expect("the last blocks are whole blocks"),
        }
    }

    /// Past the block just hashed; whether that was the message's last.
    fn advance(&mut self) -> bool {
        match self.whole.split_first_chunk::<64>() {
            Some((_, rest)) => self.whole = rest,
            None => self.last_at += 64,
        }
        self.whole.is_empty() && self.last_at == self.last.len()
    }
}

/// The MD5 of each `message ‖ suffix`, in input order, `compress` hashing one block
/// in each of its N lanes (`state[k][lane]`: A, B, C, D of each lane).
pub(super) fn run<const N: usize>(
    messages: &[&[u8]],
    suffix: &[u8],
    mut compress: impl FnMut(&mut [[u32; N]; 4], &[&[u8; 64]; N]),
) -> Vec<[u8; 16]> {
    let mut digests = vec![[0; 16]; messages.len()];
    let mut order: Vec<usize> = (0..messages.len()).collect();
    order.sort_by_key(|&m| Reverse(messages[m].len()));
    let mut queue = order.into_iter().map(|m| (m, messages[m]));
    let mut state = [[0; N]; 4];
    let mut lanes: [Lane; N] =
        std::array::from_fn(|_| Lane { message: None, whole: &[], last: Vec::new(), last_at: 0 });
    for (i, lane) in lanes.iter_mut().enumerate() {
        lane.start(queue.next(), suffix);
        reset(&mut state, i);
    }
    while lanes.iter().any(|lane| lane.message.is_some()) {
        let blocks = std::array::from_fn(|i| lanes[i].block());
        compress(&mut state, &blocks);
        for (i, lane) in lanes.iter_mut().enumerate() {
            let Some(message) = lane.message else { continue };
            if lane.advance() {
                for (k, word) in state.iter().enumerate() {
                    digests[message][4 * k..4 * k + 4].copy_from_slice(&word[i].to_le_bytes());
                }
                lane.start(queue.next(), suffix);
                reset(&mut state, i);
            }
        }
    }
    digests
}

fn reset<const N: usize>(state: &mut [[u32; N]; 4], lane: usize) {
    for (word, iv) in state.iter_mut().zip(IV) {
        word[lane] = iv;
    }
}
