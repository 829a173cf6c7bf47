//! YAML to JSON-like values, for `puppet_kicker.yaml` and Puppet's legacy YAML fact
//! cache. Ruby tags (`!ruby/object:Puppet::Node::Facts`) are ignored: we only want
//! the mapping underneath.

use serde_json::{Map, Number, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// Deeper nesting than this is refused: facts are a few levels deep, and conversion
/// (and dropping the parsed tree) recurses.
pub const MAX_DEPTH: usize = 64;

/// Parses the first document of `text`; an empty document is `Null`.
pub fn parse(text: &str) -> Result<Value, String> {
    check_flow_depth(text)?;
    let mut docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    if docs.is_empty() {
        return Ok(Value::Null);
    }
    convert(&docs.swap_remove(0), 0)
}

fn convert(yaml: &Yaml, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    Ok(match yaml {
        Yaml::Null | Yaml::BadValue => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::Number((*i).into()),
        Yaml::Real(text) => match text.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => Value::Number(n),
            None => Value::String(text.clone()),
        },
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(items.iter().map(|i| convert(i, depth + 1)).collect::<Result<_, _>>()?),
        Yaml::Hash(hash) => {
            let mut map = Map::new();
            for (key, value) in hash {
                map.insert(key_string(key), convert(value, depth + 1)?);
            }
            Value::Object(map)
        }
        Yaml::Alias(_) => return Err("YAML aliases are not supported".into()),
    })
}

fn key_string(key: &Yaml) -> String {
    match key {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Null => "~".to_string(),
        other => format!("{other:?}"),
    }
}

/// The loader builds flow collections (`[[[[...`) without a depth limit; refuse
/// absurd nesting before parsing. Brackets inside strings count too, which can only
/// make this stricter than needed for text nobody writes.
fn check_flow_depth(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH * 4 {
                    return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' => {}
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn absurd_nesting_is_refused() {
        let deep = format!("a: {}{}", "[".repeat(1000), "]".repeat(1000));
        assert!(parse(&deep).unwrap_err().contains("nested deeper"));
    }
}
