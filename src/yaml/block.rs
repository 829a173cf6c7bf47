//! A fast path for the block YAML that Psych (and yaml-rust2's emitter) write for
//! a fact cache: mappings and sequences by indentation, one-line plain and quoted
//! scalars, `{}` and `[]`. Lines are split once and scalars are borrowed from the
//! text, where yaml-rust2's scanner goes character by character and allocates a
//! String for every scalar.
//!
//! It never decides anything on its own: a document with anything else (anchors,
//! aliases, tags past the header, flow collections, escapes, multi-line scalars,
//! comments, tabs, control characters) or anything near a limit is declined, and
//! [`super::decode`] reads it with the full parser. What it accepts it types with
//! the full parser's own functions, so both give the same ids
//! (`tests/yaml_decode.rs` and the `yaml_facts_and_config` fuzz target hold it).

use super::{may_be_typed, plain, store_key, store_scalar, MAX_DEPTH, MAX_TEXT, MAX_VALUES};
use crate::store::{Builder, ValueId};

/// The document's value in `builder`, or `None` when the document is not of the
/// simple shape (nothing added to the builder's stack then; values interned on
/// the way stay, unreferenced, as after a failed decode).
pub(super) fn decode(text: &str, builder: &mut Builder) -> Option<ValueId> {
    if !simple_characters(text) {
        return None;
    }
    let mut lines = split_lines(text)?;
    let start = header_lines(&lines)?;
    let first = *lines.get(start)?;
    let mark = builder.open();
    let mut reader = Reader { lines: &mut lines, at: start, builder, values: 0, text: 0 };
    let root = reader.block(first.indent, 0).filter(|_| reader.at == reader.lines.len());
    if root.is_none() {
        reader.builder.discard_open(mark);
    }
    root
}

#[derive(Clone, Copy)]
struct Line<'t> {
    indent: usize,
    /// After the indentation, trailing spaces removed; never empty.
    text: &'t str,
}

/// Only printable characters, no tab or carriage return: anything else may be
/// read differently (or refused) by the full parser.
fn simple_characters(text: &str) -> bool {
    if text.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\n') {
        return true;
    }
    text.chars().all(|c| match c {
        '\n' => true,
        ' '..='~' => true,
        '\u{0}'..='\u{a0}' | '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}' => false,
        _ => true,
    })
}

/// The non-blank lines; `None` when a line could open or close a document (only
/// the first may be `---`, the header; none may be `...`, even the first).
fn split_lines(text: &str) -> Option<Vec<Line<'_>>> {
    let mut lines = Vec::with_capacity(text.len() / 24);
    for line in text.split('\n') {
        let content = line.trim_end_matches(' ');
        let body = content.trim_start_matches(' ');
        if body.is_empty() {
            continue;
        }
        let indent = content.len() - body.len();
        if indent == 0 && (body.starts_with("---") && !lines.is_empty() || body.starts_with("...")) {
            return None;
        }
        lines.push(Line { indent, text: body });
    }
    Some(lines)
}

/// Lines before the document's content: none, or `---` with at most a plain tag
/// (`--- !ruby/object:Puppet::Node::Facts`).
fn header_lines(lines: &[Line]) -> Option<usize> {
    let Some(first) = lines.first() else { return Some(0) };
    let Some(rest) = first.text.strip_prefix("---") else { return Some(0) };
    if first.indent != 0 {
        return None;
    }
    let tag_ok = match rest.strip_prefix(" !") {
        Some(tag) => !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b":/_.-".contains(&b)),
        None => rest.is_empty(),
    };
    tag_ok.then_some(1)
}

struct Reader<'l, 't, 'b> {
    lines: &'l mut Vec<Line<'t>>,
    at: usize,
    builder: &'b mut Builder,
    /// Values and text so far, counted as the full parser counts them.
    values: usize,
    text: usize,
}

