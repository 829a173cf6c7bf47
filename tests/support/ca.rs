//! A CA made for a test (rcgen, no openssl process), able to sign server and client
//! certificates: used by tests/support/postgres.rs, tests/support/fake_puppetdb.rs
//! (which includes this file itself: benches/puppetdb.rs takes it without the rest of
//! tests/support) and tests/mcollective_tls.rs.
#![allow(dead_code)]

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// A self-signed CA named `name` (its common name), allowed to sign certificates and CRLs.
pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf certificate for `names` (DNS names or IP addresses; the first is also its
    /// common name) and its key, as PEM.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let mut params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}
