//! `cargo bench --bench puppetdb` with `PK_BENCH_PUPPETDB_URL` (and `_CERT`, `_KEY`,
//! `_CA`: a client certificate PuppetDB accepts): against that real PuppetDB, as
//! bench/puppetdb runs it. Measures, side by side in one run:
//! - a full refresh through the core (listing, pages, decode, index);
//! - PuppetDB's own share: the same requests with the answers read and discarded;
//! - our share: decoding the same answers into a store, no network;
//! - other query shapes PuppetDB could be asked (one whole inventory, other page sizes,
//!   two pages in flight), the answers discarded;
//! - an incremental refresh after replace_facts for 10 nodes (waited for until PuppetDB
//!   lists them), with the cost of each of its requests alone.

use puppet_kicker::config::{Config, PuppetSettings};
use puppet_kicker::source::puppetdb::client::{Client, Session};
use puppet_kicker::source::puppetdb::PuppetdbSettings;
use puppet_kicker::source::puppetdb::{decode, query, PuppetdbSource};
use puppet_kicker::source::Source;
use puppet_kicker::store::Builder;
use puppet_kicker::time::now;
use puppet_kicker::tls_files as tls;
use puppet_kicker::Index;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const SAMPLES: usize = 5;
/// The page sizes a full refresh through the core is timed at, side by side.
const FULL_PAGE_SIZES: [usize; 2] = [500, 250];
const CHANGED: usize = 10;
const ROLE_FACT: &str = "trusted.extensions.pp_role";
/// The bound on one answer when PuppetDB is asked for everything at once.
const WHOLE_ANSWER_BYTES: usize = 1 << 30;

struct Real {
    settings: PuppetdbSettings,
    url: String,
    agent: ureq::Agent,
}

/// The real PuppetDB given by the environment, if any.
pub fn from_env() -> Option<(String, [PathBuf; 3])> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let url = var("PK_BENCH_PUPPETDB_URL")?;
    let file = |k: &str| PathBuf::from(var(k).unwrap_or_else(|| panic!("{k} must be set with PK_BENCH_PUPPETDB_URL")));
    Some((url, [file("PK_BENCH_PUPPETDB_CERT"), file("PK_BENCH_PUPPETDB_KEY"), file("PK_BENCH_PUPPETDB_CA")]))
}

pub fn run(url: String, [cert, key, ca]: [PathBuf; 3]) {
    let puppet = PuppetSettings {
        hostcert: Some(cert.clone()),
        hostprivkey: Some(key.clone()),
        localcacert: Some(ca.clone()),
        ..Default::default()
    };
    let mut settings = Config::defaults(&puppet).sources.puppetdb;
    settings.server_urls = Some(vec![url.clone()]);
    let files = tls::TlsFiles { prefix: "puppetdb", check_name: true, ca, cert, key, crl: None };
    let tls = tls::client_config(&files).expect("the TLS files");
    let agent = ureq::AgentBuilder::new().tls_config(tls).timeout(Duration::from_secs(60)).build();
    let real = Real { settings, url, agent };
    println!("A real PuppetDB at {} (page_size {}); medians:\n", real.url, real.settings.page_size);

    let (source, mut index) = real.full_refreshes();
    real.shares();
    for round in 0..=SAMPLES {
        index = real.incremental(&source, index, round);
    }
    print_incremental();
}

fn refresh(source: &PuppetdbSource, previous: Option<&Index>) -> Index {
    let mut read = source.refresh(previous, now(), &Default::default()).expect("a refresh");
    let environments = read.environments.take().unwrap_or_default();
    let (index, base) = read.into_index_and_base(previous, &environments, ROLE_FACT, now());
    source.carry(base);
    index
}

impl Real {
    fn client(&self, max_answer_bytes: usize) -> Client {
        let files = tls::TlsFiles {
            prefix: "puppetdb",
            check_name: true,
            ca: self.settings.ca.clone().unwrap(),
            cert: self.settings.cert.clone().unwrap(),
            key: self.settings.key.clone().unwrap(),
            crl: None,
        };
        let tls = tls::client_config(&files).unwrap();
        Client::new(std::slice::from_ref(&self.url), tls, Duration::from_secs(self.settings.timeout), max_answer_bytes)
    }

