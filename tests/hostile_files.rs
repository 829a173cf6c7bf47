//! Files on disk built to crash, hang or exhaust the master: YAML bombs, deep
//! nesting, oversized files. Anything that could kill the process runs in a child
//! process (this test binary, re-run on one test), so a crash fails one test
//! instead of ending the run.

use puppet_kicker::yaml;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

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
        let err = yaml::parse(&bomb).unwrap_err().to_string();
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
            let err = yaml::parse(&text).unwrap_err().to_string();
            assert!(err.contains("nested deeper than 64"), "{err}");
        }
    });
}

#[test]
fn deep_flow_nesting_is_refused_not_a_stack_overflow() {
    isolated("deep_flow_nesting_is_refused_not_a_stack_overflow", || {
        for text in [format!("a: {}", "[".repeat(100_000)), format!("a: {}", "{a: ".repeat(100_000))] {
            let err = yaml::parse(&text).unwrap_err().to_string();
            assert!(err.contains("nested deeper than 64"), "{err}");
        }
    });
}

/// A scratch directory for the test, removed when it ends.
fn tempdir(name: &str) -> support::ScratchDir {
    support::ScratchDir::new(&format!("pk-hostile-{name}"))
}

/// A msgpack string.
fn mp_str(out: &mut Vec<u8>, s: &str) {
    out.push(0xa0 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

#[test]
fn a_deeply_nested_snapshot_is_refused_not_a_stack_overflow() {
    isolated("a_deeply_nested_snapshot_is_refused_not_a_stack_overflow", || {
        let dir = tempdir("deep-snapshot");
        let path = puppet_kicker::snapshot::path_in(&dir);
        // [built_at, [[certname, environment, {"a": [[[[...100,000 levels]]]]}]], {}]
        let mut payload = b"PKINDEX\0".to_vec();
        payload.extend_from_slice(&puppet_kicker::snapshot::FORMAT_VERSION.to_le_bytes());
        payload.extend_from_slice(&[0x93, 0x01, 0x91, 0x93]);
        mp_str(&mut payload, "web1");
        mp_str(&mut payload, "production");
        payload.push(0x81);
        mp_str(&mut payload, "a");
        payload.extend(std::iter::repeat_n(0x91, 100_000));
        payload.push(0xc0);
        std::fs::write(&path, &payload).unwrap();
        // A puppetserver thread's stack, not the main thread's 8 MiB.
        let read = std::thread::Builder::new()
            .stack_size(512 << 10)
            .spawn(move || puppet_kicker::snapshot::read(&path, "role"))
            .unwrap()
            .join()
            .unwrap();
        let err = read.unwrap_err().to_string();
        // Format 2 is flat: the decoder refuses the nesting where a blob belongs,
        // before descending into it.
        assert!(err.contains("ignoring corrupt snapshot"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn a_deeply_nested_config_file_is_a_configuration_error() {
    isolated("a_deeply_nested_config_file_is_a_configuration_error", || {
        let dir = tempdir("deep-config");
        let path = dir.join("puppet_kicker.yaml");
        // 60 KB: `cache:` then `- - - ... x`, 30,000 block sequences on one line.
        let text = format!("cache:\n{}x\n", "- ".repeat(30_000));
        std::fs::write(&path, text).unwrap();
        let settings = puppet_kicker::PuppetSettings { config_file: Some(path.clone()), ..Default::default() };
        let err = puppet_kicker::Config::load(&settings).unwrap_err().to_string();
        assert!(err.contains("puppet_kicker.yaml") && err.contains("nested deeper than 64"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn a_config_file_over_1_mib_is_a_configuration_error() {
    let dir = tempdir("big-config");
    let path = dir.join("puppet_kicker.yaml");
    let settings = puppet_kicker::PuppetSettings { config_file: Some(path.clone()), ..Default::default() };
    let line = "role_fact: pp_role\n";
    let limit = puppet_kicker::config::MAX_FILE_SIZE as usize;
    let at_limit = format!("{line}{}", "#".repeat(limit - line.len()));
    std::fs::write(&path, &at_limit).unwrap();
    assert_eq!(puppet_kicker::Config::load(&settings).unwrap().role_fact, "pp_role");
    std::fs::write(&path, at_limit + "\n").unwrap();
    let err = puppet_kicker::Config::load(&settings).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()) && err.contains("over the 1 MiB limit"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fact_files_over_16_mib_or_nested_too_deep_are_skipped_with_a_warning() {
    use puppet_kicker::source::puppet_cache;
    let dir = tempdir("big-facts");
    let facts = |name: &str| format!(r#"{{"name":"{name}","values":{{"role":"web"}}}}"#);
    let limit = puppet_cache::MAX_FILE_SIZE as usize;
    let padded = |text: String, len: usize| text.clone() + &" ".repeat(len - text.len());
    std::fs::write(dir.join("at.example.com.json"), padded(facts("at.example.com"), limit)).unwrap();
    std::fs::write(dir.join("over.example.com.json"), padded(facts("over.example.com"), limit + 1)).unwrap();
    let nested =
        |depth: usize| format!(r#"{{"name":"n","values":{{"a":{}{}}}}}"#, "[".repeat(depth), "]".repeat(depth));
    // The document and `values` are two levels: 62 more is 64 in all.
    std::fs::write(dir.join("n62.json"), nested(62)).unwrap();
    std::fs::write(dir.join("n63.json"), nested(63)).unwrap();
    std::fs::write(dir.join("n500.json"), nested(500)).unwrap();
    let read = puppet_cache::load(std::slice::from_ref(&dir)).unwrap();
    let names: Vec<_> = read.observations.iter().map(|o| o.certname.as_str()).collect();
    assert_eq!(names, ["at.example.com", "n"]);
    assert_eq!(read.warnings.len(), 3, "{:?}", read.warnings);
    let deep = &read.warnings[0];
    assert!(deep.contains("n500.json") && deep.contains("nested deeper than 64 levels"), "{deep}");
    assert!(read.warnings[1].contains("n63.json") && read.warnings[1].contains("nested deeper than 64 levels"));
    let over = &read.warnings[2];
    assert!(over.contains("over.example.com.json") && over.contains("over the 16 MiB limit"), "{over}");
    std::fs::remove_dir_all(&dir).unwrap();
}
