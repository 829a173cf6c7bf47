//! puppet-kicker's core: a cached index of every server's facts, the query language
//! that selects servers from it, the fact sources that fill it and the snapshot that
//! keeps it across processes.
//!
//! Nothing here knows about Ruby: the Ruby extension (`ext/puppet_kicker`) and the
//! C-ABI library for JRuby only convert values in and out of [`api`].

pub mod api;
pub mod atomic_file;
pub mod bounded_read;
pub mod cache_dir;
pub mod command;
pub mod config;
pub mod error;
pub mod facts;
pub mod helper_presence;
pub mod index;
pub mod kick;
pub mod log;
pub mod masterless_helper;
pub mod mcollective;
pub mod process;
pub mod puppet_settings;
pub mod query;
pub mod redact;
pub mod reply;
pub mod rollout;
pub mod service;
pub mod snapshot;
pub mod source;
pub mod store;
/// A deterministic synthetic fleet with Facter-4-like facts, for benchmarks and tests
/// (the `synthetic` feature; the shipped libraries leave it out).
#[cfg(feature = "synthetic")]
pub mod synthetic;
pub mod time;
pub mod tls_files;
pub mod unpoisoned;
pub mod yaml;

pub use config::{Config, PuppetSettings};
pub use error::{Error, Result};
pub use facts::Node;
pub use index::{Freshness, Index};
pub use service::{IndexService, Selection, Service, Status};

pub use query::{Query, RoleSelector};
