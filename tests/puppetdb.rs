//! `source: puppetdb` against an in-test PuppetDB: an HTTPS server on 127.0.0.1
//! (rustls, a client certificate required, CAs made per test) answering the
//! source's PQL from a fleet the test changes. Covers TLS (a wrong CA refused),
//! a 5xx, a timeout, the second URL used when the first is down, paging, a
//! malformed answer, incremental refreshes equal to full reads, and the service:
//! the last snapshot served while PuppetDB is down, a cold start failing with
//! the reason.

#[path = "support/fake_puppetdb.rs"]
mod fake_puppetdb;

use fake_puppetdb::{
    quoted_strings, server_config, server_config_presenting, server_config_trusting, Behaviour, Ca, Dir, FakePuppetdb,
    PdbNode,
};
use puppet_kicker::config::{Config, PuppetSettings};
use puppet_kicker::index::RoleSelector;
use puppet_kicker::service::IndexService;
use puppet_kicker::source::puppetdb::PuppetdbSettings;
use puppet_kicker::source::puppetdb::{query, PuppetdbSource};
use puppet_kicker::source::Source;
use puppet_kicker::{Freshness, Index, Node};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::time::Duration;

/// A master's certificate, key and CA as Puppet would give them, in `dir`.
fn puppet_settings(dir: &Dir, ca: &Ca) -> PuppetSettings {
    let (cert, key) = ca.issue(&["master.example.com"]);
    PuppetSettings {
        confdir: dir.0.join("etc"),
        vardir: dir.0.join("var"),
        hostcert: Some(dir.write("master.pem", &cert)),
        hostprivkey: Some(dir.write("master.key", &key)),
        localcacert: Some(dir.write("ca.pem", &ca.cert.pem())),
        hostcrl: Some(dir.0.join("no-crl.pem")),
        ..Default::default()
    }
}

fn settings(puppet: &PuppetSettings, urls: &[&str]) -> PuppetdbSettings {
    let mut s = Config::defaults(puppet).sources.puppetdb;
    s.server_urls = Some(urls.iter().map(|u| u.to_string()).collect());
    s.timeout = 2;
    s
}

fn node(role: &str, timestamp: i64) -> PdbNode {
    PdbNode {
        timestamp,
        environment: Some("production".into()),
        facts: json!({"role": role, "os": {"family": "Debian"}}),
        trusted: json!({"extensions": {"pp_role": role}, "authenticated": "remote"}),
        deactivated: None,
        expired: None,
    }
}

/// One refresh, its index built and what it leaves carried for the next.
fn refresh(source: &PuppetdbSource, previous: Option<&Index>, role_fact: &str) -> puppet_kicker::Result<Index> {
    let now = puppet_kicker::time::now();
    let mut read = source.refresh(previous, now, &Default::default())?;
    let environments = read.environments.take().unwrap_or_default();
    let (index, base) = read.into_index_and_base(previous, &environments, role_fact, now);
    source.carry(base);
    Ok(index)
}

fn servers(index: &Index) -> Vec<Node> {
    (0..index.len() as u32).map(|p| index.server(p).to_node()).collect()
}

fn with_role(index: &Index, role: &str) -> Vec<String> {
    let fresh = Freshness { now: puppet_kicker::time::now(), max_age: 86_400 };
    let positions = index.with_role(&RoleSelector::parse(&[role]).unwrap(), "production", fresh);
    positions.into_iter().map(|p| index.server(p).certname().to_string()).collect()
}

/// The certnames whose facts a query of the run asked for.
fn fetched(asked: &[String]) -> Vec<String> {
    let pages = asked.iter().filter(|q| q.starts_with(&format!("inventory[{}]", query::INVENTORY_FIELDS)));
    pages.flat_map(|q| quoted_strings(q)).collect()
}

