//! YAML to JSON-like values, for `puppet_kicker.yaml` and Puppet's legacy YAML fact
//! cache. Ruby tags (`!ruby/object:Puppet::Node::Facts`) are ignored: we only want
//! the mapping underneath.
//!
//! The tree is built from the parser's events with an explicit stack, never by
//! recursion, and within limits: a document nested deeper than [`MAX_DEPTH`], with
//! more than [`MAX_ALIASES`] aliases, aliases repeating more than
//! [`MAX_ALIASED_VALUES`] values, or expanding to more than [`MAX_VALUES`] values or
//! [`MAX_TEXT`] bytes of text is refused before it is built. No value deeper than
//! [`MAX_DEPTH`] is ever built, so dropping one cannot overflow the stack either.

mod block;

use crate::store::{Builder, StrId, ValueId, FALSE, NULL, TRUE};
use serde_json::{Map, Number, Value};
use std::collections::HashMap;
use std::fmt;
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, ScanError, TScalarStyle};
use yaml_rust2::Yaml;

/// Most collections nested in one another: facts are a few levels deep.
pub const MAX_DEPTH: usize = 64;
/// Most aliases (`*name`) in a document. Psych writes one for each object a fact
/// shares with another; a few dozen in a real fact file.
pub const MAX_ALIASES: usize = 10_000;
/// Most values (scalars, keys and collections, each alias counting the values it
/// repeats) in a document. A real fact file has a few thousand.
pub const MAX_VALUES: usize = 1_000_000;
/// Most bytes of scalar text in a document, aliases counting what they repeat.
pub const MAX_TEXT: usize = 64 << 20;
/// Most values that aliases repeat in a document, on top of [`MAX_VALUES`]: Psych's
/// aliases share a few small objects, while a few hundred bytes of nested aliases
/// would otherwise expand to the full value budget (a million values, half a second).
pub const MAX_ALIASED_VALUES: usize = 100_000;
/// Most bytes of a key made from a collection (`? [a, b]`, said as its JSON). Each
/// level of such keys nested in one another escapes the level below, so their text
/// doubles per level: without a bound, sixty bytes of `? ? ? ...` would ask for
/// gigabytes. Fact keys are names.
pub const MAX_COLLECTION_KEY: usize = 64 << 10;

/// Why a document was refused: not YAML, or over one of the limits. Each says on
/// which line; the caller names the file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum YamlError {
    /// Not YAML: the parser's reason, with the byte, line and column.
    Syntax(ScanError),
    /// Collections nested deeper than `limit` ([`MAX_DEPTH`]); `through_alias` when
    /// an alias would copy a collection that deep.
    TooDeep { limit: usize, line: usize, through_alias: bool },
    /// More than `limit` ([`MAX_ALIASES`]) aliases.
    TooManyAliases { limit: usize, line: usize },
    /// Aliases repeat more than `limit` ([`MAX_ALIASED_VALUES`]) values.
    TooManyAliasedValues { limit: usize, line: usize },
    /// More than `limit` ([`MAX_VALUES`]) values, counting what aliases repeat.
    TooManyValues { limit: usize, line: usize },
    /// More than `limit` ([`MAX_TEXT`]) bytes of text, counting what aliases repeat.
    TooMuchText { limit: usize, line: usize },
    /// A key made from a collection longer than `limit` ([`MAX_COLLECTION_KEY`])
    /// bytes as text.
    CollectionKeyTooLong { limit: usize, line: usize },
    /// An alias refers to the collection that contains it.
    RecursiveAlias { line: usize },
    /// A collection ends that never started (the parser should never say so).
    UnmatchedEnd { line: usize },
}

