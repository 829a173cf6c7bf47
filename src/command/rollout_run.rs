//! `puppet kicker rollout run` and `rollout status`: a plan ([`super::rollout`])
//! carried out by [`crate::rollout::Rollout`] through the kick transport, one bounded
//! step per request, its state saved in the cache dir (`rollout.json`) after each.
//! The face loops on `rollout_step`, shows progress between steps and turns Ctrl-C
//! or SIGTERM into `rollout_abort`: that the core never blocks for long is what
//! makes the signal safe to take.

use super::rollout::{make_plan, Args as PlanArgs};
use crate::error::{Error, Result};
use crate::kick::{now_ms, Transport};
use crate::rollout::{Batch, Rollout};
use crate::service::Service;
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The saved rollout, in the cache dir.
pub const STATE_FILE: &str = "rollout.json";
/// Held while a request changes the saved rollout.
const LOCK_FILE: &str = "rollout.lock";
/// `--timeout-per-batch` when not given: a Puppet run's usual bound.
const DEFAULT_TIMEOUT_PER_BATCH: u64 = 1800;

const NAME: &str = "puppet kicker rollout run";

/// What `rollout run` sends: the plan's options, then the run's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    environment: String,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    clauses: Vec<String>,
    #[serde(default)]
    batch: Option<u64>,
    #[serde(default)]
    order: Option<String>,
    /// Go on past a failed batch.
    #[serde(default)]
    continue_on_failure: bool,
    /// Seconds a batch may take until every run of it is confirmed.
    #[serde(default)]
    timeout_per_batch: Option<u64>,
    /// Continue the saved rollout instead of planning a new one.
    #[serde(default)]
    resume: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbortArgs {
    /// Why (the signal's name), for the log and the state.
    why: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Starts a rollout (or, with `resume`, takes the saved one up): its state.
pub fn start(service: &Service, args: RunArgs) -> Result<Value> {
    let transport = transport(service)?;
    let _lock = lock(service)?;
    let saved = load(service)?;
    let rollout = if args.resume {
        match saved {
            Some(rollout) if !rollout.is_over() => rollout,
            Some(rollout) => {
                return Err(Error::Query(format!("{NAME} --resume: rollout {} is over; nothing to resume", rollout.id)))
            }
            None => {
                return Err(Error::Query(format!("{NAME} --resume: no rollout saved in {}", path(service).display())))
            }
        }
    } else {
        if let Some(rollout) = saved.filter(|r| !r.is_over()) {
            return Err(Error::Query(format!(
                "{NAME}: rollout {} is in progress (its state is in {}): continue it with --resume",
                rollout.id,
                path(service).display()
            )));
        }
        let timeout = args.timeout_per_batch.unwrap_or(DEFAULT_TIMEOUT_PER_BATCH);
        if timeout == 0 || timeout > 86_400 {
            return Err(Error::Query(format!("{NAME}: --timeout-per-batch {timeout}: give 1 to 86400 seconds")));
        }
        let plan_args = PlanArgs::new(&args.environment, &args.roles, &args.clauses, args.batch, args.order.clone());
        let (plan, _) = make_plan(service, &plan_args)?;
        let batches: Vec<Batch> = plan
            .groups
            .iter()
            .flat_map(|g| g.batches().map(|b| Batch { group: g.name(), servers: b.to_vec() }).collect::<Vec<_>>())
            .collect();
        let now = now_ms();
        let rollout = Rollout::new(
            &rollout_id(now),
            &args.environment,
            batches,
            args.continue_on_failure,
            (timeout * 1000) as i64,
            now,
        );
        save(service, &rollout)?;
        rollout
    };
    drop(transport);
    Ok(answer(&rollout, Vec::new()))
}

/// One step of the saved rollout.
pub fn step(service: &Service, _: NoArgs) -> Result<Value> {
    let transport = transport(service)?;
    let _lock = lock(service)?;
    let mut rollout = load(service)?.ok_or_else(|| Error::Query(format!("{NAME}: no rollout saved")))?;
    let lines = rollout.step(transport.as_ref(), now_ms());
    save(service, &rollout)?;
    Ok(answer(&rollout, lines))
}

/// Stops the saved rollout at its next step.
pub fn abort(service: &Service, args: AbortArgs) -> Result<Value> {
    let _lock = lock(service)?;
    let mut rollout = load(service)?.ok_or_else(|| Error::Query(format!("{NAME}: no rollout saved")))?;
    rollout.abort(&args.why);
    save(service, &rollout)?;
    Ok(answer(&rollout, Vec::new()))
}

/// `rollout status`: the saved rollout as it stands.
pub fn status(service: &Service, _: NoArgs) -> Result<Value> {
    match load(service)? {
        Some(rollout) => Ok(answer(&rollout, Vec::new())),
        None => {
            Err(Error::Query(format!("puppet kicker rollout status: no rollout saved in {}", path(service).display())))
        }
    }
}

fn answer(rollout: &Rollout, lines: Vec<crate::rollout::Line>) -> Value {
    json!({
        "rollout": rollout,
        "progress": rollout.progress(),
        "over": rollout.is_over(),
        "lines": lines.into_iter().map(|l| json!({"warning": l.warning, "text": l.text})).collect::<Vec<_>>(),
    })
}

/// The configured transport, if it can disable, enable and read the last run.
fn transport(service: &Service) -> Result<Box<dyn Transport>> {
    let transport = service.kick_transport().map_err(|e| Error::Query(format!("{NAME}: no kick transport: {e}")))?;
    if !transport.controls_agents() {
        return Err(Error::Query(format!("{NAME}: {} (`rollout plan` works without it)", transport.no_control())));
    }
    Ok(transport)
}

fn path(service: &Service) -> PathBuf {
    service.config().cache_dir.join(STATE_FILE)
}

fn lock(service: &Service) -> Result<std::fs::File> {
    let dir = &service.config().cache_dir;
    crate::cache_dir::ensure(dir).map_err(|e| Error::Io(format!("{NAME}: {e}")))?;
    let path = dir.join(LOCK_FILE);
    crate::process::lock_within(&path, std::time::Duration::from_secs(30))
        .map_err(|e| Error::Io(format!("{NAME}: cannot lock {}: {e}", path.display())))?
        .ok_or_else(|| Error::Query(format!("{NAME}: another process holds {} for 30 s", path.display())))
}

fn load(service: &Service) -> Result<Option<Rollout>> {
    let path = path(service);
    let bytes = match crate::bounded_read::read(&path, crate::rollout::MAX_STATE_BYTES as u64) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Io(format!("{NAME}: cannot read {}: {e}", path.display()))),
    };
    crate::rollout::decode(&bytes)
        .map(Some)
        .map_err(|e| Error::Io(format!("{NAME}: {} is not a rollout's state: {e}", path.display())))
}

fn save(service: &Service, rollout: &Rollout) -> Result<()> {
    let path = path(service);
    let bytes = serde_json::to_vec_pretty(rollout).map_err(|e| Error::Io(format!("{NAME}: {e}")))?;
    crate::atomic_file::write(&path, &[&bytes, b"\n"])
        .map_err(|e| Error::Io(format!("{NAME}: cannot save {}: {e}", path.display())))
}

/// `20261129T040500Z`: when it started, in UTC, to the second.
fn rollout_id(now: i64) -> String {
    let t = crate::time::CalendarTime::utc(now.div_euclid(1000));
    format!("{:04}{:02}{:02}T{:02}{:02}{:02}Z", t.year, t.month, t.day, t.hour, t.minute, t.second)
}