#[test]
fn a_full_read_over_verified_tls_pages_and_adds_trusted_facts() {
    let dir = Dir::new("full");
    let ca = Ca::new("Puppet CA: test");
    let pdb = FakePuppetdb::start(server_config(&ca));
    let now = puppet_kicker::time::now();
    for i in 0..7 {
        pdb.set(&format!("web{i}.example.com"), node(if i < 4 { "web" } else { "db" }, now - 100 + i));
    }
    let mut only_trusted = node("ignored", now);
    only_trusted.facts = json!({"kernel": "Linux"});
    only_trusted.trusted = json!({"extensions": {"pp_role": "cache"}});
    pdb.set("cache1.example.com", only_trusted);
    let mut other_env = node("web", now);
    other_env.environment = Some("staging".into());
    pdb.set("stage1.example.com", other_env);
    let mut facts_env = node("web", now);
    facts_env.facts = json!({"environment": "dev"});
    pdb.set("dev1.example.com", facts_env);

    let puppet = puppet_settings(&dir, &ca);
    let mut s = settings(&puppet, &[&pdb.url]);
    s.page_size = 3;
    let source = PuppetdbSource::open(&s).unwrap();
    let index = refresh(&source, None, "trusted.extensions.pp_role").unwrap();
    assert_eq!(index.len(), 10);
    let asked = pdb.asked();
    assert_eq!(asked[0], "inventory[certname, timestamp] {}");
    assert_eq!(asked.len(), 1 + 4, "a listing, then pages of 3: {asked:?}");
    assert_eq!(fetched(&asked).len(), 10);

    let web0 = index.by_certname("web0.example.com").unwrap().to_node();
    assert_eq!(
        Value::Object(web0.facts),
        json!({"role": "web", "os": {"family": "Debian"},
               "trusted": {"extensions": {"pp_role": "web"}, "authenticated": "remote"}})
    );
    assert_eq!(web0.timestamp, now - 100);
    assert_eq!(with_role(&index, "cache"), ["cache1.example.com"], "a role only in a trusted extension");
    // The facts' environment first, then PuppetDB's recorded one.
    assert_eq!(index.by_certname("dev1.example.com").unwrap().environment(), "dev");
    assert_eq!(index.by_certname("stage1.example.com").unwrap().environment(), "staging");
    assert_eq!(with_role(&index, "web").len(), 4);

    // Pages asked one at a time or several at once: decoded in page order, the same
    // servers and the same store, id for id.
    let ids = |index: &Index| (0..index.len()).map(|i| index.rows().facts[i]).collect::<Vec<_>>();
    for requests_in_flight in [1, 3, 8] {
        let source = PuppetdbSource::open(&PuppetdbSettings { requests_in_flight, ..s.clone() }).unwrap();
        let again = refresh(&source, None, "trusted.extensions.pp_role").unwrap();
        assert_eq!(servers(&again), servers(&index), "{requests_in_flight} in flight");
        assert_eq!(ids(&again), ids(&index), "{requests_in_flight} in flight: the same ids");
        assert_eq!(again.store().values(), index.store().values(), "{requests_in_flight} in flight");
    }

    // `puppet kicker refresh --wait` counts the servers decoded, page by page.
    let progress = std::sync::atomic::AtomicUsize::new(0);
    let read = source.refresh(None, now, &progress).unwrap();
    assert_eq!(progress.into_inner(), read.observations.len());
    assert_eq!(read.observations.len(), 10);
}

#[test]
fn a_certificate_from_another_ca_is_refused_naming_the_url() {
    let dir = Dir::new("wrong-ca");
    let (ca, other) = (Ca::new("Puppet CA: right"), Ca::new("Puppet CA: other"));
    let pdb = FakePuppetdb::start(server_config(&other));
    let source = PuppetdbSource::open(&settings(&puppet_settings(&dir, &ca), &[&pdb.url])).unwrap();
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&pdb.url), "{error}");
    assert!(error.contains("UnknownIssuer (PuppetDB's certificate is not signed by the CA of puppetdb.ca)"), "{error}");

    let refusing = FakePuppetdb::start(server_config_trusting(&ca, &other));
    let source = PuppetdbSource::open(&settings(&puppet_settings(&dir, &ca), &[&refusing.url])).unwrap();
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&refusing.url) && error.contains("puppetdb.cert"), "{error}");
}

