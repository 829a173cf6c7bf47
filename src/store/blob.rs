//! Arrays of fixed-width integers as one MessagePack `bin` each (little-endian), so
//! a snapshot is read with a few bulk copies instead of one decode per element.

use serde::de::{Deserializer, Error, SeqAccess, Visitor};
use serde::Serializer;

/// Integers stored as blobs.
pub trait Word: Copy {
    const WIDTH: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

impl Word for u8 {
    const WIDTH: usize = 1;
    fn put(self, out: &mut Vec<u8>) {
        out.push(self)
    }
    fn get(bytes: &[u8]) -> u8 {
        bytes[0]
    }
}

impl Word for u32 {
    const WIDTH: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes())
    }
    fn get(bytes: &[u8]) -> u32 {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl Word for i64 {
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

pub fn serialize<W: Word, S: Serializer>(words: &[W], s: S) -> Result<S::Ok, S::Error> {
    let mut bytes = Vec::with_capacity(words.len() * W::WIDTH);
    for w in words {
        w.put(&mut bytes);
    }
    s.serialize_bytes(&bytes)
}

pub fn deserialize<'de, W: Word, D: Deserializer<'de>>(d: D) -> Result<Vec<W>, D::Error> {
    struct Blob<W>(std::marker::PhantomData<W>);
    impl<W: Word> Blob<W> {
        fn words<E: Error>(bytes: &[u8]) -> Result<Vec<W>, E> {
            if !bytes.len().is_multiple_of(W::WIDTH) {
                return Err(E::custom(format!(
                    "a blob of {} bytes is not a whole number of {}-byte words",
                    bytes.len(),
                    W::WIDTH
                )));
            }
            Ok(bytes.chunks_exact(W::WIDTH).map(W::get).collect())
        }
    }
    impl<'de, W: Word> Visitor<'de> for Blob<W> {
        type Value = Vec<W>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a blob of {}-byte words", W::WIDTH)
        }
        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<W>, E> {
            Self::words(v)
        }
        fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Vec<W>, E> {
            Self::words(v)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Vec<W>, A::Error> {
            Err(A::Error::custom("an array where a blob belongs"))
        }
    }
    d.deserialize_bytes(Blob(std::marker::PhantomData))
}
