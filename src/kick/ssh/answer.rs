//! What runs on the target, and how its answer is read.
//!
//! [`RUNONCE_SCRIPT`] does there what the Choria/mcollective `puppet` agent's
//! `runonce` does (choria-plugins/puppet-agent, `PuppetAgentMgr#runonce!`): a run in
//! progress answers busy, a disabled agent answers disabled with its message, an
//! idle daemon gets SIGUSR1, and with no daemon one run starts in the background.
//! It never waits for the run. It answers in one line, `puppet-kicker runonce: WORD
//! WHY`, which [`read`] turns into the planner's outcome; any other command is read
//! by its exit status and text, as `classify` reads an mcollective reply.

use super::child::Captured;
use crate::kick::Outcome;

/// The prefix of the answer line.
pub const ANSWER: &str = "puppet-kicker runonce: ";

/// POSIX sh, run as `sh -c RUNONCE_SCRIPT puppet-kicker-runonce [--puppet PATH]
/// [--environment E] [--action runonce|disable|enable|last_run] [--message M]`
/// (`--puppet`: the `puppet` command to use, else the first on the PATH). The other
/// actions are what a rollout asks (`puppet agent --disable M`, `--enable`, and the
/// last run's summary as `last_run END HAS_RESOURCES FAILED FAILED_EVENTS CHANGED`).
/// Where Puppet keeps its lock files is asked of Puppet itself (`puppet config
/// print`), so the same script works with Debian's `puppet` package and the
/// puppetlabs/openvox AIO packages (`/opt/puppetlabs/bin` is looked in first).
pub const RUNONCE_SCRIPT: &str = r#"answer() { echo "puppet-kicker runonce: $*"; }
environment= puppet= action=runonce message=
while [ $# -gt 0 ]; do
  case $1 in
    --environment) environment=${2-} ;;
    --puppet) puppet=${2-} ;;
    --action) action=${2-} ;;
    --message) message=${2-} ;;
    *) answer refused "unknown argument"; exit 2 ;;
  esac
  [ $# -gt 1 ] && shift; shift
done
case $environment in *[!A-Za-z0-9_]*) answer refused "invalid environment"; exit 2 ;; esac
case $action in runonce|disable|enable|last_run) ;; *) answer refused "unknown action"; exit 2 ;; esac
PATH=/opt/puppetlabs/bin:$PATH:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
if [ -z "$puppet" ]; then puppet=$(command -v puppet) || { answer failed "no puppet command on $PATH"; exit 1; }; fi
[ -x "$puppet" ] || { answer failed "$puppet is not an executable"; exit 1; }
settings=$("$puppet" config print --section agent agent_catalog_run_lockfile agent_disabled_lockfile pidfile lastrunfile 2>&1 </dev/null) ||
  { answer failed "puppet config print failed: $(echo "$settings" | tail -n 1 | cut -c1-300)"; exit 1; }
setting() { echo "$settings" | sed -n "s/^$1 = //p"; }
lock=$(setting agent_catalog_run_lockfile); disabled=$(setting agent_disabled_lockfile); pidfile=$(setting pidfile)
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
lock_message() { sed -n 's/.*"disabled_message" *: *"\([^"]*\)".*/\1/p' "$disabled" | cut -c1-300; }
case $action in
  disable)
    if [ -f "$disabled" ]; then answer refused "Already disabled: $(lock_message)"; exit 1; fi
    "$puppet" agent --disable "$message" </dev/null >/dev/null 2>&1 || { answer failed "puppet agent --disable failed"; exit 1; }
    answer ok "disabled"; exit 0 ;;
  enable)
    [ -f "$disabled" ] || { answer refused "Already enabled"; exit 1; }
    "$puppet" agent --enable </dev/null >/dev/null 2>&1 || { answer failed "puppet agent --enable failed"; exit 1; }
    answer ok "enabled"; exit 0 ;;
  last_run)
    summary=$(setting lastrunfile)
    [ -f "$summary" ] || { answer last_run 0 0 0 0 0; exit 0; }
    awk '/^[a-z_]+:/ { section = $1; sub(":", "", section); next }
      /^  [a-z_]+: / { key = $1; sub(":", "", key); v = $2 + 0
        if (section == "resources") { has = 1; if (key == "failed") f = v; if (key == "changed") c = v }
        if (section == "events" && key == "failure") e = v
        if (section == "time" && key == "last_run") t = v }
      END { printf "puppet-kicker runonce: last_run %d %d %d %d %d\n", t, has, f, e, c }' "$summary"
    exit 0 ;;
