//! The `kick` section of `puppet_kicker.yaml`: its keys are declared with all the
//! others in `config::keys` (which gives these settings their defaults); here are
//! the settings they fill and the check that spans two of them.

use super::choria::ChoriaSettings;
use super::policy::{Policy, RateLimit};
use super::postgresql::{PgSettings, StateKind};
use super::ssh::SshSettings;
use super::transport::Agent;
use super::{ConfirmBy, KickConfig, ReportBudget};
use std::fmt;
use std::time::Duration;

/// How kicks reach the servers (`kick.transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// mcollective `runonce` (the `mcollective.*` keys).
    Mcollective,
    /// Choria's `puppet#runonce` over NATS (the `choria.*` keys).
    Choria,
    /// The system's OpenSSH client (the `ssh.*` keys).
    Ssh,
}

impl TransportKind {
    /// Each kind with its `kick.transport` name.
    pub const ALL: &'static [(&'static str, TransportKind)] =
        &[("mcollective", TransportKind::Mcollective), ("choria", TransportKind::Choria), ("ssh", TransportKind::Ssh)];

    pub fn name(self) -> &'static str {
        TransportKind::ALL.iter().find(|(_, k)| *k == self).map_or("?", |(name, _)| name)
    }
}

impl ConfirmBy {
    pub const ALL: &'static [(&'static str, ConfirmBy)] =
        &[("auto", ConfirmBy::Auto), ("reports", ConfirmBy::Reports), ("transport", ConfirmBy::Transport)];

    pub fn name(self) -> &'static str {
        ConfirmBy::ALL.iter().find(|(_, k)| *k == self).map_or("?", |(name, _)| name)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct KickSettings {
    pub planner: KickConfig,
    pub transport: TransportKind,
    /// The `choria.*` keys, used when `transport` is Choria.
    pub choria: ChoriaSettings,
    pub agent: Agent,
    /// How long a `runonce` waits for the server's reply.
    pub reply_timeout: Duration,
    /// How long a short-lived process (`puppet apply`) waits at exit for due kicks.
    pub exit_wait: Duration,
    /// The `ssh.*` keys, for `kick.transport: ssh`.
    pub ssh: SshSettings,
    /// Where the kick state is kept (`kick.state`).
    pub state: StateKind,
    /// The `kick.postgresql.*` keys, for `kick.state: postgresql`.
    pub postgresql: PgSettings,
}

impl KickSettings {
    /// What the keys' defaults are applied to: the values no key sets, and zeros.
    pub(crate) fn unset() -> KickSettings {
        KickSettings {
            planner: KickConfig {
                coalesce_ms: 0,
                retry_base_ms: 0,
                retry_max_ms: 0,
                max_attempts: 0,
                run_timeout_ms: 0,
                confirm_within_ms: 0,
                confirm_by: ConfirmBy::Auto,
                max_hops: 0,
                policy: Policy::allow_all(),
                environments: Policy::allow_all(),
                budget: ReportBudget { kicks: 0, clauses: 0, targets: 0 },
                in_flight_timeout_ms: 0,
                clock_skew_ms: 0,
                role_graph_ttl_ms: 0,
                rate_limit: RateLimit { max: 0, window_ms: 1 },
                dry_run: false,
                keep_outcomes: 200,
            },
            transport: TransportKind::Mcollective,
            choria: ChoriaSettings::unset(),
            agent: Agent::Puppetd,
            reply_timeout: Duration::ZERO,
            exit_wait: Duration::ZERO,
            ssh: SshSettings::unset(),
            state: StateKind::Local,
            postgresql: PgSettings::unset(),
        }
    }

    /// Checks what no single key can: a `runonce` must be answered (or given up)
    /// well within the time after which another process sends it again, or two
    /// processes send the same kick. The problem is about `kick.reply_timeout`.
    pub fn validate(&self) -> Result<(), ReplyTimeoutTooLong> {
        let in_flight_ms = self.planner.in_flight_timeout_ms;
        let reply_ms = self.reply_timeout.as_millis() as i64;
        if reply_ms.saturating_mul(2) > in_flight_ms {
            return Err(ReplyTimeoutTooLong { reply_ms, in_flight_ms });
        }
        Ok(())
    }
}

/// `kick.reply_timeout` is more than half of `kick.in_flight_timeout`. Displayed as
/// the reason that follows the key's name in the configuration error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTimeoutTooLong {
    pub reply_ms: i64,
    pub in_flight_ms: i64,
}