#[test]
fn a_revoked_server_certificate_is_refused_when_the_crl_exists() {
    let dir = Dir::new("crl");
    let ca = Ca::new("Puppet CA: crl");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let serial = rcgen::SerialNumber::from_slice(
        x509_serial(&CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()).as_slice(),
    );
    let crl = rcgen::CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2020, 1, 1),
        next_update: rcgen::date_time_ymd(2099, 1, 1),
        crl_number: rcgen::SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: vec![rcgen::RevokedCertParams {
            serial_number: serial,
            revocation_time: rcgen::date_time_ymd(2021, 1, 1),
            reason_code: None,
            invalidity_date: None,
        }],
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&ca.cert, &ca.key)
    .unwrap();
    let pdb = FakePuppetdb::start(server_config_presenting(&cert, &key, &ca));
    pdb.set("a.example.com", node("web", puppet_kicker::time::now()));
    let mut puppet = puppet_settings(&dir, &ca);
    // Without the CRL file the certificate is trusted.
    let source = PuppetdbSource::open(&settings(&puppet, &[&pdb.url])).unwrap();
    assert_eq!(refresh(&source, None, "role").unwrap().len(), 1);
    // A CRL written while the source runs (Puppet's hostcrl, renewed) is used from the
    // next refresh on.
    puppet.hostcrl = Some(dir.0.join("crl.pem"));
    let source = PuppetdbSource::open(&settings(&puppet, &[&pdb.url])).unwrap();
    assert_eq!(refresh(&source, None, "role").unwrap().len(), 1, "no CRL file yet");
    dir.write("crl.pem", &crl.pem().unwrap());
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&pdb.url) && error.contains("revoked by puppetdb.crl"), "{error}");
    let source = PuppetdbSource::open(&settings(&puppet, &[&pdb.url])).unwrap();
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&pdb.url) && error.contains("revoked by puppetdb.crl"), "{error}");
}

/// The serial number of a DER certificate (tbsCertificate's second field).
fn x509_serial(der: &CertificateDer) -> Vec<u8> {
    let bytes = der.as_ref();
    // SEQUENCE { SEQUENCE (tbs) { [0] version, INTEGER serial, ...
    let mut at = 0;
    let header = |at: &mut usize| -> (u8, usize) {
        let tag = bytes[*at];
        let mut len = bytes[*at + 1] as usize;
        *at += 2;
        if len & 0x80 != 0 {
            let n = len & 0x7f;
            len = bytes[*at..*at + n].iter().fold(0, |acc, b| acc << 8 | *b as usize);
            *at += n;
        }
        (tag, len)
    };
    header(&mut at);
    header(&mut at);
    let (tag, len) = header(&mut at);
    if tag == 0xa0 {
        at += len;
    }
    let (tag, len) = header(&mut at);
    assert_eq!(tag, 0x02);
    bytes[at..at + len].to_vec()
}

#[test]
fn failures_name_the_url_and_the_second_url_answers_when_the_first_is_down() {
    let dir = Dir::new("failures");
    let ca = Ca::new("Puppet CA: failures");
    let pdb = FakePuppetdb::start(server_config(&ca));
    pdb.set("a.example.com", node("web", puppet_kicker::time::now()));
    let puppet = puppet_settings(&dir, &ca);
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port())
    };

    let source = PuppetdbSource::open(&settings(&puppet, &[&closed, &pdb.url])).unwrap();
    assert_eq!(refresh(&source, None, "role").unwrap().len(), 1, "the second URL answered");

    let source = PuppetdbSource::open(&settings(&puppet, &[&closed])).unwrap();
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&closed) && error.to_lowercase().contains("refused"), "{error}");

    let source = PuppetdbSource::open(&settings(&puppet, &[&pdb.url])).unwrap();
    pdb.behave(Behaviour::Status(503));
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&format!("{}: HTTP 503", pdb.url)) && error.contains("PuppetDB is starting"), "{error}");

    pdb.behave(Behaviour::Garbage);
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(error.contains(&format!("PuppetDB {} gave a malformed answer", pdb.url)), "{error}");

    pdb.behave(Behaviour::Hang);
    let started = std::time::Instant::now();
    let error = refresh(&source, None, "role").unwrap_err().to_string();
    assert!(started.elapsed() < Duration::from_secs(4), "bounded by puppetdb.timeout (2 s)");
    assert!(error.contains(&pdb.url) && error.contains("timed out"), "{error}");

    pdb.behave(Behaviour::Answer);
    let mut small = settings(&puppet, &[&pdb.url]);
    small.max_page_bytes = 40;
    let error = refresh(&PuppetdbSource::open(&small).unwrap(), None, "role").unwrap_err().to_string();
    assert!(error.contains("larger than puppetdb.max_page_bytes (40 bytes)"), "{error}");
}