esac
if [ -s "$lock" ] && alive "$(cat "$lock")"; then
  answer busy "Puppet is currently applying a catalog (pid $(cat "$lock")), cannot run now"; exit 1
fi
if [ -f "$disabled" ]; then
  why=$(lock_message)
  answer disabled "Puppet is disabled, cannot run now: ${why:-no message}"; exit 1
fi
if [ -s "$pidfile" ] && alive "$(cat "$pidfile")"; then
  pid=$(cat "$pidfile")
  if kill -USR1 "$pid"; then answer started "signalled the idle puppet agent daemon (pid $pid)"; exit 0; fi
  answer failed "cannot signal the puppet agent daemon (pid $pid)"; exit 1
fi
log=$(mktemp) || { answer failed "mktemp failed"; exit 1; }
"$puppet" agent --onetime --daemonize --no-splay --no-usecacheonfailure --color=false \
  ${environment:+--environment "$environment"} </dev/null >"$log" 2>&1
status=$?
if [ "$status" -eq 0 ]; then answer started "puppet agent --onetime --daemonize"; rm -f "$log"; exit 0; fi
answer failed "puppet agent exited $status: $(tail -n 3 "$log" | tr '\n' ' ' | cut -c1-500)"; rm -f "$log"; exit 1
"#;

/// The `$0` the script runs as (what `ps` shows on the target).
pub const SCRIPT_NAME: &str = "puppet-kicker-runonce";

/// How much of ssh's or the command's text goes into a reason.
pub const REASON_BYTES: usize = 2048;

/// The ssh client's own exit status for its failures (connection, authentication,
/// host key); the remote command's status otherwise.
const SSH_FAILED: i32 = 255;

/// The answer to a rollout's action (`--action disable|enable|last_run`): the
/// answer line's words after `ok` or `last_run`, or why not.
pub fn read_control(host: &str, status: Option<i32>, stdout: &Captured, stderr: &Captured) -> Result<String, String> {
    let out = String::from_utf8_lossy(&stdout.bytes);
    if let Some(line) = out.lines().find_map(|l| l.strip_prefix(ANSWER)) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = clean(rest, REASON_BYTES);
        return match word {
            "ok" | "last_run" => Ok(rest),
            "refused" | "failed" => Err(rest),
            other => Err(format!("{host}: unexpected answer {:?}", clean(other, 64))),
        };
    }
    let err = clean(&String::from_utf8_lossy(&stderr.bytes), REASON_BYTES);
    match status {
        Some(SSH_FAILED) => Err(ssh_failure(host, &err)),
        code => Err(format!("{host}: no answer from the runonce script (exit {code:?}): {err}")),
    }
}

/// The planner's outcome for a finished `ssh` run to `host`: `status` is its exit
/// code (`None`: killed by a signal).
pub fn read(host: &str, status: Option<i32>, stdout: &Captured, stderr: &Captured) -> Outcome {
    let out = String::from_utf8_lossy(&stdout.bytes);
    if let Some(line) = out.lines().find_map(|l| l.strip_prefix(ANSWER)) {
        let (word, why) = line.split_once(' ').unwrap_or((line, ""));
        let why = clean(why, REASON_BYTES);
        match word {
            "started" => return Outcome::Started,
            "busy" => return Outcome::Busy(why),
            "disabled" => return Outcome::Disabled(why),
            "refused" => return Outcome::Refused(why),
            "failed" => return Outcome::Failed(format!("{host}: {why}")),
            _ => {}
        }
    }
    let err = clean(&String::from_utf8_lossy(&stderr.bytes), REASON_BYTES);
    match status {
        Some(0) => Outcome::Started,
        Some(SSH_FAILED) => Outcome::Failed(ssh_failure(host, &err)),
        Some(code) => {
            let text = clean(&format!("{} {err}", clean(&out, REASON_BYTES)), REASON_BYTES);
            // A plain `puppet agent --onetime` says so itself.
            match crate::kick::classify(1, &text) {
                Outcome::Busy(_) => Outcome::Busy(format!("{text} (exit {code})")),
                Outcome::Disabled(_) => Outcome::Disabled(format!("{text} (exit {code})")),
                _ => Outcome::Failed(format!("{host}: the command exited {code}: {text}")),
            }
        }
        None => Outcome::Failed(format!("{host}: ssh was killed by a signal: {err}")),
    }
}

