//! `puppet kicker metrics`: the status answer as Prometheus text (exposition format
//! 0.0.4), for node_exporter's textfile collector or any scraper. Like `status`, it
//! never refreshes nor waits on the source.

use super::status;
use crate::error::Result;
use crate::kick::CONFIRM_BUCKETS;
use crate::service::Service;
use serde::Deserialize;
use serde_json::Value;
use std::fmt::Write;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {}

/// `{"text": PROMETHEUS_TEXT}`.
pub fn run(service: &Service, _: Args) -> Result<Value> {
    let answer = status::run(service, status::Args::default())?;
    Ok(serde_json::json!({ "text": render(&from_status(&answer)) }))
}

/// The metrics, always the same ones in the same order (a scraper sees no gaps): what
/// `status` knows is 0 when it knows nothing (no refresh recorded, no kick state yet),
/// and the index's age is +Inf when there is no data, so an age alert fires.
pub fn from_status(answer: &Value) -> Vec<Metric> {
    use Kind::{Counter, Gauge};
    let or_zero = |path: &[&str]| at(answer, path).unwrap_or(0.0);
    let refresh = &answer["last_refresh"];
    let counter = |name| or_zero(&["kicks", "document", "counters", name]);
    vec![
        Metric {
            name: "index_servers",
            help: "Servers in the index the functions answer from.",
            kind: Gauge,
            value: or_zero(&["index", "servers"]),
            samples: Vec::new(),
        },
        Metric {
            name: "index_age_seconds",
            help: "Age of the index's data (+Inf: no data).",
            kind: Gauge,
            value: at(answer, &["index", "age_ms"]).map_or(f64::INFINITY, |ms| ms / 1000.0),
            samples: Vec::new(),
        },
        Metric {
            name: "index_bytes",
            help: "Memory the index holds, in bytes.",
            kind: Gauge,
            value: or_zero(&["index", "bytes"]),
            samples: Vec::new(),
        },
        Metric {
            name: "snapshot_bytes",
            help: "Size of the index's snapshot on disk, in bytes.",
            kind: Gauge,
            value: or_zero(&["index", "snapshot", "bytes"]),
            samples: Vec::new(),
        },
        Metric {
            name: "refresh_failures",
            help: "Refreshes failed in a row (0 after a good one).",
            kind: Gauge,
            value: or_zero(&["backoff", "failures"]),
            samples: Vec::new(),
        },
        Metric {
            name: "last_refresh_success",
            help: "1 when the last recorded refresh succeeded, else 0.",
            kind: Gauge,
            value: if refresh["outcome"].as_str().is_some_and(|o| o != "failed") { 1.0 } else { 0.0 },
            samples: Vec::new(),
        },
        Metric {
            name: "last_refresh_duration_seconds",
            help: "How long the last recorded refresh took.",
            kind: Gauge,
            value: at(refresh, &["duration_ms"]).map_or(0.0, |ms| ms / 1000.0),
            samples: Vec::new(),
        },
        Metric {
            name: "last_refresh_timestamp_seconds",
            help: "When the last recorded refresh ended, in Unix seconds.",
            kind: Gauge,
            value: at(refresh, &["finished_ms"]).map_or(0.0, |ms| ms / 1000.0),
            samples: Vec::new(),
        },
        Metric {
            name: "kicks_pending",
            help: "Kicks not yet started: due, in flight, waiting for a retry or a local run.",
            kind: Gauge,
            value: or_zero(&["kicks", "document", "pending_count"]),
            samples: Vec::new(),
        },
        Metric {
            name: "kicks_sent_total",
            help: "Kicks whose runonce started a Puppet run.",
            kind: Counter,
            value: counter("sent"),
            samples: Vec::new(),
        },
        Metric {
            name: "kicks_failed_total",
            help: "Kicks given up after their last attempt.",
            kind: Counter,
            value: counter("failed"),
            samples: Vec::new(),
        },
        Metric {
            name: "kicks_suppressed_total",
            help: "Kicks suppressed: policy, rate limit, loops, max_hops, budget.",
            kind: Counter,
            value: counter("suppressed"),
            samples: Vec::new(),
        },
        confirmed(answer),
        Metric {
            name: "kicks_unconfirmed_total",
            help: "Kicks whose server reported no run started after them within kick.confirm_within.",
            kind: Counter,
            value: counter("unconfirmed"),
            samples: Vec::new(),
        },
        kick_to_report(answer),
        Metric {
            name: "kick_state_reachable",
            help: "0 while the shared kick state (kick.state: postgresql) is unreachable and kicks are kept locally, else 1.",
            kind: Gauge,
            value: if answer["kicks"]["document"]["state"]["outage"].is_object() { 0.0 } else { 1.0 },
            samples: Vec::new(),
        },
    ]
}

