//! What one refresh leaves the next (its memo): every server held, as PuppetDB last
//! gave it, its facts in the store of the index that refresh built.

use super::decode::Entry;
use crate::source::Observation;
use std::collections::BTreeMap;

/// A server as the index holds it.
#[derive(Clone, Debug)]
pub struct Held {
    /// PuppetDB's timestamp of its facts, as PuppetDB wrote it.
    pub timestamp: String,
    pub observation: Observation,
    /// PuppetDB's recorded environment.
    pub environment: Option<String>,
}

impl Held {
    pub fn of(entry: Entry) -> (String, Held) {
        let observation = Observation::new(entry.certname.clone(), entry.facts, entry.seconds);
        (entry.certname, Held { timestamp: entry.timestamp, observation, environment: entry.environment })
    }
}

/// Every server held, by certname, and what the next incremental refresh starts from.
#[derive(Debug, Default)]
pub struct State {
    pub servers: BTreeMap<String, Held>,
    /// The newest facts timestamp PuppetDB gave (Unix seconds, PuppetDB's clock).
    pub newest: i64,
    /// When the last full read began (this host's clock).
    pub full_at: i64,
    /// Values in the store after the last full read.
    pub values_after_full: usize,
}

impl State {
    /// Where PuppetDB recorded each server, in place of where the master saw it compile.
    pub fn environments(&self) -> BTreeMap<String, String> {
        let recorded = self.servers.iter().filter_map(|(c, h)| Some((c.clone(), h.environment.clone()?)));
        recorded.collect()
    }

    /// Every server held, in certname order.
    pub fn observations(&self) -> Vec<Observation> {
        self.servers.values().map(|h| h.observation.clone()).collect()
    }
}
