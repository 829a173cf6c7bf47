//! Helpers shared by integration tests (each test file includes what it uses).
#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub mod ca;
pub mod postgres;

pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// For a test marked `#[ignore = "needs root"]`: fails, saying so, when not root, so
/// that such a test never passes without running. `script/test` runs them (CI is root).
pub fn require_root() {
    assert!(is_root(), "this test needs root (it chowns or mounts); run it as root, as script/test does in CI");
}

/// A tmpfs of `size` bytes mounted on `dir` until dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Needs root: the test that mounts one is marked `#[ignore = "needs root"]`.
    pub fn mount(dir: &Path, size: usize) -> Tmpfs {
        require_root();
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let target = c(dir.to_str().unwrap());
        let options = c(&format!("size={size},mode=0750"));
        let rc = unsafe {
            libc::mount(c("tmpfs").as_ptr(), target.as_ptr(), c("tmpfs").as_ptr(), 0, options.as_ptr().cast())
        };
        if rc != 0 {
            panic!("cannot mount a tmpfs on {}: {}", dir.display(), std::io::Error::last_os_error());
        }
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.0.to_str().unwrap()).unwrap();
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Where a test's files go when they outlive the function that makes them (a kick
/// service's cache dir, a master's root): `$TMPDIR/pk-tests/{pid}/{name}`, emptied,
/// not created. They are left when the test process ends, for a look at a failure;
/// a later test process removes those of every process that has exited. After
/// `cargo test`, what is left is the last test binary's: the failed one, since
/// `cargo test` stops at the first binary that fails.
pub fn scratch_path(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let root = std::env::temp_dir().join("pk-tests");
    SWEPT.call_once(|| {
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            if pid.is_some_and(|pid| pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let dir = root.join(std::process::id().to_string()).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A fresh directory `$TMPDIR/{name}-{pid}` for one test, removed with what it holds
/// when dropped: at the test's end, passed or failed (declared before anything
/// mounted in it, such as a [`Tmpfs`], it is dropped after).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = PathBuf;

    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small deterministic PRNG, so the mutation tests need no crate.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A report from `host` whose one resource, `resource`, kicks the servers of `role`
/// (a run started now, in production, not a noop run).
pub fn role_kick(host: &str, resource: &str, role: &str) -> puppet_kicker::kick::ReportKicks {
    use puppet_kicker::kick::{KickSpec, ReportKicks, Selector};
    ReportKicks {
        host: host.into(),
        environment: "production".into(),
        run_started: puppet_kicker::kick::now_ms(),
        noop: false,
        reporter_pid: None,
        status: None,
        kicks: vec![KickSpec {
            resource: resource.into(),
            selector: Selector::Roles(vec![role.into()]),
            environment: None,
        }],
    }
}

/// A report with no kick (most reports), from `host`, of a changed run started now.
pub fn report_without_kicks(service: &puppet_kicker::kick::KickService, host: &str) {
    let mut report = role_kick(host, "Notify[quiet]", "none");
    report.kicks.clear();
    report.status = Some(puppet_kicker::kick::RunStatus::Changed);
    service.report(&report, |_, _| Vec::new(), |_| None);
}

/// `host`'s report kicking `role` ([`role_kick`]) taken in by `service`, its targets
/// resolved in `fleet` (certname, role); the lines it logged.
pub fn fleet_report(
    service: &puppet_kicker::kick::KickService,
    fleet: &[(&str, &str)],
    host: &str,
    role: &str,
) -> Vec<String> {
    use puppet_kicker::kick::{Selector, Target};
    let report = role_kick(host, &format!("Notify[kick -> {role}]"), role);
    let resolve = |selector: &Selector, _: &str| match selector {
        Selector::Roles(roles) => fleet
            .iter()
            .filter(|(_, r)| roles.iter().any(|x| x == r))
            .map(|(n, r)| Target { certname: n.to_string(), role: Some(r.to_string()) })
            .collect(),
        Selector::Facts(_) => Vec::new(),
    };
    let role_of = |host: &str| fleet.iter().find(|(n, _)| *n == host).map(|(_, r)| r.to_string());
    service.report(&report, resolve, role_of).into_iter().map(|l| l.message).collect()
}

/// A scratch master in `$TMPDIR/{dir}-{pid}`, made afresh: the fixtures' fact cache
/// (tests/fixtures/puppet_cache: lb1.example.com has role haproxy) as its
/// `var/server_data/facts`, `yaml` as its `etc/puppet_kicker.yaml`. Puppet's settings
/// for it (confdir and vardir; the caller adds the rest) and its root.
pub fn scratch_master(dir: &str, yaml: &str) -> (puppet_kicker::config::PuppetSettings, PathBuf) {
    let root = scratch_path(dir);
    let facts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/puppet_cache/server_data/facts");
    copy_facts_as_of_now(&facts, &root.join("var/server_data/facts"));
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/puppet_kicker.yaml"), yaml).unwrap();
    let settings = puppet_kicker::config::PuppetSettings {
        confdir: root.join("etc"),
        vardir: root.join("var"),
        ..Default::default()
    };
    (settings, root)
}

/// When the fixtures' fact caches (tests/fixtures/puppet_cache) were written: their
/// newest facts are from then, node0's a month older.
pub const FIXTURES_WRITTEN: &str = "2026-11-22T20:09:22Z";

/// Copies the fact cache files of `from` into `to` (created), their timestamps moved
/// forward by the time since [`FIXTURES_WRITTEN`]: fresh facts stay fresh (within
/// `max_age`) and stale ones stale, whatever day the tests run.
pub fn copy_facts_as_of_now(from: &Path, to: &Path) {
    let written = puppet_kicker::time::parse_timestamp(FIXTURES_WRITTEN).unwrap();
    let shift = puppet_kicker::time::now() - written;
    // The one form the fixtures' timestamps take: puppetserver's, as the synthetic
    // fleet writes it.
    let stamp = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.(\d{9})\+00:00").unwrap();
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        let moved = match String::from_utf8(bytes) {
            Ok(text) => stamp
                .replace_all(&text, |c: &regex::Captures<'_>| {
                    let at = puppet_kicker::time::parse_timestamp(&c[0]).unwrap();
                    puppet_kicker::synthetic::rfc3339(at + shift, c[1].parse().unwrap())
                })
                .into_owned()
                .into_bytes(),
            Err(not_text) => not_text.into_bytes(),
        };
        std::fs::write(to.join(entry.file_name()), moved).unwrap();
    }
}

/// A transport that answers every runonce with "started" and remembers who was
/// kicked, in order.
#[derive(Clone, Default)]
pub struct Recorder(pub std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl puppet_kicker::kick::Transport for Recorder {
    fn runonce(&self, dispatch: &puppet_kicker::kick::Dispatch) -> puppet_kicker::kick::Outcome {
        self.0.lock().unwrap().push(dispatch.target.clone());
        puppet_kicker::kick::Outcome::Started
    }
}

impl Recorder {
    /// Who was kicked, sorted.
    pub fn kicked(&self) -> Vec<String> {
        let mut kicked = self.0.lock().unwrap().clone();
        kicked.sort();
        kicked
    }
}
