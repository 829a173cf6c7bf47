//! The SSH transport: a kick is one run of the system's OpenSSH client (`ssh`), so
//! the operator's ssh configuration, agent, certificates and ProxyJump apply. The
//! client never prompts (`BatchMode=yes`) and never accepts a host key that is not
//! in the configured known_hosts (`StrictHostKeyChecking=yes`); it is run from an
//! argv list, never through a local shell, and killed at the kick's deadline. What
//! it runs on the target is [`answer::RUNONCE_SCRIPT`] by default.

mod answer;
mod child;

/// For the `ssh_answer` fuzz target: how what came back from the target is read.
pub use answer::{read as read_answer, REASON_BYTES};
use answer::{RUNONCE_SCRIPT, SCRIPT_NAME};
pub use child::Captured;

use super::planner::{Dispatch, Outcome};
use super::transport::{LastRun, Server, Transport};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Most bytes kept of each of ssh's output streams: the answer is one line.
pub const MAX_OUTPUT: usize = 64 << 10;
/// How long an idle shared connection (`ssh.control_master`) stays open.
pub const CONTROL_PERSIST: Duration = Duration::from_secs(60);
/// The longest socket path ssh can make: `sun_path` holds 108 bytes with its NUL.
const MAX_SOCKET_PATH: usize = 107;
/// What ssh appends to a control path while it sets up a master (`.` and 16 random
/// characters), before renaming the socket into place.
const SOCKET_TEMP_SUFFIX: usize = 17;
/// Hex digits of a control socket's name (80 bits of a SHA-256).
const SOCKET_NAME: usize = 20;
/// The Choria/mcollective `puppet` agent's rule for an environment (its DDL's
/// `puppet_variable` validation and `maxlength`).
pub const MAX_ENVIRONMENT: usize = 50;
/// A DNS name is at most this long.
const MAX_HOST: usize = 253;

/// The `ssh.*` keys.
#[derive(Clone, PartialEq)]
pub struct SshSettings {
    /// `-l`; unset: ssh's own choice (its config, else the local user).
    pub user: Option<String>,
    /// `-p`; unset: ssh's own choice.
    pub port: Option<u16>,
    /// `-i` (with `IdentitiesOnly=yes`); unset: the agent and ssh's defaults.
    pub identity_file: Option<PathBuf>,
    /// `UserKnownHostsFile`: required for this transport.
    pub known_hosts: Option<PathBuf>,
    /// `-F`; unset: `~/.ssh/config` and `/etc/ssh/ssh_config` as usual.
    pub config_file: Option<PathBuf>,
    /// `ConnectTimeout`.
    pub connect_timeout: Duration,
    /// What runs on the target, an argv list (quoted for the remote shell).
    pub command: Vec<String>,
    /// Shared connections (`ControlMaster=auto`, sockets under the cache dir).
    pub control_master: bool,
    /// Kicks sent at once.
    pub max_parallel: usize,
    /// The fact whose value is the address to connect to (the certname without it).
    pub address_fact: String,
}

crate::redact::debug_showing!(SshSettings: user, port, identity_file, known_hosts, config_file, connect_timeout, control_master, max_parallel, address_fact);

impl SshSettings {
    /// What the keys' defaults are applied to.
    pub(crate) fn unset() -> SshSettings {
        SshSettings {
            user: None,
            port: None,
            identity_file: None,
            known_hosts: None,
            config_file: None,
            connect_timeout: Duration::ZERO,
            command: SshSettings::default_command(),
            control_master: true,
            max_parallel: 1,
            address_fact: String::new(),
        }
    }

    /// The default `ssh.command`: [`RUNONCE_SCRIPT`] as root through `sudo -n`.
    pub fn default_command() -> Vec<String> {
        let mut command = vec!["sudo".to_string(), "-n".to_string()];
        command.extend(SshSettings::script_command());
        command
    }