    /// One warm-up, then SAMPLES full refreshes at each page size of
    /// [`FULL_PAGE_SIZES`], taken in turn, each by a new source.
    fn full_refreshes(&self) -> (PuppetdbSource, Index) {
        let mut samples = vec![Vec::new(); FULL_PAGE_SIZES.len()];
        let mut last = None;
        for sample in 0..=SAMPLES {
            for (i, page_size) in FULL_PAGE_SIZES.iter().enumerate() {
                let settings = PuppetdbSettings { page_size: *page_size, ..self.settings.clone() };
                let source = PuppetdbSource::open(&settings).unwrap();
                let t = Instant::now();
                let index = refresh(&source, None);
                if sample > 0 {
                    samples[i].push(t.elapsed());
                }
                last = Some((PuppetdbSource::open(&self.settings).unwrap(), index));
            }
        }
        let (source, _) = last.unwrap();
        // The source kept for the incremental rounds: its own full read first.
        let index = refresh(&source, None);
        for (page_size, samples) in FULL_PAGE_SIZES.iter().zip(&samples) {
            report(&format!("full refresh through the core, {} servers, pages of {page_size}", index.len()), samples);
        }
        (source, index)
    }

    /// PuppetDB's share and ours of a full read, and the other shapes of the same read.
    fn shares(&self) {
        let client = self.client(self.settings.max_page_bytes);
        let mut session = client.session();
        let names = listed_names(&mut session);
        let page = self.settings.page_size;
        let mut pages_answers = Vec::new();
        let mut listing = Vec::new();
        let mut sequential = Vec::new();
        for sample in 0..=SAMPLES {
            let t = Instant::now();
            listed_names(&mut session);
            let listed = t.elapsed();
            let answers: Vec<Vec<u8>> =
                names.chunks(page).map(|p| session.query(&query::inventory_of(p)).unwrap().bytes).collect();
            if sample > 0 {
                listing.push(listed);
                sequential.push(t.elapsed());
            }
            pages_answers = answers;
        }
        report("  PuppetDB's share: the listing alone", &listing);
        report(
            &format!("  PuppetDB's share: listing + {} pages of {page}, read and discarded", pages_answers.len()),
            &sequential,
        );
        let mb = pages_answers.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
        let mut decoding = Vec::new();
        for _ in 0..=SAMPLES {
            let t = Instant::now();
            let mut builder = Builder::new();
            let (mut entries, mut warnings) = (Vec::new(), Vec::new());
            for answer in &pages_answers {
                decode::inventory(answer, &mut builder, &mut entries, &mut warnings).unwrap();
            }
            assert_eq!(entries.len(), names.len());
            decoding.push(t.elapsed());
        }
        decoding.remove(0);
        report(&format!("  our share: decoding those {mb:.1} MB into a store (no network)"), &decoding);

        println!("- query shapes, answers read and discarded (listing not included):");
        for size in [100, 250, 500, 1000, 2500] {
            let samples = sampled(|| {
                for p in names.chunks(size) {
                    session.query(&query::inventory_of(p)).unwrap();
                }
            });
            report(&format!("  certname in [...] pages of {size}, one at a time"), &samples);
        }
        let samples = sampled(|| two_in_flight(&client, &names, page));
        report(&format!("  certname in [...] pages of {page}, two in flight"), &samples);
        let whole = self.client(WHOLE_ANSWER_BYTES);
        let all = format!("inventory[{}] {{}}", query::INVENTORY_FIELDS);
        let samples = sampled(|| {
            whole.session().query(&all).unwrap();
        });
        report("  one request: inventory[...] {} (unbounded answer)", &samples);
        let samples = sampled(|| {
            let mut s = whole.session();
            for offset in (0..names.len()).step_by(page) {
                let pql = format!(
                    "inventory[{}] {{ order by certname limit {page} offset {offset} }}",
                    query::INVENTORY_FIELDS
                );
                s.query(&pql).unwrap();
            }
        });
        report(&format!("  order by certname limit {page} offset k, one at a time"), &samples);
    }

