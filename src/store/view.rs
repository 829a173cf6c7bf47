//! Reading a store: a value by id, as a cheap copyable handle.

use super::{Slot, Store, StrId, Tag, ValueId};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{Map, Number, Value};

/// A value in a store. Copy; two views of one store are equal when their ids are.
#[derive(Clone, Copy)]
pub struct View<'s> {
    store: &'s Store,
    id: ValueId,
}

/// What a [`View`] holds.
#[derive(Clone, Copy)]
pub enum Kind<'s> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'s str),
    Array(ArrayRef<'s>),
    Object(ObjectRef<'s>),
}

#[derive(Clone, Copy)]
pub struct ArrayRef<'s> {
    store: &'s Store,
    items: &'s [u32],
}

/// A key for [`ObjectRef::get_hinted`], with where it was last found and its string
/// id in the store it was found in.
#[derive(Clone, Copy, Debug)]
pub struct KeyHint<'k> {
    key: &'k str,
    id: Option<StrId>,
    at: usize,
}

impl<'k> KeyHint<'k> {
    pub fn new(key: &'k str) -> KeyHint<'k> {
        KeyHint { key, id: None, at: 0 }
    }
}

#[derive(Clone, Copy)]
pub struct ObjectRef<'s> {
    store: &'s Store,
    /// Key and value ids in pairs, keys in byte order.
    pairs: &'s [u32],
}

impl<'s> View<'s> {
    pub(super) fn new(store: &'s Store, id: ValueId) -> View<'s> {
        View { store, id }
    }

    pub fn id(self) -> ValueId {
        self.id
    }

    /// The store the value is in: names of its keys by id ([`ObjectRef::ids`]).
    pub fn store(self) -> &'s Store {
        self.store
    }

    pub fn kind(self) -> Kind<'s> {
        let slot: Slot = self.store.slot(self.id);
        match slot.tag {
            Tag::Null => Kind::Null,
            Tag::Bool => Kind::Bool(slot.lo != 0),
            Tag::Int => Kind::Int(slot.bits() as i64),
            Tag::UInt => Kind::UInt(slot.bits()),
            Tag::Float => Kind::Float(f64::from_bits(slot.bits())),
            Tag::Str => Kind::Str(self.store.str(slot.lo)),
            Tag::Array => Kind::Array(ArrayRef { store: self.store, items: &self.store.children[slot.children()] }),
            Tag::Object => Kind::Object(ObjectRef { store: self.store, pairs: &self.store.children[slot.children()] }),
        }
    }

    pub fn as_str(self) -> Option<&'s str> {
        match self.kind() {
            Kind::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(self) -> Option<ObjectRef<'s>> {
        match self.kind() {
            Kind::Object(o) => Some(o),
            _ => None,
        }
    }

    /// A scalar as serde_json has it (no allocation but for a string), for the
    /// comparison rules written against JSON values; `None` for containers.
    pub fn scalar_json(self) -> Option<Value> {
        Some(match self.kind() {
            Kind::Null => Value::Null,
            Kind::Bool(b) => Value::Bool(b),
            Kind::Int(i) => Value::Number(i.into()),
            Kind::UInt(u) => Value::Number(u.into()),
            Kind::Float(f) => Value::Number(Number::from_f64(f)?),
            Kind::Str(s) => Value::String(s.to_string()),
            Kind::Array(_) | Kind::Object(_) => return None,
        })
    }

    /// The value as serde_json, allocated anew (for the few paths that still want one).
    pub fn to_json(self) -> Value {
        match self.kind() {
            Kind::Array(items) => Value::Array(items.iter().map(View::to_json).collect()),
            Kind::Object(object) => {
                Value::Object(object.iter().map(|(k, v)| (k.to_string(), v.to_json())).collect::<Map<_, _>>())
            }
            _ => self.scalar_json().unwrap_or(Value::Null),
        }
    }
}

impl<'s> ArrayRef<'s> {
    pub fn len(self) -> usize {
        self.items.len()
    }

    pub fn is_empty(self) -> bool {
        self.items.is_empty()
    }

    pub fn get(self, i: usize) -> Option<View<'s>> {
        self.items.get(i).map(|&id| View::new(self.store, id))
    }

    pub fn iter(self) -> impl ExactSizeIterator<Item = View<'s>> + 's {
        let store = self.store;
        self.items.iter().map(move |&id| View::new(store, id))
    }
}

