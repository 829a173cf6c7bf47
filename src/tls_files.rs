//! A TLS client configuration made of Puppet's PEM files, for PuppetDB (`puppetdb.*`)
//! and the shared kick state's PostgreSQL (`kick.postgresql.*`): verification always
//! on, against the CA file (Puppet's `localcacert`), with the CRL (`hostcrl`) when the
//! file exists; the client certificate and key (`hostcert`, `hostprivkey`) the server
//! may check. Only `ring`, passed explicitly (never installed process-wide).
//!
//! Errors name the setting (`puppetdb.ca`, `kick.postgresql.ca`, ...) and the file.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A CA bundle, certificate, key or CRL larger than this is refused.
const MAX_PEM_FILE_BYTES: u64 = 16 << 20;

/// The files a TLS client is made of, and how the server's name is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The settings' prefix, for errors: `puppetdb` names `puppetdb.ca` and so on.
    pub prefix: &'static str,
    /// The server's certificate must be valid for the name connected to (PostgreSQL's
    /// `sslmode: verify-full`); when false, only its chain to the CA and its dates
    /// are checked (`verify-ca`).
    pub check_name: bool,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Used when the file exists.
    pub crl: Option<PathBuf>,
}

/// How the files stood: each one's length, modification time and inode, or absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp([Option<(u64, std::time::SystemTime, u64)>; 4]);

impl Stamp {
    pub fn of(files: &TlsFiles) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let stamp = |path: Option<&Path>| {
            let meta = std::fs::metadata(path?).ok()?;
            Some((meta.len(), meta.modified().ok()?, meta.ino()))
        };
        Stamp([stamp(Some(&files.ca)), stamp(Some(&files.cert)), stamp(Some(&files.key)), stamp(files.crl.as_deref())])
    }
}

/// Why the TLS files do not make a client configuration. Each names the setting
/// (`puppetdb.ca`, ...) and the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read, or is over 16 MiB.
    Read { setting: String, path: PathBuf, source: std::io::Error },
    /// The file is not PEM.
    InvalidPem { setting: String, path: PathBuf, source: rustls::pki_types::pem::Error },
    /// A certificate file holding no certificate.
    NoCertificate { setting: String, path: PathBuf },
    /// The CRL file (`PREFIX.crl`) holding no CRL.
    NoCrl { prefix: &'static str, path: PathBuf },
    /// A CA certificate of `PREFIX.ca` that rustls refuses.
    UnusableCa { prefix: &'static str, path: PathBuf, source: rustls::Error },
    /// The CRLs do not make a verifier.
    Crl { prefix: &'static str, source: rustls::client::VerifierBuilderError },
    /// `PREFIX.key` holds no usable private key.
    NoKey { prefix: &'static str, path: PathBuf, source: rustls::pki_types::pem::Error },
    /// rustls has no protocol version to offer.
    Setup { source: rustls::Error },
    /// The key does not go with the certificate.
    KeyMismatch { prefix: &'static str, key: PathBuf, source: rustls::Error },
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { setting, path, source } => {
                write!(f, "{setting}: cannot read {}: {source}", path.display())
            }
            TlsError::InvalidPem { setting, path, source } => {
                write!(f, "{setting} {}: invalid PEM: {source}", path.display())
            }
            TlsError::NoCertificate { setting, path } => {
                write!(f, "{setting} {} holds no PEM certificate", path.display())
            }
            TlsError::NoCrl { prefix, path } => write!(f, "{prefix}.crl {} holds no PEM CRL", path.display()),
            TlsError::UnusableCa { prefix, path, source } => {
                write!(f, "{prefix}.ca {}: unusable CA certificate: {source}", path.display())
            }
            TlsError::Crl { prefix, source } => write!(f, "{prefix}.crl: {source}"),
            TlsError::NoKey { prefix, path, source } => {
                write!(f, "{prefix}.key {}: no usable PEM private key ({source})", path.display())
            }
            TlsError::Setup { source } => write!(f, "TLS setup: {source}"),
            TlsError::KeyMismatch { prefix, key, source } => {
                write!(
                    f,
                    "{prefix}.key {} cannot be used with the certificate of {prefix}.cert: {source}",
                    key.display()
                )
            }
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Read { source, .. } => Some(source),
            TlsError::InvalidPem { source, .. } | TlsError::NoKey { source, .. } => Some(source),
            TlsError::UnusableCa { source, .. } | TlsError::Setup { source } | TlsError::KeyMismatch { source, .. } => {
                Some(source)
            }
            TlsError::Crl { source, .. } => Some(source),
            TlsError::NoCertificate { .. } | TlsError::NoCrl { .. } => None,
        }
    }
}

/// The rustls configuration of `files`; the error names the file and the setting.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let prefix = files.prefix;
    let setting = |name: &str| format!("{prefix}.{name}");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in certificates(&files.ca, setting("ca"))? {
        roots.add(cert).map_err(|source| TlsError::UnusableCa { prefix, path: files.ca.clone(), source })?;
    }
    let crls = match files.crl.as_deref().filter(|crl| crl.exists()) {
        Some(crl) => revocation_lists(crl, prefix)?,
        None => Vec::new(),
    };
    let mut verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    if !crls.is_empty() {
        // Puppet's CRL file holds its CA's list: the server's certificate is checked
        // against it (an intermediate CA's own status is the root's business).
        verifier = verifier.with_crls(crls).only_check_end_entity_revocation();
    }
    let verifier = verifier.build().map_err(|source| TlsError::Crl { prefix, source })?;
    let chain = certificates(&files.cert, setting("cert"))?;
    let pem = read(&files.key, setting("key"))?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|source| TlsError::NoKey {
        prefix,
        path: files.key.clone(),
        source,
    })?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Setup { source })?;
    let builder = if files.check_name {
        builder.with_webpki_verifier(verifier)
    } else {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
    };
    let config = builder.with_client_auth_cert(chain, key).map_err(|source| TlsError::KeyMismatch {
        prefix,
        key: files.key.clone(),
        source,
    })?;
    Ok(Arc::new(config))
}

/// PostgreSQL's `sslmode=verify-ca`: the certificate's chain to the CA, its dates and
/// revocation are checked as always; only a name that does not match is let through.
/// The signatures of the handshake are checked as always too.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

fn read(path: &Path, setting: String) -> Result<Vec<u8>, TlsError> {
    crate::bounded_read::read(path, MAX_PEM_FILE_BYTES).map_err(|source| TlsError::Read {
        setting,
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, setting: String) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, setting.clone())?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::InvalidPem { setting: setting.clone(), path: path.to_path_buf(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { setting, path: path.to_path_buf() });
    }
    Ok(certs)
}

fn revocation_lists(path: &Path, prefix: &'static str) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let setting = format!("{prefix}.crl");
    let pem = read(path, setting.clone())?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::InvalidPem { setting, path: path.to_path_buf(), source })?;
    if crls.is_empty() {
        return Err(TlsError::NoCrl { prefix, path: path.to_path_buf() });
    }
    Ok(crls)
}
