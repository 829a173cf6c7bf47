//! How a fact value compares with the value written in a clause.
//!
//! mcollective compared numerically only when both sides looked numeric and otherwise
//! as strings; we keep that and add versions, so that `os.release.full>=11.2` holds
//! for `11.10`. The rules, in order, for two strings:
//! 1. both dot-separated unsigned integers, a dot in either: as versions;
//! 2. both integers (optionally signed): as integers;
//! 3. both decimal numbers (sign, fraction, exponent): as floats;
//! 4. otherwise: as strings, byte for byte (so case-sensitive).

use serde_json::Value;
use std::cmp::Ordering;

/// Which rule compared a value with a clause's operand (what `explain` shows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    Version,
    Integer,
    Decimal,
    String,
    Boolean,
    Regex,
    /// The value and the operand cannot be compared (a hash, a null, a boolean
    /// against a non-boolean): the comparison fails.
    Incomparable,
}

impl Comparison {
    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::Version => "version",
            Comparison::Integer => "integer",
            Comparison::Decimal => "decimal",
            Comparison::String => "string",
            Comparison::Boolean => "boolean",
            Comparison::Regex => "regex",
            Comparison::Incomparable => "incomparable",
        }
    }
}

/// A clause's right-hand side, classified once when the clause is compiled.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    pub text: String,
    shape: Shape,
}

/// Every numeric reading a string allows; `1.2` is both a version and a decimal.
#[derive(Clone, Debug, Default, PartialEq)]
struct Shape {
    version: Option<Vec<u64>>,
    integer: Option<i128>,
    float: Option<f64>,
}

impl Operand {
    pub fn new(text: &str) -> Operand {
        Operand { text: text.to_string(), shape: Shape::of(text) }
    }

    /// True when equality on this operand is plain string equality, so an exact-match
    /// index can answer it.
    pub fn is_plain_text(&self) -> bool {
        self.shape == Shape::default() && self.text != "true" && self.text != "false"
    }

    /// Compares a string (a fact, or a server's environment) with this operand.
    pub fn compare_text(&self, s: &str) -> Ordering {
        self.compare_text_by(s).1
    }

    /// [`Self::compare_text`], and the rule that decided.
    pub fn compare_text_by(&self, s: &str) -> (Comparison, Ordering) {
        compare_strings(&Shape::of(s), s, &self.shape, &self.text)
    }

    /// Compares a fact value with this operand; `None` when they cannot be compared
    /// (a hash, a null, a boolean against a non-boolean).
    pub fn compare(&self, fact: &Value) -> Option<Ordering> {
        self.compare_by(fact).map(|(_, ordering)| ordering)
    }

    /// [`Self::compare`], and the rule that decided.
    pub fn compare_by(&self, fact: &Value) -> Option<(Comparison, Ordering)> {
        match fact {
            Value::String(s) => Some(self.compare_text_by(s)),
            Value::Number(n) => {
                let integer = n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
                match (integer, self.shape.integer) {
                    (Some(a), Some(b)) => Some((Comparison::Integer, a.cmp(&b))),
                    _ => match self.shape.float {
                        Some(b) => n.as_f64()?.partial_cmp(&b).map(|o| (Comparison::Decimal, o)),
                        None => Some((Comparison::String, n.to_string().as_str().cmp(self.text.as_str()))),
                    },
                }
            }
            Value::Bool(b) => match self.text.as_str() {
                "true" => Some((Comparison::Boolean, b.cmp(&true))),
                "false" => Some((Comparison::Boolean, b.cmp(&false))),
                _ => None,
            },
            Value::Null | Value::Array(_) | Value::Object(_) => None,
        }
    }
}

impl Shape {
    fn of(s: &str) -> Shape {
        let version =
            if is_version(s) { s.split('.').map(|p| p.parse::<u64>().ok()).collect::<Option<Vec<_>>>() } else { None };
        let integer = if is_integer(s) { s.parse::<i128>().ok() } else { None };
        let float = if is_decimal(s) { s.parse::<f64>().ok().filter(|f| f.is_finite()) } else { None };
        Shape { version, integer, float }
    }
}