impl<'t> Reader<'_, 't, '_> {
    /// The collection starting at the current line, indented `indent`, nested in
    /// `depth` others.
    fn block(&mut self, indent: usize, depth: usize) -> Option<ValueId> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.count(1, 0)?;
        if is_entry(self.lines[self.at].text) {
            self.sequence(indent, depth)
        } else {
            self.mapping(indent, depth)
        }
    }

    fn mapping(&mut self, indent: usize, depth: usize) -> Option<ValueId> {
        let mark = self.builder.open();
        while let Some(&line) = self.lines.get(self.at) {
            if line.indent < indent {
                break;
            }
            if line.indent > indent || is_entry(line.text) {
                return None;
            }
            let (key, rest) = split_key(line.text)?;
            self.at += 1;
            self.count(1, key.text().len())?;
            let key = match key {
                Scalar::Plain(text) if !may_be_typed(text) => self.builder.string(text),
                Scalar::Plain(text) => store_key(self.builder, &plain(text.to_string())),
                Scalar::Quoted(text) => self.builder.string(&text),
            };
            let value = if rest.is_empty() { self.nested(indent, depth, true)? } else { self.inline(rest)? };
            self.builder.push_child(key);
            self.builder.push_child(value);
        }
        Some(self.builder.close_object(mark))
    }

    fn sequence(&mut self, indent: usize, depth: usize) -> Option<ValueId> {
        let mark = self.builder.open();
        while let Some(&line) = self.lines.get(self.at) {
            if line.indent < indent {
                break;
            }
            if line.indent > indent {
                return None;
            }
            if !is_entry(line.text) {
                // The next key of a mapping at this indentation (else declined there).
                break;
            }
            let rest = line.text[1..].trim_start_matches(' ');
            let item = if rest.is_empty() {
                self.at += 1;
                self.nested(indent, depth, false)?
            } else if is_entry(rest) {
                return None;
            } else if split_key(rest).is_some() {
                // `- key: value`: a mapping whose keys line up after the dash.
                let inner = indent + (line.text.len() - rest.len());
                self.lines[self.at] = Line { indent: inner, text: rest };
                self.block(inner, depth + 1)?
            } else {
                self.at += 1;
                self.inline(rest)?
            };
            self.builder.push_child(item);
        }
        Some(self.builder.close_array(mark))
    }

    /// What follows a key or a dash with nothing after it on its line: a deeper
    /// collection, a sequence at the key's own indentation, or nothing (null).
    fn nested(&mut self, indent: usize, depth: usize, after_key: bool) -> Option<ValueId> {
        match self.lines.get(self.at) {
            Some(next) if next.indent > indent => self.block(next.indent, depth + 1),
            Some(next) if after_key && next.indent == indent && is_entry(next.text) => self.block(indent, depth + 1),
            _ => self.scalar(Scalar::Plain("")),
        }
    }

    /// A value on the rest of a line: a scalar, `{}` or `[]`.
    fn inline(&mut self, text: &'t str) -> Option<ValueId> {
        match text {
            "{}" => {
                self.count(1, 0)?;
                let mark = self.builder.open();
                Some(self.builder.close_object(mark))
            }
            "[]" => {
                self.count(1, 0)?;
                let mark = self.builder.open();
                Some(self.builder.close_array(mark))
            }
            _ => {
                let (scalar, rest) = scalar(text)?;
                if !rest.is_empty() {
                    return None;
                }
                self.scalar(scalar)
            }
        }
    }

    fn scalar(&mut self, scalar: Scalar<'t>) -> Option<ValueId> {
        self.count(1, scalar.text().len())?;
        Some(match scalar {
            Scalar::Plain(text) if !may_be_typed(text) => self.builder.string_value(text),
            Scalar::Plain(text) => store_scalar(self.builder, plain(text.to_string())),
            Scalar::Quoted(text) => self.builder.string_value(&text),
        })
    }

    /// Counts values and text as the full parser does; near a limit, declines (the
    /// full parser then says which limit, and where).
    fn count(&mut self, values: usize, text: usize) -> Option<()> {
        self.values += values;
        self.text += text;
        (self.values < MAX_VALUES && self.text < MAX_TEXT).then_some(())
    }
}

