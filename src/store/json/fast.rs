//! A fast path for the JSON a fact cache holds: strings scanned eight bytes at a
//! time, escapes decoded in place, checked as UTF-8 only when the builder has not
//! seen them; integers read in place. serde_json's reader goes through a visitor
//! per value and checks every string.
//!
//! It never decides anything on its own: at anything else (a control character, an
//! escape serde_json would refuse or a lone surrogate, `-0`, an integer of more
//! than 18 digits, a float serde_json does not read as finite, a nesting at the
//! limit, bytes that are not JSON) it declines, and the caller reads the document
//! again with serde_json ([`super::decode_with`]). It adds values to the builder in
//! the order serde's visitors do (a key before its colon, a number only once
//! serde_json would take it), so what it interned before declining is what
//! serde_json adds first anyway: the store is the same either way (the
//! `json_facts` fuzz target and `tests/puppet_cache.rs` hold it).

use crate::store::{Builder, ValueId, FALSE, NULL, TRUE};
use std::borrow::Cow;

/// Integers of up to this many digits fit an `i64`.
const MAX_INT_DIGITS: usize = 18;

/// A position in one JSON document. Every method gives `None` to decline.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    /// Skips whitespace; the next byte.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    /// Only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// Opens an object, the next value being one.
    pub fn open_object(&mut self) -> Option<()> {
        (self.peek()? == b'{').then(|| self.at += 1)
    }

    /// The next key of an open object (its bytes), or `Some(None)` at its end;
    /// [`Reader::colon`] follows.
    pub fn next_key(&mut self, first: bool) -> Option<Option<Cow<'a, [u8]>>> {
        match self.peek()? {
            b'}' => {
                self.at += 1;
                return Some(None);
            }
            b',' if !first => {
                self.at += 1;
                self.peek()?;
            }
            _ if !first => return None,
            _ => {}
        }
        self.string().map(Some)
    }

    /// The `:` after a key. serde_json interns a key before it reads the colon,
    /// so the caller does too.
    pub fn colon(&mut self) -> Option<()> {
        (self.peek()? == b':').then(|| self.at += 1)
    }

    /// Whether an open array has another element (consuming the `,` before it).
    fn next_element(&mut self, first: bool) -> Option<bool> {
        match self.peek()? {
            b']' => {
                self.at += 1;
                Some(false)
            }
            b',' if !first => {
                self.at += 1;
                Some(true)
            }
            _ => first.then_some(true),
        }
    }

    /// A string's bytes, between its quotes, escapes decoded (declined at a control
    /// character or an escape serde_json would refuse; not checked as UTF-8 here).
    fn string(&mut self) -> Option<Cow<'a, [u8]>> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at + 1;
        let (mut at, mut decoded) = (start, None::<Vec<u8>>);
        loop {
            let rest = self.bytes.get(at..)?;
            let end = special_byte(rest)?;
            match rest[end] {
                b'"' => {
                    self.at = at + end + 1;
                    return Some(match decoded {
                        None => Cow::Borrowed(&self.bytes[start..at + end]),
                        Some(mut text) => {
                            text.extend_from_slice(&rest[..end]);
                            Cow::Owned(text)
                        }
                    });
                }
                b'\\' => {
                    let text = decoded.get_or_insert_with(Vec::new);
                    text.extend_from_slice(&rest[..end]);
                    let (len, c) = escape(rest.get(end + 1..)?)?;
                    text.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    at += end + 1 + len;
                }
                _ => return None,
            }
        }
    }

    /// A string value as text, or `Some(None)` for any other value (read past,
    /// within `depth` containers): what the document's `name` and `timestamp` keep.
    pub fn text_or_skip(&mut self, depth: usize) -> Option<Option<String>> {
        if self.peek()? == b'"' {
            return String::from_utf8(self.string()?.into_owned()).ok().map(Some);
        }
        self.skip(depth).map(|()| None)
    }

    /// Reads past a value, with at most `depth` containers open in it.
    pub fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mut first = true;
                while let Some(key) = self.next_key(first)? {
                    std::str::from_utf8(&key).ok()?;
                    self.colon()?;
                    self.skip(depth)?;
                    first = false;
                }
                Some(())
            }
            b'[' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mut first = true;
                while self.next_element(first)? {
                    self.skip(depth)?;
                    first = false;
                }
                Some(())
            }
            b'"' => std::str::from_utf8(&self.string()?).ok().map(|_| ()),
            _ => self.scalar().map(|_| ()),
        }
    }

    /// A value into `builder`, with at most `depth` containers open in it: what
    /// [`super::ValueSeed`] gives for it, interned in the same order.
    pub fn value(&mut self, builder: &mut Builder, depth: usize) -> Option<ValueId> {
        match self.peek()? {
            b'{' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mark = builder.open();
                let mut first = true;
                while let Some(key) = self.next_key(first)? {
                    let key = builder.string_checked(&key)?;
                    self.colon()?;
                    let value = self.value(builder, depth)?;
                    builder.push_child(key);
                    builder.push_child(value);
                    first = false;
                }
                Some(builder.close_object(mark))
            }
            b'[' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mark = builder.open();
                let mut first = true;
                while self.next_element(first)? {
                    let id = self.value(builder, depth)?;
                    builder.push_child(id);
                    first = false;
                }
                Some(builder.close_array(mark))
            }
            b'"' => {
                let bytes = self.string()?;
                builder.string_value_checked(&bytes)
            }
            _ => match self.scalar()? {
                Scalar::Null => Some(NULL),
                Scalar::Bool(b) => Some(if b { TRUE } else { FALSE }),
                Scalar::Int(i) => Some(builder.int(i)),
                Scalar::Float(f) => Some(builder.float(f)),
            },
        }
    }

    /// A literal or a number.
    fn scalar(&mut self) -> Option<Scalar> {
        let rest = self.bytes.get(self.at..)?;
        for (word, scalar) in
            [(&b"null"[..], Scalar::Null), (b"true", Scalar::Bool(true)), (b"false", Scalar::Bool(false))]
        {
            if rest.starts_with(word) {
                self.at += word.len();
                return Some(scalar);
            }
        }
        let (len, integer) = number_len(rest)?;
        let text = &rest[..len];
        self.at += len;
        if integer {
            let (negative, digits) = match text.split_first() {
                Some((b'-', digits)) => (true, digits),
                _ => (false, text),
            };
            if digits.len() > MAX_INT_DIGITS {
                return None;
            }
            let magnitude = digits.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
            return match (negative, magnitude) {
                // serde_json reads `-0` as the float -0.0.
                (true, 0) => None,
                (true, m) => Some(Scalar::Int(-m)),
                (false, m) => Some(Scalar::Int(m)),
            };
        }
        // serde_json's own reading of the number, so the float is bit for bit its own.
        let float: f64 = serde_json::from_slice(text).ok()?;
        float.is_finite().then_some(Scalar::Float(float))
    }
}

enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
}

/// The length of the JSON number `bytes` starts with, and whether it is an integer
/// (no fraction, no exponent); `None` when it is not a number by JSON's grammar.
fn number_len(bytes: &[u8]) -> Option<(usize, bool)> {
    let digits_from =
        |at: usize| bytes.get(at..).map_or(0, |rest| rest.iter().take_while(|b| b.is_ascii_digit()).count());
    let mut at = usize::from(bytes.first() == Some(&b'-'));
    match bytes.get(at) {
        // serde_json refuses a digit after a leading 0 before it reads the number.
        Some(b'0') if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => return None,
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => at += digits_from(at),
        _ => return None,
    }
    let mut integer = true;
    if bytes.get(at) == Some(&b'.') {
        let n = digits_from(at + 1);
        if n == 0 {
            return None;
        }
        at += 1 + n;
        integer = false;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let n = digits_from(at);
        if n == 0 {
            return None;
        }
        at += n;
        integer = false;
    }
    Some((at, integer))
}

/// The character of the escape `bytes` starts with (after its `\`), and its
/// length; `None` where serde_json would refuse it (a lone surrogate among them).
fn escape(bytes: &[u8]) -> Option<(usize, char)> {
    let simple = match *bytes.first()? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let unit = hex4(bytes.get(1..5)?)?;
            return match unit {
                0xd800..=0xdbff => {
                    if bytes.get(5..7)? != b"\\u" {
                        return None;
                    }
                    let low = hex4(bytes.get(7..11)?)?;
                    if !(0xdc00..=0xdfff).contains(&low) {
                        return None;
                    }
                    Some((11, char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00))?))
                }
                _ => Some((5, char::from_u32(unit)?)),
            };
        }
        _ => return None,
    };
    Some((1, simple))
}

/// Four hex digits.
fn hex4(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0, |n, &d| Some(n * 16 + char::from(d).to_digit(16)?))
}

