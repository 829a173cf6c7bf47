use super::*;
use crate::kick::Chain;

fn settings() -> SshSettings {
    SshSettings {
        user: Some("kicker".into()),
        port: Some(2222),
        identity_file: Some("/etc/puppet/kick_key".into()),
        known_hosts: Some("/etc/puppet/kick_known_hosts".into()),
        config_file: None,
        connect_timeout: Duration::from_secs(5),
        command: SshSettings::default_command(),
        control_master: false,
        max_parallel: 4,
        address_fact: "fqdn".into(),
    }
}

fn transport(settings: SshSettings) -> SshTransport {
    SshTransport {
        settings,
        timeout: Duration::from_secs(10),
        control_dir: "/var/cache/pk/ssh".into(),
        address_of: Box::new(|certname| (certname == "lb1").then(|| "lb1.example.com".to_string())),
        program: "ssh".into(),
    }
}

fn argv(command: &Command) -> Vec<String> {
    command.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
}

#[test]
fn the_ssh_command_never_prompts_never_accepts_an_unknown_host_and_ends_options() {
    let t = transport(settings());
    let args = argv(&t.command("lb1.example.com", "production"));
    let expected_start = [
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UserKnownHostsFile=/etc/puppet/kick_known_hosts",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "-o",
        "IdentitiesOnly=yes",
        "-i",
        "/etc/puppet/kick_key",
        "-l",
        "kicker",
        "-p",
        "2222",
        "-T",
        "--",
        "lb1.example.com",
    ];
    assert_eq!(args[..expected_start.len()], expected_start);
    assert_eq!(args.len(), expected_start.len() + 1, "{args:?}");
    let remote = &args[expected_start.len()];
    assert!(remote.starts_with("sudo -n /bin/sh -c 'answer() {"), "{remote}");
    assert!(remote.ends_with("' puppet-kicker-runonce --environment production"), "{remote}");

    let shared = transport(SshSettings { control_master: true, ..settings() });
    let args = argv(&shared.command("lb1.example.com", ""));
    let joined = args.join(" ");
    let socket = shared.control_path("lb1.example.com");
    assert!(
        joined.contains(&format!("-o ControlMaster=auto -o ControlPersist=60 -o ControlPath={}", socket.display())),
        "{joined}"
    );
    assert!(args.last().unwrap().ends_with("' puppet-kicker-runonce"), "no environment, no --environment: {joined}");
}

#[test]
fn each_destination_user_and_port_has_a_socket_of_its_own_with_a_short_name() {
    let t = transport(SshSettings { control_master: true, ..settings() });
    let lb1 = t.control_path("lb1.example.com");
    assert_eq!(lb1.parent(), Some(Path::new("/var/cache/pk/ssh")));
    let name = lb1.file_name().unwrap().to_str().unwrap();
    assert!(name.len() == SOCKET_NAME && name.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    assert_eq!(t.control_path("lb1.example.com"), lb1, "the same destination, the same socket");
    assert_ne!(t.control_path("lb2.example.com"), lb1);
    let other_port = transport(SshSettings { control_master: true, port: Some(22), ..settings() });
    assert_ne!(other_port.control_path("lb1.example.com"), lb1);
    let other_user = transport(SshSettings { control_master: true, user: None, ..settings() });
    assert_ne!(other_user.control_path("lb1.example.com"), lb1);
}

#[test]
fn paths_reach_ssh_with_their_percent_signs_and_spaces_intact() {
    let t = SshTransport {
        control_dir: "/srv/100% kick/ssh".into(),
        ..transport(SshSettings {
            control_master: true,
            known_hosts: Some("/etc/kick %h/known hosts".into()),
            identity_file: Some("/etc/kick/%u_key".into()),
            ..settings()
        })
    };
    let args = argv(&t.command("lb1.example.com", ""));
    assert!(args.contains(&"UserKnownHostsFile=\"/etc/kick %%h/known hosts\"".to_string()), "{args:?}");
    assert!(args.contains(&"/etc/kick/%%u_key".to_string()), "{args:?}");
    let socket = t.control_path("lb1.example.com");
    let name = socket.file_name().unwrap().to_str().unwrap();
    assert!(args.contains(&format!("ControlPath=\"/srv/100%% kick/ssh/{name}\"")), "{args:?}");
}

#[test]
fn a_cache_dir_too_long_for_the_sockets_has_them_in_a_short_private_dir() {
    let fits = format!("/{}", "d".repeat(MAX_SOCKET_PATH - SOCKET_TEMP_SUFFIX - SOCKET_NAME - 2));
    assert_eq!(check_control_dir(Path::new(&fits)), Ok(()));
    // The default cache dirs of Debian's and the AIO puppetserver fit.
    for dir in ["/var/lib/puppetserver/puppet_kicker/ssh", "/opt/puppetlabs/server/data/puppetserver/puppet_kicker/ssh"]
    {
        assert_eq!(check_control_dir(Path::new(dir)), Ok(()), "{dir}");
    }
    let long = format!("{fits}xyz");
    let e = check_control_dir(Path::new(&long)).unwrap_err();
    assert_eq!(e, 3);
    assert_eq!(too_long(e), "ssh would make paths of 110 bytes there, and a Unix socket's path is at most 107");
    let dir = crate::snapshot::tests::tempdir("ssh-long-control-dir");
    std::fs::write(dir.join("known_hosts"), "").unwrap();
    let long = dir.join("d".repeat(100));
    let made = SshTransport::new(
        SshSettings { known_hosts: Some(dir.join("known_hosts")), control_master: true, ..settings() },
        Duration::from_secs(5),
        &long,
        Box::new(|_| None),
    )
    .unwrap();
    let uid = crate::cache_dir::effective_uid();
    assert_eq!(
        made.control_dir,
        std::env::temp_dir().join(format!("puppet-kicker-ssh-{uid}")),
        "the short one instead"
    );
    assert!(!long.exists(), "nothing is created where sockets cannot be made");
}

#[test]
fn the_short_socket_dir_is_made_private_and_refused_when_someone_else_could_enter_it() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = crate::snapshot::tests::tempdir("ssh-short-control-dir");
    let uid = crate::cache_dir::effective_uid();
    let dir = short_control_dir(&tmp, uid).unwrap();
    assert_eq!(dir, tmp.join(format!("puppet-kicker-ssh-{uid}")));
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(short_control_dir(&tmp, uid).unwrap(), dir, "found again as it is");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = short_control_dir(&tmp, uid).unwrap_err();
    assert!(e.reason.contains("is not this user's private directory") && e.reason.contains("mode 0755"), "{e}");
    let someone_else = short_control_dir(&tmp, uid + 1).unwrap_err();
    assert!(someone_else.reason.contains("is not this user's private directory"), "{someone_else}");
    std::fs::remove_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&tmp, &dir).unwrap();
    assert!(short_control_dir(&tmp, uid).unwrap_err().reason.contains("is not a directory"));
    let long = tmp.join("t".repeat(100));
    assert_eq!(short_control_dir(&long, uid).unwrap_err().key, "ssh.control_master", "too long itself: refused");
}

