//! What the fuzz targets share: a small fixed fleet to query, configured in a scratch
//! directory of the fuzzing process, and builders emptied for each input ([`pool`]).

pub mod pool;

use puppet_kicker::index::reference;
use puppet_kicker::{Index, PuppetSettings, Service};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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
