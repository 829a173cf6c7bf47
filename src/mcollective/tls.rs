//! TLS to the broker, with the operator's `client.cfg` files.
//!
//! Verification is always on: the broker's certificate must chain to a CA of
//! `ssl.ca` and be valid for the pool entry's host name or IP address. A
//! client certificate and key (`ssl.cert`, `ssl.key`) are sent when set, as
//! brokers that check clients require. rustls with the `ring` provider does
//! the work; the process-wide default provider is never touched, so the
//! Puppet master's other TLS users are unaffected.
//!
//! [`BrokerStream`] is the socket the client reads frames from: plain TCP or
//! TLS over TCP. Both honour `set_read_timeout`/`set_write_timeout` as a bound
//! on each `read`/`write` call, also when a TLS record trickles in byte by byte.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

// A panic elsewhere cannot leave rustls' state half-updated in a way that matters
// more than the error the next call reports: a poisoned session is used anyway.
use crate::unpoisoned::lock;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, ClientConnection, RootCertStore};

use super::error::{Error, Result};
use super::stomp::{socket_readable_now, SocketTimeouts};

/// Largest CA, certificate or key file read (a CA bundle of a few hundred
/// certificates fits; a wrong path to a huge file does not fill memory).
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// The TLS settings of one pool entry (`plugin.<connector>.pool.N.ssl.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// `ssl.ca`: PEM files (comma-separated in client.cfg) of the CAs the broker's certificate must chain to.
    pub ca: Vec<PathBuf>,
    /// `ssl.cert`: our PEM certificate (chain), sent when the broker asks for one.
    pub cert: Option<PathBuf>,
    /// `ssl.key`: the PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

/// Which setting a [`SetupError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Ca,
    Cert,
    Key,
}

impl Setting {
    /// The client.cfg key suffix (`ssl.ca`...).
    pub fn cfg_key(self) -> &'static str {
        match self {
            Setting::Ca => "ssl.ca",
            Setting::Cert => "ssl.cert",
            Setting::Key => "ssl.key",
        }
    }
}

/// A CA, certificate or key that cannot be used.
#[derive(Debug)]
pub struct SetupError {
    pub setting: Setting,
    pub reason: String,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.setting.cfg_key(), self.reason)
    }
}

impl TlsSettings {
    /// Reads the files and builds the rustls configuration: roots from `ca`,
    /// client authentication from `cert` + `key` when both are set.
    pub fn client_config(&self) -> std::result::Result<Arc<ClientConfig>, SetupError> {
        let fail = |setting, reason: String| SetupError { setting, reason };
        if self.ca.is_empty() {
            return Err(fail(Setting::Ca, "not set: the broker's certificate cannot be verified without a CA".into()));
        }
        let mut roots = RootCertStore::empty();
        for path in &self.ca {
            let pem = read_pem_file(path).map_err(|r| fail(Setting::Ca, r))?;
            let certs = parse_certs(path, &pem).map_err(|r| fail(Setting::Ca, r))?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| fail(Setting::Ca, format!("{}: unusable CA certificate: {e}", path.display())))?;
            }
        }
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(Setting::Ca, format!("TLS setup: {e}")))?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => return Err(fail(Setting::Key, "not set, but ssl.cert is: set both or neither".into())),
            (None, Some(_)) => return Err(fail(Setting::Cert, "not set, but ssl.key is: set both or neither".into())),
            (Some(cert), Some(key)) => {
                let pem = read_pem_file(cert).map_err(|r| fail(Setting::Cert, r))?;
                let chain = parse_certs(cert, &pem).map_err(|r| fail(Setting::Cert, r))?;
                let pem = read_pem_file(key).map_err(|r| fail(Setting::Key, r))?;
                let private = PrivateKeyDer::from_pem_slice(&pem)
                    .map_err(|e| fail(Setting::Key, format!("{}: no usable PEM private key ({e})", key.display())))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    fail(Setting::Key, format!("{} cannot be used with {}: {e}", key.display(), cert.display()))
                })?
            }
        };
        Ok(Arc::new(config))
    }
}

/// Reads a PEM file of at most [`MAX_PEM_FILE_BYTES`].
fn read_pem_file(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(format!("{} is larger than {MAX_PEM_FILE_BYTES} bytes", path.display()));
    }
    Ok(bytes)
}

fn parse_certs(path: &Path, pem: &[u8]) -> std::result::Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: invalid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The name the broker's certificate must be valid for: a DNS name or an IP address.
pub fn server_name(host: &str) -> std::result::Result<ServerName<'static>, NotAServerName> {
    ServerName::try_from(host.to_string()).map_err(|_| NotAServerName { host: host.to_string() })
}

