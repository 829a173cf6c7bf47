//! Every key of `puppet_kicker.yaml`, declared once: its default, its documentation,
//! whether it is secret, how a value is read into [`Config`] and how it is shown.
//!
//! From this one table come parsing and unknown-key errors ([`Config::parse`]), the
//! defaults ([`Config::defaults`]), the redacted `Debug` of [`Config`] and the
//! configuration reference tables of README.md (a test fails when they differ;
//! `PK_WRITE_README=1 cargo test --lib readme_tables` rewrites them from this table).
//!
//! A key without a doc comment shares the row of the key before it in the README
//! (`kick.retry_base`, `kick.retry_max`).

use super::error::Problem;
use super::values::*;
use super::{Config, OnNoData};
use crate::kick::choria::{parse_brokers, MIN_TTL};
use crate::kick::postgresql::{valid_schema, SslMode, StateKind};
use crate::kick::{Agent, ConfirmBy, RateLimit, TransportKind};
use crate::mcollective::ConnectorKind;
use serde_json::Value;
use std::fmt::Debug;
use std::path::Path;
use std::time::Duration;

/// One key of `puppet_kicker.yaml`.
pub struct Key {
    /// Dotted: `cache.ttl` is `cache: {ttl: ...}`.
    pub name: &'static str,
    pub default: KeyDefault,
    /// The README's "Meaning" cell, one line per `///` line; empty: the row of the key before.
    /// Only the README test reads it: the shipped libraries do not carry the text.
    #[cfg(test)]
    pub doc: &'static [&'static str],
    /// Never shown by `Debug` (a password, the pre-shared key).
    pub secret: bool,
    set: fn(&mut Config, &Value, &Path) -> Result<(), Problem>,
    show: for<'a> fn(&'a Config) -> Box<dyn Debug + 'a>,
}

/// A key's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyDefault {
    /// A YAML value, read by the key's own reader into [`Config::defaults`].
    Value(&'static str),
    /// Not a fixed value (a path under Puppet's vardir, "from client.cfg"): what the
    /// README says; [`Config::defaults`] computes it.
    Described(&'static str),
}

impl Key {
    /// Reads `value` into `config`; relative paths are relative to `base`.
    pub(crate) fn set(&self, config: &mut Config, value: &Value, base: &Path) -> Result<(), Problem> {
        (self.set)(config, value, base)
    }

    /// The key's value in `config`, for `Debug`.
    pub(crate) fn show<'a>(&self, config: &'a Config) -> Box<dyn Debug + 'a> {
        (self.show)(config)
    }

    /// The README's Meaning cell (the doc lines joined).
    #[cfg(test)]
    pub fn doc_text(&self) -> String {
        self.doc.iter().map(|line| line.trim()).collect::<Vec<_>>().join(" ")
    }
}

