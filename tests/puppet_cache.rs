//! The puppet_cache source on files written by Puppet's own JSON and YAML termini.

mod support;

use puppet_kicker::source::puppet_cache;
use serde_json::json;
use std::path::PathBuf;

fn fixture(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/puppet_cache").join(dir)
}

#[test]
fn reads_puppetserver_json_and_legacy_yaml_caches() {
    let read = puppet_cache::load(&[fixture("server_data/facts"), fixture("yaml/facts")]).unwrap();
    let mut names: Vec<&str> = read.observations.iter().map(|o| o.certname.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "lb1.example.com",
            "lb1.example.com",
            "node0.example.com",
            "node1.example.com",
            "node2.example.com",
            "node3.example.com",
            "node9.staging.example.com",
            "node9.staging.example.com",
        ]
    );
    let from_yaml = read.observations.iter().rfind(|o| o.certname == "lb1.example.com").unwrap();
    let from_json = read.observations.iter().find(|o| o.certname == "lb1.example.com").unwrap();
    assert_eq!(read.facts_json(from_yaml), read.facts_json(from_json), "both formats carry the same facts");
    assert_eq!(from_yaml.facts, from_json.facts, "so the store holds them once");
    let facts = read.facts_json(from_json);
    assert_eq!(facts["os"]["release"]["full"], json!("12.5"));
    assert_eq!(facts["memory"]["system"]["total_bytes"], json!(2147483648u64));
    assert!(from_json.timestamp > 1_700_000_000, "timestamp parsed from the file, not defaulted");
    let node0 = read.observations.iter().find(|o| o.certname == "node0.example.com").unwrap();
    assert!(from_json.timestamp - node0.timestamp >= 29 * 86_400, "node0's facts are a month old");
}

#[test]
fn unparsable_files_are_skipped_with_a_warning_naming_them() {
    let read = puppet_cache::load(&[fixture("server_data/facts"), fixture("yaml/facts")]).unwrap();
    assert_eq!(read.warnings.len(), 2, "{:?}", read.warnings);
    assert!(read.warnings[0].contains("broken.example.com.json") && read.warnings[0].contains("invalid JSON"));
    assert!(read.warnings[1].contains("notfacts.example.com.yaml") && read.warnings[1].contains("expected a mapping"));
}

#[test]
fn a_missing_directory_is_fine_while_another_is_readable_but_not_when_none_is() {
    assert!(puppet_cache::load(&[fixture("nope"), fixture("yaml/facts")]).is_ok());
    let err = puppet_cache::load(&[fixture("nope"), fixture("also-nope")]).unwrap_err().to_string();
    assert!(err.contains("no fact cache directory could be read") && err.contains("nope (not found)"), "{err}");
}

/// Every file of `dirs` read both ways: straight into the store, and through a
/// serde_json tree as before the store. Same certname, timestamp and facts.
fn assert_both_paths_agree(dirs: &[PathBuf]) -> usize {
    use puppet_kicker::source::puppet_cache::{parse_fact_file, parse_fact_file_via_tree, Format};
    use puppet_kicker::store::Builder;
    let (mut new, mut old) = (Builder::new(), Builder::new());
    let mut compared = 0;
    for dir in dirs {
        for path in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
            if Format::of(&path) != Some(Format::Json) {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let decoded = parse_fact_file(&bytes, Format::Json, &path, 5, &mut new);
            let via_tree = parse_fact_file_via_tree(&bytes, &path, 5, &mut old);
            match (decoded, via_tree) {
                (Ok(a), Ok(b)) => {
                    assert_eq!((&a.certname, a.timestamp), (&b.certname, b.timestamp), "{}", path.display());
                    let facts = |builder: &Builder, id| builder.store().view(id).to_json();
                    assert_eq!(facts(&new, a.facts), facts(&old, b.facts), "{}", path.display());
                    compared += 1;
                }
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                (a, b) => panic!("{}: {a:?} but before {b:?}", path.display()),
            }
        }
    }
    compared
}