    /// [`RUNONCE_SCRIPT`] as an argv list without `sudo`: `/bin/sh -c SCRIPT NAME`.
    pub fn script_command() -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), RUNONCE_SCRIPT.into(), SCRIPT_NAME.into()]
    }

    /// `command` as the configuration's `Debug` shows it: the runonce script named,
    /// not spelled out.
    pub fn shown_command(&self) -> Vec<&str> {
        self.command.iter().map(|w| if w == RUNONCE_SCRIPT { "<the runonce script>" } else { w.as_str() }).collect()
    }

    /// What a transport needs that no key checks alone, when `ssh` is the
    /// transport: a readable known_hosts file. The error names the key.
    pub fn check(&self) -> Result<(), SshConfigError> {
        let key = "ssh.known_hosts";
        let Some(path) = &self.known_hosts else {
            return Err(SshConfigError {
                key,
                reason: "must be set when kick.transport is ssh: the file of host keys the targets are checked against (unknown hosts are never accepted)".into(),
            });
        };
        // Not opened unless a regular file: opening a FIFO would wait for a writer.
        let readable = std::fs::metadata(path).and_then(|meta| match meta.is_file() {
            true => std::fs::File::open(path).map(drop),
            false => Err(std::io::Error::other("not a regular file")),
        });
        readable.map_err(|e| SshConfigError { key, reason: format!("cannot read {}: {e}", path.display()) })
    }
}

/// A setting the SSH transport cannot work with: the key and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshConfigError {
    pub key: &'static str,
    pub reason: String,
}

impl fmt::Display for SshConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}' {}", self.key, self.reason)
    }
}

impl std::error::Error for SshConfigError {}

/// The address of a target: the certname given, or where to find it.
pub type AddressOf = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

pub struct SshTransport {
    settings: SshSettings,
    /// The kick's deadline: ssh is killed when it has not finished by then.
    timeout: Duration,
    /// Where the shared connections' sockets are (`ssh.control_master`).
    control_dir: PathBuf,
    address_of: AddressOf,
    program: OsString,
}

impl SshTransport {
    /// A transport with `settings` (checked: [`SshSettings::check`]); each kick is
    /// killed after `timeout`; shared connections' sockets go in `control_dir`
    /// (created, mode 0700, when `ssh.control_master` is on), or, when its path is
    /// too long for them, in a private directory of this user's in the system's
    /// temporary directory ([`short_control_dir`]); `address_of` gives a certname's
    /// address (the `ssh.address_fact`), else the certname is used.
    pub fn new(
        settings: SshSettings,
        timeout: Duration,
        control_dir: &Path,
        address_of: AddressOf,
    ) -> Result<SshTransport, SshConfigError> {
        settings.check()?;
        let mut control_dir = control_dir.to_path_buf();
        if settings.control_master {
            if let Err(excess) = check_control_dir(&control_dir) {
                let uid = crate::cache_dir::effective_uid();
                control_dir = short_control_dir(&std::env::temp_dir(), uid).map_err(|e| SshConfigError {
                    key: "ssh.control_master",
                    reason: format!(
                        "cannot keep ssh's sockets in {} ({}), nor in {}: set cache.dir to a path at least \
                         {excess} bytes shorter, or turn ssh.control_master off",
                        control_dir.display(),
                        too_long(excess),
                        e.reason,
                    ),
                })?;
            }
            use std::os::unix::fs::DirBuilderExt;
            if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&control_dir) {
                return Err(SshConfigError {
                    key: "ssh.control_master",
                    reason: format!("needs {} for its sockets: {e}", control_dir.display()),
                });
            }
        }
        Ok(SshTransport { settings, timeout, control_dir, address_of, program: "ssh".into() })
    }

    /// Runs `program` instead of `ssh` (tests).
    pub fn with_program(mut self, program: impl Into<OsString>) -> SshTransport {
        self.program = program.into();
        self
    }

    /// Where a kick of `certname` connects to: its address fact, else its certname,
    /// either checked as a host name.
    fn address(&self, certname: &str) -> Result<String, String> {
        let address = (self.address_of)(certname).filter(|a| !a.is_empty()).unwrap_or_else(|| certname.to_string());
        check_host(&address)?;
        Ok(address)
    }

    /// The socket of the shared connection to `address` (`ssh.control_master`): named
    /// after the destination as the kick gives it, with the user and port, so that
    /// each target has a connection of its own even where ssh's configuration sends
    /// several names to one `HostName`.
    pub fn control_path(&self, address: &str) -> PathBuf {
        let s = &self.settings;
        let port = s.port.map(|p| p.to_string()).unwrap_or_default();
        let key = [address, &port, s.user.as_deref().unwrap_or_default()].join("\0");
        let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
        let name: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        self.control_dir.join(&name[..SOCKET_NAME])
    }

    /// The `ssh` command for a kick of `address` in `environment` (checked).
    pub fn command(&self, address: &str, environment: &str) -> Command {
        self.command_with(address, environment, &[])
    }

    /// The same with `extra` words after the command's (a rollout's `--action`).
    fn command_with(&self, address: &str, environment: &str, extra: &[&str]) -> Command {
        let s = &self.settings;
        let mut command = Command::new(&self.program);
        let mut option = |o: String| {
            command.arg("-o").arg(o);
        };
        option("BatchMode=yes".into());
        option("StrictHostKeyChecking=yes".into());
        if let Some(known_hosts) = &s.known_hosts {
            option(format!("UserKnownHostsFile={}", ssh_path(known_hosts)));
        }
        option(format!("ConnectTimeout={}", s.connect_timeout.as_secs().max(1)));
        option("LogLevel=ERROR".into());
        if s.control_master {
            option("ControlMaster=auto".into());
            option(format!("ControlPersist={}", CONTROL_PERSIST.as_secs()));
            option(format!("ControlPath={}", ssh_path(&self.control_path(address))));
        } else {
            option("ControlMaster=no".into());
            option("ControlPath=none".into());
        }
        if let Some(identity) = &s.identity_file {
            option("IdentitiesOnly=yes".into());
            command.arg("-i").arg(ssh_path(identity));
        }
        if let Some(config) = &s.config_file {
            command.arg("-F").arg(config);
        }
        if let Some(user) = &s.user {
            command.arg("-l").arg(user);
        }
        if let Some(port) = s.port {
            command.arg("-p").arg(port.to_string());
        }
        command.arg("-T").arg("--").arg(address).arg(remote_command(&s.command, environment, extra));
        command
    }

    /// Runs the runonce script's `--action` on `target`: its answer's words, or why not.
    fn control(&self, target: &Server<'_>, action: &[&str]) -> Result<String, String> {
        if !self.controls_agents() {
            return Err(self.no_control());
        }
        let address = self.address(target.certname).map_err(|why| format!("ssh: {:?}: {why}", target.certname))?;
        check_environment(target.environment).map_err(|why| format!("ssh: {address}: {why}"))?;
        let deadline = Instant::now() + self.timeout;
        let finished = child::run(self.command_with(&address, target.environment, action), deadline, MAX_OUTPUT)
            .map_err(|e| format!("cannot run {}: {e}", self.program.to_string_lossy()))?;
        let Some(status) = finished.status else {
            return Err(format!("ssh to {address}: no answer within {}s (kick.reply_timeout)", self.timeout.as_secs()));
        };
        answer::read_control(&address, status.code(), &finished.stdout, &finished.stderr)
    }
}