/// Where the first `"`, `\` or control character of `bytes` is.
fn special_byte(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `word` below `n` (for n <= 128) sets its high bit in the result; the
    // lowest one set is exact (a borrow only disturbs bytes above it).
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH;
    let mut chunks = bytes.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        let word = u64::from_le_bytes(chunk.try_into().ok()?);
        let found =
            below(word ^ (ONES * u64::from(b'"')), 1) | below(word ^ (ONES * u64::from(b'\\')), 1) | below(word, 0x20);
        if found != 0 {
            return Some(i * 8 + (found.trailing_zeros() / 8) as usize);
        }
    }
    let tail = chunks.remainder();
    let at = tail.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(bytes.len() - tail.len() + at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::json::decode;

    /// The document through the fast path, or `None` where it declines.
    fn fast(builder: &mut Builder, text: &str) -> Option<ValueId> {
        let mut reader = Reader::new(text.as_bytes());
        let id = reader.value(builder, 8)?;
        reader.at_end().then_some(id)
    }

    #[test]
    fn special_bytes_are_found_in_words_and_in_the_tail() {
        for len in 0..20 {
            for at in 0..len {
                for special in [b'"', b'\\', b'\n', 0, 0x1f] {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = special;
                    // Bytes just above the specials, and past them, found nothing early.
                    if at + 1 < len {
                        bytes[at + 1] = special;
                    }
                    for (i, b) in bytes.iter_mut().take(at).enumerate() {
                        *b = [b' ', b'#', b']', 0x7f, 0xc3, b'!', b'[', b'~'][i % 8];
                    }
                    assert_eq!(special_byte(&bytes), Some(at), "{bytes:?}");
                }
            }
            assert_eq!(special_byte(&vec![b'x'; len]), None);
        }
        assert_eq!(special_byte("é€😀 plain\"".as_bytes()), Some(15));
    }

    #[test]
    fn what_it_takes_it_reads_as_serde_json_does() {
        for text in [
            r#"{"b": [1, -2, 0, -17, 123456789012345678, 2.5, -0.0, 1e3, "s", "é", null, true, false], "a": {}}"#,
            r#"{"k": 1, "k": {"x": []}, "j": [[], [{}]]}"#,
            "[1.5E-3, 4e+2, 0.1]",
            " \t\r\n{ \"a\" : [ 1 , 2 ] } \n",
            r#""plain""#,
            r#"{"ssh\n": "a\nb\t\"q\" \\ \/ \b\f\r \u00e9\u20AC \ud83d\ude00 \u0000 end"}"#,
        ] {
            let mut builder = Builder::new();
            let id = fast(&mut builder, text).unwrap_or_else(|| panic!("declined {text}"));
            let mut reference = Builder::new();
            let expected = decode(&mut reference, text.as_bytes(), 8).unwrap();
            assert_eq!(id, expected, "{text}");
            assert_eq!(builder.store().view(id).to_json(), reference.store().view(expected).to_json());
            assert_eq!(
                (builder.store().values(), builder.store().strings()),
                (reference.store().values(), reference.store().strings())
            );
        }
    }

    #[test]
    fn it_declines_what_it_does_not_read_exactly() {
        for text in [
            "{\"a\n\": 1}",
            "{\"a\": \"tab\there\"}",
            r#"{"a": "\x"}"#,
            r#"{"a": "\u12"}"#,
            r#"{"a": "\ud800"}"#,
            r#"{"a": "\ud800\u0041"}"#,
            r#"{"a": "\udc00"}"#,
            r#"{"a": "\"}"#,
            "{\"a\": \"\u{1}\"}",
            r#"{"a": -0}"#,
            r#"{"a": 1234567890123456789}"#,
            r#"{"a": 1e999}"#,
            r#"{"a": 01}"#,
            r#"{"a": 1.}"#,
            r#"{"a": .5}"#,
            r#"{"a": -}"#,
            r#"{"a": +1}"#,
            r#"{"a": 1,}"#,
            r#"{,"a": 1}"#,
            r#"{"a" 1}"#,
            r#"[1 2]"#,
            r#"[1,]"#,
            r#"[,1]"#,
            r#"{"a": tru}"#,
            r#"{"a": NaN}"#,
            r#"{"a": [1, 2"#,
            r#"{"a": "open"#,
            r#"{"a": 1} x"#,
            "[[[[[[[[[]]]]]]]]]",
            r#"{"a": 09}"#,
            r#"{"a": [1, 2], "b": 3 "c": 4}"#,
            r#"{"a": "x" : 1}"#,
        ] {
            let mut builder = Builder::new();
            let mark = builder.open();
            assert_eq!(fast(&mut builder, text), None, "{text}");
            // What it interned before declining, serde_json interns first: the same store.
            builder.discard_open(mark);
            let _ = decode(&mut builder, text.as_bytes(), 8);
            let mut reference = Builder::new();
            let _ = decode(&mut reference, text.as_bytes(), 8);
            assert_eq!(builder.store(), reference.store(), "{text}");
        }
        let mut builder = Builder::new();
        assert_eq!(
            fast(&mut builder, "[[[[[[[[]]]]]]]]").map(|id| builder.store().view(id).to_json().to_string()),
            Some("[[[[[[[[]]]]]]]]".into())
        );
        let invalid = b"{\"a\": \"\xff\"}";
        assert_eq!(Reader::new(invalid).value(&mut builder, 8), None);
    }

    #[test]
    fn skipping_keeps_the_same_limits() {
        let mut reader = Reader::new(br#"{"a": [1, {"b": null}], "c": "d"} "t""#);
        assert_eq!(reader.text_or_skip(3), Some(None));
        assert_eq!(reader.text_or_skip(3), Some(Some("t".to_string())));
        assert!(reader.at_end());
        assert_eq!(Reader::new(br#"[[1]]"#).skip(1), None);
        assert_eq!(Reader::new(b"{\"\xff\": 1}").skip(4), None);
    }
}
