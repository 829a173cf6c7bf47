//! The SSH transport against a real OpenSSH server of the test's own: Debian's
//! `/usr/sbin/sshd` with its own configuration, host key, authorized keys and port
//! on 127.0.0.1, stopped by pid (the machine's sshd, /etc/ssh and ~/.ssh are never
//! used). The ssh client is the system's. What is fake is only the target's `puppet`:
//! a script on the session's PATH that answers `puppet config print` with lock files
//! in the test's directory and records each `puppet agent` it is asked to start.
//! The default remote command (the runonce script) runs as it is, without `sudo`.

use puppet_kicker::kick::{
    Chain, Dispatch, KickConfig, KickService, Outcome, SshSettings, SshTransport, Target, Transport,
};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/sshd.rs"]
mod sshd;
mod support;
use sshd::*;

fn dispatch(target: &str, environment: &str) -> Dispatch {
    Dispatch { target: target.into(), environment: environment.into(), chain: Chain::default(), attempt: 1 }
}

const TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn a_kick_starts_exactly_one_background_run_with_its_environment() {
    let sshd = Sshd::start("started");
    let transport = sshd.transport(sshd.settings(), TIMEOUT);
    assert_eq!(transport.runonce(&dispatch("lb1", "staging")), Outcome::Started, "{}", sshd.log());
    assert_eq!(
        sshd.runs(),
        ["agent --onetime --daemonize --no-splay --no-usecacheonfailure --color=false --environment staging"]
    );
}

#[test]
fn a_run_in_progress_is_busy_and_a_disabled_agent_disabled_and_neither_starts_a_run() {
    let sshd = Sshd::start("busy");
    let transport = sshd.transport(sshd.settings(), TIMEOUT);
    // A live process holds the run lock: this test's own.
    std::fs::write(sshd.state("agent_catalog_run.lock"), std::process::id().to_string()).unwrap();
    let busy = transport.runonce(&dispatch("lb1", "production"));
    let why = format!("Puppet is currently applying a catalog (pid {}), cannot run now", std::process::id());
    assert_eq!(busy, Outcome::Busy(why));
    // A lock left by a process that is gone is no run in progress.
    std::fs::write(sshd.state("agent_catalog_run.lock"), "999999999").unwrap();
    std::fs::write(sshd.state("agent_disabled.lock"), r#"{"disabled_message":"kernel upgrade, back at 14:00"}"#)
        .unwrap();
    let disabled = transport.runonce(&dispatch("lb1", "production"));
    assert_eq!(disabled, Outcome::Disabled("Puppet is disabled, cannot run now: kernel upgrade, back at 14:00".into()));
    assert!(sshd.runs().is_empty(), "{:?}", sshd.runs());
}

#[test]
fn an_idle_daemon_is_woken_with_sigusr1_instead_of_a_second_agent() {
    let sshd = Sshd::start("idle");
    let transport = sshd.transport(sshd.settings(), TIMEOUT);
    let signalled = sshd.dir.join("signalled");
    let mut daemon = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("trap 'echo usr1 >> {}' USR1; while :; do sleep 0.05; done", signalled.display()))
        .spawn()
        .unwrap();
    std::fs::write(sshd.state("agent.pid"), daemon.id().to_string()).unwrap();
    let outcome = transport.runonce(&dispatch("lb1", "production"));
    let deadline = Instant::now() + Duration::from_secs(5);
    // Until the trap's line is whole: the shell creates the file before it writes it.
    while !std::fs::read_to_string(&signalled).is_ok_and(|s| s.ends_with('\n')) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(outcome, Outcome::Started);
    assert_eq!(std::fs::read_to_string(&signalled).unwrap(), "usr1\n");
    assert!(sshd.runs().is_empty(), "no second agent: {:?}", sshd.runs());
}