impl Transport for SshTransport {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        let address = match self.address(&dispatch.target) {
            Ok(address) => address,
            Err(why) => return Outcome::Refused(format!("ssh: not kicking {:?}: {why}", dispatch.target)),
        };
        if let Err(why) = check_environment(&dispatch.environment) {
            return Outcome::Refused(format!("ssh: not kicking {address}: {why}"));
        }
        let deadline = Instant::now() + self.timeout;
        let command = self.command(&address, &dispatch.environment);
        match child::run(command, deadline, MAX_OUTPUT) {
            Err(e) => Outcome::Failed(format!("cannot run {}: {e}", self.program.to_string_lossy())),
            Ok(finished) => match finished.status {
                None => Outcome::Failed(format!(
                    "ssh to {address}: no answer within {}s (kick.reply_timeout); ssh was killed{}",
                    self.timeout.as_secs(),
                    Some(answer::clean(&String::from_utf8_lossy(&finished.stderr.bytes), answer::REASON_BYTES))
                        .filter(|e| !e.is_empty())
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )),
                Some(status) => answer::read(&address, status.code(), &finished.stdout, &finished.stderr),
            },
        }
    }

    fn max_parallel(&self) -> usize {
        self.settings.max_parallel
    }

    /// Only the runonce script knows the rollout's actions: a custom `ssh.command`
    /// (a forced command, a wrapper) may not.
    fn controls_agents(&self) -> bool {
        self.settings.command.iter().any(|word| word == RUNONCE_SCRIPT)
    }

    fn no_control(&self) -> String {
        "a custom ssh.command cannot be asked to disable, enable or give the last run: only the runonce script can"
            .to_string()
    }

    fn disable(&self, target: &Server<'_>, message: &str) -> Result<(), String> {
        self.control(target, &["--action", "disable", "--message", message]).map(drop)
    }

    fn enable(&self, target: &Server<'_>) -> Result<(), String> {
        self.control(target, &["--action", "enable"]).map(drop)
    }

    fn last_run(&self, target: &Server<'_>) -> Result<LastRun, String> {
        let words = self.control(target, &["--action", "last_run"])?;
        let numbers: Vec<i64> = words.split_whitespace().map(|w| w.parse().unwrap_or(0)).collect();
        let [at, has_resources, failed, failed_events, changed] = numbers[..] else {
            return Err(format!("ssh: {}: unreadable last run {words:?}", target.certname));
        };
        let at = (at > 0).then(|| at.saturating_mul(1000));
        Ok(LastRun::from_counts(at, has_resources != 0, failed, failed_events, changed))
    }
}

