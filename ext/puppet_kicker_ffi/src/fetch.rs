//! `pk_fetch`'s reply: servers, with every fact name and value they hold that the
//! caller does not hold yet, in one buffer a Ruby caller turns into objects with
//! Ruby's own (Java, under JRuby) methods and a short loop iteration per string,
//! Hash or Array, no parsing of text: strings are slices of one UTF-8 text by
//! length, the few other scalars (numbers, true, false, nil) one JSON array, and
//! each container is built from objects already built (`Hash[*table.values_at(..)]`).
//!
//! # The caller's table and the session
//!
//! A caller numbers the objects it builds from replies 0, 1, 2, ... in the order the
//! replies list them: its table. A [`Session`] remembers, for one index generation,
//! which store value or name has which number, so a value many servers share is
//! sent, and built, once per generation. A fetch names the number of objects the
//! caller holds (`have`): when that is not what the session sent (a reply the caller
//! could not read to the end) or the generation is another, the session starts over
//! from 0 and the reply's `base` says so.
//!
//! # Layout (native byte order: the caller is in this process)
//!
//! | Bytes | What |
//! | --- | --- |
//! | 0..8 | u64: the buffer's whole length |
//! | 8..44 | u32 × 9: status, base, strings, scalars, containers, servers, words, text bytes, JSON bytes |
//! | 44.. | `words` u32s, then `text bytes` of UTF-8, then `JSON bytes` |
//!
//! Status: [`OK`]; [`STALE`] (the index is no longer that generation, or a position
//! is not in it: select again); [`FAILED`] (the JSON is a reply `{"error":
//! {"kind", "message"}}`, as the JSON functions give).
//!
//! When OK, the objects numbered from `base` are: `strings` strings, the text cut
//! at the lengths the first `strings` words give; then `scalars` other scalars, the
//! JSON array; then `containers` containers, each in the words as `tag, n,` and `n`
//! numbers ([`ARRAY`]: its items) or `2n` numbers ([`OBJECT`]: name and value, in
//! order), referring only to lower numbers. The last `servers` words are the
//! numbers of the servers asked for, in order (a server is an OBJECT container:
//! its facts, then `certname` unless a fact has that name).

use puppet_kicker::api::{self, Entry, Failure, Server, ServersAt};
use puppet_kicker::store::{Kind, StrId, View};
use std::mem::ManuallyDrop;
use std::sync::{Mutex, MutexGuard};

pub const OK: u32 = 0;
pub const STALE: u32 = 1;
pub const FAILED: u32 = 2;

pub const ARRAY: u32 = 1;
pub const OBJECT: u32 = 2;

/// Where the words start.
pub const HEADER_BYTES: usize = 44;

/// Numbers are below this; until a reply is whole, a new object's number is its
/// rank among its kind's, marked with its kind in the two bits above.
const LIMIT: u32 = 1 << 30;
const STRING_RANK: u32 = 1 << 30;
const SCALAR_RANK: u32 = 2 << 30;
const CONTAINER_RANK: u32 = 3 << 30;

/// What one caller holds of one index generation: objects by store value or name.
/// Locked while a reply is encoded (a caller's threads may share a session).
#[derive(Default)]
pub struct Session(Mutex<Sent>);

#[derive(Default)]
struct Sent {
    generation: u64,
    numbers: Numbers,
    /// How many objects the caller holds when it read every reply.
    count: u32,
    /// The encoder's buffers, kept with their room from one reply to the next: a
    /// generation's first reply is megabytes, and growing them anew each time
    /// (realloc copying them) was a third of its cost.
    scratch: Scratch,
}

/// What an [`Encoder`] writes a reply's parts into (emptied as it starts).
#[derive(Default)]
struct Scratch {
    numbered: Vec<Held>,
    lengths: Vec<u32>,
    text: Vec<u8>,
    json: Vec<u8>,
    words: Vec<u32>,
    stack: Vec<u32>,
    servers: Vec<u32>,
}

impl Scratch {
    fn clear(&mut self) {
        let Scratch { numbered, lengths, text, json, words, stack, servers } = self;
        numbered.clear();
        lengths.clear();
        text.clear();
        json.clear();
        words.clear();
        stack.clear();
        servers.clear();
    }
}