fn compare_strings(a: &Shape, a_text: &str, b: &Shape, b_text: &str) -> (Comparison, Ordering) {
    if let (Some(x), Some(y)) = (&a.version, &b.version) {
        if x.len() > 1 || y.len() > 1 {
            return (Comparison::Version, x.cmp(y));
        }
    }
    if let (Some(x), Some(y)) = (a.integer, b.integer) {
        return (Comparison::Integer, x.cmp(&y));
    }
    if let (Some(x), Some(y)) = (a.float, b.float) {
        if let Some(ordering) = x.partial_cmp(&y) {
            return (Comparison::Decimal, ordering);
        }
    }
    (Comparison::String, a_text.cmp(b_text))
}

fn is_version(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn is_decimal(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty());
    let exponent_ok = exponent.is_none_or(is_integer);
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use Ordering::*;

    fn cmp(fact: Value, operand: &str) -> Option<Ordering> {
        Operand::new(operand).compare(&fact)
    }

    #[test]
    fn versions_compare_component_wise() {
        assert_eq!(cmp(json!("11.10"), "11.2"), Some(Greater));
        assert_eq!(cmp(json!("11"), "11.2"), Some(Less));
        assert_eq!(cmp(json!("1.2.3"), "1.2.3"), Some(Equal));
        assert_eq!(cmp(json!("1.2"), "1.2.0"), Some(Less));
    }

    #[test]
    fn integers_and_decimals_compare_as_numbers() {
        assert_eq!(cmp(json!("10"), "9"), Some(Greater));
        assert_eq!(cmp(json!("010"), "10"), Some(Equal));
        assert_eq!(cmp(json!("-2.5"), "-3"), Some(Greater));
        assert_eq!(cmp(json!("-10"), "2"), Some(Less));
        assert_eq!(cmp(json!("1e3"), "999.5"), Some(Greater));
    }

    #[test]
    fn numeric_facts_compare_numerically_with_numeric_values() {
        assert_eq!(cmp(json!(10), "9"), Some(Greater));
        assert_eq!(cmp(json!(2.5), "2.25"), Some(Greater));
        assert_eq!(cmp(json!(-3), "-2.5"), Some(Less));
        assert_eq!(cmp(json!(4), "4.0"), Some(Equal));
        assert_eq!(cmp(json!(4), "four"), Some("4".cmp("four")));
    }

    #[test]
    fn anything_else_compares_as_case_sensitive_strings() {
        assert_eq!(cmp(json!("Debian"), "Debian"), Some(Equal));
        assert_eq!(cmp(json!("debian"), "Debian"), Some(Greater));
        assert_eq!(cmp(json!("10.0.0.1a"), "10.0.0.1"), Some("10.0.0.1a".cmp("10.0.0.1")));
        assert_eq!(cmp(json!("1.2"), "-1"), Some(Greater), "version against signed number: numbers");
    }

    #[test]
    fn booleans_only_equal_their_spelling_and_hashes_never_compare() {
        assert_eq!(cmp(json!(true), "true"), Some(Equal));
        assert_ne!(cmp(json!(false), "true"), Some(Equal));
        assert_eq!(cmp(json!(true), "yes"), None);
        assert_eq!(cmp(json!({"a": 1}), "a"), None);
        assert_eq!(cmp(json!(null), "a"), None);
    }

    #[test]
    fn the_rule_that_decided_is_named() {
        let rule = |fact: Value, operand: &str| Operand::new(operand).compare_by(&fact).map(|(rule, _)| rule);
        assert_eq!(rule(json!("11.10"), "11.2"), Some(Comparison::Version));
        assert_eq!(rule(json!("10"), "9"), Some(Comparison::Integer));
        assert_eq!(rule(json!(10), "9"), Some(Comparison::Integer));
        assert_eq!(rule(json!("1e3"), "999.5"), Some(Comparison::Decimal));
        assert_eq!(rule(json!(2.5), "2.25"), Some(Comparison::Decimal));
        assert_eq!(rule(json!("Debian"), "Debian"), Some(Comparison::String));
        assert_eq!(rule(json!(4), "four"), Some(Comparison::String));
        assert_eq!(rule(json!(true), "true"), Some(Comparison::Boolean));
        assert_eq!(rule(json!(true), "yes"), None);
    }

    #[test]
    fn plain_text_operands_are_recognised_for_the_index() {
        assert!(Operand::new("haproxy").is_plain_text());
        assert!(!Operand::new("10").is_plain_text());
        assert!(!Operand::new("1.2").is_plain_text());
        assert!(!Operand::new("true").is_plain_text());
    }
}