/// A host name or address `ssh` may be given as its destination: a DNS name or
/// certname (letters, digits, `-`, `_`, `.`; not starting with `-` or `.`), an IPv4
/// or an IPv6 address. Anything else (an option, a `user@`, spaces, shell
/// characters) is refused with the reason.
pub fn check_host(host: &str) -> Result<(), String> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if host.is_empty() || host.len() > MAX_HOST {
        return Err(format!("not a host name (1 to {MAX_HOST} characters)"));
    }
    if host.starts_with(['-', '.']) || !host.chars().all(allowed) {
        return Err(
            "not a host name (letters, digits, '-', '_' and '.', not starting with '-' or '.'), nor an IP address"
                .into(),
        );
    }
    Ok(())
}

/// An environment the kick may pass: word characters, at most [`MAX_ENVIRONMENT`]
/// (the `puppet` agent DDL's rule); empty means none.
pub fn check_environment(environment: &str) -> Result<(), String> {
    if environment.len() <= MAX_ENVIRONMENT && environment.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!(
            "the environment {:?} is not a Puppet environment name (letters, digits and '_', at most {MAX_ENVIRONMENT})",
            answer::clean(environment, 100)
        ))
    }
}

/// The one string ssh sends for the remote shell: `command`, the environment
/// (`--environment E` when there is one), then `extra`, each word quoted for a
/// POSIX shell.
pub fn remote_command(command: &[String], environment: &str, extra: &[&str]) -> String {
    let mut words: Vec<&str> = command.iter().map(String::as_str).collect();
    if !environment.is_empty() {
        words.extend(["--environment", environment]);
    }
    words.extend(extra);
    words.iter().map(|w| shell_quoted(w)).collect::<Vec<_>>().join(" ")
}

/// `word` as one word for a POSIX shell: as is when it holds only safe characters,
/// else in single quotes.
fn shell_quoted(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// A path as ssh reads it in an option (`-o`, `-i`): `%` doubled (ssh expands `%`
/// tokens in these), and in double quotes when it has spaces.
fn ssh_path(path: &Path) -> String {
    let path = path.to_string_lossy().replace('%', "%%");
    if path.contains([' ', '\t']) {
        format!("\"{path}\"")
    } else {
        path
    }
}

/// Where the sockets go when `<cache.dir>/ssh` is too long for them:
/// `<tmp>/puppet-kicker-ssh-<uid>`, made mode 0700, or, when it exists, used only
/// if it is a directory (not a link) of this user's that no one else can enter.
pub fn short_control_dir(tmp: &Path, uid: u32) -> Result<PathBuf, SshConfigError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = tmp.join(format!("puppet-kicker-ssh-{uid}"));
    let refused =
        |why: String| SshConfigError { key: "ssh.control_master", reason: format!("{} {why}", dir.display()) };
    check_control_dir(&dir).map_err(|excess| refused(format!("is too long ({})", too_long(excess))))?;
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refused(format!("cannot be made: {e}"))),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| refused(format!("cannot be inspected: {e}")))?;
    if !meta.is_dir() {
        return Err(refused("is not a directory".into()));
    }
    if meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(refused(format!(
            "is not this user's private directory (owner uid {}, mode {:04o}; want uid {uid}, mode 0700)",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(dir)
}

/// Whether ssh can make its sockets in `dir`: the longest path it makes there (a
/// socket's name and the suffix of its temporary name) must fit in a Unix socket
/// address. The error is how many bytes it is over.
fn check_control_dir(dir: &Path) -> Result<(), usize> {
    let longest = dir.as_os_str().len() + 1 + SOCKET_NAME + SOCKET_TEMP_SUFFIX;
    match longest.checked_sub(MAX_SOCKET_PATH) {
        None | Some(0) => Ok(()),
        Some(excess) => Err(excess),
    }
}

/// What [`check_control_dir`]'s error means, for a message.
fn too_long(excess: usize) -> String {
    format!(
        "ssh would make paths of {} bytes there, and a Unix socket's path is at most {MAX_SOCKET_PATH}",
        MAX_SOCKET_PATH + excess
    )
}

#[cfg(test)]
mod tests;
