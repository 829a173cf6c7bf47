//! `puppet kicker metrics`: the status answer as Prometheus text (exposition format
//! 0.0.4), for node_exporter's textfile collector or any scraper.

use serde_json::Value;
use std::fmt::Write;

/// How Prometheus treats a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

/// One metric: its name (`puppet_kicker_` added), what it means, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub value: f64,
}

/// The text, metric by metric in the order given, each with its HELP and TYPE.
pub fn render(metrics: &[Metric]) -> String {
    let mut text = String::new();
    for metric in metrics {
        let kind = match metric.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let name = metric.name;
        let _ = writeln!(text, "# HELP puppet_kicker_{name} {}", metric.help);
        let _ = writeln!(text, "# TYPE puppet_kicker_{name} {kind}");
        let _ = writeln!(text, "puppet_kicker_{name} {}", number(metric.value));
    }
    text
}

/// Prometheus's spelling of a sample value: integers without a fraction.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

/// The number at `path` of a JSON answer, if it is one.
pub fn at(answer: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(answer, |value, key| value.get(key)).and_then(Value::as_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_type_and_value_in_order() {
        let text = render(&[
            Metric { name: "index_servers", help: "Servers in the index.", kind: Kind::Gauge, value: 6.0 },
            Metric { name: "kicks_sent_total", help: "Kicks sent.", kind: Kind::Counter, value: 0.25 },
        ]);
        assert_eq!(
            text,
            "# HELP puppet_kicker_index_servers Servers in the index.\n# TYPE puppet_kicker_index_servers gauge\n\
             puppet_kicker_index_servers 6\n# HELP puppet_kicker_kicks_sent_total Kicks sent.\n\
             # TYPE puppet_kicker_kicks_sent_total counter\npuppet_kicker_kicks_sent_total 0.25\n"
        );
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }

    #[test]
    fn finds_numbers_by_path() {
        let answer = serde_json::json!({"index": {"servers": 3, "name": "x"}});
        assert_eq!(at(&answer, &["index", "servers"]), Some(3.0));
        assert_eq!(at(&answer, &["index", "name"]), None);
        assert_eq!(at(&answer, &["kicks", "pending"]), None);
    }
}
