//! The C ABI as a foreign caller sees it: JSON requests in, owned JSON replies out,
//! errors as data, and the same answers from many threads at once while the index
//! is being refreshed under them (puppetserver's JRuby instances have no GVL).

use puppet_kicker_ffi::*;
use serde_json::{json, Value};
use std::ffi::{c_char, CStr};
use std::fs;
use std::path::PathBuf;
use std::sync::{Arc, Barrier, Mutex, MutexGuard};

/// The core is one per process: tests that configure it take turns.
static CORE: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    CORE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes ownership of a reply: reads it, frees it.
fn take(reply: *mut c_char) -> Value {
    assert!(!reply.is_null());
    let text = unsafe { CStr::from_ptr(reply) }.to_str().expect("replies are UTF-8").to_string();
    unsafe { pk_free(reply) };
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("reply is not JSON ({e}): {text}"))
}

fn call(f: unsafe extern "C" fn(*const u8, usize) -> *mut c_char, request: &Value) -> Value {
    let bytes = serde_json::to_vec(request).unwrap();
    take(unsafe { f(bytes.as_ptr(), bytes.len()) })
}

fn ok(reply: Value) -> Value {
    match reply {
        Value::Object(mut m) if m.contains_key("ok") => m.remove("ok").unwrap(),
        other => panic!("expected ok, got {other}"),
    }
}

fn error(reply: &Value) -> (String, String) {
    let e = &reply["error"];
    (e["kind"].as_str().unwrap_or_default().to_string(), e["message"].as_str().unwrap_or_default().to_string())
}

/// A scratch master with a JSON fact cache (puppetserver's layout) of `servers`.
struct Master {
    root: PathBuf,
}