impl<'s> ObjectRef<'s> {
    /// An object with no keys.
    pub fn empty(store: &'s Store) -> ObjectRef<'s> {
        ObjectRef { store, pairs: &[] }
    }

    pub fn len(self) -> usize {
        self.pairs.len() / 2
    }

    pub fn is_empty(self) -> bool {
        self.pairs.is_empty()
    }

    /// The value under `key`: a binary search, keys being in byte order.
    pub fn get(self, key: &str) -> Option<View<'s>> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.store.str(self.pairs[2 * mid]).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(View::new(self.store, self.pairs[2 * mid + 1])),
            }
        }
        None
    }

    /// [`Self::get`] for a key asked of many objects of one store in turn: the hint
    /// remembers the key's string id and where it was last found, and an object that
    /// has it at the same place answers without comparing text (servers list their
    /// facts alike).
    pub fn get_hinted(self, hint: &mut KeyHint<'_>) -> Option<View<'s>> {
        if let Some(id) = hint.id {
            // Found before in this store, the key has an id here: look for it by id,
            // outward from where it was last (servers differ by a few facts before
            // it), never comparing text. Not found by id, it is not there.
            let at = self.find_near(id, hint.at)?;
            hint.at = at;
            return Some(View::new(self.store, self.pairs[2 * at + 1]));
        }
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.store.str(self.pairs[2 * mid]).cmp(hint.key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    (hint.id, hint.at) = (Some(self.pairs[2 * mid]), mid);
                    return Some(View::new(self.store, self.pairs[2 * mid + 1]));
                }
            }
        }
        None
    }

    /// Starts loading where [`Self::get_hinted`] will look first for `hint`'s key,
    /// so a loop over many objects overlaps their cache misses.
    pub fn prefetch_hinted(self, hint: &KeyHint<'_>) {
        if let Some(pair) = self.pairs.get(2 * hint.at.min(self.len().saturating_sub(1))) {
            super::prefetch(pair);
        }
    }

    /// The pair whose key is string `id`, looking outward from pair `start`.
    fn find_near(self, id: StrId, start: usize) -> Option<usize> {
        let keys = self.len();
        let start = start.min(keys.saturating_sub(1));
        let key = |at: usize| self.pairs[2 * at];
        (0..keys).find_map(|distance| {
            let after = start + distance;
            let before = start.checked_sub(distance).filter(|_| distance > 0);
            [Some(after).filter(|&a| a < keys), before].into_iter().flatten().find(|&at| key(at) == id)
        })
    }

    pub fn contains_key(self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Pairs as key id, key and value, for bindings that convert each key once.
    pub fn named(self) -> impl ExactSizeIterator<Item = (u32, &'s str, View<'s>)> + 's {
        let store = self.store;
        self.pairs.chunks_exact(2).map(move |p| (p[0], store.str(p[0]), View::new(store, p[1])))
    }

    /// Pairs as key id and value, for bindings that keep what they convert of a key
    /// by id and so rarely need its text ([`Store::str`]).
    pub fn ids(self) -> impl ExactSizeIterator<Item = (StrId, View<'s>)> + 's {
        let store = self.store;
        self.pairs.chunks_exact(2).map(move |p| (p[0], View::new(store, p[1])))
    }

    pub fn iter(self) -> impl ExactSizeIterator<Item = (&'s str, View<'s>)> + 's {
        let store = self.store;
        self.pairs.chunks_exact(2).map(move |p| (store.str(p[0]), View::new(store, p[1])))
    }
}

impl Serialize for View<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.kind() {
            Kind::Null => serializer.serialize_unit(),
            Kind::Bool(b) => serializer.serialize_bool(b),
            Kind::Int(i) => serializer.serialize_i64(i),
            Kind::UInt(u) => serializer.serialize_u64(u),
            Kind::Float(f) => serializer.serialize_f64(f),
            Kind::Str(s) => serializer.serialize_str(s),
            Kind::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items.iter() {
                    seq.serialize_element(&item)?;
                }
                seq.end()
            }
            Kind::Object(object) => {
                let mut map = serializer.serialize_map(Some(object.len()))?;
                for (key, value) in object.iter() {
                    map.serialize_entry(key, &value)?;
                }
                map.end()
            }
        }
    }
}

impl std::fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View({}: {})", self.id, self.to_json())
    }
}