/// A chain of incremental refreshes gives, step after step, the index a full read
/// of the same PuppetDB gives; and asks only for the nodes that changed.
#[test]
fn incremental_refreshes_give_what_a_full_read_gives() {
    let dir = Dir::new("incremental");
    let ca = Ca::new("Puppet CA: incremental");
    let pdb = FakePuppetdb::start(server_config(&ca));
    let t0 = puppet_kicker::time::now() - 3600;
    for i in 0..12 {
        pdb.set(&format!("n{i:02}.example.com"), node(["web", "db", "lb"][i % 3], t0 + i as i64));
    }
    let mut s = settings(&puppet_settings(&dir, &ca), &[&pdb.url]);
    s.page_size = 5;
    let role_fact = "trusted.extensions.pp_role";
    let source = PuppetdbSource::open(&s).unwrap();
    let mut index = refresh(&source, None, role_fact).unwrap();
    assert_eq!(fetched(&pdb.asked()).len(), 12);

    let check = |index: &Index, step: &str| {
        let full = refresh(&PuppetdbSource::open(&s).unwrap(), None, role_fact).unwrap();
        pdb.asked();
        assert_eq!(servers(index), servers(&full), "{step}");
        for role in ["web", "db", "lb", "cache"] {
            assert_eq!(with_role(index, role), with_role(&full, role), "{step}: {role}");
        }
    };
    type Step = (&'static str, Box<dyn Fn(&FakePuppetdb)>, &'static [&'static str]);
    let steps: Vec<Step> = vec![
        ("nothing changed", Box::new(|_| {}), &[]),
        (
            "two changed, one added, one deactivated, one expired",
            Box::new(move |pdb| {
                pdb.edit("n01.example.com", |n| {
                    n.timestamp = t0 + 100;
                    n.trusted = json!({"extensions": {"pp_role": "cache"}});
                });
                pdb.edit("n02.example.com", |n| {
                    n.timestamp = t0 + 101;
                    n.facts = json!({"role": "db", "environment": "staging"});
                });
                pdb.set("n99.example.com", node("web", t0 + 102));
                pdb.edit("n03.example.com", |n| n.deactivated = Some(t0 + 103));
                pdb.edit("n04.example.com", |n| n.expired = Some(t0 + 103));
            }),
            &["n01.example.com", "n02.example.com", "n99.example.com"],
        ),
        (
            "committed out of order, within the overlap",
            Box::new(move |pdb| pdb.edit("n05.example.com", |n| n.timestamp = t0 + 90)),
            &["n05.example.com"],
        ),
        (
            "reactivated with new facts, and an environment moved",
            Box::new(move |pdb| {
                pdb.edit("n03.example.com", |n| {
                    n.deactivated = None;
                    n.timestamp = t0 + 110;
                });
                pdb.edit("n06.example.com", |n| {
                    n.environment = Some("staging".into());
                    n.timestamp = t0 + 111;
                });
            }),
            &["n03.example.com", "n06.example.com"],
        ),
    ];
    for (step, change, expected) in steps {
        change(&pdb);
        let next = refresh(&source, Some(&index), role_fact).unwrap();
        let asked = pdb.asked();
        let mut got = fetched(&asked);
        got.sort();
        // Within the overlap, nodes already held at their timestamp are not fetched again.
        assert_eq!(got, expected, "{step}: {asked:?}");
        assert!(asked.iter().any(|q| q.starts_with("nodes[")), "{step}: gone nodes asked for");
        check(&next, step);
        index = next;
    }
    assert!(index.by_certname("n04.example.com").is_none());
    assert_eq!(index.by_certname("n06.example.com").unwrap().environment(), "staging");
    assert_eq!(with_role(&index, "cache"), ["n01.example.com"]);

    // Past puppetdb.full_refresh, a full read again.
    let mut every_time = s.clone();
    every_time.full_refresh = 0;
    let source = PuppetdbSource::open(&every_time).unwrap();
    let first = refresh(&source, None, role_fact).unwrap();
    pdb.asked();
    refresh(&source, Some(&first), role_fact).unwrap();
    assert_eq!(pdb.asked()[0], "inventory[certname, timestamp] {}");
}

fn write_config(dir: &Dir, puppet: &PuppetSettings, urls: &[&str], cache: &str) {
    std::fs::create_dir_all(&puppet.confdir).unwrap();
    let yaml = format!(
        "source: puppetdb\nrole_fact: trusted.extensions.pp_role\ncache:\n  dir: {}\n  cold_start_timeout: 10\n  retry_min: 1\npuppetdb:\n  server_urls: [{}]\n  timeout: 2\n",
        dir.0.join(cache).display(),
        urls.join(", ")
    );
    std::fs::write(puppet.confdir.join("puppet_kicker.yaml"), yaml).unwrap();
}

/// PuppetDB down: the last snapshot keeps serving with a warning naming the URL;
/// back: the next refresh succeeds. A cold start with PuppetDB unreachable fails
/// the compile with the reason.
#[test]
fn the_service_serves_the_last_snapshot_while_puppetdb_is_down_and_a_cold_start_fails_with_the_reason() {
    let dir = Dir::new("service");
    let ca = Ca::new("Puppet CA: service");
    let pdb = FakePuppetdb::start(server_config(&ca));
    let now = puppet_kicker::time::now();
    pdb.set("web1.example.com", node("web", now));
    pdb.set("web2.example.com", node("web", now));
    let puppet = puppet_settings(&dir, &ca);
    write_config(&dir, &puppet, &[&pdb.url], "cache");
    let service = IndexService::start(puppet.clone()).unwrap();
    let web = |service: &IndexService| service.servers_with_role(&["web"], "production").map(|s| s.len());
    assert_eq!(web(&service).unwrap(), 2);

    pdb.behave(Behaviour::Status(500));
    assert!(service.refresh_and_wait(Duration::from_secs(10)));
    let status = service.status();
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains(&pdb.url) && e.contains("HTTP 500")), "{status:?}");
    let warnings = service.take_warnings();
    assert!(
        warnings.iter().any(|w| w.contains("still serving the last snapshot") && w.contains(&pdb.url)),
        "{warnings:?}"
    );
    assert_eq!(web(&service).unwrap(), 2, "the last index serves");

    pdb.behave(Behaviour::Answer);
    pdb.set("web3.example.com", node("web", now));
    assert!(service.refresh_and_wait(Duration::from_secs(10)));
    assert_eq!(service.status().last_error, None);
    assert_eq!(web(&service).unwrap(), 3);

    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port())
    };
    let cold = PuppetSettings { confdir: dir.0.join("etc-cold"), ..puppet };
    write_config(&dir, &cold, &[&closed], "cache-cold");
    let service = IndexService::start(cold).unwrap();
    let error = web(&service).unwrap_err().to_string();
    assert!(error.contains("no fact data") && error.contains(&closed), "{error}");
    assert!(error.to_lowercase().contains("refused"), "{error}");
}

