//! The PQL this source sends. PuppetDB's inventory leaves out deactivated and
//! expired nodes unless asked; we never ask. PQL's `>`/`<` take numbers and
//! timestamps only, not certnames: so no keyset paging by certname. Instead a
//! listing (`certname`, `timestamp`) names the servers, and their facts are asked
//! for by name, a page of certnames at a time.

/// The fields of one server's entry.
pub const INVENTORY_FIELDS: &str = "certname, timestamp, environment, facts, trusted";

/// Every node's certname and facts timestamp; with `since`, only those whose facts
/// were stored at or after it.
pub fn listing(since: Option<&str>) -> String {
    match since {
        Some(since) => format!("inventory[certname, timestamp] {{ timestamp >= {} }}", quoted(since)),
        None => "inventory[certname, timestamp] {}".to_string(),
    }
}

/// The entries of `certnames`, in certname order.
pub fn inventory_of<S: AsRef<str>>(certnames: &[S]) -> String {
    let names: Vec<String> = certnames.iter().map(|c| quoted(c.as_ref())).collect();
    format!("inventory[{INVENTORY_FIELDS}] {{ certname in [{}] order by certname }}", names.join(", "))
}

/// Nodes deactivated or expired at or after `since`.
pub fn gone_since(since: &str) -> String {
    let since = quoted(since);
    format!(
        "nodes[certname, deactivated, expired] {{ node_state = \"inactive\" and (deactivated >= {since} or expired >= {since}) }}"
    )
}

/// A PQL double-quoted string: `\` and `"` escaped.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A Unix time as PuppetDB writes timestamps: `2026-11-26T02:33:00.000Z`.
pub fn timestamp(unix_seconds: i64) -> String {
    let t = crate::time::CalendarTime::utc(unix_seconds);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.000Z", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queries_read_as_pql() {
        assert_eq!(listing(None), "inventory[certname, timestamp] {}");
        assert_eq!(
            listing(Some("2026-11-26T02:33:00.000Z")),
            r#"inventory[certname, timestamp] { timestamp >= "2026-11-26T02:33:00.000Z" }"#
        );
        assert_eq!(
            inventory_of(&["a.example.com", "b"]),
            r#"inventory[certname, timestamp, environment, facts, trusted] { certname in ["a.example.com", "b"] order by certname }"#
        );
        assert_eq!(
            gone_since("2026-11-26T02:33:00.000Z"),
            r#"nodes[certname, deactivated, expired] { node_state = "inactive" and (deactivated >= "2026-11-26T02:33:00.000Z" or expired >= "2026-11-26T02:33:00.000Z") }"#
        );
    }

    #[test]
    fn strings_cannot_end_early() {
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quoted("plain"), "\"plain\"");
    }

    #[test]
    fn timestamps_round_trip() {
        let t = timestamp(1_795_660_380);
        assert_eq!(t, "2026-11-26T02:33:00.000Z");
        assert_eq!(crate::time::parse_timestamp(&t), Some(1_795_660_380));
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
    }
}