/// A pool entry's host that no certificate can be checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotAServerName {
    pub host: String,
}

impl std::fmt::Display for NotAServerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} is neither a DNS name nor an IP address a certificate can be checked against", self.host)
    }
}

impl std::error::Error for NotAServerName {}

/// A connection to a broker: plain TCP or TLS over TCP.
///
/// Clones share the connection (one reads frames, one writes them); the
/// client uses them from one thread at a time.
pub enum BrokerStream {
    Plain(TcpStream),
    Tls {
        session: Arc<Mutex<TlsSession>>,
        /// The same socket, to set timeouts and shut down without the lock.
        socket: TcpStream,
    },
}

/// rustls' state and the socket it runs over.
pub struct TlsSession {
    conn: ClientConnection,
    socket: TcpStream,
}

impl BrokerStream {
    /// Wraps a connected socket; with `tls`, first completes the handshake
    /// with `host` before `deadline`, verifying the broker's certificate.
    /// Errors name `address` (the broker's `host:port`) and the reason.
    pub fn connect(
        socket: TcpStream,
        tls: Option<&TlsSettings>,
        host: &str,
        address: &str,
        deadline: Instant,
    ) -> Result<BrokerStream> {
        let Some(settings) = tls else {
            return Ok(BrokerStream::Plain(socket));
        };
        let broker_err = |message: String| Error::Broker { host: address.to_string(), message };
        let config = settings.client_config().map_err(|e| broker_err(format!("TLS setup: {e}")))?;
        let name = server_name(host).map_err(|e| broker_err(format!("TLS: {e}")))?;
        let conn = ClientConnection::new(config, name).map_err(|e| broker_err(format!("TLS setup: {e}")))?;
        let handle = socket.try_clone().map_err(|e| Error::io(format!("configuring {address}"), e))?;
        let mut session = TlsSession { conn, socket };
        session.handshake(deadline).map_err(|e| broker_err(describe_handshake_error(e, host, settings)))?;
        Ok(BrokerStream::Tls { session: Arc::new(Mutex::new(session)), socket: handle })
    }

    fn socket(&self) -> &TcpStream {
        match self {
            BrokerStream::Plain(s) => s,
            BrokerStream::Tls { socket, .. } => socket,
        }
    }

    /// True when the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, BrokerStream::Tls { .. })
    }

    /// A second handle on the same connection.
    pub fn try_clone(&self) -> io::Result<BrokerStream> {
        Ok(match self {
            BrokerStream::Plain(s) => BrokerStream::Plain(s.try_clone()?),
            BrokerStream::Tls { session, socket } => {
                BrokerStream::Tls { session: Arc::clone(session), socket: socket.try_clone()? }
            }
        })
    }

    /// Bounds each `read` (see [`TcpStream::set_read_timeout`]).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(timeout)
    }

    /// Bounds each `write` (see [`TcpStream::set_write_timeout`]).
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket().set_write_timeout(timeout)
    }

    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        self.socket().read_timeout()
    }

    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.socket().set_nodelay(nodelay)
    }

    /// Closes the connection; a TLS one first says goodbye (close_notify),
    /// unless the other handle is busy.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if let BrokerStream::Tls { session, .. } = self {
            if let Ok(mut s) = session.try_lock() {
                s.conn.send_close_notify();
                let _ = s.flush_tls();
            }
        }
        self.socket().shutdown(how)
    }
}

/// Each read and write of a session waits only for the time left before its deadline.
impl SocketTimeouts for BrokerStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        BrokerStream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        BrokerStream::set_write_timeout(self, timeout)
    }

    /// TLS: plaintext rustls holds already counts, then the socket.
    fn readable_now(&self) -> io::Result<bool> {
        if let BrokerStream::Tls { session, .. } = self {
            let mut s = lock(session);
            let state = s
                .conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, describe_tls_error(e)))?;
            if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() {
                return Ok(true);
            }
        }
        socket_readable_now(self.socket())
    }
}

impl Read for BrokerStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            BrokerStream::Plain(s) => s.read(buf),
            BrokerStream::Tls { session, .. } => lock(session).read(buf),
        }
    }
}

impl Write for BrokerStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            BrokerStream::Plain(s) => s.write(buf),
            BrokerStream::Tls { session, .. } => lock(session).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            BrokerStream::Plain(s) => s.flush(),
            BrokerStream::Tls { session, .. } => lock(session).flush_tls(),
        }
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} timed out"))
}

/// Why a handshake failed.
enum HandshakeError {
    Io(io::Error),
    Tls(rustls::Error),
    Closed,
    Timeout,
}

