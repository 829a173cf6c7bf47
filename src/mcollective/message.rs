//! mcollective 2.x message bodies (securityprovider = psk).
//!
//! Two Marshal layers: an outer Hash with symbol keys that carries routing
//! data and the `:hash` signature, and an inner body (the RPC request or
//! reply, or "ping"/"pong" for discovery) kept as the exact bytes that were
//! signed. Requests are written the way mco 2.12.5 writes them (key order,
//! string encodings, shared String objects) so they are byte-identical to
//! captured traffic for the same inputs.

use super::error::{Error, Result};
use super::marshal::{self, DecodeLimits, Encoder, Node, Value};
use super::marshal_reader::{Doc, Item, Scan};
use super::psk;

/// The operators a fact filter may use.
pub const FACT_OPERATORS: [&str; 7] = ["==", "=~", "!=", "<", ">", "<=", ">="];

/// One fact filter entry: `{:fact=>.., :value=>.., :operator=>..}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactFilter {
    pub fact: String,
    pub value: String,
    /// One of [`FACT_OPERATORS`]; a regex is `=~` with value `"/re/"`.
    pub operator: String,
}

impl FactFilter {
    /// `fact == value`.
    pub fn eq(fact: impl Into<String>, value: impl Into<String>) -> FactFilter {
        FactFilter::new(fact, "==", value)
    }

    pub fn new(fact: impl Into<String>, operator: impl Into<String>, value: impl Into<String>) -> FactFilter {
        FactFilter { fact: fact.into(), value: value.into(), operator: operator.into() }
    }
}

/// The `:filter` of a request: each non-empty part must match (AND);
/// entries inside `identity` are ORed; `/re/` values are regexes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    pub fact: Vec<FactFilter>,
    pub cf_class: Vec<String>,
    pub agent: Vec<String>,
    pub identity: Vec<String>,
    /// Compound statements, passed through as mco builds them.
    pub compound: Vec<Value>,
    /// mco adds the target collective to discovery filters.
    pub collective: Option<String>,
}

impl Filter {
    /// Checks operators, so a typo fails here instead of matching nothing.
    pub fn validate(&self) -> Result<()> {
        for f in &self.fact {
            if !FACT_OPERATORS.contains(&f.operator.as_str()) {
                return Err(Error::InvalidInput(format!(
                    "fact filter {:?} has unknown operator {:?}",
                    f.fact, f.operator
                )));
            }
            if f.fact.is_empty() {
                return Err(Error::InvalidInput("fact filter with empty fact name".into()));
            }
        }
        Ok(())
    }

    /// Reads a filter Hash (for tests and fake daemons). Unknown keys are ignored.
    pub fn from_value(v: &Value) -> Result<Filter> {
        if v.as_hash().is_none() {
            return Err(Error::message("filter", "is not a Hash"));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            match v.get_str(key) {
                None => Ok(Vec::new()),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|i| {
                        i.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| Error::message(format!("filter {key}"), "not a String"))
                    })
                    .collect(),
                Some(_) => Err(Error::message(format!("filter {key}"), "not an Array")),
            }
        };
        let mut fact = Vec::new();
        if let Some(items) = v.get_str("fact") {
            let items = items.as_array().ok_or_else(|| Error::message("filter fact", "not an Array"))?;
            for item in items {
                let field = |k: &str| -> Result<String> {
                    item.get_sym(k)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| Error::message(format!("filter fact :{k}"), "missing"))
                };
                fact.push(FactFilter { fact: field("fact")?, value: field("value")?, operator: field("operator")? });
            }
        }
        Ok(Filter {
            fact,
            cf_class: strings("cf_class")?,
            agent: strings("agent")?,
            identity: strings("identity")?,
            compound: v.get_str("compound").and_then(Value::as_array).map(<[Value]>::to_vec).unwrap_or_default(),
            collective: v.get_str("collective").and_then(Value::as_str).map(str::to_string),
        })
    }
}

