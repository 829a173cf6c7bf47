//! The process-wide service the bindings call (through [`crate::api`]): one per
//! Puppet process, shared by every compile and (under puppetserver) every JRuby
//! instance.
//!
//! - [`index`]: the fact index, its queries and the no-data rule;
//! - [`refresh`]: the background refreshes that keep it fresh, and their backoff;
//! - [`kicks`]: [`Service`], the index composed with the kick service.

mod index;
mod kicks;
mod record;
mod refresh;

pub use index::{IndexService, Selection, Status};
pub use kicks::{OperatorKick, Service};
pub use record::{Outcome, Recorded, RefreshRecord, RECORD_FILE};

use crate::config::PuppetSettings;
use crate::error::{Error, Result};
use crate::unpoisoned::lock;
use std::sync::{Arc, Mutex};

/// Warnings kept for the bindings to log; newer ones are dropped, counted.
const MAX_PENDING_WARNINGS: usize = 256;
/// Held by the process refreshing a cache dir: one refresh at a time across the
/// processes sharing it (concurrent `puppet apply` runs, the masterless helper).
pub const REFRESH_LOCK: &str = "refresh.lock";

static GLOBAL: Mutex<Option<Arc<Service>>> = Mutex::new(None);

impl Service {
    /// The process-wide instance for these settings: reused when they are unchanged,
    /// replaced (configuration re-read) when they differ.
    pub fn configure(settings: PuppetSettings) -> Result<Arc<Service>> {
        let mut global = lock(&GLOBAL);
        if let Some(service) = global.as_ref().filter(|s| s.settings == settings) {
            return Ok(service.clone());
        }
        let service = Arc::new(Service::start(settings)?);
        *global = Some(service.clone());
        Ok(service)
    }

    /// The instance `configure` made last.
    pub fn global() -> Result<Arc<Service>> {
        lock(&GLOBAL).clone().ok_or_else(|| Error::Config("puppet-kicker is not configured yet".into()))
    }
}
