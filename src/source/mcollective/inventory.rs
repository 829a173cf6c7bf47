//! An inventory reply's inner body read in the pass that checks it: the facts go
//! into the store as the scan meets them ([`Events`]), the status and the lists are
//! kept on the way. The same refusals, observation and store ids as the two passes
//! (check, then read in place) of [`super::observation_two_passes`], which still reads
//! a body whose status comes after its facts.

use super::{convert, finish, sorted, valid_identity, BodyError, InnerBody, InventoryError, Lists, MAX_DEPTH};
use crate::mcollective::error::Error;
use crate::mcollective::marshal::Value as Ruby;
use crate::mcollective::marshal_reader::{Doc, Events, Item, Pos, Scan};
use crate::source::Observation;
use crate::store::{Builder, ValueId, FALSE, NULL, TRUE};
use serde_json::Value;
use std::borrow::Cow;

/// What one pass made of a body.
pub(super) enum Read {
    Done(std::result::Result<Observation, BodyError>),
    /// The facts came before the status that decides whether they are kept: read it
    /// in two passes, so that a refused reply adds nothing to the store.
    TwoPasses,
}

/// `body` checked and, when its status allows, its facts read into `builder` in one
/// pass.
pub(super) fn read(body: InnerBody, builder: &mut Builder) -> Read {
    let InnerBody { sender, msgtime, bytes, limits, at, main_collective } = body;
    let start = builder.open();
    let mut reader = Reader::new(valid_identity(sender), builder);
    let scanned = Doc::scan_with(bytes, limits, &mut reader);
    let Reader { statuscode, statusmsg, facts, collected, own_main, failed, .. } = reader;
    if scanned.is_err() || failed.is_some() {
        // Facts added before the failure stay in the store, unreferenced.
        builder.discard_open(start);
    }
    match scanned {
        Ok(_) => {}
        Err(Scan::Invalid(e)) => return Read::Done(Err(BodyError::Malformed(*e))),
        Err(Scan::Unsupported(_)) => return Read::Done(Err(BodyError::Unsupported)),
    }
    if let Some(e) = failed {
        return Read::Done(Err(BodyError::Malformed(e)));
    }
    let malformed = |key: &str, why: &str| BodyError::Malformed(Error::Marshal(format!(":{key} {why}")));
    let Some(statuscode) = statuscode else {
        return Read::Done(Err(if collected.root_is_hash {
            malformed("statuscode", "missing")
        } else {
            malformed("(message)", "is not a Hash")
        }));
    };
    let Some(statuscode) = statuscode else { return Read::Done(Err(malformed("statuscode", "not an Integer"))) };
    let Some(statusmsg) = statusmsg else { return Read::Done(Err(malformed("statusmsg", "missing"))) };
    if !valid_identity(sender) {
        return Read::Done(Err(BodyError::Inventory(InventoryError::BadIdentity { identity: sender.to_string() })));
    }
    if statuscode != 0 {
        return Read::Done(Err(BodyError::Inventory(InventoryError::Status { code: statuscode, message: statusmsg })));
    }
    let facts = match facts {
        Facts::Unseen => return Read::Done(Err(BodyError::Inventory(InventoryError::NoFacts))),
        Facts::NotAHash => return Read::Done(Err(BodyError::Inventory(InventoryError::FactsNotAHash))),
        // Refused and Reading cannot reach here (the status refused the reply, or the
        // scan failed); two passes are the safe answer all the same.
        Facts::Undecided | Facts::Refused | Facts::Reading => return Read::TwoPasses,
        Facts::Read(id) => id,
    };
    let [classes, agents, collectives] = collected.items;
    let lists = Lists { classes: sorted(classes), agents: sorted(agents), collectives: sorted(collectives) };
    Read::Done(Ok(finish(sender, msgtime, at, own_main, main_collective, facts, lists, builder)))
}

/// The state of the facts value (the first `:facts` of the first `:data`).
enum Facts {
    Unseen,
    NotAHash,
    /// A Hash met before the status was known.
    Undecided,
    /// A Hash not read: the reply is refused whatever it holds.
    Refused,
    Reading,
    Read(ValueId),
}

#[derive(Clone, Copy)]
enum List {
    Classes,
    Agents,
    Collectives,
}

/// Keys of the root Hash and of its `:data` that the observation reads.
const ROOT_KEYS: [&str; 3] = ["statuscode", "statusmsg", "data"];
const DATA_KEYS: [&str; 5] = ["facts", "classes", "agents", "collectives", "main_collective"];

/// What a value is to the observation, from where it lies.
#[derive(Clone, Copy)]
enum Role {
    Ignored,
    Root,
    StatusCode,
    StatusMsg,
    Data,
    Facts,
    List(List),
    ListItem(List),
    OwnMain,
    /// Inside the facts, at this depth (the facts Hash is 0).
    Fact(usize),
    /// A key of a Hash of the facts at this depth.
    FactKey(usize),
}

