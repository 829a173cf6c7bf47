//! `puppet kicker refresh`: a refresh now, through the service, in two calls so the
//! face can print progress while the core works: `refresh` starts it (or joins the
//! one in flight) and gives a ticket; `refresh_progress` waits a moment for that
//! ticket and says how far it got, then how it ended.

use crate::error::{Error, Result};
use crate::service::{Outcome, Service};
use crate::unpoisoned::lock;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refreshes a process follows at once; a caller that never polls loses its oldest.
const MAX_TICKETS: usize = 16;
/// The longest one `refresh_progress` call waits.
const MAX_POLL: Duration = Duration::from_secs(1);

/// A refresh started by `refresh`: when, and where its end is heard.
struct Ticket {
    started: Instant,
    finished: Receiver<()>,
}

static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);
static TICKETS: Mutex<BTreeMap<u64, Ticket>> = Mutex::new(BTreeMap::new());

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressArgs {
    ticket: u64,
    /// Milliseconds to wait for the end before answering (at most [`MAX_POLL`]).
    #[serde(default)]
    wait_ms: u64,
}

/// `{"ticket": T, "source": ..., "source_description": ...}`.
pub fn start(service: &Service, _args: StartArgs) -> Result<Value> {
    let finished = service.start_refresh();
    let ticket = NEXT_TICKET.fetch_add(1, Ordering::Relaxed);
    let mut tickets = lock(&TICKETS);
    while tickets.len() >= MAX_TICKETS {
        tickets.pop_first();
    }
    tickets.insert(ticket, Ticket { started: Instant::now(), finished });
    Ok(json!({
        "ticket": ticket,
        "source": service.config().source.name(),
        "source_description": service.describe_source(),
    }))
}

