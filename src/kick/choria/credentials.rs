//! The client's RSA key and certificate, which sign each Choria request.
//!
//! Puppet writes its keys as PKCS#1 (`BEGIN RSA PRIVATE KEY`); `puppetserver ca`
//! and other CAs may write PKCS#8 (`BEGIN PRIVATE KEY`): both are read. Signing is
//! `ring`'s RSA PKCS#1 v1.5 SHA-256, already built for rustls.

use super::error::CredentialError;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;

/// A key pair and its certificate, checked to belong together.
pub struct Credentials {
    key: RsaKeyPair,
    /// The certificate file's text (PEM), as Choria's `pubcert` carries it.
    certificate_pem: String,
    rng: SystemRandom,
}

impl Credentials {
    /// From the contents of the key file and the certificate file (PEM).
    pub fn from_pem(key_pem: &[u8], certificate_pem: &[u8]) -> Result<Credentials, CredentialError> {
        let key = match PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| CredentialError::KeyNotPem)? {
            PrivateKeyDer::Pkcs1(der) => RsaKeyPair::from_der(der.secret_pkcs1_der()),
            PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()),
            _ => return Err(CredentialError::KeyNotRsa),
        }
        .map_err(|e| CredentialError::KeyRejected(e.to_string()))?;

        let certificates: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(certificate_pem)
            .collect::<Result<_, _>>()
            .map_err(|_| CredentialError::CertificateNotPem)?;
        let certificate = match certificates.as_slice() {
            [] => return Err(CredentialError::CertificateNotPem),
            [one] => one,
            several => return Err(CredentialError::SeveralCertificates(several.len())),
        };
        // The certificate's SubjectPublicKeyInfo holds the key's RSAPublicKey DER
        // (modulus and exponent) verbatim: finding it there shows the pair matches,
        // without an X.509 parser.
        let public = key.public().as_ref();
        if !certificate.as_ref().windows(public.len()).any(|w| w == public) {
            return Err(CredentialError::KeyNotCertificates);
        }
        // Sent as the file is, as go-choria sends it (`PublicCertBytes`).
        let text = std::str::from_utf8(certificate_pem).map_err(|_| CredentialError::CertificateNotPem)?;
        Ok(Credentials { key, certificate_pem: text.to_string(), rng: SystemRandom::new() })
    }

    /// The certificate, PEM, for `pubcert`.
    pub fn certificate_pem(&self) -> &str {
        &self.certificate_pem
    }

    /// The public key (RSAPublicKey DER), to verify what [`Credentials::sign`] made.
    pub fn public_key_der(&self) -> &[u8] {
        self.key.public().as_ref()
    }

    /// RSA PKCS#1 v1.5 SHA-256 over `message` (deterministic: the same bytes each time).
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, CredentialError> {
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &self.rng, message, &mut signature)
            .map_err(|_| CredentialError::SigningFailed)?;
        Ok(signature)
    }
}

/// Never the key: only that there is one, and the certificate's size.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("key", &format_args!("<{}-bit RSA, redacted>", self.key.public().modulus_len() * 8))
            .field("certificate_pem", &format_args!("<{} bytes>", self.certificate_pem.len()))
            .finish()
    }
}
