//! mcollective's `psk` security provider: `:hash = MD5_hex(body + psk)`.
//!
//! Only the inner Marshal body is covered (not filter, ttl or callerid), and
//! daemons hash their replies the same way. MD5 is what the protocol fixed in
//! 2012; it is used here only because the daemons demand it.

use super::md5_lanes;
use md5::{Digest, Md5};

/// The lowercase hex MD5 of `body` followed by `psk`.
pub fn sign(body: &[u8], psk: &str) -> String {
    let mut h = Md5::new();
    h.update(body);
    h.update(psk.as_bytes());
    hex(h.finalize().into()).iter().map(|&b| char::from(b)).collect()
}

fn hex(digest: [u8; 16]) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0; 32];
    for (pair, b) in out.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0x0f)];
    }
    out
}

/// Whether `hash` is the signature of `body` under `psk`. Compared in constant
/// time; upper-case hex is accepted.
pub fn verify(body: &[u8], psk: &str, hash: &str) -> bool {
    let expected = sign(body, psk);
    same_hex(expected.as_bytes(), hash)
}

/// Whether `given` is `expected` (lowercase hex) in any case, in time independent
/// of where they differ.
fn same_hex(expected: &[u8], given: &str) -> bool {
    let given = given.as_bytes();
    if given.len() != expected.len() {
        return false;
    }
    expected.iter().zip(given).fold(0u8, |acc, (a, b)| acc | (a ^ b.to_ascii_lowercase())) == 0
}

/// [`verify`] for each `(body, hash)` pair, the bodies hashed together (several at
/// once where the CPU allows): the [`signature_number`] of each pair that verifies,
/// `None` for each that does not, in input order.
pub fn verify_many(signed: &[(&[u8], &str)], psk: &str) -> Vec<Option<u128>> {
    let bodies: Vec<&[u8]> = signed.iter().map(|(body, _)| *body).collect();
    let digests = md5_lanes::digests(&bodies, psk.as_bytes());
    signed
        .iter()
        .zip(digests)
        .map(|((_, hash), digest)| same_hex(&hex(digest), hash).then(|| u128::from_be_bytes(digest)))
        .collect()
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

    #[test]
    fn captured_ping_signature_in_a_batch() {
        let body: &[u8] = b"\x04\x08I\"\x09ping\x06:\x06ET";
        let signature = "ce8010e1d6d99171aa72460ad0fcf19d";
        let number = signature_number(signature);
        assert!(number.is_some());
        // Beside other bodies so that the batch fills lanes; each answer is its own pair's.
        let filler: Vec<Vec<u8>> = (0..12).map(|i| vec![b'x'; i * 37]).collect();
        let filler_hashes: Vec<String> = filler.iter().map(|b| sign(b, "feas-psk-secret")).collect();
        let upper = signature.to_uppercase();
        let mut pairs: Vec<(&[u8], &str)> = vec![
            (body, signature),
            (body, &upper),
            (body, "ce80"),
            (body, "de8010e1d6d99171aa72460ad0fcf19d"),
            (b"ping", signature),
            (body, ""),
        ];
        pairs.extend(filler.iter().map(Vec::as_slice).zip(filler_hashes.iter().map(String::as_str)));
        let answers = verify_many(&pairs, "feas-psk-secret");
        assert_eq!(answers[..6], [number, number, None, None, None, None]);
        for (answer, (filler, hash)) in answers[6..].iter().zip(&pairs[6..]) {
            assert_eq!(*answer, signature_number(hash), "{} bytes", filler.len());
            assert!(answer.is_some());
        }
        assert_eq!(verify_many(&[(body, signature)], "other"), [None]);
        assert!(verify_many(&[], "feas-psk-secret").is_empty());
    }

    #[test]
    fn verify_many_answers_as_verify_does() {
        let bodies: Vec<Vec<u8>> = (0..40).map(|i| (0..i * 29).map(|j| (j * 7 + i) as u8).collect()).collect();
        for psk in ["", "bench-psk", &"k".repeat(70)] {
            let mut hashes: Vec<String> = bodies.iter().map(|b| sign(b, psk)).collect();
            // Some wrong, some upper-case, some of the wrong length.
            for (i, hash) in hashes.iter_mut().enumerate() {
                match i % 5 {
                    1 => *hash = hash.to_uppercase(),
                    2 => hash.replace_range(..1, if hash.starts_with('0') { "1" } else { "0" }),
                    3 => hash.push('0'),
                    4 => *hash = sign(b"another body", psk),
                    _ => {}
                }
            }
            let pairs: Vec<(&[u8], &str)> =
                bodies.iter().map(Vec::as_slice).zip(hashes.iter().map(String::as_str)).collect();
            let answers = verify_many(&pairs, psk);
            for ((body, hash), answer) in pairs.iter().zip(answers) {
                let verified = verify(body, psk, hash);
                assert_eq!(answer.is_some(), verified);
                assert_eq!(answer, signature_number(hash).filter(|_| verified));
            }
        }
    }
}
