//! The `kick` section of `puppet_kicker.yaml`.

use super::policy::{Policy, RateLimit};
use super::transport::Agent;
use super::KickConfig;
use crate::config::duration;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

pub const KEYS: &[&str] = &[
    "kick.agent",
    "kick.force",
    "kick.splay",
    "kick.splaylimit",
    "kick.coalesce",
    "kick.retry_base",
    "kick.retry_max",
    "kick.max_attempts",
    "kick.run_timeout",
    "kick.max_hops",
    "kick.policy",
    "kick.environments",
    "kick.budget.kicks",
    "kick.budget.clauses",
    "kick.budget.targets",
    "kick.in_flight_timeout",
    "kick.clock_skew",
    "kick.role_graph_ttl",
    "kick.rate_limit.max",
    "kick.rate_limit.window",
    "kick.dry_run",
    "kick.reply_timeout",
    "kick.exit_wait",
];

#[derive(Clone, Debug, PartialEq)]
pub struct KickSettings {
    pub planner: KickConfig,
    pub agent: Agent,
    /// How long a `runonce` waits for the server's reply.
    pub reply_timeout: Duration,
    /// How long a short-lived process (`puppet apply`) waits at exit for due kicks.
    pub exit_wait: Duration,
}

impl Default for KickSettings {
    fn default() -> KickSettings {
        KickSettings {
            planner: KickConfig::default(),
            agent: Agent::Puppet { force: true, splay: false, splaylimit: None },
            reply_timeout: Duration::from_secs(10),
            exit_wait: Duration::from_secs(15),
        }
    }
}

impl KickSettings {
    pub fn set(&mut self, key: &str, value: &Value) -> Result<(), String> {
        let bad = |expected: &str| format!("'{key}' must be {expected}, got {value}");
        let seconds = || duration(value).ok_or_else(|| bad("a duration (30, 10s, 5m)"));
        let millis = || seconds().map(|s| (s as i64).saturating_mul(1000));
        let count = || value.as_u64().filter(|n| *n > 0).ok_or_else(|| bad("a positive whole number"));
        let flag = || value.as_bool().ok_or_else(|| bad("true or false"));
        let p = &mut self.planner;
        match key {
            "kick.agent" => {
                self.agent = match value.as_str() {
                    Some("puppet") => Agent::Puppet { force: true, splay: false, splaylimit: None },
                    Some("puppetd") => Agent::Puppetd,
                    _ => return Err(bad("'puppet' or 'puppetd'")),
                }
            }
            "kick.force" | "kick.splay" | "kick.splaylimit" => {
                let Agent::Puppet { force, splay, splaylimit } = &mut self.agent else {
                    return Err(format!("'{key}' applies to the puppet agent, not puppetd (set kick.agent first)"));
                };
                match key {
                    "kick.force" => *force = flag()?,
                    "kick.splay" => *splay = flag()?,
                    _ => *splaylimit = Some(u32::try_from(seconds()?).map_err(|_| bad("a duration"))?),
                }
            }
            "kick.coalesce" => p.coalesce_ms = millis()?,
            "kick.retry_base" => p.retry_base_ms = millis()?,
            "kick.retry_max" => p.retry_max_ms = millis()?,
            "kick.run_timeout" => p.run_timeout_ms = millis()?,
            "kick.max_attempts" => p.max_attempts = u32::try_from(count()?).map_err(|_| bad("a small number"))?,
            "kick.max_hops" => p.max_hops = count()? as usize,
            "kick.rate_limit.max" => p.rate_limit.max = u32::try_from(count()?).map_err(|_| bad("a small number"))?,
            "kick.rate_limit.window" => p.rate_limit = RateLimit { window_ms: millis()?.max(1), ..p.rate_limit },
            "kick.dry_run" => p.dry_run = flag()?,
            "kick.reply_timeout" => self.reply_timeout = Duration::from_secs(seconds()?),
            "kick.exit_wait" => self.exit_wait = Duration::from_secs(seconds()?),
            "kick.policy" => {
                p.policy = policy(value).ok_or_else(|| bad("a mapping of source role to a list of target roles"))?
            }
            "kick.environments" => {
                p.environments = policy(value)
                    .ok_or_else(|| bad("a mapping of source environment to a list of target environments"))?
            }
            "kick.budget.kicks" => p.budget.kicks = count()? as usize,
            "kick.budget.clauses" => p.budget.clauses = count()? as usize,
            "kick.budget.targets" => p.budget.targets = count()? as usize,
            "kick.in_flight_timeout" => {
                p.in_flight_timeout_ms =
                    millis().and_then(|ms| Some(ms).filter(|ms| *ms > 0).ok_or_else(|| bad("a positive duration")))?
            }
            "kick.clock_skew" => p.clock_skew_ms = millis()?,
            "kick.role_graph_ttl" => p.role_graph_ttl_ms = millis()?,
            _ => return Err(format!("unknown key '{key}'")),
        }
        Ok(())
    }
}

