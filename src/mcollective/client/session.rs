//! One STOMP connection to a broker of the pool: opened within the connect timeout
//! (DNS, TCP, TLS when configured, the STOMP handshake), frames sent and read
//! before a deadline, errors naming the broker, and closed.

use std::net::{Shutdown, TcpStream};
use std::time::Instant;

use super::resolve::{resolve_before, system_lookup};
use super::{deadline_after, Client};
use crate::mcollective::config::BrokerHost;
use crate::mcollective::connector::Connector;
use crate::mcollective::error::{Error, Result};
use crate::mcollective::stomp::{negotiated_version, Frame, FrameReader, FrameWriter, Version};
use crate::mcollective::tls::BrokerStream;

/// One STOMP connection.
pub(super) struct Session {
    reader: FrameReader<BrokerStream>,
    writer: FrameWriter<BrokerStream>,
    pub(super) version: Version,
    pub(super) host: String,
}

impl Client {
    /// Connects to the first pool host that completes the STOMP handshake.
    pub(super) fn open(&self) -> Result<Session> {
        let mut failures = Vec::new();
        for broker in &self.config.pool {
            match self.open_one(broker) {
                Ok(s) => return Ok(s),
                Err(e) => failures.push((broker.address(), e.to_string())),
            }
        }
        Err(Error::NoBroker(failures))
    }

    /// DNS, TCP connect and the STOMP handshake, all within `connect_timeout`.
    fn open_one(&self, broker: &BrokerHost) -> Result<Session> {
        let host = broker.address();
        let deadline = deadline_after(self.config.connect_timeout);
        let addrs = resolve_before(&broker.host, broker.port, deadline, system_lookup)
            .map_err(|e| Error::io(format!("resolving {host}"), e))?;
        let mut last = None;
        let mut stream = None;
        for addr in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(Error::io(format!("connecting to {addr}"), e)),
            }
        }
        let stream = match stream {
            Some(s) => s,
            None => return Err(last.unwrap_or_else(|| Error::InvalidInput(format!("{host} resolves to no address")))),
        };
        let io_err = |what: &str, e| Error::io(format!("{what} {host}"), e);
        stream.set_nodelay(true).map_err(|e| io_err("configuring", e))?;
        // The TLS handshake, when configured, is part of the connect timeout.
        let stream = BrokerStream::connect(stream, broker.tls.as_ref(), &broker.host, &host, deadline)?;
        let write_half = stream.try_clone().map_err(|e| io_err("configuring", e))?;
        let mut session = Session {
            reader: FrameReader::new(stream, self.config.stomp_limits),
            writer: FrameWriter::new(write_half),
            version: Version::V1_0,
            host: host.clone(),
        };
        let versions = &self.config.stomp_versions;
        session.send(&self.connector.connect(broker, versions), deadline)?;
        let Some(frame) = session.next_frame(deadline)? else {
            return Err(Error::Broker { host, message: "no CONNECTED frame within the connect timeout".into() });
        };
        match frame.command.as_str() {
            "CONNECTED" => {}
            "ERROR" => return Err(Error::Broker { host, message: error_text(&frame) }),
            other => return Err(Error::Broker { host, message: format!("expected CONNECTED, got {other}") }),
        }
        let version = negotiated_version(&frame, versions)?;
        session.version = version;
        session.reader.set_version(version);
        session.writer.set_version(version);
        Ok(session)
    }
}

impl Session {
    pub(super) fn send(&mut self, frame: &Frame, deadline: Instant) -> Result<()> {
        self.writer.write_frame_before(frame, deadline).map_err(|e| match e {
            Error::Io { context, source } => Error::io(format!("{context} to {}", self.host), source),
            other => other,
        })
    }

    /// The next frame if it is already here, without waiting on the broker.
    pub(super) fn frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.reader.read_frame_if_ready(deadline).map_err(|e| self.naming_broker(e))
    }

    /// The next frame, or None once `deadline` passed, whatever the broker
    /// sends meanwhile (heart-beats, a frame a byte at a time).
    pub(super) fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.reader.read_frame_before(deadline).map_err(|e| self.naming_broker(e))
    }

    /// A reading error that names the broker.
    fn naming_broker(&self, e: Error) -> Error {
        match e {
            Error::Io { context, source } => Error::io(format!("{context} from {}", self.host), source),
            Error::Frame(m) => Error::Frame(format!("from {}: {m}", self.host)),
            e => e,
        }
    }

    /// DISCONNECT and close; errors are moot at this point.
    pub(super) fn close(mut self, connector: &Connector, deadline: Instant) {
        let _ = self.send(&connector.disconnect(), deadline);
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

/// An ERROR frame's `message` header and body, for error text.
pub(super) fn error_text(frame: &Frame) -> String {
    let mut s = frame.get("message").unwrap_or("ERROR frame").to_string();
    let body = String::from_utf8_lossy(&frame.body);
    let body = body.trim();
    if !body.is_empty() {
        s.push_str(": ");
        s.extend(body.chars().take(500));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_frames_are_summarised() {
        let f = Frame::new("ERROR").header("message", "Bad CONNECT").body(b"Access refused\n".to_vec());
        assert_eq!(error_text(&f), "Bad CONNECT: Access refused");
    }
}