impl YamlError {
    /// The line the error is about (1-based).
    pub fn line(&self) -> usize {
        match self {
            YamlError::Syntax(e) => e.marker().line(),
            YamlError::TooDeep { line, .. }
            | YamlError::TooManyAliases { line, .. }
            | YamlError::TooManyAliasedValues { line, .. }
            | YamlError::TooManyValues { line, .. }
            | YamlError::TooMuchText { line, .. }
            | YamlError::CollectionKeyTooLong { line, .. }
            | YamlError::RecursiveAlias { line }
            | YamlError::UnmatchedEnd { line } => *line,
        }
    }
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            YamlError::Syntax(e) => return e.fmt(f),
            YamlError::TooDeep { limit, through_alias, .. } => {
                write!(f, "nested deeper than {limit} levels")?;
                if *through_alias {
                    f.write_str(" (through an alias)")?;
                }
            }
            YamlError::TooManyAliases { limit, .. } => write!(f, "more than {limit} aliases")?,
            YamlError::TooManyAliasedValues { limit, .. } => write!(f, "aliases repeat more than {limit} values")?,
            YamlError::TooManyValues { limit, .. } => {
                write!(f, "more than {limit} values (counting what aliases repeat)")?
            }
            YamlError::TooMuchText { limit, .. } => {
                write!(f, "more than {} MiB of text (counting what aliases repeat)", limit >> 20)?
            }
            YamlError::CollectionKeyTooLong { limit, .. } => {
                write!(f, "a key made from a collection is longer than {} KiB as text", limit >> 10)?
            }
            YamlError::RecursiveAlias { .. } => f.write_str("an alias refers to the collection that contains it")?,
            YamlError::UnmatchedEnd { .. } => f.write_str("a collection ends that never started")?,
        }
        write!(f, " at line {}", self.line())
    }
}

impl std::error::Error for YamlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            YamlError::Syntax(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses the first document of `text`; an empty document is `Null`.
///
/// The error says what is wrong and on which line.
pub fn parse(text: &str) -> Result<Value, YamlError> {
    Ok(read(text, TreeSink)?.unwrap_or(Value::Null))
}

/// [`parse`] straight into `builder`, no tree built: the same values (objects
/// sorted, of a key given twice the last value kept), the same limits and errors;
/// an empty document is `NULL`. An aliased value is its anchor's id again.
///
/// On an error, values already interned stay (unreferenced) and the children of
/// the containers left open are on the builder's stack: the caller takes
/// [`Builder::open`] before and calls [`Builder::discard_open`] after a failure.
pub fn decode(text: &str, builder: &mut Builder) -> Result<ValueId, YamlError> {
    if let Some(id) = block::decode(text, builder) {
        return Ok(id);
    }
    Ok(read(text, StoreSink { builder })?.unwrap_or(NULL))
}

/// The first document of `text` through `sink`, within the limits.
fn read<S: Sink>(text: &str, sink: S) -> Result<Option<S::Value>, YamlError> {
    let mut reader = Reader {
        sink,
        stack: Vec::new(),
        spent: Cost::default(),
        aliases: 0,
        aliased_values: 0,
        anchors: HashMap::new(),
        root: None,
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| match e.info() {
            // The scanner's own flow limit (255) can come first: it reads ahead.
            "recursion limit exceeded" => {
                YamlError::TooDeep { limit: MAX_DEPTH, line: e.marker().line(), through_alias: false }
            }
            _ => YamlError::Syntax(e),
        })?;
        match event {
            Event::DocumentEnd | Event::StreamEnd => return Ok(reader.root),
            event => reader.on_event(event, mark)?,
        }
    }
}

/// Where the values of a document go: a serde_json tree ([`parse`]) or a store
/// ([`decode`]). The reader decides everything else (limits, keys, aliases).
trait Sink {
    type Value: Clone;
    type Key;
    /// A collection being filled.
    type Open;
    fn open(&mut self, mapping: bool) -> Self::Open;
    fn push(&mut self, open: &mut Self::Open, value: Self::Value);
    fn insert(&mut self, open: &mut Self::Open, key: Self::Key, value: Self::Value);
    fn close(&mut self, open: Self::Open, mapping: bool) -> Self::Value;
    /// A scalar value, typed as [`resolve`] and [`scalar_value`] say.
    fn scalar(&mut self, yaml: Yaml) -> Self::Value;
    /// A plain key: its text ([`key_string`]).
    fn scalar_key(&mut self, yaml: &Yaml) -> Self::Key;
    /// An aliased or collection key ([`value_key_string`]); `None` when its text
    /// is longer than [`MAX_COLLECTION_KEY`].
    fn value_key(&mut self, value: Self::Value) -> Option<Self::Key>;
}

