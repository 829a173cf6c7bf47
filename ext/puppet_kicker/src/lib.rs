//! `puppet_kicker.so`: MRI's door into puppet-kicker's core. It only converts:
//! Ruby arguments in, `Node`s out as Hashes, core errors as `PuppetKicker::*Error`.
//!
//! Every entry point runs inside `entry`, and every call into the core inside `core`:
//! a Rust panic anywhere becomes a Ruby exception instead of `fatal`, which would end
//! the Puppet run. The core runs without the GVL, so its waits stop no Ruby thread.

mod gvl;

use magnus::value::{Lazy, ReprValue};
use magnus::RString;
use magnus::{function, prelude::*, Error, ExceptionClass, RArray, RHash, RModule, Ruby, Value};
use puppet_kicker::kick::{Level, LogLine};
use puppet_kicker::{Kicker, Node, PuppetSettings, RoleSelector, Selection};
use serde_json::Value as Json;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// `PuppetKicker::<name>`, looked up rather than kept: the lookup cannot panic, and a
/// missing class (a broken load) degrades to `RuntimeError` instead of `fatal`.
fn error_class(ruby: &Ruby, name: &str) -> ExceptionClass {
    ruby.class_object()
        .const_get::<_, RModule>("PuppetKicker")
        .and_then(|module| module.const_get::<_, ExceptionClass>(name))
        .unwrap_or_else(|_| ruby.exception_runtime_error())
}

/// `PuppetKicker::Error` for a panic caught in the binding or the core.
fn internal_error(ruby: &Ruby, panic: &(dyn Any + Send)) -> Error {
    Error::new(error_class(ruby, "Error"), puppet_kicker::error::internal_error_message(panic))
}

/// Runs a whole entry point, conversions to and from Ruby included: a panic anywhere
/// in it becomes `PuppetKicker::Error`. `body` must not let Ruby raise through it
/// (magnus's calls return Ruby exceptions as `Err`), so only Rust frames unwind here.
fn entry<T>(ruby: &Ruby, body: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| Err(internal_error(ruby, &*panic)))
}