    /// replace_facts for CHANGED nodes, waits until PuppetDB lists their new
    /// timestamps, then times an incremental refresh and each of its requests alone.
    fn incremental(&self, source: &PuppetdbSource, index: Index, round: usize) -> Index {
        let client = self.client(self.settings.max_page_bytes);
        let mut session = client.session();
        let names = listed_names(&mut session);
        let chosen: Vec<&str> = (0..CHANGED).map(|i| names[(round * 997 + i * 131) % names.len()].as_str()).collect();
        let mut chosen_sorted = chosen.clone();
        chosen_sorted.sort_unstable();
        let before = session.query(&query::inventory_of(&chosen_sorted)).unwrap().bytes;
        let before: Vec<Value> = serde_json::from_slice(&before).unwrap();
        for entry in &before {
            self.replace_facts(entry, round);
        }
        let old: Vec<String> = before.iter().map(|e| e["timestamp"].as_str().unwrap().to_string()).collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now_listed = session.query(&stamps_of(&chosen_sorted)).unwrap().bytes;
            let now_listed = decode::listing(&now_listed).unwrap();
            if now_listed.len() == CHANGED && now_listed.iter().zip(&old).all(|(l, o)| &l.timestamp != o) {
                break;
            }
            assert!(Instant::now() < deadline, "PuppetDB did not store the replace_facts within 120 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let t = Instant::now();
        let next = refresh(source, Some(&index));
        let elapsed = t.elapsed();
        assert_eq!(next.len(), index.len());
        for name in &chosen {
            let (old, new) = (index.by_certname(name).unwrap(), next.by_certname(name).expect("a changed server"));
            assert!(new.timestamp() > old.timestamp(), "{name} not refreshed");
        }
        // Each request of that refresh alone, as it asked them.
        let since = query::timestamp(source_newest(&next).saturating_sub(self.settings.overlap as i64));
        let mut timed = |pql: &str| {
            let t = Instant::now();
            session.query(pql).unwrap();
            t.elapsed()
        };
        let parts =
            [timed(&query::listing(Some(&since))), timed(&query::gone()), timed(&query::inventory_of(&chosen_sorted))];
        if round > 0 {
            INCREMENTAL.with(|s| s.borrow_mut().push((elapsed, parts)));
        }
        next
    }

    fn replace_facts(&self, entry: &Value, round: usize) {
        let certname = entry["certname"].as_str().unwrap();
        let mut values = entry["facts"].clone();
        values["uptime_seconds"] = json!(1_000_000 + round);
        values["trusted"] = entry["trusted"].clone();
        let body = json!({
            "certname": certname,
            "environment": entry["environment"],
            "producer_timestamp": query::timestamp(now()),
            "producer": "pk-bench",
            "values": values,
        });
        self.agent
            .post(&format!("{}/pdb/cmd/v1", self.url))
            .query("command", "replace_facts")
            .query("version", "5")
            .query("certname", certname)
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
            .expect("replace_facts accepted");
    }
}

thread_local! {
    static INCREMENTAL: std::cell::RefCell<Vec<(Duration, [Duration; 3])>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn print_incremental() {
    INCREMENTAL.with(|s| {
        let s = s.borrow();
        report(&format!("incremental refresh, {CHANGED} changed"), &s.iter().map(|x| x.0).collect::<Vec<_>>());
        let names = ["listing since newest - overlap", "inactive nodes", "the 10 entries"];
        for (i, name) in names.iter().enumerate() {
            report(&format!("  PuppetDB alone: {name}"), &s.iter().map(|x| x.1[i]).collect::<Vec<_>>());
        }
    });
}

/// The newest facts timestamp the index holds (what the source's state keeps).
fn source_newest(index: &Index) -> i64 {
    index.servers().map(|s| s.timestamp()).max().unwrap_or(0)
}

fn stamps_of(certnames: &[&str]) -> String {
    let names: Vec<String> = certnames.iter().map(|c| query::quoted(c)).collect();
    format!("inventory[certname, timestamp] {{ certname in [{}] order by certname }}", names.join(", "))
}

fn listed_names(session: &mut Session) -> Vec<String> {
    let answer = session.query(&query::listing(None)).unwrap();
    let mut names: Vec<String> = decode::listing(&answer.bytes).unwrap().into_iter().map(|l| l.certname).collect();
    names.sort_unstable();
    names
}

fn two_in_flight(client: &Client, names: &[String], page: usize) {
    let pages: Vec<&[String]> = names.chunks(page).collect();
    std::thread::scope(|scope| {
        for half in 0..2 {
            let pages = &pages;
            scope.spawn(move || {
                let mut session = client.session();
                for p in pages.iter().skip(half).step_by(2) {
                    session.query(&query::inventory_of(p)).unwrap();
                }
            });
        }
    });
}

fn sampled(mut f: impl FnMut()) -> Vec<Duration> {
    f();
    (0..SAMPLES)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn report(what: &str, samples: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut sorted = samples.to_vec();
    sorted.sort();
    // A Markdown list item, nested as far as `what` is indented.
    let depth = what.len() - what.trim_start().len();
    println!(
        "{}- {}: median {:.1} ms ({} samples: {})",
        " ".repeat(depth),
        what.trim_start(),
        ms(sorted[sorted.len() / 2]),
        samples.len(),
        samples.iter().map(|d| format!("{:.1}", ms(*d))).collect::<Vec<_>>().join(", ")
    );
}
