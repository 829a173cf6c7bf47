//! Ruby Marshal 4.8, through the `marshal-rs` crate, behind a small typed
//! [`Value`].
//!
//! `marshal-rs` did all 166 captured mcollective bodies byte-exact (links,
//! bignums, encodings) and its loader is iterative and length-checked. This
//! layer adds what untrusted broker traffic needs on top: an input size cap,
//! a nesting-depth cap and an output budget (object links `@n` can make a
//! small stream expand exponentially, or loop), and `catch_unwind` as a last
//! guard so a bug in the crate cannot take a Puppet master thread down.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use marshal_rs::{Arena, Kind, ValueId, ValueRef};

use super::error::{Error, Result};

/// The declared encoding of a Ruby String.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `E => true`.
    Utf8,
    /// `E => false`.
    UsAscii,
    /// No encoding ivar: ASCII-8BIT (e.g. the `:body` of a message).
    Binary,
    /// Any other declared encoding, by name.
    Other(String),
}

/// A Ruby value as far as mcollective messages use them.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Fixnum or Bignum that fits in i64.
    Int(i64),
    Float(f64),
    Str {
        bytes: Vec<u8>,
        encoding: Encoding,
    },
    Sym(String),
    Array(Vec<Value>),
    /// Pairs in stream order (Ruby hashes keep insertion order).
    Hash(Vec<(Value, Value)>),
    /// A value this layer does not model (object, struct, regexp, class,
    /// huge bignum...), described for logs. Decoding keeps the rest of the
    /// message usable; encoding one is an error.
    Other(String),
}

impl Value {
    /// A UTF-8 string, as Ruby literals are.
    pub fn str(s: impl Into<String>) -> Value {
        Value::Str { bytes: s.into().into_bytes(), encoding: Encoding::Utf8 }
    }

    /// A US-ASCII string.
    pub fn ascii(s: impl Into<String>) -> Value {
        Value::Str { bytes: s.into().into_bytes(), encoding: Encoding::UsAscii }
    }

    /// A binary (ASCII-8BIT) string.
    pub fn binary(b: impl Into<Vec<u8>>) -> Value {
        Value::Str { bytes: b.into(), encoding: Encoding::Binary }
    }

    /// A symbol.
    pub fn sym(s: impl Into<String>) -> Value {
        Value::Sym(s.into())
    }

    /// Text of a string (any encoding) whose bytes are valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str { bytes, .. } => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    /// Bytes of a string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Str { bytes, .. } => Some(bytes),
            _ => None,
        }
    }

    /// Name of a symbol.
    pub fn as_sym(&self) -> Option<&str> {
        match self {
            Value::Sym(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_hash(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Hash(h) => Some(h),
            _ => None,
        }
    }

    /// `hash[:name]`.
    pub fn get_sym(&self, name: &str) -> Option<&Value> {
        self.as_hash()?.iter().find(|(k, _)| k.as_sym() == Some(name)).map(|(_, v)| v)
    }

    /// `hash["name"]`.
    pub fn get_str(&self, name: &str) -> Option<&Value> {
        self.as_hash()?
            .iter()
            .find(|(k, _)| matches!(k, Value::Str { bytes, .. } if bytes == name.as_bytes()))
            .map(|(_, v)| v)
    }
}

/// Bounds for decoding untrusted Marshal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Bytes of input.
    pub max_input: usize,
    /// Nesting of arrays/hashes (also stops self-referencing links).
    pub max_depth: usize,
    /// Values produced, after object links are expanded.
    pub max_values: usize,
    /// String/symbol bytes produced, after object links are expanded.
    pub max_bytes: usize,
}

impl Default for DecodeLimits {
    /// mcollective bodies are a few KiB, nested 4-6 deep.
    fn default() -> Self {
        DecodeLimits { max_input: 8 * 1024 * 1024, max_depth: 64, max_values: 1_000_000, max_bytes: 64 * 1024 * 1024 }
    }
}

/// Decodes one Marshal 4.8 stream with [`DecodeLimits::default`].
pub fn decode(bytes: &[u8]) -> Result<Value> {
    decode_with(bytes, DecodeLimits::default())
}

/// Decodes one Marshal 4.8 stream within `limits`.
pub fn decode_with(bytes: &[u8], limits: DecodeLimits) -> Result<Value> {
    if bytes.len() > limits.max_input {
        return Err(Error::Marshal(format!(
            "input of {} bytes exceeds the limit of {}",
            bytes.len(),
            limits.max_input
        )));
    }
    let run = || -> Result<Value> {
        let arena = marshal_rs::load(bytes).map_err(|e| Error::Marshal(e.to_string()))?;
        let mut budget = Budget { limits, values: 0, bytes: 0 };
        convert(ValueRef::root(&arena), 0, &mut budget)
    };
    catch_unwind(AssertUnwindSafe(run))
        .unwrap_or_else(|_| Err(Error::Marshal("decoder panicked on malformed input".into())))
}

