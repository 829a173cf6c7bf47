//! Whether a masterless helper (the module `masterless_helper`) runs for a cache dir,
//! and what it waits for: `helper.json`, which the running helper writes and the
//! kick status file and the status call show under `helper`.

use serde_json::Value;
use std::path::Path;

/// The running helper's pid, start, deadline and what it waits for.
pub const HELPER_FILE: &str = "helper.json";
/// `helper.json` is a few lines; a larger one is not ours.
const MAX_HELPER_FILE: u64 = 64 << 10;

/// `helper.json` of the helper running for `cache_dir`, or null when none runs.
pub fn describe(cache_dir: &Path) -> Value {
    let path = cache_dir.join(HELPER_FILE);
    let Ok(bytes) = crate::bounded_read::read(&path, MAX_HELPER_FILE) else { return Value::Null };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(doc) if doc["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).is_some_and(crate::process::alive) => doc,
        _ => Value::Null,
    }
}
