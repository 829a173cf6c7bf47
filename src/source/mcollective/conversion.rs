//! One inventory reply into an [`Observation`]: its checks (the sender, the status,
//! the facts) and its Marshal values into the store, from a decoded [`RpcReply`]
//! ([`observation`]) or in place from the reply's bytes ([`observation_from_body`]),
//! both with the same refusals and the same store ids; and Marshal values as JSON
//! ([`to_json`]).

use super::inventory;
use super::{AGENTS, CLASSES, COLLECTIVES};
use crate::mcollective::{self as mco, RpcReply};
use crate::source::Observation;
use crate::store::{Builder, ValueId, FALSE, NULL, TRUE};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// Marshal nesting the conversion follows; the client's decoder already bounds it.
pub(super) const MAX_DEPTH: usize = 64;

/// Why a server's inventory reply was ignored (a warning that names the server).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InventoryError {
    /// The sender id cannot be a certname.
    BadIdentity { identity: String },
    /// The agent answered with a failure status.
    Status { code: i64, message: String },
    /// `:facts` is there but not a Hash.
    FactsNotAHash,
    /// The reply has no `:facts`.
    NoFacts,
}

impl fmt::Display for InventoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InventoryError::BadIdentity { identity } => write!(f, "identity {identity:?} is not a valid certname"),
            InventoryError::Status { code, message } => write!(f, "status {code} {message}"),
            InventoryError::FactsNotAHash => f.write_str(":facts is not a Hash"),
            InventoryError::NoFacts => f.write_str("no :facts in the reply"),
        }
    }
}

impl std::error::Error for InventoryError {}

/// A server from its inventory reply; `at` is when it answered, on our clock.
pub fn observation(
    reply: &RpcReply,
    at: i64,
    main_collective: &str,
    builder: &mut Builder,
) -> std::result::Result<Observation, InventoryError> {
    let identity = reply.sender.as_str();
    if !valid_identity(identity) {
        return Err(InventoryError::BadIdentity { identity: identity.to_string() });
    }
    if reply.statuscode != 0 {
        return Err(InventoryError::Status { code: reply.statuscode, message: reply.statusmsg.clone() });
    }
    let facts = match reply.data.get_sym("facts") {
        Some(facts @ mco::Value::Hash(_)) => facts,
        Some(_) => return Err(InventoryError::FactsNotAHash),
        None => return Err(InventoryError::NoFacts),
    };
    let list = |name: &str| -> Vec<Cow<'static, str>> {
        sorted(match reply.data.get_sym(name).map(to_json) {
            Some(Value::Array(items)) => {
                items.into_iter().filter_map(|i| i.as_str().map(|s| Cow::Owned(s.to_string()))).collect()
            }
            _ => Vec::new(),
        })
    };
    let lists = Lists { classes: list("classes"), agents: list("agents"), collectives: list("collectives") };
    let own_main = reply.data.get_sym("main_collective").and_then(mco::Value::as_str);
    let facts = add_to_store(facts, builder, 0);
    Ok(finish(identity, reply.msgtime, at, own_main, main_collective, facts, lists, builder))
}

/// What an inventory lists beside the facts, each sorted without repeats (text
/// borrowed from the body where it is UTF-8 already).
pub(super) struct Lists<'a> {
    pub(super) classes: Vec<Cow<'a, str>>,
    pub(super) agents: Vec<Cow<'a, str>>,
    pub(super) collectives: Vec<Cow<'a, str>>,
}

/// `items` sorted, without repeats: a list as [`Lists`] keeps it.
pub(super) fn sorted(mut items: Vec<Cow<'_, str>>) -> Vec<Cow<'_, str>> {
    // Equal items are the same text: no order among them to keep.
    items.sort_unstable();
    items.dedup();
    items
}

/// The observation of a reply whose facts are in the store: the lists go after them.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
    identity: &str,
    msgtime: i64,
    at: i64,
    own_main: Option<&str>,
    main_collective: &str,
    facts: ValueId,
    lists: Lists<'_>,
    builder: &mut Builder,
) -> Observation {
    let own_main = own_main.unwrap_or(main_collective);
    let Lists { classes, agents, collectives } = lists;
    let others: Vec<&str> =
        collectives.iter().map(|c| c.as_ref()).filter(|c| *c != own_main && *c != main_collective).collect();
    let environment_hint = match others.as_slice() {
        [only] => Some((*only).to_string()),
        _ => None,
    };
    // `{agents, classes, collectives}` in key order, into the store as
    // `Builder::object` adds a JSON object: each key, then its Array's items.
    let extra_mark = builder.open();
    for (key, items) in [(AGENTS, &agents), (CLASSES, &classes), (COLLECTIVES, &collectives)] {
        let key = builder.string(key);
        builder.push_child(key);
        let mark = builder.open();
        for item in items {
            let id = builder.string_value(item);
            builder.push_child(id);
        }
        let array = builder.close_array(mark);
        builder.push_child(array);
    }
    let extra = builder.close_object(extra_mark);
    Observation {
        certname: identity.to_string(),
        facts,
        // The daemon's clock, but never ahead of ours: a far-future `:msgtime`
        // (unsigned) would keep these facts fresh forever.
        timestamp: if msgtime > 0 { msgtime.min(at) } else { at },
        extra,
        answered_at: Some(at),
        environment_hint,
    }
}

