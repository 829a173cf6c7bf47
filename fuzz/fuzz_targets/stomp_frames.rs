//! STOMP frames from a broker, read by `FrameReader` through reads cut wherever the
//! input says (a byte stream arrives in arbitrary pieces).
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::mcollective::stomp::{FrameReader, Limits, Version};
use std::io::Read;

/// Gives at most `sizes[i]` bytes to the i-th read, cycling.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    turn: usize,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes.get(self.turn % self.sizes.len().max(1)).map_or(usize::MAX, |s| *s as usize + 1);
        self.turn += 1;
        let n = size.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|input: &[u8]| {
    // [version][n][n chunk sizes][stream]
    let Some((&version, rest)) = input.split_first() else { return };
    let Some((&n, rest)) = rest.split_first() else { return };
    let (sizes, data) = rest.split_at((n as usize % 16).min(rest.len()));
    let limits = Limits { max_header_bytes: 4096, max_headers: 32, max_body: 64 * 1024 };
    let mut reader = FrameReader::new(Chunked { data, sizes, turn: 0 }, limits);
    reader.set_version([Version::V1_0, Version::V1_1, Version::V1_2][version as usize % 3]);
    for _ in 0..64 {
        if reader.read_frame().is_err() {
            break;
        }
    }
});
