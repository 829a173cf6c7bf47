//! What the cargo benches share for `script/bench --report`: the machine (on stderr:
//! the report's header names it once), the load average, and the results file.

use std::fs;
use std::io::Write;

/// Appends `key`'s figure to the results file named by `PK_BENCH_RESULTS`, if any: one
/// JSON object a line, read by `script/bench --report` for its summary and scaling table.
pub fn record(key: &str, value: f64) {
    let Ok(path) = std::env::var("PK_BENCH_RESULTS") else { return };
    let line = serde_json::json!({ "key": key, "value": value }).to_string() + "\n";
    let mut file = fs::OpenOptions::new().create(true).append(true).open(&path).expect("open PK_BENCH_RESULTS");
    file.write_all(line.as_bytes()).expect("write PK_BENCH_RESULTS");
}

/// The benchmark's name and the machine, on stderr.
pub fn print_machine(bench: &str) {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_string())))
        .unwrap_or_default();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    eprintln!("puppet-kicker {} benchmark (cargo bench --bench {bench})", env!("CARGO_PKG_VERSION"));
    eprintln!(
        "machine: nproc {nproc}, CPU {model}, memory {memory}, Linux {}, {} {}",
        kernel.trim(),
        std::env::consts::ARCH,
        if cfg!(debug_assertions) { "debug build" } else { "optimized build" }
    );
}

/// The 1, 5 and 15-minute load averages.
pub fn load_average() -> String {
    let text = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