/// Numbers by store id ([`NONE`] where none): a lookup per fact is an index, not a
/// hash (4 bytes per id of the store, at most, per session).
#[derive(Default)]
struct Numbers {
    values: Vec<u32>,
    names: Vec<u32>,
    certname_name: Option<u32>,
}

const NONE: u32 = u32::MAX;

/// A store value, a name, or the `certname` name.
#[derive(Clone, Copy)]
enum Held {
    Value(u32),
    Name(StrId),
    CertnameName,
}

impl Numbers {
    /// Holds nothing; keeps its room (a u32 per store value and name: megabytes on a
    /// large fleet, not allocated again each generation).
    fn clear(&mut self) {
        self.values.clear();
        self.names.clear();
        self.certname_name = None;
    }

    fn get(&self, held: Held) -> Option<u32> {
        let number = match held {
            Held::Value(id) => self.values.get(id as usize).copied(),
            Held::Name(id) => self.names.get(id as usize).copied(),
            Held::CertnameName => self.certname_name,
        };
        number.filter(|n| *n != NONE)
    }

    fn set(&mut self, held: Held, number: u32) {
        let (slots, id) = match held {
            Held::Value(id) => (&mut self.values, id as usize),
            Held::Name(id) => (&mut self.names, id as usize),
            Held::CertnameName => return self.certname_name = Some(number),
        };
        if id >= slots.len() {
            slots.resize(id + 1, NONE);
        }
        slots[id] = number;
    }
}

impl Session {
    /// The servers at `positions` of index `generation`, encoded for a caller that
    /// holds `have` objects of this session.
    pub fn fetch(&self, generation: u64, have: u64, positions: &[u32]) -> Reply {
        encode(&self.0, generation, have, positions.to_vec())
    }
}

/// Locks a session: a panic while encoding left numbers no reply gave, so a
/// poisoned one starts over.
fn lock(session: &Mutex<Sent>) -> MutexGuard<'_, Sent> {
    let sent = session.lock().unwrap_or_else(|poisoned| {
        let mut sent = poisoned.into_inner();
        *sent = Sent::default();
        sent
    });
    session.clear_poison();
    sent
}

/// Encodes the servers at `positions` of index `generation`, for a caller holding
/// `have` objects of `session`, in one reply. A stale generation or position is a
/// STALE reply; an error, a FAILED reply.
fn encode(session: &Mutex<Sent>, generation: u64, have: u64, positions: Vec<u32>) -> Reply {
    let servers = match api::servers_at(ServersAt { generation, positions }) {
        Ok(Some(servers)) => servers,
        Ok(None) => return finish(STALE, [0; 6], &[], &[], |word| word, b"", b""),
        Err(e) => return failed(Failure::from(e)),
    };
    let mut sent = lock(session);
    if sent.generation != generation || u64::from(sent.count) != have {
        sent.start(generation);
    }
    let servers: Vec<Server> = servers.iter().collect();
    match Encoder::new(&mut sent).encode(&servers) {
        Some(reply) => reply,
        None => {
            sent.start(generation);
            failed(Failure::internal("a reply past 2^30 objects or 4 GiB"))
        }
    }
}

impl Sent {
    /// Forgets what was sent, for `generation` (the buffers' room is kept).
    fn start(&mut self, generation: u64) {
        self.generation = generation;
        self.count = 0;
        self.numbers.clear();
    }
}

/// A reply: its bytes (the layout above), in a buffer that, once dropped, a later
/// reply reuses. A generation's first reply is megabytes: written into a new
/// allocation each time, every page of it was a page fault, and the faults and the
/// copy were nearly half of `pk_fetch`'s time. Buffers are kept for the whole
/// process, [`KEPT_AT_MOST`] bytes of them in all (several callers' replies may be
/// in use at once).
pub struct Reply {
    /// [`PREFIX`] bytes, then the reply.
    buffer: Vec<u8>,
}

/// Bytes before a reply's own, where [`Reply::into_raw`] keeps its buffer's length
/// and capacity for [`Reply::from_raw`].
const PREFIX: usize = 16;

/// The most bytes of buffers kept for later replies.
pub const KEPT_AT_MOST: usize = 64 << 20;