/// Places the filter in `e`; returns the filter node, the node of the
/// agent-filter entry equal to `agent` and the collective node, which the
/// outer hash shares as Ruby does.
fn encode_filter(e: &mut Encoder, f: &Filter, agent: &str) -> Result<(Node, Option<Node>, Option<Node>)> {
    let strings = |e: &mut Encoder, items: &[String]| -> Result<(Node, Vec<Node>)> {
        let nodes = items.iter().map(|s| e.value(&Value::str(s.as_str()))).collect::<Result<Vec<_>>>()?;
        Ok((e.array(&nodes)?, nodes))
    };
    let mut pairs = Vec::new();
    let key = e.value(&Value::str("fact"))?;
    let mut facts = Vec::new();
    for f in &f.fact {
        let entry = Value::Hash(vec![
            (Value::sym("fact"), Value::str(f.fact.as_str())),
            (Value::sym("value"), Value::str(f.value.as_str())),
            (Value::sym("operator"), Value::str(f.operator.as_str())),
        ]);
        facts.push(e.value(&entry)?);
    }
    pairs.push((key, e.array(&facts)?));
    let key = e.value(&Value::str("cf_class"))?;
    pairs.push((key, strings(e, &f.cf_class)?.0));
    let key = e.value(&Value::str("agent"))?;
    let (agents, agent_nodes) = strings(e, &f.agent)?;
    let agent_node = f.agent.iter().position(|a| a == agent).and_then(|i| agent_nodes.get(i).copied());
    pairs.push((key, agents));
    let key = e.value(&Value::str("identity"))?;
    pairs.push((key, strings(e, &f.identity)?.0));
    let key = e.value(&Value::str("compound"))?;
    pairs.push((key, e.value(&Value::Array(f.compound.clone()))?));
    let mut collective_node = None;
    if let Some(c) = &f.collective {
        let key = e.value(&Value::str("collective"))?;
        let node = e.value(&Value::str(c.as_str()))?;
        collective_node = Some(node);
        pairs.push((key, node));
    }
    Ok((e.hash(&pairs)?, agent_node, collective_node))
}

/// An outgoing request (outer layer). `body` is the inner Marshal stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub senderid: String,
    pub requestid: String,
    pub filter: Filter,
    pub collective: String,
    pub agent: String,
    pub callerid: String,
    pub ttl: i64,
    pub msgtime: i64,
    pub body: Vec<u8>,
}

impl Request {
    /// The signed outer Marshal stream.
    pub fn encode(&self, psk: &str) -> Result<Vec<u8>> {
        check_callerid(&self.callerid)?;
        self.filter.validate()?;
        let mut e = Encoder::new();
        let mut pairs = Vec::new();
        let put = |e: &mut Encoder, pairs: &mut Vec<(Node, Node)>, k: &str, v: Node| {
            let k = e.value(&Value::sym(k))?;
            pairs.push((k, v));
            Ok::<(), Error>(())
        };
        let v = e.value(&Value::binary(self.body.clone()))?;
        put(&mut e, &mut pairs, "body", v)?;
        let v = e.value(&Value::str(self.senderid.as_str()))?;
        put(&mut e, &mut pairs, "senderid", v)?;
        let v = e.value(&Value::ascii(self.requestid.as_str()))?;
        put(&mut e, &mut pairs, "requestid", v)?;
        let (filter, agent_node, collective_node) = encode_filter(&mut e, &self.filter, &self.agent)?;
        put(&mut e, &mut pairs, "filter", filter)?;
        let v = match collective_node {
            Some(n) if self.filter.collective.as_deref() == Some(self.collective.as_str()) => n,
            _ => e.value(&Value::str(self.collective.as_str()))?,
        };
        put(&mut e, &mut pairs, "collective", v)?;
        let v = match agent_node {
            Some(n) => n,
            None => e.value(&Value::str(self.agent.as_str()))?,
        };
        put(&mut e, &mut pairs, "agent", v)?;
        let v = e.value(&Value::str(self.callerid.as_str()))?;
        put(&mut e, &mut pairs, "callerid", v)?;
        let v = e.value(&Value::Int(self.ttl))?;
        put(&mut e, &mut pairs, "ttl", v)?;
        let v = e.value(&Value::Int(self.msgtime))?;
        put(&mut e, &mut pairs, "msgtime", v)?;
        let v = e.value(&Value::ascii(psk::sign(&self.body, psk)))?;
        put(&mut e, &mut pairs, "hash", v)?;
        let root = e.hash(&pairs)?;
        e.finish(root)
    }

