//! `puppet_kicker.so`: MRI's door into puppet-kicker's core. It only converts:
//! Ruby arguments in, `Node`s out as Hashes, core errors as `PuppetKicker::*Error`.
//!
//! Every entry point runs inside `guard`, so a Rust panic becomes a Ruby exception
//! instead of `fatal`, which would end the Puppet run.

use magnus::value::{Lazy, ReprValue};
use magnus::RString;
use magnus::{function, prelude::*, Error, ExceptionClass, RArray, RHash, RModule, Ruby, Value};
use puppet_kicker::kick::{Level, LogLine};
use puppet_kicker::{Kicker, Node, PuppetSettings, RoleSelector, Selection};
use serde_json::Value as Json;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

static MODULE: Lazy<RModule> = Lazy::new(|ruby| ruby.define_module("PuppetKicker").expect("define PuppetKicker"));

fn error_class(ruby: &Ruby, name: &str) -> ExceptionClass {
    ruby.get_inner(&MODULE).const_get::<_, ExceptionClass>(name).unwrap_or_else(|_| ruby.exception_runtime_error())
}

/// Runs `body`, turning core errors into PuppetKicker exceptions and panics into
/// `PuppetKicker::Error` ("internal error"), never letting one cross into Ruby.
fn guard<T>(ruby: &Ruby, body: impl FnOnce() -> Result<T, puppet_kicker::Error>) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            let class = match e {
                puppet_kicker::Error::Query(_) => "QueryError",
                puppet_kicker::Error::Config(_) => "ConfigError",
                puppet_kicker::Error::NoData(_) => "NoDataError",
                puppet_kicker::Error::Io(_) => "Error",
            };
            Err(Error::new(error_class(ruby, class), e.to_string()))
        }
        Err(panic) => {
            Err(Error::new(error_class(ruby, "Error"), puppet_kicker::error::internal_error_message(&*panic)))
        }
    }
}

fn configure(
    ruby: &Ruby,
    confdir: String,
    vardir: String,
    server_datadir: Option<String>,
    config_file: Option<String>,
) -> Result<(), Error> {
    let settings = PuppetSettings {
        confdir: PathBuf::from(confdir),
        vardir: PathBuf::from(vardir),
        server_datadir: server_datadir.map(PathBuf::from),
        config_file: config_file.filter(|f| !f.is_empty()).map(PathBuf::from),
    };
    guard(ruby, || Kicker::configure(settings).map(|_| ()))
}

fn servers_with_role(ruby: &Ruby, roles: Vec<String>, environment: String) -> Result<RArray, Error> {
    let selection = guard(ruby, || {
        let roles = RoleSelector::parse(&roles)?;
        Kicker::global()?.servers_with_role(&roles, &environment)
    })?;
    servers(ruby, &selection)
}

fn server_with_role(ruby: &Ruby, roles: Vec<String>, environment: String) -> Result<Value, Error> {
    let selection = guard(ruby, || {
        let roles = RoleSelector::parse(&roles)?;
        Kicker::global()?.servers_with_role(&roles, &environment)
    })?;
    match selection.positions().1.first() {
        Some(position) => converted(ruby, &selection, *position),
        None => Ok(ruby.qnil().as_value()),
    }
}

fn servers_with_facts(ruby: &Ruby, clauses: Vec<String>, environment: String) -> Result<RArray, Error> {
    let selection = guard(ruby, || Kicker::global()?.servers_with_facts(&clauses, &environment))?;
    servers(ruby, &selection)
}

fn note_environment(ruby: &Ruby, certname: String, environment: String) -> Result<(), Error> {
    guard(ruby, || Kicker::global().map(|k| k.note_environment(&certname, &environment)))
}

fn take_warnings(ruby: &Ruby) -> Result<Vec<String>, Error> {
    guard(ruby, || Ok(Kicker::global().map(|k| k.take_warnings()).unwrap_or_default()))
}

fn status(ruby: &Ruby) -> Result<RHash, Error> {
    let status = guard(ruby, || Kicker::global().map(|k| k.status()))?;
    let hash = ruby.hash_new();
    hash.aset("servers", status.servers)?;
    hash.aset("built_at", status.built_at)?;
    hash.aset("last_error", status.last_error)?;
    hash.aset("config_file", status.config_file.map(|f| f.display().to_string()))?;
    hash.aset("cache_dir", status.cache_dir.display().to_string())?;
    hash.aset("failures", status.failures)?;
    hash.aset("retry_at", status.retry_at)?;
    Ok(hash)
}

/// `[[level, message], ...]` for Puppet's logger.
fn log_lines(ruby: &Ruby, lines: Vec<LogLine>) -> Result<RArray, Error> {
    let array = ruby.ary_new_capa(lines.len());
    for line in lines {
        let level = match line.level {
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warning => "warning",
            Level::Err => "err",
        };
        array.push((level, line.message))?;
    }
    Ok(array)
}

fn kick_report(ruby: &Ruby, report: RString) -> Result<RArray, Error> {
    // SAFETY: the bytes are copied before any Ruby code can run.
    let bytes = unsafe { report.as_slice() }.to_vec();
    let lines = guard(ruby, || {
        let report = puppet_kicker::kick::parse_report(&bytes)?;
        Kicker::global()?.kick_report(&report)
    })?;
    log_lines(ruby, lines)
}

