//! STOMP 1.0/1.1/1.2 frame codec.
//!
//! Hand-written because the STOMP crates are async and/or 1.2-only, and the
//! mcollective wire needs exact header control (order, `content-length` on
//! bodies that contain NUL bytes, 1.0 without escaping). The reader is
//! incremental: a socket read timeout in the middle of a frame loses nothing,
//! so the client can poll a deadline with short read timeouts. Every size is
//! bounded by [`Limits`]; bad input is an [`Error`], never a panic, and memory
//! grows only as bytes actually arrive (a declared `content-length` is checked
//! against the limit but never pre-allocated).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::error::{Error, Result};

/// A STOMP protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V1_0,
    V1_1,
    V1_2,
}

impl Version {
    /// The version as written in `accept-version` / `version` headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }

    /// Parses "1.0", "1.1" or "1.2".
    pub fn parse(s: &str) -> Option<Version> {
        match s.trim() {
            "1.0" => Some(Version::V1_0),
            "1.1" => Some(Version::V1_1),
            "1.2" => Some(Version::V1_2),
            _ => None,
        }
    }

    /// 1.1 and 1.2 escape header octets; 1.0 has no escaping at all.
    fn escapes(self) -> bool {
        self >= Version::V1_1
    }
}

/// The `accept-version` value for a CONNECT offering `versions`.
pub fn accept_version(versions: &[Version]) -> String {
    let mut v: Vec<Version> = versions.to_vec();
    v.sort();
    v.dedup();
    v.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(",")
}

/// The version a CONNECTED frame settled on. No `version` header means 1.0
/// (a 1.0 broker ignores `accept-version`); a version we did not offer is an error.
pub fn negotiated_version(connected: &Frame, offered: &[Version]) -> Result<Version> {
    let Some(raw) = connected.get("version") else {
        return Ok(Version::V1_0);
    };
    match Version::parse(raw) {
        Some(v) if offered.contains(&v) || v == Version::V1_0 => Ok(v),
        _ => Err(Error::Frame(format!(
            "CONNECTED has version {raw:?}, but only {} was offered",
            accept_version(offered)
        ))),
    }
}

/// Upper bounds on what the reader accepts from the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the command line plus all header lines.
    pub max_header_bytes: usize,
    /// Number of header lines in one frame.
    pub max_headers: usize,
    /// Bytes of one body.
    pub max_body: usize,
}

impl Default for Limits {
    /// Generous for mcollective (an inventory reply is a few KiB) yet small
    /// enough that a hostile broker cannot exhaust a Puppet master's memory.
    fn default() -> Self {
        Limits { max_header_bytes: 64 * 1024, max_headers: 128, max_body: 8 * 1024 * 1024 }
    }
}

/// One STOMP frame. Headers keep their order and repeats; the first
/// occurrence of a name is the one that counts (STOMP 1.2 rule).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Frame {
    pub command: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Frame {
    /// A frame with no headers and an empty body.
    pub fn new(command: impl Into<String>) -> Frame {
        Frame { command: command.into(), headers: Vec::new(), body: Vec::new() }
    }

    /// Builder: appends a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Frame {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Builder: sets the body.
    pub fn body(mut self, body: Vec<u8>) -> Frame {
        self.body = body;
        self
    }

    /// The first value of header `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// CONNECT and CONNECTED are never escaped, so that a 1.0 peer can read them.
fn frame_escapes(command: &str, version: Version) -> bool {
    version.escapes() && command != "CONNECT" && command != "CONNECTED"
}

fn valid_command(c: &str) -> bool {
    !c.is_empty() && c.len() <= 32 && c.bytes().all(|b| b.is_ascii_uppercase())
}

fn escape_into(out: &mut Vec<u8>, s: &str, version: Version) {
    for b in s.bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b':' => out.extend_from_slice(b"\\c"),
            b'\r' if version == Version::V1_2 => out.extend_from_slice(b"\\r"),
            _ => out.push(b),
        }
    }
}