/// The key named `name`.
pub fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// `Plain`/`Secret` "name" = Value("default") | Described("text"), set |config, value, base| ..., show |config| ...;
macro_rules! keys {
    ($(
        $(#[doc = $doc:literal])*
        $secrecy:ident $name:literal = $kind:ident($default:literal),
            set |$c:ident, $v:ident, $base:pat_param| $set:expr,
            show |$sc:ident| $show:expr;
    )*) => {
        /// Every key, in the README's order.
        pub static KEYS: &[Key] = &[$(
            Key {
                name: $name,
                default: KeyDefault::$kind($default),
                #[cfg(test)]
                doc: &[$($doc),*],
                secret: matches!(Secrecy::$secrecy, Secrecy::Secret),
                set: |$c: &mut Config, $v: &Value, $base: &Path| -> Result<(), Problem> {
                    $set;
                    Ok(())
                },
                show: |$sc: &Config| -> Box<dyn Debug + '_> { Box::new($show) },
            },
        )*];
    };
}

/// Whether `Debug` may show a key's value.
enum Secrecy {
    Plain,
    Secret,
}

/// The `puppet` agent's `runonce` inputs, or `applies to the puppet agent` for puppetd.
fn puppet_inputs(c: &mut Config) -> Result<(&mut bool, &mut bool, &mut Option<u32>), Problem> {
    match &mut c.kick.agent {
        Agent::Puppet { force, splay, splaylimit } => Ok((force, splay, splaylimit)),
        Agent::Puppetd => {
            Err(Problem::Invalid("applies to the puppet agent, not puppetd (set kick.agent first)".to_string()))
        }
    }
}

fn shown_puppet_inputs(c: &Config) -> Option<(bool, bool, Option<u32>)> {
    match c.kick.agent {
        Agent::Puppet { force, splay, splaylimit } => Some((force, splay, splaylimit)),
        Agent::Puppetd => None,
    }
}

const PUPPET_AGENT: Agent = Agent::Puppet { force: true, splay: false, splaylimit: None };

/// A command as an argv list: a non-empty list of strings.
fn argv(v: &Value) -> Result<Vec<String>, Problem> {
    let what = "a list of strings (the command and its arguments)";
    let list = v.as_array().filter(|l| !l.is_empty()).ok_or(expected(what))?;
    list.iter().map(|w| w.as_str().map(str::to_string).ok_or(expected(what))).collect()
}

keys! {
    /// Where facts come from: `puppet_cache` (the master's own fact cache), `mcollective`
    /// (`rpcutil#inventory` of your mcollectived daemons; see [The mcollective source](#the-mcollective-source))
    /// or `puppetdb` (PuppetDB's inventory; see [The PuppetDB source](#the-puppetdb-source)).
    Plain "source" = Value("puppet_cache"),
        set |c, v, _| c.source = source_kind(v)?,
        show |c| &c.source;
    /// Directories of cached facts: JSON (puppetserver 7, `facts_terminus = json`) and Ruby-tagged YAML
    /// (older masters). Read on up to two threads (never more than the cores). A file that does not
    /// parse is skipped with a warning naming it, as is one over
    /// 16 MiB or nested deeper than 64 levels; a YAML file is also skipped past 10,000 aliases, aliases
    /// repeating 100,000 values, or 1,000,000 values or 64 MiB of text counting what aliases repeat, or
    /// with a key made from a collection over 64 KiB or an implicit key over YAML's 1,024 characters.
    Plain "puppet_cache.dirs" = Described("`[$server_datadir/facts, $vardir/yaml/facts]`"),
        set |c, v, base| c.sources.puppet_cache.dirs = directories(v, base)?,
        show |c| &c.sources.puppet_cache.dirs;
    /// Where the index snapshot (`index.msgpack`) and the kick state are kept. Created with mode 0750
    /// if missing. Refused, with an error naming it and what to change, when others could plant files
    /// there: writable by every user, writable by its group and not owned by the user Puppet runs as,
    /// or a symlink owned by another user than that one or root. Owned by another user and not
    /// writable by others is fine (root's `puppet apply` in puppetserver's directory; files root
    /// writes there are given to the directory's owner). Files are written with mode 0600.
    Plain "cache.dir" = Described("`$vardir/puppet_kicker`"),
        set |c, v, base| c.cache_dir = base.join(text(v, "a directory")?),
        show |c| &c.cache_dir;
    /// Age after which a query starts a background refresh; the query itself answers from the current index.
    Plain "cache.ttl" = Value("60"),
        set |c, v, _| c.cache_ttl = seconds(v, "a duration (300, 5m, 1h)")?,
        show |c| &c.cache_ttl;
    /// How long a compile waits for the first refresh when there is no snapshot at all.
    Plain "cache.cold_start_timeout" = Value("20"),
        set |c, v, _| c.cold_start_timeout = seconds(v, "a duration (20, 1m)")?,
        show |c| &c.cold_start_timeout;
    /// `fail`: a compile fails when the index holds no server. `empty`: return `[]`.
    Plain "on_no_data" = Value("fail"),
        set |c, v, _| c.on_no_data = choice(v, &[("fail", OnNoData::Fail), ("empty", OnNoData::Empty)], "'fail' or 'empty'")?,
        show |c| &c.on_no_data;
    /// Servers whose facts are older than this are left out (like PuppetDB's `node-ttl`).
    Plain "max_age" = Value("7d"),
        set |c, v, _| c.max_age = seconds(v, "a duration (604800, 7d)")?,
        show |c| &c.max_age;
    /// The fact that holds a server's role: a name, or a dotted path into a structured fact
    /// (`trusted.extensions.pp_role`); a top-level fact named exactly so wins, as in queries.
    Plain "role_fact" = Value("role"),
        set |c, v, _| c.role_fact = text(v, "a fact name")?,
        show |c| &c.role_fact;
    /// After a failed refresh, compiles start no new refresh for this long; doubled after each further failure...
    Plain "cache.retry_min" = Value("5"),
        set |c, v, _| c.retry_min = positive_seconds(v, "a duration (5s)")?,
        show |c| &c.retry_min;
    /// ... up to this. The last index keeps serving meanwhile.
    Plain "cache.retry_max" = Value("5m"),
        set |c, v, _| c.retry_max = positive_seconds(v, "a duration (5m)")?,
        show |c| &c.retry_max;

    /// The mcollective client configuration to read: the one `mco` already uses. Every
    /// `mcollective.*` key below overrides the value it names in that file.
    Plain "mcollective.client_config" = Described("`/etc/mcollective/client.cfg`, else `/etc/puppetlabs/mcollective/client.cfg`"),
        set |c, v, base| c.sources.mcollective.overrides.config_path = Some(base.join(text(v, "a file")?)),
        show |c| &c.sources.mcollective.overrides.config_path;
    /// `rabbitmq` or `activemq`.
    Plain "mcollective.connector" = Described("from client.cfg (`activemq` if unset there)"),
        set |c, v, _| c.sources.mcollective.overrides.connector = Some(v.as_str().and_then(ConnectorKind::parse).ok_or(expected("rabbitmq or activemq"))?),
        show |c| &c.sources.mcollective.overrides.connector;
    /// Brokers, tried in order: a list of `{host, port, user, password}` or `host:port`; `ssl: true`
    /// with `ssl_ca` (a file or a list), `ssl_cert`, `ssl_key` for TLS (see
    /// docs/mcollective.md, "TLS to the broker"; relative to this file).
    Plain "mcollective.pool" = Described("from client.cfg (`plugin.<connector>.pool.*`)"),
        set |c, v, base| c.sources.mcollective.overrides.pool = Some(pool(v, base)?),
        show |c| &c.sources.mcollective.overrides.pool;
    /// Broker login, for every broker of the pool.
    Plain "mcollective.user" = Described("from client.cfg"),
        set |c, v, _| c.sources.mcollective.user = Some(string(v)?),
        show |c| &c.sources.mcollective.user;
    Secret "mcollective.password" = Described("from client.cfg"),
        set |c, v, _| c.sources.mcollective.password = Some(string(v)?),
        show |c| &c.sources.mcollective.password;
    /// STOMP `host` header (`plugin.<connector>.vhost`).
    Plain "mcollective.vhost" = Described("from client.cfg (`/` for RabbitMQ, `mcollective` for ActiveMQ)"),
        set |c, v, _| c.sources.mcollective.overrides.vhost = Some(text(v, "a vhost")?),
        show |c| &c.sources.mcollective.overrides.vhost;
    /// The pre-shared key. Only the `psk` security provider is supported: any other
    /// `securityprovider` is a configuration error naming the file, the line and the key.
    Secret "mcollective.psk" = Described("from client.cfg (`plugin.psk`), else `$MCOLLECTIVE_PSK`"),
        set |c, v, _| c.sources.mcollective.overrides.psk = Some(text(v, "a pre-shared key")?),
        show |c| &c.sources.mcollective.overrides.psk;
    /// The master's identity on the middleware.
    Plain "mcollective.identity" = Described("from client.cfg, else the host name"),
        set |c, v, _| c.sources.mcollective.overrides.identity = Some(text(v, "an identity")?),
        show |c| &c.sources.mcollective.overrides.identity;
    /// The collectives to ask (see below).
    Plain "mcollective.main_collective" = Described("from client.cfg"),
        set |c, v, _| c.sources.mcollective.overrides.main_collective = Some(text(v, "a collective")?),
        show |c| &c.sources.mcollective.overrides.main_collective;
    Plain "mcollective.collectives" = Described("from client.cfg"),
        set |c, v, _| c.sources.mcollective.overrides.collectives = Some(collectives(v)?),
        show |c| &c.sources.mcollective.overrides.collectives;
    /// The caller the daemons log.
    Plain "mcollective.callerid" = Described("`uid=<the master's uid>`"),
        set |c, v, _| c.sources.mcollective.overrides.callerid = Some(text(v, "a callerid such as cert=puppet")?),
        show |c| &c.sources.mcollective.overrides.callerid;
    /// Seconds a request stays valid; daemons drop older ones (clocks must agree).
    Plain "mcollective.ttl" = Described("from client.cfg (`60`)"),
        set |c, v, _| c.sources.mcollective.overrides.ttl = Some(u32::try_from(positive_seconds(v, "a duration (60)")?).map_err(|_| expected("a duration (60)"))?),
        show |c| &c.sources.mcollective.overrides.ttl;
    /// How long discovery listens, in each collective.
    Plain "mcollective.discovery_timeout" = Described("from client.cfg (`2`)"),
        set |c, v, _| c.sources.mcollective.overrides.discovery_timeout = Some(Duration::from_secs(positive_seconds(v, "a duration (2)")?)),
        show |c| &c.sources.mcollective.overrides.discovery_timeout;
    /// TCP connect plus STOMP handshake, per broker.
    Plain "mcollective.connect_timeout" = Described("from client.cfg (`10`)"),
        set |c, v, _| c.sources.mcollective.overrides.connect_timeout = Some(Duration::from_secs(positive_seconds(v, "a duration (10)")?)),
        show |c| &c.sources.mcollective.overrides.connect_timeout;
    /// How long to wait for `rpcutil#inventory` replies once discovery answered (it returns as soon
    /// as every discovered server replied).
    Plain "mcollective.timeout" = Value("10"),
        set |c, v, _| c.sources.mcollective.timeout = positive_seconds(v, "a duration (10)")?,
        show |c| &c.sources.mcollective.timeout;
    /// A server that stops answering stays in the index this long after its last answer, then is
    /// dropped. `0` drops it at the first refresh it misses.
    Plain "mcollective.grace" = Value("10m"),
        set |c, v, _| c.sources.mcollective.grace = seconds(v, "a duration (10m)")?,
        show |c| &c.sources.mcollective.grace;
    /// Most distinct servers one request (discovery, inventory, kick) keeps; replies beyond are
    /// dropped, and a warning says how many.
    Plain "mcollective.max_servers" = Described("`100000`"),
        set |c, v, _| c.sources.mcollective.overrides.reply_limits.get_or_insert_with(Default::default).max_replies =
            usize::try_from(v.as_u64().filter(|n| *n > 0).ok_or(expected("a number of servers (100000)"))?).unwrap_or(usize::MAX),
        show |c| c.sources.mcollective.overrides.reply_limits.map(|l| l.max_replies);
    /// Most bytes of replies one request keeps (a number, or with `K`, `M`, `G`); beyond, the same.
    Plain "mcollective.max_reply_bytes" = Described("`1G`"),
        set |c, v, _| c.sources.mcollective.overrides.reply_limits.get_or_insert_with(Default::default).max_bytes = byte_size(v)?,
        show |c| c.sources.mcollective.overrides.reply_limits.map(|l| l.max_bytes);

    /// The puppetdb.conf to read `server_urls` from (`[main]`, `server_urls = https://a:8081,https://b:8081`).
    Plain "puppetdb.config" = Described("`$confdir/puppetdb.conf`"),
        set |c, v, base| c.sources.puppetdb.config_file = base.join(text(v, "a file")?),
        show |c| &c.sources.puppetdb.config_file;
    /// PuppetDB's URLs, tried in order (a list, or one string with commas); each must be `https://`.
    Plain "puppetdb.server_urls" = Described("from puppetdb.config"),
        set |c, v, _| c.sources.puppetdb.server_urls = Some(https_urls(v)?),
        show |c| &c.sources.puppetdb.server_urls;
    /// The client certificate and key presented to PuppetDB, the CA its certificate must chain
    /// to, and the CRL checked when the file exists (relative to this file). TLS verification is
    /// always on.
    Plain "puppetdb.cert" = Described("Puppet's `hostcert`"),
        set |c, v, base| c.sources.puppetdb.cert = Some(base.join(text(v, "a file")?)),
        show |c| &c.sources.puppetdb.cert;
    Plain "puppetdb.key" = Described("Puppet's `hostprivkey`"),
        set |c, v, base| c.sources.puppetdb.key = Some(base.join(text(v, "a file")?)),
        show |c| &c.sources.puppetdb.key;
    Plain "puppetdb.ca" = Described("Puppet's `localcacert`"),
        set |c, v, base| c.sources.puppetdb.ca = Some(base.join(text(v, "a file")?)),
        show |c| &c.sources.puppetdb.ca;
    Plain "puppetdb.crl" = Described("Puppet's `hostcrl`"),
        set |c, v, base| c.sources.puppetdb.crl = Some(base.join(text(v, "a file")?)),
        show |c| &c.sources.puppetdb.crl;
    /// One request to one URL (connect, TLS, answer read) fails past this; the next URL is tried.
    Plain "puppetdb.timeout" = Value("30"),
        set |c, v, _| c.sources.puppetdb.timeout = positive_seconds(v, "a duration (30)")?,
        show |c| &c.sources.puppetdb.timeout;
    /// Servers whose facts one request fetches; each answer is decoded into the index as it arrives.
    Plain "puppetdb.page_size" = Value("500"),
        set |c, v, _| c.sources.puppetdb.page_size = usize_count(v)?,
        show |c| &c.sources.puppetdb.page_size;
    /// Pages a full read asks of PuppetDB at once (1 to 8): PuppetDB answers one request on one
    /// core, so two take about half the time on a PuppetDB with two cores or more.
    Plain "puppetdb.requests_in_flight" = Value("2"),
        set |c, v, _| c.sources.puppetdb.requests_in_flight = at_most(usize_count(v)?, 8)?,
        show |c| &c.sources.puppetdb.requests_in_flight;
    /// Most bytes of one answer; a larger one fails the refresh. One server's entry is bounded
    /// as one fact cache file is (16 MiB, 64 levels).
    Plain "puppetdb.max_page_bytes" = Value("256M"),
        set |c, v, _| c.sources.puppetdb.max_page_bytes = byte_size(v)?,
        show |c| &c.sources.puppetdb.max_page_bytes;
    /// An incremental refresh asks for the nodes changed since the newest change it saw, less
    /// this (commands commit out of order).
    Plain "puppetdb.overlap" = Value("60"),
        set |c, v, _| c.sources.puppetdb.overlap = seconds(v, "a duration (60)")?,
        show |c| &c.sources.puppetdb.overlap;
    /// A full read at least this often, whatever the incremental refreshes found.
    Plain "puppetdb.full_refresh" = Value("1h"),
        set |c, v, _| c.sources.puppetdb.full_refresh = seconds(v, "a duration (3600, 1h)")?,
        show |c| &c.sources.puppetdb.full_refresh;

    /// The NATS brokers of your Choria fleet, tried in order: a list of `host:port` (Choria's port is
    /// 4222). Required with `kick.transport: choria`. TLS is always on (see docs/choria.md).
    Plain "choria.brokers" = Described("none: required for `kick.transport: choria`"),
        set |c, v, _| c.kick.choria.brokers = parse_brokers(v).map_err(|e| Problem::Invalid(format!("must be {e}")))?,
        show |c| &c.kick.choria.brokers;
    /// The caller id is `choria=<certname>`; the certificate must be this name's (checked at start).
    Plain "choria.certname" = Described("Puppet's certname (the name of its `hostcert` file)"),
        set |c, v, _| c.kick.choria.certname = Some(text(v, "a certname")?),
        show |c| &c.kick.choria.certname;
    /// The CA the brokers' certificates must chain to, and the certificate and key that sign
    /// requests and authenticate to the brokers (relative to this file): Choria's own defaults.
    Plain "choria.ssl_ca" = Described("Puppet's `localcacert` (`$ssldir/certs/ca.pem`)"),
        set |c, v, base| c.kick.choria.ssl_ca = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.choria.ssl_ca;
    Plain "choria.ssl_cert" = Described("Puppet's `hostcert` (`$ssldir/certs/<certname>.pem`)"),
        set |c, v, base| c.kick.choria.ssl_cert = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.choria.ssl_cert;
    Plain "choria.ssl_key" = Described("Puppet's `hostprivkey` (`$ssldir/private_keys/<certname>.pem`)"),
        set |c, v, base| c.kick.choria.ssl_key = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.choria.ssl_key;
    /// The main collective; a kick whose environment is one of `choria.collectives` goes to that collective.
    Plain "choria.collective" = Value("mcollective"),
        set |c, v, _| c.kick.choria.collective = text(v, "a collective")?,
        show |c| &c.kick.choria.collective;
    Plain "choria.collectives" = Described("none"),
        set |c, v, _| c.kick.choria.collectives = collectives(v)?,
        show |c| &c.kick.choria.collectives;
    /// Seconds a request stays valid (at least 30); servers drop older ones (clocks must agree).
    Plain "choria.ttl" = Value("60"),
        set |c, v, _| c.kick.choria.ttl = u32::try_from(positive_seconds(v, "a duration (60)")?).ok().filter(|t| *t >= MIN_TTL).ok_or(Problem::Invalid(format!("must be at least {MIN_TTL} seconds (Choria's minimum)")))?,
        show |c| &c.kick.choria.ttl;
    /// TCP, TLS and NATS handshake, per broker.
    Plain "choria.connect_timeout" = Value("10"),
        set |c, v, _| c.kick.choria.connect_timeout = Duration::from_secs(positive_seconds(v, "a duration (10)")?),
        show |c| &c.kick.choria.connect_timeout;
    /// Send the kick's environment as `runonce`'s `environment` input. Off: the server runs in
    /// its own environment, as with mcollective.
    Plain "choria.send_environment" = Value("false"),
        set |c, v, _| c.kick.choria.send_environment = flag(v)?,
        show |c| &c.kick.choria.send_environment;
    /// Choria kicks awaiting their replies at once (1 to 256), over the one connection.
    Plain "choria.max_parallel" = Value("32"),
        set |c, v, _| c.kick.choria.max_parallel = at_most(usize_count(v)?, 256)?,
        show |c| &c.kick.choria.max_parallel;

    /// The file of host keys SSH kicks check the targets against (`UserKnownHostsFile`, with
    /// `StrictHostKeyChecking=yes`: an unknown or changed host key fails the kick). Required with
    /// `kick.transport: ssh`; see docs/ssh.md.
    Plain "ssh.known_hosts" = Described("none"),
        set |c, v, base| c.kick.ssh.known_hosts = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.ssh.known_hosts;
    /// The private key SSH kicks log in with (`-i`, `IdentitiesOnly=yes`; relative to this file).
    Plain "ssh.identity_file" = Described("ssh's own (its agent, `~/.ssh/id_*`)"),
        set |c, v, base| c.kick.ssh.identity_file = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.ssh.identity_file;
    /// The user and port SSH kicks log in as and connect to (`-l`, `-p`).
    Plain "ssh.user" = Described("ssh's own (its config, else the user Puppet runs as; port 22)"),
        set |c, v, _| c.kick.ssh.user = Some(text(v, "a user name")?),
        show |c| &c.kick.ssh.user;
    Plain "ssh.port" = Described("ssh's own (its config, else the user Puppet runs as; port 22)"),
        set |c, v, _| c.kick.ssh.port = Some(v.as_u64().and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0).ok_or(expected("a port (1 to 65535)"))?),
        show |c| &c.kick.ssh.port;
    /// An ssh client configuration for kicks only (`-F`, replacing `~/.ssh/config` and `/etc/ssh/ssh_config`).
    Plain "ssh.config_file" = Described("ssh's own"),
        set |c, v, base| c.kick.ssh.config_file = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.ssh.config_file;
    /// `ConnectTimeout` of SSH kicks; the whole kick is killed after `kick.reply_timeout`.
    Plain "ssh.connect_timeout" = Value("5"),
        set |c, v, _| c.kick.ssh.connect_timeout = std::time::Duration::from_secs(positive_seconds(v, "a duration (5, 5s)")?),
        show |c| &c.kick.ssh.connect_timeout;
    /// What an SSH kick runs on the target, as a list (each word quoted for the target's shell);
    /// `--environment ENV` is appended. The default starts one run without waiting for it and
    /// answers busy or disabled as the Choria `puppet` agent does (docs/ssh.md).
    Plain "ssh.command" = Described("`[sudo, -n, /bin/sh, -c, <the runonce script of docs/ssh.md>, puppet-kicker-runonce]`"),
        set |c, v, _| c.kick.ssh.command = argv(v)?,
        show |c| c.kick.ssh.shown_command();
    /// Share one connection per target between kicks (`ControlMaster=auto`, `ControlPersist=60`,
    /// sockets in `<cache.dir>/ssh`, whose path must leave room for them: docs/ssh.md). Off:
    /// `ControlMaster=no`, `ControlPath=none`, a new connection for every kick.
    Plain "ssh.control_master" = Value("true"),
        set |c, v, _| c.kick.ssh.control_master = flag(v)?,
        show |c| &c.kick.ssh.control_master;
    /// SSH kicks sent at once (1 to 256).
    Plain "ssh.max_parallel" = Value("16"),
        set |c, v, _| c.kick.ssh.max_parallel = at_most(usize_count(v)?, 256)?,
        show |c| &c.kick.ssh.max_parallel;
    /// The fact holding the address SSH kicks connect to (a dotted path allowed); a server without
    /// it is reached by its certname. Checked as a host name or IP address before ssh runs.
    Plain "ssh.address_fact" = Value("fqdn"),
        set |c, v, _| c.kick.ssh.address_fact = text(v, "a fact name")?,
        show |c| &c.kick.ssh.address_fact;

    /// Where the kick state is kept: `local` (`kicks.msgpack` in `cache.dir`, shared by the processes
    /// of one host) or `postgresql` (one state for several compilers: coalescing, rate limits, loops
    /// and dispatch as one; the `kick.postgresql.*` keys, docs/shared-state.md).
    Plain "kick.state" = Value("local"),
        set |c, v, _| c.kick.state = choice(v, StateKind::ALL, "'local' or 'postgresql'")?,
        show |c| c.kick.state.name();
    /// A libpq connection string or `postgresql://` URL; when set, it gives the host, port, database
    /// and user. It may hold a password: it is never shown or logged.
    Secret "kick.postgresql.connection" = Described("none: the keys below"),
        set |c, v, _| c.kick.postgresql.connection = Some(text(v, "a connection string")?),
        show |c| &c.kick.postgresql.connection;
    /// The server (a host name, an IP address, or a Unix socket's directory: no TLS there), and the
    /// schema of the module's tables (created and migrated by the module; nothing outside it).
    Plain "kick.postgresql.host" = Value("localhost"),
        set |c, v, _| c.kick.postgresql.host = text(v, "a host")?,
        show |c| &c.kick.postgresql.host;
    Plain "kick.postgresql.port" = Value("5432"),
        set |c, v, _| c.kick.postgresql.port = v.as_u64().and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0).ok_or(expected("a port (1 to 65535)"))?,
        show |c| &c.kick.postgresql.port;
    Plain "kick.postgresql.database" = Value("puppet_kicker"),
        set |c, v, _| c.kick.postgresql.database = text(v, "a database name")?,
        show |c| &c.kick.postgresql.database;
    Plain "kick.postgresql.user" = Value("puppet_kicker"),
        set |c, v, _| c.kick.postgresql.user = text(v, "a user name")?,
        show |c| &c.kick.postgresql.user;
    Plain "kick.postgresql.schema" = Value("puppet_kicker"),
        set |c, v, _| c.kick.postgresql.schema = text(v, "a schema name").and_then(|s| if valid_schema(&s) { Ok(s) } else { Err(expected("a schema name of lower case letters, digits and _")) })?,
        show |c| &c.kick.postgresql.schema;
    /// TLS, always on over TCP: `verify-full` (the server's certificate checked against the CA and
    /// the host name) or `verify-ca` (the CA only); the CA, and the client certificate and key
    /// presented, as PuppetDB's own PostgreSQL setups use them (files relative to this file).
    Plain "kick.postgresql.sslmode" = Value("verify-full"),
        set |c, v, _| c.kick.postgresql.sslmode = choice(v, SslMode::ALL, "'verify-full' or 'verify-ca'")?,
        show |c| c.kick.postgresql.sslmode.name();
    Plain "kick.postgresql.ca" = Described("Puppet's `localcacert`"),
        set |c, v, base| c.kick.postgresql.ca = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.postgresql.ca;
    Plain "kick.postgresql.cert" = Described("Puppet's `hostcert`"),
        set |c, v, base| c.kick.postgresql.cert = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.postgresql.cert;
    Plain "kick.postgresql.key" = Described("Puppet's `hostprivkey`"),
        set |c, v, base| c.kick.postgresql.key = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.postgresql.key;
    /// A file whose first line is the password (relative to this file).
    Plain "kick.postgresql.password_file" = Described("none"),
        set |c, v, base| c.kick.postgresql.password_file = Some(base.join(text(v, "a file")?)),
        show |c| &c.kick.postgresql.password_file;
    /// Connections each process keeps open at most; each statement's bound (the wait for another
    /// compiler's transaction included: a compiler stopped mid-transaction loses its session after
    /// four times this); the connection's.
    Plain "kick.postgresql.pool_size" = Value("2"),
        set |c, v, _| c.kick.postgresql.pool_size = at_most(usize_count(v)?, 64)?,
        show |c| &c.kick.postgresql.pool_size;
    Plain "kick.postgresql.statement_timeout" = Value("5s"),
        set |c, v, _| c.kick.postgresql.statement_timeout = Duration::from_secs(positive_seconds(v, "a duration (5s)")?),
        show |c| &c.kick.postgresql.statement_timeout;
    Plain "kick.postgresql.connect_timeout" = Value("5s"),
        set |c, v, _| c.kick.postgresql.connect_timeout = Duration::from_secs(positive_seconds(v, "a duration (5s)")?),
        show |c| &c.kick.postgresql.connect_timeout;

    /// How kicks reach the servers: `mcollective` (`runonce` of the mcollective `kick.agent`, the
    /// `mcollective.*` keys), `choria` (the `choria.*` keys; docs/choria.md) or `ssh` (the system's
    /// OpenSSH client; the `ssh.*` keys, docs/ssh.md).
    Plain "kick.transport" = Value("mcollective"),
        set |c, v, _| c.kick.transport = choice(v, TransportKind::ALL, "'mcollective', 'choria' or 'ssh'")?,
        show |c| c.kick.transport.name();
    /// mcollective agent: `puppet` (mcollective-puppet-agent) or the legacy `puppetd` (`runonce` with
    /// `forcerun` as the String `"true"`, as `mco puppetd runonce` sends it: the DDLs in the field
    /// declare it a string or not at all). A request the agent refuses as such (its DDL rejects an
    /// input, an unknown action: status 2, 3 or 4) fails at once with the agent's reason in the log,
    /// without retries.
    Plain "kick.agent" = Value("puppet"),
        set |c, v, _| c.kick.agent = choice(v, &[("puppet", PUPPET_AGENT), ("puppetd", Agent::Puppetd)], "'puppet' or 'puppetd'")?,
        show |c| c.kick.agent.name();
    /// `runonce` inputs of the `puppet` agent
    Plain "kick.force" = Value("true"),
        set |c, v, _| *puppet_inputs(c)?.0 = flag(v)?,
        show |c| shown_puppet_inputs(c).map(|i| i.0);
    Plain "kick.splay" = Value("false"),
        set |c, v, _| *puppet_inputs(c)?.1 = flag(v)?,
        show |c| shown_puppet_inputs(c).map(|i| i.1);
    Plain "kick.splaylimit" = Described("unset"),
        set |c, v, _| *puppet_inputs(c)?.2 = Some(u32::try_from(seconds(v, "a duration (30, 10s, 5m)")?).map_err(|_| expected("a duration"))?),
        show |c| shown_puppet_inputs(c).map(|i| i.2);
    /// Kicks of one server within this window become one run
    Plain "kick.coalesce" = Value("10s"),
        set |c, v, _| c.kick.planner.coalesce_ms = millis(v)?,
        show |c| &c.kick.planner.coalesce_ms;
    /// Backoff after busy, disabled or no reply; doubles each attempt
    Plain "kick.retry_base" = Value("30s"),
        set |c, v, _| c.kick.planner.retry_base_ms = millis(v)?,
        show |c| &c.kick.planner.retry_base_ms;
    Plain "kick.retry_max" = Value("10m"),
        set |c, v, _| c.kick.planner.retry_max_ms = millis(v)?,
        show |c| &c.kick.planner.retry_max_ms;
    /// Attempts before a kick is logged as failed
    Plain "kick.max_attempts" = Value("6"),
        set |c, v, _| c.kick.planner.max_attempts = small_count(v)?,
        show |c| &c.kick.planner.max_attempts;
    /// A kicked run with no report after this counts as finished
    Plain "kick.run_timeout" = Value("1h"),
        set |c, v, _| c.kick.planner.run_timeout_ms = millis(v)?,
        show |c| &c.kick.planner.run_timeout_ms;
    /// A kick whose server reports no run started after it within this long is unconfirmed
    Plain "kick.confirm_within" = Value("30m"),
        set |c, v, _| c.kick.planner.confirm_within_ms = millis(v)?,
        show |c| &c.kick.planner.confirm_within_ms;
    /// What confirms a kick: `reports` (the target's report, through this machine's `kick` processor), `transport` (its agent's last-run summary, asked every 15 s; the `puppet` agent over mcollective or Choria, or SSH's runonce script) or `auto` (reports, except for kicks from a masterless `puppet apply`'s report: transport)
    Plain "kick.confirm_by" = Value("auto"),
        set |c, v, _| c.kick.planner.confirm_by = choice(v, ConfirmBy::ALL, "'auto', 'reports' or 'transport'")?,
        show |c| c.kick.planner.confirm_by.name();
    /// Longest causal chain
    Plain "kick.max_hops" = Value("5"),
        set |c, v, _| c.kick.planner.max_hops = usize_count(v)?,
        show |c| &c.kick.planner.max_hops;
    /// `{node: [haproxy], admin: '*', '*': []}`: source role to allowed target roles; `*` for any
    Plain "kick.policy" = Described("anyone may kick anyone"),
        set |c, v, _| c.kick.planner.policy = policy(v, "a mapping of source role to a list of target roles")?,
        show |c| &c.kick.planner.policy;
    /// Kicking reports accepted per source per window
    Plain "kick.rate_limit.max" = Value("30"),
        set |c, v, _| c.kick.planner.rate_limit.max = small_count(v)?,
        show |c| &c.kick.planner.rate_limit.max;
    Plain "kick.rate_limit.window" = Value("1h"),
        set |c, v, _| c.kick.planner.rate_limit = RateLimit { window_ms: millis(v)?.max(1), ..c.kick.planner.rate_limit },
        show |c| &c.kick.planner.rate_limit.window_ms;
    /// Log what would be kicked, kick nothing
    Plain "kick.dry_run" = Value("false"),
        set |c, v, _| c.kick.planner.dry_run = flag(v)?,
        show |c| &c.kick.planner.dry_run;
    /// `{production: [staging], '*': []}`: source environment to the other environments its kicks may name
    Plain "kick.environments" = Described("any"),
        set |c, v, _| c.kick.planner.environments = policy(v, "a mapping of source environment to a list of target environments")?,
        show |c| &c.kick.planner.environments;
    /// Per report: kicks processed, roles and fact clauses resolved, servers kicked
    Plain "kick.budget.kicks" = Value("32"),
        set |c, v, _| c.kick.planner.budget.kicks = usize_count(v)?,
        show |c| &c.kick.planner.budget.kicks;
    Plain "kick.budget.clauses" = Value("128"),
        set |c, v, _| c.kick.planner.budget.clauses = usize_count(v)?,
        show |c| &c.kick.planner.budget.clauses;
    Plain "kick.budget.targets" = Value("1000"),
        set |c, v, _| c.kick.planner.budget.targets = usize_count(v)?,
        show |c| &c.kick.planner.budget.targets;
    /// Without the agent's clock in the reply, a report whose run started this long before the kick
    /// still ends the kicked run
    Plain "kick.clock_skew" = Value("10s"),
        set |c, v, _| c.kick.planner.clock_skew_ms = millis(v)?,
        show |c| &c.kick.planner.clock_skew_ms;
    /// A role-to-role edge not seen for this long is forgotten, with its cycles
    Plain "kick.role_graph_ttl" = Value("7d"),
        set |c, v, _| c.kick.planner.role_graph_ttl_ms = millis(v)?,
        show |c| &c.kick.planner.role_graph_ttl_ms;
    /// How long a `runonce` waits for the server's reply; at most half of `kick.in_flight_timeout`
    Plain "kick.reply_timeout" = Value("10s"),
        set |c, v, _| c.kick.reply_timeout = Duration::from_secs(seconds(v, "a duration (30, 10s, 5m)")?),
        show |c| &c.kick.reply_timeout;
    /// A `runonce` unanswered this long was lost with its process (a killed `puppet apply`, a
    /// restarted master) and is sent again, so a kick is delivered at most once more
    Plain "kick.in_flight_timeout" = Value("2m"),
        set |c, v, _| c.kick.planner.in_flight_timeout_ms = Some(millis(v)?).filter(|ms| *ms > 0).ok_or(expected("a positive duration"))?,
        show |c| &c.kick.planner.in_flight_timeout_ms;
    /// How long `puppet apply` waits at exit for due kicks
    Plain "kick.exit_wait" = Value("15s"),
        set |c, v, _| c.kick.exit_wait = Duration::from_secs(seconds(v, "a duration (30, 10s, 5m)")?),
        show |c| &c.kick.exit_wait;
}