struct Budget {
    limits: DecodeLimits,
    values: usize,
    bytes: usize,
}

impl Budget {
    fn take(&mut self, bytes: usize) -> Result<()> {
        self.values += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if self.values > self.limits.max_values {
            return Err(Error::Marshal(format!("more than {} values", self.limits.max_values)));
        }
        if self.bytes > self.limits.max_bytes {
            return Err(Error::Marshal(format!("more than {} bytes of strings", self.limits.max_bytes)));
        }
        Ok(())
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn convert(v: ValueRef<'_, '_>, depth: usize, budget: &mut Budget) -> Result<Value> {
    if depth > budget.limits.max_depth {
        return Err(Error::Marshal(format!("nesting deeper than {}", budget.limits.max_depth)));
    }
    let kind = v.kind();
    let size = match kind {
        Kind::Str | Kind::Bytes => v.as_bytes().map_or(0, <[u8]>::len),
        Kind::Symbol => v.as_symbol_bytes().map_or(0, <[u8]>::len),
        _ => 0,
    };
    budget.take(size)?;
    Ok(match kind {
        Kind::Nil => Value::Nil,
        Kind::True => Value::Bool(true),
        Kind::False => Value::Bool(false),
        Kind::Fixnum | Kind::Bignum => match v.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Other("Bignum beyond 64 bits".into()),
        },
        Kind::Float => match v.as_f64() {
            Some(f) => Value::Float(f),
            None => Value::Other("Float with unreadable text".into()),
        },
        Kind::Bytes => Value::binary(v.as_bytes().unwrap_or_default()),
        Kind::Str => {
            let encoding = match v.encoding_id() {
                Some(marshal_rs::ENCODING_UTF_8) => Encoding::Utf8,
                Some(marshal_rs::ENCODING_US_ASCII) => Encoding::UsAscii,
                Some(marshal_rs::ENCODING_ASCII_8BIT) => Encoding::Binary,
                _ => Encoding::Other(lossy(v.encoding_name().unwrap_or(b"?"))),
            };
            Value::Str { bytes: v.as_bytes().unwrap_or_default().to_vec(), encoding }
        }
        Kind::Symbol => Value::Sym(lossy(v.as_symbol_bytes().unwrap_or_default())),
        Kind::Array => {
            let mut out = Vec::with_capacity(v.len().min(1024));
            for item in v.array() {
                out.push(convert(item, depth + 1, budget)?);
            }
            Value::Array(out)
        }
        Kind::Hash => {
            let mut out = Vec::with_capacity(v.len().min(1024));
            for (k, val) in v.entries() {
                let k = convert(k, depth + 1, budget)?;
                out.push((k, convert(val, depth + 1, budget)?));
            }
            Value::Hash(out)
        }
        Kind::Regexp => {
            let src = v.as_regexp().map(|(s, _)| lossy(s)).unwrap_or_default();
            Value::Other(format!("Regexp /{src}/"))
        }
        Kind::Struct | Kind::Object | Kind::Class | Kind::Module => {
            let class = v.class_name().or_else(|| v.as_path()).map(lossy).unwrap_or_default();
            Value::Other(format!("{kind:?} {class}"))
        }
    })
}

/// A value already placed in an [`Encoder`]; using it twice makes Ruby see
/// one shared object (an `@` link), as mcollective's own requests do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node(ValueId);

/// Builds a Marshal stream with control over object sharing.
///
/// Like Ruby 2.5+, equal String hash keys become one (deduplicated, frozen)
/// object, so nested hashes are written with the same `@` links as Ruby.
pub struct Encoder {
    arena: Arena<'static>,
    keys: HashMap<(Vec<u8>, Encoding), Node>,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new()
    }
}

/// Ruby writes integers in -2^30..2^30 as Fixnum, others as Bignum.
const FIXNUM_MIN: i64 = -(1 << 30);
const FIXNUM_MAX: i64 = (1 << 30) - 1;

impl Encoder {
    pub fn new() -> Encoder {
        Encoder { arena: Arena::builder(), keys: HashMap::new() }
    }

    /// Adds a value tree (no sharing inside it).
    pub fn value(&mut self, v: &Value) -> Result<Node> {
        self.value_at(v, 0)
    }

