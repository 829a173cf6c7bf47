//! YAML decoded straight into the store (`yaml::decode`, the fact cache's path)
//! against the tree it replaced (`yaml::parse`, then `Builder::value`): the same
//! values, ids and facts per server, and the same errors, on the fixtures, on a
//! generated fleet and on hostile documents.

use puppet_kicker::source::puppet_cache::{self, parse_fact_file, parse_yaml_fact_file_via_tree, Format};
use puppet_kicker::store::Builder;
use puppet_kicker::synthetic;
use puppet_kicker::yaml::{self, MAX_ALIASES, MAX_DEPTH};
use std::path::{Path, PathBuf};

/// Both paths on `text`: both refuse it with the same error, or give the same
/// value, which interns to the same id in one builder.
fn same_document(text: &str) {
    let mut builder = Builder::new();
    let mark = builder.open();
    let decoded = yaml::decode(text, &mut builder);
    match (yaml::parse(text), decoded) {
        (Ok(tree), Ok(id)) => {
            assert_eq!(builder.store().view(id).to_json(), tree, "{text:?}");
            assert_eq!(builder.value(&tree), id, "{text:?}");
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "{text:?}");
            assert_eq!(a.to_string(), b.to_string());
            builder.discard_open(mark);
            assert_eq!(builder.open(), mark);
        }
        (a, b) => panic!("{text:?}: the tree gives {a:?}, the store {b:?}"),
    }
}

/// Both paths on one fact file: the same error (naming the file), or the same
/// server, date and facts.
fn same_fact_file(bytes: &[u8], path: &Path) {
    let (mut new, mut old) = (Builder::new(), Builder::new());
    let decoded = parse_fact_file(bytes, Format::Yaml, path, 7, &mut new);
    let reference = parse_yaml_fact_file_via_tree(bytes, path, 7, &mut old);
    match (decoded, reference) {
        (Ok(a), Ok(b)) => {
            assert_eq!((&a.certname, a.timestamp), (&b.certname, b.timestamp), "{}", path.display());
            assert_eq!(new.store().view(a.facts).to_json(), old.store().view(b.facts).to_json(), "{}", path.display());
            assert_eq!(new.value(&old.store().view(b.facts).to_json()), a.facts);
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{}", path.display()),
        (a, b) => panic!("{}: the store gives {a:?}, the tree {b:?}", path.display()),
    }
}

#[test]
fn fixtures_read_the_same() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/puppet_cache/yaml/facts");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if Format::of(&path) == Some(Format::Yaml) {
            let bytes = std::fs::read(&path).unwrap();
            same_fact_file(&bytes, &path);
            same_document(std::str::from_utf8(&bytes).unwrap());
            seen += 1;
        }
    }
    assert!(seen >= 3, "{seen} fixtures");
    // And through the source: the same servers and facts as the JSON-era reference.
    let read = puppet_cache::load(&[dir]).unwrap();
    assert!(!read.observations.is_empty());
}

#[test]
fn a_generated_fleet_reads_the_same_server_by_server() {
    for node in synthetic::fleet(300, 0x5EED, 1_790_000_000) {
        let text = synthetic::yaml_fact_file(&node);
        same_fact_file(text.as_bytes(), &PathBuf::from(format!("/facts/{}.yaml", node.certname)));
    }
}

#[test]
fn scalars_keys_tags_aliases_and_duplicates_read_the_same() {
    for text in [
        "",
        "~",
        "--- 1\n--- [x\n",
        "a: ~\nb: 0x10\nc: '7'\nd: .inf\n1.50: x\n~: y\ne: !!str 3\nf: []\ng: 1e400\nh: -0.0\ni: 0o17\n",
        "a: !!int x\nb: !!bool yes\nc: !!null ''\nd: !!float 2\ne: !ruby/sym x\nf: !!bool True\ng: !!int 12\n",
        "true: 1\nfalse: 2\n12: 3\n-3: 4\nnull: 5\n'null': 6\n2.50: 7\n",
        "b: 1\na: 2\nb: 3\nc: {k: 1, k: 2}\n",
        "ip: &1 10.0.0.5\nnetworking:\n  ip: *1\n  interfaces: &2\n    eth0: {ip: *1}\ncopy: *2\n*1 : key\n",
        "&k 1.50: anchored key\n&n ~: null key\n? [1, {a: 2}]\n: collection key\n? {b: [x]}\n: map key\n*k : again\n",
        "? &l [1, 2]\n: v\nw: *l\n? *l\n: last\n",
        "a: &a [*a]\n",
        "a: *nowhere\n",
        "a: [1\n",
        "--- !ruby/object:Puppet::Node::Facts\nname: n\nvalues:\n  x: &x {y: [1, 2.5, 'z', true]}\n  w: *x\n",
        "- &a [x]\n- *a\n- [*a, *a]\n",
        "a: &a x\na: *a\na: &a y\nb: *a\n",
    ] {
        same_document(text);
        same_fact_file(text.as_bytes(), Path::new("/facts/odd.example.com.yaml"));
    }
}

#[test]
fn hostile_documents_are_refused_the_same() {
    let nested = |depth: usize| {
        (0..depth).map(|level| format!("{}-\n", " ".repeat(level))).collect::<String>()
            + &format!("{}x\n", " ".repeat(depth))
    };
    let flow = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let mut bomb = String::from("a0: &a0 [x,x,x,x,x,x,x,x,x,x]\n");
    for i in 1..9 {
        bomb += &format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(","));
    }
    let aliases = |n: usize| format!("a: &a x\nb: [{}]\n", vec!["*a"; n].join(","));
    let repeats = |n: usize| format!("a: &a [{}]\nb: [{}]\n", vec!["1"; 999].join(","), vec!["*a"; n].join(","));
    let text = |n: usize| format!("a: &a {}\nb: [{}]\n", "x".repeat(1 << 20), vec!["*a"; n].join(","));
    let list = |n: usize| format!("a: [{}]\n", vec!["1"; n].join(","));
    for text in [
        nested(MAX_DEPTH),
        nested(MAX_DEPTH + 1),
        flow(MAX_DEPTH),
        flow(MAX_DEPTH + 1),
        flow(300),
        format!("- &a {}\n- *a\n", flow(MAX_DEPTH - 1)),
        format!("- &a {}\n- [*a]\n", flow(MAX_DEPTH - 1)),
        format!("values:\n  deep: {}\n", flow(MAX_DEPTH)),
        bomb,
        aliases(MAX_ALIASES),
        aliases(MAX_ALIASES + 1),
        repeats(100),
        repeats(101),
        text(61),
        text(62),
        list(1_000_000 - 3),
        list(1_000_000 - 2),
    ] {
        same_document(&text);
        same_fact_file(text.as_bytes(), Path::new("/facts/hostile.example.com.yaml"));
    }
}

#[test]
fn a_refused_file_leaves_the_builder_fit_for_the_next() {
    let mut builder = Builder::new();
    let path = Path::new("/facts/a.example.com.yaml");
    assert!(parse_fact_file(b"values:\n  a: [1, {b: [2, 3\n", Format::Yaml, path, 0, &mut builder).is_err());
    assert_eq!(builder.open(), 0);
    let o = parse_fact_file(b"values:\n  c: [4]\n", Format::Yaml, path, 0, &mut builder).unwrap();
    assert_eq!(builder.store().view(o.facts).to_json(), serde_json::json!({"c": [4]}));
}