    /// Reads an outer request; returns it and its `:hash` (unverified).
    /// Used by tests and fake daemons.
    pub fn decode(outer: &[u8], limits: DecodeLimits) -> Result<(Request, String)> {
        let v = marshal::decode_with(outer, limits)?;
        let filter = Filter::from_value(v.get_sym("filter").ok_or_else(|| Error::message(":filter", "missing"))?)?;
        let req = Request {
            senderid: text(&v, "senderid")?,
            requestid: text(&v, "requestid")?,
            filter,
            collective: text(&v, "collective")?,
            agent: text(&v, "agent")?,
            callerid: text(&v, "callerid")?,
            ttl: int(&v, "ttl")?,
            msgtime: int(&v, "msgtime")?,
            body: bytes(&v, "body")?,
        };
        Ok((req, text(&v, "hash")?))
    }
}

fn field<'v>(v: &'v Value, key: &str) -> Result<&'v Value> {
    if v.as_hash().is_none() {
        return Err(Error::message("(message)", "is not a Hash"));
    }
    v.get_sym(key).ok_or_else(|| Error::message(format!(":{key}"), "missing"))
}

fn text(v: &Value, key: &str) -> Result<String> {
    field(v, key)?.as_str().map(str::to_string).ok_or_else(|| Error::message(format!(":{key}"), "not a UTF-8 String"))
}

fn bytes(v: &Value, key: &str) -> Result<Vec<u8>> {
    field(v, key)?.as_bytes().map(<[u8]>::to_vec).ok_or_else(|| Error::message(format!(":{key}"), "not a String"))
}

fn int(v: &Value, key: &str) -> Result<i64> {
    field(v, key)?.as_int().ok_or_else(|| Error::message(format!(":{key}"), "not an Integer"))
}

/// Daemons reject callerids not matching `/^\w+=[\w.\-]+$/`.
pub fn check_callerid(callerid: &str) -> Result<()> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = match callerid.split_once('=') {
        Some((k, v)) => {
            !k.is_empty() && k.chars().all(word) && !v.is_empty() && v.chars().all(|c| word(c) || c == '.' || c == '-')
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("callerid {callerid:?} does not match /^\\w+=[\\w.\\-]+$/")))
    }
}

/// A fresh request id: 32 random lowercase hex digits.
pub fn new_request_id() -> Result<String> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| Error::InvalidInput(format!("no OS randomness: {e}")))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// The inner body of discovery: the String "ping".
pub fn discovery_body() -> Result<Vec<u8>> {
    marshal::encode(&Value::str("ping"))
}

/// The inner body of an RPC request:
/// `{:agent, :action, :caller, :data=>{inputs..., :process_results=>..}}`.
/// Encodings follow mco 2.12.5 (action US-ASCII, the rest UTF-8).
pub fn rpc_body(
    agent: &str,
    action: &str,
    caller: &str,
    inputs: &[(String, Value)],
    process_results: bool,
) -> Result<Vec<u8>> {
    if agent.is_empty() || action.is_empty() {
        return Err(Error::InvalidInput("agent and action must not be empty".into()));
    }
    let mut data: Vec<(Value, Value)> = inputs
        .iter()
        .filter(|(k, _)| k != "process_results")
        .map(|(k, v)| (Value::sym(k.as_str()), v.clone()))
        .collect();
    data.push((Value::sym("process_results"), Value::Bool(process_results)));
    let action_value = if action.is_ascii() { Value::ascii(action) } else { Value::str(action) };
    marshal::encode(&Value::Hash(vec![
        (Value::sym("agent"), Value::str(agent)),
        (Value::sym("action"), action_value),
        (Value::sym("caller"), Value::str(caller)),
        (Value::sym("data"), Value::Hash(data)),
    ]))
}