    fn value_at(&mut self, v: &Value, depth: usize) -> Result<Node> {
        if depth > DecodeLimits::default().max_depth {
            return Err(Error::Marshal("value nested too deeply to encode".into()));
        }
        let a = &mut self.arena;
        let id = match v {
            Value::Nil => a.push_nil(),
            Value::Bool(b) => a.push_bool(*b),
            Value::Int(i) if (FIXNUM_MIN..=FIXNUM_MAX).contains(i) => {
                let small = i32::try_from(*i).map_err(|_| Error::Marshal(format!("fixnum {i} out of range")))?;
                a.push_fixnum(small)
            }
            Value::Int(i) => {
                let magnitude = i.unsigned_abs().to_le_bytes().to_vec();
                a.push_bignum(*i < 0, magnitude)
            }
            Value::Float(f) => a.push_float(float_text(*f).into_bytes()),
            Value::Str { bytes, encoding } => match encoding {
                Encoding::Binary => a.push_bytes(bytes.clone()),
                Encoding::Utf8 => a
                    .push_str_with_encoding(bytes.clone(), marshal_rs::ENCODING_UTF_8)
                    .ok_or_else(|| Error::Marshal("UTF-8 encoding unknown".into()))?,
                Encoding::UsAscii => a
                    .push_str_with_encoding(bytes.clone(), marshal_rs::ENCODING_US_ASCII)
                    .ok_or_else(|| Error::Marshal("US-ASCII encoding unknown".into()))?,
                Encoding::Other(name) => a.push_str_with_encoding_name(bytes.clone(), name.as_bytes()),
            },
            Value::Sym(s) => a.push_symbol(s.as_bytes().to_vec()),
            Value::Array(items) => {
                let mut ids = Vec::with_capacity(items.len());
                for item in items {
                    ids.push(self.value_at(item, depth + 1)?);
                }
                return self.array(&ids);
            }
            Value::Hash(pairs) => {
                let mut ids = Vec::with_capacity(pairs.len());
                for (k, val) in pairs {
                    let k = self.key_at(k, depth + 1)?;
                    ids.push((k, self.value_at(val, depth + 1)?));
                }
                return self.hash(&ids);
            }
            Value::Other(what) => return Err(Error::Marshal(format!("cannot encode unsupported value {what}"))),
        };
        Ok(Node(id))
    }

    /// A hash key: Strings are shared by content, as Ruby's fstring table does.
    fn key_at(&mut self, k: &Value, depth: usize) -> Result<Node> {
        let Value::Str { bytes, encoding } = k else {
            return self.value_at(k, depth);
        };
        let id = (bytes.clone(), encoding.clone());
        if let Some(node) = self.keys.get(&id) {
            return Ok(*node);
        }
        let node = self.value_at(k, depth)?;
        self.keys.insert(id, node);
        Ok(node)
    }

    /// An Array of values already added.
    pub fn array(&mut self, items: &[Node]) -> Result<Node> {
        let ids: Vec<ValueId> = items.iter().map(|n| n.0).collect();
        self.arena.push_array(&ids).map(Node).ok_or_else(|| Error::Marshal("array element from another encoder".into()))
    }

    /// A Hash of key/value pairs already added.
    pub fn hash(&mut self, pairs: &[(Node, Node)]) -> Result<Node> {
        let ids: Vec<(ValueId, ValueId)> = pairs.iter().map(|(k, v)| (k.0, v.0)).collect();
        self.arena
            .push_hash(&ids, None)
            .map(Node)
            .ok_or_else(|| Error::Marshal("hash entry from another encoder".into()))
    }

    /// The Marshal bytes with `root` as the top value.
    pub fn finish(mut self, root: Node) -> Result<Vec<u8>> {
        if !self.arena.set_root(root.0) {
            return Err(Error::Marshal("root from another encoder".into()));
        }
        let arena = self.arena;
        catch_unwind(AssertUnwindSafe(|| marshal_rs::dump(&arena)))
            .map_err(|_| Error::Marshal("encoder panicked".into()))
    }
}

/// Encodes a value tree as a Marshal 4.8 stream.
pub fn encode(v: &Value) -> Result<Vec<u8>> {
    let mut e = Encoder::new();
    let root = e.value(v)?;
    e.finish(root)
}