impl Master {
    fn new(name: &str, config: &str, servers: &[(&str, Value)]) -> Master {
        let root = std::env::temp_dir().join(format!("pk-ffi-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let facts = root.join("var/server_data/facts");
        fs::create_dir_all(&facts).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        for (certname, values) in servers {
            let doc = json!({"name": certname, "values": values, "timestamp": "2024-05-01T10:00:00.000000000+00:00",
                             "expiration": "2024-05-01T10:30:00.000000000+00:00"});
            fs::write(facts.join(format!("{certname}.json")), doc.to_string()).unwrap();
        }
        // The fixtures' timestamps are fixed: keep them from going stale.
        fs::write(root.join("etc/puppet_kicker.yaml"), format!("max_age: 5200w\n{config}")).unwrap();
        Master { root }
    }

    fn configure(&self) -> Value {
        call(
            pk_configure,
            &json!({"confdir": self.root.join("etc"), "vardir": self.root.join("var"), "server_datadir": null}),
        )
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn fleet() -> Vec<(&'static str, Value)> {
    vec![
        (
            "web2.example.com",
            json!({"fqdn": "web2.example.com", "role": "web", "hostname": "web2", "ipaddress": "10.0.0.12"}),
        ),
        (
            "web1.example.com",
            json!({"fqdn": "web1.example.com", "role": "web", "hostname": "web1", "ipaddress": "10.0.0.11",
                   "uptime_days": 12, "load": 0.25, "big": 18446744073709551615u64, "neg": -3, "virtual": false,
                   "nothing": null, "os": {"family": "Debian", "release": {"full": "12.5", "major": "12"}},
                   "disks": [{"name": "sda", "size_bytes": 1e12}], "empty": {}, "none": [], "unicode": "é\u{2028}\u{0}ü"}),
        ),
        (
            "db1.example.com",
            json!({"fqdn": "db1.example.com", "role": "db", "hostname": "db1", "certname": "db1-from-fact"}),
        ),
        ("lb1.example.com", json!({"role": "haproxy", "hostname": "lb1", "environment": "staging"})),
    ]
}

/// A query's servers as the Ruby side fetches them, through pk_select, then
/// pk_servers_at (servers as name and value ids) and pk_values (the names and values
/// behind the ids): `{"ok": [server, ..]}` (the first server or null for
/// `server_with_role`), or pk_select's error. Selects again when the index was
/// replaced in between, as the Ruby side does.
fn query(request: &Value) -> Value {
    for _ in 0..100 {
        let selected = call(pk_select, request);
        let Some(at) = selected.get("ok") else { return selected };
        let generation = &at["generation"];
        let by_ids = ok(call(pk_servers_at, &json!({"generation": generation, "positions": at["positions"]})));
        let Some(servers) = by_ids.as_array() else { continue };
        let Some(servers) = built(generation, servers) else { continue };
        return match request["op"].as_str() {
            Some("server_with_role") => json!({"ok": servers.first().cloned().unwrap_or(Value::Null)}),
            _ => json!({"ok": servers}),
        };
    }
    panic!("the index kept changing while {request} was read")
}

/// Servers as pk_servers_at gives them, `[[[K, ..], [V, ..], certname], ..]`, built
/// into objects with what pk_values gives for their ids; None once the index is
/// replaced.
fn built(generation: &Value, servers: &[Value]) -> Option<Vec<Value>> {
    let ids = |list: &Value| list.as_array().unwrap().iter().map(|id| id.as_u64().unwrap()).collect::<Vec<_>>();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for server in servers {
        assert_eq!(ids(&server[0]).len(), ids(&server[1]).len());
        keys.extend(ids(&server[0]));
        values.extend(ids(&server[1]));
    }
    let fetched = ok(call(pk_values, &json!({"generation": generation, "values": values, "keys": keys})));
    if fetched.is_null() {
        return None;
    }
    let (mut names, mut items) = (fetched["keys"].as_array()?.iter(), fetched["values"].as_array()?.iter());
    let objects = servers.iter().map(|server| {
        let mut object = serde_json::Map::new();
        for _ in 0..ids(&server[0]).len() {
            object.insert(names.next().unwrap().as_str().unwrap().to_string(), items.next().unwrap().clone());
        }
        if let Some(certname) = server[2].as_str() {
            object.insert("certname".into(), certname.into());
        }
        Value::Object(object)
    });
    Some(objects.collect())
}

fn hostnames(servers: &Value) -> Vec<&str> {
    servers.as_array().unwrap().iter().map(|s| s["hostname"].as_str().unwrap()).collect()
}

#[test]
fn version_and_abi_need_no_configuration() {
    assert_eq!(pk_abi_version(), ABI_VERSION);
    let version = ok(take(pk_version()));
    assert!(version.as_str().unwrap().contains("index format"), "{version}");
    unsafe { pk_free(std::ptr::null_mut()) };
}

#[test]
fn queries_return_servers_as_the_magnus_extension_builds_them() {
    let _core = serial();
    let master = Master::new("queries", "", &fleet());
    assert_eq!(ok(master.configure()), Value::Null);

    let web = ok(query(&json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"})));
    assert_eq!(hostnames(&web), ["web1", "web2"]);
    // Every fact, in the core's order, then certname; values of every JSON type intact.
    let web1 = web[0].as_object().unwrap();
    assert_eq!(web1["certname"], "web1.example.com");
    let selected = ok(call(pk_select, &json!({"op":"servers_with_role","roles":["web"],"environment":"production"})));
    let request =
        serde_json::to_vec(&json!({"generation": selected["generation"], "positions": selected["positions"]})).unwrap();
    let raw = |function: unsafe extern "C" fn(*const u8, usize) -> *mut c_char, request: &[u8]| {
        let reply = unsafe { function(request.as_ptr(), request.len()) };
        let raw = unsafe { CStr::from_ptr(reply) }.to_str().unwrap().to_string();
        unsafe { pk_free(reply) };
        raw
    };
    // Servers by id: the first fact's name and value ids, ..., the certname to add.
    let by_ids = raw(pk_servers_at, &request);
    assert!(by_ids.starts_with(r#"{"ok":[[["#) && by_ids.contains(r#"],"web1.example.com"],[["#), "{by_ids}");
    let by_ids: Value = serde_json::from_str(&by_ids).unwrap();
    let (keys, values) = (&by_ids["ok"][0][0], &by_ids["ok"][0][1]);
    let request =
        json!({"generation": selected["generation"], "values": [values[0], values[1]], "keys": [keys[0], keys[1]]});
    let values = raw(pk_values, &serde_json::to_vec(&request).unwrap());
    assert_eq!(
        values,
        r#"{"ok":{"values":[18446744073709551615,[{"name":"sda","size_bytes":1000000000000.0}]],"keys":["big","disks"]}}"#
    );
    // Ids are of one generation: one the index does not have is as a replaced index.
    let beyond = json!({"generation": selected["generation"], "values": [1_000_000], "keys": []});
    assert_eq!(ok(call(pk_values, &beyond)), Value::Null);
    let beyond = json!({"generation": selected["generation"], "values": [], "keys": [1_000_000]});
    assert_eq!(ok(call(pk_values, &beyond)), Value::Null);
    let other = json!({"generation": selected["generation"].as_u64().unwrap() + 1000, "values": [0]});
    assert_eq!(ok(call(pk_values, &other)), Value::Null);
    assert_eq!(web1["big"], json!(18446744073709551615u64));
    assert_eq!(web1["neg"], json!(-3));
    assert_eq!(web1["load"], json!(0.25));
    assert_eq!(web1["disks"][0]["size_bytes"], json!(1e12));
    assert_eq!(web1["unicode"], "é\u{2028}\u{0}ü");
    assert_eq!(web1["nothing"], Value::Null);
    assert_eq!(web1["os"]["release"]["full"], "12.5");

    // A fact named certname wins over the certname.
    let db = ok(query(&json!({"op": "server_with_role", "roles": ["/^d/"], "environment": "production"})));
    assert_eq!(db["certname"], "db1-from-fact");
    let none = ok(query(&json!({"op": "server_with_role", "roles": ["nobody"], "environment": "production"})));
    assert_eq!(none, Value::Null);

    let big = ok(query(
        &json!({"op": "servers_with_facts", "clauses": ["uptime_days>10", "os.family=Debian"], "environment": "production"}),
    ));
    assert_eq!(hostnames(&big), ["web1"]);
    let staging = ok(query(&json!({"op": "servers_with_role", "roles": ["haproxy"], "environment": "staging"})));
    assert_eq!(staging[0]["certname"], "lb1.example.com");

    assert_eq!(
        ok(call(pk_note_environment, &json!({"certname": "web9.example.com", "environment": "staging"}))),
        Value::Null
    );
    let reply = pk_status();
    let raw = unsafe { CStr::from_ptr(reply) }.to_str().unwrap().to_string();
    let status = ok(take(reply));
    // The magnus extension's key order.
    assert!(
        raw.starts_with(r#"{"ok":{"servers":4,"index_bytes":"#)
            && raw.contains(r#","last_error":null,"config_file":""#)
    );
    assert!(
        raw.contains(r#"","cache_dir":""#)
            && raw.ends_with(r#","failures":0,"retry_at":null,"work_left":[],"helper":null}}"#),
        "{raw}"
    );
    assert_eq!(status["servers"], 4);
    assert!(status["index_bytes"].as_u64().unwrap() > 1000, "{status}");
    assert!(status["config_file"].as_str().unwrap().ends_with("etc/puppet_kicker.yaml"));
    assert!(ok(take(pk_take_log())).is_array());
}

/// pk_log_pending counts what pk_take_log would give, without JSON: the facade
/// skips pk_take_log when it is 0.
#[test]
fn log_pending_counts_what_take_log_gives() {
    let _core = serial();
    let master = Master::new("pending", "", &fleet());
    fs::write(master.root.join("var/server_data/facts/broken.example.com.json"), "not json").unwrap();
    fs::write(master.root.join("var/server_data/facts/broken2.example.com.json"), "{").unwrap();
    assert_eq!(ok(master.configure()), Value::Null);
    ok(query(&json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"})));
    let pending = pk_log_pending();
    assert!(pending >= 2, "two unreadable fact files are two warnings, got {pending}");
    let lines = ok(take(pk_take_log()));
    assert_eq!(lines.as_array().unwrap().len(), pending as usize, "{lines}");
    assert!(lines.to_string().contains("broken.example.com.json"), "{lines}");
    assert_eq!(pk_log_pending(), 0);
    assert_eq!(ok(take(pk_take_log())), json!([]));
    // Still 0, and still no JSON, however often it is asked.
    for _ in 0..1000 {
        assert_eq!(pk_log_pending(), 0);
    }
}

#[test]
fn errors_are_data_with_the_cores_kind_and_message() {
    let _core = serial();
    let master = Master::new("errors", "", &fleet());
    master.configure();

    let reply =
        query(&json!({"op": "servers_with_facts", "clauses": ["role=web", "uptime"], "environment": "production"}));
    let (kind, message) = error(&reply);
    assert_eq!(kind, "query");
    assert!(message.starts_with("clause 'uptime': no operator"), "{message}");
    let (kind, message) = error(&query(&json!({"op": "servers_with_role", "roles": ["/(?=x)/"], "environment": "p"})));
    assert_eq!(kind, "query");
    assert!(message.starts_with("role /(?=x)/: invalid regex"), "{message}");

    // A bad configuration names the file and the key.
    let bad = Master::new("bad-config", "cache:\n  ttl: soon\n", &fleet());
    let (kind, message) = error(&bad.configure());
    assert_eq!(kind, "config");
    assert!(message.contains("puppet_kicker.yaml: 'cache.ttl' must be a duration"), "{message}");

    // No data at all: the no_data kind, with the policy's explanation.
    let empty = Master::new("empty", "cache:\n  cold_start_timeout: 2\n", &[]);
    empty.configure();
    let (kind, message) = error(&query(&json!({"op": "servers_with_role", "roles": ["web"], "environment": "p"})));
    assert_eq!(kind, "no_data");
    assert!(message.contains("on_no_data: empty"), "{message}");

    // Malformed requests are the caller's bug, reported, never a crash.
    for request in
        [&b"not json"[..], br#"{"op":"drop_tables"}"#, br#"{"op":"servers_with_role","roles":[1],"environment":"p"}"#]
    {
        let (kind, message) = error(&take(unsafe { pk_select(request.as_ptr(), request.len()) }));
        assert_eq!(kind, "request", "{message}");
        assert!(message.starts_with("malformed request: "), "{message}");
    }
    let (kind, _) = error(&take(unsafe { pk_select(std::ptr::null(), 5) }));
    assert_eq!(kind, "request");
    let (kind, _) = error(&take(unsafe { pk_select(std::ptr::null(), 0) }));
    assert_eq!(kind, "request");
    // A kick payload the core cannot read is a report error, as through magnus.
    let (kind, message) = error(&call(pk_kick, &json!({"host": 1})));
    assert_eq!(kind, "report");
    assert!(message.starts_with("kick report: "), "{message}");
}

/// puppetserver runs several JRuby instances at once, without a GVL: every one calls
/// into the same core. Here 8 threads query, configure (same settings), note
/// environments and read the status while `cache.ttl: 0` makes every query start a
/// background refresh that swaps the index under them; every answer must be whole
/// and the same.
#[test]
fn parallel_calls_while_the_index_is_refreshed_agree() {
    let _core = serial();
    let master = Arc::new(Master::new("parallel", "cache:\n  ttl: 0\n", &fleet()));
    master.configure();
    let requests = [
        json!({"op": "servers_with_role", "roles": ["web", "db"], "environment": "production"}),
        json!({"op": "servers_with_facts", "clauses": ["uptime_days>10", "os.family=Debian"], "environment": "production"}),
        json!({"op": "server_with_role", "roles": ["/^hap/"], "environment": "staging"}),
        json!({"op": "servers_with_facts", "clauses": ["hostname=/^web/", "role!=db"], "environment": "production"}),
    ];
    let expected: Vec<Value> = requests.iter().map(query).collect();
    assert_eq!(hostnames(&expected[0]["ok"]), ["db1", "web1", "web2"]);

    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (barrier, master, requests, expected) =
                (barrier.clone(), master.clone(), requests.clone(), expected.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..400 {
                    let k = (i + t) % requests.len();
                    assert_eq!(query(&requests[k]), expected[k], "thread {t}, call {i}");
                    match i % 50 {
                        0 => assert_eq!(ok(master.configure()), Value::Null),
                        10 => {
                            ok(call(pk_note_environment, &json!({"certname": format!("n{t}"), "environment": "dev"})));
                        }
                        20 => assert_eq!(ok(take(pk_status()))["servers"], 4),
                        30 => assert!(ok(take(pk_take_log())).is_array()),
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker failed");
    }
}

#[test]
fn selections_are_fetched_by_generation_and_go_stale_with_a_new_index() {
    let _core = serial();
    let master = Master::new("select", "cache:\n  ttl: 1h\n", &fleet());
    assert_eq!(ok(master.configure()), Value::Null);
    let web = json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"});
    let selected = ok(call(pk_select, &web));
    let generation = selected["generation"].clone();
    assert_eq!(selected["positions"].as_array().unwrap().len(), 2);
    let servers = ok(call(pk_servers_at, &json!({"generation": generation, "positions": selected["positions"]})));
    let servers = built(&generation, servers.as_array().unwrap()).unwrap();
    assert_eq!(Value::Array(servers), ok(query(&web)), "the same servers as a query, in order");
    let first = ok(call(pk_select, &json!({"op": "server_with_role", "roles": ["web"], "environment": "production"})));
    assert_eq!(first["positions"], json!([selected["positions"][0]]));

    // The same query answers the same: same answer id, and no positions for a
    // caller that says it holds that answer. server_with_role is never a kept answer.
    let answer = selected["answer"].as_u64().unwrap();
    assert_ne!(answer, 0);
    let again = ok(call(pk_select, &web));
    assert_eq!((again["answer"].as_u64(), &again["positions"]), (Some(answer), &selected["positions"]));
    let held = ok(call(
        pk_select,
        &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production", "known": answer}),
    ));
    assert_eq!(held, json!({"generation": generation, "answer": answer}));
    let other_known = ok(call(
        pk_select,
        &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production", "known": answer + 1}),
    ));
    assert_eq!(other_known["positions"], selected["positions"], "positions unless the held answer is the answer");
    assert_eq!(first["answer"], 0);
    let (kind, message) = error(&call(
        pk_select,
        &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production", "known": "x"}),
    ));
    assert_eq!((kind.as_str(), message.contains("`known` must be an answer id")), ("request", true), "{message}");
    let (kind, message) = error(&call(
        pk_select,
        &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production", "nown": 1}),
    ));
    assert_eq!((kind.as_str(), message.contains("unknown field `nown`")), ("request", true), "{message}");

    // Another configuration means another index: the old generation is refused.
    let other = Master::new("select-other", "", &fleet());
    assert_eq!(ok(other.configure()), Value::Null);
    ok(call(pk_select, &web));
    let stale = ok(call(pk_servers_at, &json!({"generation": generation, "positions": [0]})));
    assert_eq!(stale, Value::Null);
    let (kind, _) = error(&call(pk_servers_at, &json!({"generation": "x"})));
    assert_eq!(kind, "request");
}

/// pk_answer_holds says, without JSON, whether an answer pk_select gave is still the
/// answer to that call: exactly while pk_select with that `known` leaves the
/// positions out. Never for 0, an unknown id, or an id of a replaced index.
#[test]
fn a_held_answer_is_known_without_json_while_it_is_the_answer() {
    let _core = serial();
    let master = Master::new("holds", "", &fleet());
    assert_eq!(ok(master.configure()), Value::Null);
    let web = json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"});
    let selected = ok(call(pk_select, &web));
    let answer = selected["answer"].as_u64().unwrap();
    for _ in 0..1000 {
        assert_eq!(pk_answer_holds(answer), 1);
    }
    let known = json!({"op": "servers_with_role", "roles": ["web"], "environment": "production", "known": answer});
    assert_eq!(ok(call(pk_select, &known)), json!({"generation": selected["generation"], "answer": answer}));
    // Ids no answer has (ids count from 1 in a process, so `answer` may be 1 when
    // this test runs first: 1 is not among them).
    for id in [0, answer + 1, u64::MAX, u64::MAX - 1, answer + 1_000_000, 1 << 63] {
        assert_eq!(pk_answer_holds(id), 0, "id {id}");
    }
    // server_with_role is never a kept answer: its id is 0, never held.
    let first = ok(call(pk_select, &json!({"op": "server_with_role", "roles": ["web"], "environment": "production"})));
    assert_eq!((first["answer"].as_u64(), pk_answer_holds(0)), (Some(0), 0));
    // Another answer of the same index is held on its own.
    let db = ok(call(pk_select, &json!({"op": "servers_with_role", "roles": ["db"], "environment": "production"})));
    let db = db["answer"].as_u64().unwrap();
    assert_ne!(db, answer);
    assert_eq!((pk_answer_holds(answer), pk_answer_holds(db)), (1, 1));

    // Another configuration, another index: nothing of the old one is held.
    let other = Master::new("holds-other", "", &fleet());
    assert_eq!(ok(other.configure()), Value::Null);
    assert_eq!((pk_answer_holds(answer), pk_answer_holds(db)), (0, 0));
    let again = ok(call(pk_select, &known));
    let renewed = again["answer"].as_u64().unwrap();
    assert_ne!(renewed, answer);
    assert_eq!(again["positions"], selected["positions"], "the same servers, a new answer");
    assert_eq!(pk_answer_holds(renewed), 1);
}

/// An answer one of whose servers passes max_age is not held: pk_select computes it
/// again, without that server, as it would have without pk_answer_holds.
#[test]
fn a_held_answer_ends_when_a_server_passes_max_age() {
    let _core = serial();
    let master = Master::new("holds-age", "", &[]);
    fs::write(master.root.join("etc/puppet_kicker.yaml"), "max_age: 10s\ncache:\n  ttl: 1h\n").unwrap();
    let facts = master.root.join("var/server_data/facts");
    let now = std::time::SystemTime::now();
    for (certname, age) in [("young.example.com", 0), ("aging.example.com", 8)] {
        // No timestamp in the document: the file's modification time dates the facts.
        let doc = json!({"name": certname, "values": {"fqdn": certname, "role": "web"}});
        let path = facts.join(format!("{certname}.json"));
        fs::write(&path, doc.to_string()).unwrap();
        let file = fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(now - std::time::Duration::from_secs(age)).unwrap();
    }
    assert_eq!(ok(master.configure()), Value::Null);
    let web = json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"});
    let selected = ok(call(pk_select, &web));
    assert_eq!(selected["positions"].as_array().unwrap().len(), 2, "{selected}");
    let answer = selected["answer"].as_u64().unwrap();
    assert_eq!(pk_answer_holds(answer), 1);
    // `aging` passes max_age 2 s from now (the clock counts whole seconds).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pk_answer_holds(answer) == 1 {
        assert!(std::time::Instant::now() < deadline, "the answer outlived its servers' max_age");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let aged = ok(call(
        pk_select,
        &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production", "known": answer}),
    ));
    assert_eq!(aged["positions"].as_array().map(Vec::len), Some(1), "{aged}");
    assert_ne!(aged["answer"].as_u64(), Some(answer));
    assert_eq!(aged["generation"], selected["generation"], "the same index, a new answer");
    assert_eq!(pk_answer_holds(aged["answer"].as_u64().unwrap()), 1);
}

/// A held answer of an index older than cache.ttl queues a refresh, as the query
/// does: the index is replaced with no other call, and the answer is no longer held.
#[test]
fn a_held_answer_of_a_stale_index_queues_a_refresh() {
    let _core = serial();
    let master = Master::new("holds-stale", "cache:\n  ttl: 1s\n", &fleet());
    assert_eq!(ok(master.configure()), Value::Null);
    let web = json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"});
    let answer = ok(call(pk_select, &web))["answer"].as_u64().unwrap();
    let built_at = ok(take(pk_status()))["built_at"].clone();
    std::thread::sleep(std::time::Duration::from_millis(2100));
    // Nothing refreshes a stale index by itself...
    assert_eq!(ok(take(pk_status()))["built_at"], built_at);
    // ...but a call does, and still gets the answer of the index it found.
    assert_eq!(pk_answer_holds(answer), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while ok(take(pk_status()))["built_at"] == built_at {
        assert!(std::time::Instant::now() < deadline, "no refresh was queued");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(pk_answer_holds(answer), 0, "a new index: the answer is asked again");
    let renewed = ok(call(pk_select, &web))["answer"].as_u64().unwrap();
    assert_ne!(renewed, answer);
}

/// A pk_fetch reply read as a caller reads it (fetch.rs's layout) into its table,
/// checking every word: its status, and the servers as JSON objects, or the JSON
/// error it carries.
#[derive(Debug)]
enum Fetched {
    Servers(Vec<Value>),
    Stale,
    Failed(Value),
}

/// A caller of pk_fetch: its session and its table of objects.
struct Fetcher {
    session: *mut puppet_kicker_ffi::fetch::Session,
    table: Vec<Value>,
}

impl Fetcher {
    fn new() -> Fetcher {
        let session = pk_session_new();
        assert!(!session.is_null());
        Fetcher { session, table: Vec::new() }
    }

    fn fetch(&mut self, generation: u64, positions: &[u32]) -> Fetched {
        self.fetch_having(generation, self.table.len() as u64, positions)
    }

    fn fetch_having(&mut self, generation: u64, have: u64, positions: &[u32]) -> Fetched {
        let mut length = 0;
        let reply =
            unsafe { pk_fetch(self.session, generation, have, positions.as_ptr(), positions.len(), &mut length) };
        read_reply(reply, length, &mut self.table)
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        unsafe { pk_session_free(self.session) };
    }
}

/// Reads the reply of `length` bytes (as pk_fetch handed it over) at `reply`, and frees it.
fn read_reply(reply: *mut u8, length: usize, table: &mut Vec<Value>) -> Fetched {
    assert!(!reply.is_null());
    assert!(length >= puppet_kicker_ffi::fetch::HEADER_BYTES, "a header at least: {length}");
    let own = u64::from_ne_bytes(unsafe { *(reply as *const [u8; 8]) }) as usize;
    assert_eq!(own, length, "the reply's own length is the one handed over");
    let bytes = unsafe { std::slice::from_raw_parts(reply, length) }.to_vec();
    unsafe { pk_free_fetch(reply) };
    read_fetched(&bytes, table)
}

fn read_fetched(bytes: &[u8], table: &mut Vec<Value>) -> Fetched {
    use puppet_kicker_ffi::fetch::*;
    let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    let [status, base, strings, scalars, containers, servers, words, text, json] =
        std::array::from_fn(|i| u32_at(8 + 4 * i) as usize);
    let text_at = HEADER_BYTES + 4 * words;
    let json_at = text_at + text;
    assert_eq!(json_at + json, bytes.len(), "the counts add up to the length");
    match status as u32 {
        OK => {}
        STALE => return Fetched::Stale,
        FAILED => return Fetched::Failed(serde_json::from_slice(&bytes[json_at..]).unwrap()),
        other => panic!("status {other}"),
    }
    if base != table.len() {
        assert_eq!(base, 0, "a session starts over from 0");
        table.clear();
    }
    let words: Vec<u32> = (0..words).map(|i| u32_at(HEADER_BYTES + 4 * i)).collect();
    let (mut at, mut offset) = (0, text_at);
    for _ in 0..strings {
        let end = offset + words[at] as usize;
        table.push(std::str::from_utf8(&bytes[offset..end]).expect("strings are UTF-8").into());
        (at, offset) = (at + 1, end);
    }
    assert_eq!(offset, json_at, "the strings fill the text");
    let others: Vec<Value> = serde_json::from_slice(&bytes[json_at..]).unwrap();
    assert_eq!(others.len(), scalars);
    assert!(others.iter().all(|v| !(v.is_string() || v.is_array() || v.is_object())), "{others:?}");
    table.extend(others);
    for _ in 0..containers {
        let (tag, n) = (words[at], words[at + 1] as usize);
        at += 2;
        let built = table.len();
        let item = |number: u32| {
            assert!((number as usize) < built, "only lower numbers");
            table[number as usize].clone()
        };
        let container = match tag {
            ARRAY => Value::Array(words[at..at + n].iter().map(|number| item(*number)).collect()),
            OBJECT => Value::Object(
                words[at..at + 2 * n]
                    .chunks(2)
                    .map(|pair| (item(pair[0]).as_str().expect("names are strings").to_string(), item(pair[1])))
                    .collect(),
            ),
            other => panic!("tag {other}"),
        };
        at += if tag == OBJECT { 2 * n } else { n };
        table.push(container);
    }
    assert_eq!(at + servers, words.len(), "every word read");
    Fetched::Servers(words[at..].iter().map(|number| table[*number as usize].clone()).collect())
}

fn positions_of(selected: &Value) -> Vec<u32> {
    selected["positions"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as u32).collect()
}

/// pk_fetch gives, in one binary reply, the servers the JSON functions give, every
/// value of every JSON type intact at any depth.
#[test]
fn fetch_gives_the_servers_of_the_json_functions_in_one_binary_reply() {
    let _core = serial();
    let master = Master::new("fetch", "cache:\n  ttl: 1h\n", &fleet());
    assert_eq!(ok(master.configure()), Value::Null);
    let mut fetcher = Fetcher::new();
    for request in [
        json!({"op": "servers_with_role", "roles": ["/./"], "environment": "production"}),
        json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"}),
        json!({"op": "servers_with_role", "roles": ["haproxy"], "environment": "staging"}),
        json!({"op": "servers_with_role", "roles": ["nobody"], "environment": "production"}),
    ] {
        let selected = ok(call(pk_select, &request));
        let generation = selected["generation"].as_u64().unwrap();
        let Fetched::Servers(servers) = fetcher.fetch(generation, &positions_of(&selected)) else {
            panic!("{request}: not fetched")
        };
        assert_eq!(Value::Array(servers), ok(query(&request)), "{request}");
    }
    let selected =
        ok(call(pk_select, &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"})));
    let generation = selected["generation"].as_u64().unwrap();
    let Fetched::Servers(none) = fetcher.fetch(generation, &[]) else { panic!("no positions: no servers") };
    assert!(none.is_empty());
    let web1 = positions_of(&selected)[0];
    let Fetched::Servers(web) = Fetcher::new().fetch(generation, &[web1, web1]) else { panic!("a position twice") };
    assert_eq!((web.len(), &web[0], &web[0]["big"]), (2, &web[1], &json!(18446744073709551615u64)));
    assert_eq!((&web[0]["neg"], &web[0]["load"]), (&json!(-3), &json!(0.25)));
    assert_eq!((&web[0]["unicode"], &web[0]["certname"]), (&json!("é\u{2028}\u{0}ü"), &json!("web1.example.com")));
    assert_eq!((&web[0]["empty"], &web[0]["none"], &web[0]["nothing"]), (&json!({}), &json!([]), &Value::Null));

    // A position beyond the index, or another generation: select again.
    assert!(matches!(fetcher.fetch(generation, &[web1, u32::MAX]), Fetched::Stale));
    assert!(matches!(fetcher.fetch(generation + 1, &[web1]), Fetched::Stale));
    assert!(matches!(fetcher.fetch(u64::MAX, &[]), Fetched::Stale));
    // Null positions with a count, or no session: a request error, as data.
    let mut length = 0;
    let reply = unsafe { pk_fetch(fetcher.session, generation, 0, std::ptr::null(), 3, &mut length) };
    let Fetched::Failed(failure) = read_reply(reply, length, &mut Vec::new()) else {
        panic!("null positions accepted")
    };
    assert_eq!(error(&failure), ("request".to_string(), "null positions with count 3".to_string()));
    // No length asked for (null): the reply is the same, its length in its first 8 bytes.
    let reply = unsafe { pk_fetch(std::ptr::null(), generation, 0, [web1].as_ptr(), 1, std::ptr::null_mut()) };
    let length = u64::from_ne_bytes(unsafe { *(reply as *const [u8; 8]) }) as usize;
    let Fetched::Failed(failure) = read_reply(reply, length, &mut Vec::new()) else { panic!("no session accepted") };
    assert_eq!(error(&failure), ("request".to_string(), "null session".to_string()));
    unsafe { pk_free_fetch(std::ptr::null_mut()) };
    unsafe { pk_session_free(std::ptr::null_mut()) };

    // Another configuration, another index: the old generation is stale.
    let other = Master::new("fetch-other", "", &fleet());
    assert_eq!(ok(other.configure()), Value::Null);
    ok(call(pk_select, &json!({"op": "servers_with_role", "roles": ["web"], "environment": "production"})));
    assert!(matches!(fetcher.fetch(generation, &[web1]), Fetched::Stale));
}

/// Integers at the edges of i64 and u64, and floats, come back exact; a value many
/// servers share, at any depth and in any call of one generation, is sent once; a
/// caller whose table is not what its session sent gets everything again, from 0.
#[test]
fn fetch_keeps_numbers_exact_and_sends_a_shared_value_once_a_generation() {
    let _core = serial();
    let shared = json!({"family": "Debian", "release": {"full": "12.5", "major": "12"}});
    let numbers = json!([0, -1, i32::MAX, i32::MIN, i64::from(i32::MAX) + 1, i64::from(i32::MIN) - 1, i64::MAX,
                         i64::MIN, u64::MAX, 0.1, -0.0, 5e-324, 1e300, true, false, null, "", [[]], {"a": {}}]);
    let servers = [
        ("n1.example.com", json!({"role": "n", "numbers": numbers, "os": shared, "deep": {"os": shared}})),
        ("n2.example.com", json!({"role": "n", "os": shared, "list": [shared, shared]})),
        ("m1.example.com", json!({"role": "m", "os": shared, "list": [shared]})),
    ];
    let master = Master::new("fetch-numbers", "", &servers);
    assert_eq!(ok(master.configure()), Value::Null);
    let n = json!({"op": "servers_with_role", "roles": ["n"], "environment": "production"});
    let selected = ok(call(pk_select, &n));
    let generation = selected["generation"].as_u64().unwrap();
    let mut fetcher = Fetcher::new();
    let Fetched::Servers(fetched) = fetcher.fetch(generation, &positions_of(&selected)) else { panic!("not fetched") };
    assert_eq!(fetched[0]["numbers"], numbers);
    assert_eq!(fetched[0]["numbers"][10].as_f64().map(f64::is_sign_negative), Some(true), "-0.0 keeps its sign");
    assert_eq!((&fetched[0]["deep"]["os"], &fetched[1]["list"][1]), (&shared, &shared));
    assert_eq!(Value::Array(fetched), ok(query(&n)));
    let families = fetcher.table.iter().filter(|v| *v == "Debian").count();
    let oses = fetcher.table.iter().filter(|v| **v == shared).count();
    assert_eq!((families, oses), (1, 1), "one string, one object, however many times they appear");

    // The next call sends only what the table lacks: "m", m1's list, its certname, and m1.
    let m = json!({"op": "servers_with_role", "roles": ["m"], "environment": "production"});
    let held = fetcher.table.len();
    let Fetched::Servers(m1) = fetcher.fetch(generation, &positions_of(&ok(call(pk_select, &m)))) else { panic!() };
    assert_eq!(Value::Array(m1.clone()), ok(query(&m)));
    assert_eq!(fetcher.table.len() - held, 4, "{:?}", &fetcher.table[held..]);
    // A caller that lost what it held (a reply it could not read) starts over.
    let m1_at = positions_of(&ok(call(pk_select, &m)));
    let Fetched::Servers(again) = fetcher.fetch_having(generation, 3, &m1_at) else { panic!() };
    // 8 names, 5 strings (certname included), `release`, `os`, the list, m1.
    assert_eq!((again, fetcher.table.len()), (m1, 17), "from 0: all of m1");
}
