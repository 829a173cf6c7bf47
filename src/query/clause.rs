//! One `servers_with_facts` clause: parsing and testing a server against it.
//!
//! The syntax is mcollective's fact filter, which users of the original wrote, plus
//! dotted paths and `!~`: `fact OP value`, spaces allowed around `OP`.

use super::compare::{Comparison, Operand};
use super::cost::{regex_cost, QUERY_BUDGET};
use crate::error::{Error, Result};
use crate::facts::{FactPath, Node};
use crate::store::{Kind, View};
use regex::{Regex, RegexBuilder};
use serde_json::Value;
use std::cmp::Ordering;

/// Upper bound on a compiled regex, so a clause cannot eat the master's memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

const OPERATORS: &str = "=, ==, !=, =~, !~, <, >, <=, >=, => (>=), =< (<=)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Clone, Debug)]
enum Test {
    Compare(Op, Operand),
    /// `cost`: what compiling `regex` was priced at ([`regex_cost`]).
    Regex {
        regex: Regex,
        negated: bool,
        cost: u64,
    },
}

/// How a clause's comparison went on one value: a scalar, or one element of a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub comparison: Comparison,
    /// Whether the positive form of the test held (`=` for `!=`, `=~` for `!~`).
    pub matched: bool,
}

#[derive(Clone, Debug)]
pub struct Clause {
    text: String,
    path: FactPath,
    test: Test,
}

impl Clause {
    pub fn parse(text: &str) -> Result<Clause> {
        let error = |column: usize, what: String| Error::Query(format!("clause '{text}': {what} (at column {column})"));

        let op_start = text.find(['=', '!', '<', '>', '~']).ok_or_else(|| {
            error(text.len() + 1, format!("no operator; expected `fact OP value` with OP one of {OPERATORS}"))
        })?;
        let path = text[..op_start].trim();
        if path.is_empty() {
            return Err(error(op_start + 1, "no fact name before the operator".into()));
        }
        if let Some(bad) = path.find(char::is_whitespace) {
            return Err(error(bad + 1, format!("fact name '{path}' contains a space")));
        }
        if path.split('.').any(str::is_empty) {
            return Err(error(1, format!("fact path '{path}' has an empty segment")));
        }

        let op_len = text[op_start..].bytes().take_while(|b| b"=!<>~".contains(b)).count();
        let op_text = &text[op_start..op_start + op_len];
        let value_start = op_start + op_len;
        let value = text[value_start..].trim();
        if value.is_empty() {
            return Err(error(value_start + 1, format!("no value after the operator '{op_text}'")));
        }
        let slashed = value.len() >= 2 && value.starts_with('/') && value.ends_with('/');
        let regex_source = if slashed { &value[1..value.len() - 1] } else { value };
        let regex_cost = if slashed || op_text.contains('~') { regex_cost(regex_source).unwrap_or(0) } else { 0 };
        if regex_cost > QUERY_BUDGET {
            return Err(error(
                value_start + 1,
                format!(
                    "regex /{regex_source}/ would take too long to compile (cost {regex_cost}, at most {QUERY_BUDGET}): \
                     fewer character classes, or no (?i) with classes that span much of Unicode"
                ),
            ));
        }
        let regex = |negated: bool| -> Result<Test> {
            let regex = RegexBuilder::new(regex_source)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| error(value_start + 1, format!("invalid regex /{regex_source}/: {}", regex_error(&e))))?;
            Ok(Test::Regex { regex, negated, cost: regex_cost })
        };
        let compare = |op: Op| -> Result<Test> {
            if slashed && !matches!(op, Op::Eq | Op::Ne) {
                return Err(error(value_start + 1, format!("a regex cannot be compared with '{op_text}'")));
            }
            Ok(Test::Compare(op, Operand::new(value)))
        };