/// `{"done": false, "servers_read": N, "elapsed_ms": E}` while it runs; then
/// `"done": true` and `"refresh"`, the record of the refresh (counts, servers,
/// duration). A failed refresh is an error naming the source and its reason.
pub fn progress(service: &Service, args: ProgressArgs) -> Result<Value> {
    let (started, finished) = {
        let tickets = lock(&TICKETS);
        let ticket = tickets.get(&args.ticket).ok_or_else(|| {
            Error::Query(format!("puppet kicker refresh_progress: no refresh {} in this process", args.ticket))
        })?;
        (ticket.started, ticket.finished.clone())
    };
    let done = match finished.recv_timeout(Duration::from_millis(args.wait_ms).min(MAX_POLL)) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
        Err(RecvTimeoutError::Timeout) => false,
    };
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let servers_read = service.refresh_progress();
    if !done {
        return Ok(json!({"done": false, "servers_read": servers_read, "elapsed_ms": elapsed_ms}));
    }
    lock(&TICKETS).remove(&args.ticket);
    let record = service
        .last_refresh()
        .ok_or_else(|| Error::Io("puppet kicker refresh: the refresh ended without a record".into()))?;
    if record.outcome == Outcome::Failed {
        // Said once, as this error: the refresh thread did not warn of it
        // (`Service::start_refresh`).
        let serving = match record.servers {
            0 => "no data to serve yet".to_string(),
            n => format!("the last index, {n} servers, still serves"),
        };
        return Err(Error::Io(format!(
            "puppet kicker refresh: {} failed ({} in a row; {serving}): {}",
            service.describe_source(),
            record.failures,
            record.error.as_deref().unwrap_or("no reason given")
        )));
    }
    Ok(json!({"done": true, "servers_read": servers_read, "elapsed_ms": elapsed_ms, "refresh": record}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PuppetSettings;
    use crate::service::{Recorded, RefreshRecord, RECORD_FILE};
    use std::fs;

    /// How the refresh thread's warning of a failed refresh begins (`service::refresh`).
    const FAILED_WARNING: &str = "puppet-kicker refresh failed (";

    fn until_done(service: &Service, ticket: u64) -> Result<Value> {
        let start = Instant::now();
        loop {
            let answer = progress(service, ProgressArgs { ticket, wait_ms: 100 })?;
            if answer["done"] == true {
                return Ok(answer);
            }
            assert!(start.elapsed() < Duration::from_secs(20), "the refresh did not end");
        }
    }

    /// A refresh started and polled ends with its record, also written for other
    /// processes; status reads it; a failed one is an error naming the directory,
    /// recorded as failed while the last index still serves.
    #[test]
    fn a_refresh_is_polled_to_its_record_and_a_failure_names_the_source() {
        let root = crate::snapshot::tests::tempdir("command-refresh");
        let (etc, facts, cache) = (root.join("etc"), root.join("facts"), root.join("cache"));
        fs::create_dir_all(&etc).unwrap();
        let config = format!("puppet_cache:\n  dirs: [{}]\ncache:\n  dir: {}\n", facts.display(), cache.display());
        fs::write(etc.join("puppet_kicker.yaml"), config).unwrap();
        crate::synthetic::write_puppet_cache(&facts, &crate::synthetic::fleet(30, 2, crate::time::now())).unwrap();
        let settings = PuppetSettings { confdir: etc, vardir: root.join("var"), ..Default::default() };
        let service = Service::start(settings).unwrap();
        let status = |max_age: Option<u64>| {
            super::super::status::run(&service, super::super::status::Args::with_max_age(max_age)).unwrap()
        };

        let before = status(Some(60));
        assert_eq!((before["index"]["servers"].as_u64(), before["exit_code"].as_i64()), (Some(0), Some(2)));
        assert_eq!(before["last_refresh"], Value::Null);
        assert!(!cache.join(RECORD_FILE).exists(), "status refreshes nothing");

        let ticket = start(&service, StartArgs {}).unwrap()["ticket"].as_u64().unwrap();
        let done = until_done(&service, ticket).unwrap();
        let record = &done["refresh"];
        assert_eq!((record["outcome"].as_str(), record["servers"].as_u64()), (Some("ok"), Some(30)));
        assert_eq!(
            (record["added"].as_u64(), record["changed"].as_u64(), record["dropped"].as_u64()),
            (Some(30), Some(0), Some(0))
        );
        assert_eq!(done["servers_read"].as_u64(), Some(30));
        assert!(matches!(service.recorded_refresh(), Recorded::Found(r) if r.servers == 30));
        let after = status(Some(3600));
        assert_eq!((after["index"]["servers"].as_u64(), after["exit_code"].as_i64()), (Some(30), Some(0)));
        assert_eq!(&after["last_refresh"], record);
        assert!(progress(&service, ProgressArgs { ticket, wait_ms: 0 }).is_err(), "a ticket ends with its answer");

        fs::remove_dir_all(&facts).unwrap();
        let ticket = start(&service, StartArgs {}).unwrap()["ticket"].as_u64().unwrap();
        // Polled as the face polls, its warnings logged after every call: the
        // failure never shows as a warning, however the poll falls (it once did when
        // a poll ended between the warning and the end).
        let error = loop {
            let answer = progress(&service, ProgressArgs { ticket, wait_ms: 1 });
            let warned = service.take_warnings();
            assert!(!warned.iter().any(|w| w.starts_with(FAILED_WARNING)), "said once, as the error: {warned:?}");
            match answer {
                Ok(answer) => assert_eq!(answer["done"], false, "the refresh fails"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(error.contains(&facts.display().to_string()) && error.contains("1 in a row"), "{error}");
        assert!(error.contains("the last index, 30 servers, still serves"), "{error}");
        assert!(!service.take_warnings().iter().any(|w| w.starts_with(FAILED_WARNING)), "said once, as the error");
        let failed = status(None);
        assert_eq!(failed["last_refresh"]["outcome"], "failed");
        assert_eq!((failed["index"]["servers"].as_u64(), failed["backoff"]["failures"].as_u64()), (Some(30), Some(1)));

        // The row is the cache dir's: other processes' failures of this source count,
        // another process's success breaks it, another source's record is not this row.
        let Recorded::Found(mine) = service.recorded_refresh() else { panic!("the failure is recorded") };
        let fail_after = |other: Option<RefreshRecord>| {
            if let Some(other) = other {
                fs::write(cache.join(RECORD_FILE), serde_json::to_vec(&other).unwrap()).unwrap();
            }
            let ticket = start(&service, StartArgs {}).unwrap()["ticket"].as_u64().unwrap();
            let error = until_done(&service, ticket).unwrap_err().to_string();
            let recorded = match service.recorded_refresh() {
                Recorded::Found(r) => r.failures,
                other => panic!("{other:?}"),
            };
            (error, recorded, status(None)["backoff"]["failures"].as_u64())
        };
        let other = |outcome, failures, source: &str| RefreshRecord {
            pid: mine.pid.wrapping_add(1),
            outcome,
            failures,
            source: source.into(),
            ..mine.clone()
        };
        let (error, recorded, backoff) = fail_after(None);
        assert!(error.contains("2 in a row"), "{error}");
        assert_eq!((recorded, backoff), (2, Some(2)));
        let (error, recorded, backoff) = fail_after(Some(other(Outcome::Failed, 6, "puppet_cache")));
        assert!(error.contains("7 in a row"), "after another process's sixth: {error}");
        assert_eq!((recorded, backoff), (7, Some(7)));
        let (error, recorded, _) = fail_after(Some(other(Outcome::Ok, 0, "puppet_cache")));
        assert!(error.contains("1 in a row"), "another process's success broke the row: {error}");
        assert_eq!(recorded, 1);
        let (error, recorded, _) = fail_after(Some(other(Outcome::Failed, 40, "mcollective")));
        assert!(error.contains("2 in a row"), "another source's row is not this one: {error}");
        assert_eq!(recorded, 2);
        let _ = fs::remove_dir_all(&root);
    }

    /// Two processes sharing a cache dir whose refreshes fail at the same moment:
    /// each failure is counted once in the row on disk (each reads the other's
    /// record under the refresh lock), however their refreshes interleave.
    #[test]
    fn failures_at_once_in_two_processes_are_each_counted() {
        const ROUNDS: u64 = 12;
        let root = crate::snapshot::tests::tempdir("command-refresh-at-once");
        let (etc, cache) = (root.join("etc"), root.join("cache"));
        fs::create_dir_all(&etc).unwrap();
        let missing = root.join("no-such-facts");
        let config = format!("puppet_cache:\n  dirs: [{}]\ncache:\n  dir: {}\n", missing.display(), cache.display());
        fs::write(etc.join("puppet_kicker.yaml"), config).unwrap();
        // Two services on one configuration: two processes, as far as the cache dir
        // can tell (flock locks belong to open files, not to processes).
        let settings = || PuppetSettings { confdir: etc.clone(), vardir: root.join("var"), ..Default::default() };
        let (first, second) = (Service::start(settings()).unwrap(), Service::start(settings()).unwrap());
        for _ in 0..ROUNDS {
            let tickets = [&first, &second].map(|s| start(s, StartArgs {}).unwrap()["ticket"].as_u64().unwrap());
            for (service, ticket) in [&first, &second].into_iter().zip(tickets) {
                assert!(until_done(service, ticket).is_err(), "the facts directory is missing");
            }
        }
        let recorded = |service: &Service| match service.recorded_refresh() {
            Recorded::Found(r) => r.failures,
            other => panic!("{other:?}"),
        };
        let on_disk: RefreshRecord = serde_json::from_slice(&fs::read(cache.join(RECORD_FILE)).unwrap()).unwrap();
        assert_eq!(u64::from(on_disk.failures), 2 * ROUNDS, "every failure counted once");
        assert_eq!(u64::from(recorded(&first).max(recorded(&second))), 2 * ROUNDS);
        let _ = fs::remove_dir_all(&root);
    }
}
