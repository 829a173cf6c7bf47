//! A borrowed reader for the Marshal 4.8 that mcollective sends: Hash, Array,
//! String (with `E`/`encoding` ivars), Symbol and symlink, Fixnum, Bignum, Float,
//! true/false/nil and object links. No values are built: [`Doc::scan`] checks the
//! whole stream once, within the same [`DecodeLimits`] as [`marshal::decode_with`]
//! (links expanded, values and bytes counted the same way), and records where each
//! object starts; callers then read what they need in place (`get_sym`,
//! [`Doc::items`], slices of the input), or, with [`Doc::scan_with`], are told each
//! value as the check meets it ([`Events`]) and read it in that same pass.
//!
//! Anything outside that subset (objects, structs, regexps, `_dump` data, hashes
//! with a default, odd ivars) is [`Scan::Unsupported`]: the caller decodes the
//! stream with [`marshal`] instead, so both readers always give the same answer.

use super::error::{Error, Result};
use super::marshal::{self, DecodeLimits, Encoding, Value};

/// A position in the stream where a value starts.
pub type Pos = usize;

/// Why [`Doc::scan`] did not give a document.
#[derive(Debug)]
pub enum Scan {
    /// Not Marshal, or over a limit: [`marshal::decode_with`] refuses it too. Boxed:
    /// every step of the scan returns a result, and a small one is cheaper to pass.
    Invalid(Box<Error>),
    /// Outside the subset: decode it with [`marshal`].
    Unsupported(&'static str),
}

type ScanResult<T> = std::result::Result<T, Scan>;

#[cold]
fn bad<T>(what: impl Into<String>) -> ScanResult<T> {
    Err(Scan::Invalid(Box::new(Error::Marshal(what.into()))))
}

/// One value's head, read at a position.
#[derive(Clone, Copy, Debug)]
pub enum Item<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    /// A Bignum beyond 64 bits, or a Float whose text does not parse: the old
    /// reader's `Value::Other`, with its words.
    Other(&'static str),
    Float(f64),
    /// Bytes, and the position of the `I` wrapper's ivars when there is one.
    Str(&'a [u8], Option<Pos>),
    Sym(&'a [u8]),
    /// Element count; the elements start at the position given with it.
    Array(u32),
    Hash(u32),
}

/// What [`Doc::scan_with`] reports as it checks the stream: each value where the
/// scan meets it, the targets of links read again in their place, so a caller can
/// read the document in the same pass that checks it.
pub trait Events<'a> {
    /// A value that holds no others (never [`Item::Array`] or [`Item::Hash`]).
    fn leaf(&mut self, item: Item<'a>);
    /// An Array or Hash starting at `pos`; its elements (a Hash's as key, value)
    /// follow, then [`Events::close`].
    fn open(&mut self, item: Item<'a>, pos: Pos);
    /// The end of the innermost open Array or Hash; `doc` can read every value
    /// that ended so far ([`Doc::value`]).
    fn close(&mut self, doc: &Doc<'a>);
}

/// The plain check: nothing to report.
struct Quiet;

impl<'a> Events<'a> for Quiet {
    fn leaf(&mut self, _: Item<'a>) {}
    fn open(&mut self, _: Item<'a>, _: Pos) {}
    fn close(&mut self, _: &Doc<'a>) {}
}

/// A checked Marshal stream: the symbol and object tables of its one pass.
pub struct Doc<'a> {
    bytes: &'a [u8],
    /// (start, end) of each symbol, in table order.
    symbols: Vec<(u32, u32)>,
    /// Where each object of the link table starts, and whether it was complete.
    objects: Vec<(u32, bool)>,
    limits: DecodeLimits,
    values: usize,
    string_bytes: usize,
}

impl<'a> Doc<'a> {
    /// Checks `bytes` within `limits`: the same streams [`marshal::decode_with`] takes
    /// (when in the subset) and the same refusals.
    pub fn scan(bytes: &'a [u8], limits: DecodeLimits) -> ScanResult<Doc<'a>> {
        Doc::scan_with(bytes, limits, &mut Quiet)
    }

    /// [`Doc::scan`], telling `events` each value as the check meets it (until it
    /// fails: what was told before an error is the caller's to undo).
    pub fn scan_with(bytes: &'a [u8], limits: DecodeLimits, events: &mut impl Events<'a>) -> ScanResult<Doc<'a>> {
        if bytes.len() > limits.max_input {
            return bad(format!("input of {} bytes exceeds the limit of {}", bytes.len(), limits.max_input));
        }
        if bytes.get(..2) != Some(&[4, 8][..]) {
            return bad("not a Marshal 4.8 byte stream (bad 2-byte header)");
        }
        // The object table sized at once (an inventory has an object every ~14
        // bytes), not grown ten times over.
        let (symbols, objects) = (Vec::with_capacity(64), Vec::with_capacity((bytes.len() / 12).min(4096)));
        let mut doc = Doc { bytes, symbols, objects, limits, values: 0, string_bytes: 0 };
        let end = doc.walk(2, 0, true, events)?;
        if end != bytes.len() {
            return bad(format!("unexpected data after the value, at byte {end}"));
        }
        Ok(doc)
    }

    /// The position of the root value.
    pub fn root(&self) -> Pos {
        2
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    fn byte(&self, pos: Pos) -> ScanResult<u8> {
        match self.bytes.get(pos) {
            Some(&b) => Ok(b),
            None => bad(format!("unexpected end of input at byte {pos}")),
        }
    }

    #[inline]
    fn int(&self, pos: Pos) -> ScanResult<(i32, Pos)> {
        let lead = self.byte(pos)? as i8;
        let pos = pos + 1;
        // Most lengths and indexes: one byte.
        if lead > 4 {
            return Ok((i32::from(lead) - 5, pos));
        }
        Ok(match lead {
            0 => (0, pos),
            1..=4 => {
                let n = lead as usize;
                let tail = self.slice(pos, n)?;
                let mut buf = [0u8; 4];
                buf[..n].copy_from_slice(tail);
                (i32::from_le_bytes(buf), pos + n)
            }
            -4..=-1 => {
                let n = lead.unsigned_abs() as usize;
                let tail = self.slice(pos, n)?;
                let mut buf = [0xffu8; 4];
                buf[..n].copy_from_slice(tail);
                (i32::from_le_bytes(buf), pos + n)
            }
            _ if lead > 0 => (i32::from(lead) - 5, pos),
            _ => (i32::from(lead) + 5, pos),
        })
    }

    fn slice(&self, pos: Pos, len: usize) -> ScanResult<&'a [u8]> {
        match pos.checked_add(len).and_then(|end| self.bytes.get(pos..end)) {
            Some(s) => Ok(s),
            None => bad(format!("unexpected end of input at byte {pos}")),
        }
    }

    /// A length: not negative, and not more than the bytes left.
    fn len(&self, pos: Pos) -> ScanResult<(usize, Pos)> {
        let (n, next) = self.int(pos)?;
        let n = usize::try_from(n).or_else(|_| bad(format!("negative length {n} at byte {pos}")))?;
        if n > self.bytes.len().saturating_sub(next) {
            return bad("declared length exceeds remaining input");
        }
        Ok((n, next))
    }

    fn index(&self, pos: Pos) -> ScanResult<(usize, Pos)> {
        let (n, next) = self.int(pos)?;
        usize::try_from(n).map(|n| (n, next)).or_else(|_| bad("declared length exceeds remaining input"))
    }

    #[inline]
    fn chunk(&self, pos: Pos) -> ScanResult<(&'a [u8], Pos)> {
        // Most: a one-byte length (1..=122) and the bytes all there, as `len` and
        // `slice` would find them.
        if let Some(&lead @ 6..=0x7f) = self.bytes.get(pos) {
            let (start, n) = (pos + 1, usize::from(lead) - 5);
            if let Some(bytes) = self.bytes.get(start..start + n) {
                return Ok((bytes, start + n));
            }
        }
        let (n, pos) = self.len(pos)?;
        Ok((self.slice(pos, n)?, pos + n))
    }

    /// A symbol (`:` or `;`) at `pos`; `first` registers a new one.
    fn symbol(&mut self, pos: Pos, first: bool) -> ScanResult<(&'a [u8], Pos)> {
        match self.byte(pos)? {
            b':' => {
                let (s, next) = self.chunk(pos + 1)?;
                if first {
                    self.symbols.push(((next - s.len()) as u32, next as u32));
                }
                Ok((s, next))
            }
            b';' => {
                let (idx, next) = self.index(pos + 1)?;
                match self.symbols.get(idx) {
                    Some(&(a, b)) => Ok((&self.bytes[a as usize..b as usize], next)),
                    None => bad(format!("symbol link {idx} has no matching symbol")),
                }
            }
            b'I' => Err(Scan::Unsupported("symbol with instance variables as a name")),
            other => bad(format!("unexpected type tag {other:#04x} at byte {pos}")),
        }
    }

    fn take(&mut self, bytes: usize) -> ScanResult<()> {
        self.values += 1;
        self.string_bytes = self.string_bytes.saturating_add(bytes);
        if self.values > self.limits.max_values {
            return bad(format!("more than {} values", self.limits.max_values));
        }
        if self.string_bytes > self.limits.max_bytes {
            return bad(format!("more than {} bytes of strings", self.limits.max_bytes));
        }
        Ok(())
    }

    /// The one pass (`first`: registers symbols and objects) and the replays of
    /// links: every value counted against the limits as the old reader counts it.
    fn walk<E: Events<'a>>(&mut self, pos: Pos, depth: usize, first: bool, events: &mut E) -> ScanResult<Pos> {
        if depth > self.limits.max_depth {
            return bad(format!("nesting deeper than {}", self.limits.max_depth));
        }
        let tag = self.byte(pos)?;
        let at = pos + 1;
        match tag {
            b'0' | b'T' | b'F' => {
                self.take(0)?;
                events.leaf(match tag {
                    b'0' => Item::Nil,
                    _ => Item::Bool(tag == b'T'),
                });
                Ok(at)
            }
            b'i' => {
                self.take(0)?;
                let (i, next) = self.int(at)?;
                events.leaf(Item::Int(i64::from(i)));
                Ok(next)
            }
            b':' | b';' => {
                let (s, next) = self.symbol(pos, first)?;
                self.take(s.len())?;
                events.leaf(Item::Sym(s));
                Ok(next)
            }
            b'"' => {
                let (s, next) = self.chunk(at)?;
                if first {
                    self.objects.push((pos as u32, true));
                }
                self.take(s.len())?;
                events.leaf(Item::Str(s, None));
                Ok(next)
            }
            b'f' => {
                let (text, next) = self.chunk(at)?;
                if first {
                    self.objects.push((pos as u32, true));
                }
                self.take(0)?;
                events.leaf(float_text(text).map_or(Item::Other("Float with unreadable text"), Item::Float));
                Ok(next)
            }
            b'l' => {
                let (words, next) = self.len(at + 1)?;
                let magnitude = self.slice(next, words * 2)?;
                let negative = self.bytes[at] != b'+';
                if first {
                    self.objects.push((pos as u32, true));
                }
                self.take(0)?;
                events.leaf(bignum(negative, magnitude).map_or(Item::Other("Bignum beyond 64 bits"), Item::Int));
                Ok(next + words * 2)
            }
            b'@' => {
                let (idx, next) = self.index(at)?;
                let target = match self.objects.get(idx) {
                    None => return bad(format!("object link {idx} has no matching object")),
                    // A link into a value still being read loops: the old reader fails
                    // on its depth.
                    Some(&(_, false)) => return bad(format!("object link {idx} refers to itself")),
                    Some(&(target, true)) => target as Pos,
                };
                self.walk(target, depth, false, events)?;
                Ok(next)
            }
            b'[' | b'{' => {
                let (n, mut next) = self.len(at)?;
                let slot = self.open(pos, first);
                self.take(0)?;
                let (item, children) =
                    if tag == b'[' { (Item::Array(n as u32), n) } else { (Item::Hash(n as u32), n * 2) };
                events.open(item, pos);
                let deeper = depth < self.limits.max_depth;
                for _ in 0..children {
                    // Most elements are Strings of mcollective's usual shape: read here,
                    // as the walk would (object slot, limits, event), without a call.
                    let usual = if deeper { self.usual_string(next, first) } else { None };
                    next = match usual {
                        Some((text, ivars, end)) => {
                            self.take(text.len())?;
                            events.leaf(Item::Str(text, Some(ivars)));
                            end
                        }
                        None => self.walk(next, depth + 1, first, events)?,
                    };
                }
                self.close(slot);
                events.close(self);
                Ok(next)
            }
            b'I' => {
                let inner = self.byte(at)?;
                if !matches!(inner, b'"' | b':' | b';') {
                    return Err(Scan::Unsupported("instance variables on a value other than a String or Symbol"));
                }
                let slot = if inner == b'"' { self.open(pos, first) } else { None };
                let (item, len, next) = match inner {
                    b'"' => {
                        let (s, next) = self.chunk(at + 1)?;
                        (Item::Str(s, Some(next)), s.len(), next)
                    }
                    _ => {
                        let (s, next) = self.symbol(at, first)?;
                        (Item::Sym(s), s.len(), next)
                    }
                };
                let next = match self.one_linked_flag(next) {
                    Some(next) => next,
                    None => self.ivars(next, first)?,
                };
                self.close(slot);
                self.take(len)?;
                events.leaf(item);
                Ok(next)
            }
            b'e' | b'C' | b'o' | b'd' | b'u' | b'U' | b'/' | b'}' | b'S' | b'M' | b'c' | b'm' => {
                Err(Scan::Unsupported("a Ruby value mcollective does not send"))
            }
            other => bad(format!("unexpected type tag {other:#04x} at byte {pos}")),
        }
    }

    fn open(&mut self, pos: Pos, first: bool) -> Option<usize> {
        first.then(|| {
            self.objects.push((pos as u32, false));
            self.objects.len() - 1
        })
    }

    fn close(&mut self, slot: Option<usize>) {
        if let Some(slot) = slot {
            self.objects[slot].1 = true;
        }
    }

    /// A String at `pos` in the shape nearly all of mcollective's have (`I"`, a
    /// one-byte length, the bytes, one encoding flag through a symbol link): its
    /// bytes, where its ivars start and where it ends; `first` registers it in the
    /// object table, as [`Doc::walk`] does. `None` for any other value.
    #[inline]
    fn usual_string(&mut self, pos: Pos, first: bool) -> Option<(&'a [u8], Pos, Pos)> {
        let &[b'I', b'"', lead @ 6..=0x7f] = self.bytes.get(pos..pos + 3)? else { return None };
        let ivars = pos + 3 + usize::from(lead) - 5;
        let text = self.bytes.get(pos + 3..ivars)?;
        let end = self.one_linked_flag(ivars)?;
        if first {
            self.objects.push((pos as u32, true));
        }
        Some((text, ivars, end))
    }

    /// The ivars nearly every String mcollective sends carries, one encoding flag
    /// named by a symbol link (`\x06 ; link T`), read at once: where they end, as
    /// [`Doc::ivars`] reads them; `None` for any other shape.
    #[inline]
    fn one_linked_flag(&self, pos: Pos) -> Option<Pos> {
        let &[count, b';', link, flag] = self.bytes.get(pos..pos + 4)? else { return None };
        // A one-byte Marshal integer: 0, or 6..=127 for 1..=122.
        let index = match link {
            0 => 0,
            6..=0x7f => usize::from(link) - 5,
            _ => return None,
        };
        (count == 6 && index < self.symbols.len() && matches!(flag, b'T' | b'F' | b'0')).then_some(pos + 4)
    }

    /// An `I` wrapper's ivars: names, each with true, false, nil or a plain String
    /// (the only values the old reader keeps nothing of, or an encoding name).
    fn ivars(&mut self, pos: Pos, first: bool) -> ScanResult<Pos> {
        let (n, mut next) = self.len(pos)?;
        for _ in 0..n {
            next = self.symbol(next, first)?.1;
            match self.byte(next)? {
                b'T' | b'F' | b'0' => next += 1,
                b'"' => {
                    if first {
                        self.objects.push((next as u32, true));
                    }
                    next = self.chunk(next + 1)?.1;
                }
                _ => return Err(Scan::Unsupported("an instance variable other than an encoding")),
            }
        }
        Ok(next)
    }

    /// The value at `pos` with links followed: its head, and where its contents
    /// (elements, pairs) start.
    pub fn item(&self, pos: Pos) -> Result<(Item<'a>, Pos)> {
        self.item_scan(self.deref(pos)?).map_err(scan_error)
    }

    /// Where the value a link at `pos` refers to starts (`pos` itself when no link).
    pub fn deref(&self, pos: Pos) -> Result<Pos> {
        if self.byte(pos).map_err(scan_error)? != b'@' {
            return Ok(pos);
        }
        // Links were checked by the scan: each leads to an earlier, complete object,
        // never to another link.
        let (idx, _) = self.index(pos + 1).map_err(scan_error)?;
        match self.objects.get(idx) {
            Some(&(target, true)) => Ok(target as Pos),
            _ => Err(Error::Marshal("object link out of range".into())),
        }
    }

    /// The value at `pos` (not a link): its head, and where it ends (a container:
    /// where its contents start).
    pub fn head(&self, pos: Pos) -> Result<(Item<'a>, Pos)> {
        self.item_scan(pos).map_err(scan_error)
    }

    fn item_scan(&self, pos: Pos) -> ScanResult<(Item<'a>, Pos)> {
        let at = pos + 1;
        Ok(match self.byte(pos)? {
            b'0' => (Item::Nil, at),
            b'T' => (Item::Bool(true), at),
            b'F' => (Item::Bool(false), at),
            b'i' => {
                let (i, next) = self.int(at)?;
                (Item::Int(i64::from(i)), next)
            }
            b':' | b';' => {
                let (s, next) = DocView(self).symbol_at(pos)?;
                (Item::Sym(s), next)
            }
            b'"' => {
                let (s, next) = self.chunk(at)?;
                (Item::Str(s, None), next)
            }
            b'f' => {
                let (text, next) = self.chunk(at)?;
                (float_text(text).map_or(Item::Other("Float with unreadable text"), Item::Float), next)
            }
            b'l' => {
                let negative = self.byte(at)? != b'+';
                let (words, next) = self.len(at + 1)?;
                let magnitude = self.slice(next, words * 2)?;
                (bignum(negative, magnitude).map_or(Item::Other("Bignum beyond 64 bits"), Item::Int), next + words * 2)
            }
            b'[' => {
                let (n, next) = self.len(at)?;
                (Item::Array(n as u32), next)
            }
            b'{' => {
                let (n, next) = self.len(at)?;
                (Item::Hash(n as u32), next)
            }
            b'I' => match self.byte(at)? {
                b'"' => {
                    let (s, next) = self.chunk(at + 1)?;
                    (Item::Str(s, Some(next)), self.skip_ivars(next)?)
                }
                _ => {
                    let (s, next) = DocView(self).symbol_at(at)?;
                    (Item::Sym(s), self.skip_ivars(next)?)
                }
            },
            other => return bad(format!("unexpected type tag {other:#04x} at byte {pos}")),
        })
    }

    /// Where the value at `pos` ends (links not followed).
    pub fn skip(&self, pos: Pos) -> Result<Pos> {
        self.skip_scan(pos, 0).map_err(scan_error)
    }

    fn skip_scan(&self, pos: Pos, depth: usize) -> ScanResult<Pos> {
        if depth > self.limits.max_depth {
            return bad("nesting too deep to skip");
        }
        let at = pos + 1;
        match self.byte(pos)? {
            b'0' | b'T' | b'F' => Ok(at),
            b'i' | b'@' | b';' => Ok(self.int(at)?.1),
            b':' | b'"' | b'f' => Ok(self.chunk(at)?.1),
            b'l' => {
                let (words, next) = self.len(at + 1)?;
                Ok(next + words * 2)
            }
            b'[' | b'{' => {
                let (n, mut next) = self.len(at)?;
                let n = if self.bytes[pos] == b'{' { n * 2 } else { n };
                for _ in 0..n {
                    next = self.skip_scan(next, depth + 1)?;
                }
                Ok(next)
            }
            b'I' => {
                let next = self.skip_scan(at, depth + 1)?;
                self.skip_ivars(next)
            }
            _ => Err(Scan::Unsupported("a Ruby value mcollective does not send")),
        }
    }

    /// Past an `I` wrapper's ivars (names, then true, false, nil or a plain String).
    fn skip_ivars(&self, pos: Pos) -> ScanResult<Pos> {
        let (n, mut next) = self.len(pos)?;
        for _ in 0..n {
            next = DocView(self).symbol_at(next)?.1;
            next = self.skip_scan(next, 0)?;
        }
        Ok(next)
    }

    /// The `(key, value)` positions of the Hash at `pos` (None: not a Hash).
    pub fn pairs(&self, pos: Pos) -> Result<Option<Vec<(Pos, Pos)>>> {
        let (Item::Hash(n), mut next) = self.item(pos)? else { return Ok(None) };
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let value = self.skip(next)?;
            let end = self.skip(value)?;
            out.push((next, value));
            next = end;
        }
        Ok(Some(out))
    }

    /// The element positions of the Array at `pos` (None: not an Array).
    pub fn items(&self, pos: Pos) -> Result<Option<Vec<Pos>>> {
        let (Item::Array(n), mut next) = self.item(pos)? else { return Ok(None) };
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            out.push(next);
            next = self.skip(next)?;
        }
        Ok(Some(out))
    }

    /// `hash[:name]`, the first such key as Ruby keeps it (None: no such key, or not
    /// a Hash).
    pub fn get_sym(&self, pos: Pos, name: &str) -> Result<Option<Pos>> {
        let (Item::Hash(n), mut next) = self.item(pos)? else { return Ok(None) };
        for _ in 0..n {
            let value = self.skip(next)?;
            if matches!(self.item(next)?.0, Item::Sym(s) if s == name.as_bytes()) {
                return Ok(Some(value));
            }
            next = self.skip(value)?;
        }
        Ok(None)
    }

    /// `hash[:name]` for each of `names` in one pass over the Hash at `pos`, as
    /// [`Doc::get_sym`] finds each (all None when not a Hash).
    pub fn get_syms<const N: usize>(&self, pos: Pos, names: [&str; N]) -> Result<[Option<Pos>; N]> {
        let mut found = [None; N];
        let (Item::Hash(n), mut next) = self.item(pos)? else { return Ok(found) };
        for _ in 0..n {
            let value = self.skip(next)?;
            if let Item::Sym(s) = self.item(next)?.0 {
                if let Some(i) = names.iter().position(|name| name.as_bytes() == s) {
                    found[i] = found[i].or(Some(value));
                }
            }
            next = self.skip(value)?;
        }
        Ok(found)
    }

    /// The value at `pos` as the old reader gives it (for keys that are neither
    /// String nor Symbol, and to hold the two readers to each other).
    pub fn value(&self, pos: Pos) -> Result<Value> {
        self.value_at(pos, 0)
    }

    fn value_at(&self, pos: Pos, depth: usize) -> Result<Value> {
        if depth > self.limits.max_depth {
            return Err(Error::Marshal(format!("nesting deeper than {}", self.limits.max_depth)));
        }
        let (item, mut next) = self.item(pos)?;
        Ok(match item {
            Item::Nil => Value::Nil,
            Item::Bool(b) => Value::Bool(b),
            Item::Int(i) => Value::Int(i),
            Item::Float(f) => Value::Float(f),
            Item::Other(what) => Value::Other(what.into()),
            Item::Str(bytes, ivars) => Value::Str {
                bytes: bytes.to_vec(),
                encoding: ivars.map_or(Ok(Encoding::Binary), |p| self.encoding(p))?,
            },
            Item::Sym(s) => Value::Sym(String::from_utf8_lossy(s).into_owned()),
            Item::Array(n) => {
                let mut out = Vec::with_capacity((n as usize).min(1024));
                for _ in 0..n {
                    out.push(self.value_at(next, depth + 1)?);
                    next = self.skip(next)?;
                }
                Value::Array(out)
            }
            Item::Hash(n) => {
                let mut out = Vec::with_capacity((n as usize).min(1024));
                for _ in 0..n {
                    let k = self.value_at(next, depth + 1)?;
                    next = self.skip(next)?;
                    out.push((k, self.value_at(next, depth + 1)?));
                    next = self.skip(next)?;
                }
                Value::Hash(out)
            }
        })
    }

    /// A String's encoding from its ivars: the first `E` or `encoding` decides.
    fn encoding(&self, pos: Pos) -> Result<Encoding> {
        let (n, mut next) = self.len(pos).map_err(scan_error)?;
        for _ in 0..n {
            let (name, after) = DocView(self).symbol_at(next).map_err(scan_error)?;
            next = after;
            let tag = self.byte(next).map_err(scan_error)?;
            match (name, tag) {
                (b"E", b'T') => return Ok(Encoding::Utf8),
                (b"E", _) => return Ok(Encoding::UsAscii),
                (b"encoding", b'"') => {
                    let (enc, _) = self.chunk(next + 1).map_err(scan_error)?;
                    return Ok(match enc {
                        b"UTF-8" => Encoding::Utf8,
                        b"US-ASCII" => Encoding::UsAscii,
                        b"ASCII-8BIT" => Encoding::Binary,
                        other => Encoding::Other(String::from_utf8_lossy(other).into_owned()),
                    });
                }
                _ => {}
            }
            next = self.skip(next)?;
        }
        Ok(Encoding::Binary)
    }
}

fn scan_error(e: Scan) -> Error {
    match e {
        Scan::Invalid(e) => *e,
        Scan::Unsupported(what) => Error::Marshal(what.into()),
    }
}

/// Symbols read after the scan (never registered again).
struct DocView<'d, 'a>(&'d Doc<'a>);

impl<'a> DocView<'_, 'a> {
    fn symbol_at(&self, pos: Pos) -> ScanResult<(&'a [u8], Pos)> {
        let doc = self.0;
        match doc.byte(pos)? {
            b':' => doc.chunk(pos + 1),
            b';' => {
                let (idx, next) = doc.index(pos + 1)?;
                match doc.symbols.get(idx) {
                    Some(&(a, b)) => Ok((&doc.bytes[a as usize..b as usize], next)),
                    None => bad(format!("symbol link {idx} has no matching symbol")),
                }
            }
            other => bad(format!("unexpected type tag {other:#04x} at byte {pos}")),
        }
    }
}

/// A Float's text as marshal-rs reads it: up to a NUL, then Rust's parser.
fn float_text(bytes: &[u8]) -> Option<f64> {
    std::str::from_utf8(bytes.split(|&b| b == 0).next()?).ok()?.parse().ok()
}

/// A Bignum that fits in i64, as marshal-rs reads it.
fn bignum(negative: bool, magnitude_le: &[u8]) -> Option<i64> {
    let end = magnitude_le.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let bytes = &magnitude_le[..end];
    if bytes.len() > 8 {
        return None;
    }
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    let magnitude = u64::from_le_bytes(buf);
    if negative && magnitude != 0 {
        return (magnitude <= 1u64 << 63).then(|| (magnitude as i64).wrapping_neg());
    }
    i64::try_from(magnitude).ok()
}

/// Decodes like [`marshal::decode_with`], through the scan when the stream is in the
/// subset (for tests and the fuzz targets, which hold the two to each other).
pub fn decode_with(bytes: &[u8], limits: DecodeLimits) -> Result<Value> {
    match Doc::scan(bytes, limits) {
        Ok(doc) => doc.value(doc.root()),
        Err(Scan::Invalid(e)) => Err(*e),
        Err(Scan::Unsupported(_)) => marshal::decode_with(bytes, limits),
    }
}