/// Why [`observation_from_body`] gave no observation.
#[derive(Debug)]
pub enum BodyError {
    /// The inner body is not an RPC reply: the client counts it as malformed.
    Malformed(mco::Error),
    /// A reply the source refuses, with its reason.
    Inventory(InventoryError),
    /// Outside the borrowed reader's subset: decode it with
    /// [`RpcReply::from_reply`] and [`observation`].
    Unsupported,
}

impl From<mco::Error> for BodyError {
    fn from(e: mco::Error) -> BodyError {
        BodyError::Malformed(e)
    }
}

pub(super) fn valid_identity(identity: &str) -> bool {
    !identity.is_empty() && identity.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A reply's inner body, and what reading it needs: who sent it and when (its
/// `:senderid` and `:msgtime`), when it arrived, the limits on it, and the main
/// collective.
#[derive(Clone, Copy, Debug)]
pub struct InnerBody<'a> {
    pub sender: &'a str,
    pub msgtime: i64,
    pub bytes: &'a [u8],
    pub limits: mco::marshal::DecodeLimits,
    /// When the reply arrived.
    pub at: i64,
    pub main_collective: &'a str,
}

/// [`RpcReply::from_reply`] then [`observation`], on the inner body's bytes in place:
/// the same refusals, and the same facts put in the store in the same order (so the
/// same ids), without Marshal values or copies of the strings. One pass checks the
/// body and reads it ([`inventory`]); a body whose status follows its facts takes two.
pub fn observation_from_body(body: InnerBody, builder: &mut Builder) -> std::result::Result<Observation, BodyError> {
    match inventory::read(body, builder) {
        inventory::Read::Done(got) => got,
        inventory::Read::TwoPasses => observation_two_passes(body, builder),
    }
}

/// [`observation_from_body`] in two passes, the whole body checked then read in
/// place: for a body whose status follows its facts, and the reference the one pass
/// is measured against (benches/inventory.rs).
pub fn observation_two_passes(body: InnerBody, builder: &mut Builder) -> std::result::Result<Observation, BodyError> {
    let InnerBody { sender, msgtime, bytes, limits, at, main_collective } = body;
    use mco::marshal_reader::{Doc, Item, Scan};
    let doc = match Doc::scan(bytes, limits) {
        Ok(doc) => doc,
        Err(Scan::Invalid(e)) => return Err(BodyError::Malformed(*e)),
        Err(Scan::Unsupported(_)) => return Err(BodyError::Unsupported),
    };
    let root = doc.root();
    let malformed = |key: &str, why: &str| BodyError::Malformed(mco::Error::Marshal(format!(":{key} {why}")));
    if !matches!(doc.item(root)?.0, Item::Hash(_)) {
        return Err(malformed("(message)", "is not a Hash"));
    }
    let [statuscode, statusmsg, data] = doc.get_syms(root, ["statuscode", "statusmsg", "data"])?;
    let statuscode = match statuscode {
        Some(pos) => match doc.item(pos)?.0 {
            Item::Int(i) => i,
            _ => return Err(malformed("statuscode", "not an Integer")),
        },
        None => return Err(malformed("statuscode", "missing")),
    };
    let statusmsg = match statusmsg {
        Some(pos) => match doc.item(pos)?.0 {
            Item::Str(bytes, _) => String::from_utf8_lossy(bytes).into_owned(),
            _ => String::new(),
        },
        None => return Err(malformed("statusmsg", "missing")),
    };
    if !valid_identity(sender) {
        return Err(BodyError::Inventory(InventoryError::BadIdentity { identity: sender.to_string() }));
    }
    if statuscode != 0 {
        return Err(BodyError::Inventory(InventoryError::Status { code: statuscode, message: statusmsg }));
    }
    let names = ["facts", "classes", "agents", "collectives", "main_collective"];
    let [facts, classes, agents, collectives, own_main] = match data {
        Some(data) => doc.get_syms(data, names)?,
        None => [None; 5],
    };
    let facts = match facts {
        Some(pos) if matches!(doc.item(pos)?.0, Item::Hash(_)) => pos,
        Some(_) => return Err(BodyError::Inventory(InventoryError::FactsNotAHash)),
        None => return Err(BodyError::Inventory(InventoryError::NoFacts)),
    };
    let list = |at: Option<usize>| -> mco::Result<Vec<Cow<'_, str>>> {
        let mut items = Vec::new();
        if let Some(pos) = at {
            for item in doc.items(pos)?.unwrap_or_default() {
                match doc.item(item)?.0 {
                    Item::Str(bytes, _) | Item::Sym(bytes) => items.push(crate::store::lossy_text(bytes)),
                    _ => {}
                }
            }
        }
        Ok(sorted(items))
    };
    let lists = Lists { classes: list(classes)?, agents: list(agents)?, collectives: list(collectives)? };
    let own_main = match own_main {
        Some(pos) => match doc.item(pos)?.0 {
            Item::Str(bytes, _) => std::str::from_utf8(bytes).ok(),
            _ => None,
        },
        None => None,
    };
    let facts = DocToStore { doc: &doc, builder }.value(facts, 0)?.0;
    Ok(finish(sender, msgtime, at, own_main, main_collective, facts, lists, builder))
}