struct TreeSink;

enum TreeOpen {
    Sequence(Vec<Value>),
    Mapping(Map<String, Value>),
}

impl Sink for TreeSink {
    type Value = Value;
    type Key = String;
    type Open = TreeOpen;

    fn open(&mut self, mapping: bool) -> TreeOpen {
        if mapping {
            TreeOpen::Mapping(Map::new())
        } else {
            TreeOpen::Sequence(Vec::new())
        }
    }

    fn push(&mut self, open: &mut TreeOpen, value: Value) {
        if let TreeOpen::Sequence(items) = open {
            items.push(value);
        }
    }

    fn insert(&mut self, open: &mut TreeOpen, key: String, value: Value) {
        if let TreeOpen::Mapping(map) = open {
            map.insert(key, value);
        }
    }

    fn close(&mut self, open: TreeOpen, _: bool) -> Value {
        match open {
            TreeOpen::Sequence(items) => Value::Array(items),
            TreeOpen::Mapping(map) => Value::Object(map),
        }
    }

    fn scalar(&mut self, yaml: Yaml) -> Value {
        scalar_value(yaml)
    }

    fn scalar_key(&mut self, yaml: &Yaml) -> String {
        key_string(yaml)
    }

    fn value_key(&mut self, value: Value) -> Option<String> {
        value_key_string(value)
    }
}

struct StoreSink<'b> {
    builder: &'b mut Builder,
}

impl Sink for StoreSink<'_> {
    type Value = ValueId;
    type Key = StrId;
    /// Where the collection's children start on the builder's stack.
    type Open = usize;

    fn open(&mut self, _: bool) -> usize {
        self.builder.open()
    }

    fn push(&mut self, _: &mut usize, value: ValueId) {
        self.builder.push_child(value);
    }

    fn insert(&mut self, _: &mut usize, key: StrId, value: ValueId) {
        self.builder.push_child(key);
        self.builder.push_child(value);
    }

    fn close(&mut self, mark: usize, mapping: bool) -> ValueId {
        if mapping {
            self.builder.close_object(mark)
        } else {
            self.builder.close_array(mark)
        }
    }

    fn scalar(&mut self, yaml: Yaml) -> ValueId {
        store_scalar(self.builder, yaml)
    }

    fn scalar_key(&mut self, yaml: &Yaml) -> StrId {
        store_key(self.builder, yaml)
    }

    fn value_key(&mut self, value: ValueId) -> Option<StrId> {
        // Rare (Psych writes no such key): through the tree, to say it as `parse` does.
        let key = value_key_string(self.builder.store().view(value).to_json())?;
        Some(self.builder.string(&key))
    }
}

/// A scalar value into the store: as [`scalar_value`], then `Builder::value`.
fn store_scalar(builder: &mut Builder, yaml: Yaml) -> ValueId {
    match yaml {
        Yaml::Boolean(true) => TRUE,
        Yaml::Boolean(false) => FALSE,
        Yaml::Integer(i) => builder.int(i),
        Yaml::Real(text) => match text.parse::<f64>() {
            Ok(f) if f.is_finite() => builder.float(f),
            _ => builder.string_value(&text),
        },
        Yaml::String(s) => builder.string_value(&s),
        _ => NULL,
    }
}

/// A plain key into the store: its text, as [`key_string`] says it.
fn store_key(builder: &mut Builder, yaml: &Yaml) -> StrId {
    match yaml {
        Yaml::String(s) | Yaml::Real(s) => builder.string(s),
        Yaml::Integer(i) => builder.string(&i.to_string()),
        Yaml::Boolean(b) => builder.string(if *b { "true" } else { "false" }),
        _ => builder.string("~"),
    }
}

/// What a finished node cost, to charge again for each alias of it.
#[derive(Clone, Copy, Default)]
struct Cost {
    values: usize,
    text: usize,
    /// Collections nested in it, itself included: 0 for a scalar.
    height: usize,
}

