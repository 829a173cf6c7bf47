use super::*;
use serde_json::{json, Value};

/// A store's arrays as plain vectors, to change before checking them.
struct Parts {
    text: Vec<u8>,
    text_ends: Vec<u32>,
    tags: Vec<u8>,
    lo: Vec<u32>,
    hi: Vec<u32>,
    children: Vec<u32>,
}

fn owned(store: &Store) -> Parts {
    Parts {
        text: store.text.to_vec(),
        text_ends: store.text_ends.to_vec(),
        tags: store.tags.to_vec(),
        lo: store.lo.to_vec(),
        hi: store.hi.to_vec(),
        children: store.children.to_vec(),
    }
}

/// What [`Store::from_blobs`] does after reading the arrays, checked on one thread
/// and on two: the same error either way.
fn from_parts(p: Parts) -> Result<Store, Invalid> {
    let store = Store {
        text: p.text.into(),
        text_ends: p.text_ends.into(),
        tags: p.tags.into(),
        lo: p.lo.into(),
        hi: p.hi.into(),
        children: p.children.into(),
    };
    let (one, two) = (store.validate_with(false), store.validate_with(true));
    assert_eq!(one, two, "one thread and two disagree");
    one?;
    Ok(store)
}

fn sample() -> Value {
    json!({
        "os": {"family": "Debian", "release": {"full": "12.5", "major": "12"}},
        "processors": {"count": 4, "models": ["Xeon", "Xeon"]},
        "uptime_seconds": 18446744073709551615u64,
        "load": -1.5,
        "negative": -7,
        "virtual": false,
        "is_virtual": true,
        "nothing": null,
        "empty": {},
        "none": [],
        "naïve": "ünïcode",
    })
}

#[test]
fn every_json_value_comes_back_unchanged() {
    let mut builder = Builder::new();
    let value = sample();
    let id = builder.value(&value);
    let store = builder.finish();
    assert_eq!(store.view(id).to_json(), value);
    assert_eq!(serde_json::to_value(store.view(id)).unwrap(), value);
}

#[test]
fn equal_values_share_one_id_and_one_copy() {
    let mut builder = Builder::new();
    let a = builder.value(&sample());
    let values = builder.store().values();
    let strings = builder.store().strings();
    let b = builder.value(&sample());
    assert_eq!(a, b);
    assert_eq!(builder.store().values(), values, "nothing added for a repeated value");
    assert_eq!(builder.store().strings(), strings);
    // "Xeon" twice in one array is one value, and the same as a top-level "Xeon".
    let xeon = builder.value(&json!("Xeon"));
    let store = builder.finish();
    let models = store.view(a).as_object().unwrap().get("processors").unwrap().as_object().unwrap().get("models");
    let Kind::Array(models) = models.unwrap().kind() else { panic!("models is an array") };
    assert!(models.iter().all(|m| m.id() == xeon));
}

#[test]
fn different_values_never_share_an_id() {
    let mut builder = Builder::new();
    let values = [json!(1), json!(1.0), json!("1"), json!([1]), json!({"1": 1}), json!(-0.0), json!(0.0), json!({})];
    let ids: Vec<_> = values.iter().map(|v| builder.value(v)).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    assert_eq!(ids[7], EMPTY_OBJECT);
}

#[test]
fn objects_are_read_by_key_with_a_binary_search() {
    let mut builder = Builder::new();
    let keys: Vec<String> = (0..100).map(|i| format!("k{i:03}")).collect();
    let map: serde_json::Map<String, Value> = keys.iter().map(|k| (k.clone(), json!(k))).collect();
    let id = builder.value(&Value::Object(map));
    let store = builder.finish();
    let object = store.view(id).as_object().unwrap();
    for k in &keys {
        assert_eq!(object.get(k).and_then(View::as_str), Some(k.as_str()));
    }
    assert!(object.get("k100").is_none() && object.get("").is_none() && object.get("zzz").is_none());
}

