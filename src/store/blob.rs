//! Arrays of fixed-width integers as one MessagePack `bin` each (little-endian),
//! aligned in the file, so a mapped snapshot's arrays are read in place.

use serde::de::{Deserializer, Error, SeqAccess, Visitor};
use std::io::{self, Write};

/// Where a snapshot's bytes go: kept in memory, or, given a file, written to it
/// as they come (a blob straight from its array, smaller parts through a buffer
/// of [`Spool::BUFFER`] bytes), so that writing a snapshot never holds a second
/// copy of the index. Counts what it was given, for alignment. Writing to it
/// cannot fail: a file's first error is kept, further writes are dropped, and
/// [`Spool::finish`] returns it.
pub struct Spool<'f> {
    buffer: Vec<u8>,
    file: Option<&'f mut dyn Write>,
    written: usize,
    error: Option<io::Error>,
}

impl<'f> Spool<'f> {
    /// The most a spool writing to a file holds before it writes it out.
    pub const BUFFER: usize = 1 << 20;

    /// A spool that keeps everything in memory ([`Spool::into_bytes`]).
    pub fn in_memory(capacity: usize) -> Spool<'static> {
        Spool { buffer: Vec::with_capacity(capacity), file: None, written: 0, error: None }
    }

    /// A spool that writes to `file`.
    pub fn to(file: &'f mut dyn Write) -> Spool<'f> {
        Spool { buffer: Vec::with_capacity(Self::BUFFER), file: Some(file), written: 0, error: None }
    }

    /// Bytes given so far.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Appends `bytes`.
    pub fn put(&mut self, bytes: &[u8]) {
        self.written += bytes.len();
        if self.file.is_none() || self.buffer.len() + bytes.len() <= Self::BUFFER {
            self.buffer.extend_from_slice(bytes);
            return;
        }
        self.flush_buffer();
        if bytes.len() <= Self::BUFFER {
            self.buffer.extend_from_slice(bytes);
        } else {
            self.write_out(bytes);
        }
    }

    fn flush_buffer(&mut self) {
        let buffer = std::mem::take(&mut self.buffer);
        self.write_out(&buffer);
        self.buffer = buffer;
        self.buffer.clear();
    }

    fn write_out(&mut self, bytes: &[u8]) {
        if let (Some(file), None) = (self.file.as_mut(), self.error.as_ref()) {
            if let Err(e) = file.write_all(bytes) {
                self.error = Some(e);
            }
        }
    }

    /// Writes out what is buffered: the first error writing to the file, if any.
    pub fn finish(mut self) -> io::Result<usize> {
        self.flush_buffer();
        self.error.take().map_or(Ok(self.written), Err)
    }

    /// What an in-memory spool was given.
    pub fn into_bytes(self) -> Vec<u8> {
        debug_assert!(self.file.is_none(), "a spool writing to a file keeps nothing");
        self.buffer
    }
}

/// For the MessagePack encoders (rmp, rmp-serde): never fails (see [`Spool`]).
impl Write for Spool<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.put(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Integers stored as blobs.
///
/// # Safety
/// Every bit pattern of `WIDTH` bytes must be a valid value, `WIDTH` its size: a
/// [`super::Column`] reads the words of a mapped file in place.
pub unsafe trait Word: Copy + 'static {
    const WIDTH: usize;
    fn put(self, out: &mut Spool);
    fn get(bytes: &[u8]) -> Self;
}

// SAFETY: a plain integer; any bit pattern is one.
unsafe impl Word for u8 {
    const WIDTH: usize = 1;
    fn put(self, out: &mut Spool) {
        out.put(&[self])
    }
    fn get(bytes: &[u8]) -> u8 {
        bytes[0]
    }
}

// SAFETY: a plain integer; any bit pattern is one.
unsafe impl Word for u32 {
    const WIDTH: usize = 4;
    fn put(self, out: &mut Spool) {
        out.put(&self.to_le_bytes())
    }
    fn get(bytes: &[u8]) -> u32 {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

// SAFETY: a plain integer; any bit pattern is one.
unsafe impl Word for i64 {
    const WIDTH: usize = 8;
    fn put(self, out: &mut Spool) {
        out.put(&self.to_le_bytes())
    }
    fn get(bytes: &[u8]) -> i64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        i64::from_le_bytes(word)
    }
}

/// The bytes of `words`, little-endian, appended to `out`.
fn put_words<W: Word>(out: &mut Spool, words: &[W]) {
    if cfg!(target_endian = "little") {
        // SAFETY: a `Word` is a plain integer of `WIDTH` bytes (no padding), so its
        // memory is `len * WIDTH` initialized bytes, already little-endian here.
        let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) };
        out.put(bytes);
    } else {
        words.iter().for_each(|w| w.put(out));
    }
}

/// Where a blob's bytes start, counted from the spool's first byte (the file's).
pub const ALIGN: usize = 8;

/// Appends the map entry `key: bin(words)` so that the bytes start at a multiple of
/// [`ALIGN`] in `out`, after a padding entry `_pad_KEY: bin(0..8 bytes)` that
/// readers skip as an unknown field. Counts as two entries of the enclosing map.
pub fn write_entry<W: Word>(out: &mut Spool, key: &str, words: &[W]) {
    let byte_len = std::mem::size_of_val(words);
    let mut head = Vec::with_capacity(key.len() + 10);
    rmp::encode::write_str(&mut head, key).expect("writing to a Vec");
    rmp::encode::write_bin_len(&mut head, byte_len as u32).expect("writing to a Vec");
    let mut pad_key = Vec::with_capacity(key.len() + 10);
    rmp::encode::write_str(&mut pad_key, &format!("_pad_{key}")).expect("writing to a Vec");
    // The padding entry: its key, a bin8 header (2 bytes), then `pad` zero bytes.
    let before = out.written() + pad_key.len() + 2 + head.len();
    let pad = (ALIGN - before % ALIGN) % ALIGN;
    out.put(&pad_key);
    rmp::encode::write_bin_len(out, pad as u32).expect("a spool takes every write");
    out.put(&[0; ALIGN][..pad]);
    out.put(&head);
    debug_assert!(out.written().is_multiple_of(ALIGN));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A spool writing to a file gives it what an in-memory one keeps, in order,
    /// whatever the sizes: small parts through its buffer, parts larger than the
    /// buffer straight, and parts that just fill it or just overflow it.
    #[test]
    fn a_spool_to_a_file_writes_what_one_in_memory_keeps() {
        let sizes = [1, 7, Spool::BUFFER - 8, 8, 1, Spool::BUFFER, 3, Spool::BUFFER + 1, 0, 5, 3 * Spool::BUFFER];
        let parts: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect()).collect();
        let mut memory = Spool::in_memory(0);
        let mut file = Vec::new();
        let mut spool = Spool::to(&mut file);
        for part in &parts {
            memory.put(part);
            spool.put(part);
            assert_eq!(spool.written(), memory.written());
        }
        assert_eq!(spool.finish().unwrap(), parts.iter().map(Vec::len).sum::<usize>());
        assert!(file == memory.into_bytes(), "the same bytes");
        assert!(file == parts.concat());
    }
}
