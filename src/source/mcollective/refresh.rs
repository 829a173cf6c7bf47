//! A refresh of `source: mcollective`: which collectives it asks (in parallel), the
//! reply each server's observation comes from, and the grace period of the servers
//! that stopped answering (see the module above).

use super::{observe_since, McollectiveSource, ReplyMemo, ACTION, AGENT, DECODE_THREADS};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::mcollective::message::Reply;
use crate::mcollective::{self as mco, Filter};
use crate::source::puppet_cache::GARBAGE_FACTOR;
use crate::source::{Memo, SourceRead};
use crate::store::Builder;
use crate::time::now;
use crate::unpoisoned::lock;
use std::collections::{BTreeMap, BTreeSet};

/// What one collective answered.
struct Answer {
    discovered: Vec<String>,
    replies: Vec<Reply>,
    /// Senders whose inventory body another sender sent too (see [`mco::RpcOutcome::ambiguous`]).
    ambiguous: Vec<String>,
    /// Our clock when the replies were in.
    at: i64,
}

/// Replies the client refused during one refresh, by reason.
#[derive(Clone, Copy)]
struct Refused {
    /// A bad psk signature.
    forged: u64,
    /// A msgtime more than the ttl away from the request's.
    misdated: u64,
    /// Past `mcollective.max_servers` or `mcollective.max_reply_bytes`.
    over_limit: u64,
}

impl Refused {
    fn between(before: &mco::ClientStats, after: &mco::ClientStats) -> Refused {
        Refused {
            forged: after.bad_hash.saturating_sub(before.bad_hash),
            misdated: after.bad_msgtime.saturating_sub(before.bad_msgtime),
            over_limit: after.over_limit.saturating_sub(before.over_limit),
        }
    }
}

/// The answers of every collective asked, gathered per server.
struct Gathered {
    /// (collective, error) of each collective that failed, in the order asked.
    failures: Vec<(String, String)>,
    discovered: BTreeSet<String>,
    /// identity -> (reply, our time) of each collective that answered.
    candidates: BTreeMap<String, Vec<(Reply, i64)>>,
}

impl Gathered {
    /// The answers gathered; a warning for each collective where the same signed
    /// reply came under several sender ids (those senders' replies are left out).
    fn of(answers: Vec<(String, mco::Result<Answer>)>, warnings: &mut Vec<String>) -> Gathered {
        let mut gathered = Gathered { failures: Vec::new(), discovered: BTreeSet::new(), candidates: BTreeMap::new() };
        for (collective, answer) in answers {
            match answer {
                Err(e) => gathered.failures.push((collective, e.to_string())),
                Ok(answer) => {
                    gathered.discovered.extend(answer.discovered);
                    if !answer.ambiguous.is_empty() {
                        warnings.push(format!(
                            "mcollective: collective {collective}: ignored the inventories of {}: the same signed reply came under more than one sender id, and the psk cannot tell who sent it (a replay on the broker?)",
                            join(&answer.ambiguous)
                        ));
                    }
                    let ambiguous: BTreeSet<&str> = answer.ambiguous.iter().map(String::as_str).collect();
                    for reply in answer.replies.into_iter().filter(|r| !ambiguous.contains(r.senderid.as_str())) {
                        gathered.candidates.entry(reply.senderid.clone()).or_default().push((reply, answer.at));
                    }
                }
            }
        }
        gathered
    }

    /// Each server's replies, taken, in identity order and newest first (the first
    /// received among equals): the first well-formed one is its inventory.
    fn take_servers(&mut self) -> Vec<Vec<(Reply, i64)>> {
        std::mem::take(&mut self.candidates)
            .into_values()
            .map(|mut replies| {
                replies.sort_by_key(|r| std::cmp::Reverse(r.0.msgtime));
                replies
            })
            .collect()
    }
}

impl McollectiveSource {
    /// The collectives a refresh asks, sorted: see the module documentation.
    pub fn targets(&self, previous: Option<&Index>) -> Vec<String> {
        let config = self.client.config();
        match previous.filter(|index| !index.is_empty()) {
            None => {
                let mut all = config.collectives.clone();
                all.sort();
                all.dedup();
                all
            }
            Some(index) => {
                let mut targets = BTreeSet::from([config.main_collective.clone()]);
                let environments: BTreeSet<&str> = index.servers().map(|s| s.environment()).collect();
                for environment in environments {
                    if config.collectives.iter().any(|c| c == environment) {
                        targets.insert(environment.to_string());
                    }
                }
                targets.into_iter().collect()
            }
        }
    }