enum Scalar<'t> {
    Plain(&'t str),
    Quoted(std::borrow::Cow<'t, str>),
}

impl Scalar<'_> {
    fn text(&self) -> &str {
        match self {
            Scalar::Plain(text) => text,
            Scalar::Quoted(text) => text,
        }
    }
}

/// A block sequence entry: `- ...` or a lone `-`.
fn is_entry(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// YAML's bound on an implicit key: its `:` at most this many characters after the
/// key's first. Past it the full parser refuses the document ("simple key expect
/// ':'", as libyaml and so Psych do), so a longer key is declined here.
const MAX_SIMPLE_KEY: usize = 1024;

/// `key: rest` (rest possibly empty), the key plain or quoted.
fn split_key(text: &str) -> Option<(Scalar<'_>, &str)> {
    let (key, after) = if text.starts_with(['\'', '"']) {
        scalar(text)?
    } else {
        let end = text
            .match_indices(':')
            .map(|(i, _)| i)
            .find(|&i| text[i + 1..].is_empty() || text[i + 1..].starts_with(' '))?;
        let key = text[..end].trim_end_matches(' ');
        (plain_scalar(key)?, &text[end..])
    };
    let colon = text.len() - after.len();
    if colon > MAX_SIMPLE_KEY && text[..colon].chars().count() > MAX_SIMPLE_KEY {
        return None;
    }
    let rest = after.strip_prefix(':')?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    Some((key, rest.trim_start_matches(' ')))
}

/// A scalar at the start of `text`, and what follows it (after a quoted one).
fn scalar(text: &str) -> Option<(Scalar<'_>, &str)> {
    if let Some(body) = text.strip_prefix('\'') {
        let mut unquoted = String::new();
        let mut rest = body;
        loop {
            let quote = rest.find('\'')?;
            unquoted.push_str(&rest[..quote]);
            rest = &rest[quote + 1..];
            match rest.strip_prefix('\'') {
                Some(after) => {
                    unquoted.push('\'');
                    rest = after;
                }
                None => return Some((Scalar::Quoted(unquoted.into()), rest)),
            }
        }
    }
    if let Some(body) = text.strip_prefix('"') {
        let end = body.find(['"', '\\'])?;
        if body.as_bytes()[end] == b'"' {
            return Some((Scalar::Quoted(body[..end].into()), &body[end + 1..]));
        }
        let (unquoted, rest) = double_quoted_with_escapes(body)?;
        return Some((Scalar::Quoted(unquoted.into()), rest));
    }
    Some((plain_scalar(text)?, ""))
}

/// The text of a double-quoted scalar with escapes (`body` follows the opening
/// quote), and what follows the closing quote; `None` for an escape YAML does not
/// have (the full parser then refuses the document).
fn double_quoted_with_escapes(body: &str) -> Option<(String, &str)> {
    let mut unquoted = String::with_capacity(body.len());
    let mut rest = body;
    loop {
        let end = rest.find(['"', '\\'])?;
        unquoted.push_str(&rest[..end]);
        let (mark, after) = (rest.as_bytes()[end], &rest[end + 1..]);
        if mark == b'"' {
            return Some((unquoted, after));
        }
        let escape = *after.as_bytes().first()?;
        let hex_digits = match escape {
            b'x' => 2,
            b'u' => 4,
            b'U' => 8,
            _ => 0,
        };
        let simple = match escape {
            b'0' => '\0',
            b'a' => '\u{7}',
            b'b' => '\u{8}',
            b't' => '\t',
            b'n' => '\n',
            b'v' => '\u{b}',
            b'f' => '\u{c}',
            b'r' => '\r',
            b'e' => '\u{1b}',
            b' ' => ' ',
            b'"' => '"',
            b'/' => '/',
            b'\\' => '\\',
            b'N' => '\u{85}',
            b'_' => '\u{a0}',
            b'L' => '\u{2028}',
            b'P' => '\u{2029}',
            _ if hex_digits > 0 => {
                let digits = after.get(1..1 + hex_digits)?;
                if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                char::from_u32(u32::from_str_radix(digits, 16).ok()?)?
            }
            _ => return None,
        };
        unquoted.push(simple);
        rest = &after[1 + hex_digits..];
    }
}

/// A one-line plain scalar, or `None` when the full parser could read `text`
/// otherwise: an indicator first, a comment, or a `: ` inside.
fn plain_scalar(text: &str) -> Option<Scalar<'_>> {
    let first = *text.as_bytes().first()?;
    let indicator = b"-?:,[]{}#&*!|>'\"%@`".contains(&first);
    let dash_like = matches!(first, b'-' | b'?' | b':') && text.len() > 1 && text.as_bytes()[1] != b' ';
    if (indicator && !dash_like) || text.contains(" #") || text.contains(": ") || text.ends_with(':') {
        return None;
    }
    Some(Scalar::Plain(text))
}