/// How a confirmed kick's run ended: its report's status, or unknown when it gave none.
const OUTCOMES: [&str; 4] = ["changed", "unchanged", "failed", "unknown"];

/// `kicks_confirmed_total{outcome=...}`: one sample per outcome, always all four.
fn confirmed(answer: &Value) -> Metric {
    let counters = &answer["kicks"]["document"]["counters"];
    let samples: Vec<(String, f64)> = OUTCOMES
        .iter()
        .map(|o| (format!("{{outcome=\"{o}\"}}"), counters[format!("confirmed_{o}")].as_f64().unwrap_or(0.0)))
        .collect();
    Metric {
        name: "kicks_confirmed_total",
        help: "Kicks confirmed by the kicked server's report, by how its run ended (unknown: the report did not say).",
        kind: Kind::Counter,
        value: samples.iter().map(|(_, v)| v).sum(),
        samples,
    }
}

/// The histogram of seconds from a kick to the report that confirmed it.
fn kick_to_report(answer: &Value) -> Metric {
    let counters = &answer["kicks"]["document"]["counters"];
    let per_bucket = |i: usize| counters["confirm_buckets"].get(i).and_then(Value::as_f64).unwrap_or(0.0);
    let count: f64 = OUTCOMES.iter().map(|o| counters[format!("confirmed_{o}")].as_f64().unwrap_or(0.0)).sum();
    let mut samples = Vec::new();
    let mut cumulative = 0.0;
    for (i, le) in CONFIRM_BUCKETS.iter().enumerate() {
        cumulative += per_bucket(i);
        samples.push((format!("_bucket{{le=\"{le}\"}}"), cumulative));
    }
    samples.push(("_bucket{le=\"+Inf\"}".to_string(), count));
    samples.push(("_sum".to_string(), counters["confirm_ms_sum"].as_f64().unwrap_or(0.0) / 1000.0));
    samples.push(("_count".to_string(), count));
    Metric {
        name: "kick_to_report_seconds",
        help: "Seconds from a kick (its run started) to the report that confirmed it.",
        kind: Kind::Histogram,
        value: count,
        samples,
    }
}

/// How Prometheus treats a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

/// One metric: its name (`puppet_kicker_` added), what it means, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub value: f64,
    /// When not empty, the lines written instead of `value`'s: each a suffix to the
    /// name with its labels (`{outcome="failed"}`, `_bucket{le="60"}`, `_sum`), and
    /// its value; `value` then sums them up for the status view.
    pub samples: Vec<(String, f64)>,
}