    /// One refresh: discovery and inventory in every target collective, then the
    /// grace period for servers of `previous` that did not answer.
    pub(super) fn ask_and_observe(&self, previous: Option<&Index>, started: i64) -> Result<SourceRead> {
        let targets = self.targets(previous);
        let before = self.client.stats();
        let answers = self.ask_all(&targets);
        let refused = Refused::between(&before, &self.client.stats());
        let mut read = SourceRead::default();
        self.warn_refused(&refused, &mut read.warnings);
        let mut gathered = Gathered::of(answers, &mut read.warnings);
        if gathered.failures.len() == targets.len() {
            return Err(Error::Io(format!("mcollective: {}", summarize(&gathered.failures))));
        }
        for (collective, error) in &gathered.failures {
            read.warnings.push(format!("mcollective: collective {collective}: {error}"));
        }
        self.observe(&gathered.take_servers(), previous, &mut read);
        let answered_owned: Vec<String> = read.observations.iter().map(|o| o.certname.clone()).collect();
        let answered: BTreeSet<&str> = answered_owned.iter().map(String::as_str).collect();
        let silent: Vec<&String> = gathered.discovered.iter().filter(|d| !answered.contains(d.as_str())).collect();
        if !silent.is_empty() {
            read.warnings.push(format!(
                "mcollective: discovered but no {AGENT}#{ACTION} answer within {}s from: {}",
                self.timeout.as_secs(),
                join(silent)
            ));
        }
        if read.observations.is_empty() {
            return Err(self.nobody_answered(&targets, &gathered, &refused));
        }
        if let Some(previous) = previous {
            self.apply_grace(previous, &answered, started, &mut read);
        }
        Ok(read)
    }

    /// Every target collective asked at once, each on its own thread, in order.
    fn ask_all(&self, targets: &[String]) -> Vec<(String, mco::Result<Answer>)> {
        std::thread::scope(|scope| {
            let running: Vec<_> = targets.iter().map(|c| (c, scope.spawn(move || self.ask(c)))).collect::<Vec<_>>();
            running
                .into_iter()
                .map(|(c, handle)| {
                    let answer = handle.join().unwrap_or_else(|_| {
                        Err(mco::Error::InvalidInput(format!("internal error: asking collective {c} panicked")))
                    });
                    (c.clone(), answer)
                })
                .collect()
        })
    }

    /// One warning per kind of reply the client refused during this refresh.
    fn warn_refused(&self, refused: &Refused, warnings: &mut Vec<String>) {
        let Refused { forged, misdated, over_limit } = *refused;
        if forged > 0 {
            warnings.push(format!(
                "mcollective: ignored {forged} {} with a bad psk signature (a daemon with another psk, or forged)",
                replies(forged)
            ));
        }
        if misdated > 0 {
            warnings.push(format!(
                "mcollective: ignored {misdated} {} whose msgtime is more than the ttl ({}s) away from the request: replayed, or a daemon's clock is off",
                replies(misdated),
                self.client.config().ttl
            ));
        }
        if over_limit > 0 {
            let limits = self.client.config().reply_limits;
            warnings.push(format!(
                "mcollective: dropped {over_limit} {} over the limit of {} servers or {} bytes per request (mcollective.max_servers, mcollective.max_reply_bytes)",
                replies(over_limit),
                limits.max_replies,
                limits.max_bytes
            ));
        }
    }