/// Why ssh itself failed, in words an operator acts on, with ssh's own text.
fn ssh_failure(host: &str, err: &str) -> String {
    let lower = err.to_ascii_lowercase();
    let what = if lower.contains("host key verification failed") || lower.contains("no matching host key") {
        "the host key is unknown or does not match known_hosts (StrictHostKeyChecking)"
    } else if lower.contains("permission denied") {
        "the target refused the key (authentication failed)"
    } else if lower.contains("timed out") {
        "connecting timed out"
    } else if lower.contains("connection refused") || lower.contains("could not resolve") || lower.contains("no route")
    {
        "cannot connect"
    } else {
        "ssh failed"
    };
    format!("ssh to {host}: {what}: {err}")
}

/// `text` on one line (control characters become spaces, runs of them one), trimmed,
/// at most `max` bytes (cut at a character boundary, `...` said).
pub fn clean(text: &str, max: usize) -> String {
    let mut line = String::with_capacity(text.len().min(max));
    let mut space = false;
    for c in text.trim().chars() {
        if c.is_control() || c.is_whitespace() {
            space = true;
            continue;
        }
        if space && !line.is_empty() {
            line.push(' ');
        }
        space = false;
        if line.len() + c.len_utf8() > max {
            line.push_str("...");
            break;
        }
        line.push(c);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(text: &str) -> Captured {
        Captured { bytes: text.as_bytes().to_vec(), truncated: false }
    }

    #[test]
    fn the_scripts_answers_map_to_the_planners_outcomes() {
        let none = captured("");
        let answer = |line: &str, code| read("lb1", Some(code), &captured(line), &none);
        assert_eq!(answer("puppet-kicker runonce: started puppet agent --onetime --daemonize\n", 0), Outcome::Started);
        assert_eq!(
            answer("motd\npuppet-kicker runonce: busy Puppet is currently applying a catalog (pid 9)\n", 1),
            Outcome::Busy("Puppet is currently applying a catalog (pid 9)".into())
        );
        assert_eq!(
            answer("puppet-kicker runonce: disabled Puppet is disabled, cannot run now: upgrade\n", 1),
            Outcome::Disabled("Puppet is disabled, cannot run now: upgrade".into())
        );
        assert_eq!(
            answer("puppet-kicker runonce: refused invalid environment\n", 2),
            Outcome::Refused("invalid environment".into())
        );
        assert_eq!(
            answer("puppet-kicker runonce: failed no puppet command on /bin\n", 1),
            Outcome::Failed("lb1: no puppet command on /bin".into())
        );
    }

    #[test]
    fn other_commands_are_read_by_status_and_text() {
        let none = captured("");
        assert_eq!(read("lb1", Some(0), &none, &none), Outcome::Started);
        let busy = captured("Notice: Run of Puppet configuration client already in progress; skipping");
        assert!(matches!(read("lb1", Some(1), &none, &busy), Outcome::Busy(_)));
        let disabled = captured("Notice: Skipping run of Puppet configuration client; administratively disabled");
        assert!(matches!(read("lb1", Some(1), &none, &disabled), Outcome::Disabled(_)));
        let other = read("lb1", Some(127), &none, &captured("sudo: a password is required\n"));
        assert_eq!(other, Outcome::Failed("lb1: the command exited 127: sudo: a password is required".into()));
    }

    #[test]
    fn ssh_failures_say_what_to_fix() {
        let none = captured("");
        let failed = |err: &str| match read("lb1", Some(255), &none, &captured(err)) {
            Outcome::Failed(why) => why,
            other => panic!("{other:?}"),
        };
        let hostkey = failed("No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\r\nHost key verification failed.\r\n");
        assert!(hostkey.starts_with("ssh to lb1: the host key is unknown"), "{hostkey}");
        assert!(hostkey.ends_with("strict checking. Host key verification failed."), "{hostkey}");
        assert!(failed("root@127.0.0.1: Permission denied (publickey).").contains("refused the key"));
        assert!(failed("ssh: connect to host x port 22: Connection timed out").contains("connecting timed out"));
    }

    #[test]
    fn reasons_are_one_bounded_line() {
        assert_eq!(clean("  a\r\n\tb  c\u{1b}[0m ", 100), "a b c [0m");
        let long = clean(&"é".repeat(3000), REASON_BYTES);
        assert!(long.len() <= REASON_BYTES + 3 && long.ends_with("..."), "{}", long.len());
    }
}