struct Frame<S: Sink> {
    open: S::Open,
    mapping: bool,
    /// A mapping's key waiting for its value.
    key: Option<S::Key>,
    anchor: usize,
    start: Cost,
    height: usize,
}

struct Reader<S: Sink> {
    sink: S,
    stack: Vec<Frame<S>>,
    /// Values and text so far (`height` unused).
    spent: Cost,
    aliases: usize,
    /// Values that aliases repeated so far.
    aliased_values: usize,
    anchors: HashMap<usize, (S::Value, Cost)>,
    root: Option<S::Value>,
}

impl<S: Sink> Reader<S> {
    fn on_event(&mut self, event: Event, mark: Marker) -> Result<(), YamlError> {
        let line = mark.line();
        match event {
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    return Err(YamlError::TooDeep { limit: MAX_DEPTH, line, through_alias: false });
                }
                self.charge(Cost { values: 1, text: 0, height: 0 }, line)?;
                let start = self.spent;
                let mapping = matches!(event, Event::MappingStart(..));
                let open = self.sink.open(mapping);
                self.stack.push(Frame { open, mapping, key: None, anchor, start, height: 1 });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(Frame { open, mapping, anchor, start, height, .. }) = self.stack.pop() else {
                    return Err(YamlError::UnmatchedEnd { line });
                };
                let value = self.sink.close(open, mapping);
                let cost =
                    Cost { values: self.spent.values - start.values + 1, text: self.spent.text - start.text, height };
                self.finish(value, anchor, cost, line)?;
            }
            Event::Scalar(text, style, anchor, tag) => {
                let cost = Cost { values: 1, text: text.len(), height: 0 };
                self.charge(cost, line)?;
                let value = match self.stack.last_mut() {
                    // A scalar key keeps its text: `1.50:` is the key "1.50".
                    Some(Frame { mapping: true, key: key @ None, .. }) if anchor == 0 => {
                        *key = Some(self.sink.scalar_key(&resolve(text, style, tag)));
                        return Ok(());
                    }
                    _ => self.sink.scalar(resolve(text, style, tag)),
                };
                self.finish(value, anchor, cost, line)?;
            }
            Event::Alias(id) => {
                self.aliases += 1;
                if self.aliases > MAX_ALIASES {
                    return Err(YamlError::TooManyAliases { limit: MAX_ALIASES, line });
                }
                let Some(&(_, cost)) = self.anchors.get(&id) else {
                    return Err(YamlError::RecursiveAlias { line });
                };
                if self.stack.len() + cost.height > MAX_DEPTH {
                    return Err(YamlError::TooDeep { limit: MAX_DEPTH, line, through_alias: true });
                }
                // Charged before it is copied: a bomb is refused before it is built.
                self.aliased_values += cost.values;
                if self.aliased_values > MAX_ALIASED_VALUES {
                    return Err(YamlError::TooManyAliasedValues { limit: MAX_ALIASED_VALUES, line });
                }
                self.charge(cost, line)?;
                let value = self.anchors[&id].0.clone();
                self.finish(value, 0, cost, line)?;
            }
            Event::Nothing | Event::StreamStart | Event::DocumentStart | Event::DocumentEnd | Event::StreamEnd => {}
        }
        Ok(())
    }

    /// Counts `cost`, of a node at `line`, against the document's limits.
    fn charge(&mut self, cost: Cost, line: usize) -> Result<(), YamlError> {
        self.spent.values += cost.values;
        self.spent.text += cost.text;
        if self.spent.values > MAX_VALUES {
            return Err(YamlError::TooManyValues { limit: MAX_VALUES, line });
        }
        if self.spent.text > MAX_TEXT {
            return Err(YamlError::TooMuchText { limit: MAX_TEXT, line });
        }
        Ok(())
    }

    /// Puts a finished node into its parent (or makes it the document), and keeps a
    /// copy of an anchored one for its aliases.
    fn finish(&mut self, value: S::Value, anchor: usize, cost: Cost, line: usize) -> Result<(), YamlError> {
        if anchor != 0 {
            // The copy is memory too (a tree's is; a store's is charged the same).
            self.charge(cost, line)?;
            self.anchors.insert(anchor, (value.clone(), cost));
        }
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(frame) => {
                frame.height = frame.height.max(cost.height + 1);
                if !frame.mapping {
                    self.sink.push(&mut frame.open, value);
                } else {
                    match frame.key.take() {
                        Some(key) => self.sink.insert(&mut frame.open, key, value),
                        None => match self.sink.value_key(value) {
                            Some(key) => frame.key = Some(key),
                            None => return Err(YamlError::CollectionKeyTooLong { limit: MAX_COLLECTION_KEY, line }),
                        },
                    }
                }
            }
        }
        Ok(())
    }
}

