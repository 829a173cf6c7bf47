//! What compiling a clause's regex will cost, estimated from its syntax before the
//! regex crate does the work.
//!
//! `RegexBuilder::size_limit` bounds the compiled program, but it is checked after
//! the pattern is translated, and translation can be the expensive part. Under
//! case-insensitive matching (`(?i)`) the regex crate folds every character class
//! code point by code point: one class that spans all of Unicode (`[[^a]]`, `[\p{L}]`,
//! `[\x00-\x{10FFFF}]`) takes about 4 ms on a 2020s x86 core, and a clause of 4 KiB
//! can hold dozens of them. A manifest's call, or a kick report that a node forged,
//! would then spend a fraction of a second of the master's CPU per clause. So each
//! clause is charged from its syntax tree (cheap to build: one pass, no tables) and a
//! query whose clauses together cost more than [`QUERY_BUDGET`] is refused, with an
//! error naming the clause. The estimate depends on the text only, so the same
//! clauses are always accepted or always refused, cached or not.
//!
//! One unit is about a microsecond of compiling on the machine of `docs/performance.md`
//! (release build); each charge is above what was measured there for its worst case
//! (`cargo bench --bench regex_cost` measures these cases and prints their charges):
//!
//! | what | charge | measured |
//! |------|--------|----------|
//! | any regex | 16 | 7 µs for `(?i)^web12$` |
//! | a Unicode or Perl class (`\w`, `\p{L}`), inside brackets or not | 256, and 72 a copy | 223 µs for `\w+`, 316 µs for `(?i)\p{L}`, 4.3 ms for `\w{1,64}` |
//! | a bracketed class | 48 a copy | 26 µs for `(?i)^web1[^a]$`, 366 µs for `(?i)[^a]{0,100}` |
//! | `.` | 4 a copy | 657 µs for 200 of them |
//! | under `(?i)`, a bracketed class holding a nested class, a Unicode or Perl class or a set operation, or spanning all of Unicode: a full fold | 4,352 more | 4.9 ms for `(?i)[\x00-\x{10FFFF}]` |
//! | under `(?i)`, any other bracketed class | its code points / 64 more | 3.8 ms for `(?i)[\x00-\x{FFFF}]` 4 times |
//!
//! A repetition multiplies its body's automaton by its bound (`x{0,200}` is 200 copies)
//! but not its translation.
//!
//! The compiled program itself is bounded by `size_limit` (src/query/clause.rs).

use regex_syntax::ast::{
    self, Ast, ClassBracketed, ClassSet, ClassSetItem, Flag, Flags, RepetitionKind, RepetitionRange,
};

/// Units the clauses of one query may cost together (about 20 ms of translation).
pub const QUERY_BUDGET: u64 = 20_000;

/// Deeper nesting is refused by the regex crate too (its default nest limit).
const NEST_LIMIT: u32 = 250;

/// Code points folded per unit (the Basic Multilingual Plane's density of case pairs).
const CODE_POINTS_PER_UNIT: u64 = 64;

/// A full fold: a class spanning all of Unicode.
const FULL_FOLD: u64 = 4_352;

/// Any regex: parsing and compiling a short literal pattern.
const BASE: u64 = 16;

/// A Unicode or Perl class: building its table once, and each copy of the UTF-8
/// automaton it compiles to.
const TABLE_CLASS: u64 = 256;
const TABLE_CLASS_COPY: u64 = 72;

/// A bracketed class, before any fold.
const BRACKET: u64 = 48;

/// `.`: any character, as a UTF-8 automaton.
const DOT: u64 = 4;

/// The estimated cost of compiling `pattern`, in units; `None` when it does not
/// parse (the regex crate then reports why, in its own words).
pub fn regex_cost(pattern: &str) -> Option<u64> {
    let ast = ast::parse::ParserBuilder::new().nest_limit(NEST_LIMIT).build().parse(pattern).ok()?;
    let case_insensitive = sets_case_insensitive(&ast);
    Some(BASE.saturating_add(cost(&ast, case_insensitive).total()))
}

/// Whether `(?i)` is set anywhere; it is then priced as if it held for the whole
/// pattern. (Recursion is bounded by [`NEST_LIMIT`], as the parser enforced it.)
fn sets_case_insensitive(ast: &Ast) -> bool {
    let sets = |flags: &Flags| flags.flag_state(Flag::CaseInsensitive) == Some(true);
    match ast {
        Ast::Flags(set) => sets(&set.flags),
        Ast::Group(group) => {
            matches!(&group.kind, ast::GroupKind::NonCapturing(flags) if sets(flags))
                || sets_case_insensitive(&group.ast)
        }
        Ast::Repetition(repetition) => sets_case_insensitive(&repetition.ast),
        Ast::Alternation(alternation) => alternation.asts.iter().any(sets_case_insensitive),
        Ast::Concat(concat) => concat.asts.iter().any(sets_case_insensitive),
        _ => false,
    }
}

/// What compiling a piece of a pattern costs: translation, paid once, and the
/// automaton, paid for each copy a repetition makes (`x{0,200}` is 200 copies).
#[derive(Clone, Copy, Default)]
struct Cost {
    once: u64,
    each: u64,
}