    /// The observations of `servers` into `read`: in a builder resumed on the store
    /// of `previous` when the last refresh built it (and its garbage is bounded), so
    /// unchanged bodies are given again; else every reply decoded afresh. The memo
    /// goes with the read, for the service to [`crate::source::Source::carry`] it back.
    fn observe(&self, servers: &[Vec<(Reply, i64)>], previous: Option<&Index>, read: &mut SourceRead) {
        let config = self.client.config();
        // Taken: a refresh that fails leaves none, and the next decodes every reply.
        let carried = lock(&self.carried).take().and_then(|mut c| Some((c.take_memo::<ReplyMemo>()?, c)));
        let (memo, resumed) = match (carried, previous) {
            (Some((memo, c)), Some(index))
                if c.goes_on_from(index)
                    && index.store().values() <= GARBAGE_FACTOR.saturating_mul(memo.values_after_full.max(1)) =>
            {
                read.builder = Builder::resume(index.store(), c.tables);
                (memo, true)
            }
            (c, _) => (c.map_or_else(ReplyMemo::default, |(memo, _)| memo.forget_servers()), false),
        };
        let (observed, mut memo, reused) = observe_since(
            servers,
            &config.main_collective,
            config.marshal_limits,
            DECODE_THREADS,
            &mut read.builder,
            &memo,
        );
        if !resumed {
            // Garbage (values no server uses any more) is bounded by this store's size.
            memo.values_after_full = read.builder.store().values();
        }
        read.memo = Some(Memo::new(memo));
        read.reused = reused;
        self.client.record_inner(observed.accepted, observed.malformed);
        read.observations = observed.observations;
        read.warnings.extend(observed.warnings);
    }

    /// The error of a refresh that heard from no server, with what may explain it.
    fn nobody_answered(&self, targets: &[String], gathered: &Gathered, refused: &Refused) -> Error {
        let mut why = format!(
            "no mcollective server answered {AGENT}#{ACTION} in collective{} {} (discovery {}s{})",
            if targets.len() == 1 { "" } else { "s" },
            targets.join(", "),
            self.client.config().discovery_timeout.as_secs_f64(),
            if gathered.discovered.is_empty() { ", nobody" } else { "" }
        );
        if refused.forged > 0 {
            why.push_str(&format!("; {} replies had a bad psk signature", refused.forged));
        }
        why.push_str(
            ": check that mcollectived runs, that plugin.psk matches the daemons' and that the collectives exist",
        );
        if !gathered.failures.is_empty() {
            why.push_str(&format!("; also {}", summarize(&gathered.failures)));
        }
        Error::Io(why)
    }

    /// Keeps silent servers of `previous` for the grace period, with one warning when
    /// a server first goes silent and one when it is dropped.
    fn apply_grace(&self, previous: &Index, answered: &BTreeSet<&str>, started: i64, read: &mut SourceRead) {
        let mut newly_silent = Vec::new();
        let mut dropped = Vec::new();
        for server in previous.servers() {
            let Some(last) = server.answered_at() else { continue };
            if answered.contains(server.certname()) {
                continue;
            }
            if started.saturating_sub(last) <= self.grace {
                if last >= previous.built_at() {
                    newly_silent.push(server.certname());
                }
                read.kept.push(server.position());
            } else {
                dropped.push(server.certname());
            }
        }
        if !newly_silent.is_empty() {
            read.warnings.push(format!(
                "mcollective: no answer from {}; kept for the grace period of {}s",
                join(newly_silent),
                self.grace
            ));
        }
        if !dropped.is_empty() {
            read.warnings.push(format!(
                "mcollective: dropped {}: no answer for longer than the grace period of {}s",
                join(dropped),
                self.grace
            ));
        }
    }

    /// Discovery, then inventory of whoever answered, in one collective.
    fn ask(&self, collective: &str) -> mco::Result<Answer> {
        let config = self.client.config();
        let filter = Filter { agent: vec![AGENT.to_string()], ..Filter::default() };
        let discovered = self.client.discover(collective, &filter, config.discovery_timeout, None)?;
        if discovered.is_empty() {
            return Ok(Answer { discovered, replies: Vec::new(), ambiguous: Vec::new(), at: now() });
        }
        let outcome = self.client.rpc_broadcast_raw(
            collective,
            AGENT,
            ACTION,
            &[],
            &filter,
            Some(discovered.len()),
            self.timeout,
        )?;
        Ok(Answer { discovered, replies: outcome.replies, ambiguous: outcome.ambiguous, at: now() })
    }
}

fn replies(n: u64) -> &'static str {
    if n == 1 {
        "reply"
    } else {
        "replies"
    }
}