#[cfg(test)]
mod tests {
    use super::super::{decode as full_decode, parse};
    use super::*;
    use crate::synthetic::{self, Rng};

    /// Whether the fast path took `text`, after checking that `yaml::decode` (fast
    /// path or not) gives what the full parser's tree gives, id for id.
    fn taken(text: &str) -> bool {
        let mut builder = Builder::new();
        let fast = decode(text, &mut builder);
        assert_eq!(builder.open(), 0, "{text:?}: a declined document leaves nothing on the stack");
        let mut full = Builder::new();
        match (parse(text), full_decode(text, &mut full)) {
            (Ok(tree), Ok(id)) => {
                assert_eq!(full.value(&tree), id, "{text:?}");
                if let Some(fast) = fast {
                    assert_eq!(builder.value(&tree), fast, "{text:?}");
                }
            }
            (Err(a), Err(b)) => {
                assert_eq!(a, b, "{text:?}");
                assert!(fast.is_none(), "{text:?}: taken by the fast path, refused by the parser ({a})");
            }
            (a, b) => panic!("{text:?}: the tree gives {a:?}, the store {b:?}"),
        }
        fast.is_some()
    }

    #[test]
    fn fact_files_as_psych_and_yaml_rust2_write_them_are_taken() {
        let fixture = include_str!("../../tests/fixtures/puppet_cache/yaml/facts/lb1.example.com.yaml");
        assert!(taken(fixture));
        for node in synthetic::fleet(50, 7, 1_790_000_000) {
            let text = synthetic::yaml_fact_file(&node);
            assert!(taken(&text), "{text}");
        }
        for text in [
            "--- !ruby/object:Puppet::Node::Facts\nname: a\nvalues:\n  list:\n  - x\n  - y\n  other: 1\n",
            "list:\n  - x\n  -\n    deep: 1\n  - k: v\n    k2: 'it''s'\n  -   far: \"q\"\n      too: ''\n",
            "a: {}\nb: []\nc:\nd: ~\ne: 0x10\nf: '7'\n1.50: x\ng: 1e400\nh: -0.0\ni: true\nj: .inf\nk: 'a: b # c'\n",
            "mac: 52:54:00:00:00:02\nurl: http://x:80/a\nweird key  : v\n\"quoted key\": 1\n'single': 2\nb: 1\nb: 2\n",
            "- 1\n- - \n",
            "- a\n- b\n",
            "x: é∞ ünïcode\n",
            "a: \"tab\\tand \\\"quotes\\\" \\x41\\u00e9\\U0001F600 \\N\\_\\L\\P\\0\\e\\/\"\n",
            "sshfp: \"SSHFP 3 1 05\\nSSHFP 3 2 b3\"\n",
        ] {
            assert_eq!(taken(text), !text.starts_with("- 1"), "{text:?}");
        }
    }