impl Cost {
    fn once(units: u64) -> Cost {
        Cost { once: units, each: 0 }
    }

    fn each(units: u64) -> Cost {
        Cost { once: 0, each: units }
    }

    fn plus(self, other: Cost) -> Cost {
        Cost { once: self.once.saturating_add(other.once), each: self.each.saturating_add(other.each) }
    }

    fn total(self) -> u64 {
        self.once.saturating_add(self.each)
    }
}

fn cost(ast: &Ast, case_insensitive: bool) -> Cost {
    match ast {
        Ast::Empty(_) | Ast::Flags(_) | Ast::Assertion(_) => Cost::default(),
        Ast::Literal(_) => Cost::each(1),
        Ast::Dot(_) => Cost::each(DOT),
        Ast::ClassUnicode(_) | Ast::ClassPerl(_) => Cost::once(TABLE_CLASS).plus(Cost::each(TABLE_CLASS_COPY)),
        Ast::ClassBracketed(class) => bracket(class, case_insensitive),
        Ast::Group(group) => cost(&group.ast, case_insensitive),
        Ast::Repetition(repetition) => {
            let copies = match &repetition.op.kind {
                RepetitionKind::ZeroOrOne | RepetitionKind::ZeroOrMore | RepetitionKind::OneOrMore => 1,
                RepetitionKind::Range(RepetitionRange::Exactly(n) | RepetitionRange::AtLeast(n)) => (*n).max(1),
                RepetitionKind::Range(RepetitionRange::Bounded(_, n)) => (*n).max(1),
            };
            let body = cost(&repetition.ast, case_insensitive);
            Cost { once: body.once, each: body.each.saturating_mul(u64::from(copies)) }
        }
        Ast::Alternation(alternation) => sum(&alternation.asts, case_insensitive),
        Ast::Concat(concat) => sum(&concat.asts, case_insensitive),
    }
}

fn sum(asts: &[Ast], case_insensitive: bool) -> Cost {
    asts.iter().fold(Cost::default(), |total, ast| total.plus(cost(ast, case_insensitive)))
}

/// A bracketed class: its items, and under `(?i)` its fold, which walks the class's
/// code points. A class that holds a nested class, a table class or a set operation
/// may span all of Unicode by the time it is folded, so it is priced as a full fold.
fn bracket(class: &ClassBracketed, case_insensitive: bool) -> Cost {
    let (items, operation): (Vec<&ClassSetItem>, u64) = match &class.kind {
        ClassSet::BinaryOp(op) => {
            let sides = [&*op.lhs, &*op.rhs];
            let cost = sides.iter().map(|side| set_cost(side, case_insensitive)).fold(0u64, u64::saturating_add);
            (Vec::new(), cost.saturating_add(FULL_FOLD))
        }
        ClassSet::Item(ClassSetItem::Union(union)) => (union.items.iter().collect(), 0),
        ClassSet::Item(item) => (vec![item], 0),
    };
    let mut total = Cost { once: operation, each: BRACKET };
    let mut code_points: u64 = 0;
    let mut spans_everything = operation > 0;
    for item in items {
        match item {
            ClassSetItem::Range(range) => {
                code_points += u64::from(range.end.c).saturating_sub(u64::from(range.start.c)) + 1;
            }
            ClassSetItem::Unicode(_) | ClassSetItem::Perl(_) => {
                total = total.plus(Cost::once(TABLE_CLASS));
                spans_everything = true;
            }
            ClassSetItem::Bracketed(nested) => {
                total = total.plus(Cost::once(bracket(nested, case_insensitive).total()));
                spans_everything = true;
            }
            ClassSetItem::Union(_) => spans_everything = true,
            ClassSetItem::Empty(_) | ClassSetItem::Literal(_) | ClassSetItem::Ascii(_) => code_points += 1,
        }
    }
    if case_insensitive {
        let fold = if spans_everything { FULL_FOLD } else { (code_points / CODE_POINTS_PER_UNIT).min(FULL_FOLD) };
        total = total.plus(Cost::once(fold));
    }
    total
}

/// One side of a class set operation (`[a-z&&[^aeiou]]`).
fn set_cost(set: &ClassSet, case_insensitive: bool) -> u64 {
    match set {
        ClassSet::BinaryOp(op) => set_cost(&op.lhs, case_insensitive)
            .saturating_add(set_cost(&op.rhs, case_insensitive))
            .saturating_add(if case_insensitive { FULL_FOLD } else { 0 }),
        ClassSet::Item(ClassSetItem::Bracketed(nested)) => bracket(nested, case_insensitive).total(),
        ClassSet::Item(ClassSetItem::Union(union)) => union
            .items
            .iter()
            .map(|item| match item {
                ClassSetItem::Bracketed(nested) => bracket(nested, case_insensitive).total(),
                ClassSetItem::Unicode(_) | ClassSetItem::Perl(_) => TABLE_CLASS,
                _ => 1,
            })
            .fold(0, u64::saturating_add),
        ClassSet::Item(ClassSetItem::Unicode(_) | ClassSetItem::Perl(_)) => TABLE_CLASS,
        ClassSet::Item(_) => 1,
    }
}
