//! Arrays of fixed-width integers as one MessagePack `bin` each (little-endian),
//! aligned in the file, so a mapped snapshot's arrays are read in place.

use serde::de::{Deserializer, Error, SeqAccess, Visitor};

/// Integers stored as blobs.
///
/// # Safety
/// Every bit pattern of `WIDTH` bytes must be a valid value, `WIDTH` its size: a
/// [`super::Column`] reads the words of a mapped file in place.
pub unsafe trait Word: Copy + 'static {
    const WIDTH: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

// SAFETY: a plain integer; any bit pattern is one.
unsafe impl Word for u8 {
    const WIDTH: usize = 1;
    fn put(self, out: &mut Vec<u8>) {
        out.push(self)
    }
    fn get(bytes: &[u8]) -> u8 {
        bytes[0]
    }
}

// SAFETY: a plain integer; any bit pattern is one.
unsafe impl Word for u32 {
    const WIDTH: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes())
    }
    fn get(bytes: &[u8]) -> u32 {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

// SAFETY: a plain integer; any bit pattern is one.
unsafe impl Word for i64 {
    const WIDTH: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes())
    }
    fn get(bytes: &[u8]) -> i64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        i64::from_le_bytes(word)
    }
}

/// The bytes of `words`, little-endian, appended to `out`.
fn put_words<W: Word>(out: &mut Vec<u8>, words: &[W]) {
    if cfg!(target_endian = "little") {
        // SAFETY: a `Word` is a plain integer of `WIDTH` bytes (no padding), so its
        // memory is `len * WIDTH` initialized bytes, already little-endian here.
        let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) };
        out.extend_from_slice(bytes);
    } else {
        out.reserve(words.len() * W::WIDTH);
        words.iter().for_each(|w| w.put(out));
    }
}

/// Where a blob's bytes start, counted from `out`'s first byte (the file's).
pub const ALIGN: usize = 8;

/// Appends the map entry `key: bin(words)` so that the bytes start at a multiple of
/// [`ALIGN`] in `out`, after a padding entry `_pad_KEY: bin(0..8 bytes)` that
/// readers skip as an unknown field. Counts as two entries of the enclosing map.
pub fn write_entry<W: Word>(out: &mut Vec<u8>, key: &str, words: &[W]) {
    let byte_len = std::mem::size_of_val(words);
    let mut head = Vec::with_capacity(key.len() + 10);
    rmp::encode::write_str(&mut head, key).expect("writing to a Vec");
    rmp::encode::write_bin_len(&mut head, byte_len as u32).expect("writing to a Vec");
    let mut pad_key = Vec::with_capacity(key.len() + 10);
    rmp::encode::write_str(&mut pad_key, &format!("_pad_{key}")).expect("writing to a Vec");
    // The padding entry: its key, a bin8 header (2 bytes), then `pad` zero bytes.
    let before = out.len() + pad_key.len() + 2 + head.len();
    let pad = (ALIGN - before % ALIGN) % ALIGN;
    out.extend_from_slice(&pad_key);
    rmp::encode::write_bin_len(out, pad as u32).expect("writing to a Vec");
    out.resize(out.len() + pad, 0);
    out.extend_from_slice(&head);
    debug_assert!(out.len().is_multiple_of(ALIGN));
    put_words(out, words);
}

/// A blob's bytes, borrowed from the decoder's input (see [`super::Column::from_blob`]).
#[derive(Clone, Copy)]
pub struct Blob<'a>(pub &'a [u8]);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Blob<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Blob<'a>, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Blob<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a blob of words")
            }
            fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Blob<'de>, E> {
                Ok(Blob(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Blob<'de>, A::Error> {
                Err(A::Error::custom("an array where a blob belongs"))
            }
        }
        d.deserialize_bytes(Bytes)
    }
}