/// A reply's outer layer. `body` is the inner Marshal stream as signed.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub senderid: String,
    pub requestid: String,
    pub senderagent: String,
    pub msgtime: i64,
    pub body: Body,
    /// The verified PSK signature (MD5 of body and key) as a number: equal bodies
    /// have equal signatures, so a refresh knows an unchanged body without reading
    /// it again. `None` for a reply this process built.
    pub signature: Option<u128>,
}

impl Reply {
    /// Reads an outer reply and checks its `:hash` against `psk`, on the body's
    /// bytes as they lie in `outer`.
    pub fn decode_verified(outer: &[u8], psk: &str, limits: DecodeLimits) -> Result<Reply> {
        match ReplyRef::decode_verified(outer, psk, limits) {
            Ok(r) => Ok(r.to_owned()),
            Err(Unread::Error(e)) => Err(e),
            Err(Unread::Unsupported) => Reply::decode_verified_via_values(outer, psk, limits),
        }
    }

    /// [`Reply::decode_verified`] through marshal-rs's values: for streams outside
    /// [`marshal_reader`](super::marshal_reader)'s subset, and the reference the new
    /// reader is held to.
    pub fn decode_verified_via_values(outer: &[u8], psk: &str, limits: DecodeLimits) -> Result<Reply> {
        let v = marshal::decode_with(outer, limits)?;
        let reply = Reply {
            senderid: text(&v, "senderid")?,
            requestid: text(&v, "requestid")?,
            senderagent: text(&v, "senderagent")?,
            msgtime: int(&v, "msgtime")?,
            body: bytes(&v, "body")?.into(),
            signature: None,
        };
        let hash = text(&v, "hash")?;
        if !psk::verify(&reply.body, psk, &hash) {
            return Err(Error::Signature(format!(
                "reply from {} for request {} has a bad :hash",
                reply.senderid, reply.requestid
            )));
        }
        Ok(Reply { signature: psk::signature_number(&hash), ..reply })
    }

    /// The signed outer stream, as a daemon writes it (for fake daemons in tests).
    pub fn encode(&self, psk: &str) -> Result<Vec<u8>> {
        marshal::encode(&Value::Hash(vec![
            (Value::sym("senderid"), Value::str(self.senderid.as_str())),
            (Value::sym("requestid"), Value::ascii(self.requestid.as_str())),
            (Value::sym("senderagent"), Value::str(self.senderagent.as_str())),
            (Value::sym("msgtime"), Value::Int(self.msgtime)),
            (Value::sym("body"), Value::binary(self.body.to_vec())),
            (Value::sym("hash"), Value::ascii(psk::sign(&self.body, psk))),
        ]))
    }

    /// The decoded inner body.
    pub fn inner(&self, limits: DecodeLimits) -> Result<Value> {
        marshal::decode_with(&self.body, limits)
    }
}

/// A reply's inner body where it arrived: a range of the outer message's bytes,
/// which it keeps. A burst of 10,000 inventories is 140 MB of bodies; a reply kept
/// this way costs no second copy of them.
#[derive(Clone, Default)]
pub struct Body {
    outer: Vec<u8>,
    range: std::ops::Range<usize>,
}

impl Body {
    /// The body at `range` of `outer`.
    fn within(outer: Vec<u8>, range: std::ops::Range<usize>) -> Body {
        assert!(range.start <= range.end && range.end <= outer.len(), "a body lies within its message");
        Body { outer, range }
    }
}

impl From<Vec<u8>> for Body {
    fn from(bytes: Vec<u8>) -> Body {
        let range = 0..bytes.len();
        Body { outer: bytes, range }
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.outer[self.range.clone()]
    }
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        **self == **other
    }
}

impl Eq for Body {}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        <[u8] as std::fmt::Debug>::fmt(self, f)
    }
}

