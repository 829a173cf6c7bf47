//! STOMP frames from a broker, read by `FrameReader` as the client reads them: from a
//! socket whose reads are cut wherever the input says and that now and then has
//! nothing to give (a read timeout: `read_frame_if_ready` then returns, and
//! `read_frame_before` reads on), and from a recorded stream (`read_frame_or_end`).
//! However the stream is cut, the frames read are the same, and so is the error
//! that ends them. A CONNECTED frame's version is read as the client negotiates it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::mcollective::stomp::{negotiated_version, Frame, FrameReader, Limits, SocketTimeouts, Version};
use std::cell::Cell;
use std::io::{self, Read};
use std::time::{Duration, Instant};

/// At most this many frames from one input.
const FRAMES: usize = 64;

/// A socket: the i-th read gives at most `sizes[i]` bytes (cycling); a size of 0
/// is a read that times out with nothing (as a socket with a read timeout does).
struct Chunked<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    turn: Cell<usize>,
}

impl Chunked<'_> {
    fn size(&self) -> Option<usize> {
        self.sizes.get(self.turn.get() % self.sizes.len().max(1)).map(|&s| usize::from(s))
    }
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.size();
        self.turn.set(self.turn.get() + 1);
        if size == Some(0) && !self.data.is_empty() {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "nothing yet"));
        }
        let n = size.unwrap_or(usize::MAX).min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

impl SocketTimeouts for Chunked<'_> {
    fn set_read_timeout(&self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }

    fn set_write_timeout(&self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }

    /// Not when the next read would time out: that turn is then spent, as time passes.
    fn readable_now(&self) -> io::Result<bool> {
        if self.size() == Some(0) && !self.data.is_empty() {
            self.turn.set(self.turn.get() + 1);
            return Ok(false);
        }
        Ok(true)
    }
}

/// The frames read, and the error that ended them (`None`: the stream ended between frames).
type Outcome = (Vec<Frame>, Option<String>);

fn end(error: puppet_kicker::mcollective::Error) -> Option<String> {
    let text = error.to_string();
    // A recorded stream ends with `Ok(None)`, a socket with "closed by peer".
    (!text.ends_with("connection closed by peer")).then_some(text)
}

/// As the client's collecting thread reads: frames while they are ready, waiting
/// for more (`read_frame_before`) when none is.
fn from_socket(data: &[u8], sizes: &[u8], version: Version, limits: Limits) -> Outcome {
    let mut reader = FrameReader::new(Chunked { data, sizes, turn: Cell::new(0) }, limits);
    reader.set_version(version);
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut frames = Vec::new();
    // `read_frame_before` gives a frame or ends the stream (some size is not 0).
    for turn in 0..FRAMES * 2 + 2 {
        let got = if turn % 2 == 0 { reader.read_frame_if_ready(deadline) } else { reader.read_frame_before(deadline) };
        match got {
            Ok(Some(frame)) if frames.len() + 1 == FRAMES => {
                frames.push(frame);
                return (frames, None);
            }
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => {}
            Err(e) => return (frames, end(e)),
        }
    }
    panic!("the reader made no progress: {} frames, {} bytes", frames.len(), data.len());
}

/// As a recorded stream is read.
fn recorded(data: &[u8], version: Version, limits: Limits) -> Outcome {
    let mut reader = FrameReader::new(data, limits);
    reader.set_version(version);
    let mut frames = Vec::new();
    while frames.len() < FRAMES {
        match reader.read_frame_or_end() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => return (frames, None),
            Err(e) => return (frames, end(e)),
        }
    }
    (frames, None)
}

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    // [version][n][n chunk sizes][stream]
    let Some((&version, rest)) = input.split_first() else { return };
    let Some((&n, rest)) = rest.split_first() else { return };
    let (sizes, data) = rest.split_at((n as usize % 16).min(rest.len()));
    // Reads that all time out would never end: then the socket gives what it has.
    let sizes = if sizes.iter().all(|&s| s == 0) { &[][..] } else { sizes };
    let limits = Limits { max_header_bytes: 4096, max_headers: 32, max_body: 64 * 1024 };
    let version = [Version::V1_0, Version::V1_1, Version::V1_2][version as usize % 3];
    let (frames, error) = from_socket(data, sizes, version, limits);
    let whole = recorded(data, version, limits);
    assert_eq!((&frames, &error), (&whole.0, &whole.1), "cut by {sizes:?} and whole");
    for frame in frames.iter().filter(|f| f.command == "CONNECTED") {
        let _ = negotiated_version(frame, &[Version::V1_0, Version::V1_1, Version::V1_2]);
        let _ = negotiated_version(frame, &[Version::V1_1]);
    }
});