/// [`add_to_store`] on a checked Marshal document, value by value in stream order.
struct DocToStore<'d, 'a, 'b> {
    doc: &'d mco::marshal_reader::Doc<'a>,
    builder: &'b mut Builder,
}

impl DocToStore<'_, '_, '_> {
    /// The id of the value at `pos`, and where it ends.
    fn value(&mut self, pos: usize, depth: usize) -> mco::Result<(ValueId, usize)> {
        use mco::marshal_reader::Item;
        let target = self.doc.deref(pos)?;
        if target != pos {
            let id = self.value(target, depth)?.0;
            return Ok((id, self.doc.skip(pos)?));
        }
        if depth > MAX_DEPTH {
            return Ok((NULL, self.doc.skip(pos)?));
        }
        let (item, mut next) = self.doc.head(pos)?;
        let id = match item {
            Item::Nil | Item::Other(_) => NULL,
            Item::Bool(true) => TRUE,
            Item::Bool(false) => FALSE,
            Item::Int(i) => self.builder.int(i),
            Item::Float(f) if f.is_finite() => self.builder.float(f),
            Item::Float(_) => NULL,
            Item::Str(bytes, _) | Item::Sym(bytes) => self.builder.string_value(&String::from_utf8_lossy(bytes)),
            Item::Array(n) => {
                let mark = self.builder.open();
                for _ in 0..n {
                    let (id, end) = self.value(next, depth + 1)?;
                    self.builder.push_child(id);
                    next = end;
                }
                self.builder.close_array(mark)
            }
            Item::Hash(n) => {
                let mark = self.builder.open();
                for _ in 0..n {
                    let key = if depth + 1 > MAX_DEPTH {
                        next = self.doc.skip(next)?;
                        self.builder.string("null")
                    } else {
                        let target = self.doc.deref(next)?;
                        match self.doc.head(target)? {
                            (Item::Str(bytes, _) | Item::Sym(bytes), end) => {
                                next = if target == next { end } else { self.doc.skip(next)? };
                                self.builder.string(&String::from_utf8_lossy(bytes))
                            }
                            _ => {
                                let key = self.doc.value(next)?;
                                next = self.doc.skip(next)?;
                                match convert(&key, depth + 1) {
                                    Value::String(s) => self.builder.string(&s),
                                    other => self.builder.string(&other.to_string()),
                                }
                            }
                        }
                    };
                    let (value, end) = self.value(next, depth + 1)?;
                    next = end;
                    self.builder.push_child(key);
                    self.builder.push_child(value);
                }
                self.builder.close_object(mark)
            }
        };
        Ok((id, next))
    }
}

/// A Ruby value as JSON: Strings and Symbols become strings, Hash keys strings.
pub fn to_json(value: &mco::Value) -> Value {
    convert(value, 0)
}