/// An open Array or Hash.
struct Frame {
    role: Role,
    is_hash: bool,
    /// A Hash: whether the next element is a key.
    key_next: bool,
    /// A Hash: the role of the value after the key just read.
    value_role: Role,
    /// A fact container: where its children start on the builder.
    mark: usize,
    /// A fact key that is an Array or Hash: where it starts.
    key_at: Option<Pos>,
}

/// What the root Hash and its `:data` held besides the facts.
struct Collected<'a> {
    root_is_hash: bool,
    root_seen: [bool; 3],
    data_seen: [bool; 5],
    items: [Vec<Cow<'a, str>>; 3],
}

struct Reader<'a, 'b> {
    identity_ok: bool,
    builder: &'b mut Builder,
    stack: Vec<Frame>,
    started: bool,
    statuscode: Option<Option<i64>>,
    statusmsg: Option<String>,
    facts: Facts,
    own_main: Option<&'a str>,
    collected: Collected<'a>,
    failed: Option<Error>,
}

impl<'a, 'b> Reader<'a, 'b> {
    fn new(identity_ok: bool, builder: &'b mut Builder) -> Self {
        Reader {
            identity_ok,
            builder,
            stack: Vec::with_capacity(16),
            started: false,
            statuscode: None,
            statusmsg: None,
            facts: Facts::Unseen,
            own_main: None,
            collected: Collected {
                root_is_hash: false,
                root_seen: [false; 3],
                data_seen: [false; 5],
                // An inventory's usual sizes: tens of classes, a few agents and collectives.
                items: [Vec::with_capacity(64), Vec::with_capacity(16), Vec::with_capacity(8)],
            },
            failed: None,
        }
    }

    /// The role of the value starting now, and for a Hash key, what it makes of the
    /// value after it (`symbol`: the value's text when it is a Symbol).
    fn next_role(&mut self, symbol: Option<&[u8]>) -> Role {
        let Some(top) = self.stack.last_mut() else {
            if self.started {
                return Role::Ignored;
            }
            self.started = true;
            return Role::Root;
        };
        if !top.is_hash {
            return match top.role {
                Role::List(list) => Role::ListItem(list),
                Role::Fact(depth) => Role::Fact(depth + 1),
                _ => Role::Ignored,
            };
        }
        let key = top.key_next;
        top.key_next = !key;
        if !key {
            return std::mem::replace(&mut top.value_role, Role::Ignored);
        }
        top.value_role = match top.role {
            Role::Fact(depth) => Role::Fact(depth + 1),
            Role::Root => match symbol.and_then(|s| ROOT_KEYS.iter().position(|k| k.as_bytes() == s)) {
                Some(i) if !std::mem::replace(&mut self.collected.root_seen[i], true) => {
                    [Role::StatusCode, Role::StatusMsg, Role::Data][i]
                }
                _ => Role::Ignored,
            },
            Role::Data => match symbol.and_then(|s| DATA_KEYS.iter().position(|k| k.as_bytes() == s)) {
                Some(i) if !std::mem::replace(&mut self.collected.data_seen[i], true) => [
                    Role::Facts,
                    Role::List(List::Classes),
                    Role::List(List::Agents),
                    Role::List(List::Collectives),
                    Role::OwnMain,
                ][i],
                _ => Role::Ignored,
            },
            _ => Role::Ignored,
        };
        match top.role {
            Role::Fact(depth) => Role::FactKey(depth),
            _ => Role::Ignored,
        }
    }

    /// Whether the facts are read now: only when the reply is known to be accepted,
    /// so that a refused one adds nothing to the store.
    fn facts_met(&mut self) -> bool {
        let refused = !self.identity_ok
            || match self.statuscode {
                Some(Some(code)) => code != 0,
                Some(None) => true,
                None => false,
            };
        self.facts = if refused {
            Facts::Refused
        } else if self.statuscode == Some(Some(0)) && self.statusmsg.is_some() {
            Facts::Reading
        } else {
            Facts::Undecided
        };
        matches!(self.facts, Facts::Reading)
    }

    /// A fact leaf's id ([`super::add_to_store`]'s rules).
    fn fact(&mut self, item: Item<'a>, depth: usize) -> ValueId {
        if depth > MAX_DEPTH {
            return NULL;
        }
        match item {
            Item::Nil | Item::Other(_) | Item::Array(_) | Item::Hash(_) => NULL,
            Item::Bool(true) => TRUE,
            Item::Bool(false) => FALSE,
            Item::Int(i) => self.builder.int(i),
            Item::Float(f) if f.is_finite() => self.builder.float(f),
            Item::Float(_) => NULL,
            Item::Str(bytes, _) | Item::Sym(bytes) => self.builder.string_value_lossy(bytes),
        }
    }