/// Against a real PuppetDB (`script/puppetdb start`, then `eval "$(script/puppetdb
/// env)"`): its answers to the source's PQL read as a full read, and an incremental
/// refresh gives what a full read gives. `PK_PUPPETDB_URL`, `PK_PUPPETDB_CA`,
/// `PK_PUPPETDB_CERT` and `PK_PUPPETDB_KEY` name the running one: script/test-puppetdb
/// runs this (`--ignored`) once its agents have stored their facts.
#[test]
#[ignore = "needs a running PuppetDB: script/test-puppetdb runs it"]
fn a_real_puppetdb_answers_the_sources_queries() {
    let var = |name: &str| {
        let value = std::env::var_os(name).unwrap_or_else(|| panic!("{name} must name the running PuppetDB's"));
        std::path::PathBuf::from(value)
    };
    let (url, ca, cert, key) =
        (var("PK_PUPPETDB_URL"), var("PK_PUPPETDB_CA"), var("PK_PUPPETDB_CERT"), var("PK_PUPPETDB_KEY"));
    let puppet =
        PuppetSettings { hostcert: Some(cert), hostprivkey: Some(key), localcacert: Some(ca), ..Default::default() };
    let mut s = settings(&puppet, &[url.to_str().unwrap()]);
    s.page_size = 7;
    let source = PuppetdbSource::open(&s).unwrap();
    let full = refresh(&source, None, "trusted.extensions.pp_role").unwrap();
    assert!(!full.is_empty(), "the stack holds facts");
    for server in servers(&full) {
        assert!(server.facts.get("trusted").is_some_and(Value::is_object), "{}", server.certname);
    }
    let next = refresh(&source, Some(&full), "trusted.extensions.pp_role").unwrap();
    let again = refresh(&PuppetdbSource::open(&s).unwrap(), None, "trusted.extensions.pp_role").unwrap();
    assert_eq!(servers(&next), servers(&again));
    eprintln!("{} servers from {}", full.len(), url.display());
}