#[test]
fn json_decoded_into_the_store_reads_what_the_serde_json_trees_read() {
    assert_eq!(assert_both_paths_agree(&[fixture("server_data/facts")]), 6);
    let dir = std::env::temp_dir().join(format!("pk-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    puppet_kicker::synthetic::write_puppet_cache(&dir, &puppet_kicker::synthetic::fleet(200, 3, 1_764_000_000))
        .unwrap();
    assert_eq!(assert_both_paths_agree(std::slice::from_ref(&dir)), 200);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_reader_or_two_give_the_same_store_id_for_id_and_the_same_index() {
    use puppet_kicker::Index;
    use std::collections::BTreeMap;
    let dir = std::env::temp_dir().join(format!("pk-readers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nodes = puppet_kicker::synthetic::fleet(300, 5, 1_764_000_000);
    puppet_kicker::synthetic::write_puppet_cache(&dir, &nodes).unwrap();
    std::fs::write(dir.join("broken.example.com.json"), "{").unwrap();
    let dirs = [dir.clone(), fixture("server_data/facts")];
    let (one, two) =
        (puppet_cache::load_with_readers(&dirs, 1).unwrap(), puppet_cache::load_with_readers(&dirs, 2).unwrap());
    assert_eq!(one.builder.store(), two.builder.store());
    assert_eq!(one.observations, two.observations);
    assert_eq!(one.warnings, two.warnings);
    assert_eq!(one.warnings.len(), 2, "{:?}", one.warnings);

    // And the index is the one the serde_json trees gave.
    let seen = BTreeMap::new();
    let index = two.into_index(None, &seen, "role", 1_764_000_000);
    let before = Index::build(one.observations.iter().map(|o| one.node(o, None)).collect(), "role", 1_764_000_000);
    let servers = |i: &Index| i.servers().map(|s| s.to_node()).collect::<Vec<_>>();
    assert_eq!(servers(&index), servers(&before));
    assert_eq!(index.len(), 300 + 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_refresh_reads_only_the_files_that_changed_and_gives_what_a_full_read_gives() {
    use puppet_cache::Previous;
    use puppet_kicker::Index;
    use std::collections::BTreeMap;
    let dir = std::env::temp_dir().join(format!("pk-since-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let now = 1_764_000_000;
    let mut nodes = puppet_kicker::synthetic::fleet(200, 9, now);
    puppet_kicker::synthetic::write_puppet_cache(&dir, &nodes).unwrap();
    std::fs::write(dir.join("broken.example.com.json"), "{").unwrap();
    // Written an hour ago: a file modified in the last seconds is read every time.
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for entry in std::fs::read_dir(&dir).unwrap() {
        std::fs::File::options().write(true).open(entry.unwrap().path()).unwrap().set_modified(an_hour_ago).unwrap();
    }
    let dirs = [dir.clone()];
    let seen = BTreeMap::new();
    let servers = |i: &Index| i.servers().map(|s| s.to_node()).collect::<Vec<_>>();

    let (first, memo) = puppet_cache::load_since(&dirs, None).unwrap();
    assert_eq!((first.reused, first.observations.len(), first.warnings.len()), (0, 200, 1));
    let (index, tables) = first.into_index_and_tables(None, &seen, "role", now);

    // Nothing changed: nothing is read, the bad file is still reported.
    let previous = Previous { index: &index, tables, memo };
    let (again, memo) = puppet_cache::load_since(&dirs, Some(previous)).unwrap();
    assert_eq!((again.reused, again.warnings.len()), (201, 1), "{:?}", again.warnings);
    let (same, tables) = again.into_index_and_tables(None, &seen, "role", now);
    assert_eq!(servers(&same), servers(&index));

    // Three servers rewritten (one with a new role), one removed, one added.
    for node in nodes.iter_mut().take(3) {
        node.facts.insert("role".into(), serde_json::json!("rewritten"));
        node.timestamp += 60;
    }
    let removed = nodes.remove(10);
    std::fs::remove_file(dir.join(format!("{}.json", removed.certname))).unwrap();
    let mut added = puppet_kicker::synthetic::fleet(1, 10, now).remove(0);
    added.certname = "added.example.com".into();
    added.facts.insert("fqdn".into(), serde_json::json!("added.example.com"));
    nodes.push(added);
    let mut changed = nodes[..3].to_vec();
    changed.push(nodes.last().unwrap().clone());
    puppet_kicker::synthetic::write_puppet_cache(&dir, &changed).unwrap();

    let previous = Previous { index: &same, tables, memo };
    let (incremental, _) = puppet_cache::load_since(&dirs, Some(previous)).unwrap();
    assert_eq!(incremental.reused, 200 - 3 - 1 + 1, "only the four written files are read");
    let incremental = incremental.into_index(None, &seen, "role", now);
    let full = puppet_cache::load(&dirs).unwrap().into_index(None, &seen, "role", now);
    assert_eq!(servers(&incremental), servers(&full));
    assert_eq!(incremental.len(), 200);
    assert!(incremental.by_certname(&removed.certname).is_none());
    let rewritten = incremental.by_certname(&nodes[0].certname).unwrap();
    assert_eq!(rewritten.role("role"), Some("rewritten"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_store_is_read_whole_again_once_changed_servers_doubled_it() {
    use puppet_cache::{Previous, GARBAGE_FACTOR};
    use std::collections::BTreeMap;
    let dir = std::env::temp_dir().join(format!("pk-garbage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let now = 1_764_000_000;
    let mut nodes = puppet_kicker::synthetic::fleet(20, 4, now);
    puppet_kicker::synthetic::write_puppet_cache(&dir, &nodes).unwrap();
    let dirs = [dir.clone()];
    let seen = BTreeMap::new();
    let (read, mut memo) = puppet_cache::load_since(&dirs, None).unwrap();
    let mut last_full = read.builder.store().values();
    let (mut index, mut tables) = read.into_index_and_tables(None, &seen, "role", now);
    let mut full_reads = 0;
    for round in 0..40 {
        // Every server changes every round: each leaves its old values behind.
        for node in nodes.iter_mut() {
            node.facts.insert("uptime_seconds".into(), serde_json::json!(1000 + round));
            let noise: Vec<String> = (0..50).map(|i| format!("{}-{round}-{i}", node.certname)).collect();
            node.facts.insert("round".into(), serde_json::json!({"n": round, "noise": noise}));
        }
        puppet_kicker::synthetic::write_puppet_cache(&dir, &nodes).unwrap();
        let before = index.store().values();
        let previous = Previous { index: &index, tables, memo };
        let (read, next_memo) = puppet_cache::load_since(&dirs, Some(previous)).unwrap();
        assert_eq!(read.reused, 0);
        let after = read.builder.store().values();
        if before > GARBAGE_FACTOR * last_full {
            assert!(after < before, "round {round}: a store over {GARBAGE_FACTOR}x is read whole again");
            (full_reads, last_full) = (full_reads + 1, after);
        } else {
            assert!(after >= before, "round {round}: below it, the store goes on from the last one");
        }
        (index, tables) = read.into_index_and_tables(None, &seen, "role", now);
        memo = next_memo;
    }
    assert!(full_reads >= 2, "{full_reads} full reads in 40 rounds");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What an index answers: every server in order, every certname looked up, each
/// environment's roles by name and by pattern, and queries through the role map
/// and the path indexes.
fn everything_answered(index: &puppet_kicker::Index) -> Vec<String> {
    use puppet_kicker::{Freshness, Query, RoleSelector};
    let fresh = Freshness { now: 1_764_000_000, max_age: i64::MAX as u64 };
    let mut answers: Vec<String> = index.servers().map(|s| format!("{:?}", s.to_node())).collect();
    let mut environments: Vec<&str> = index.servers().map(|s| s.environment()).collect();
    let mut roles: Vec<&str> = index.servers().flat_map(|s| s.roles("role")).collect();
    environments.sort();
    environments.dedup();
    roles.sort();
    roles.dedup();
    for server in index.servers() {
        answers.push(format!("{:?}", index.by_certname(server.certname()).map(|s| s.position())));
    }
    answers.push(format!("{:?}", index.by_certname("nobody.example.com").map(|s| s.position())));
    for environment in environments {
        let all = RoleSelector::parse(&["/./"]).unwrap();
        answers.push(format!("{environment} all roles {:?}", index.with_role(&all, environment, fresh)));
        for role in &roles {
            let one = RoleSelector::names([*role]);
            answers.push(format!("{environment} {role} {:?}", index.with_role(&one, environment, fresh)));
            let query = Query::parse(&[format!("role={role}")]).unwrap();
            answers.push(format!("{environment} {role} {:?}", index.with_facts(&query, environment, fresh)));
        }
        let query = Query::parse(&["processors.count>=4"]).unwrap();
        answers.push(format!("{environment} {:?}", index.with_facts(&query, environment, fresh)));
    }
    answers
}

/// Two indexes' answers the same, else the first that differs (a server is long).
fn assert_same_answers(got: &[String], expected: &[String], what: &str) {
    let first = got.iter().zip(expected).position(|(a, b)| a != b);
    let cut = |s: Option<&String>| s.map(|s| s.chars().take(400).collect::<String>());
    if let Some(at) = first.or((got.len() != expected.len()).then(|| got.len().min(expected.len()))) {
        panic!("{what}: answer {at} is {:?}, expected {:?}", cut(got.get(at)), cut(expected.get(at)));
    }
}

#[test]
fn refreshes_going_on_from_the_last_index_serve_what_a_full_read_does_and_leave_the_old_index_unchanged() {
    use puppet_cache::Previous;
    use puppet_kicker::facts::Node;
    use serde_json::json;
    use std::collections::BTreeMap;
    let dir = std::env::temp_dir().join(format!("pk-shared-{}", std::process::id()));
    let (main, other) = (dir.join("main"), dir.join("other"));
    let _ = std::fs::remove_dir_all(&dir);
    let now = 1_764_000_000;
    let mut nodes = puppet_kicker::synthetic::fleet(120, 11, now);
    // Servers whose facts name no environment: where the master saw them decides.
    for node in &mut nodes[20..30] {
        node.facts.remove("environment");
        node.facts.remove("agent_specified_environment");
    }
    puppet_kicker::synthetic::write_puppet_cache(&main, &nodes).unwrap();
    // Duplicates of certnames in a second directory: the newest facts win.
    let mut duplicates: Vec<Node> = nodes[40..44].to_vec();
    for (k, node) in duplicates.iter_mut().enumerate() {
        node.timestamp += if k % 2 == 0 { 30 } else { -30 };
        node.facts.insert("role".into(), json!(format!("duplicate{k}")));
    }
    puppet_kicker::synthetic::write_puppet_cache(&other, &duplicates).unwrap();
    // Dated in the past, each write later than the last: within the last seconds a
    // file's stamp is not trusted.
    let date = |dir: &std::path::Path, nodes: &[Node], minutes: u64| {
        let then = std::time::SystemTime::now() - std::time::Duration::from_secs(3600 - 60 * minutes);
        for node in nodes {
            let path = dir.join(format!("{}.json", node.certname));
            std::fs::File::options().write(true).open(path).unwrap().set_modified(then).unwrap();
        }
    };
    date(&main, &nodes, 0);
    date(&other, &duplicates, 0);
    let dirs = [main.clone(), other.clone()];
    let mut seen = BTreeMap::new();
    let (read, mut memo) = puppet_cache::load_since(&dirs, None).unwrap();
    let (mut index, mut tables) = read.into_index_and_tables(None, &seen, "role", now);
    let mut kept = Vec::new();
    for round in 0..8 {
        // Rewritten (a new role, a new fqdn), removed and added servers.
        nodes[round].facts.insert("uptime_seconds".into(), json!(round * 1000));
        nodes[round + 50].facts.insert("role".into(), json!(format!("role{round}")));
        nodes[round + 60].facts.insert("fqdn".into(), json!(format!("{round}.moved.example.com")));
        let removed = nodes.remove(100);
        std::fs::remove_file(main.join(format!("{}.json", removed.certname))).unwrap();
        let mut added = nodes[7].clone();
        added.certname = format!("added{round}.example.com");
        added.facts.insert("fqdn".into(), json!(added.certname));
        nodes.push(added);
        let mut changed = vec![nodes[round].clone(), nodes[round + 50].clone(), nodes[round + 60].clone()];
        changed.push(nodes.last().unwrap().clone());
        // A file renamed, its content unchanged (the certname is inside).
        let renamed = &nodes[80 + round].certname;
        std::fs::rename(main.join(format!("{renamed}.json")), main.join(format!("renamed-{renamed}.json"))).unwrap();
        puppet_kicker::synthetic::write_puppet_cache(&main, &changed).unwrap();
        date(&main, &changed, round as u64 + 1);
        // The master saw some servers compile elsewhere (their facts name none, or do).
        seen.insert(nodes[20 + round].certname.clone(), format!("seen{round}"));
        seen.insert(nodes[30 + round].certname.clone(), format!("seen{round}"));
        if round % 3 == 2 {
            seen.remove(&nodes[20 + round - 1].certname);
        }
        // A duplicate turns newer, then goes.
        match round {
            1 => {
                duplicates[1].timestamp += 120;
                puppet_kicker::synthetic::write_puppet_cache(&other, &duplicates[1..2]).unwrap();
                date(&other, &duplicates[1..2], round as u64 + 1);
            }
            3 => std::fs::remove_file(other.join(format!("{}.json", duplicates[0].certname))).unwrap(),
            _ => {}
        }

        let expected_before = everything_answered(&index);
        let previous = Previous { index: &index, tables, memo };
        let (read, next_memo) = puppet_cache::load_since(&dirs, Some(previous)).unwrap();
        let changes = read.changes.as_ref().expect("the refresh goes on from the last one");
        assert_eq!(changes.since, index.generation(), "round {round}");
        let (next, next_tables) = read.into_index_and_tables(Some(&index), &seen, "role", now);
        let full = puppet_cache::load(&dirs).unwrap().into_index(None, &seen, "role", now);
        assert_same_answers(&everything_answered(&next), &everything_answered(&full), &format!("round {round}"));
        let unchanged = format!("round {round}: the index it went on from is unchanged");
        assert_same_answers(&everything_answered(&index), &expected_before, &unchanged);
        kept.push((expected_before, index));
        (index, tables, memo) = (next, next_tables, next_memo);
    }
    let environments: Vec<&str> =
        (20..28).map(|p| index.by_certname(&nodes[p].certname).unwrap().environment()).collect();
    assert!(environments.iter().any(|e| e.starts_with("seen")), "{environments:?}");
    assert!(index.servers().any(|s| s.role("role") == Some("duplicate1")), "the duplicate made newer won");
    for (expected, old) in &kept {
        assert_same_answers(&everything_answered(old), expected, "every older index still serves what it did");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every file read with the JSON fast path where it takes the file, and with
/// serde_json alone: the same outcome for each file and, file after file into one
/// builder, the same store id for id (what the fast path interns before it
/// declines is what serde_json interns first).
fn assert_fast_path_keeps_the_store(files: &[(PathBuf, Vec<u8>)]) -> (usize, usize) {
    use puppet_kicker::source::puppet_cache::Format;
    use puppet_kicker::source::puppet_cache::{json_fast_path_takes, parse_fact_file, parse_json_fact_file_with_serde};
    use puppet_kicker::store::Builder;
    let (mut fast, mut serde) = (Builder::new(), Builder::new());
    let (mut taken, mut declined) = (0, 0);
    for (path, bytes) in files {
        let a = parse_fact_file(bytes, Format::Json, path, 5, &mut fast);
        let b = parse_json_fact_file_with_serde(bytes, path, 5, &mut serde);
        match (&a, &b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{}", path.display()),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{}", path.display()),
            _ => panic!("{}: {a:?} but serde_json alone {b:?}", path.display()),
        }
        // Taken means read whole; the document may still be refused (no `values`).
        if json_fast_path_takes(bytes) {
            taken += 1;
        } else {
            declined += 1;
        }
    }
    assert_eq!(fast.store(), serde.store());
    (taken, declined)
}

#[test]
fn the_json_fast_path_gives_the_store_serde_json_gives_id_for_id() {
    let dir = std::env::temp_dir().join(format!("pk-fast-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    puppet_kicker::synthetic::write_puppet_cache(&dir, &puppet_kicker::synthetic::fleet(200, 11, 1_764_000_000))
        .unwrap();
    let mut files = Vec::new();
    for dir in [dir.clone(), fixture("server_data/facts")] {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        paths.sort();
        files.extend(paths.into_iter().map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        }));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // The synthetic fleet (with Facter's escaped newlines) and Puppet's own files are taken.
    let (taken, declined) = assert_fast_path_keeps_the_store(&files);
    assert_eq!((taken, declined), (200 + 6, 1), "all but the broken fixture");

    // Mutated: bytes and escapes that change what is taken, refused or read.
    let mut rng = support::Lcg(0x15_0b);
    let pieces: [&[u8]; 16] = [
        b"\\",
        b"\\u",
        b"\\ud83d",
        b"\\ude00",
        b"\"",
        b"-0",
        b"1e400",
        b"0.5",
        b"01",
        b"\x01",
        b"\xff",
        b"[",
        b"{",
        b",",
        b"12345678901234567890",
        b"\\n",
    ];
    let mut mutated = Vec::new();
    for i in 0..3000 {
        let (path, bytes) = &files[rng.below(files.len())];
        let mut bytes = bytes.clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(bytes.len() + 1);
            match rng.below(3) {
                0 => bytes.splice(at..at, pieces[rng.below(pieces.len())].iter().copied()).for_each(drop),
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => bytes.truncate(at.max(bytes.len() * 9 / 10)),
            }
        }
        mutated.push((path.with_file_name(format!("m{i}.json")), bytes));
    }
    let (taken, declined) = assert_fast_path_keeps_the_store(&mutated);
    assert!(taken > 300 && declined > 300, "both ways exercised: {taken} taken, {declined} declined");
}
