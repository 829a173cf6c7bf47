//! Files on disk built to crash, hang or exhaust the master: YAML bombs, deep
//! nesting, oversized files. Anything that could kill the process runs in a child
//! process (this test binary, re-run on one test), so a crash fails one test
//! instead of ending the run.

use puppet_kicker::yaml;
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "PK_HOSTILE_FILES_CHILD";

/// Runs `body` in a child process running only the test `name`; fails when the
/// child crashes, fails or is still running after 60 seconds.
fn isolated(name: &str, body: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{name}: still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{name}: child ended with {status}\n{stderr}");
}

/// `a: &a [x, x, ...]`, then each level a list of `fan_out` aliases of the one before.
fn alias_bomb(levels: usize, fan_out: usize) -> String {
    let mut text = format!("l0: &l0 [{}]\n", vec!["x"; fan_out].join(", "));
    for level in 1..levels {
        let refs = vec![format!("*l{}", level - 1); fan_out].join(", ");
        text.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
    }
    text
}

#[test]
fn an_alias_bomb_is_refused_quickly_not_expanded() {
    isolated("an_alias_bomb_is_refused_quickly_not_expanded", || {
        // 10^7 values from a few hundred bytes.
        let bomb = alias_bomb(7, 10);
        assert!(bomb.len() < 400, "{}", bomb.len());
        let started = Instant::now();
        let err = yaml::parse(&bomb).unwrap_err();
        assert!(err.contains("values"), "{err}");
        // Expanding it took minutes; refusing it takes a few hundred milliseconds (debug build).
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    });
}

#[test]
fn deep_block_nesting_is_refused_not_a_stack_overflow() {
    isolated("deep_block_nesting_is_refused_not_a_stack_overflow", || {
        // A fact file 10,000 levels deep: `a:\n  a:\n    a: ...`, and the same with lists.
        let mut mappings = String::new();
        let mut lists = String::new();
        for level in 0..10_000 {
            mappings.push_str(&format!("{}a:\n", " ".repeat(level)));
            lists.push_str(&format!("{}-\n", " ".repeat(level)));
        }
        for text in [mappings, lists] {
            let err = yaml::parse(&text).unwrap_err();
            assert!(err.contains("nested deeper than 64"), "{err}");
        }
    });
}

#[test]
fn deep_flow_nesting_is_refused_not_a_stack_overflow() {
    isolated("deep_flow_nesting_is_refused_not_a_stack_overflow", || {
        for text in [format!("a: {}", "[".repeat(100_000)), format!("a: {}", "{a: ".repeat(100_000))] {
            let err = yaml::parse(&text).unwrap_err();
            assert!(err.contains("nested deeper than 64"), "{err}");
        }
    });
}