fn unescape(raw: &[u8], version: Version) -> Result<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut it = raw.iter();
    while let Some(&b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match it.next() {
            Some(b'\\') => out.push(b'\\'),
            Some(b'n') => out.push(b'\n'),
            Some(b'c') => out.push(b':'),
            Some(b'r') if version == Version::V1_2 => out.push(b'\r'),
            other => {
                return Err(Error::Frame(format!(
                    "undefined header escape \\{} in STOMP {}",
                    other.map(|c| char::from(*c).to_string()).unwrap_or_default(),
                    version.as_str()
                )))
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Serialises a frame. A `content-length` header, if the caller put one in
/// (to control header order), must match the body; otherwise one is appended
/// whenever there is a body.
pub fn encode(frame: &Frame, version: Version) -> Result<Vec<u8>> {
    if !valid_command(&frame.command) {
        return Err(Error::Frame(format!("cannot send command {:?}", frame.command)));
    }
    // ActiveMQ: "SUBSCRIBE received without a subscription id!"
    let needs_id = matches!(frame.command.as_str(), "SUBSCRIBE" | "UNSUBSCRIBE");
    if needs_id && version >= Version::V1_1 && frame.get("id").is_none() {
        return Err(Error::Frame(format!("{} needs an id header in STOMP {}", frame.command, version.as_str())));
    }
    let escaping = frame_escapes(&frame.command, version);
    let mut out = Vec::with_capacity(frame.body.len() + 256);
    out.extend_from_slice(frame.command.as_bytes());
    out.push(b'\n');
    let mut has_length = false;
    for (name, value) in &frame.headers {
        if name.is_empty() || name.contains('\0') || value.contains('\0') {
            return Err(Error::Frame(format!("{} header {name:?}: empty name or NUL byte", frame.command)));
        }
        if name == "content-length" {
            has_length = true;
            if value.trim().parse::<usize>().ok() != Some(frame.body.len()) {
                return Err(Error::Frame(format!(
                    "{} content-length {value} does not match body of {} bytes",
                    frame.command,
                    frame.body.len()
                )));
            }
        }
        if escaping {
            escape_into(&mut out, name, version);
            out.push(b':');
            escape_into(&mut out, value, version);
        } else {
            // Without escaping these octets would change the frame's meaning.
            let bad = |s: &str| s.contains('\n') || s.contains('\r');
            if bad(name) || bad(value) || name.contains(':') {
                return Err(Error::Frame(format!(
                    "{} header {name:?} cannot be written unescaped in STOMP {}",
                    frame.command,
                    version.as_str()
                )));
            }
            out.extend_from_slice(name.as_bytes());
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        }
        out.push(b'\n');
    }
    if !has_length && !frame.body.is_empty() {
        out.extend_from_slice(format!("content-length:{}\n", frame.body.len()).as_bytes());
    }
    out.push(b'\n');
    out.extend_from_slice(&frame.body);
    out.push(0);
    Ok(out)
}

/// Decodes exactly one frame from `bytes` (EOLs before and after it are
/// heart-beats and ignored). For tests and captured data.
pub fn decode(bytes: &[u8], version: Version, limits: Limits) -> Result<Frame> {
    let mut reader = FrameReader::new(bytes, limits);
    reader.set_version(version);
    let frame = reader.read_frame()?;
    let rest = &reader.buf[reader.start..reader.end];
    if skip_heartbeats(rest) != rest.len() || !reader.inner.is_empty() {
        return Err(Error::Frame(format!("{} frame is followed by unexpected bytes", frame.command)));
    }
    Ok(frame)
}

/// Number of leading heart-beat EOLs (`\n` or `\r\n`).
fn skip_heartbeats(buf: &[u8]) -> usize {
    let mut i = 0;
    loop {
        match buf.get(i) {
            Some(b'\n') => i += 1,
            Some(b'\r') if buf.get(i + 1) == Some(&b'\n') => i += 2,
            _ => return i,
        }
    }
}

/// Where the body of a frame whose headers are parsed ends.
#[derive(Debug)]
enum BodyEnd {
    /// `content-length` bytes, then a NUL.
    Length(usize),
    /// First NUL; `scanned` bytes are already known NUL-free.
    Nul { scanned: usize },
}

/// Where the blank line ending command and headers is in `head` (which starts at a
/// command, never at an EOL), searching from `scanned` bytes already known to hold
/// none; `None` if it has not arrived yet.
fn head_end(head: &[u8], scanned: usize) -> Option<usize> {
    let from = scanned.saturating_sub(2);
    let rest = &head[from.min(head.len())..];
    let mut at = 0;
    while let Some(nl) = rest[at..].iter().position(|&b| b == b'\n') {
        let i = at + nl + 1;
        match rest.get(i) {
            Some(b'\n') => return Some(from + i + 1),
            Some(b'\r') if rest.get(i + 1) == Some(&b'\n') => return Some(from + i + 2),
            _ => at = i,
        }
    }
    None
}

/// Parses command + headers at the start of `buf`. `Ok(None)`: need more bytes.
fn parse_head(buf: &[u8], version: Version, limits: &Limits) -> Result<Option<(Frame, BodyEnd, usize)>> {
    let mut pos = 0;
    let mut command: Option<String> = None;
    let mut headers = Vec::new();
    loop {
        let window = &buf[pos..buf.len().min(limits.max_header_bytes + 1)];
        let Some(nl) = window.iter().position(|&b| b == b'\n') else {
            if buf.len() > limits.max_header_bytes {
                return Err(Error::Frame(format!("command and headers exceed {} bytes", limits.max_header_bytes)));
            }
            return Ok(None);
        };
        let mut line = &window[..nl];
        pos += nl + 1;
        if let Some(stripped) = line.strip_suffix(b"\r") {
            line = stripped;
        }
        let Some(cmd) = &command else {
            let c = std::str::from_utf8(line).unwrap_or("");
            if !valid_command(c) {
                return Err(Error::Frame(format!(
                    "malformed command line {:?}",
                    String::from_utf8_lossy(&line[..line.len().min(40)])
                )));
            }
            command = Some(c.to_string());
            continue;
        };
        if line.is_empty() {
            break;
        }
        if headers.len() >= limits.max_headers {
            return Err(Error::Frame(format!("{cmd} has more than {} headers", limits.max_headers)));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(Error::Frame(format!(
                "{cmd} header line without colon: {:?}",
                String::from_utf8_lossy(&line[..line.len().min(40)])
            )));
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let (name, value) = if frame_escapes(cmd, version) {
            (unescape(name, version)?, unescape(value, version)?)
        } else {
            (String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned())
        };
        headers.push((name, value));
    }
    let command = command.unwrap_or_default();
    let frame = Frame { command, headers, body: Vec::new() };
    let end = match frame.get("content-length") {
        None => BodyEnd::Nul { scanned: 0 },
        Some(v) => {
            let len: usize = v
                .trim()
                .parse()
                .map_err(|_| Error::Frame(format!("{} has bad content-length {v:?}", frame.command)))?;
            if len > limits.max_body {
                return Err(Error::Frame(format!(
                    "{} body of {len} bytes exceeds the limit of {}",
                    frame.command, limits.max_body
                )));
            }
            BodyEnd::Length(len)
        }
    };
    Ok(Some((frame, end, pos)))
}

/// A byte stream whose reads and writes can be given a timeout: what
/// [`FrameReader::read_frame_before`] and [`FrameWriter::write_frame_before`]
/// need to hold a deadline however the peer trickles bytes. Implemented for
/// TCP; a TLS stream implements it by setting the timeouts of its socket.
pub trait SocketTimeouts {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Whether a read would return at once (bytes, or the end of the stream).
    fn readable_now(&self) -> io::Result<bool>;
}

impl SocketTimeouts for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }

    fn readable_now(&self) -> io::Result<bool> {
        socket_readable_now(self)
    }
}

/// `poll(2)` of one socket for input, not waiting.
pub fn socket_readable_now(socket: &TcpStream) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut fds = [libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
    loop {
        // SAFETY: `fds` is one valid pollfd for the call's length of 1, and the
        // descriptor stays open while `socket` is borrowed.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
        if n >= 0 {
            // POLLHUP and POLLERR count: the read that follows reports them.
            return Ok(n > 0 && fds[0].revents != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Time left until `deadline`; `None` once it has passed. Never zero, which
/// socket timeouts refuse.
fn time_left(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.max(Duration::from_millis(1)))
}

/// Room a [`FrameReader`] leaves for each read.
const READ_ROOM: usize = 64 * 1024;

/// Reads frames from any byte stream (TCP socket, file, slice).
///
/// Buffered internally; keeps partial frames across `WouldBlock`/`TimedOut`
/// errors so a read timeout can be used as a poll interval.
pub struct FrameReader<R> {
    inner: R,
    /// Read into in place; bytes `start..end` are buffered, the rest is room.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes after `start` known not to end the command and headers, so a head
    /// arriving in small reads is scanned once, not once per read.
    head_scanned: usize,
    pending: Option<(Frame, BodyEnd)>,
    version: Version,
    limits: Limits,
}

impl<R: Read> FrameReader<R> {
    /// A reader speaking STOMP 1.0 until [`FrameReader::set_version`].
    pub fn new(inner: R, limits: Limits) -> FrameReader<R> {
        FrameReader {
            inner,
            buf: Vec::new(),
            start: 0,
            end: 0,
            head_scanned: 0,
            pending: None,
            version: Version::V1_0,
            limits,
        }
    }

    /// Switches header unescaping after negotiation.
    pub fn set_version(&mut self, version: Version) {
        self.version = version;
    }

    /// The underlying stream (e.g. to change its read timeout).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Reads the next frame, skipping heart-beat EOLs.
    pub fn read_frame(&mut self) -> Result<Frame> {
        loop {
            if let Some(frame) = self.try_frame()? {
                return Ok(frame);
            }
            self.fill()?;
        }
    }

    /// The next frame, or `None` when the stream ends between frames (a stream
    /// that ends inside one is an error).
    pub fn read_frame_or_end(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some(frame) = self.try_frame()? {
                return Ok(Some(frame));
            }
            match self.fill() {
                Ok(()) => {}
                Err(Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::UnexpectedEof
                        && self.start == self.end
                        && self.pending.is_none() =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Tries to cut one frame out of the buffered bytes.
    fn try_frame(&mut self) -> Result<Option<Frame>> {
        if self.pending.is_none() {
            self.start += skip_heartbeats(&self.buf[self.start..self.end]);
            let head = &self.buf[self.start..self.end];
            match head_end(head, self.head_scanned) {
                Some(_) => {}
                None if head.len() > self.limits.max_header_bytes => {}
                None => {
                    self.head_scanned = head.len();
                    return Ok(None);
                }
            }
            self.head_scanned = 0;
            match parse_head(&self.buf[self.start..self.end], self.version, &self.limits)? {
                None => return Ok(None),
                Some((frame, end, used)) => {
                    self.start += used;
                    self.pending = Some((frame, end));
                }
            }
        }
        let avail = &self.buf[self.start..self.end];
        let Some((frame, end)) = self.pending.as_mut() else {
            return Ok(None);
        };
        let body_len = match end {
            BodyEnd::Length(len) => {
                if avail.len() <= *len {
                    return Ok(None);
                }
                if avail[*len] != 0 {
                    return Err(Error::Frame(format!(
                        "{} body of content-length {len} is not followed by NUL",
                        frame.command
                    )));
                }
                *len
            }
            BodyEnd::Nul { scanned } => {
                let upto = avail.len().min(self.limits.max_body + 1);
                match avail[*scanned..upto].iter().position(|&b| b == 0) {
                    Some(i) => *scanned + i,
                    None => {
                        if avail.len() > self.limits.max_body {
                            return Err(Error::Frame(format!(
                                "{} body without content-length exceeds {} bytes",
                                frame.command, self.limits.max_body
                            )));
                        }
                        *scanned = upto;
                        return Ok(None);
                    }
                }
            }
        };
        let Some((mut frame, _)) = self.pending.take() else {
            return Ok(None);
        };
        frame.body = avail[..body_len].to_vec();
        self.start += body_len + 1;
        Ok(Some(frame))
    }

    /// Reads more bytes straight into the buffer's room, at least [`READ_ROOM`] of
    /// it (a burst of replies takes a few reads, and no copy through the stack);
    /// keeps everything buffered on error.
    fn fill(&mut self) -> Result<()> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        if self.buf.len() - self.end < READ_ROOM {
            // What is left is at most one frame not read whole: moved to the front.
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
            let needed = self.end + READ_ROOM;
            if self.buf.len() < needed {
                self.buf.resize(needed.max(2 * self.buf.len()), 0);
            }
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    let what = if self.start == self.end && self.pending.is_none() {
                        "connection closed by peer"
                    } else {
                        "connection closed in the middle of a frame"
                    };
                    return Err(Error::io("reading STOMP frame", io::Error::new(io::ErrorKind::UnexpectedEof, what)));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("reading STOMP frame", e)),
            }
        }
    }
}

impl<R: Read + SocketTimeouts> FrameReader<R> {
    /// The next frame, or `Ok(None)` once `deadline` has passed. Each read
    /// waits at most until the deadline, so a peer sending heart-beats or a
    /// frame one byte at a time cannot hold the caller past it. A partial frame
    /// stays buffered for the next call.
    pub fn read_frame_before(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.read_frame_until(deadline, true)
    }

    /// The next frame if its bytes are already here, buffered or waiting on the
    /// socket; `Ok(None)` when reading on would wait (or `deadline` has passed).
    /// Lets a caller hold frames that arrive together and handle them as a batch,
    /// and handle what it holds before it waits.
    pub fn read_frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.read_frame_until(deadline, false)
    }

    /// A frame before `deadline`; without `wait`, only from bytes already here.
    fn read_frame_until(&mut self, deadline: Instant, wait: bool) -> Result<Option<Frame>> {
        loop {
            if let Some(frame) = self.try_frame()? {
                return Ok(Some(frame));
            }
            let Some(left) = time_left(deadline) else {
                return Ok(None);
            };
            if !wait && !self.inner.readable_now().map_err(|e| Error::io("polling the connection", e))? {
                return Ok(None);
            }
            self.inner.set_read_timeout(Some(left)).map_err(|e| Error::io("setting the read timeout", e))?;
            match self.fill() {
                Ok(()) => {}
                Err(e) if e.is_timeout() && wait => {}
                Err(e) if e.is_timeout() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
}

/// Writes frames to any byte sink.
pub struct FrameWriter<W> {
    inner: W,
    version: Version,
}

impl<W: Write> FrameWriter<W> {
    /// A writer speaking STOMP 1.0 until [`FrameWriter::set_version`].
    pub fn new(inner: W) -> FrameWriter<W> {
        FrameWriter { inner, version: Version::V1_0 }
    }

    /// Switches header escaping after negotiation.
    pub fn set_version(&mut self, version: Version) {
        self.version = version;
    }

    /// Encodes, writes and flushes one frame.
    pub fn write_frame(&mut self, frame: &Frame) -> Result<()> {
        let bytes = encode(frame, self.version)?;
        let context = || format!("writing STOMP {} frame", frame.command);
        self.inner.write_all(&bytes).map_err(|e| Error::io(context(), e))?;
        self.inner.flush().map_err(|e| Error::io(context(), e))
    }
}

impl<W: Write + SocketTimeouts> FrameWriter<W> {
    /// Like [`FrameWriter::write_frame`], but gives up once `deadline` has
    /// passed, even against a peer that reads a byte at a time.
    pub fn write_frame_before(&mut self, frame: &Frame, deadline: Instant) -> Result<()> {
        let bytes = encode(frame, self.version)?;
        let context = || format!("writing STOMP {} frame", frame.command);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let Some(left) = time_left(deadline) else {
                return Err(Error::io(context(), io::Error::new(io::ErrorKind::TimedOut, "deadline passed")));
            };
            self.inner.set_write_timeout(Some(left)).map_err(|e| Error::io("setting the write timeout", e))?;
            match self.inner.write(rest) {
                Ok(0) => return Err(Error::io(context(), io::ErrorKind::WriteZero.into())),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(Error::io(context(), e)),
            }
        }
        self.inner.flush().map_err(|e| Error::io(context(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits::default()
    }

    /// Gives at most a few bytes per read, the count varying: a socket under load.
    struct Uneven<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl io::Read for Uneven<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.step = (self.step * 7 + 3) % 40_000 + 1;
            let n = self.step.min(buf.len()).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn frames_of_every_size_around_a_read_come_out_whole_however_the_bytes_arrive() {
        let sizes = [0, 1, 16_383, 16_384, 16_385, 40_000, 100_000, 1_000_000, 7];
        let frames: Vec<Frame> =
            sizes.iter().map(|&n| Frame::new("MESSAGE").body((0..n).map(|i| (i * 31 % 251) as u8).collect())).collect();
        let mut stream = Vec::new();
        for f in &frames {
            stream.extend(encode(f, Version::V1_0).unwrap());
            stream.extend(b"\n\n");
        }
        let limits = Limits { max_body: 2_000_000, ..lim() };
        for step in [0, 1, 5000] {
            let mut reader = FrameReader::new(Uneven { bytes: &stream, step }, limits);
            for (f, &n) in frames.iter().zip(&sizes) {
                let got = reader.read_frame().unwrap();
                assert_eq!(got.body, f.body, "{n} bytes");
            }
            let end = reader.read_frame().unwrap_err();
            assert!(end.to_string().contains("closed by peer"), "{end}");
        }
    }

    #[test]
    fn roundtrip_binary_body_with_nul() {
        let f = Frame::new("SEND").header("destination", "/queue/a").body(vec![4, 8, 0, 1, 0]);
        let bytes = encode(&f, Version::V1_0).unwrap();
        let mut g = decode(&bytes, Version::V1_0, lim()).unwrap();
        assert_eq!(g.get("content-length"), Some("5"));
        g.headers.retain(|(k, _)| k != "content-length");
        assert_eq!(f, g);
    }

    #[test]
    fn escaping_only_in_1_1_and_1_2() {
        let f = Frame::new("SEND").header("a:b", "x\ny\\z\r");
        let b12 = encode(&f, Version::V1_2).unwrap();
        assert!(b12.starts_with(b"SEND\na\\cb:x\\ny\\\\z\\r\n"));
        assert_eq!(decode(&b12, Version::V1_2, lim()).unwrap(), f);
        // 1.1 has no \r escape: the raw CR is written, and a CR before LF is ambiguous.
        let f11 = Frame::new("SEND").header("a:b", "x\ny\\z");
        let b11 = encode(&f11, Version::V1_1).unwrap();
        assert_eq!(decode(&b11, Version::V1_1, lim()).unwrap(), f11);
        assert!(encode(&f, Version::V1_0).is_err());
        // 1.0 takes backslashes literally.
        let raw = b"MESSAGE\nk:a\\nb\n\n\0";
        assert_eq!(decode(raw, Version::V1_0, lim()).unwrap().get("k"), Some("a\\nb"));
        assert!(decode(b"MESSAGE\nk:a\\qb\n\n\0", Version::V1_2, lim()).is_err());
        // CONNECTED is never unescaped.
        let c = decode(b"CONNECTED\nx:a\\qb\n\n\0", Version::V1_2, lim()).unwrap();
        assert_eq!(c.get("x"), Some("a\\qb"));
    }

    #[test]
    fn heartbeats_and_crlf_tolerated() {
        let data = b"\n\r\n\nMESSAGE\r\nk:v\r\n\r\nbody\0\n\nRECEIPT\nreceipt-id:1\n\n\0\n";
        let mut r = FrameReader::new(&data[..], lim());
        r.set_version(Version::V1_2);
        let m = r.read_frame().unwrap();
        assert_eq!((m.command.as_str(), m.get("k"), &m.body[..]), ("MESSAGE", Some("v"), &b"body"[..]));
        assert_eq!(r.read_frame().unwrap().command, "RECEIPT");
        assert!(r.read_frame().is_err()); // EOF
    }

    #[test]
    fn first_header_wins() {
        let f = decode(b"MESSAGE\nk:1\nk:2\n\n\0", Version::V1_2, lim()).unwrap();
        assert_eq!(f.get("k"), Some("1"));
        assert_eq!(f.headers.len(), 2);
    }

    #[test]
    fn malformed_and_oversized_are_errors() {
        let small = Limits { max_header_bytes: 64, max_headers: 2, max_body: 16 };
        let cases: Vec<&[u8]> = vec![
            b"message\n\n\0",
            b"SEND\nno-colon\n\n\0",
            b"SEND\ncontent-length:abc\n\n\0",
            b"SEND\ncontent-length:-1\n\n\0",
            b"SEND\ncontent-length:99999999999999999999999\n\n\0",
            b"SEND\ncontent-length:17\n\n01234567890123456\0",
            b"SEND\ncontent-length:2\n\nabc\0",
            b"SEND\na:1\nb:2\nc:3\n\n\0",
            b"SEND\n\n01234567890123456789\0",
            b"SEND\nk:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n\n\0",
            b"SEND\nk:v\n\nno-nul",
            b"SEND\nk:v",
            b"\xff\xfe\n\n\0",
            b"",
        ];
        for c in cases {
            assert!(decode(c, Version::V1_0, small).is_err(), "accepted {:?}", String::from_utf8_lossy(c));
        }
        // A huge declared length is refused before any body byte arrives.
        let mut r = FrameReader::new(&b"SEND\ncontent-length:1000000000\n\n"[..], small);
        assert!(matches!(r.read_frame(), Err(Error::Frame(_))));
    }

    #[test]
    fn partial_reads_survive_timeouts() {
        // A reader that returns one byte, then a timeout, alternately.
        struct Trickle {
            data: Vec<u8>,
            pos: usize,
            tick: bool,
        }
        impl Read for Trickle {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                self.tick = !self.tick;
                if self.tick {
                    return Err(io::Error::new(io::ErrorKind::WouldBlock, "tick"));
                }
                if self.pos >= self.data.len() {
                    return Ok(0);
                }
                out[0] = self.data[self.pos];
                self.pos += 1;
                Ok(1)
            }
        }
        let data = encode(&Frame::new("MESSAGE").header("a", "b").body(b"x\0y".to_vec()), Version::V1_0).unwrap();
        let mut r = FrameReader::new(Trickle { data, pos: 0, tick: false }, lim());
        let mut timeouts = 0;
        let frame = loop {
            match r.read_frame() {
                Ok(f) => break f,
                Err(e) if e.is_timeout() => timeouts += 1,
                Err(e) => panic!("{e}"),
            }
        };
        assert!(timeouts > 10);
        assert_eq!(frame.body, b"x\0y");
    }

    /// Gives the bytes `step` at a time (the last read may be shorter).
    struct Pieces<'a>(&'a [u8], usize);

    impl Read for Pieces<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(out.len()).min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn frames_cut_anywhere_read_the_same() {
        let stream: &[u8] =
            b"\n\r\nMESSAGE\r\nk:v\r\n\r\nbody\0\nRECEIPT\nreceipt-id:1\n\n\0SEND\ncontent-length:3\n\na\0b\0";
        let whole: Vec<Frame> = {
            let mut r = FrameReader::new(stream, lim());
            (0..3).map(|_| r.read_frame().unwrap()).collect()
        };
        assert_eq!(whole.iter().map(|f| f.command.as_str()).collect::<Vec<_>>(), ["MESSAGE", "RECEIPT", "SEND"]);
        for step in 1..stream.len() {
            let mut r = FrameReader::new(Pieces(stream, step), lim());
            let cut: Vec<Frame> = (0..3).map(|_| r.read_frame().unwrap()).collect();
            assert_eq!(cut, whole, "reads of {step} bytes");
        }
    }

    #[test]
    fn a_head_trickled_byte_by_byte_is_held_to_its_limit() {
        let small = Limits { max_header_bytes: 64, max_headers: 8, max_body: 16 };
        // Exactly at the limit: the command and header lines are 64 bytes (the blank
        // line that ends them is not counted).
        let at_limit = [b"SEND\nk:".as_slice(), &[b'a'; 56], b"\n\n\0"].concat();
        assert_eq!(at_limit.len() - 2, 64);
        let mut r = FrameReader::new(Pieces(&at_limit, 1), small);
        assert_eq!(r.read_frame().unwrap().get("k").map(str::len), Some(56));
        // One byte over, and a head that never ends: refused once past the limit.
        let over = [b"SEND\nk:".as_slice(), &[b'a'; 57], b"\n\n\0"].concat();
        let mut r = FrameReader::new(Pieces(&over, 1), small);
        assert!(matches!(r.read_frame(), Err(Error::Frame(_))));
        let endless = [b"SEND\nk:".as_slice(), &[b'a'; 1000]].concat();
        let mut r = FrameReader::new(Pieces(&endless, 1), small);
        assert!(matches!(r.read_frame(), Err(Error::Frame(m)) if m.contains("exceed 64 bytes")));
        // A malformed command is still refused, once its head is complete.
        let mut r = FrameReader::new(Pieces(b"message\nk:v\n\n\0", 1), small);
        assert!(matches!(r.read_frame(), Err(Error::Frame(m)) if m.contains("malformed command")));
    }

    #[test]
    fn negotiation() {
        let all = [Version::V1_0, Version::V1_1, Version::V1_2];
        assert_eq!(accept_version(&all), "1.0,1.1,1.2");
        let c = Frame::new("CONNECTED").header("version", "1.2");
        assert_eq!(negotiated_version(&c, &all).unwrap(), Version::V1_2);
        assert_eq!(negotiated_version(&Frame::new("CONNECTED"), &all).unwrap(), Version::V1_0);
        assert!(negotiated_version(&c, &[Version::V1_0]).is_err());
        assert!(encode(&Frame::new("SEND").header("content-length", "3"), Version::V1_0).is_err());
        let sub = Frame::new("SUBSCRIBE").header("destination", "/queue/a");
        assert!(encode(&sub, Version::V1_0).is_ok());
        assert!(encode(&sub, Version::V1_1).is_err());
        assert!(encode(&sub.header("id", "1"), Version::V1_2).is_ok());
    }
}