/// The buffers of replies dropped, empty, for the next ones.
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn spare() -> MutexGuard<'static, Vec<Vec<u8>>> {
    SPARE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Reply {
    /// An empty reply with room for `length` bytes: the kept buffer if there is one.
    fn with_room(length: usize) -> Reply {
        let mut buffer = spare().pop().unwrap_or_default();
        buffer.clear();
        buffer.reserve(PREFIX + length);
        buffer.resize(PREFIX, 0);
        Reply { buffer }
    }

    /// The reply's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buffer[PREFIX..]
    }

    /// The reply's first byte, for a C caller, who passes it to [`Reply::from_raw`]
    /// exactly once.
    pub fn into_raw(self) -> *mut u8 {
        let mut this = ManuallyDrop::new(self);
        let mut buffer = ManuallyDrop::new(std::mem::take(&mut this.buffer));
        let (length, capacity) = (buffer.len() as u64, buffer.capacity() as u64);
        let base = buffer.as_mut_ptr();
        // SAFETY: the buffer's first PREFIX bytes are its own (`with_room`).
        unsafe {
            base.cast::<u64>().write_unaligned(length);
            base.add(8).cast::<u64>().write_unaligned(capacity);
            base.add(PREFIX)
        }
    }

    /// The reply whose first byte [`Reply::into_raw`] gave.
    ///
    /// # Safety
    /// `reply` must be a pointer `into_raw` returned, not given back before.
    pub unsafe fn from_raw(reply: *mut u8) -> Reply {
        // SAFETY: `into_raw` wrote the buffer's length and capacity before the reply.
        unsafe {
            let base = reply.sub(PREFIX);
            let length = base.cast::<u64>().read_unaligned() as usize;
            let capacity = base.add(8).cast::<u64>().read_unaligned() as usize;
            Reply { buffer: Vec::from_raw_parts(base, length, capacity) }
        }
    }
}

/// Whether a dropped reply's buffer of `capacity` bytes is kept, with buffers of
/// `kept` bytes kept already.
fn kept(capacity: usize, kept: usize) -> bool {
    kept.checked_add(capacity).is_some_and(|all| all <= KEPT_AT_MOST)
}

impl Drop for Reply {
    fn drop(&mut self) {
        let mut spare = spare();
        if kept(self.buffer.capacity(), spare.iter().map(Vec::capacity).sum()) {
            spare.push(std::mem::take(&mut self.buffer));
        }
    }
}

