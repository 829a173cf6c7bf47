//! TLS to the broker against an in-test rustls STOMP broker on 127.0.0.1,
//! with CAs made for each test: a verified round trip (with and without a
//! client certificate the broker requires), refusal of a certificate from
//! another CA or for another host, and handshakes bounded by the connect
//! timeout. client.cfg parsing of `pool.N.ssl*` is covered here too.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use puppet_kicker::mcollective::config::{BrokerHost, Config, ConnectorKind, Overrides};
use puppet_kicker::mcollective::marshal::{self, DecodeLimits, Value};
use puppet_kicker::mcollective::message::{Reply, Request};
use puppet_kicker::mcollective::stomp::{Frame, FrameReader, FrameWriter, Limits};
use puppet_kicker::mcollective::tls::{TlsSettings, MAX_PEM_FILE_BYTES};
use puppet_kicker::mcollective::{Client, Filter};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};
use support::ca::Ca;

mod support;

const PSK: &str = "tls-psk";

/// Files of one test in a fresh temporary directory.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("pk-tls-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
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

fn server_config(cert_pem: &str, key_pem: &str, client_ca: Option<&Ca>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.cert.der().clone()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    Arc::new(builder.with_single_cert(chain, key).unwrap())
}

/// What the in-test broker did with its (only) connection.
#[derive(Debug, Default)]
struct Seen {
    commands: Vec<String>,
    /// The handshake or a read failed, and why.
    error: Option<String>,
    client_certificate: bool,
}

struct TlsBroker {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl TlsBroker {
    /// A STOMP broker speaking TLS with `config` that answers discovery
    /// with a pong from node1.example.com.
    fn start(config: Arc<ServerConfig>) -> TlsBroker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let log = seen.clone();
        thread::spawn(move || {
            let Ok((socket, _)) = listener.accept() else { return };
            socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let conn = ServerConnection::new(config).unwrap();
            if let Err(e) = serve(StreamOwned::new(conn, socket), &log) {
                log.lock().unwrap().error = Some(e);
            }
        });
        TlsBroker { addr, seen }
    }

    fn host(&self, host: &str, tls: TlsSettings) -> BrokerHost {
        BrokerHost {
            host: host.into(),
            port: self.addr.port(),
            user: "mcollective".into(),
            password: "marionette".into(),
            tls: Some(tls),
        }
    }
}

type Tls = StreamOwned<ServerConnection, TcpStream>;

/// The broker's TLS stream, shared by its frame reader and writer (one thread).
#[derive(Clone)]
struct Shared(Rc<RefCell<Tls>>);

