//! JSON decoded straight into a [`Builder`]: no `serde_json::Value` tree, no
//! `String` per value where the input can be borrowed.
//!
//! Nesting is bounded by the caller: a container deeper than its limit stops the
//! decode and sets [`Depth::exceeded`], so the caller can say so rather than report
//! a syntax error. serde_json's own recursion limit (128) stays beneath it.

pub mod fast;

use super::{Builder, StrId, ValueId, FALSE, NULL, TRUE};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// How many containers may still open, and whether one more was refused.
#[derive(Debug)]
pub struct Depth {
    levels_left: usize,
    pub exceeded: bool,
}

impl Depth {
    /// At most `max` containers nested in one another, the outermost one counted.
    pub fn new(max: usize) -> Depth {
        Depth { levels_left: max, exceeded: false }
    }

    /// Enters a container: an error once `max` are open.
    pub fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        if self.levels_left == 0 {
            self.exceeded = true;
            return Err(E::custom("nested too deep"));
        }
        self.levels_left -= 1;
        Ok(())
    }

    pub fn leave(&mut self) {
        self.levels_left += 1;
    }
}

/// Decodes one JSON value into the builder, giving its id.
pub struct ValueSeed<'b> {
    pub builder: &'b mut Builder,
    pub depth: &'b mut Depth,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = ValueId;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ValueId, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = ValueId;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<ValueId, E> {
        Ok(NULL)
    }

    fn visit_bool<E>(self, b: bool) -> Result<ValueId, E> {
        Ok(if b { TRUE } else { FALSE })
    }

    fn visit_i64<E>(self, i: i64) -> Result<ValueId, E> {
        Ok(self.builder.int(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<ValueId, E> {
        Ok(self.builder.uint(u))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<ValueId, E> {
        if !f.is_finite() {
            return Err(E::custom("a number that is not finite"));
        }
        Ok(self.builder.float(f))
    }

    fn visit_str<E>(self, s: &str) -> Result<ValueId, E> {
        Ok(self.builder.string_value(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ValueId, A::Error> {
        self.depth.enter()?;
        let mark = self.builder.open();
        while let Some(id) =
            seq.next_element_seed(ValueSeed { builder: &mut *self.builder, depth: &mut *self.depth })?
        {
            self.builder.push_child(id);
        }
        self.depth.leave();
        Ok(self.builder.close_array(mark))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ValueId, A::Error> {
        self.depth.enter()?;
        let mark = self.builder.open();
        while let Some(key) = map.next_key_seed(KeySeed { builder: &mut *self.builder })? {
            let value = map.next_value_seed(ValueSeed { builder: &mut *self.builder, depth: &mut *self.depth })?;
            self.builder.push_child(key);
            self.builder.push_child(value);
        }
        self.depth.leave();
        Ok(self.builder.close_object(mark))
    }
}

/// An object's key, interned.
pub struct KeySeed<'b> {
    pub builder: &'b mut Builder,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = StrId;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<StrId, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = StrId;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, s: &str) -> Result<StrId, E> {
        Ok(self.builder.string(s))
    }
}

/// Reads past a value the caller does not keep, its nesting still bounded.
pub struct Skip<'b> {
    pub depth: &'b mut Depth,
}

impl<'de> DeserializeSeed<'de> for Skip<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.depth.enter()?;
        while seq.next_element_seed(Skip { depth: &mut *self.depth })?.is_some() {}
        self.depth.leave();
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.depth.enter()?;
        while map.next_key::<de::IgnoredAny>()?.is_some() {
            map.next_value_seed(Skip { depth: &mut *self.depth })?;
        }
        self.depth.leave();
        Ok(())
    }
}

/// One whole JSON document as a value of the builder.
pub fn decode(builder: &mut Builder, bytes: &[u8], max_depth: usize) -> Result<ValueId, JsonError> {
    decode_with(bytes, max_depth, |input, depth| ValueSeed { builder, depth }.deserialize(input))
}

/// One whole JSON document through `read` (a seed deserializing from the input,
/// nesting counted in the `Depth` it is given); nothing may follow it.
pub fn decode_with<T>(
    bytes: &[u8],
    max_depth: usize,
    read: impl FnOnce(&mut serde_json::Deserializer<serde_json::de::SliceRead<'_>>, &mut Depth) -> serde_json::Result<T>,
) -> Result<T, JsonError> {
    let mut depth = Depth::new(max_depth);
    let mut input = serde_json::Deserializer::from_slice(bytes);
    let decoded = read(&mut input, &mut depth).and_then(|value| {
        input.end()?;
        Ok(value)
    });
    decoded.map_err(|e| if depth.exceeded { JsonError::TooDeep { limit: max_depth } } else { JsonError::Syntax(e) })
}

/// Why [`decode`] refused a document.
#[derive(Debug)]
pub enum JsonError {
    Syntax(serde_json::Error),
    TooDeep { limit: usize },
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonError::Syntax(e) => write!(f, "invalid JSON: {e}"),
            JsonError::TooDeep { limit } => write!(f, "invalid JSON: nested deeper than {limit} levels"),
        }
    }
}

impl std::error::Error for JsonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JsonError::Syntax(e) => Some(e),
            JsonError::TooDeep { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json_of(builder: &Builder, id: ValueId) -> serde_json::Value {
        builder.store().view(id).to_json()
    }

    #[test]
    fn values_decode_as_serde_json_reads_them() {
        let mut builder = Builder::new();
        let text = br#"{"z": [1, -2, 18446744073709551615, 2.5, "s\u00e9", null, true], "a": {"y": {}, "x": []}}"#;
        let id = decode(&mut builder, text, 8).unwrap();
        let tree: serde_json::Value = serde_json::from_slice(text).unwrap();
        assert_eq!(json_of(&builder, id), tree);
        // The same value again is the same id: decoding interns like building does.
        assert_eq!(
            decode(
                &mut builder,
                br#"{"a":{"x":[],"y":{}},"z":[1,-2,18446744073709551615,2.5,"s\u00e9",null,true]}"#,
                8
            )
            .unwrap(),
            id
        );
        assert_eq!(builder.value(&tree), id);
    }

    #[test]
    fn keys_come_out_sorted_and_a_repeated_key_keeps_its_last_value() {
        let mut builder = Builder::new();
        let id = decode(&mut builder, br#"{"b": 1, "a": 2, "b": 3, "c": {"k": 1, "k": 2}}"#, 8).unwrap();
        let object = builder.store().view(id).as_object().unwrap();
        let keys: Vec<&str> = object.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(json_of(&builder, id), json!({"a": 2, "b": 3, "c": {"k": 2}}));
        assert_eq!(
            json_of(&builder, id),
            serde_json::from_str::<serde_json::Value>(r#"{"b": 1, "a": 2, "b": 3, "c": {"k": 1, "k": 2}}"#).unwrap()
        );
    }

    #[test]
    fn nesting_stops_at_the_limit_with_its_own_error() {
        let nested = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        let mut builder = Builder::new();
        assert!(decode(&mut builder, nested(5).as_bytes(), 5).is_ok());
        let err = decode(&mut builder, nested(6).as_bytes(), 5).unwrap_err();
        assert!(matches!(err, JsonError::TooDeep { limit: 5 }), "{err:?}");
        assert_eq!(err.to_string(), "invalid JSON: nested deeper than 5 levels");
        let err = decode(&mut builder, br#"{"a": [1, 2"#, 5).unwrap_err();
        assert!(matches!(err, JsonError::Syntax(_)) && err.to_string().starts_with("invalid JSON: EOF"), "{err}");
        let err = decode(&mut builder, b"{} {}", 5).unwrap_err();
        assert!(err.to_string().contains("trailing characters"), "{err}");
    }

    #[test]
    fn a_document_refused_half_way_leaves_the_builder_fit_for_the_next() {
        let mut builder = Builder::new();
        let mark = builder.open();
        assert!(decode(&mut builder, br#"{"a": [1, {"b": [2, 3"#, 8).is_err());
        builder.discard_open(mark);
        let id = decode(&mut builder, br#"{"c": [4]}"#, 8).unwrap();
        assert_eq!(json_of(&builder, id), json!({"c": [4]}));
    }
}
