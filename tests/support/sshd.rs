//! An OpenSSH server of the test's own for the SSH transport's tests and benchmark:
//! Debian's `/usr/sbin/sshd` with its own configuration, host keys, authorized keys
//! and port on 127.0.0.1, stopped by pid when dropped (the machine's sshd, /etc/ssh and
//! ~/.ssh are never used). The target's `puppet` is a script on the session's PATH
//! that answers `puppet config print` with lock files in the test's directory and
//! records each `puppet agent` it is asked to start. Included with `#[path]` by
//! tests/ssh_transport.rs and benches/transports.rs.
#![allow(dead_code)]

use puppet_kicker::kick::{SshSettings, SshTransport};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const SSHD: &str = "/usr/sbin/sshd";

pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

pub fn user_name() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// An sshd of this test's own, and the keys and files around it.
pub struct Sshd {
    pub dir: PathBuf,
    pub port: u16,
    pub child: Child,
}

impl Sshd {
    pub fn start(name: &str) -> Sshd {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: the SSH transport tests need Debian's openssh-server (script/bootstrap test installs it)"
        );
        let dir = std::env::temp_dir().join(format!("pk-sshd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("state")).unwrap();
        for key in ["host_key", "other_host_key", "user_key", "stranger_key"] {
            run("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-C", key, "-f", dir.join(key).to_str().unwrap()]);
        }
        let user_key = std::fs::read_to_string(dir.join("user_key.pub")).unwrap();
        // The session's PATH finds the fake puppet first (PermitUserEnvironment PATH).
        // SHLVL=1 keeps the login shell (bash, for root) from reading ~/.bashrc, as it
        // does for a command sent over ssh: this machine's user's rc files (a pyenv
        // init takes ~100 ms) are not the target's, and would be timed with each kick.
        std::fs::write(
            dir.join("authorized_keys"),
            format!(
                "environment=\"PATH={}:/usr/bin:/bin\",environment=\"SHLVL=1\" {user_key}",
                dir.join("bin").display()
            ),
        )
        .unwrap();
        let state = dir.join("state");
        write_executable(
            &dir.join("bin/puppet"),
            &format!(
                "#!/bin/sh\ncase \"$1\" in\n  config) echo \"agent_catalog_run_lockfile = {s}/agent_catalog_run.lock\"\n    echo \"agent_disabled_lockfile = {s}/agent_disabled.lock\"\n    echo \"pidfile = {s}/agent.pid\"\n    echo \"lastrunfile = {s}/last_run_summary.yaml\" ;;\n  agent) case \"$2\" in\n    --disable) printf '{{\"disabled_message\":\"%s\"}}' \"$3\" > {s}/agent_disabled.lock ;;\n    --enable) rm -f {s}/agent_disabled.lock ;;\n    *) echo \"$*\" >> {runs} ;;\n  esac ;;\n  *) exit 1 ;;\nesac\n",
                s = state.display(),
                runs = dir.join("runs").display()
            ),
        );
        std::fs::write(dir.join("ssh_config"), "").unwrap();
        if is_root() && !Path::new("/run/sshd").exists() {
            // sshd started by root needs its privilege separation directory.
            std::fs::create_dir_all("/run/sshd").unwrap();
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n\
             PermitUserEnvironment PATH,SHLVL\nMaxStartups 100\nMaxSessions 100\nAllowUsers {user}\n",
            d = dir.display(),
            user = user_name()
        );
        std::fs::write(dir.join("sshd_config"), config).unwrap();
        let log = std::fs::File::create(dir.join("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let sshd = Sshd { dir, port, child };
        sshd.wait_for_banner();
        sshd
    }

    pub fn wait_for_banner(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut banner = [0u8; 4];
                if stream.read_exact(&mut banner).is_ok() && &banner == b"SSH-" {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "sshd did not come up: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// A known_hosts file listing `host_key` (this sshd's, or another) for 127.0.0.1.
    pub fn known_hosts(&self, host_key: &str) -> PathBuf {
        let public = std::fs::read_to_string(self.dir.join(format!("{host_key}.pub"))).unwrap();
        let path = self.dir.join(format!("known_hosts-{host_key}"));
        std::fs::write(&path, format!("[127.0.0.1]:{} {public}", self.port)).unwrap();
        path
    }

    pub fn settings(&self) -> SshSettings {
        SshSettings {
            user: Some(user_name()),
            port: Some(self.port),
            identity_file: Some(self.dir.join("user_key")),
            known_hosts: Some(self.known_hosts("host_key")),
            config_file: Some(self.dir.join("ssh_config")),
            connect_timeout: Duration::from_secs(5),
            command: SshSettings::script_command(),
            control_master: false,
            max_parallel: 4,
            address_fact: "fqdn".into(),
        }
    }

    /// A transport whose every target is this sshd.
    pub fn transport(&self, settings: SshSettings, timeout: Duration) -> SshTransport {
        SshTransport::new(settings, timeout, &self.dir.join("control"), Box::new(|_| Some("127.0.0.1".to_string())))
            .unwrap()
    }

    /// The `puppet agent` runs the fake puppet was asked for, one line of arguments each.
    pub fn runs(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("runs")).unwrap_or_default().lines().map(str::to_string).collect()
    }

    pub fn state(&self, file: &str) -> PathBuf {
        self.dir.join("state").join(file)
    }
}

impl Sshd {
    /// Ends every session this sshd serves (its child processes), and with them the
    /// shared connections (`ControlPersist`) kicks left open to it.
    pub fn end_sessions(&self) {
        let listener = self.child.id().to_string();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: comm may hold spaces, so read after its ')'.
            let ppid = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1));
            if ppid == Some(listener.as_str()) {
                let _ = Command::new("kill").arg(entry.file_name()).status();
            }
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.end_sessions();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn is_root() -> bool {
    user_name() == "root"
}