    #[test]
    fn anything_else_is_declined_and_read_by_the_full_parser() {
        for text in [
            "",
            "---\n",
            "--- 1\n",
            "a: 1\n--- \nb: 2\n",
            "a: 1\n...\n",
            // Found by the yaml_facts_and_config fuzz target: taken as {"...": null},
            // where the full parser reads a document end marker, then refuses the rest.
            "... :\n",
            "...\na: 1\n",
            "a: &x 1\nb: *x\n",
            "a: !!str 3\n",
            "a: [1, 2]\n",
            "a: {b: 1}\n",
            "a: \"bad \\q escape\"\n",
            "a: \"short \\x4\"\n",
            "a: \"surrogate \\ud800\"\n",
            "a: \"unclosed \\\"\n",
            "a: plain\n  continued\n",
            "a: |\n  literal\n",
            "a: >\n  folded\n",
            "a: 1 # comment\n",
            "# comment\na: 1\n",
            "a:\tb\n",
            "a: 1\r\nb: 2\r\n",
            "a: 'unclosed\n  quote'\n",
            "key:value\n",
            "a: b: c\n",
            "? complex\n: key\n",
            "- - nested\n",
            "a:\n  - x\n  y: 1\n",
            "a:\n- x\n b: 1\n",
            "\u{feff}a: 1\n",
            "a: \u{85}\n",
            "%YAML 1.2\n---\na: 1\n",
            "a: @x\n",
            "a: `x\n",
            "a: ,x\n",
            "- x\nnot an entry\n",
            "a: 1\n  b: 2\n",
        ] {
            assert!(!taken(text), "{text:?} was taken");
        }
    }

    /// Found by the yaml_facts_and_config fuzz target: a key of 1,100 characters was
    /// taken, where the full parser (like libyaml) refuses an implicit key whose `:`
    /// is more than 1,024 characters after its start.
    #[test]
    fn implicit_keys_are_held_to_yamls_1024_characters() {
        for (key, ok) in [
            ("k".repeat(1024), true),
            ("k".repeat(1025), false),
            (format!("{}   ", "k".repeat(1021)), true),
            (format!("{}    ", "k".repeat(1021)), false),
            (format!("'{}'", "k".repeat(1022)), true),
            (format!("'{}'", "k".repeat(1023)), false),
            ("é".repeat(1024), true),
            ("é".repeat(1025), false),
        ] {
            for text in [format!("{key}: 1\n"), format!("a:\n  {key}: 1\n"), format!("- {key}: 1\n")] {
                assert_eq!(taken(&text), ok, "a key of {} characters", key.chars().count());
                assert_eq!(parse(&text).is_ok(), ok, "the full parser, a key of {} characters", key.chars().count());
            }
        }
    }

    #[test]
    fn the_depth_limit_is_left_to_the_full_parser() {
        let nested = |depth: usize| {
            (0..depth).map(|level| format!("{}k:\n", " ".repeat(level))).collect::<String>()
                + &format!("{}k: x\n", " ".repeat(depth))
        };
        assert!(taken(&nested(MAX_DEPTH - 1)));
        assert!(!taken(&nested(MAX_DEPTH)));
        assert!(!taken(&nested(MAX_DEPTH + 1)));
    }

    /// Generated fact files, mutated where a fast path would most likely go wrong:
    /// whatever either path makes of them, both make the same.
    #[test]
    fn mutated_fact_files_read_the_same_through_both_paths() {
        const INSERTS: [&str; 24] = [
            " ", "  ", ":", ": ", "#", " #", "-", "- ", "'", "\"", "\\", "\n", "\n  ", "{}", "[]", "&a ", "*a", "!x ",
            "|", "?", ",", "~", "1", "\t",
        ];
        let mut rng = Rng::new(0x4a4d);
        let files: Vec<String> = synthetic::fleet(8, 3, 1_790_000_000).iter().map(synthetic::yaml_fact_file).collect();
        let (mut cases, mut fast) = (0, 0);
        for _ in 0..4_000 {
            let mut text = rng.pick(&files).clone();
            for _ in 0..rng.range(1, 3) {
                let mut at = rng.below(text.len() as u64) as usize;
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                if rng.chance(0.3) {
                    let mut end = (at + rng.range(1, 4) as usize).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(at..end, "");
                } else {
                    let insert: &&str = rng.pick(&INSERTS);
                    text.insert_str(at, insert);
                }
            }
            cases += 1;
            fast += usize::from(taken(&text));
        }
        // Most single mutations leave a document of the simple shape: the fast path
        // is exercised, not just declined.
        assert!(fast > cases / 4, "the fast path took {fast} of {cases}");
    }
}
