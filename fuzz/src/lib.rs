//! What the fuzz targets share: each input's CPU budget ([`CpuBudget`]), a small
//! fixed fleet to query, configured in a scratch directory of the fuzzing process,
//! and builders emptied for each input ([`pool`]).

pub mod pool;

use puppet_kicker::index::reference;
use puppet_kicker::{Index, PuppetSettings, Service};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The CPU time an input may take: the process's, every thread's.
pub const CPU_PER_INPUT: Duration = Duration::from_secs(1);

/// An input's CPU budget, started first thing in every target and checked when
/// dropped, at whatever return: an input over [`CPU_PER_INPUT`] fails as a slow
/// input (a panic, so libFuzzer saves it). libFuzzer's `-timeout` counts wall time,
/// which a fuzzer starved of the CPU spends without any slowness of its own (at
/// `nice -n 19` beside builds, inputs of 30 ms of CPU took 13 and 17 s): script/fuzz
/// gives it 60 s, for a hang or a wait.
pub struct CpuBudget(Duration);

impl CpuBudget {
    pub fn start() -> CpuBudget {
        CpuBudget(process_cpu_time())
    }
}

impl Drop for CpuBudget {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let spent = process_cpu_time().saturating_sub(self.0);
        assert!(
            spent <= CPU_PER_INPUT,
            "a slow input: {:.3} s of CPU, over the {} s an input may take",
            spent.as_secs_f64(),
            CPU_PER_INPUT.as_secs()
        );
    }
}

/// The CPU time of this process so far (user and system, every thread).
fn process_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID): {}", std::io::Error::last_os_error());
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The puppet cache fixtures of the core's tests.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/puppet_cache")
}

/// A directory of this fuzzing process, removed by nobody: it lives in the temp dir.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("puppet-kicker-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    })
}

/// The settings of a master over the fixture fleet, its config file written with
/// `config` (kicks dry-run: nothing leaves the process).
pub fn fleet_settings(config: &str) -> PuppetSettings {
    let dir = scratch_dir().join("fleet");
    std::fs::create_dir_all(&dir).expect("fleet dir");
    let facts = fixtures();
    let text = format!(
        "puppet_cache:\n  dirs: [{}, {}]\ncache:\n  dir: {}\non_no_data: empty\nmax_age: 100000d\nkick:\n  dry_run: true\n{config}",
        facts.join("server_data/facts").display(),
        facts.join("yaml/facts").display(),
        dir.join("cache").display(),
    );
    let config_file = dir.join("puppet_kicker.yaml");
    std::fs::write(&config_file, text).expect("fleet config");
    PuppetSettings { confdir: dir.clone(), vardir: dir, config_file: Some(config_file), ..Default::default() }
}

/// The fixture fleet, indexed once per process.
pub fn fleet() -> &'static Service {
    static FLEET: OnceLock<Service> = OnceLock::new();
    FLEET.get_or_init(|| Service::start(fleet_settings("")).expect("the fixture fleet starts"))
}

/// The input of the query targets: the first line is the environment, the next (at
/// most 32) are the function's arguments. `None` unless the input is UTF-8.
pub fn environment_and_arguments(input: &[u8]) -> Option<(&str, Vec<&str>)> {
    let text = std::str::from_utf8(input).ok()?;
    let mut lines = text.split('\n');
    let environment = lines.next().unwrap_or_default();
    Some((environment, lines.take(32).collect()))
}

/// The fixture fleet twice: in the store-backed index and in the serde_json index it
/// replaced, for targets that hold one to the other.
pub fn indexes() -> &'static (Index, reference::Index) {
    static BOTH: OnceLock<(Index, reference::Index)> = OnceLock::new();
    BOTH.get_or_init(|| {
        let facts = fixtures();
        let dirs = [facts.join("server_data/facts"), facts.join("yaml/facts")];
        let harvest = puppet_kicker::source::puppet_cache::load(&dirs).expect("the fixture fleet loads");
        let nodes: Vec<_> = harvest.observations.iter().map(|o| harvest.node(o, None)).collect();
        (Index::build(nodes.clone(), "role", 0), reference::Index::build(nodes, "role", 0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(cpu: Duration) {
        let start = process_cpu_time();
        while process_cpu_time() - start < cpu {
            std::hint::black_box(());
        }
    }

    #[test]
    fn an_input_within_its_cpu_budget_passes() {
        let _cpu = CpuBudget::start();
        spin(Duration::from_millis(50));
    }

    #[test]
    #[should_panic(expected = "a slow input")]
    fn an_input_over_its_cpu_budget_fails() {
        let _cpu = CpuBudget::start();
        spin(CPU_PER_INPUT + Duration::from_millis(50));
    }
}
