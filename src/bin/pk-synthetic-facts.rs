//! `pk-synthetic-facts DIR N [SEED]`: writes a synthetic fleet of N servers as
//! puppetserver's JSON fact cache into DIR (which must be empty or not exist), for
//! benchmarks. The same N and SEED give the same servers; timestamps are "now".

use puppet_kicker::synthetic;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: pk-synthetic-facts DIR N [SEED]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("pk-synthetic-facts: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let (dir, count, seed) = match args.as_slice() {
        [dir, count] => (dir, count, "1"),
        [dir, count, seed] => (dir, count, seed.as_str()),
        _ => return Err(USAGE.into()),
    };
    let dir = PathBuf::from(dir);
    let count: usize = count.parse().map_err(|_| format!("N must be a number of servers, got {count:?}\n{USAGE}"))?;
    let seed: u64 = seed.parse().map_err(|_| format!("SEED must be an unsigned integer, got {seed:?}\n{USAGE}"))?;
    // Never mix with (or overwrite) a real fact cache.
    if let Ok(mut entries) = std::fs::read_dir(&dir) {
        if entries.next().is_some() {
            return Err(format!("{} is not empty; give a new or empty directory", dir.display()));
        }
    }
    let nodes = synthetic::fleet(count, seed, puppet_kicker::time::now());
    let bytes =
        synthetic::write_puppet_cache(&dir, &nodes).map_err(|e| format!("cannot write {}: {e}", dir.display()))?;
    let facts: usize = nodes.iter().map(|n| n.facts.len()).sum();
    println!(
        "wrote {count} servers (seed {seed}, {:.0} top-level facts each on average, {:.1} MB) to {}",
        facts as f64 / count.max(1) as f64,
        bytes as f64 / 1e6,
        dir.display()
    );
    Ok(())
}