#[cfg(test)]
/// The README's reference table of the keys `which` selects, one row per key or per run
/// of keys sharing a doc.
pub fn readme_table(which: impl Fn(&Key) -> bool) -> String {
    let mut rows: Vec<(Vec<&Key>, String)> = Vec::new();
    for key in KEYS.iter().filter(|k| which(k)) {
        match rows.last_mut() {
            Some((keys, _)) if key.doc.is_empty() => keys.push(key),
            _ => rows.push((vec![key], key.doc_text())),
        }
    }
    let mut table = String::from("| Key | Default | Meaning |\n| --- | --- | --- |\n");
    for (keys, doc) in rows {
        let names = keys.iter().map(|k| format!("`{}`", k.name)).collect::<Vec<_>>().join(", ");
        let mut defaults: Vec<String> = keys
            .iter()
            .map(|k| match k.default {
                KeyDefault::Value(v) => format!("`{v}`"),
                KeyDefault::Described(text) => text.to_string(),
            })
            .collect();
        defaults.dedup();
        table.push_str(&format!("| {names} | {} | {doc} |\n", defaults.join(", ")));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PuppetSettings;

    /// README.md's table between `<!-- keys {name}: ... -->` and `<!-- end keys {name} -->`.
    fn readme_section(readme: &str, name: &str) -> (usize, usize) {
        let begin = readme.find(&format!("<!-- keys {name}:")).unwrap_or_else(|| panic!("README: no keys {name}"));
        let start = begin + readme[begin..].find('\n').expect("a line after the marker") + 1;
        let end = readme.find(&format!("<!-- end keys {name} -->")).unwrap_or_else(|| panic!("README: no end"));
        (start, end)
    }

    /// The README's reference tables are the declaration's; `PK_WRITE_README=1` rewrites them.
    #[test]
    fn readme_tables() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let mut readme = std::fs::read_to_string(&path).unwrap();
        let is_kick = |k: &Key| k.name.starts_with("kick.");
        let mut stale = Vec::new();
        for (name, table) in [("general", readme_table(|k| !is_kick(k))), ("kick", readme_table(is_kick))] {
            let (start, end) = readme_section(&readme, name);
            if readme[start..end] != table {
                stale.push(name);
                readme.replace_range(start..end, &table);
            }
        }
        if std::env::var_os("PK_WRITE_README").is_some() {
            std::fs::write(&path, readme).unwrap();
        } else {
            assert!(
                stale.is_empty(),
                "README.md's {stale:?} key tables differ from src/config/keys.rs; \
                 `PK_WRITE_README=1 cargo test --lib readme_tables` rewrites them"
            );
        }
    }

    #[test]
    fn every_default_is_read_by_its_own_key() {
        for key in KEYS {
            if let KeyDefault::Value(text) = key.default {
                let mut config = Config::defaults(&PuppetSettings::default());
                let value = crate::yaml::parse(text).unwrap();
                assert_eq!(key.set(&mut config, &value, Path::new("")), Ok(()), "{}", key.name);
            }
        }
    }

    #[test]
    fn keys_are_unique_and_none_is_a_prefix_of_another() {
        for a in KEYS {
            assert_eq!(KEYS.iter().filter(|b| b.name == a.name).count(), 1, "{}", a.name);
            // `cache` and `cache.ttl` both declared would make `cache: {ttl: 1}` ambiguous.
            assert!(!KEYS.iter().any(|b| b.name.starts_with(&format!("{}.", a.name))), "{}", a.name);
        }
        assert!(!KEYS[0].doc.is_empty(), "the first key starts a README row");
    }

    #[test]
    fn described_limits_are_the_clients_defaults() {
        let limits = crate::mcollective::ReplyLimits::default();
        let described = |name| match key(name).unwrap().default {
            KeyDefault::Described(text) => crate::yaml::parse(text.trim_matches('`')).unwrap(),
            KeyDefault::Value(_) => panic!("{name} is described"),
        };
        assert_eq!(described("mcollective.max_servers").as_u64(), Some(limits.max_replies as u64));
        assert_eq!(byte_size(&described("mcollective.max_reply_bytes")), Ok(limits.max_bytes));
    }

    #[test]
    fn debug_shows_every_key_but_no_secret() {
        let yaml = "mcollective:\n  user: broker-login\n  password: pw-s3cret\n  psk: psk-s3cret\n  pool:\n    - {host: mq1, user: u, password: pool-s3cret}\n    - mq2\nkick:\n  coalesce: 30s\n  postgresql:\n    connection: postgresql://k:conn-s3cret@db/kicks\n";
        let config =
            Config::parse(yaml, Path::new("/etc/puppet/puppet_kicker.yaml"), &PuppetSettings::default()).unwrap();
        let debug = format!(
            "{config:?} {config:#?} {:?} {:?}",
            config.sources.mcollective, config.sources.mcollective.overrides
        );
        for secret in ["pw-s3cret", "psk-s3cret", "pool-s3cret", "conn-s3cret"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        assert!(debug.contains(r#""mcollective.password": <redacted>"#), "{debug}");
        assert!(debug.contains(r#""mcollective.psk": <redacted>"#), "{debug}");
        assert!(debug.contains("broker-login") && debug.contains("mq1") && debug.contains("30000"), "{debug}");
        for key in KEYS {
            assert!(debug.contains(&format!("{:?}", key.name)), "{} not shown", key.name);
        }
        let unset = format!("{:?}", Config::defaults(&PuppetSettings::default()));
        assert!(unset.contains(r#""mcollective.psk": None"#), "{unset}");
        let secret_keys: Vec<_> = KEYS.iter().filter(|k| k.secret).map(|k| k.name).collect();
        assert_eq!(secret_keys, ["mcollective.password", "mcollective.psk", "kick.postgresql.connection"]);
    }
}