impl KickSettings {
    /// Checks what no single key can: a `runonce` must be answered (or given up)
    /// well within the time after which another process sends it again, or two
    /// processes send the same kick.
    pub fn validate(&self) -> Result<(), String> {
        let in_flight = self.planner.in_flight_timeout_ms;
        let reply = self.reply_timeout.as_millis() as i64;
        if reply.saturating_mul(2) > in_flight {
            return Err(format!(
                "'kick.reply_timeout' ({}s) must be at most half of 'kick.in_flight_timeout' ({}s): \
                 a kick unanswered for kick.in_flight_timeout is sent again by another process",
                reply / 1000,
                in_flight / 1000
            ));
        }
        Ok(())
    }
}

/// `{node: [haproxy], admin: '*'}`: a role name, `*`, or a list of them per source role.
fn policy(value: &Value) -> Option<Policy> {
    let mut rules = BTreeMap::new();
    for (source, targets) in value.as_object()? {
        let targets = match targets {
            Value::String(s) => vec![s.clone()],
            Value::Array(items) => items.iter().map(|i| i.as_str().map(str::to_string)).collect::<Option<Vec<_>>>()?,
            Value::Null => Vec::new(),
            _ => return None,
        };
        rules.insert(source.clone(), targets);
    }
    Some(Policy::from_rules(rules))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kick_key_is_read_and_bad_values_named() {
        let mut k = KickSettings::default();
        for (key, value) in [
            ("kick.coalesce", json!("30s")),
            ("kick.retry_base", json!(5)),
            ("kick.max_attempts", json!(3)),
            ("kick.max_hops", json!(2)),
            ("kick.rate_limit.max", json!(4)),
            ("kick.rate_limit.window", json!("10m")),
            ("kick.dry_run", json!(true)),
            ("kick.splaylimit", json!(30)),
            ("kick.policy", json!({"node": ["haproxy"], "admin": "*"})),
        ] {
            k.set(key, &value).unwrap();
        }
        assert_eq!(k.planner.coalesce_ms, 30_000);
        assert_eq!(k.planner.retry_base_ms, 5_000);
        assert_eq!((k.planner.max_attempts, k.planner.max_hops), (3, 2));
        assert_eq!(k.planner.rate_limit, RateLimit { max: 4, window_ms: 600_000 });
        assert!(k.planner.dry_run);
        assert_eq!(k.agent, Agent::Puppet { force: true, splay: false, splaylimit: Some(30) });
        assert!(
            k.planner.policy.allows(Some("node"), Some("haproxy"))
                && !k.planner.policy.allows(Some("node"), Some("db"))
        );

        assert!(k
            .set("kick.max_hops", &json!(0))
            .unwrap_err()
            .contains("'kick.max_hops' must be a positive whole number"));
        assert!(k.set("kick.agent", &json!("salt")).unwrap_err().contains("'puppet' or 'puppetd'"));
        k.set("kick.agent", &json!("puppetd")).unwrap();
        assert!(k.set("kick.force", &json!(true)).unwrap_err().contains("not puppetd"));
        assert!(k.set("kick.policy", &json!(["x"])).unwrap_err().contains("mapping of source role"));
    }

    #[test]
    fn new_keys_are_read_and_reply_timeout_must_fit_the_in_flight_timeout() {
        let mut k = KickSettings::default();
        for (key, value) in [
            ("kick.environments", json!({"production": ["staging"], "*": []})),
            ("kick.budget.kicks", json!(8)),
            ("kick.budget.clauses", json!(16)),
            ("kick.budget.targets", json!(500)),
            ("kick.clock_skew", json!("1m")),
            ("kick.role_graph_ttl", json!("1d")),
            ("kick.in_flight_timeout", json!("4m")),
            ("kick.reply_timeout", json!("2m")),
        ] {
            k.set(key, &value).unwrap();
        }
        assert_eq!(k.planner.budget, crate::kick::ReportBudget { kicks: 8, clauses: 16, targets: 500 });
        assert_eq!((k.planner.clock_skew_ms, k.planner.role_graph_ttl_ms), (60_000, 86_400_000));
        assert!(k.planner.environments.allows(Some("production"), Some("staging")));
        assert!(!k.planner.environments.allows(Some("dev"), Some("production")));
        assert_eq!(k.validate(), Ok(()), "reply_timeout at half the in-flight timeout");
        k.set("kick.reply_timeout", &json!(121)).unwrap();
        let e = k.validate().unwrap_err();
        assert!(
            e.contains("'kick.reply_timeout' (121s) must be at most half of 'kick.in_flight_timeout' (240s)"),
            "{e}"
        );
        assert!(KickSettings::default().validate().is_ok());
        assert!(k.set("kick.in_flight_timeout", &json!(0)).unwrap_err().contains("a positive duration"));
        assert!(k.set("kick.budget.kicks", &json!(0)).unwrap_err().contains("a positive whole number"));
    }
}
