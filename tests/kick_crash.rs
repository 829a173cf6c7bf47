//! A process killed (SIGKILL) at any point of a kick's life: between saving the kick,
//! sending `runonce` and recording the outcome. The next process on the same cache
//! directory delivers it: at least once in all, at most once more.
//!
//! The test re-executes its own binary as the process to kill; the child runs a
//! `KickService` whose transport appends each `runonce` to a file, and stops dead
//! (sleeps) at the chosen point after leaving a marker for the parent.

#![cfg(unix)]

mod support;

use puppet_kicker::kick::{Dispatch, KickConfig, KickService, Outcome, Selector, Target, Transport};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "PK_KICK_CRASH_CHILD";
const TEST_NAME: &str = "a_kick_is_delivered_at_most_once_more_after_a_sigkill_at_any_point";

/// Where the child stops and waits to be killed.
const POINTS: &[&str] = &["saved", "claimed", "sent", "recorded"];

fn config() -> KickConfig {
    KickConfig { coalesce_ms: 0, in_flight_timeout_ms: 1_000, ..KickConfig::default() }
}

/// Appends each runonce to `deliveries`, durably, as the server would run it.
struct FileTransport {
    dir: PathBuf,
    stop_at: Option<String>,
}

impl FileTransport {
    fn stop_if(&self, point: &str) {
        stop_if(&self.dir, self.stop_at.as_deref(), point);
    }
}

impl Transport for FileTransport {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        self.stop_if("claimed");
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("deliveries")).unwrap();
        writeln!(file, "{}", dispatch.target).unwrap();
        file.sync_all().unwrap();
        self.stop_if("sent");
        Outcome::Started
    }
}

/// At `point`, tells the parent (a marker file) and waits for SIGKILL.
fn stop_if(dir: &Path, stop_at: Option<&str>, point: &str) {
    if stop_at == Some(point) {
        std::fs::write(dir.join("stopped"), point).unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

fn start(dir: &Path, stop_at: Option<&str>) -> KickService {
    let transport = FileTransport { dir: dir.to_path_buf(), stop_at: stop_at.map(str::to_string) };
    let (marker_dir, stop) = (dir.to_path_buf(), stop_at.map(str::to_string));
    let before_dispatch = Box::new(move || stop_if(&marker_dir, stop.as_deref(), "saved"));
    KickService::start(config(), dir, Ok(Box::new(transport)), before_dispatch).unwrap()
}

fn deliveries(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("deliveries")).unwrap_or_default().lines().map(str::to_string).collect()
}

/// The child: node1's report kicks lb1, then the process stops at `point`.
fn child(point: &str, dir: &Path) -> ! {
    let service = start(dir, Some(point));
    let report = support::role_kick("node1", "Kick[lb]", "haproxy");
    let lb1 = |_: &Selector, _: &str| vec![Target { certname: "lb1".into(), role: Some("haproxy".into()) }];
    service.report(&report, lb1, |_: &str| Some("node".into()));
    service.flush(Duration::from_secs(20));
    stop_if(dir, Some(point), "recorded");
    unreachable!("the child stops at {point}");
}

#[test]
fn a_kick_is_delivered_at_most_once_more_after_a_sigkill_at_any_point() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (point, dir) = spec.split_once(' ').unwrap();
        child(point, Path::new(dir));
    }
    for point in POINTS {
        let dir = support::scratch_path(&format!("kick-crash-{point}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, format!("{point} {}", dir.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let waited = Instant::now();
        while !dir.join("stopped").exists() {
            assert!(process.try_wait().unwrap().is_none(), "{point}: the child exited before stopping");
            assert!(waited.elapsed() < Duration::from_secs(60), "{point}: the child never got there");
            std::thread::sleep(Duration::from_millis(20));
        }
        process.kill().unwrap(); // SIGKILL
        process.wait().unwrap();
        let before = deliveries(&dir).len();

        let next = start(&dir, None);
        assert_eq!(next.flush(Duration::from_secs(20)), 0, "{point}: delivered by the next process");
        let after = deliveries(&dir);
        assert!(after.iter().all(|t| t == "lb1"), "{point}: {after:?}");
        assert!((1..=2).contains(&after.len()), "{point}: delivered {} times", after.len());
        match *point {
            "sent" => assert_eq!((before, after.len()), (1, 2), "sent, outcome lost: sent once more"),
            "recorded" => assert_eq!((before, after.len()), (1, 1), "recorded: not again"),
            _ => assert_eq!((before, after.len()), (0, 1), "{point}: never sent, so sent once"),
        }
        let status = next.status();
        assert_eq!(status["recent_outcomes"].as_array().unwrap().last().unwrap()["result"], "started", "{point}");
        assert_eq!(status["pending"], serde_json::json!([]), "{point}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