#[test]
fn a_store_survives_its_flat_arrays() {
    let mut builder = Builder::new();
    let id = builder.value(&sample());
    let store = builder.finish();
    let again = from_parts(owned(&store)).unwrap();
    assert_eq!(again, store);
    assert_eq!(again.view(id).to_json(), sample());
}

#[test]
fn decoded_stores_are_checked_before_use() {
    let mut builder = Builder::new();
    let top = builder.value(&json!({"a": ["x", {"b": 1}], "c": "y"}));
    let store = builder.finish();
    let refused = |change: &dyn Fn(&mut Parts), what: &str| {
        let mut parts = owned(&store);
        change(&mut parts);
        let error = from_parts(parts).expect_err(what);
        assert!(error.0.contains(what), "{error} should say {what}");
    };
    let top = top as usize;
    refused(&|p| p.tags[top] = 9, "unknown tag");
    refused(&|p| p.hi[top] = 1000, "children past the end");
    refused(&|p| p.text_ends.push(u32::MAX), "ends at");
    refused(&|p| p.text[0] = 0xff, "not UTF-8");
    refused(&|p| p.lo.pop().map(drop).unwrap_or(()), "value words");
    refused(
        &|p| {
            p.tags.truncate(2);
            p.lo.truncate(2);
            p.hi.truncate(2);
        },
        "fewer than the",
    );
    refused(&|p| p.tags[NULL as usize] = Tag::Str as u8, "not the constant");
    refused(&|p| p.tags.push(Tag::Bool as u8), "value words");
    refused(
        &|p| {
            // The top object's value "y" now names the object itself.
            let last = p.children.len() - 1;
            p.children[last] = top as u32;
        },
        "not an earlier one",
    );
    refused(
        &|p| {
            // Swap the keys "a" and "c": out of order.
            let start = p.lo[top] as usize;
            p.children.swap(start, start + 2);
        },
        "out of order",
    );
    refused(
        &|p| {
            p.tags.push(Tag::Float as u8);
            p.lo.push(0);
            p.hi.push(0x7ff0_0000);
        },
        "not finite",
    );
}

fn nested(depth: u32) -> Value {
    let mut value = json!("leaf");
    for _ in 1..depth {
        value = json!([value]);
    }
    value
}

#[test]
fn nesting_is_accepted_up_to_max_depth_and_refused_beyond() {
    let mut builder = Builder::new();
    builder.value(&nested(MAX_DEPTH));
    assert!(from_parts(owned(&builder.finish())).is_ok());

    let mut builder = Builder::new();
    builder.value(&nested(MAX_DEPTH + 1));
    let error = from_parts(owned(&builder.finish())).unwrap_err();
    assert!(error.0.contains("nests deeper than"), "{error}");
}

#[test]
fn a_string_ending_inside_a_character_is_refused() {
    let mut builder = Builder::new();
    builder.value(&json!(["é", "x"]));
    let mut parts = owned(&builder.finish());
    let e = parts.text.iter().position(|&b| b == 0xc3).unwrap() as u32;
    let i = parts.text_ends.iter().position(|&end| end == e + 2).unwrap();
    parts.text_ends[i] = e + 1;
    let error = from_parts(parts).unwrap_err();
    assert!(error.0.contains("ends inside a character"), "{error}");
}

