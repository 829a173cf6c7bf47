//! The core's top-level modules import each other as a stack: no module reaches,
//! through any chain of `crate::` paths, back to itself (ARCHITECTURE.md lists the
//! stack). The crate's error type is left out: it wraps the modules' own errors,
//! and every module returns it. Tests (`tests.rs`, `mod tests`) are left out too.

use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules whose incoming edges do not count.
const WRAPPERS: [&str; 1] = ["error"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
}

/// Each top-level module's imports of the others, from the `crate::` paths of its files.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let path_re = Regex::new(r"crate::((?:[a-z_][a-z0-9_]*::?)+)").unwrap();
    let tests_re = Regex::new(r"#\[cfg\(test\)\]\s*mod tests").unwrap();
    let is_module = |name: &str| src.join(name).is_dir() || src.join(format!("{name}.rs")).is_file();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_str().unwrap();
        let module = first.trim_end_matches(".rs");
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = tests_re.split(&text).next().unwrap_or_default();
        for hit in path_re.captures_iter(code) {
            let target = hit[1].split("::").next().unwrap();
            if target != module && is_module(target) && !WRAPPERS.contains(&target) {
                edges.entry(module.to_string()).or_default().insert(target.to_string());
            }
        }
    }
    edges
}

/// A cycle through `from`, as the modules on it, if there is one.
fn cycle_from(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((module, path)) = stack.pop() {
        for next in edges.get(&module).into_iter().flatten() {
            if next == from {
                return Some([path.clone(), vec![from.to_string()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

#[test]
fn the_top_level_modules_import_each_other_as_a_stack() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = imports(&src);
    assert!(edges.get("api").is_some_and(|a| a.contains("service")), "the scan finds imports: {edges:?}");
    let cycles: Vec<String> =
        edges.keys().filter_map(|module| cycle_from(&edges, module)).map(|cycle| cycle.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles among src/'s modules:\n{}", cycles.join("\n"));
}

#[test]
fn a_cycle_is_found() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ("d".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(cycle_from(&edges, "a"), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    assert_eq!(cycle_from(&edges, "d"), None);
}