        let test = match op_text {
            "=" | "==" if slashed => regex(false)?,
            "!=" if slashed => regex(true)?,
            "=" | "==" => compare(Op::Eq)?,
            "!=" => compare(Op::Ne)?,
            "=~" => regex(false)?,
            "!~" => regex(true)?,
            "<" => compare(Op::Lt)?,
            ">" => compare(Op::Gt)?,
            "<=" | "=<" => compare(Op::Le)?,
            ">=" | "=>" => compare(Op::Ge)?,
            other => {
                return Err(error(op_start + 1, format!("unknown operator '{other}'; expected one of {OPERATORS}")))
            }
        };
        Ok(Clause { text: text.to_string(), path: FactPath::new(path), test })
    }

    /// What compiling the clause's regex cost, in the units of [`super::cost`]; 0 for
    /// a comparison.
    pub fn cost(&self) -> u64 {
        match self.test {
            Test::Regex { cost, .. } => cost,
            Test::Compare(..) => 0,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn path(&self) -> &str {
        self.path.as_str()
    }

    pub fn fact_path(&self) -> &FactPath {
        &self.path
    }

    /// The value of an equality clause that an exact-match index can answer.
    pub fn plain_equality(&self) -> Option<&str> {
        match &self.test {
            Test::Compare(Op::Eq, operand) if operand.is_plain_text() => Some(&operand.text),
            _ => None,
        }
    }

    /// Whether `node` satisfies the clause. A missing fact never matches, `!=` and
    /// `!~` included (mcollective's rule); a clause on `environment` tests the
    /// server's resolved environment; one on `certname` tests its certname unless a
    /// fact has that name (the functions return it like a fact, so it is queried as one).
    pub fn matches(&self, node: &Node) -> bool {
        if self.path.as_str() == "environment" {
            return self.holds(|test| test.on_text(&node.environment));
        }
        match node.fact(&self.path) {
            None if self.path.as_str() == "certname" => self.holds(|test| test.on_text(&node.certname)),
            None | Some(Value::Null) => false,
            Some(Value::Array(items)) => self.holds(|test| items.iter().any(|item| test.on_value(item))),
            Some(value) => self.holds(|test| test.on_value(value)),
        }
    }

    /// Whether a value found at the clause's path satisfies it: a list when any
    /// element does (for `!=`/`!~`, when none does); never a null. The store-backed
    /// twin of [`Clause::matches`], which the index calls once per distinct value.
    pub fn holds_on_view(&self, value: View) -> bool {
        match value.kind() {
            Kind::Null => false,
            Kind::Array(items) => self.holds(|test| items.iter().any(|item| test.on_view(item))),
            _ => self.holds(|test| test.on_view(value)),
        }
    }

    /// Whether a server's environment, or its certname standing in for a missing
    /// `certname` fact, satisfies the clause.
    pub fn holds_on_text(&self, text: &str) -> bool {
        self.holds(|test| test.on_text(text))
    }

    /// Whether the test is negated (`!=`, `!~`): it holds when its positive form
    /// holds on no element.
    pub fn negated(&self) -> bool {
        matches!(self.test, Test::Compare(Op::Ne, _) | Test::Regex { negated: true, .. })
    }

    /// The steps by which [`Self::holds_on_view`] decides on `value`: one per element
    /// of a list, one for a scalar or a hash, none for a null (which never matches).
    pub fn steps_on_view(&self, value: View) -> Vec<Step> {
        let positive = self.positive();
        match value.kind() {
            Kind::Null => Vec::new(),
            Kind::Array(items) => items.iter().map(|item| positive.on_view_by(item)).collect(),
            _ => vec![positive.on_view_by(value)],
        }
    }

    /// The step by which [`Self::holds_on_text`] decides on `text`.
    pub fn step_on_text(&self, text: &str) -> Step {
        self.positive().on_text_by(text)
    }

    /// Applies the positive form of the test and negates it for `!=`/`!~`, so a
    /// list fact is "not equal" only when no element is equal.
    fn holds(&self, positive: impl Fn(&Positive) -> bool) -> bool {
        positive(&self.positive()) != self.negated()
    }

    fn positive(&self) -> Positive<'_> {
        match &self.test {
            Test::Compare(Op::Ne, operand) => Positive::Compare(Op::Eq, operand),
            Test::Compare(op, operand) => Positive::Compare(*op, operand),
            Test::Regex { regex, .. } => Positive::Regex(regex),
        }
    }
}

enum Positive<'a> {
    Compare(Op, &'a Operand),
    Regex(&'a Regex),
}

// Each test is written once, in its `_by` form, which also says which comparison
// decided (for `explain`); the plain forms keep only the verdict.
impl Positive<'_> {
    fn on_value(&self, value: &Value) -> bool {
        self.on_value_by(value).matched
    }

    fn on_view(&self, value: View) -> bool {
        self.on_view_by(value).matched
    }

    fn on_text(&self, s: &str) -> bool {
        self.on_text_by(s).matched
    }

    fn on_value_by(&self, value: &Value) -> Step {
        let step = |comparison, matched| Step { comparison, matched };
        match (self, value) {
            (_, Value::String(s)) => self.on_text_by(s),
            (Positive::Compare(op, operand), _) => match operand.compare_by(value) {
                Some((comparison, ordering)) => step(comparison, op_holds(*op, ordering)),
                None => step(Comparison::Incomparable, false),
            },
            (Positive::Regex(regex), Value::Number(n)) => step(Comparison::Regex, regex.is_match(&n.to_string())),
            (Positive::Regex(regex), Value::Bool(b)) => {
                step(Comparison::Regex, regex.is_match(if *b { "true" } else { "false" }))
            }
            (Positive::Regex(_), _) => step(Comparison::Incomparable, false),
        }
    }

    fn on_view_by(&self, value: View) -> Step {
        match value.kind() {
            Kind::Str(s) => self.on_text_by(s),
            // Numbers and booleans as serde_json has them (no allocation), so the
            // rules stay written once; a container never matches.
            _ => match value.scalar_json() {
                Some(scalar) => self.on_value_by(&scalar),
                None => Step { comparison: Comparison::Incomparable, matched: false },
            },
        }
    }

    fn on_text_by(&self, s: &str) -> Step {
        match self {
            Positive::Compare(op, operand) => {
                let (comparison, ordering) = operand.compare_text_by(s);
                Step { comparison, matched: op_holds(*op, ordering) }
            }
            Positive::Regex(regex) => Step { comparison: Comparison::Regex, matched: regex.is_match(s) },
        }
    }
}

fn op_holds(op: Op, ordering: Ordering) -> bool {
    match op {
        Op::Eq => ordering == Ordering::Equal,
        Op::Ne => ordering != Ordering::Equal,
        Op::Lt => ordering == Ordering::Less,
        Op::Gt => ordering == Ordering::Greater,
        Op::Le => ordering != Ordering::Greater,
        Op::Ge => ordering != Ordering::Less,
    }
}

/// The regex crate's messages span several lines with a caret diagram; keep the
/// last line, which says what is unsupported (look-around, back-references, ...).
fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(&text).trim().trim_start_matches("error: ").to_string()
}