#[test]
fn a_written_store_is_read_back_in_place_from_the_mapped_file() {
    let mut builder = Builder::new();
    let id = builder.value(&sample());
    let store = builder.finish();
    // As in a snapshot: the blobs are aligned from the file's first byte, whatever
    // comes before them.
    for prefix in 0..9 {
        let mut spool = super::blob::Spool::in_memory(0);
        spool.put(&vec![0xc0; prefix]);
        store.write(&mut spool);
        let bytes = spool.into_bytes();
        let dir = crate::snapshot::tests::tempdir(&format!("store-in-place-{prefix}"));
        std::fs::write(dir.join("store"), &bytes).unwrap();
        let file = Arc::new(crate::bounded_read::map(&dir.join("store"), 1 << 20).unwrap());
        let mut decoder = rmp_serde::Deserializer::from_read_ref(&file[prefix..]);
        let blobs = StoreBlobs::deserialize(&mut decoder).unwrap();
        let read = Store::from_blobs(&file, blobs).unwrap();
        assert_eq!(read, store);
        assert_eq!(read.view(id).to_json(), sample());
        assert_eq!(read.is_mapped(), cfg!(target_endian = "little"), "prefix {prefix}");
        assert_eq!(read.heap_bytes(), bytes_of(&store));
        drop(read);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The bytes of a store's arrays (what a mapped store reports as held).
fn bytes_of(store: &Store) -> usize {
    store.text.len()
        + store.tags.len()
        + 4 * (store.text_ends.len() + store.lo.len() + store.hi.len() + store.children.len())
}

#[test]
fn absorbing_a_store_renumbers_it_into_this_one_sharing_what_both_hold() {
    let (mut a, mut b) = (Builder::new(), Builder::new());
    let shared = json!({"os": {"family": "Debian"}, "n": [1, 2.5, null]});
    let own = json!({"os": {"family": "Debian"}, "host": "b1", "big": 18446744073709551615u64});
    let in_a = a.value(&shared);
    let (b_shared, b_own) = (b.value(&own), b.value(&shared));
    let values_before = a.store().values();
    let remap = a.absorb(b.store());
    assert_eq!(remap.values[b_own as usize], in_a, "an equal value is the same id");
    assert_eq!(a.store().view(remap.values[b_shared as usize]).to_json(), own);
    for id in 0..b.store().values() as ValueId {
        assert_eq!(a.store().view(remap.values[id as usize]).to_json(), b.store().view(id).to_json());
    }
    assert!(a.store().values() < values_before + b.store().values(), "shared values are not copied");
}

#[test]
fn importing_a_value_copies_it_once_however_often_it_is_asked_for() {
    let mut from = Builder::new();
    let id = from.value(&json!({"k": ["v", {"x": 1}]}));
    let from = from.finish();
    let mut to = Builder::new();
    let mut memo = std::collections::HashMap::new();
    let copied = to.import(&from, id, &mut memo);
    let values = to.store().values();
    assert_eq!(to.import(&from, id, &mut memo), copied);
    assert_eq!(to.store().values(), values);
    assert_eq!(to.store().view(copied).to_json(), json!({"k": ["v", {"x": 1}]}));
}

#[test]
fn a_key_hint_answers_as_the_binary_search_does_wherever_the_key_is() {
    let mut b = Builder::new();
    let objects = [
        json!({"a": 1, "hostname": "x", "z": 2}),
        json!({"hostname": "y"}),
        json!({"a": 1, "b": 2, "c": 3, "hostname": "z"}),
        json!({"a": 1, "b": 2, "c": 3, "d": 4}),
        json!({"a": 1, "b": 2, "c": 3, "hostname": "w"}),
        json!({}),
        json!({"hostname": "v", "z": 1}),
        many_keys_then("hostname", 40),
        json!({"a": 1, "d": 4}),
        many_keys_then("d", 3),
    ];
    let ids: Vec<ValueId> = objects.iter().map(|o| b.value(o)).collect();
    let store = b.finish();
    let mut hints = ["hostname", "a", "d", "missing"].map(KeyHint::new);
    for (id, object) in ids.iter().zip(&objects) {
        for (hint, key) in hints.iter_mut().zip(["hostname", "a", "d", "missing"]) {
            let found = store.view(*id).as_object().unwrap().get_hinted(hint);
            assert_eq!(found.map(View::to_json), object.get(key).cloned(), "{key} in {object}");
            assert_eq!(found.map(View::id), store.view(*id).as_object().unwrap().get(key).map(View::id));
        }
    }
}

/// An object of `count` keys sorting before `key` ("a00", "a01", ...), then `key`.
fn many_keys_then(key: &str, count: usize) -> serde_json::Value {
    let mut object: serde_json::Map<String, serde_json::Value> =
        (0..count).map(|i| (format!("a{i:02}"), json!(i))).collect();
    object.insert(key.to_string(), json!(key));
    serde_json::Value::Object(object)
}

#[test]
fn checked_on_two_threads_a_store_reports_its_first_error() {
    let nodes = crate::synthetic::fleet(40, 9, 1_764_000_000);
    let mut builder = Builder::new();
    let facts: Vec<ValueId> =
        nodes.iter().map(|n| builder.object(n.facts.iter().map(|(k, v)| (k.as_str(), v)))).collect();
    let store = builder.finish();
    assert_eq!(store.validate_with(true), Ok(()));
    // Two servers' facts objects: an early one gets its first two keys swapped, a
    // later one a value naming itself. Whichever is first in value order is reported.
    let (early, late) = (facts[5] as usize, facts[30] as usize);
    let swap_keys = |p: &mut Parts, id: usize| {
        let start = p.lo[id] as usize;
        p.children.swap(start, start + 2);
    };
    let name_itself = |p: &mut Parts, id: usize| {
        let at = p.lo[id] as usize + 1;
        p.children[at] = id as u32;
    };
    let mut parts = owned(&store);
    swap_keys(&mut parts, early);
    name_itself(&mut parts, late);
    let error = from_parts(parts).unwrap_err();
    assert!(error.0.contains(&format!("value {early} has keys out of order")), "{error}");
    let mut parts = owned(&store);
    name_itself(&mut parts, early);
    swap_keys(&mut parts, late);
    let error = from_parts(parts).unwrap_err();
    assert!(error.0.contains(&format!("value {early} refers to value {early}")), "{error}");
}

#[test]
fn bytes_repaired_as_text_are_never_taken_for_utf8_later() {
    let mut builder = Builder::new();
    let repaired = builder.string_lossy(b"a\xffb");
    assert_eq!(builder.store().str(repaired), "a\u{fffd}b");
    assert_eq!(builder.string_checked(b"a\xffb"), None);
    assert_eq!(builder.string_value_checked(b"a\xffb"), None);
    assert_eq!(builder.string_lossy(b"a\xffb"), repaired);
    // Valid bytes are the same string whichever way they come.
    let ok = builder.string_lossy(b"ok");
    assert_eq!(builder.string_checked(b"ok"), Some(ok));
    assert_eq!(builder.string("ok"), ok);
    let value = builder.string_value_lossy(b"ok");
    assert_eq!((builder.string_value_checked(b"ok"), builder.string_value("ok")), (Some(value), value));
}

#[test]
fn text_is_checked_as_utf8_whether_ascii_or_not() {
    let mut builder = Builder::new();
    // ASCII at every length around a word, multi-byte text, and bytes that are not
    // UTF-8 after an ASCII start (the word-at-a-time check must not pass them).
    for len in 0..=17 {
        let ascii = "k".repeat(len);
        let id = builder.string_checked(ascii.as_bytes()).expect("ASCII is UTF-8");
        assert_eq!(builder.store().str(id), ascii);
    }
    let id = builder.string_checked("größe ✓ of a long string".as_bytes()).expect("UTF-8");
    assert_eq!(builder.store().str(id), "größe ✓ of a long string");
    assert_eq!(builder.string_checked(b"eight by\xfftes more"), None);
    assert_eq!(lossy_text(b"eight by\xfftes more"), "eight by\u{fffd}tes more");
}

#[test]
fn objects_come_out_sorted_by_key_whatever_pairs_were_seen_in_order_before() {
    let object = |builder: &mut Builder, keys: &[&str]| {
        let mark = builder.open();
        for (i, key) in keys.iter().enumerate() {
            let key = builder.string(key);
            let value = builder.int(i as i64);
            builder.push_child(key);
            builder.push_child(value);
        }
        let id = builder.close_object(mark);
        let store = builder.store();
        // The stored order (`to_json` would sort them again).
        let Kind::Object(pairs) = store.view(id).kind() else { panic!("not an object") };
        pairs.ids().map(|(key, _)| store.str(key).to_string()).collect::<Vec<_>>()
    };
    let mut builder = Builder::new();
    assert_eq!(object(&mut builder, &["a", "b", "c"]), ["a", "b", "c"]);
    // The same keys again, out of order: the pairs known in order do not hide the one that is not.
    assert_eq!(object(&mut builder, &["a", "c", "b"]), ["a", "b", "c"]);
    assert_eq!(object(&mut builder, &["c", "b", "a"]), ["a", "b", "c"]);
    // After a clear, the same ids are other strings, in the other order.
    builder.clear();
    assert_eq!(object(&mut builder, &["z", "y"]), ["y", "z"]);
    assert_eq!(object(&mut builder, &["y", "z"]), ["y", "z"]);
}

/// [`Store::check_text`] as one check of the whole text, then of the ends: what the
/// chunked check must report, error for error.
fn text_checked_whole(text: &[u8], text_ends: &[u32]) -> Result<(), Invalid> {
    if let Err(e) = std::str::from_utf8(text) {
        return Err(Invalid(format!("the text is not UTF-8 at byte {}", e.valid_up_to())));
    }
    let mut start = 0usize;
    for (i, &end) in text_ends.iter().enumerate() {
        let end = end as usize;
        if end < start || end > text.len() {
            return Err(Invalid(format!("string {i} ends at {end}, outside {start}..{}", text.len())));
        }
        if text.get(end).is_some_and(|&b| b & 0xc0 == 0x80) {
            return Err(Invalid(format!("string {i} ends inside a character")));
        }
        start = end;
    }
    if start != text.len() {
        return Err(Invalid(format!("{} bytes of text after the last string", text.len() - start)));
    }
    Ok(())
}

/// A change to a store's arrays, for a test to check what it makes of them.
type Change = dyn Fn(&mut Parts);

#[test]
fn a_text_of_many_chunks_is_checked_as_one_check_of_the_whole_would() {
    // Strings of one- to four-byte characters, so chunks start inside characters.
    let mut builder = Builder::new();
    let strings: Vec<Value> =
        (0..20_000).map(|i| json!(format!("{i}:{}", ["a", "ü", "€", "𝄞"][i % 4].repeat(1 + i % 13)))).collect();
    builder.value(&Value::Array(strings));
    let store = builder.finish();
    let parts = owned(&store);
    assert!(parts.text.len() > 4 * TEXT_CHUNK, "{} bytes", parts.text.len());
    let check = |p: &Parts| {
        let store = Store { text: p.text.clone().into(), text_ends: p.text_ends.clone().into(), ..Store::default() };
        store.check_text()
    };
    assert_eq!(check(&parts), Ok(()));
    let cases: Vec<(&str, Box<Change>)> = vec![
        ("a stray byte far in", Box::new(|p| p.text[3 * TEXT_CHUNK + 5] = 0xff)),
        (
            "a character cut at a chunk's end",
            Box::new(|p| {
                let at = (TEXT_CHUNK..).find(|&at| p.text[at] & 0xc0 == 0x80).unwrap();
                p.text[at] = b'x';
            }),
        ),
        (
            "five continuation bytes across a chunk's end",
            Box::new(|p| p.text[2 * TEXT_CHUNK - 2..2 * TEXT_CHUNK + 3].fill(0x80)),
        ),
        (
            "an end inside a character in a later chunk",
            Box::new(|p| {
                let i = (4000..).find(|&i| p.text[p.text_ends[i] as usize - 1] >= 0x80).unwrap();
                p.text_ends[i] -= 1;
            }),
        ),
        ("an end going back", Box::new(|p| p.text_ends[5000] = p.text_ends[10])),
        ("an end past the text", Box::new(|p| *p.text_ends.last_mut().unwrap() += 1)),
        (
            "text after the last string",
            Box::new(|p| {
                p.text_ends.pop();
            }),
        ),
        (
            "a bad end before a stray byte: the stray byte",
            Box::new(|p| {
                p.text_ends[100] = 0;
                p.text[4 * TEXT_CHUNK] = 0xc0;
            }),
        ),
    ];
    for (what, change) in cases {
        let mut p = owned(&store);
        change(&mut p);
        let expected = text_checked_whole(&p.text, &p.text_ends);
        assert!(expected.is_err(), "{what}: the change makes a bad text");
        assert_eq!(check(&p), expected, "{what}");
    }
}