/// Float text as Ruby's reader (strtod) accepts it.
fn float_text(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{f}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_roundtrip() {
        let v = Value::Array(vec![
            Value::Nil,
            Value::Bool(true),
            Value::Bool(false),
            Value::Int(0),
            Value::Int(-1),
            Value::Int(FIXNUM_MAX),
            Value::Int(FIXNUM_MAX + 1),
            Value::Int(FIXNUM_MIN),
            Value::Int(FIXNUM_MIN - 1),
            Value::Int(i64::MAX),
            Value::Int(i64::MIN + 1),
            Value::Float(1.5),
            Value::Float(-0.25),
            Value::str("héllo"),
            Value::ascii("abc"),
            Value::binary(vec![0, 255, 4, 8]),
            Value::sym("key"),
            Value::sym("key"),
            Value::Hash(vec![(Value::sym("a"), Value::str("b"))]),
        ]);
        let bytes = encode(&v).unwrap();
        assert_eq!(decode(&bytes).unwrap(), v);
    }

    #[test]
    fn epoch_is_bignum() {
        // Ruby: Marshal.dump(1795333867) == "\x04\bl+\a\xEB\x9E\x02k"
        assert_eq!(encode(&Value::Int(1_795_333_867)).unwrap(), b"\x04\x08l+\x07\xeb\x9e\x02k");
        assert_eq!(encode(&Value::Int(60)).unwrap(), b"\x04\x08iA");
    }

    #[test]
    fn shared_nodes_become_links() {
        let mut e = Encoder::new();
        let s = e.value(&Value::str("x")).unwrap();
        let arr = e.array(&[s, s]).unwrap();
        let bytes = e.finish(arr).unwrap();
        assert_eq!(bytes, b"\x04\x08[\x07I\"\x06x\x06:\x06ET@\x06");
        let v = decode(&bytes).unwrap();
        assert_eq!(v, Value::Array(vec![Value::str("x"), Value::str("x")]));
    }

    #[test]
    fn hostile_input_is_an_error() {
        let mut deep = b"\x04\x08".to_vec();
        deep.extend(std::iter::repeat_n([b'[', 0x06], 100_000).flatten());
        deep.push(b'0');
        assert!(decode(&deep).is_err(), "deep nesting");

        // Self-referencing array: [@0]
        assert!(decode(b"\x04\x08[\x06@\x00").is_err(), "cycle");

        let huge_string = b"\x04\x08\"\x04\xff\xff\xff\x7fabc";
        assert!(decode(huge_string).is_err(), "huge declared string");
        let huge_array = b"\x04\x08[\x04\xff\xff\xff\x7f0";
        assert!(decode(huge_array).is_err(), "huge declared array");
        let huge_hash = b"\x04\x08{\x04\xff\xff\xff\x7f00";
        assert!(decode(huge_hash).is_err(), "huge declared hash");
        assert!(decode(b"").is_err());
        assert!(decode(b"\x04\x09[\x00").is_err(), "bad version");
        assert!(decode(b"\x04\x08{\x06:\x06a").is_err(), "truncated");
        assert!(decode(b"\x04\x08;\x05").is_err(), "bad symbol link");
        let limits = DecodeLimits { max_input: 4, ..DecodeLimits::default() };
        assert!(decode_with(b"\x04\x08[\x000", limits).is_err(), "input size");
    }

    #[test]
    fn link_expansion_is_budgeted() {
        // a0 = [s, s]; a1 = [a0, a0]; ... 2^30 strings if expanded.
        // Objects are numbered in stream order: arrays get numbers as they open.
        // Build bottom-up: innermost array first is impossible in Marshal, so
        // nest outward-in: [ [ [ ... ["x", @k] ... ], @j ], @i ]
        let depth = 30u8;
        let mut b = b"\x04\x08".to_vec();
        for _ in 0..depth {
            b.extend_from_slice(b"[\x07");
        }
        b.extend_from_slice(b"I\"\x06x\x06:\x06ET"); // object number `depth`
        for level in (0..depth).rev() {
            // The second element of array `level` links to its first element,
            // which is object `level + 1`.
            b.push(b'@');
            b.push(level + 1 + 5);
        }
        let limits = DecodeLimits { max_depth: 64, max_values: 10_000, ..DecodeLimits::default() };
        let r = decode_with(&b, limits);
        assert!(r.is_err(), "{r:?}");
    }

    #[test]
    fn other_kinds_are_described_not_fatal() {
        // [/ab/, Object Foo]
        let bytes = b"\x04\x08[\x07I/\x07ab\x00\x06:\x06EFo:\x08Foo\x00";
        let v = decode(bytes).unwrap();
        let a = v.as_array().unwrap();
        assert!(matches!(&a[0], Value::Other(s) if s.contains("ab")));
        assert!(matches!(&a[1], Value::Other(s) if s.contains("Foo")));
        assert!(encode(&a[1]).is_err());
    }
}
