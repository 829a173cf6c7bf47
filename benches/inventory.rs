//! `cargo bench --bench inventory`: what a refresh of `source: mcollective` costs on
//! the master once the replies are on the wire: 10,000 `rpcutil#inventory` replies
//! of realistic size, from STOMP bytes to the index a compile reads.
//!
//! The replies are generated: the Facter-4-like facts of `puppet_kicker::synthetic`
//! (about 150 top-level facts, structured), every leaf turned into a String as
//! mcollective 2.12's fact plugins do, plus 40 classes, the agents, data plugins and
//! collectives an inventory carries; each is Marshal-encoded, PSK-signed and framed
//! as the broker delivers it.
//!
//! Stages, each over all 10,000 replies: (1) read the STOMP MESSAGE frames from a
//! byte stream; (2) decode each outer Marshal layer and check its PSK signature and
//! (3) decode the inner layer, as the client does per reply; (4) turn each into an
//! observation (facts and classes to JSON values); (5) build the index. One warm-up, then at least five samples; the
//! median of each stage is reported.
//!
//! The new path runs beside it in the same samples, from the same bytes: (1'+2') the
//! replies received as the client receives a burst (`Client::collect_recorded`, the
//! client's own collect loop reading the bytes in place of a broker): frames read,
//! outer layers read in place (`ReplyRef`), PSK signatures checked on the bodies'
//! bytes in batches (`decode_replies_verified`), each reply kept by sender with its
//! frame's bytes as its body; (3'+4') the inner layer read in place straight into the
//! store (`observe_replies`), on one thread and on two, and beside them, as before
//! the one pass, the body checked then read (`observation_two_passes`, one thread);
//! (5') the index. Then the
//! incremental case: 10 of the 10,000 replies with a new body, the rest as last time
//! (`observe_since` on a builder resumed on the last index's store).

#[path = "support/report.rs"]
mod report;

use puppet_kicker::mcollective::client::{Client, VERIFY_BATCH};
use puppet_kicker::mcollective::config::{BrokerHost, Config, Overrides};
use puppet_kicker::mcollective::marshal::{DecodeLimits, Value};
use puppet_kicker::mcollective::marshal_reader::Doc;
use puppet_kicker::mcollective::md5_lanes::{self, Engine};
use puppet_kicker::mcollective::message::{Reply, RpcStatus};
use puppet_kicker::mcollective::stomp::{self, Frame, FrameReader, Limits, Version};
use puppet_kicker::mcollective::RpcReply;
use puppet_kicker::source::mcollective::{
    observation, observation_two_passes, observe_replies, observe_since, InnerBody, ReplyMemo,
};
use puppet_kicker::source::SourceRead;
use puppet_kicker::store::Builder;
use puppet_kicker::synthetic;
use puppet_kicker::time::now;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::Cursor;
use std::time::{Duration, Instant};

use report::{load_average, record};

const SERVERS: usize = 10_000;
const REQUEST_ID: &str = "0123456789abcdef0123456789abcdef";
const SEED: u64 = 1;
const PSK: &str = "bench-psk";
const SAMPLES: usize = 5;
const MIN_TIME: Duration = Duration::from_secs(3);