/// Why [`ReplyRef::decode_verified`] gave no reply.
#[derive(Debug)]
pub enum Unread {
    /// What [`Reply::decode_verified_via_values`] says too.
    Error(Error),
    /// Outside the borrowed reader's subset: decode through the values.
    Unsupported,
}

impl From<Error> for Unread {
    fn from(e: Error) -> Unread {
        Unread::Error(e)
    }
}

/// A reply's outer layer read in place: `body` is the signed slice of the input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplyRef<'a> {
    pub senderid: &'a str,
    pub requestid: &'a str,
    pub senderagent: &'a str,
    pub msgtime: i64,
    pub body: &'a [u8],
    /// As [`Reply::signature`].
    pub signature: Option<u128>,
}

impl<'a> ReplyRef<'a> {
    /// [`Reply::decode_verified`] without building values or copying the body: the
    /// same fields and checks, in the same order.
    pub fn decode_verified(outer: &'a [u8], psk: &str, limits: DecodeLimits) -> std::result::Result<Self, Unread> {
        let (reply, hash) = ReplyRef::decode_unverified(outer, limits)?;
        let signature = psk::verify(reply.body, psk, hash).then(|| psk::signature_number(hash)).flatten();
        reply.verified(signature).map_err(Unread::Error)
    }

    /// The outer layer read, every check of [`ReplyRef::decode_verified`] made but
    /// the signature's; the `:hash` text, to check.
    fn decode_unverified(outer: &'a [u8], limits: DecodeLimits) -> std::result::Result<(Self, &'a str), Unread> {
        let doc = match Doc::scan(outer, limits) {
            Ok(doc) => doc,
            Err(Scan::Invalid(e)) => return Err(Unread::Error(*e)),
            Err(Scan::Unsupported(_)) => return Err(Unread::Unsupported),
        };
        let root = doc.root();
        let names = ["senderid", "requestid", "senderagent", "msgtime", "body", "hash"];
        let found = doc.get_syms(root, names)?;
        let is_hash = matches!(doc.item(root)?.0, Item::Hash(_));
        let field = |i: usize| -> Result<Item<'a>> {
            match found[i] {
                Some(pos) => Ok(doc.item(pos)?.0),
                None if !is_hash => Err(Error::message("(message)", "is not a Hash")),
                None => Err(Error::message(format!(":{}", names[i]), "missing")),
            }
        };
        let text = |i: usize| -> Result<&'a str> {
            match field(i)? {
                Item::Str(bytes, _) => std::str::from_utf8(bytes).ok(),
                _ => None,
            }
            .ok_or_else(|| Error::message(format!(":{}", names[i]), "not a UTF-8 String"))
        };
        let reply = ReplyRef {
            senderid: text(0)?,
            requestid: text(1)?,
            senderagent: text(2)?,
            msgtime: match field(3)? {
                Item::Int(i) => i,
                _ => return Err(Error::message(":msgtime", "not an Integer").into()),
            },
            body: match field(4)? {
                Item::Str(bytes, _) => bytes,
                _ => return Err(Error::message(":body", "not a String").into()),
            },
            signature: None,
        };
        Ok((reply, text(5)?))
    }

    /// This reply once its `:hash` was checked: with the signature it verified as,
    /// or (`None`) the error that names it.
    fn verified(self, signature: Option<u128>) -> Result<Self> {
        match signature {
            Some(_) => Ok(ReplyRef { signature, ..self }),
            None => Err(Error::Signature(format!(
                "reply from {} for request {} has a bad :hash",
                self.senderid, self.requestid
            ))),
        }
    }

    pub fn to_owned(&self) -> Reply {
        self.with_body(self.body.to_vec().into())
    }

    /// This reply owned, with `body` for its body.
    fn with_body(&self, body: Body) -> Reply {
        Reply {
            senderid: self.senderid.to_string(),
            requestid: self.requestid.to_string(),
            senderagent: self.senderagent.to_string(),
            msgtime: self.msgtime,
            body,
            signature: self.signature,
        }
    }
}