    /// A key of a Hash of the facts at `depth`, given as the value it is.
    fn fact_key(&mut self, key: &Ruby, depth: usize) {
        let id = match convert(key, depth + 1) {
            Value::String(s) => self.builder.string(&s),
            other => self.builder.string(&other.to_string()),
        };
        self.builder.push_child(id);
    }
}

impl<'a> Events<'a> for Reader<'a, '_> {
    fn leaf(&mut self, item: Item<'a>) {
        let symbol = match item {
            Item::Sym(s) => Some(s),
            _ => None,
        };
        match self.next_role(symbol) {
            Role::Ignored | Role::Root | Role::Data | Role::List(_) => {}
            Role::StatusCode => {
                self.statuscode = Some(match item {
                    Item::Int(i) => Some(i),
                    _ => None,
                })
            }
            Role::StatusMsg => {
                self.statusmsg = Some(match item {
                    Item::Str(bytes, _) => crate::store::lossy_text(bytes).into_owned(),
                    _ => String::new(),
                })
            }
            Role::Facts => self.facts = Facts::NotAHash,
            Role::ListItem(list) => {
                if let Item::Str(bytes, _) | Item::Sym(bytes) = item {
                    self.collected.items[list as usize].push(crate::store::lossy_text(bytes));
                }
            }
            Role::OwnMain => {
                self.own_main = match item {
                    Item::Str(bytes, _) => std::str::from_utf8(bytes).ok(),
                    _ => None,
                }
            }
            Role::Fact(depth) => {
                let id = self.fact(item, depth);
                self.builder.push_child(id);
            }
            Role::FactKey(depth) => match item {
                _ if depth + 1 > MAX_DEPTH => {
                    let id = self.builder.string("null");
                    self.builder.push_child(id);
                }
                Item::Str(bytes, _) | Item::Sym(bytes) => {
                    let id = self.builder.string_lossy(bytes);
                    self.builder.push_child(id);
                }
                Item::Nil | Item::Other(_) | Item::Array(_) | Item::Hash(_) => self.fact_key(&Ruby::Nil, depth),
                Item::Bool(b) => self.fact_key(&Ruby::Bool(b), depth),
                Item::Int(i) => self.fact_key(&Ruby::Int(i), depth),
                Item::Float(f) => self.fact_key(&Ruby::Float(f), depth),
            },
        }
    }

    fn open(&mut self, item: Item<'a>, pos: Pos) {
        let is_hash = matches!(item, Item::Hash(_));
        let role = match self.next_role(None) {
            Role::Root => {
                self.collected.root_is_hash = is_hash;
                if is_hash {
                    Role::Root
                } else {
                    Role::Ignored
                }
            }
            Role::StatusCode => {
                self.statuscode = Some(None);
                Role::Ignored
            }
            Role::StatusMsg => {
                self.statusmsg = Some(String::new());
                Role::Ignored
            }
            Role::Data if is_hash => Role::Data,
            Role::Facts if is_hash => {
                if self.facts_met() {
                    Role::Fact(0)
                } else {
                    Role::Ignored
                }
            }
            Role::Facts => {
                self.facts = Facts::NotAHash;
                Role::Ignored
            }
            Role::List(list) if !is_hash => Role::List(list),
            Role::Fact(depth) if depth > MAX_DEPTH => {
                self.builder.push_child(NULL);
                Role::Ignored
            }
            Role::Fact(depth) => Role::Fact(depth),
            Role::FactKey(depth) if depth + 1 > MAX_DEPTH => {
                let id = self.builder.string("null");
                self.builder.push_child(id);
                Role::Ignored
            }
            Role::FactKey(_) => {
                self.stack.push(Frame {
                    role: Role::Ignored,
                    is_hash,
                    key_next: true,
                    value_role: Role::Ignored,
                    mark: 0,
                    key_at: Some(pos),
                });
                return;
            }
            _ => Role::Ignored,
        };
        let mark = self.builder.open();
        self.stack.push(Frame { role, is_hash, key_next: true, value_role: Role::Ignored, mark, key_at: None });
    }

    fn close(&mut self, doc: &Doc<'a>) {
        let Some(frame) = self.stack.pop() else { return };
        if let Some(key_at) = frame.key_at {
            // A key that is an Array or Hash: its JSON text, as the value it is.
            let Some(Role::Fact(depth)) = self.stack.last().map(|f| f.role) else { return };
            match doc.value(key_at) {
                Ok(key) => self.fact_key(&key, depth),
                Err(e) => {
                    self.failed.get_or_insert(e);
                }
            }
            return;
        }
        let Role::Fact(depth) = frame.role else { return };
        let id =
            if frame.is_hash { self.builder.close_object(frame.mark) } else { self.builder.close_array(frame.mark) };
        if depth == 0 {
            self.facts = Facts::Read(id);
        } else {
            self.builder.push_child(id);
        }
    }
}
