//! Who may kick whom, and how often. Reports come from servers, and whoever controls
//! a server controls its reports: without a policy, any node could make the whole
//! fleet run Puppet.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Which roles may kick which. Keys are source roles, `*` for any other source;
/// values are target roles, `*` for any. No policy at all means anyone may kick
/// anyone (the original's behaviour).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    rules: Option<BTreeMap<String, Vec<String>>>,
}

impl Policy {
    pub fn allow_all() -> Policy {
        Policy { rules: None }
    }

    pub fn from_rules(rules: BTreeMap<String, Vec<String>>) -> Policy {
        Policy { rules: Some(rules) }
    }

    pub fn allows(&self, source_role: Option<&str>, target_role: Option<&str>) -> bool {
        let Some(rules) = &self.rules else { return true };
        let allowed = source_role.and_then(|r| rules.get(r)).or_else(|| rules.get("*"));
        allowed.is_some_and(|targets| targets.iter().any(|t| t == "*" || Some(t.as_str()) == target_role))
    }
}

/// At most `max` kicking reports per source within `window_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub max: u32,
    pub window_ms: i64,
}

/// Times of each source's recent kicking reports; persisted with the planner so a
/// restart does not reset a storm's budget.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLedger {
    seen: BTreeMap<String, VecDeque<i64>>,
}

impl RateLedger {
    /// Records a kicking report from `source` at `now` if the limit allows it.
    pub fn admit(&mut self, limit: RateLimit, source: &str, now: i64) -> bool {
        let times = self.seen.entry(source.to_string()).or_default();
        while times.front().is_some_and(|t| now - t >= limit.window_ms) {
            times.pop_front();
        }
        if times.len() >= limit.max as usize {
            return false;
        }
        times.push_back(now);
        true
    }

    /// Forgets sources with nothing inside the window, so the ledger stays small.
    pub fn prune(&mut self, limit: RateLimit, now: i64) {
        self.seen.retain(|_, times| times.back().is_some_and(|t| now - t < limit.window_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_rules_by_source_role_with_wildcards() {
        let policy = Policy::from_rules(BTreeMap::from([
            ("node".to_string(), vec!["haproxy".to_string()]),
            ("admin".to_string(), vec!["*".to_string()]),
            ("*".to_string(), vec![]),
        ]));
        assert!(policy.allows(Some("node"), Some("haproxy")));
        assert!(!policy.allows(Some("node"), Some("db")));
        assert!(policy.allows(Some("admin"), Some("db")));
        assert!(!policy.allows(Some("web"), Some("haproxy")), "falls back to *, which allows nothing");
        assert!(!policy.allows(None, Some("haproxy")));
        assert!(Policy::allow_all().allows(None, None));
    }

    #[test]
    fn rate_limit_slides_with_the_window() {
        let limit = RateLimit { max: 2, window_ms: 1000 };
        let mut ledger = RateLedger::default();
        assert!(ledger.admit(limit, "n", 0));
        assert!(ledger.admit(limit, "n", 500));
        assert!(!ledger.admit(limit, "n", 900));
        assert!(ledger.admit(limit, "other", 900));
        assert!(ledger.admit(limit, "n", 1000), "the first one left the window");
        ledger.prune(limit, 5000);
        assert_eq!(ledger, RateLedger::default());
    }
}