fn main() {
    report::print_machine("inventory");
    println!("Load average at the start: {}.\n", load_average());
    let started = Instant::now();
    let built_at = now();
    let nodes = synthetic::fleet(SERVERS, SEED, built_at);
    let mut stream = Vec::new();
    let (mut inner_bytes, mut outer_bytes) = (0usize, 0usize);
    for (i, node) in nodes.iter().enumerate() {
        let environment = node.environment.as_str();
        let inner = RpcStatus { statuscode: 0, statusmsg: "OK".into(), data: inventory(&node.facts, environment, i) }
            .encode()
            .unwrap();
        inner_bytes += inner.len();
        let outer = Reply {
            senderid: node.certname.clone(),
            requestid: REQUEST_ID.into(),
            senderagent: "rpcutil".into(),
            msgtime: built_at,
            body: inner.into(),
            signature: None,
        }
        .encode(PSK)
        .unwrap();
        outer_bytes += outer.len();
        stream.extend(framed(outer, i));
    }
    println!(
        "{SERVERS} inventory replies (synthetic fleet, seed {SEED}): {:.1} KB of Marshal each on average \
         ({:.1} KB facts+classes body), {:.1} MB of STOMP in all; generated in {:.1} s.\n",
        outer_bytes as f64 / SERVERS as f64 / 1e3,
        inner_bytes as f64 / SERVERS as f64 / 1e3,
        stream.len() as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    let limits = Limits::default();
    let client = Client::new(
        Config::resolve(
            "",
            None,
            &Overrides {
                no_config_file: true,
                psk: Some(PSK.into()),
                // Never connected to: the replies are read from the bytes.
                pool: Some(vec![BrokerHost {
                    host: "127.0.0.1".into(),
                    port: 61613,
                    user: String::new(),
                    password: String::new(),
                    tls: None,
                }]),
                ..Overrides::default()
            },
            None,
        )
        .unwrap(),
    );

    let mut samples: Vec<[Duration; 5]> = Vec::new();
    let mut new_samples: Vec<[Duration; 4]> = Vec::new();
    let mut scan_samples: Vec<Duration> = Vec::new();
    let mut two_pass_samples: Vec<Duration> = Vec::new();
    let mut md5_samples: Vec<[Duration; 2]> = Vec::new();
    let bench_start = Instant::now();
    let mut warm = true;
    while warm || samples.len() < SAMPLES || bench_start.elapsed() < MIN_TIME {
        let mut times = [Duration::ZERO; 5];

        let t = Instant::now();
        let mut reader = FrameReader::new(Cursor::new(stream.as_slice()), limits);
        let frames: Vec<Frame> = (0..SERVERS).map(|_| reader.read_frame().unwrap()).collect();
        times[0] = t.elapsed();

        let t = Instant::now();
        let outers: Vec<Reply> = frames
            .iter()
            .map(|f| Reply::decode_verified_via_values(&f.body, PSK, DecodeLimits::default()).unwrap())
            .collect();
        times[1] = t.elapsed();

        drop(frames);
        // The new path, from the same bytes: [received, inner on 1 thread, inner on 2, index].
        let mut new_times = [Duration::ZERO; 4];
        let t = Instant::now();
        // As the client receives a burst (frames read, checked in batches of
        // VERIFY_BATCH with their signatures together, kept by sender), then one
        // list of replies per server, as the source makes them.
        let received = client.collect_recorded(&stream, REQUEST_ID, "rpcutil", built_at, Some(SERVERS)).unwrap();
        let servers: Vec<Vec<(Reply, i64)>> =
            received.replies.into_iter().map(|reply| vec![(reply, built_at)]).collect();
        new_times[0] = t.elapsed();
        assert_eq!(servers.len(), SERVERS);
        let t = Instant::now();
        let mut one = SourceRead::default();
        let observed = observe_replies(&servers, "mcollective", DecodeLimits::default(), 1, &mut one.builder);
        new_times[1] = t.elapsed();
        assert_eq!(observed.observations.len(), SERVERS);
        drop((one, observed));
        let t = Instant::now();
        let mut two = SourceRead::default();
        let observed = observe_replies(&servers, "mcollective", DecodeLimits::default(), 2, &mut two.builder);
        two.observations = observed.observations;
        new_times[2] = t.elapsed();
        // Before the one pass, on the same replies: check, then read in place (1 thread).
        let t = Instant::now();
        let mut before = Builder::new();
        for s in &servers {
            let (reply, at) = &s[0];
            let body = InnerBody {
                sender: &reply.senderid,
                msgtime: reply.msgtime,
                bytes: &reply.body,
                limits: DecodeLimits::default(),
                at: *at,
                main_collective: "mcollective",
            };
            let o = observation_two_passes(body, &mut before);
            black_box(o.unwrap());
        }
        two_pass_samples.push(t.elapsed());
        drop(before);
        // Where the time goes: the MD5s (one at a time with md-5 and in lanes, side
        // by side), and the checking scan of the inner layer alone.
        let bodies: Vec<&[u8]> = servers.iter().map(|s| &s[0].0.body[..]).collect();
        let t = Instant::now();
        let one_at_a_time = md5_lanes::digests_with(Engine::OneAtATime, &bodies, PSK.as_bytes());
        let one_time = t.elapsed();
        let t = Instant::now();
        let in_lanes = md5_lanes::digests(&bodies, PSK.as_bytes());
        md5_samples.push([one_time, t.elapsed()]);
        assert!(one_at_a_time == in_lanes);
        drop(bodies);
        let t = Instant::now();
        for s in &servers {
            assert!(Doc::scan(&s[0].0.body, DecodeLimits::default()).is_ok());
        }
        scan_samples.push(t.elapsed());
        drop(servers);
        let t = Instant::now();
        let new_index = two.into_index(None, &BTreeMap::new(), "role", built_at);
        new_times[3] = t.elapsed();
        assert_eq!(black_box(&new_index).len(), SERVERS);
        drop(new_index);

        let t = Instant::now();
        let replies: Vec<RpcReply> =
            outers.into_iter().map(|reply| RpcReply::from_reply(reply, DecodeLimits::default()).unwrap()).collect();
        times[2] = t.elapsed();

        let t = Instant::now();
        let mut read = SourceRead::default();
        for reply in &replies {
            let o = observation(reply, built_at, "mcollective", &mut read.builder).unwrap();
            read.observations.push(o);
        }
        times[3] = t.elapsed();
        drop(replies);

        let t = Instant::now();
        let index = read.into_index(None, &BTreeMap::new(), "role", built_at);
        times[4] = t.elapsed();
        assert_eq!(black_box(&index).len(), SERVERS);
        drop(index);

        if warm {
            warm = false;
            scan_samples.clear();
            two_pass_samples.clear();
            md5_samples.clear();
        } else {
            samples.push(times);
            new_samples.push(new_times);
        }
    }

    let stages = [
        "1. read STOMP frames",
        "2. decode the outer Marshal, verify the PSK hash",
        "3. decode the inner Marshal (the inventory)",
        "4. to observations (facts from the Marshal values into the store)",
        "5. build the index (rows, order, role maps)",
    ];
    println!(
        "**The old path** (each reply decoded into Marshal values, then converted), {} samples; median per stage:\n",
        samples.len()
    );
    println!("| Stage | 10,000 replies | per reply |");
    println!("| --- | ---: | ---: |");
    let mut total = Duration::ZERO;
    for (i, stage) in stages.iter().enumerate() {
        let mut v: Vec<Duration> = samples.iter().map(|s| s[i]).collect();
        v.sort();
        let median = v[v.len() / 2];
        total += median;
        println!("| {stage} | {} | {} |", ms(median), us(median));
    }
    let mut totals: Vec<Duration> = samples.iter().map(|s| s.iter().sum()).collect();
    totals.sort();
    let median_total = totals[totals.len() / 2];
    println!("| **total** (median of sums) | **{}** | **{}** |", ms(median_total), us(median_total));
    println!(
        "\nThroughput: {:.0} MB/s of STOMP, {:.0} replies/s (sum of stage medians {}).",
        stream.len() as f64 / median_total.as_secs_f64() / 1e6,
        SERVERS as f64 / median_total.as_secs_f64(),
        ms(total)
    );

    let median = |v: Vec<Duration>| {
        let mut v = v;
        v.sort();
        v[v.len() / 2]
    };
    let new_stages = [
        "1'+2'. received as the client receives a burst: frames read, the outer layers read in place and their PSK checked in batches, kept by sender",
        "3'+4'. the inner layer read in place into the store, 1 thread",
        "3'+4'. the inner layer read in place into the store, 2 threads",
        "5'. build the index",
    ];
    println!();
    println!("**What a refresh does** (the borrowed Marshal reader), the same samples; median per stage:\n");
    println!("| Stage | 10,000 replies | per reply |");
    println!("| --- | ---: | ---: |");
    for (i, stage) in new_stages.iter().enumerate() {
        let m = median(new_samples.iter().map(|s| s[i]).collect());
        println!("| {stage} | {} | {} |", ms(m), us(m));
    }
    let new_total = |threads_stage: usize| median(new_samples.iter().map(|n| n[0] + n[threads_stage] + n[3]).collect());
    println!("| **total, 1 thread** (median of sums) | **{}** | **{}** |", ms(new_total(1)), us(new_total(1)));
    println!("| **total, 2 threads** (median of sums) | **{}** | **{}** |", ms(new_total(2)), us(new_total(2)));
    record("mcollective_full_1", new_total(1).as_secs_f64() * 1e9);
    record("mcollective_full_2", new_total(2).as_secs_f64() * 1e9);
    record("mcollective_old", median_total.as_secs_f64() * 1e9);
    println!();
    println!("- old path {}, what a refresh does {} (2 threads);", ms(median_total), ms(new_total(2)));
    let scan = median(scan_samples.clone());
    println!("- the checking scan of the inner layers alone: {};", ms(scan));
    println!(
        "- MD5 of the 10,000 bodies (in 2', in batches of {VERIFY_BATCH}): md-5 one at a time {}, all in {} lanes {};",
        ms(median(md5_samples.iter().map(|s| s[0]).collect())),
        Engine::detected().lanes(),
        ms(median(md5_samples.iter().map(|s| s[1]).collect()))
    );
    let two_passes = median(two_pass_samples.clone());
    println!(
        "- 3'+4' as before, in two passes (the body checked, then read into the store), 1 thread, the same samples: {} ({}).",
        ms(two_passes),
        us(two_passes)
    );

    incremental(&client, &stream, built_at);
}

/// A refresh after one in which every server answered: 10 servers' inventories
/// changed. The outer layer (PSK included) is read as replies arrive, during the
/// network wait; what comes after it is the CPU the target counts.
fn incremental(client: &Client, stream: &[u8], built_at: i64) {
    const CHANGED: usize = 10;
    let limits = DecodeLimits::default();
    // Received as the client receives them, one list of replies per server.
    let replies = |stream: &[u8]| -> Vec<Vec<(Reply, i64)>> {
        let received = client.collect_recorded(stream, REQUEST_ID, "rpcutil", built_at, Some(SERVERS)).unwrap();
        received.replies.into_iter().map(|reply| vec![(reply, built_at)]).collect()
    };
    let first = replies(stream);
    let mut later_stream = Vec::new();
    for (i, server) in first.iter().enumerate() {
        let mine = &server[0].0;
        let outer = if i % (SERVERS / CHANGED) == 0 {
            // Another server's inventory under this server's name: its facts all changed.
            let body = first[(i + 1) % SERVERS][0].0.body.clone();
            Reply { body, ..mine.clone() }.encode(PSK).unwrap()
        } else {
            mine.encode(PSK).unwrap()
        };
        later_stream.extend(framed(outer, i));
    }

    let mut samples: Vec<[Duration; 4]> = Vec::new();
    for sample in 0..=SAMPLES {
        // The refresh before: every server decoded.
        let mut read = SourceRead::default();
        let (observed, memo, _) =
            observe_since(&first, "mcollective", limits, 2, &mut read.builder, &ReplyMemo::default());
        read.observations = observed.observations;
        let (index, tables) = read.into_index_and_tables(None, &BTreeMap::new(), "role", built_at);

        let mut times = [Duration::ZERO; 4];
        let t = Instant::now();
        let later = replies(&later_stream);
        times[0] = t.elapsed();
        let t = Instant::now();
        let mut next = SourceRead { builder: Builder::resume(index.store(), tables), ..SourceRead::default() };
        times[1] = t.elapsed();
        let t = Instant::now();
        let (observed, _, reused) = observe_since(&later, "mcollective", limits, 2, &mut next.builder, &memo);
        next.observations = observed.observations;
        times[2] = t.elapsed();
        assert_eq!(reused, SERVERS - CHANGED);
        let t = Instant::now();
        let index = next.into_index(Some(&index), &BTreeMap::new(), "role", built_at);
        times[3] = t.elapsed();
        assert_eq!(black_box(&index).len(), SERVERS);
        if sample > 0 {
            samples.push(times);
        }
    }
    let median = |i: usize| {
        let mut v: Vec<Duration> = samples.iter().map(|s| s[i]).collect();
        v.sort();
        v[v.len() / 2]
    };
    println!();
    println!(
        "**Incremental: {CHANGED} of {SERVERS} inventories changed**, {} samples; median per stage:\n",
        samples.len()
    );
    println!("| Stage | time |");
    println!("| --- | ---: |");
    println!("| received as the client receives them (done as they arrive, in the network wait) | {} |", ms(median(0)));
    println!("| resume the builder on the last index's store | {} |", ms(median(1)));
    println!(
        "| know each unchanged body by its signature, decode the {CHANGED} changed into the store | {} |",
        ms(median(2))
    );
    println!("| build the index | {} |", ms(median(3)));
    let mut beyond: Vec<Duration> = samples.iter().map(|s| s[1] + s[2] + s[3]).collect();
    beyond.sort();
    println!("| **beyond the network wait** (median of sums) | **{}** |", ms(beyond[beyond.len() / 2]));
    record("mcollective_incremental", beyond[beyond.len() / 2].as_secs_f64() * 1e9);
    println!("\nLoad average at the end: {}.", load_average());
}

/// `rpcutil#inventory`'s data for one server, as mcollective 2.12 sends it.
fn inventory(facts: &serde_json::Map<String, Json>, environment: &str, i: usize) -> Value {
    let strings = |items: &[&str]| Value::Array(items.iter().map(|s| Value::str(*s)).collect());
    let role = facts.get("role").and_then(Json::as_str).unwrap_or("node");
    let mut classes = vec!["settings".to_string(), format!("role::{role}"), "profile::base".into()];
    classes.extend((0..37).map(|c| format!("profile::component{}::part{}", c, (i + c) % 7)));
    Value::Hash(vec![
        (Value::sym("agents"), strings(&["discovery", "package", "puppet", "rpcutil", "service"])),
        (Value::sym("facts"), stringified(&Json::Object(facts.clone()))),
        (Value::sym("classes"), Value::Array(classes.into_iter().map(Value::str).collect())),
        (Value::sym("version"), Value::str("2.12.5")),
        (Value::sym("data_plugins"), strings(&["agent", "collective", "fact", "fstatinfo", "puppet", "resource"])),
        (Value::sym("main_collective"), Value::str("mcollective")),
        (Value::sym("collectives"), strings(&["mcollective", environment])),
    ])
}

/// mcollective's `normalize_facts`: Arrays and Hashes kept, every other value `to_s`.
fn stringified(v: &Json) -> Value {
    match v {
        Json::Array(items) => Value::Array(items.iter().map(stringified).collect()),
        Json::Object(map) => Value::Hash(map.iter().map(|(k, v)| (Value::str(k.as_str()), stringified(v))).collect()),
        Json::Null => Value::str(""),
        Json::String(s) => Value::str(s.as_str()),
        other => Value::str(other.to_string()),
    }
}

/// `outer` in a MESSAGE frame, as the broker delivers the `i`th reply.
fn framed(outer: Vec<u8>, i: usize) -> Vec<u8> {
    let frame = Frame::new("MESSAGE")
        .header("destination", "/reply-queue/amq.gen-bench")
        .header("message-id", format!("T_/reply-queue/amq.gen-bench@@session-1@@{i}"))
        .header("content-length", outer.len().to_string())
        .body(outer);
    stomp::encode(&frame, Version::V1_0).unwrap()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6 / SERVERS as f64)
}
