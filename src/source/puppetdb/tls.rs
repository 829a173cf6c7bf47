//! The TLS client configuration for PuppetDB: verification always on, against the
//! CA file (Puppet's `localcacert`), with the CRL (`hostcrl`) when the file exists;
//! the client certificate and key (`hostcert`, `hostprivkey`) PuppetDB's allowlist
//! checks. Only `ring`, passed explicitly (never installed process-wide).

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A CA bundle, certificate, key or CRL larger than this is refused.
const MAX_PEM_FILE_BYTES: u64 = 16 << 20;

/// The files TLS to PuppetDB is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
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
    Read { setting: &'static str, path: PathBuf, source: std::io::Error },
    /// The file is not PEM.
    InvalidPem { setting: &'static str, path: PathBuf, source: rustls::pki_types::pem::Error },
    /// A certificate file holding no certificate.
    NoCertificate { setting: &'static str, path: PathBuf },
    /// The CRL file (`puppetdb.crl`) holding no CRL.
    NoCrl { path: PathBuf },
    /// A CA certificate of `puppetdb.ca` that rustls refuses.
    UnusableCa { path: PathBuf, source: rustls::Error },
    /// The CRLs do not make a verifier.
    Crl { source: rustls::client::VerifierBuilderError },
    /// `puppetdb.key` holds no usable private key.
    NoKey { path: PathBuf, source: rustls::pki_types::pem::Error },
    /// rustls has no protocol version to offer.
    Setup { source: rustls::Error },
    /// The key does not go with the certificate.
    KeyMismatch { key: PathBuf, cert: PathBuf, source: rustls::Error },
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
            TlsError::NoCrl { path } => write!(f, "puppetdb.crl {} holds no PEM CRL", path.display()),
            TlsError::UnusableCa { path, source } => {
                write!(f, "puppetdb.ca {}: unusable CA certificate: {source}", path.display())
            }
            TlsError::Crl { source } => write!(f, "puppetdb.crl: {source}"),
            TlsError::NoKey { path, source } => {
                write!(f, "puppetdb.key {}: no usable PEM private key ({source})", path.display())
            }
            TlsError::Setup { source } => write!(f, "TLS setup: {source}"),
            TlsError::KeyMismatch { key, cert, source } => {
                write!(f, "puppetdb.key {} cannot be used with {}: {source}", key.display(), cert.display())
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
            TlsError::Crl { source } => Some(source),
            TlsError::NoCertificate { .. } | TlsError::NoCrl { .. } => None,
        }
    }
}

/// The rustls configuration of `files`; the error names the file and the setting.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in certificates(&files.ca, "puppetdb.ca")? {
        roots.add(cert).map_err(|source| TlsError::UnusableCa { path: files.ca.clone(), source })?;
    }
    let crls = match files.crl.as_deref().filter(|crl| crl.exists()) {
        Some(crl) => revocation_lists(crl)?,
        None => Vec::new(),
    };
    let mut verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    if !crls.is_empty() {
        // Puppet's CRL file holds its CA's list: the server's certificate is checked
        // against it (an intermediate CA's own status is the root's business).
        verifier = verifier.with_crls(crls).only_check_end_entity_revocation();
    }
    let verifier = verifier.build().map_err(|source| TlsError::Crl { source })?;
    let chain = certificates(&files.cert, "puppetdb.cert")?;
    let pem = read(&files.key, "puppetdb.key")?;
    let key =
        PrivateKeyDer::from_pem_slice(&pem).map_err(|source| TlsError::NoKey { path: files.key.clone(), source })?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Setup { source })?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|source| TlsError::KeyMismatch { key: files.key.clone(), cert: files.cert.clone(), source })?;
    Ok(Arc::new(config))
}

fn read(path: &Path, setting: &'static str) -> Result<Vec<u8>, TlsError> {
    crate::bounded_read::read(path, MAX_PEM_FILE_BYTES).map_err(|source| TlsError::Read {
        setting,
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, setting: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, setting)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::InvalidPem { setting, path: path.to_path_buf(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { setting, path: path.to_path_buf() });
    }
    Ok(certs)
}

fn revocation_lists(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let setting = "puppetdb.crl";
    let pem = read(path, setting)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::InvalidPem { setting, path: path.to_path_buf(), source })?;
    if crls.is_empty() {
        return Err(TlsError::NoCrl { path: path.to_path_buf() });
    }
    Ok(crls)
}