/// One failure per line of the message; the same error in several collectives once.
fn summarize(failures: &[(String, String)]) -> String {
    let mut by_error: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (collective, error) in failures {
        by_error.entry(error.as_str()).or_default().push(collective.as_str());
    }
    by_error
        .into_iter()
        .map(|(error, collectives)| {
            let plural = if collectives.len() == 1 { "" } else { "s" };
            format!("collective{plural} {}: {error}", collectives.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn join<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    const SHOWN: usize = 20;
    let items: Vec<S> = items.into_iter().collect();
    let mut text = items.iter().take(SHOWN).map(AsRef::as_ref).collect::<Vec<_>>().join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults of the `mcollective.*` keys.
    fn defaults() -> McollectiveSettings {
        crate::config::Config::defaults(&crate::PuppetSettings::default()).sources.mcollective
    }
    use crate::facts::Node;
    use crate::mcollective::config::{BrokerHost, Config, Overrides};
    use crate::mcollective::Client;
    use crate::source::mcollective::McollectiveSettings;
    use crate::source::Source;
    use serde_json::json;

    fn source(collectives: &[&str], grace: u64) -> McollectiveSource {
        let overrides = Overrides {
            no_config_file: true,
            pool: Some(vec![BrokerHost {
                host: "127.0.0.1".into(),
                port: 1,
                user: String::new(),
                password: String::new(),
                tls: None,
            }]),
            psk: Some("k".into()),
            identity: Some("master".into()),
            collectives: Some(collectives.iter().map(|s| s.to_string()).collect()),
            ..Overrides::default()
        };
        let client = Client::new(Config::resolve("", None, &overrides, None).unwrap());
        McollectiveSource::with_client(client, &McollectiveSettings { grace, ..defaults() })
    }

    fn node(certname: &str, environment: &str, answered_at: Option<i64>) -> Node {
        let facts = json!({"environment": environment}).as_object().cloned().unwrap();
        let mut node = Node::new(certname.into(), facts, 0, None);
        node.answered_at = answered_at;
        node
    }

    #[test]
    fn targets_are_the_environments_collectives_plus_the_main_one_or_all_on_a_cold_start() {
        let s = source(&["mcollective", "production", "staging", "dev"], 60);
        assert_eq!(s.targets(None), ["dev", "mcollective", "production", "staging"]);
        let empty = Index::build(vec![], "role", 0);
        assert_eq!(s.targets(Some(&empty)).len(), 4);
        let index = Index::build(
            vec![node("a", "production", None), node("b", "qa", None), node("c", "production", None)],
            "role",
            0,
        );
        // qa has no collective: the main collective stands in for it.
        assert_eq!(s.targets(Some(&index)), ["mcollective", "production"]);
    }

    #[test]
    fn silent_servers_are_kept_for_the_grace_period_then_dropped() {
        let s = source(&["mcollective"], 60);
        let previous = Index::build(
            vec![
                node("answered", "production", Some(1000)),
                node("silent-now", "production", Some(1000)),
                node("silent-long", "production", Some(900)),
                node("from-a-cache", "production", None),
            ],
            "role",
            1000,
        );
        let mut read = SourceRead::default();
        s.apply_grace(&previous, &BTreeSet::from(["answered"]), 1010, &mut read);
        let kept: Vec<&str> = read.kept.iter().map(|p| previous.server(*p).certname()).collect();
        assert_eq!(kept, ["silent-now"]);
        assert_eq!(read.warnings.len(), 2, "{:?}", read.warnings);
        assert!(read.warnings[0].contains("no answer from silent-now; kept"), "{:?}", read.warnings);
        assert!(read.warnings[1].contains("dropped silent-long"), "{:?}", read.warnings);

        // Still silent at the next refresh: kept, without a new warning, until the grace ends.
        let next = read.into_index(Some(&previous), &BTreeMap::new(), "role", 1010);
        let carried = next.by_certname("silent-now").expect("kept");
        assert_eq!((carried.environment(), carried.answered_at()), ("production", Some(1000)));
        assert_eq!(next.len(), 1);
        let mut again = SourceRead::default();
        s.apply_grace(&next, &BTreeSet::new(), 1060, &mut again);
        assert_eq!(again.kept.len(), 1);
        assert!(again.warnings.is_empty(), "{:?}", again.warnings);
        let mut last = SourceRead::default();
        s.apply_grace(&next, &BTreeSet::new(), 1061, &mut last);
        assert!(last.kept.is_empty());
        assert!(last.warnings[0].contains("dropped silent-now"));
    }

    #[test]
    fn an_unreachable_broker_fails_the_refresh_with_the_reason() {
        let s = source(&["mcollective", "production"], 60);
        let e = s.refresh(None, now(), &Default::default()).unwrap_err().to_string();
        assert!(e.contains("collectives mcollective, production: no broker could be reached: 127.0.0.1:1"), "{e}");
    }
}
