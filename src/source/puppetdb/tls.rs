//! The TLS client configuration for PuppetDB: verification always on, against the
//! CA file (Puppet's `localcacert`), with the CRL (`hostcrl`) when the file exists;
//! the client certificate and key (`hostcert`, `hostprivkey`) PuppetDB's allowlist
//! checks. Only `ring`, passed explicitly (never installed process-wide).

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
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

/// The rustls configuration of `files`; the error names the file and the setting.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in certificates(&files.ca, "puppetdb.ca")? {
        roots.add(cert).map_err(|e| format!("puppetdb.ca {}: unusable CA certificate: {e}", files.ca.display()))?;
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
    let verifier = verifier.build().map_err(|e| format!("puppetdb.crl: {e}"))?;
    let chain = certificates(&files.cert, "puppetdb.cert")?;
    let pem = read(&files.key, "puppetdb.key")?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("puppetdb.key {}: no usable PEM private key ({e})", files.key.display()))?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| {
            format!("puppetdb.key {} cannot be used with {}: {e}", files.key.display(), files.cert.display())
        })?;
    Ok(Arc::new(config))
}

fn read(path: &Path, setting: &str) -> Result<Vec<u8>, String> {
    crate::bounded_read::read(path, MAX_PEM_FILE_BYTES)
        .map_err(|e| format!("{setting}: cannot read {}: {e}", path.display()))
}

fn certificates(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, setting)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{setting} {}: invalid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{setting} {} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

fn revocation_lists(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    let pem = read(path, "puppetdb.crl")?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("puppetdb.crl {}: invalid PEM: {e}", path.display()))?;
    if crls.is_empty() {
        return Err(format!("puppetdb.crl {} holds no PEM CRL", path.display()));
    }
    Ok(crls)
}