/// [`to_json`]'s value added to the store, without the JSON tree (the same value:
/// `facts_go_to_the_store_as_to_json_reads_them` and the inventory_reply fuzz target
/// hold one to the other).
fn add_to_store(value: &mco::Value, builder: &mut Builder, depth: usize) -> ValueId {
    use mco::Value as R;
    if depth > MAX_DEPTH {
        return NULL;
    }
    match value {
        R::Nil | R::Other(_) => NULL,
        R::Bool(b) => {
            if *b {
                TRUE
            } else {
                FALSE
            }
        }
        R::Int(i) => builder.int(*i),
        R::Float(f) if f.is_finite() => builder.float(*f),
        R::Float(_) => NULL,
        R::Str { bytes, .. } => builder.string_value(&String::from_utf8_lossy(bytes)),
        R::Sym(s) => builder.string_value(s),
        R::Array(items) => {
            let mark = builder.open();
            for item in items {
                let id = add_to_store(item, builder, depth + 1);
                builder.push_child(id);
            }
            builder.close_array(mark)
        }
        R::Hash(pairs) => {
            let mark = builder.open();
            for (k, v) in pairs {
                let key = match k {
                    _ if depth + 1 > MAX_DEPTH => builder.string("null"),
                    R::Str { bytes, .. } => builder.string(&String::from_utf8_lossy(bytes)),
                    R::Sym(s) => builder.string(s),
                    other => match convert(other, depth + 1) {
                        Value::String(s) => builder.string(&s),
                        other => builder.string(&other.to_string()),
                    },
                };
                let value = add_to_store(v, builder, depth + 1);
                builder.push_child(key);
                builder.push_child(value);
            }
            builder.close_object(mark)
        }
    }
}