/// A [`FAILED`] reply carrying `failure` as the JSON functions give it.
pub fn failed(failure: Failure) -> Reply {
    let json = serde_json::to_vec(&serde_json::json!({ "error": failure }))
        .unwrap_or_else(|_| br#"{"error":{"kind":"internal","message":"puppet-kicker internal error"}}"#.to_vec());
    finish(FAILED, [0; 6], &[], &[], |word| word, b"", &json)
}

/// The buffer: `counts` are base, strings, scalars, containers, servers and the
/// words' count; the words are `lengths`, then each part of `numbers` with
/// `settle` applied as it is copied (one pass over them, not two).
fn finish(
    status: u32,
    counts: [u32; 6],
    lengths: &[u32],
    numbers: &[&[u32]],
    settle: impl Fn(u32) -> u32,
    text: &[u8],
    json: &[u8],
) -> Reply {
    let word_count = lengths.len() + numbers.iter().map(|part| part.len()).sum::<usize>();
    let length = HEADER_BYTES + 4 * word_count + text.len() + json.len();
    let mut reply = Reply::with_room(length);
    let out = &mut reply.buffer;
    out.extend_from_slice(&(length as u64).to_ne_bytes());
    // The encoder keeps the text and the JSON under 4 GiB.
    for word in [status].iter().chain(&counts).chain(&[text.len() as u32, json.len() as u32]) {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    extend_words(out, lengths, |word| word);
    for part in numbers {
        extend_words(out, part, &settle);
    }
    out.extend_from_slice(text);
    out.extend_from_slice(json);
    reply
}

/// Appends `words`, each `map`ped, to `out` as native-endian bytes.
fn extend_words(out: &mut Vec<u8>, words: &[u32], map: impl Fn(u32) -> u32) {
    out.reserve(4 * words.len());
    let start = out.len();
    // SAFETY: the room was reserved; every byte up to the new length is written
    // before it is set (unaligned writes: the buffer is bytes).
    unsafe {
        let to = out.as_mut_ptr().add(start).cast::<[u8; 4]>();
        for (at, word) in words.iter().enumerate() {
            to.add(at).write_unaligned(map(*word).to_ne_bytes());
        }
        out.set_len(start + 4 * words.len());
    }
}

struct Encoder<'s> {
    /// The session's numbers; those this reply gives are provisional (kind and
    /// rank) until it is whole.
    numbers: &'s mut Numbers,
    count: &'s mut u32,
    /// Where the parts are written, the session's: what this reply numbered (to
    /// settle), the strings' lengths and text, the other scalars' JSON array, the
    /// containers' words, numbers waiting for their container (innermost last), the
    /// servers' numbers.
    parts: &'s mut Scratch,
    scalars: u32,
    containers: u32,
}

impl<'s> Encoder<'s> {
    fn new(sent: &'s mut Sent) -> Encoder<'s> {
        let Sent { numbers, count, scratch, .. } = sent;
        scratch.clear();
        scratch.json.push(b'[');
        Encoder { numbers, count, parts: scratch, scalars: 0, containers: 0 }
    }

    /// The reply; the session then holds its numbers and count.
    fn encode(mut self, servers: &[Server]) -> Option<Reply> {
        for server in servers {
            let base = self.parts.stack.len();
            for entry in server.entry_ids() {
                let pair = match entry {
                    Entry::Value(key, value) => [self.name(key, |key| server.name(key))?, self.value(value)?],
                    Entry::Certname(text) => {
                        [self.string(Some(Held::CertnameName), "certname")?, self.string(None, text)?]
                    }
                };
                self.parts.stack.extend(pair);
            }
            let number = self.container(OBJECT, base)?;
            self.parts.servers.push(number);
        }
        self.parts.json.push(b']');
        let base = *self.count;
        let strings = u32::try_from(self.parts.lengths.len()).ok()?;
        let first_scalar = base.checked_add(strings)?;
        let first_container = first_scalar.checked_add(self.scalars)?;
        let end = first_container.checked_add(self.containers)?;
        if end >= LIMIT
            || u32::try_from(self.parts.text.len()).is_err()
            || u32::try_from(self.parts.json.len()).is_err()
        {
            return None;
        }
        // Tags and counts are below LIMIT: only numbers carry a kind, in the top two
        // bits, which pick what their rank is added to (no branch: millions of words).
        let firsts = [0, base, first_scalar, first_container];
        let settle = |n: u32| firsts[(n >> 30) as usize] + (n & !CONTAINER_RANK);
        for held in &self.parts.numbered {
            let number = self.numbers.get(*held)?;
            self.numbers.set(*held, settle(number));
        }
        *self.count = end;
        let Scratch { lengths, words, servers: server_numbers, text, json, .. } = &*self.parts;
        let word_count = lengths.len() + words.len() + server_numbers.len();
        u32::try_from(word_count).ok()?;
        let counts = [base, strings, self.scalars, self.containers, servers.len() as u32, word_count as u32];
        Some(finish(OK, counts, lengths, &[words, server_numbers], settle, text, json))
    }

    fn held(&self, held: Held) -> Option<u32> {
        self.numbers.get(held)
    }

    /// Numbers `held` in this reply (provisionally).
    fn number(&mut self, held: Held, number: u32) -> u32 {
        self.numbers.set(held, number);
        self.parts.numbered.push(held);
        number
    }

    /// A name's number: held, or numbered now (its text looked up only then).
    fn name<'t>(&mut self, id: StrId, text: impl FnOnce(StrId) -> &'t str) -> Option<u32> {
        match self.held(Held::Name(id)) {
            Some(number) => Some(number),
            None => self.string(Some(Held::Name(id)), text(id)),
        }
    }

    /// A store value's number: held, or numbered now, its children first (nesting
    /// is bounded by the store: 64 levels).
    fn value(&mut self, value: View) -> Option<u32> {
        let key = Held::Value(value.id());
        if let Some(number) = self.held(key) {
            return Some(number);
        }
        let base = self.parts.stack.len();
        let tag = match value.kind() {
            Kind::Array(items) => {
                for item in items.iter() {
                    let number = self.value(item)?;
                    self.parts.stack.push(number);
                }
                ARRAY
            }
            Kind::Object(object) => {
                for (name, item) in object.ids() {
                    let pair = [self.name(name, |name| value.store().str(name))?, self.value(item)?];
                    self.parts.stack.extend(pair);
                }
                OBJECT
            }
            Kind::Str(text) => return self.string(Some(key), text),
            _ => {
                let rank = self.scalars;
                if rank > 0 {
                    self.parts.json.push(b',');
                }
                serde_json::to_writer(&mut self.parts.json, &value).ok()?;
                self.scalars = rank.checked_add(1).filter(|n| *n < LIMIT)?;
                return Some(self.number(key, SCALAR_RANK | rank));
            }
        };
        let number = self.container(tag, base)?;
        Some(self.number(key, number))
    }

    /// A container of the numbers on the stack from `base`, which it pops.
    fn container(&mut self, tag: u32, base: usize) -> Option<u32> {
        let items = &self.parts.stack[base..];
        let n = if tag == OBJECT { items.len() / 2 } else { items.len() };
        self.parts.words.extend([tag, u32::try_from(n).ok().filter(|n| *n < LIMIT)?]);
        self.parts.words.extend_from_slice(items);
        self.parts.stack.truncate(base);
        let rank = self.containers;
        self.containers = rank.checked_add(1).filter(|c| *c < LIMIT)?;
        Some(CONTAINER_RANK | rank)
    }

    /// The number of a string held under `key`, or numbered now (a string with no
    /// key, a certname, is always numbered anew).
    fn string(&mut self, key: Option<Held>, text: &str) -> Option<u32> {
        if let Some(number) = key.and_then(|key| self.held(key)) {
            return Some(number);
        }
        let rank = u32::try_from(self.parts.lengths.len()).ok().filter(|n| *n < LIMIT)?;
        self.parts.lengths.push(u32::try_from(text.len()).ok()?);
        self.parts.text.extend_from_slice(text.as_bytes());
        Some(match key {
            Some(key) => self.number(key, STRING_RANK | rank),
            None => STRING_RANK | rank,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(bytes: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
    }

    /// A reply keeps its bytes through a C caller (`into_raw`, `from_raw`), its
    /// numbers settled and its lengths not; a reply written into a larger kept
    /// buffer is exactly its own length; buffers are kept up to the limit.
    #[test]
    fn a_reply_is_its_own_bytes_through_a_c_caller_in_a_kept_buffer() {
        let settle = |n: u32| if n & CONTAINER_RANK == STRING_RANK { 10 + (n & !CONTAINER_RANK) } else { n };
        let reply = finish(
            OK,
            [10, 2, 0, 1, 1, 5],
            &[STRING_RANK | 1, 1],
            &[&[ARRAY, 1, STRING_RANK | 1], &[11]],
            settle,
            b"abc",
            b"[]",
        );
        let bytes = reply.bytes().to_vec();
        assert_eq!(u64::from_ne_bytes(bytes[..8].try_into().unwrap()) as usize, bytes.len());
        assert_eq!(bytes.len(), HEADER_BYTES + 4 * 6 + 3 + 2);
        let words: Vec<u32> = (0..6).map(|i| u32_at(&bytes, HEADER_BYTES + 4 * i)).collect();
        assert_eq!(words, [STRING_RANK | 1, 1, ARRAY, 1, 11, 11], "lengths as they are, numbers settled");
        assert_eq!(&bytes[HEADER_BYTES + 24..], b"abc[]");

        let back = unsafe { Reply::from_raw(reply.into_raw()) };
        assert_eq!(back.bytes(), &bytes[..]);
        drop(back);
        // A smaller reply, perhaps in that buffer: its own length, its own bytes.
        let stale = finish(STALE, [0; 6], &[], &[], |n| n, b"", b"");
        let stale = stale.bytes();
        assert_eq!(stale.len(), HEADER_BYTES);
        assert_eq!((u64::from_ne_bytes(stale[..8].try_into().unwrap()), u32_at(stale, 8)), (44, STALE));

        assert!(kept(KEPT_AT_MOST, 0));
        assert!(kept(KEPT_AT_MOST - 10, 10));
        assert!(!kept(KEPT_AT_MOST - 10, 11));
        assert!(!kept(KEPT_AT_MOST + 1, 0));
        assert!(!kept(usize::MAX, 1));
    }
}