impl TlsSession {
    /// Drives the handshake, every socket call bounded by what is left until `deadline`.
    fn handshake(&mut self, deadline: Instant) -> std::result::Result<(), HandshakeError> {
        while self.conn.is_handshaking() || self.conn.wants_write() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(HandshakeError::Timeout);
            }
            self.socket.set_read_timeout(Some(left)).map_err(HandshakeError::Io)?;
            self.socket.set_write_timeout(Some(left)).map_err(HandshakeError::Io)?;
            let step = if self.conn.wants_write() {
                self.conn.write_tls(&mut self.socket).map(|_| ())
            } else {
                match self.conn.read_tls(&mut self.socket) {
                    Ok(0) => return Err(HandshakeError::Closed),
                    Ok(_) => match self.conn.process_new_packets() {
                        Ok(_) => Ok(()),
                        Err(e) => {
                            // Tell the broker why (the alert rustls queued); the error stands anyway.
                            let _ = self.conn.write_tls(&mut self.socket);
                            return Err(HandshakeError::Tls(e));
                        }
                    },
                    Err(e) => Err(e),
                }
            };
            match step {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Err(HandshakeError::Timeout)
                }
                Err(e) => return Err(HandshakeError::Io(e)),
            }
        }
        Ok(())
    }

    /// Sets the socket timeout to what is left of `deadline` (None: blocking).
    fn arm(&self, deadline: Option<Instant>, write: bool, what: &str) -> io::Result<()> {
        let Some(deadline) = deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(what));
        }
        if write {
            self.socket.set_write_timeout(Some(left))
        } else {
            self.socket.set_read_timeout(Some(left))
        }
    }

    /// Writes out what rustls has queued (records, alerts).
    fn flush_tls(&mut self) -> io::Result<()> {
        // The socket's timeout bounds the whole call, however many socket calls it takes.
        let timeout = self.socket.write_timeout()?;
        let result = self.flush_until(timeout.map(|t| Instant::now() + t));
        // Later calls start from the timeout the caller set, not what was left of it.
        self.socket.set_write_timeout(timeout)?;
        result
    }

    fn flush_until(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        while self.conn.wants_write() {
            self.arm(deadline, true, "TLS write")?;
            match self.conn.write_tls(&mut self.socket) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.conn.writer().write(buf)?;
        self.flush_tls()?;
        Ok(n)
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = self.socket.read_timeout()?;
        let result = self.read_until(buf, timeout.map(|t| Instant::now() + t));
        self.socket.set_read_timeout(timeout)?;
        result
    }

    fn read_until(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n), // 0: the broker closed the TLS session cleanly
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Answers rustls owes the broker (e.g. to a key update) go out first.
            self.flush_until(deadline)?;
            self.arm(deadline, false, "TLS read")?;
            match self.conn.read_tls(&mut self.socket) {
                Ok(_) => {} // 0 (EOF) is reported by the plaintext reader above
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            self.conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, describe_tls_error(e)))?;
        }
    }
}

/// A handshake failure in words an operator can act on.
fn describe_handshake_error(e: HandshakeError, host: &str, settings: &TlsSettings) -> String {
    let cas = || settings.ca.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(",");
    match e {
        HandshakeError::Timeout => "TLS handshake not completed within the connect timeout".to_string(),
        HandshakeError::Closed => {
            "the broker closed the connection during the TLS handshake (is this a TLS port? does it require \
             a client certificate, ssl.cert and ssl.key?)"
                .to_string()
        }
        HandshakeError::Io(e) => format!("TLS handshake: {e}"),
        HandshakeError::Tls(rustls::Error::InvalidCertificate(cert)) => match cert {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("TLS: the broker's certificate is not signed by a CA of ssl.ca ({}): {cert:?}", cas())
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "TLS: the broker's certificate is not valid for {host:?}: {}",
                    rustls::Error::InvalidCertificate(cert)
                )
            }
            other => format!("TLS: the broker's certificate is refused: {}", rustls::Error::InvalidCertificate(other)),
        },
        HandshakeError::Tls(e) => describe_tls_error(e),
    }
}

/// A TLS error after our side of the handshake, e.g. the broker refusing our
/// certificate (with TLS 1.3 it says so only after the handshake).
fn describe_tls_error(e: rustls::Error) -> String {
    use rustls::AlertDescription as Alert;
    match e {
        rustls::Error::AlertReceived(Alert::CertificateRequired) => {
            "TLS: the broker requires a client certificate (set ssl.cert and ssl.key)".to_string()
        }
        rustls::Error::AlertReceived(
            alert @ (Alert::BadCertificate | Alert::UnknownCA | Alert::CertificateUnknown | Alert::AccessDenied),
        ) => format!("TLS: the broker refused our client certificate (ssl.cert): {alert:?}"),
        other => format!("TLS: {other}"),
    }
}