/// [`Reply::decode_verified`] of each of `outers`, in order, with the signatures
/// checked together: a batch of replies that arrived together costs the PSK's MD5
/// several bodies at a time. Each reply keeps its outer bytes as its [`Body`].
pub fn decode_replies_verified(outers: Vec<Vec<u8>>, psk: &str, limits: DecodeLimits) -> Vec<Result<Reply>> {
    let read: Vec<std::result::Result<(ReplyRef<'_>, &str), Unread>> =
        outers.iter().map(|outer| ReplyRef::decode_unverified(outer, limits)).collect();
    let signed: Vec<(&[u8], &str)> =
        read.iter().filter_map(|r| r.as_ref().ok()).map(|(r, hash)| (r.body, *hash)).collect();
    let mut signatures = psk::verify_many(&signed, psk).into_iter();
    // The replies with their bodies' places, until the outer bytes can be moved.
    let placed: Vec<std::result::Result<(Reply, std::ops::Range<usize>), Unread>> = read
        .into_iter()
        .zip(&outers)
        .map(|(r, outer)| {
            let (reply, _) = r?;
            let start = reply.body.as_ptr() as usize - outer.as_ptr() as usize;
            let range = start..start + reply.body.len();
            let verified = reply.verified(signatures.next().flatten())?;
            Ok((verified.with_body(Body::default()), range))
        })
        .collect();
    placed
        .into_iter()
        .zip(outers)
        .map(|(placed, outer)| match placed {
            Ok((reply, range)) => Ok(Reply { body: Body::within(outer, range), ..reply }),
            Err(Unread::Error(e)) => Err(e),
            Err(Unread::Unsupported) => Reply::decode_verified_via_values(&outer, psk, limits),
        })
        .collect()
}

/// The inner body of an RPC reply: `{:statuscode, :statusmsg, :data}`.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcStatus {
    /// 0 OK, 1 aborted, 2 unknown action, 3 missing data, 4 invalid data, 5 error.
    pub statuscode: i64,
    pub statusmsg: String,
    /// The agent's outputs (a Hash with symbol keys).
    pub data: Value,
}

impl RpcStatus {
    /// Reads an inner RPC reply.
    pub fn from_value(v: &Value) -> Result<RpcStatus> {
        Ok(RpcStatus {
            statuscode: int(v, "statuscode")?,
            statusmsg: field(v, "statusmsg")?
                .as_bytes()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default(),
            data: v.get_sym("data").cloned().unwrap_or(Value::Nil),
        })
    }

    /// The inner Marshal stream, as a daemon writes it (for fake daemons).
    pub fn encode(&self) -> Result<Vec<u8>> {
        marshal::encode(&Value::Hash(vec![
            (Value::sym("statuscode"), Value::Int(self.statuscode)),
            (Value::sym("statusmsg"), Value::str(self.statusmsg.as_str())),
            (Value::sym("data"), self.data.clone()),
        ]))
    }
}

/// Whether an inner body is the discovery answer "pong".
pub fn is_pong(v: &Value) -> bool {
    v.as_bytes() == Some(&b"pong"[..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callerid_rule() {
        for ok in ["uid=0", "cert=puppet.example-1.com", "user=a_b"] {
            assert!(check_callerid(ok).is_ok(), "{ok}");
        }
        for bad in ["uid", "=0", "uid=", "uid=0 1", "u-id=0", "uid=a/b", "uid=0\n"] {
            assert!(check_callerid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn request_ids_are_32_hex_and_distinct() {
        let a = new_request_id().unwrap();
        let b = new_request_id().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn bad_operator_rejected() {
        let f = Filter { fact: vec![FactFilter::new("role", "===", "x")], ..Filter::default() };
        assert!(f.validate().is_err());
    }

    #[test]
    fn process_results_is_last_and_single() {
        let body = rpc_body(
            "puppet",
            "runonce",
            "uid=0",
            &[("process_results".into(), Value::Bool(false)), ("force".into(), Value::Bool(true))],
            true,
        )
        .unwrap();
        let v = marshal::decode(&body).unwrap();
        let data = v.get_sym("data").unwrap().as_hash().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[1], (Value::sym("process_results"), Value::Bool(true)));
    }
}