fn kick_flush(ruby: &Ruby) -> Result<RArray, Error> {
    let lines = guard(ruby, || Ok(Kicker::global().map(|k| k.kick_flush()).unwrap_or_default()))?;
    log_lines(ruby, lines)
}

fn take_kick_log(ruby: &Ruby) -> Result<RArray, Error> {
    let lines = guard(ruby, || Ok(Kicker::global().map(|k| k.take_kick_log()).unwrap_or_default()))?;
    log_lines(ruby, lines)
}

fn kick_status(ruby: &Ruby) -> Result<String, Error> {
    guard(ruby, || Kicker::global()?.kick_status().map(|s| s.to_string()))
}

fn version() -> String {
    puppet_kicker::service::version().to_string()
}

fn servers(ruby: &Ruby, selection: &Selection) -> Result<RArray, Error> {
    let array = ruby.ary_new_capa(selection.len());
    for position in selection.positions().1 {
        array.push(converted(ruby, selection, *position)?)?;
    }
    Ok(array)
}

/// Servers converted for the current index generation, by position: building a
/// server's Hash (a thousand Ruby objects for ~150 structured facts) costs far more
/// than finding it, so each is built once per index and shared, deep-frozen, by
/// every later call. The Array is marked for the GC by `Lazy`; the GVL serializes it.
static CONVERTED: Lazy<RArray> = Lazy::new(|ruby| ruby.ary_new());
static CONVERTED_GENERATION: AtomicU64 = AtomicU64::new(0);

fn converted(ruby: &Ruby, selection: &Selection, position: u32) -> Result<Value, Error> {
    let cache = ruby.get_inner(&CONVERTED);
    let generation = selection.positions().0;
    if CONVERTED_GENERATION.load(Ordering::Relaxed) != generation {
        cache.clear()?;
        CONVERTED_GENERATION.store(generation, Ordering::Relaxed);
    }
    let cached: Value = cache.entry(position as isize)?;
    if !cached.is_nil() {
        return Ok(cached);
    }
    let node = selection.node_at(position).expect("positions come from the selection's index");
    let hash = server(ruby, node)?.as_value();
    cache.store(position as isize, hash)?;
    Ok(hash)
}

/// A server as the functions return it: its facts, what its source reported beside
/// them (`mcollective::classes`, ...: names no fact can have), plus `certname` unless
/// a fact already has that name.
fn server(ruby: &Ruby, node: &Node) -> Result<RHash, Error> {
    let hash = ruby.hash_new();
    for (name, value) in node.entries() {
        hash.aset(ruby.str_new(name), to_ruby(ruby, value)?)?;
    }
    if !node.facts.contains_key("certname") {
        hash.aset(ruby.str_new("certname"), frozen(ruby.str_new(&node.certname).as_value()))?;
    }
    hash.freeze();
    Ok(hash)
}

/// Shared between calls, so nothing a template does can change them.
fn frozen(value: Value) -> Value {
    value.freeze();
    value
}

fn to_ruby(ruby: &Ruby, value: &Json) -> Result<Value, Error> {
    Ok(match value {
        Json::Null => ruby.qnil().as_value(),
        Json::Bool(b) => ruby.into_value(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => ruby.integer_from_i64(i).as_value(),
            (None, Some(u)) => ruby.integer_from_u64(u).as_value(),
            _ => ruby.float_from_f64(n.as_f64().unwrap_or(f64::NAN)).as_value(),
        },
        Json::String(s) => frozen(ruby.str_new(s).as_value()),
        Json::Array(items) => {
            let array = ruby.ary_new_capa(items.len());
            for item in items {
                array.push(to_ruby(ruby, item)?)?;
            }
            frozen(array.as_value())
        }
        Json::Object(map) => {
            let hash = ruby.hash_new();
            for (k, v) in map {
                hash.aset(ruby.str_new(k), to_ruby(ruby, v)?)?;
            }
            frozen(hash.as_value())
        }
    })
}

#[magnus::init(name = "puppet_kicker")]
fn init(ruby: &Ruby) -> Result<(), Error> {
    let module = ruby.get_inner(&MODULE);
    let base = module.define_error("Error", ruby.exception_standard_error())?;
    for name in ["QueryError", "ConfigError", "NoDataError"] {
        module.define_error(name, base)?;
    }
    let native = module.define_module("Native")?;
    native.define_module_function("configure", function!(configure, 4))?;
    native.define_module_function("servers_with_role", function!(servers_with_role, 2))?;
    native.define_module_function("server_with_role", function!(server_with_role, 2))?;
    native.define_module_function("servers_with_facts", function!(servers_with_facts, 2))?;
    native.define_module_function("note_environment", function!(note_environment, 2))?;
    native.define_module_function("take_warnings", function!(take_warnings, 0))?;
    native.define_module_function("status", function!(status, 0))?;
    native.define_module_function("version", function!(version, 0))?;
    native.define_module_function("kick_report", function!(kick_report, 1))?;
    native.define_module_function("kick_flush", function!(kick_flush, 0))?;
    native.define_module_function("take_kick_log", function!(take_kick_log, 0))?;
    native.define_module_function("kick_status", function!(kick_status, 0))?;
    Ok(())
}
