//! An in-test PuppetDB for `tests/puppetdb.rs` and `benches/puppetdb.rs`: an HTTPS
//! server on 127.0.0.1 (rustls, a client certificate required, CAs made per test)
//! answering the puppetdb source's PQL from a fleet the caller changes.
#![allow(dead_code)]

// The test CA (tests/support/ca.rs), taken in here so that benches/puppetdb.rs, which
// includes this file alone, has it too.
#[path = "ca.rs"]
mod ca;
pub use ca::Ca;

use puppet_kicker::source::puppetdb::query;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Files of one test in a fresh temporary directory.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(test: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("pk-pdb-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One node as the in-test PuppetDB holds it.
#[derive(Clone)]
pub struct PdbNode {
    pub timestamp: i64,
    pub environment: Option<String>,
    pub facts: Value,
    pub trusted: Value,
    pub deactivated: Option<i64>,
    pub expired: Option<i64>,
}

/// How the in-test PuppetDB answers.
#[derive(Clone, Copy, PartialEq)]
pub enum Behaviour {
    Answer,
    Status(u16),
    /// Reads the request, never answers.
    Hang,
    Garbage,
}

#[derive(Default)]
pub struct Fleet {
    nodes: BTreeMap<String, PdbNode>,
    /// Each node's inventory entry as JSON, made when first asked for.
    rendered: BTreeMap<String, String>,
    /// Every query asked, in order.
    asked: Vec<String>,
    /// Time spent making answers: PuppetDB's share, as far as this one has one.
    answering: Duration,
}

pub struct FakePuppetdb {
    pub url: String,
    fleet: Arc<Mutex<Fleet>>,
    behaviour: Arc<Mutex<Behaviour>>,
}

pub fn stamp(seconds: i64) -> String {
    query::timestamp(seconds).replace(".000Z", ".123Z")
}

impl FakePuppetdb {
    pub fn start(server: Arc<ServerConfig>) -> FakePuppetdb {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let fleet = Arc::new(Mutex::new(Fleet::default()));
        let behaviour = Arc::new(Mutex::new(Behaviour::Answer));
        let (f, b) = (fleet.clone(), behaviour.clone());
        std::thread::spawn(move || {
            for socket in listener.incoming() {
                let Ok(socket) = socket else { continue };
                let (f, b, server) = (f.clone(), b.clone(), server.clone());
                std::thread::spawn(move || {
                    let _ = serve(socket, server, &f, &b);
                });
            }
        });
        FakePuppetdb { url, fleet, behaviour }
    }

    pub fn set(&self, certname: &str, node: PdbNode) {
        let mut fleet = self.fleet.lock().unwrap();
        fleet.rendered.remove(certname);
        fleet.nodes.insert(certname.to_string(), node);
    }

    pub fn edit(&self, certname: &str, change: impl FnOnce(&mut PdbNode)) {
        let mut fleet = self.fleet.lock().unwrap();
        fleet.rendered.remove(certname);
        change(fleet.nodes.get_mut(certname).unwrap());
    }

    /// The time spent making answers since the last call.
    pub fn answering(&self) -> Duration {
        std::mem::take(&mut self.fleet.lock().unwrap().answering)
    }

    pub fn behave(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    /// The queries asked since the last call.
    pub fn asked(&self) -> Vec<String> {
        std::mem::take(&mut self.fleet.lock().unwrap().asked)
    }
}

fn serve(
    socket: TcpStream,
    config: Arc<ServerConfig>,
    fleet: &Mutex<Fleet>,
    behaviour: &Mutex<Behaviour>,
) -> Result<(), String> {
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn = ServerConnection::new(config).unwrap();
    let mut tls = StreamOwned::new(conn, socket);
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    let (head_end, length) = loop {
        let n = tls.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed".into());
        }
        request.extend_from_slice(&buf[..n]);
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&request[..end]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            break (end + 4, length);
        }
    };
    while request.len() < head_end + length {
        let n = tls.read(&mut buf).map_err(|e| e.to_string())?;
        request.extend_from_slice(&buf[..n]);
    }
    assert!(request.starts_with(b"POST /pdb/query/v4 "), "{}", String::from_utf8_lossy(&request));
    let body: Value = serde_json::from_slice(&request[head_end..]).unwrap();
    let pql = body["query"].as_str().unwrap().to_string();
    let behaviour = *behaviour.lock().unwrap();
    let (status, answer) = match behaviour {
        Behaviour::Hang => {
            std::thread::sleep(Duration::from_secs(5));
            return Ok(());
        }
        Behaviour::Status(code) => (code, "PuppetDB is starting".to_string()),
        Behaviour::Garbage => (200, "[{\"certname\": ".to_string()),
        Behaviour::Answer => {
            let mut fleet = fleet.lock().unwrap();
            let started = Instant::now();
            fleet.asked.push(pql.clone());
            let answer = answer(&mut fleet, &pql);
            fleet.answering += started.elapsed();
            (200, answer)
        }
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
    tls.write_all(response.as_bytes()).map_err(|e| e.to_string())?;
    tls.flush().map_err(|e| e.to_string())?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// The strings quoted in a PQL query, in order.
pub fn quoted_strings(pql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = pql.chars();
    while let Some(c) = chars.next() {
        if c == '"' {
            let mut s = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => s.extend(chars.next()),
                    '"' => break,
                    c => s.push(c),
                }
            }
            out.push(s);
        }
    }
    out
}

/// PuppetDB's answer to the source's queries, over the fleet's nodes.
fn answer(fleet: &mut Fleet, pql: &str) -> String {
    let nodes = &fleet.nodes;
    let active = nodes.iter().filter(|(_, n)| n.deactivated.is_none() && n.expired.is_none());
    let seconds = |s: &str| puppet_kicker::time::parse_timestamp(s).unwrap();
    if let Some(rest) = pql.strip_prefix("inventory[certname, timestamp] ") {
        let since = quoted_strings(rest).first().map(|s| seconds(s));
        let listed = active.filter(|(_, n)| since.is_none_or(|since| n.timestamp >= since));
        let listed = listed.map(|(c, n)| json!({"certname": c, "timestamp": stamp(n.timestamp)}));
        return Value::Array(listed.collect()).to_string();
    }
    if pql.starts_with(&format!("inventory[{}] {{ certname in [", query::INVENTORY_FIELDS)) {
        let wanted: Vec<String> = quoted_strings(pql);
        let given: Vec<String> = active.filter(|(c, _)| wanted.contains(c)).map(|(c, _)| c.clone()).collect();
        let mut out = String::from("[");
        for (i, certname) in given.iter().enumerate() {
            if !fleet.rendered.contains_key(certname) {
                let n = &fleet.nodes[certname];
                let entry = json!({"certname": certname, "timestamp": stamp(n.timestamp), "environment": n.environment,
                                   "facts": n.facts, "trusted": n.trusted});
                fleet.rendered.insert(certname.clone(), entry.to_string());
            }
            if i > 0 {
                out.push(',');
            }
            out.push_str(&fleet.rendered[certname]);
        }
        out.push(']');
        return out;
    }
    if pql == query::gone() {
        let gone = nodes.iter().filter(|(_, n)| n.deactivated.is_some() || n.expired.is_some());
        let gone = gone.map(
            |(c, n)| json!({"certname": c, "deactivated": n.deactivated.map(stamp), "expired": n.expired.map(stamp)}),
        );
        return Value::Array(gone.collect()).to_string();
    }
    panic!("unexpected PQL: {pql}")
}

/// The server's TLS: its certificate from `ca`, client certificates from `ca` required.
pub fn server_config(ca: &Ca) -> Arc<ServerConfig> {
    server_config_trusting(ca, ca)
}

/// The server's TLS: its certificate from `ca`, client certificates from `clients` required.
pub fn server_config_trusting(ca: &Ca, clients: &Ca) -> Arc<ServerConfig> {
    let (cert, key) = ca.issue(&["127.0.0.1", "localhost"]);
    server_config_presenting(&cert, &key, clients)
}

/// The server's TLS: the PEM certificate `cert` with `key`, client certificates from `clients` required.
pub fn server_config_presenting(cert: &str, key: &str, clients: &Ca) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(clients.cert.der().clone()).unwrap();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    Arc::new(config)
}