/// A scalar's type, as yaml-rust2's loader decides it.
fn resolve(text: String, style: TScalarStyle, tag: Option<Tag>) -> Yaml {
    if style != TScalarStyle::Plain {
        return Yaml::String(text);
    }
    match tag {
        Some(Tag { handle, suffix }) if handle == "tag:yaml.org,2002:" => match suffix.as_str() {
            "bool" => match text.as_str() {
                "true" | "True" | "TRUE" => Yaml::Boolean(true),
                "false" | "False" | "FALSE" => Yaml::Boolean(false),
                _ => Yaml::BadValue,
            },
            "int" => text.parse().map(Yaml::Integer).unwrap_or(Yaml::BadValue),
            "float" => Yaml::Real(text),
            "null" => match text.as_str() {
                "~" | "null" => Yaml::Null,
                _ => Yaml::BadValue,
            },
            _ => Yaml::String(text),
        },
        Some(_) => Yaml::String(text),
        None => plain(text),
    }
}

/// `Yaml::from_str`, without its copy of the text when the scalar is a string that
/// holds no digit: every other type it gives (a number, a `.inf`, a `0x` prefix)
/// needs a digit or is one of [`PLAIN_WORDS`].
fn plain(text: String) -> Yaml {
    if may_be_typed(&text) {
        Yaml::from_str(&text)
    } else {
        Yaml::String(text)
    }
}

/// The plain scalars without a digit that `Yaml::from_str` may read as other than
/// a string.
const PLAIN_WORDS: [&str; 22] = [
    "", "~", "null", "true", "True", "TRUE", "false", "False", "FALSE", ".inf", ".Inf", ".INF", "+.inf", "+.Inf",
    "+.INF", "-.inf", "-.Inf", "-.INF", ".nan", ".NaN", ".NAN", "+",
];

/// Whether plain scalar `text` may be other than a string (see [`plain`]).
fn may_be_typed(text: &str) -> bool {
    text.bytes().any(|b| b.is_ascii_digit()) || PLAIN_WORDS.contains(&text)
}

fn scalar_value(yaml: Yaml) -> Value {
    match yaml {
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Integer(i) => Value::Number(i.into()),
        Yaml::Real(text) => match text.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => Value::Number(n),
            None => Value::String(text),
        },
        Yaml::String(s) => Value::String(s),
        _ => Value::Null,
    }
}

fn key_string(key: &Yaml) -> String {
    match key {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        _ => "~".to_string(),
    }
}