/// The text, metric by metric in the order given, each with its HELP and TYPE.
pub fn render(metrics: &[Metric]) -> String {
    let mut text = String::new();
    for metric in metrics {
        let kind = match metric.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        };
        let name = metric.name;
        let _ = writeln!(text, "# HELP puppet_kicker_{name} {}", metric.help);
        let _ = writeln!(text, "# TYPE puppet_kicker_{name} {kind}");
        if metric.samples.is_empty() {
            let _ = writeln!(text, "puppet_kicker_{name} {}", number(metric.value));
        }
        for (suffix, value) in &metric.samples {
            let _ = writeln!(text, "puppet_kicker_{name}{suffix} {}", number(*value));
        }
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
            Metric {
                name: "index_servers",
                help: "Servers in the index.",
                kind: Kind::Gauge,
                value: 6.0,
                samples: vec![],
            },
            Metric { name: "kicks_sent_total", help: "Kicks sent.", kind: Kind::Counter, value: 0.25, samples: vec![] },
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
    fn reads_the_status_answer_and_says_infinitely_old_without_data() {
        let answer = serde_json::json!({
            "index": {"servers": 6, "age_ms": 1500, "bytes": 2817, "snapshot": {"bytes": 3067}},
            "last_refresh": {"outcome": "ok", "duration_ms": 6, "finished_ms": 1795674006035_i64},
            "backoff": {"failures": 0},
            "kicks": {"document": {"pending_count": 2, "counters": {"sent": 5, "failed": 1, "suppressed": 3,
                "confirmed_changed": 2, "confirmed_failed": 1, "unconfirmed": 1,
                "confirm_buckets": [0, 1, 0, 2, 0, 0, 0, 0, 0, 0], "confirm_ms_sum": 95_500}}},
        });
        let values: Vec<(&str, f64)> = from_status(&answer).iter().map(|m| (m.name, m.value)).collect();
        assert_eq!(
            values,
            [
                ("index_servers", 6.0),
                ("index_age_seconds", 1.5),
                ("index_bytes", 2817.0),
                ("snapshot_bytes", 3067.0),
                ("refresh_failures", 0.0),
                ("last_refresh_success", 1.0),
                ("last_refresh_duration_seconds", 0.006),
                ("last_refresh_timestamp_seconds", 1795674006.035),
                ("kicks_pending", 2.0),
                ("kicks_sent_total", 5.0),
                ("kicks_failed_total", 1.0),
                ("kicks_suppressed_total", 3.0),
                ("kicks_confirmed_total", 3.0),
                ("kicks_unconfirmed_total", 1.0),
                ("kick_to_report_seconds", 3.0),
                ("kick_state_reachable", 1.0),
            ]
        );
        let mut outage = answer.clone();
        outage["kicks"]["document"]["state"] = serde_json::json!({"outage": {"reason": "connection refused"}});
        let reachable = from_status(&outage).into_iter().find(|m| m.name == "kick_state_reachable").unwrap();
        assert_eq!(reachable.value, 0.0, "an outage of the shared state");
        let text = render(&from_status(&answer));
        for line in [
            "puppet_kicker_kicks_confirmed_total{outcome=\"changed\"} 2",
            "puppet_kicker_kicks_confirmed_total{outcome=\"unchanged\"} 0",
            "puppet_kicker_kicks_confirmed_total{outcome=\"failed\"} 1",
            "# TYPE puppet_kicker_kick_to_report_seconds histogram",
            "puppet_kicker_kick_to_report_seconds_bucket{le=\"5\"} 0",
            "puppet_kicker_kick_to_report_seconds_bucket{le=\"10\"} 1",
            "puppet_kicker_kick_to_report_seconds_bucket{le=\"60\"} 3",
            "puppet_kicker_kick_to_report_seconds_bucket{le=\"3600\"} 3",
            "puppet_kicker_kick_to_report_seconds_bucket{le=\"+Inf\"} 3",
            "puppet_kicker_kick_to_report_seconds_sum 95.5",
            "puppet_kicker_kick_to_report_seconds_count 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("puppet_kicker_kicks_confirmed_total 3"), "a labelled metric has no bare sample");
        let nothing = from_status(&serde_json::json!({"index": {"servers": 0}, "last_refresh": null, "kicks": null}));
        assert_eq!(nothing.len(), values.len(), "the same metrics, always");
        assert_eq!(nothing[1].value, f64::INFINITY);
        let known_only = |m: &&Metric| !["index_age_seconds", "kick_state_reachable"].contains(&m.name);
        assert!(nothing.iter().filter(known_only).all(|m| m.value == 0.0));
    }

    #[test]
    fn finds_numbers_by_path() {
        let answer = serde_json::json!({"index": {"servers": 3, "name": "x"}});
        assert_eq!(at(&answer, &["index", "servers"]), Some(3.0));
        assert_eq!(at(&answer, &["index", "name"]), None);
        assert_eq!(at(&answer, &["kicks", "pending"]), None);
    }
}
