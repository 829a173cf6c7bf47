//! A PostgreSQL 15 cluster of the test's own: initdb in a scratch directory, on a
//! free port of 127.0.0.1, TLS on with a CA made for the test (the server's
//! certificate for 127.0.0.1; a client certificate signed by the same CA), password
//! authentication (scram-sha-256) for the role `kicker`. Started with pg_ctl,
//! stopped by the pid in postmaster.pid, removed on drop. As root (CI), the cluster
//! runs as the `postgres` user, as PostgreSQL requires.

use super::ca::Ca;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
pub const USER: &str = "kicker";
pub const PASSWORD: &str = "kicker-test-password";
pub const DATABASE: &str = "kicks";

pub struct Postgres {
    pub dir: PathBuf,
    pub port: u16,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub password_file: PathBuf,
    /// A CA that signed nothing here: the server's certificate does not verify against it.
    pub other_ca: PathBuf,
    data: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `argv` as the cluster's owner; its output on failure.
fn as_owner(argv: &[&str]) -> std::process::Output {
    let mut command = if super::is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).args(argv);
        c
    } else {
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..]);
        c
    };
    command.output().unwrap_or_else(|e| panic!("{}: {e} (is postgresql-15 installed? script/bootstrap test)", argv[0]))
}

fn chown_to_owner(path: &Path) {
    if super::is_root() {
        let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(path).status().unwrap();
        assert!(status.success(), "chown {}", path.display());
    }
}

impl Postgres {
    pub fn start(name: &str) -> Postgres {
        assert!(
            Path::new(PG_BIN).join("initdb").exists(),
            "{PG_BIN}/initdb missing: PostgreSQL 15 is installed by script/bootstrap test"
        );
        let dir = std::env::temp_dir().join(format!("pk-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let test_ca = Ca::new("puppet-kicker test CA");
        let other = Ca::new("another CA");
        let write = |file: &str, text: &str| {
            let path = dir.join(file);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca = write("ca.pem", &test_ca.cert.pem());
        let other_ca = write("other-ca.pem", &other.cert.pem());
        let (server_cert, server_key) = test_ca.issue(&["127.0.0.1", "localhost"]);
        let (client_cert, client_key) = test_ca.issue(&["compiler.test"]);
        let cert = write("compiler.pem", &client_cert);
        let key = write("compiler.key", &client_key);
        let password_file = write("password", &format!("{PASSWORD}\n"));
        let server = dir.join("server");
        std::fs::create_dir_all(&server).unwrap();
        std::fs::write(server.join("server.crt"), server_cert).unwrap();
        std::fs::write(server.join("server.key"), server_key).unwrap();
        std::fs::write(server.join("ca.crt"), test_ca.cert.pem()).unwrap();
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(dir.join("pwfile"), format!("{PASSWORD}\n")).unwrap();
        chown_to_owner(&dir);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(server.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
        let out = as_owner(&[
            &format!("{PG_BIN}/initdb"),
            "-D",
            data.to_str().unwrap(),
            "-U",
            USER,
            "--pwfile",
            dir.join("pwfile").to_str().unwrap(),
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ]);
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{sock}'\nssl = on\n\
             ssl_cert_file = '{s}/server.crt'\nssl_key_file = '{s}/server.key'\nssl_ca_file = '{s}/ca.crt'\n\
             fsync = on\nmax_connections = 50\nshared_buffers = 16MB\n",
            sock = dir.display(),
            s = server.display()
        );
        let mut pg_conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        pg_conf.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), pg_conf).unwrap();
        // TLS only over TCP; the Unix socket (the test's own setup) trusts.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        chown_to_owner(&dir);
        let pg = Postgres { dir, port, ca, cert, key, password_file, other_ca, data };
        pg.run();
        let out = as_owner(&[
            &format!("{PG_BIN}/psql"),
            "-X",
            "-q",
            "-h",
            pg.dir.to_str().unwrap(),
            "-p",
            &port.to_string(),
            "-U",
            USER,
            "-d",
            "postgres",
            "-c",
            &format!("CREATE DATABASE {DATABASE}"),
        ]);
        assert!(out.status.success(), "createdb: {}", String::from_utf8_lossy(&out.stderr));
        pg
    }

    /// The cluster another process of this test started in `dir` (its files only:
    /// dropping this leaves the cluster running).
    pub fn attach(port: u16, dir: &Path) -> Postgres {
        Postgres {
            dir: dir.to_path_buf(),
            port,
            ca: dir.join("ca.pem"),
            cert: dir.join("compiler.pem"),
            key: dir.join("compiler.key"),
            password_file: dir.join("password"),
            other_ca: dir.join("other-ca.pem"),
            data: PathBuf::new(),
        }
    }

    /// Starts the cluster (after [`Self::stop`]), waiting until it accepts connections.
    pub fn run(&self) {
        let log = self.dir.join("postgresql.log");
        let out = as_owner(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            self.data.to_str().unwrap(),
            "-l",
            log.to_str().unwrap(),
            "-w",
            "-t",
            "60",
            "start",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Stops the cluster by its pid (a fast shutdown: sessions are ended), and waits.
    pub fn stop(&self) {
        let Some(pid) = self.pid() else { return };
        unsafe { libc::kill(pid, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs SQL as the cluster's superuser over its Unix socket; the output's text.
    pub fn psql(&self, sql: &str) -> String {
        let out = as_owner(&[
            &format!("{PG_BIN}/psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-h",
            self.dir.to_str().unwrap(),
            "-p",
            &self.port.to_string(),
            "-U",
            USER,
            "-d",
            DATABASE,
            "-c",
            sql,
        ]);
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.data.as_os_str().is_empty() {
            return; // attached: the starter's to stop
        }
        if let Some(pid) = self.pid() {
            unsafe { libc::kill(pid, libc::SIGQUIT) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