/// The key for an aliased or collection key: its text, or its JSON; `None` past
/// [`MAX_COLLECTION_KEY`] bytes. (The keys inside a collection key were bounded
/// the same way, so its JSON is at most a few times the bound.)
fn value_key_string(key: Value) -> Option<String> {
    match key {
        Value::String(s) => Some(s),
        Value::Null => Some("~".to_string()),
        // At most MAX_DEPTH deep: serde_json's recursion is bounded.
        other => Some(other.to_string()).filter(|text| text.len() <= MAX_COLLECTION_KEY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A fuzz campaign's input: 49 bytes of nested complex keys took 1 s, as each
    /// level's key escaped the level below (2 MB of key at 20 levels).
    #[test]
    fn nested_collection_keys_are_bounded() {
        let text = "? ".repeat(40);
        let error = parse(&text).unwrap_err();
        assert!(matches!(error, YamlError::CollectionKeyTooLong { limit: MAX_COLLECTION_KEY, .. }), "{error}");
        assert!(error.to_string().starts_with("a key made from a collection is longer than 64 KiB"), "{error}");
        let mut builder = crate::store::Builder::new();
        assert_eq!(decode(&text, &mut builder).unwrap_err(), error);
        // A short collection key still reads, as its JSON.
        assert_eq!(parse("? [a, b]\n: 1\n").unwrap(), json!({"[\"a\",\"b\"]": 1}));
    }

    #[test]
    fn ruby_tagged_fact_cache_parses_to_its_mapping() {
        let text = "--- !ruby/object:Puppet::Node::Facts\nname: web1.example.com\nvalues:\n  role: node\n  processors:\n    count: 4\n  load: 0.5\n  virtual: false\ntimestamp: 2026-11-20 10:15:30.123456789 +00:00\n";
        let v = parse(text).unwrap();
        assert_eq!(v["name"], json!("web1.example.com"));
        assert_eq!(v["values"]["processors"]["count"], json!(4));
        assert_eq!(v["values"]["load"], json!(0.5));
        assert_eq!(v["values"]["virtual"], json!(false));
        assert_eq!(v["timestamp"], json!("2026-11-20 10:15:30.123456789 +00:00"));
    }

    #[test]
    fn plain_scalars_are_typed_as_yaml_rust2_types_them() {
        let words = "~ null Null true True TRUE tRUE false no yes x inf nan NaN infinity .inf .Inf .INF +.inf -.inf \
                     -.INF .nan .NaN .NAN + - +x 0x 0xg 0xff 0o 0o7 +1 -1 1 1.5 1e3 e E . .. -. +. a1 \
                     web1.example.com 10.0.0.5 é ∞";
        let words = words.split_whitespace().chain([""]);
        for word in words {
            assert_eq!(plain(word.to_string()), Yaml::from_str(word), "{word:?}");
        }
    }

    #[test]
    fn scalars_keys_and_documents() {
        let v = parse("a: ~\nb: 0x10\nc: '7'\nd: .inf\n1.50: x\n~: y\ne: !!str 3\nf: []\n").unwrap();
        assert_eq!(v, json!({"a": null, "b": 16, "c": "7", "d": ".inf", "1.50": "x", "~": "y", "e": "3", "f": []}));
        assert_eq!(parse("").unwrap(), Value::Null);
        assert_eq!(parse("--- 1\n--- [unclosed\n").unwrap(), json!(1), "only the first document is read");
        assert!(matches!(parse("a: [1\n").unwrap_err(), YamlError::Syntax(e) if e.to_string().contains("line 2")));
    }

    #[test]
    fn aliases_repeat_their_anchor_as_psych_writes_them() {
        let text = "ip: &1 10.0.0.5\nnetworking:\n  ip: *1\n  interfaces: &2\n    eth0: {ip: *1}\ncopy: *2\n*1 : key\n";
        let v = parse(text).unwrap();
        assert_eq!(v["networking"]["ip"], json!("10.0.0.5"));
        assert_eq!(v["copy"], json!({"eth0": {"ip": "10.0.0.5"}}));
        assert_eq!(v["10.0.0.5"], json!("key"));
        let err = parse("a: &a [*a]\n").unwrap_err();
        assert_eq!(err, YamlError::RecursiveAlias { line: 1 });
        assert_eq!(err.to_string(), "an alias refers to the collection that contains it at line 1");
    }

    /// `depth` sequences nested in one another, `[[...[x]...]]`, as block YAML.
    fn nested(depth: usize) -> String {
        (0..depth).map(|level| format!("{}-\n", " ".repeat(level))).collect::<String>()
            + &format!("{}x\n", " ".repeat(depth))
    }

    #[test]
    fn depth_limit_counts_block_flow_and_aliased_collections() {
        let at_limit = parse(&nested(MAX_DEPTH)).unwrap();
        let mut v = &at_limit;
        for _ in 0..MAX_DEPTH {
            v = &v[0];
        }
        assert_eq!(v, &json!("x"));
        let err = parse(&nested(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(err, YamlError::TooDeep { limit: MAX_DEPTH, line: MAX_DEPTH + 1, through_alias: false });
        assert_eq!(err.to_string(), format!("nested deeper than {MAX_DEPTH} levels at line {}", MAX_DEPTH + 1));

        let flow = |depth| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse(&flow(MAX_DEPTH)).is_ok());
        assert!(parse(&flow(MAX_DEPTH + 1)).unwrap_err().to_string().contains("nested deeper than 64 levels"));
        assert!(parse("a: '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\n").is_ok());

        // 63 levels anchored in a list: 64; its alias one level further down is 65.
        let anchored = format!("- &a {}\n- *a\n", flow(MAX_DEPTH - 1));
        assert!(parse(&anchored).is_ok());
        let anchored = format!("- &a {}\n- [*a]\n", flow(MAX_DEPTH - 1));
        let err = parse(&anchored).unwrap_err();
        assert!(matches!(err, YamlError::TooDeep { through_alias: true, .. }), "{err:?}");
        assert!(err.to_string().contains("nested deeper than 64 levels (through an alias)"), "{err}");
    }

    #[test]
    fn alias_count_limit() {
        let aliases = |n: usize| format!("a: &a x\nb: [{}]\n", vec!["*a"; n].join(","));
        assert!(parse(&aliases(MAX_ALIASES)).is_ok());
        let err = parse(&aliases(MAX_ALIASES + 1)).unwrap_err();
        assert_eq!(err, YamlError::TooManyAliases { limit: MAX_ALIASES, line: 2 });
        assert_eq!(err.to_string(), format!("more than {MAX_ALIASES} aliases at line 2"));
    }

    #[test]
    fn aliased_value_limit() {
        // An anchored list of 999 items is 1,000 values; n aliases repeat n * 1,000.
        let repeats = |n: usize| {
            let items = vec!["1"; 999].join(",");
            format!("a: &a [{items}]\nb: [{}]\n", vec!["*a"; n].join(","))
        };
        assert!(parse(&repeats(MAX_ALIASED_VALUES / 1000)).is_ok());
        let err = parse(&repeats(MAX_ALIASED_VALUES / 1000 + 1)).unwrap_err();
        assert_eq!(err, YamlError::TooManyAliasedValues { limit: MAX_ALIASED_VALUES, line: 2 });
        assert_eq!(err.to_string(), format!("aliases repeat more than {MAX_ALIASED_VALUES} values at line 2"));
        // The audit's 300-byte bomb: refused after 100,000 repeated values, not 1,000,000.
        let mut bomb = String::from("a0: &a0 [x,x,x,x,x,x,x,x,x,x]\n");
        for i in 1..9 {
            bomb += &format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(","));
        }
        assert!(parse(&bomb).unwrap_err().to_string().starts_with("aliases repeat more than 100000 values"));
    }

    #[test]
    fn value_and_text_limits_count_what_aliases_repeat() {
        // A list of n values is n + 1: the list and its items; with the mapping and its key, n + 3.
        let list = |n: usize| format!("a: [{}]\n", vec!["1"; n].join(","));
        assert!(parse(&list(MAX_VALUES - 3)).is_ok());
        let err = parse(&list(MAX_VALUES - 2)).unwrap_err();
        assert_eq!(err, YamlError::TooManyValues { limit: MAX_VALUES, line: 1 });
        assert!(err.to_string().starts_with("more than 1000000 values"), "{err}");

        // One 1 MiB string, anchored (its copy counts) and repeated: 2 + (2 + repeats) MiB.
        let text = |repeats: usize| format!("a: &a {}\nb: [{}]\n", "x".repeat(1 << 20), vec!["*a"; repeats].join(","));
        assert!(parse(&text(61)).is_ok());
        let err = parse(&text(62)).unwrap_err();
        assert!(matches!(err, YamlError::TooMuchText { limit: MAX_TEXT, line: 2 }), "{err:?}");
        assert!(err.to_string().starts_with("more than 64 MiB of text"), "{err}");
    }
}