/// Runs core code without the GVL, turning its errors into PuppetKicker exceptions
/// and its panics into `PuppetKicker::Error` ("internal error").
fn core<T: Send>(ruby: &Ruby, body: impl FnOnce() -> Result<T, puppet_kicker::Error> + Send) -> Result<T, Error> {
    match gvl::without_gvl(body) {
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
        Err(gvl::Failure::Panic(panic)) => Err(internal_error(ruby, &*panic)),
        Err(gvl::Failure::Interrupted) => {
            Err(Error::new(error_class(ruby, "Error"), "puppet-kicker: interrupted before the call could start"))
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
    entry(ruby, || {
        let settings = PuppetSettings {
            confdir: PathBuf::from(confdir),
            vardir: PathBuf::from(vardir),
            server_datadir: server_datadir.map(PathBuf::from),
            config_file: config_file.filter(|f| !f.is_empty()).map(PathBuf::from),
        };
        core(ruby, || Kicker::configure(settings).map(|_| ()))
    })
}

fn servers_with_role(ruby: &Ruby, roles: Vec<String>, environment: String) -> Result<RArray, Error> {
    entry(ruby, || {
        let selection = core(ruby, || {
            let roles = RoleSelector::parse(&roles)?;
            Kicker::global()?.servers_with_role(&roles, &environment)
        })?;
        servers(ruby, &selection)
    })
}

fn server_with_role(ruby: &Ruby, roles: Vec<String>, environment: String) -> Result<Value, Error> {
    entry(ruby, || {
        let selection = core(ruby, || {
            let roles = RoleSelector::parse(&roles)?;
            Kicker::global()?.servers_with_role(&roles, &environment)
        })?;
        match selection.positions().1.first() {
            Some(position) => converted(ruby, &selection, *position),
            None => Ok(ruby.qnil().as_value()),
        }
    })
}

fn servers_with_facts(ruby: &Ruby, clauses: Vec<String>, environment: String) -> Result<RArray, Error> {
    entry(ruby, || {
        let selection = core(ruby, || Kicker::global()?.servers_with_facts(&clauses, &environment))?;
        servers(ruby, &selection)
    })
}

fn note_environment(ruby: &Ruby, certname: String, environment: String) -> Result<(), Error> {
    entry(ruby, || core(ruby, || Kicker::global().map(|k| k.note_environment(&certname, &environment))))
}

fn take_warnings(ruby: &Ruby) -> Result<Vec<String>, Error> {
    entry(ruby, || core(ruby, || Ok(Kicker::global().map(|k| k.take_warnings()).unwrap_or_default())))
}

fn status(ruby: &Ruby) -> Result<RHash, Error> {
    entry(ruby, || {
        let (status, work_left, helper) = core(ruby, || {
            let kicker = Kicker::global()?;
            let helper = puppet_kicker::helper::describe(&kicker.config().cache_dir);
            Ok((kicker.status(), kicker.work_left(), helper))
        })?;
        let hash = ruby.hash_new();
        hash.aset("servers", status.servers)?;
        hash.aset("built_at", status.built_at)?;
        hash.aset("last_error", status.last_error)?;
        hash.aset("config_file", status.config_file.map(|f| f.display().to_string()))?;
        hash.aset("cache_dir", status.cache_dir.display().to_string())?;
        hash.aset("failures", status.failures)?;
        hash.aset("retry_at", status.retry_at)?;
        // Masterless: what this process leaves undone at exit, and the helper finishing it.
        hash.aset("work_left", work_left)?;
        hash.aset("helper", to_ruby(ruby, &helper)?)?;
        Ok(hash)
    })
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
    entry(ruby, || {
        // SAFETY: the bytes are copied before any Ruby code can run.
        let bytes = unsafe { report.as_slice() }.to_vec();
        let lines = core(ruby, || {
            let report = puppet_kicker::kick::parse_report(&bytes)?;
            Kicker::global()?.kick_report(&report)
        })?;
        log_lines(ruby, lines)
    })
}

fn kick_flush(ruby: &Ruby) -> Result<RArray, Error> {
    entry(ruby, || {
        let lines = core(ruby, || Ok(Kicker::global().map(|k| k.kick_flush()).unwrap_or_default()))?;
        log_lines(ruby, lines)
    })
}

fn take_kick_log(ruby: &Ruby) -> Result<RArray, Error> {
    entry(ruby, || {
        let lines = core(ruby, || Ok(Kicker::global().map(|k| k.take_kick_log()).unwrap_or_default()))?;
        log_lines(ruby, lines)
    })
}

fn kick_status(ruby: &Ruby) -> Result<String, Error> {
    entry(ruby, || core(ruby, || Kicker::global()?.kick_status().map(|s| s.to_string())))
}

/// The masterless helper's one call (lib/puppet_kicker/helper.rb): finishes the cache
/// dir's refresh and pending kicks, then returns how it ended. Never called by a master.
fn run_helper(
    ruby: &Ruby,
    confdir: String,
    vardir: String,
    server_datadir: Option<String>,
    config_file: Option<String>,
) -> Result<String, Error> {
    entry(ruby, || {
        let settings = PuppetSettings {
            confdir: PathBuf::from(confdir),
            vardir: PathBuf::from(vardir),
            server_datadir: server_datadir.filter(|d| !d.is_empty()).map(PathBuf::from),
            config_file: config_file.filter(|f| !f.is_empty()).map(PathBuf::from),
        };
        core(ruby, || puppet_kicker::helper::run(settings).map(|ending| format!("{ending:?}")))
    })
}

fn version(ruby: &Ruby) -> Result<String, Error> {
    entry(ruby, || Ok(puppet_kicker::service::version().to_string()))
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
    let Some(node) = selection.node_at(position) else {
        let message = format!("puppet-kicker internal error: no server at position {position} of index {generation}");
        return Err(Error::new(error_class(ruby, "Error"), message));
    };
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
    entry(ruby, || define(ruby))
}

fn define(ruby: &Ruby) -> Result<(), Error> {
    let module = ruby.define_module("PuppetKicker")?;
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
    native.define_module_function("run_helper", function!(run_helper, 4))?;
    Ok(())
}

/// One embedded Ruby VM per process, bound to the thread that started it: the checks
/// run in one test, in turn.
#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn no_panic_or_broken_invariant_reaches_ruby_as_fatal() {
        // SAFETY: the only VM of this test process, started and used on this thread.
        let _cleanup = unsafe { magnus::embed::init() };
        let ruby = Ruby::get().unwrap();
        define(&ruby).unwrap();

        a_panic_in_an_entry_point_is_a_puppet_kicker_error(&ruby);
        a_panic_in_the_core_without_the_gvl_is_a_puppet_kicker_error(&ruby);
        a_server_past_the_end_of_its_index_is_a_puppet_kicker_error(&ruby);
    }

    fn assert_puppet_kicker_error(ruby: &Ruby, error: Error, message: &str) {
        let class = error_class(ruby, "Error");
        assert!(error.is_kind_of(class), "{error} is not a PuppetKicker::Error");
        assert!(!error.is_kind_of(ruby.exception_fatal()), "{error} is fatal");
        assert!(error.to_string().contains(message), "{error:?} does not say {message:?}");
    }

    fn a_panic_in_an_entry_point_is_a_puppet_kicker_error(ruby: &Ruby) {
        let error = entry(ruby, || -> Result<(), Error> { panic!("conversion invariant broken") }).unwrap_err();
        assert_puppet_kicker_error(ruby, error, "puppet-kicker internal error: conversion invariant broken");
    }

    fn a_panic_in_the_core_without_the_gvl_is_a_puppet_kicker_error(ruby: &Ruby) {
        let error = core(ruby, || -> Result<(), puppet_kicker::Error> { panic!("core invariant broken") }).unwrap_err();
        assert_puppet_kicker_error(ruby, error, "puppet-kicker internal error: core invariant broken");
        assert_eq!(core(ruby, || Ok(6 * 7)).unwrap(), 42, "a value comes back from without the GVL");
    }

    fn a_server_past_the_end_of_its_index_is_a_puppet_kicker_error(ruby: &Ruby) {
        let dir = std::env::temp_dir().join(format!("puppet-kicker-binding-{}", std::process::id()));
        let facts = dir.join("var/server_data/facts");
        fs::create_dir_all(&facts).unwrap();
        fs::create_dir_all(dir.join("etc")).unwrap();
        fs::write(dir.join("etc/puppet_kicker.yaml"), "cache:\n  dir: cache\n").unwrap();
        let document = r#"{"name":"web1.example.com","values":{"role":"web"},
            "timestamp":"2099-01-01T00:00:00.000000000+00:00","expiration":"2099-01-01T00:00:00.000000000+00:00"}"#;
        fs::write(facts.join("web1.example.com.json"), document).unwrap();
        let settings = PuppetSettings {
            confdir: dir.join("etc"),
            vardir: dir.join("var"),
            server_datadir: None,
            config_file: None,
        };
        let kicker = Kicker::start(settings).unwrap();
        let selection = kicker.servers_with_role(&RoleSelector::parse(&["web"]).unwrap(), "production").unwrap();
        assert_eq!(selection.len(), 1, "the fixture server is found");

        let past_the_end = selection.len() as u32 + 1000;
        let error = converted(ruby, &selection, past_the_end).unwrap_err();
        assert_puppet_kicker_error(ruby, error, &format!("no server at position {past_the_end}"));
        let found = converted(ruby, &selection, selection.positions().1[0]).unwrap();
        assert!(RHash::from_value(found).is_some(), "the server at a valid position is a Hash");
        fs::remove_dir_all(&dir).unwrap();
    }
}
