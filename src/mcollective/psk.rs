//! mcollective's `psk` security provider: `:hash = MD5_hex(body + psk)`.
//!
//! Only the inner Marshal body is covered (not filter, ttl or callerid), and
//! daemons hash their replies the same way. MD5 is what the protocol fixed in
//! 2012; it is used here only because the daemons demand it.

use md5::{Digest, Md5};

/// The lowercase hex MD5 of `body` followed by `psk`.
pub fn sign(body: &[u8], psk: &str) -> String {
    let mut h = Md5::new();
    h.update(body);
    h.update(psk.as_bytes());
    let digest = h.finalize();
    let mut out = String::with_capacity(32);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether `hash` is the signature of `body` under `psk`. Compared in constant
/// time; upper-case hex is accepted.
pub fn verify(body: &[u8], psk: &str, hash: &str) -> bool {
    let expected = sign(body, psk);
    let given = hash.as_bytes();
    if given.len() != expected.len() {
        return false;
    }
    expected.bytes().zip(given).fold(0u8, |acc, (a, b)| acc | (a ^ b.to_ascii_lowercase())) == 0
}

/// [`verify`] of each (body, hash) pair under `psk`, in order.
pub fn verify_many(signed: &[(&[u8], &str)], psk: &str) -> Vec<bool> {
    signed.iter().map(|(body, hash)| verify(body, psk, hash)).collect()
}

/// A signature [`verify`] accepted, as a number (its case does not matter).
pub fn signature_number(hash: &str) -> Option<u128> {
    u128::from_str_radix(hash, 16).ok().filter(|_| hash.len() == 32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_signature_is_a_number_whatever_its_case_and_only_at_its_length() {
        let signed = sign(b"body", "key");
        let number = signature_number(&signed).unwrap();
        assert_eq!(signature_number(&signed.to_uppercase()), Some(number));
        assert_ne!(signature_number(&sign(b"other body", "key")), Some(number));
        assert_eq!(signature_number(&signed[1..]), None, "31 digits");
        assert_eq!(signature_number(&format!("0{signed}")), None, "33 digits");
        assert_eq!(signature_number("g".repeat(32).as_str()), None);
    }

    use super::*;

    #[test]
    fn captured_ping_signature() {
        // From rabbitmq/070-s05-c2s-SEND: body "ping", psk feas-psk-secret.
        let body = b"\x04\x08I\"\x09ping\x06:\x06ET";
        assert_eq!(sign(body, "feas-psk-secret"), "ce8010e1d6d99171aa72460ad0fcf19d");
        assert!(verify(body, "feas-psk-secret", "CE8010E1D6D99171AA72460AD0FCF19D"));
        assert!(!verify(body, "other", "ce8010e1d6d99171aa72460ad0fcf19d"));
        assert!(!verify(body, "feas-psk-secret", "ce80"));
    }
}