impl Read for Shared {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().read(buf)
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

fn serve(tls: Tls, seen: &Mutex<Seen>) -> Result<(), String> {
    let shared = Shared(Rc::new(RefCell::new(tls)));
    let mut reader = FrameReader::new(shared.clone(), Limits::default());
    let mut writer = FrameWriter::new(shared.clone());
    loop {
        let frame = reader.read_frame().map_err(|e| e.to_string())?;
        {
            let mut s = seen.lock().unwrap();
            s.commands.push(frame.command.clone());
            s.client_certificate = shared.0.borrow().conn.peer_certificates().is_some_and(|c| !c.is_empty());
        }
        match frame.command.as_str() {
            "CONNECT" => writer
                .write_frame(&Frame::new("CONNECTED").header("version", "1.0").header("server", "tls-fake/1.0"))
                .map_err(|e| e.to_string())?,
            "SEND" => {
                let (req, _) = Request::decode(&frame.body, DecodeLimits::default()).map_err(|e| e.to_string())?;
                let pong = Reply {
                    senderid: "node1.example.com".into(),
                    requestid: req.requestid,
                    senderagent: req.agent,
                    msgtime: puppet_kicker::time::now(),
                    body: marshal::encode(&Value::str("pong")).unwrap().into(),
                    signature: None,
                }
                .encode(PSK)
                .unwrap();
                let reply_to = frame.get("reply-to").unwrap_or("/queue/none").to_string();
                let msg = Frame::new("MESSAGE")
                    .header("destination", reply_to.as_str())
                    .header("message-id", "m-1")
                    .body(pong);
                writer.write_frame(&msg).map_err(|e| e.to_string())?;
            }
            "DISCONNECT" => return Ok(()),
            _ => {}
        }
    }
}

fn config(pool: Vec<BrokerHost>, connect_timeout: Duration) -> Config {
    let o = Overrides {
        no_config_file: true,
        connector: Some(ConnectorKind::ActiveMq),
        pool: Some(pool),
        psk: Some(PSK.into()),
        identity: Some("master.example.com".into()),
        connect_timeout: Some(connect_timeout),
        ..Overrides::default()
    };
    Config::resolve("", None, &o, None).unwrap()
}

fn discover(config: Config) -> Result<Vec<String>, String> {
    Client::new(config)
        .discover("mcollective", &Filter::default(), Duration::from_secs(2), Some(1))
        .map_err(|e| e.to_string())
}

fn ca_only(dir: &Dir, ca: &Ca) -> TlsSettings {
    TlsSettings { ca: vec![dir.write("ca.pem", &ca.cert.pem())], cert: None, key: None }
}

#[test]
fn discovery_round_trips_over_verified_tls() {
    let dir = Dir::new("roundtrip");
    let ca = Ca::new("Test CA");
    let (cert, key) = ca.issue(&["127.0.0.1", "localhost"]);
    for host in ["127.0.0.1", "localhost"] {
        let broker = TlsBroker::start(server_config(&cert, &key, None));
        let nodes = discover(config(vec![broker.host(host, ca_only(&dir, &ca))], Duration::from_secs(5)));
        assert_eq!(nodes.unwrap(), ["node1.example.com"], "via {host}");
        let seen = broker.seen.lock().unwrap();
        assert_eq!(seen.commands.first().map(String::as_str), Some("CONNECT"), "{seen:?}");
        assert!(seen.commands.iter().any(|c| c == "SEND"), "{seen:?}");
        assert!(!seen.client_certificate);
    }
}

#[test]
fn the_client_certificate_is_sent_to_a_broker_that_requires_one() {
    let dir = Dir::new("mutual");
    let ca = Ca::new("Test CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let (client_cert, client_key) = ca.issue(&["master.example.com"]);

    let broker = TlsBroker::start(server_config(&cert, &key, Some(&ca)));
    let tls = TlsSettings {
        ca: vec![dir.write("ca.pem", &ca.cert.pem())],
        cert: Some(dir.write("master.pem", &client_cert)),
        key: Some(dir.write("master.key", &client_key)),
    };
    assert_eq!(
        discover(config(vec![broker.host("127.0.0.1", tls)], Duration::from_secs(5))).unwrap(),
        ["node1.example.com"]
    );
    assert!(broker.seen.lock().unwrap().client_certificate);

    // Without one, the broker refuses the handshake and the client says so.
    let broker = TlsBroker::start(server_config(&cert, &key, Some(&ca)));
    let e = discover(config(vec![broker.host("127.0.0.1", ca_only(&dir, &ca))], Duration::from_secs(5))).unwrap_err();
    assert!(e.contains(&broker.addr.to_string()), "{e}");
    assert!(e.contains("the broker requires a client certificate (set ssl.cert and ssl.key)"), "{e}");
}

#[test]
fn a_broker_certificate_from_another_ca_is_refused_naming_broker_and_reason() {
    let dir = Dir::new("otherca");
    let ours = Ca::new("Our CA");
    let theirs = Ca::new("Their CA");
    let (cert, key) = theirs.issue(&["127.0.0.1"]);
    let broker = TlsBroker::start(server_config(&cert, &key, None));
    let e = discover(config(vec![broker.host("127.0.0.1", ca_only(&dir, &ours))], Duration::from_secs(5))).unwrap_err();
    assert!(e.contains(&format!("127.0.0.1:{}", broker.addr.port())), "{e}");
    assert!(e.contains("not signed by a CA of ssl.ca") && e.contains("ca.pem"), "{e}");
    // Nothing was sent in the clear or otherwise: no STOMP frame reached the broker.
    thread::sleep(Duration::from_millis(100));
    assert!(broker.seen.lock().unwrap().commands.is_empty());
}

#[test]
fn a_broker_certificate_for_another_host_is_refused() {
    let dir = Dir::new("hostname");
    let ca = Ca::new("Test CA");
    let (cert, key) = ca.issue(&["broker.example.com", "127.0.0.2"]);
    let broker = TlsBroker::start(server_config(&cert, &key, None));
    let e = discover(config(vec![broker.host("127.0.0.1", ca_only(&dir, &ca))], Duration::from_secs(5))).unwrap_err();
    assert!(e.contains(&broker.addr.to_string()), "{e}");
    assert!(e.contains("not valid for \"127.0.0.1\""), "{e}");

    let broker = TlsBroker::start(server_config(&cert, &key, None));
    let e = discover(config(vec![broker.host("localhost", ca_only(&dir, &ca))], Duration::from_secs(5))).unwrap_err();
    assert!(e.contains("not valid for \"localhost\""), "{e}");
}

/// Accepts connections and, per connection, runs `behave` on the socket.
fn tcp_server(behave: fn(TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for s in listener.incoming().flatten() {
            thread::spawn(move || behave(s));
        }
    });
    addr
}

fn handshake_must_time_out(addr: SocketAddr) {
    let dir = Dir::new(&format!("silent{}", addr.port()));
    let ca = Ca::new("Test CA");
    let host = BrokerHost {
        host: "127.0.0.1".into(),
        port: addr.port(),
        user: String::new(),
        password: String::new(),
        tls: Some(ca_only(&dir, &ca)),
    };
    let start = Instant::now();
    let e = discover(config(vec![host], Duration::from_millis(500))).unwrap_err();
    let took = start.elapsed();
    assert!(took < Duration::from_millis(1500), "took {took:?}: {e}");
    assert!(
        e.contains(&addr.to_string()) && e.contains("TLS handshake not completed within the connect timeout"),
        "{e}"
    );
}

#[test]
fn a_broker_that_never_completes_the_handshake_fails_within_the_connect_timeout() {
    // Accepts TCP, then says nothing.
    handshake_must_time_out(tcp_server(|s| {
        thread::sleep(Duration::from_secs(5));
        drop(s);
    }));
    // Trickles a TLS record header and then one byte every 50 ms: each socket read
    // returns in time, the handshake must still end at the deadline.
    handshake_must_time_out(tcp_server(|mut s| {
        let _ = s.write_all(&[0x16, 0x03, 0x03, 0x40, 0x00]);
        for _ in 0..100 {
            thread::sleep(Duration::from_millis(50));
            if s.write_all(&[0x02]).is_err() {
                return;
            }
        }
    }));
}

#[test]
fn a_plain_stomp_port_is_reported_as_a_handshake_failure() {
    // A plain STOMP broker answers a TLS ClientHello with an ERROR frame, or closes.
    let addr = tcp_server(|mut s| {
        let _ = s.write_all(b"ERROR\nmessage:Unknown STOMP action\n\n\0");
        thread::sleep(Duration::from_millis(200));
    });
    let dir = Dir::new("plain");
    let ca = Ca::new("Test CA");
    let host = BrokerHost {
        host: "127.0.0.1".into(),
        port: addr.port(),
        user: String::new(),
        password: String::new(),
        tls: Some(ca_only(&dir, &ca)),
    };
    let e = discover(config(vec![host], Duration::from_secs(2))).unwrap_err();
    assert!(e.contains(&addr.to_string()) && e.contains("TLS"), "{e}");
}

// ---------------------------------------------------------------- client.cfg

fn client_cfg(dir: &Dir, ssl_lines: &str) -> String {
    format!(
        "connector = rabbitmq\nplugin.rabbitmq.pool.size = 1\nplugin.rabbitmq.pool.1.host = 127.0.0.1\n\
         plugin.rabbitmq.pool.1.port = 61614\nplugin.psk = k\nidentity = m\n{}\n",
        ssl_lines.replace("DIR", &dir.0.display().to_string())
    )
}

fn resolve(text: &str) -> Result<Config, String> {
    Config::resolve(text, Some(Path::new("/etc/mcollective/client.cfg")), &Overrides::default(), None)
        .map_err(|e| e.to_string())
}

#[test]
fn client_cfg_pool_ssl_settings_are_read() {
    let dir = Dir::new("cfg");
    let ca = Ca::new("Test CA");
    let (cert, key) = ca.issue(&["master.example.com"]);
    dir.write("ca.pem", &ca.cert.pem());
    dir.write("other-ca.pem", &Ca::new("Other").cert.pem());
    dir.write("cert.pem", &cert);
    dir.write("key.pem", &key);
    let c = resolve(&client_cfg(
        &dir,
        "plugin.rabbitmq.pool.1.ssl = 1\nplugin.rabbitmq.pool.1.ssl.ca = DIR/ca.pem,DIR/other-ca.pem\n\
         plugin.rabbitmq.pool.1.ssl.cert = DIR/cert.pem\nplugin.rabbitmq.pool.1.ssl.key = DIR/key.pem\n\
         plugin.rabbitmq.pool.1.ssl.fallback = 0",
    ))
    .unwrap();
    let tls = c.pool[0].tls.as_ref().unwrap();
    assert_eq!(tls.ca, [dir.0.join("ca.pem"), dir.0.join("other-ca.pem")]);
    assert_eq!(tls.cert.as_deref(), Some(dir.0.join("cert.pem").as_path()));
    assert_eq!(tls.key.as_deref(), Some(dir.0.join("key.pem").as_path()));

    let c =
        resolve(&client_cfg(&dir, "plugin.rabbitmq.pool.1.ssl = 0\nplugin.rabbitmq.pool.1.ssl.ca = DIR/nope")).unwrap();
    assert_eq!(c.pool[0].tls, None);
}

#[test]
fn client_cfg_ssl_errors_name_file_line_key_and_reason() {
    let dir = Dir::new("cfgerr");
    let ca = Ca::new("Test CA");
    let (cert, key) = ca.issue(&["master.example.com"]);
    dir.write("ca.pem", &ca.cert.pem());
    dir.write("cert.pem", &cert);
    dir.write("key.pem", &key);
    dir.write("empty.pem", "just text\n");
    let ssl = "plugin.rabbitmq.pool.1.ssl = 1\nplugin.rabbitmq.pool.1.ssl.ca = DIR/ca.pem\n";
    let cases = [
        // (extra lines after `ssl`, key named, line, reason)
        ("plugin.rabbitmq.pool.1.ssl = maybe", "plugin.rabbitmq.pool.1.ssl", 7, "is not a boolean"),
        (
            &format!("{ssl}plugin.rabbitmq.pool.1.ssl.fallback = 1"),
            "pool.1.ssl.fallback",
            9,
            "unverified TLS is not supported",
        ),
        ("plugin.rabbitmq.pool.1.ssl = 1", "plugin.rabbitmq.pool.1.ssl.ca", 0, "not set"),
        (
            "plugin.rabbitmq.pool.1.ssl = 1\nplugin.rabbitmq.pool.1.ssl.ca = DIR/missing.pem",
            "pool.1.ssl.ca",
            8,
            "missing.pem",
        ),
        (
            "plugin.rabbitmq.pool.1.ssl = 1\nplugin.rabbitmq.pool.1.ssl.ca = DIR/empty.pem",
            "pool.1.ssl.ca",
            8,
            "holds no PEM certificate",
        ),
        (&format!("{ssl}plugin.rabbitmq.pool.1.ssl.cert = DIR/cert.pem"), "pool.1.ssl.key", 0, "set both or neither"),
        (
            &format!(
                "{ssl}plugin.rabbitmq.pool.1.ssl.cert = DIR/cert.pem\nplugin.rabbitmq.pool.1.ssl.key = DIR/ca.pem"
            ),
            "pool.1.ssl.key",
            10,
            "no usable PEM private key",
        ),
        (
            &format!(
                "{ssl}plugin.rabbitmq.pool.1.ssl.cert = DIR/empty.pem\nplugin.rabbitmq.pool.1.ssl.key = DIR/key.pem"
            ),
            "pool.1.ssl.cert",
            9,
            "holds no PEM certificate",
        ),
    ];
    for (lines, key, line, reason) in cases {
        let e = resolve(&client_cfg(&dir, lines)).unwrap_err();
        assert!(e.contains("/etc/mcollective/client.cfg") && e.contains(key) && e.contains(reason), "{lines}: {e}");
        if line > 0 {
            assert!(e.contains(&format!("line {line} ")), "{lines}: {e}");
        }
    }
}

#[test]
fn a_pem_file_at_the_size_limit_is_read_and_one_byte_more_is_refused() {
    let dir = Dir::new("limit");
    let ca = Ca::new("Test CA").cert.pem();
    // Text outside PEM sections is skipped, as in a commented CA bundle.
    let padded = |total: u64| {
        let fill = total as usize - ca.len() - 1;
        format!("{}\n{ca}", "#".repeat(fill))
    };
    let at = dir.write("at.pem", &padded(MAX_PEM_FILE_BYTES));
    assert_eq!(std::fs::metadata(&at).unwrap().len(), MAX_PEM_FILE_BYTES);
    let settings = |p: PathBuf| TlsSettings { ca: vec![p], cert: None, key: None };
    assert!(settings(at).client_config().is_ok());
    let over = dir.write("over.pem", &padded(MAX_PEM_FILE_BYTES + 1));
    let e = settings(over).client_config().unwrap_err().to_string();
    assert!(e.contains("over.pem") && e.contains(&format!("larger than {MAX_PEM_FILE_BYTES} bytes")), "{e}");
}

#[test]
fn a_callers_pool_has_its_tls_files_checked_like_client_cfgs() {
    let dir = Dir::new("override");
    let host = BrokerHost {
        host: "mq1".into(),
        port: 61614,
        user: String::new(),
        password: String::new(),
        tls: Some(TlsSettings { ca: vec![dir.0.join("missing.pem")], cert: None, key: None }),
    };
    let o = Overrides {
        no_config_file: true,
        pool: Some(vec![host]),
        psk: Some(PSK.into()),
        identity: Some("m".into()),
        ..Overrides::default()
    };
    let e = Config::resolve("", None, &o, None).unwrap_err().to_string();
    assert!(e.contains("pool entry 1 (mq1:61614) ssl_ca") && e.contains("missing.pem"), "{e}");
}