#[test]
fn an_unknown_host_key_is_refused_and_nothing_runs() {
    let sshd = Sshd::start("hostkey");
    // known_hosts lists another key for this address: a man in the middle, or a new host.
    let settings = SshSettings { known_hosts: Some(sshd.known_hosts("other_host_key")), ..sshd.settings() };
    match sshd.transport(settings, TIMEOUT).runonce(&dispatch("lb1", "production")) {
        Outcome::Failed(why) => assert!(
            why.starts_with("ssh to 127.0.0.1: the host key is unknown or does not match known_hosts")
                && why.contains("Host key verification failed"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // Not listed at all.
    let empty = sshd.dir.join("known_hosts-empty");
    std::fs::write(&empty, "").unwrap();
    let settings = SshSettings { known_hosts: Some(empty), ..sshd.settings() };
    match sshd.transport(settings, TIMEOUT).runonce(&dispatch("lb1", "production")) {
        Outcome::Failed(why) => assert!(why.contains("the host key is unknown"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(sshd.runs().is_empty());
}

#[test]
fn a_key_the_target_does_not_accept_fails_with_the_reason() {
    let sshd = Sshd::start("badkey");
    let settings = SshSettings { identity_file: Some(sshd.dir.join("stranger_key")), ..sshd.settings() };
    match sshd.transport(settings, TIMEOUT).runonce(&dispatch("lb1", "production")) {
        Outcome::Failed(why) => {
            assert!(why.starts_with("ssh to 127.0.0.1: the target refused the key"), "{why}");
            assert!(why.contains("Permission denied (publickey)"), "{why}");
            let key = std::fs::read_to_string(sshd.dir.join("stranger_key")).unwrap();
            let body = key.lines().nth(1).unwrap();
            assert!(!why.contains(body), "the key itself in the reason");
        }
        other => panic!("{other:?}"),
    }
    assert!(sshd.runs().is_empty());
}

#[test]
fn a_remote_that_hangs_is_killed_at_the_deadline() {
    let sshd = Sshd::start("hang");
    let settings = SshSettings { command: vec!["sleep".into(), "60".into()], ..sshd.settings() };
    let started = Instant::now();
    let outcome = sshd.transport(settings, Duration::from_secs(2)).runonce(&dispatch("lb1", ""));
    let took = started.elapsed();
    assert_eq!(
        outcome,
        Outcome::Failed("ssh to 127.0.0.1: no answer within 2s (kick.reply_timeout); ssh was killed".into())
    );
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(4), "{took:?}");
}

#[test]
fn a_hostile_address_fact_is_refused_without_running_ssh() {
    let sshd = Sshd::start("hostile");
    let pwned = sshd.dir.join("pwned");
    let hostile = format!("-oProxyCommand=touch {}", pwned.display());
    let address = hostile.clone();
    let transport = SshTransport::new(
        sshd.settings(),
        TIMEOUT,
        &sshd.dir.join("control"),
        Box::new(move |_| Some(address.clone())),
    )
    .unwrap();
    match transport.runonce(&dispatch("lb1", "production")) {
        Outcome::Refused(why) => assert!(why.contains("not a host name"), "{why}"),
        other => panic!("{other:?}"),
    }
    match sshd.transport(sshd.settings(), TIMEOUT).runonce(&dispatch("lb1", "production; touch /tmp/x")) {
        Outcome::Refused(why) => assert!(why.contains("not a Puppet environment name"), "{why}"),
        other => panic!("{other:?}"),
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(!pwned.exists());
    assert!(sshd.runs().is_empty());
}

#[test]
fn shared_connections_serve_later_kicks_and_are_kept_under_the_control_dir() {
    let sshd = Sshd::start("control");
    let settings = SshSettings { control_master: true, ..sshd.settings() };
    let transport = sshd.transport(settings.clone(), TIMEOUT);
    assert_eq!(transport.runonce(&dispatch("lb1", "production")), Outcome::Started);
    let control = sshd.dir.join("control");
    let sockets: Vec<_> = std::fs::read_dir(&control).unwrap().collect();
    assert_eq!(sockets.len(), 1, "one master socket in {}", control.display());
    let mode = std::fs::metadata(&control).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let started = Instant::now();
    assert_eq!(transport.runonce(&dispatch("lb1", "production")), Outcome::Started);
    let reused = started.elapsed();
    assert_eq!(sshd.runs().len(), 2);
    // The master is told to exit (it would otherwise stay for ControlPersist).
    let kick = transport.command("127.0.0.1", "");
    let args: Vec<_> = kick.get_args().map(|a| a.to_owned()).collect();
    let dash = args.iter().position(|a| a == "--").unwrap();
    let out = Command::new("ssh").args(&args[..dash]).args(["-O", "exit", "--", "127.0.0.1"]).output().unwrap();
    assert!(out.status.success(), "ssh -O exit: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("a kick over the shared connection took {reused:?}");
}

#[test]
fn kicks_of_many_servers_go_out_at_most_max_parallel_at_a_time() {
    let sshd = Sshd::start("parallel");
    let (running, seen, counts) = (sshd.dir.join("running"), sshd.dir.join("seen"), sshd.dir.join("counts"));
    std::fs::create_dir_all(&running).unwrap();
    std::fs::create_dir_all(&seen).unwrap();
    // Each remote command notes how many run with it as it starts, and waits (up to
    // 15 s) for a second one to have started: the first two must overlap, however slow
    // the machine. Two at once is the most there may ever be.
    let script = format!(
        "touch {r}/$$ {s}/$$; ls {r} | wc -l >> {c}; i=0; \
         while [ \"$(ls {s} | wc -l)\" -lt 2 ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; \
         sleep 0.2; rm {r}/$$",
        r = running.display(),
        s = seen.display(),
        c = counts.display()
    );
    let settings =
        SshSettings { command: vec!["/bin/sh".into(), "-c".into(), script], max_parallel: 2, ..sshd.settings() };
    let transport = sshd.transport(settings, TIMEOUT);
    let cache = sshd.dir.join("cache");
    let config = KickConfig { coalesce_ms: 0, ..KickConfig::default() };
    let service = KickService::start(config, &cache, Ok(Box::new(transport)), Box::new(|| {})).unwrap();
    let report = support::role_kick("node1", "Notify[kick -> web]", "web");
    let targets: Vec<Target> =
        (1..=6).map(|i| Target { certname: format!("web{i}"), role: Some("web".into()) }).collect();
    service.report(&report, |_, _| targets.clone(), |_| Some("node".into()));
    assert_eq!(service.flush(Duration::from_secs(120)), 0, "{:?}", service.take_log());
    let status = service.status();
    let started = status["recent_outcomes"].as_array().unwrap().iter().filter(|o| o["result"] == "started").count();
    assert_eq!(started, 6, "{status}");
    let counts: Vec<usize> =
        std::fs::read_to_string(&counts).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(counts.len(), 6, "each remote command ran once: {counts:?}");
    assert_eq!(counts.iter().max(), Some(&2), "ssh.max_parallel 2: {counts:?}");
}

#[test]
fn the_transport_is_refused_without_a_readable_known_hosts() {
    let dir = std::env::temp_dir().join(format!("pk-ssh-nokh-{}", std::process::id()));
    let settings =
        SshSettings { known_hosts: Some(dir.join("missing")), ..puppet_kicker::kick::KickSettings::default().ssh };
    let error = SshTransport::new(settings, TIMEOUT, &dir, Box::new(|_| None)).err().expect("refused");
    assert_eq!(error.key, "ssh.known_hosts");
    assert!(error.to_string().contains(&dir.join("missing").display().to_string()), "{error}");
}

#[test]
fn the_script_runs_the_puppet_it_is_given() {
    let sshd = Sshd::start("puppet-path");
    let alternative = sshd.dir.join("alt-puppet");
    let runs = sshd.dir.join("alt-runs");
    let stub = std::fs::read_to_string(sshd.dir.join("bin/puppet")).unwrap();
    let runs_file = sshd.dir.join("runs").display().to_string();
    write_executable(&alternative, &stub.replace(&runs_file, &runs.display().to_string()));
    let mut command = SshSettings::script_command();
    command.extend(["--puppet".to_string(), alternative.display().to_string()]);
    let transport = sshd.transport(SshSettings { command, ..sshd.settings() }, TIMEOUT);
    assert_eq!(transport.runonce(&dispatch("lb1", "production")), Outcome::Started);
    let alternative_runs = std::fs::read_to_string(&runs).unwrap();
    assert!(alternative_runs.ends_with("--environment production\n"), "{alternative_runs}");
    assert!(sshd.runs().is_empty(), "the puppet on the PATH was not asked");

    let mut command = SshSettings::script_command();
    command.extend(["--puppet".to_string(), "/nonexistent/puppet".to_string()]);
    let transport = sshd.transport(SshSettings { command, ..sshd.settings() }, TIMEOUT);
    assert_eq!(
        transport.runonce(&dispatch("lb1", "production")),
        Outcome::Failed("127.0.0.1: /nonexistent/puppet is not an executable".into())
    );
}

#[test]
fn a_rollout_disables_and_enables_the_agent_and_reads_its_last_run_summary() {
    use puppet_kicker::kick::{LastRun, RunStatus, Server, Transport};
    let sshd = Sshd::start("control");
    let transport = sshd.transport(sshd.settings(), TIMEOUT);
    assert!(transport.controls_agents());
    let target = Server { certname: "node1.example.com", environment: "production" };

    transport.disable(&target, "puppet kicker rollout 20261129T050000Z").unwrap();
    let lock = std::fs::read_to_string(sshd.state("agent_disabled.lock")).unwrap();
    assert_eq!(lock, r#"{"disabled_message":"puppet kicker rollout 20261129T050000Z"}"#);
    let again = transport.disable(&target, "someone else").unwrap_err();
    assert_eq!(again, "Already disabled: puppet kicker rollout 20261129T050000Z");
    assert!(matches!(transport.runonce(&dispatch("node1.example.com", "production")), Outcome::Disabled(_)));
    transport.enable(&target).unwrap();
    assert!(!sshd.state("agent_disabled.lock").exists());
    assert_eq!(transport.enable(&target).unwrap_err(), "Already enabled");
    assert!(sshd.runs().is_empty(), "no run was started");

    // No summary yet: never ran. Then summaries as Puppet writes them.
    assert_eq!(transport.last_run(&target).unwrap(), LastRun { at: None, status: RunStatus::Failed });
    let summary = |failed: u32, changed: u32, failure: u32| {
        format!(
            "---\nversion:\n  config: 1795926000\n  puppet: 7.23.0\nresources:\n  changed: {changed}\n  corrective_change: 0\n  \
             failed: {failed}\n  failed_to_restart: 0\n  out_of_sync: {changed}\n  restarted: 0\n  scheduled: 0\n  skipped: 0\n  \
             total: 8\ntime:\n  notify: 0.001\n  total: 0.5\n  last_run: 1795926007\nchanges:\n  total: {changed}\n\
             events:\n  failure: {failure}\n  success: {changed}\n  total: {changed}\n"
        )
    };
    let write = |text: String| std::fs::write(sshd.state("last_run_summary.yaml"), text).unwrap();
    write(summary(0, 1, 0));
    assert_eq!(
        transport.last_run(&target).unwrap(),
        LastRun { at: Some(1_795_926_007_000), status: RunStatus::Changed }
    );
    write(summary(0, 0, 0));
    assert_eq!(transport.last_run(&target).unwrap().status, RunStatus::Unchanged);
    write(summary(1, 0, 1));
    assert_eq!(transport.last_run(&target).unwrap().status, RunStatus::Failed);
    // A failed catalog: a summary with no resources.
    write("---\nversion:\n  config: \n  puppet: 7.23.0\ntime:\n  last_run: 1795926099\n".into());
    assert_eq!(
        transport.last_run(&target).unwrap(),
        LastRun { at: Some(1_795_926_099_000), status: RunStatus::Failed }
    );

    // A custom ssh.command is not the runonce script: no rollout through it.
    let custom = sshd.transport(SshSettings { command: vec!["true".into()], ..sshd.settings() }, TIMEOUT);
    assert!(!custom.controls_agents());
    assert!(custom.disable(&target, "x").unwrap_err().contains("only the runonce script can"));
}