#[test]
fn the_remote_command_reaches_the_remote_shell_word_for_word() {
    let command: Vec<String> = ["printf", "%s|", "it's", "a b", "$HOME", "`id`", "", "ok"].map(String::from).to_vec();
    let line = remote_command(&command, "prod_1", &["--message", "rollout 'x' $(id)"]);
    // What sshd does with it: the login shell's `-c`.
    let out = std::process::Command::new("/bin/sh").arg("-c").arg(&line).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "it's|a b|$HOME|`id`||ok|--environment|prod_1|--message|rollout 'x' $(id)|"
    );
}

#[test]
fn a_hostile_target_or_environment_is_refused_before_ssh_runs() {
    // `program` does not exist: had ssh been run, the outcome would say so.
    let t = SshTransport {
        address_of: Box::new(|certname| match certname {
            "evil-fact" => Some("-oProxyCommand=touch /tmp/pwned".to_string()),
            _ => None,
        }),
        ..transport(settings())
    }
    .with_program("/nonexistent/ssh");
    let dispatch = |target: &str, environment: &str| Dispatch {
        target: target.into(),
        environment: environment.into(),
        chain: Chain::default(),
        attempt: 1,
    };
    for target in
        ["-oProxyCommand=touch /tmp/pwned", "evil-fact", "root@lb1", "lb1;id", "lb1 x", ".lb1", "", "lb1$(id)"]
    {
        match t.runonce(&dispatch(target, "production")) {
            Outcome::Refused(why) => assert!(why.contains("not a host name"), "{target}: {why}"),
            other => panic!("{target}: {other:?}"),
        }
    }
    match t.runonce(&dispatch("lb1", "prod;id")) {
        Outcome::Refused(why) => assert!(why.contains("is not a Puppet environment name"), "{why}"),
        other => panic!("{other:?}"),
    }
    match t.runonce(&dispatch("lb1", &"e".repeat(51))) {
        Outcome::Refused(why) => assert!(why.contains("at most 50"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Good names get as far as running the program.
    for (target, environment) in [("lb1", "production"), ("web-1.example.com", ""), ("10.0.0.1", "a"), ("::1", "b")] {
        match t.runonce(&dispatch(target, environment)) {
            Outcome::Failed(why) => assert!(why.starts_with("cannot run /nonexistent/ssh"), "{target}: {why}"),
            other => panic!("{target}: {other:?}"),
        }
    }
}

#[test]
fn known_hosts_is_required_and_must_be_readable() {
    let missing = SshSettings { known_hosts: None, ..settings() };
    let e = missing.check().unwrap_err();
    assert_eq!(e.key, "ssh.known_hosts");
    assert!(e.to_string().starts_with("'ssh.known_hosts' must be set when kick.transport is ssh"), "{e}");
    let unreadable = SshSettings { known_hosts: Some("/nonexistent/known_hosts".into()), ..settings() };
    let e = unreadable.check().unwrap_err().to_string();
    assert!(e.starts_with("'ssh.known_hosts' cannot read /nonexistent/known_hosts: "), "{e}");
    let directory = SshSettings { known_hosts: Some("/".into()), ..settings() };
    assert_eq!(directory.check().unwrap_err().reason, "cannot read /: not a regular file");
    // A FIFO is refused without opening it (which would wait for a writer).
    let dir = crate::snapshot::tests::tempdir("ssh-fifo");
    let fifo = dir.join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let pipe = SshSettings { known_hosts: Some(fifo), ..settings() };
    assert!(pipe.check().unwrap_err().reason.ends_with(": not a regular file"));
    std::fs::write(dir.join("known_hosts"), "").unwrap();
    let readable = SshSettings { known_hosts: Some(dir.join("known_hosts")), ..settings() };
    assert_eq!(readable.check(), Ok(()));
}

#[test]
fn debug_shows_the_settings_but_not_the_script() {
    let debug = format!("{:?}", settings());
    assert!(debug.contains("kick_key") && debug.contains("max_parallel: 4"), "{debug}");
    assert!(!debug.contains("answer()"), "{debug}");
}

fn parse(yaml: &str) -> Result<crate::config::Config, String> {
    let settings = crate::config::PuppetSettings::default();
    crate::config::Config::parse(yaml, Path::new("/etc/puppet/puppet_kicker.yaml"), &settings)
        .map_err(|e| e.to_string())
}

#[test]
fn the_ssh_keys_are_read_and_known_hosts_is_a_configuration_error_naming_the_key_and_file() {
    let e = parse("kick:\n  transport: ssh\n").unwrap_err();
    assert!(
        e.starts_with("/etc/puppet/puppet_kicker.yaml: 'ssh.known_hosts' must be set when kick.transport is ssh"),
        "{e}"
    );
    let e = parse("kick:\n  transport: ssh\nssh:\n  known_hosts: /nonexistent/kh\n").unwrap_err();
    assert!(e.starts_with("/etc/puppet/puppet_kicker.yaml: 'ssh.known_hosts' cannot read /nonexistent/kh: "), "{e}");
    // Unset is fine while another transport is in use.
    assert_eq!(parse("ssh:\n  user: x\n").unwrap().kick.transport, crate::kick::TransportKind::Mcollective);
    assert!(parse("kick:\n  transport: rsh\n").unwrap_err().contains("'mcollective', 'choria' or 'ssh'"));

    let dir = crate::snapshot::tests::tempdir("ssh-keys");
    std::fs::write(dir.join("known_hosts"), "").unwrap();
    let yaml = format!(
        "kick:\n  transport: ssh\nssh:\n  known_hosts: {0}/known_hosts\n  identity_file: id_kick\n  user: kicker\n  port: 2222\n  connect_timeout: 3s\n  command: [sudo, -n, /usr/local/sbin/kick]\n  control_master: false\n  max_parallel: 8\n  address_fact: networking.fqdn\n",
        dir.display()
    );
    let ssh = parse(&yaml).unwrap().kick.ssh;
    assert_eq!(ssh.known_hosts, Some(dir.join("known_hosts")));
    assert_eq!(ssh.identity_file, Some(PathBuf::from("/etc/puppet/id_kick")), "relative to the file");
    assert_eq!((ssh.user.as_deref(), ssh.port), (Some("kicker"), Some(2222)));
    assert_eq!(ssh.connect_timeout, Duration::from_secs(3));
    assert_eq!(ssh.command, ["sudo", "-n", "/usr/local/sbin/kick"]);
    assert_eq!((ssh.control_master, ssh.max_parallel, ssh.address_fact.as_str()), (false, 8, "networking.fqdn"));

    assert!(parse("ssh:\n  command: []\n").unwrap_err().contains("a list of strings"));
    assert!(parse("ssh:\n  command: sudo puppet\n").unwrap_err().contains("a list of strings"));
    assert!(parse("ssh:\n  port: 70000\n").unwrap_err().contains("a port (1 to 65535)"));
    assert!(parse("ssh:\n  max_parallel: 1000\n").unwrap_err().contains("must be at most 256"));
}

#[test]
fn the_defaults_are_the_documented_ones() {
    let k = crate::kick::KickSettings::default();
    assert_eq!(k.transport, crate::kick::TransportKind::Mcollective);
    let s = k.ssh;
    assert_eq!((&s.user, s.port, &s.identity_file, &s.known_hosts, &s.config_file), (&None, None, &None, &None, &None));
    assert_eq!(s.connect_timeout, Duration::from_secs(5));
    assert_eq!(s.command, SshSettings::default_command());
    assert_eq!(s.shown_command(), ["sudo", "-n", "/bin/sh", "-c", "<the runonce script>", "puppet-kicker-runonce"]);
    assert_eq!((s.control_master, s.max_parallel, s.address_fact.as_str()), (true, 16, "fqdn"));
}

/// docs/ssh.md shows the script the default command runs, as it is.
#[test]
fn docs_show_the_runonce_script() {
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ssh.md")).unwrap();
    assert!(docs.contains(&format!("```sh\n{RUNONCE_SCRIPT}```\n")), "docs/ssh.md must show RUNONCE_SCRIPT verbatim");
}