pub(super) fn convert(value: &mco::Value, depth: usize) -> Value {
    use mco::Value as R;
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    match value {
        R::Nil | R::Other(_) => Value::Null,
        R::Bool(b) => Value::Bool(*b),
        R::Int(i) => Value::from(*i),
        R::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        R::Str { bytes, .. } => Value::String(String::from_utf8_lossy(bytes).into_owned()),
        R::Sym(s) => Value::String(s.clone()),
        R::Array(items) => Value::Array(items.iter().map(|i| convert(i, depth + 1)).collect()),
        R::Hash(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let key = match convert(k, depth + 1) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, convert(v, depth + 1))
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::mcollective::AGENT;
    use crate::source::SourceRead;
    use serde_json::json;

    fn ruby_facts() -> mco::Value {
        use mco::Value as R;
        R::Hash(vec![
            (R::str("role"), R::str("node")),
            (R::str("processorcount"), R::str("4")),
            (R::str("os"), R::Hash(vec![(R::str("release"), R::Hash(vec![(R::str("full"), R::str("12.5"))]))])),
            (R::str("addresses"), R::Array(vec![R::str("10.0.0.1"), R::str("10.0.0.2")])),
        ])
    }

    fn reply(sender: &str, collectives: &[&str]) -> RpcReply {
        use mco::Value as R;
        let strings = |items: &[&str]| R::Array(items.iter().map(|s| R::str(*s)).collect());
        RpcReply {
            sender: sender.into(),
            agent: AGENT.into(),
            msgtime: 1_700_000_000,
            statuscode: 0,
            statusmsg: "OK".into(),
            data: R::Hash(vec![
                (R::sym("agents"), strings(&["rpcutil", "discovery", "puppet"])),
                (R::sym("facts"), ruby_facts()),
                (R::sym("classes"), strings(&["settings", "role::node", "ntp", "ntp"])),
                (R::sym("version"), R::str("2.12.5")),
                (R::sym("collectives"), strings(collectives)),
                (R::sym("main_collective"), R::str("mcollective")),
            ]),
        }
    }

    #[test]
    fn an_inventory_reply_becomes_facts_plus_classes_agents_and_collectives() {
        let (o, read) = observe(&reply("web1.example.com", &["staging", "mcollective"]), 1_700_000_005).unwrap();
        assert_eq!(o.certname, "web1.example.com");
        let node = read.node(&o, None);
        assert_eq!(
            Value::Object(node.facts.clone()),
            json!({"role": "node", "processorcount": "4", "os": {"release": {"full": "12.5"}},
                   "addresses": ["10.0.0.1", "10.0.0.2"]})
        );
        assert_eq!(node.extra[CLASSES], json!(["ntp", "role::node", "settings"]));
        assert_eq!(node.extra[AGENTS], json!(["discovery", "puppet", "rpcutil"]));
        assert_eq!(node.extra[COLLECTIVES], json!(["mcollective", "staging"]));
        assert_eq!((o.timestamp, o.answered_at), (1_700_000_000, Some(1_700_000_005)));
        assert_eq!(o.environment_hint.as_deref(), Some("staging"));

        // The hint only decides when neither the facts nor the master name the environment.
        assert_eq!(node.environment, "staging");
        assert_eq!(read.node(&o, Some("dev")).environment, "dev");
        let (only_main, _) = observe(&reply("a.example.com", &["mcollective"]), 1).unwrap();
        assert_eq!(only_main.environment_hint, None);
        let (two, _) = observe(&reply("a.example.com", &["mcollective", "x", "y"]), 1).unwrap();
        assert_eq!(two.environment_hint, None);
    }

    #[test]
    fn facts_are_never_dated_in_the_future() {
        let mut r = reply("web1.example.com", &["mcollective"]);
        r.msgtime = 4_102_444_800; // 2100
        let (o, _) = observe(&r, 1_700_000_005).unwrap();
        assert_eq!(o.timestamp, 1_700_000_005);
        r.msgtime = 1_700_000_001;
        assert_eq!(observe(&r, 1_700_000_005).unwrap().0.timestamp, 1_700_000_001);
    }

    #[test]
    fn classes_and_friends_are_queryable_and_never_hide_a_fact() {
        let (o, read) = observe(&reply("web1.example.com", &["mcollective"]), 1).unwrap();
        let node = read.node(&o, None);
        let q = crate::Query::parse(&["mcollective::classes=role::node", "os.release.full>=12"]).unwrap();
        assert!(q.matches(&node));
        let q = crate::Query::parse(&["mcollective::agents=puppetd"]).unwrap();
        assert!(!q.matches(&node));
        let q = crate::Query::parse(&["processorcount>3"]).unwrap();
        assert!(q.matches(&node), "numeric strings compare numerically");
    }

    #[test]
    fn bad_replies_are_refused_with_a_reason() {
        let mut r = reply("bad identity", &["mcollective"]);
        let err = observe(&r, 1).unwrap_err();
        assert_eq!(err, InventoryError::BadIdentity { identity: "bad identity".into() });
        assert_eq!(err.to_string(), "identity \"bad identity\" is not a valid certname");
        r.sender = "ok.example.com".into();
        r.statuscode = 5;
        r.statusmsg = "boom".into();
        let err = observe(&r, 1).unwrap_err();
        assert_eq!(err, InventoryError::Status { code: 5, message: "boom".into() });
        assert_eq!(err.to_string(), "status 5 boom");
        r.statuscode = 0;
        r.data = mco::Value::Hash(vec![]);
        assert_eq!(observe(&r, 1).unwrap_err(), InventoryError::NoFacts);
    }

    fn observe(reply: &RpcReply, at: i64) -> std::result::Result<(Observation, SourceRead), InventoryError> {
        let mut read = SourceRead::default();
        let o = observation(reply, at, "mcollective", &mut read.builder)?;
        Ok((o, read))
    }

    #[test]
    fn facts_go_to_the_store_as_to_json_reads_them() {
        use mco::Value as R;
        let mut deep = R::Hash(vec![(R::str("leaf"), R::Int(1))]);
        for level in 0..70 {
            deep = R::Hash(vec![(R::sym(format!("l{level}")), deep), (R::Int(level), R::Array(vec![R::Nil]))]);
        }
        let values = [
            ruby_facts(),
            R::Hash(
                [
                    odd_values(),
                    vec![
                        (R::Nil, R::Float(f64::NAN)),
                        (R::Array(vec![R::Int(1), R::str("x")]), R::Float(f64::INFINITY)),
                        (R::str("a"), R::str("the last of a repeated key")),
                        (R::Bool(false), R::Hash(vec![])),
                    ],
                ]
                .concat(),
            ),
            deep,
        ];
        for value in values {
            let mut builder = Builder::new();
            let id = add_to_store(&value, &mut builder, 0);
            assert_eq!(builder.store().view(id).to_json(), to_json(&value));
        }
    }

    /// Keys and values of every kind a reply may hold.
    fn odd_values() -> Vec<(mco::Value, mco::Value)> {
        use mco::Value as R;
        vec![
            (R::sym("a"), R::Int(-3)),
            (R::Int(1), R::Float(0.5)),
            (R::str("n"), R::Nil),
            (R::str("b"), R::Bool(true)),
            (R::str("o"), R::Other("Object".into())),
            (R::str("bin"), R::binary(vec![0xff, b'a'])),
        ]
    }

    #[test]
    fn marshal_values_convert_to_json() {
        let v = mco::Value::Hash(odd_values());
        assert_eq!(to_json(&v), json!({"a": -3, "1": 0.5, "n": null, "b": true, "o": null, "bin": "\u{fffd}a"}));
    }
}