impl fmt::Display for ReplyTimeoutTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "({}s) must be at most half of 'kick.in_flight_timeout' ({}s): \
             a kick unanswered for kick.in_flight_timeout is sent again by another process",
            self.reply_ms / 1000,
            self.in_flight_ms / 1000
        )
    }
}

impl std::error::Error for ReplyTimeoutTooLong {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, PuppetSettings};
    use std::path::Path;

    fn parse(yaml: &str) -> Result<KickSettings, String> {
        let settings = PuppetSettings::default();
        Config::parse(yaml, Path::new("/etc/puppet/puppet_kicker.yaml"), &settings)
            .map(|c| c.kick)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_kick_key_is_read_and_bad_values_named() {
        let k = parse(
            "kick:\n  coalesce: 30s\n  retry_base: 5\n  max_attempts: 3\n  max_hops: 2\n  rate_limit:\n    max: 4\n    window: 10m\n  dry_run: true\n  splaylimit: 30\n  policy: {node: [haproxy], admin: '*'}\n",
        )
        .unwrap();
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

        assert!(parse("kick:\n  max_hops: 0\n")
            .unwrap_err()
            .contains("'kick.max_hops' must be a positive whole number"));
        assert!(parse("kick:\n  agent: salt\n").unwrap_err().contains("'puppet' or 'puppetd'"));
        assert_eq!(parse("kick:\n  agent: puppetd\n").unwrap().agent, Agent::Puppetd);
        let e = parse("kick:\n  agent: puppetd\n  force: true\n").unwrap_err();
        assert!(e.contains("'kick.force' applies to the puppet agent, not puppetd"), "{e}");
        assert!(parse("kick:\n  policy: [x]\n").unwrap_err().contains("mapping of source role"));
    }

    #[test]
    fn new_keys_are_read_and_reply_timeout_must_fit_the_in_flight_timeout() {
        let keys = "kick:\n  environments: {production: [staging], '*': []}\n  budget: {kicks: 8, clauses: 16, targets: 500}\n  clock_skew: 1m\n  role_graph_ttl: 1d\n  in_flight_timeout: 4m\n";
        let k = parse(&format!("{keys}  reply_timeout: 2m\n")).expect("reply_timeout at half the in-flight timeout");
        assert_eq!(k.planner.budget, ReportBudget { kicks: 8, clauses: 16, targets: 500 });
        assert_eq!((k.planner.clock_skew_ms, k.planner.role_graph_ttl_ms), (60_000, 86_400_000));
        assert!(k.planner.environments.allows(Some("production"), Some("staging")));
        assert!(!k.planner.environments.allows(Some("dev"), Some("production")));
        let e = parse(&format!("{keys}  reply_timeout: 121\n")).unwrap_err();
        assert!(
            e.contains("'kick.reply_timeout' (121s) must be at most half of 'kick.in_flight_timeout' (240s)"),
            "{e}"
        );
        assert!(KickSettings::default().validate().is_ok());
        assert!(parse("kick:\n  in_flight_timeout: 0\n").unwrap_err().contains("a positive duration"));
        assert!(parse("kick:\n  budget:\n    kicks: 0\n").unwrap_err().contains("a positive whole number"));
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let k = KickSettings::default();
        let p = &k.planner;
        assert_eq!((p.coalesce_ms, p.retry_base_ms, p.retry_max_ms), (10_000, 30_000, 600_000));
        assert_eq!((p.max_attempts, p.run_timeout_ms, p.max_hops), (6, 3_600_000, 5));
        assert_eq!((p.in_flight_timeout_ms, p.clock_skew_ms, p.role_graph_ttl_ms), (120_000, 10_000, 604_800_000));
        assert_eq!(p.rate_limit, RateLimit { max: 30, window_ms: 3_600_000 });
        assert_eq!(p.budget, ReportBudget { kicks: 32, clauses: 128, targets: 1000 });
        assert_eq!((p.dry_run, p.keep_outcomes), (false, 200));
        assert_eq!((p.policy.clone(), p.environments.clone()), (Policy::allow_all(), Policy::allow_all()));
        assert_eq!(k.agent, Agent::Puppet { force: true, splay: false, splaylimit: None });
        assert_eq!((k.reply_timeout, k.exit_wait), (Duration::from_secs(10), Duration::from_secs(15)));
    }
}
