//! `puppet_kicker.so`: MRI's door into puppet-kicker's core. It only converts:
//! Ruby arguments in, `Node`s out as Hashes, core errors as `PuppetKicker::*Error`.
//!
//! Every entry point runs inside `entry`, and every call into the core inside `core`:
//! a Rust panic anywhere becomes a Ruby exception instead of `fatal`, which would end
//! the Puppet run. The core runs without the GVL, so its waits stop no Ruby thread.

mod convert;
mod gvl;
mod same_keys;

use convert::Converter;

use magnus::r_hash::ForEach;
use magnus::value::ReprValue;
use magnus::RString;
use magnus::{function, prelude::*, Error, ExceptionClass, RHash, RModule, Ruby, Value};
use puppet_kicker::api::{self, Failure, NoteEnvironment, Query, Settings};
use puppet_kicker::log::LogLine;
use serde_json::Value as Json;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Which Ruby this extension is compiled for (build.rs), where
/// lib/puppet_kicker/ruby_abi.rb finds it in the file before loading it: the only
/// copy of its marker in the library, between NULs. Loaded, it is
/// `PuppetKicker::Native::RUBY_ABI`.
static RUBY_ABI: &str = concat!("\0PUPPET_KICKER_RUBY_ABI ", env!("PUPPET_KICKER_RUBY_ABI"), "\0");

/// The exception class for a failure: `PuppetKicker::ERRORS[kind]`, the one list
/// (lib/puppet_kicker.rb), else `PuppetKicker::Error`. Looked up rather than kept:
/// the lookup cannot panic, and a missing class (a broken load) degrades to
/// `RuntimeError` instead of `fatal`.
fn error_class(ruby: &Ruby, kind: api::Kind) -> ExceptionClass {
    let module = ruby.class_object().const_get::<_, RModule>("PuppetKicker").ok();
    let listed = module.and_then(|m| m.const_get::<_, RHash>("ERRORS").ok());
    listed
        .and_then(|errors| errors.lookup::<_, Option<ExceptionClass>>(kind.as_str()).ok().flatten())
        .or_else(|| module.and_then(|m| m.const_get::<_, ExceptionClass>("Error").ok()))
        .unwrap_or_else(|| ruby.exception_runtime_error())
}

fn raise(ruby: &Ruby, failure: Failure) -> Error {
    Error::new(error_class(ruby, failure.kind), failure.message)
}

/// Runs a whole entry point, conversions to and from Ruby included: a panic anywhere
/// in it becomes `PuppetKicker::Error`. `body` must not let Ruby raise through it
/// (magnus's calls return Ruby exceptions as `Err`), so only Rust frames unwind here.
fn entry<T>(ruby: &Ruby, body: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| Err(raise(ruby, Failure::panic(&*panic))))
}

/// Runs an api call without the GVL, its errors and panics raised as
/// `PuppetKicker::*Error`. When Ruby has an interrupt pending, the call has not
/// started: Ruby handles it first (switches threads, runs a signal's handler, or
/// raises what `Thread#raise` sent, which then propagates), then the call runs.
fn core<T: Send>(ruby: &Ruby, body: impl FnOnce() -> Result<T, puppet_kicker::Error> + Send) -> Result<T, Error> {
    let mut body = body;
    for _ in 0..MAX_INTERRUPTS {
        match gvl::without_gvl(body) {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => return Err(raise(ruby, e.into())),
            Err(gvl::Failure::Panic(panic)) => return Err(raise(ruby, Failure::panic(&*panic))),
            Err(gvl::Failure::Interrupted(again)) => {
                ruby.thread_check_ints()?;
                body = again;
            }
        }
    }
    Err(raise(ruby, Failure::internal(format!("interrupted {MAX_INTERRUPTS} times before the call could start"))))
}

/// Interrupts handled before a call gives up: each is a thread switch at the least,
/// so a call that meets this many has waited for the other threads long enough.
const MAX_INTERRUPTS: u32 = 1000;

/// An api call whose value converts to Ruby.
fn call<T: Send>(
    ruby: &Ruby,
    body: impl FnOnce() -> Result<T, puppet_kicker::Error> + Send,
    convert: impl FnOnce(&Ruby, T) -> Result<Value, Error>,
) -> Result<Value, Error> {
    entry(ruby, || convert(ruby, core(ruby, body)?))
}

/// Puppet's settings; `ssl` maps the names of [`Settings::SSL`] to paths (or nil).
fn settings(
    ruby: &Ruby,
    confdir: String,
    vardir: String,
    server_datadir: Option<String>,
    config_file: Option<String>,
    ssl: Option<RHash>,
) -> Result<Settings, Error> {
    let mut settings = Settings { confdir, vardir, server_datadir, config_file, ..Settings::default() };
    if let Some(ssl) = ssl {
        ssl.foreach(|name: String, path: Option<String>| {
            if settings.set_ssl(&name, path) {
                return Ok(ForEach::Continue);
            }
            let known = Settings::SSL.join(", ");
            Err(Error::new(ruby.exception_arg_error(), format!("unknown certificate setting {name:?}: use {known}")))
        })?;
    }
    Ok(settings)
}

fn servers(ruby: &Ruby, query: Query) -> Result<Value, Error> {
    call(
        ruby,
        || api::select(query),
        |ruby, selected| {
            let mut converter = Converter::new(ruby, &selected)?;
            let id = selected.answer_id();
            if let Some(kept) = converter.kept_answer(id)? {
                return Ok(kept);
            }
            let servers = selected
                .positions()
                .iter()
                .map(|position| converter.server(&selected, *position))
                .collect::<Result<Vec<Value>, Error>>()?;
            let array = ruby.ary_new_from_values(&servers);
            array.freeze();
            converter.keep_answer(id, array)?;
            Ok(array.as_value())
        },
    )
}

fn first(ruby: &Ruby, query: Query) -> Result<Value, Error> {
    call(
        ruby,
        || api::select(query),
        |ruby, selected| match selected.positions().first() {
            Some(position) => Converter::new(ruby, &selected)?.server(&selected, *position),
            None => Ok(ruby.qnil().as_value()),
        },
    )
}

fn nil(ruby: &Ruby, _: ()) -> Result<Value, Error> {
    Ok(ruby.qnil().as_value())
}

fn string(ruby: &Ruby, text: impl AsRef<str>) -> Result<Value, Error> {
    Ok(ruby.str_new(text.as_ref()).as_value())
}

/// `[[level, message], ...]` for Puppet's logger.
fn log_lines(ruby: &Ruby, lines: Vec<LogLine>) -> Result<Value, Error> {
    let array = ruby.ary_new_capa(lines.len());
    for line in lines {
        array.push((line.level.as_str(), line.message))?;
    }
    Ok(array.as_value())
}

fn status(ruby: &Ruby, status: api::Status) -> Result<Value, Error> {
    let hash = ruby.hash_new();
    for (name, value) in status.fields() {
        hash.aset(name, to_ruby(ruby, &value)?)?;
    }
    Ok(hash.as_value())
}

/// The report's bytes, copied before any Ruby code can run.
fn bytes(report: RString) -> Vec<u8> {
    // SAFETY: copied at once, with no Ruby call in between.
    unsafe { report.as_slice() }.to_vec()
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

/// `PuppetKicker::Native`, one line per function. The exception classes are
/// lib/puppet_kicker.rb's, which loads this library.
#[rustfmt::skip]
fn define(ruby: &Ruby) -> Result<(), Error> {
    let native = ruby.define_module("PuppetKicker")?.define_module("Native")?;
    // (black_box: the record's bytes stay in the file whole, NULs included.)
    native.const_set("RUBY_ABI", std::hint::black_box(RUBY_ABI).trim_matches('\0'))?;
    native.define_module_function("configure", function!(|r: &Ruby, c, v, d, f, s| { let s = settings(r, c, v, d, f, s)?; call(r, || api::configure(s), nil) }, 5))?;
    native.define_module_function("servers_with_role", function!(|r: &Ruby, roles, environment| servers(r, Query::ServersWithRole { roles, environment }), 2))?;
    native.define_module_function("server_with_role", function!(|r: &Ruby, roles, environment| first(r, Query::ServerWithRole { roles, environment }), 2))?;
    native.define_module_function("servers_with_facts", function!(|r: &Ruby, clauses, environment| servers(r, Query::ServersWithFacts { clauses, environment }), 2))?;
    native.define_module_function("note_environment", function!(|r: &Ruby, certname, environment| call(r, || api::note_environment(NoteEnvironment { certname, environment }), nil), 2))?;
    native.define_module_function("take_log", function!(|r: &Ruby| call(r, api::take_log, log_lines), 0))?;
    native.define_module_function("log_pending", function!(|r: &Ruby| entry(r, || Ok(api::log_pending())), 0))?;
    native.define_module_function("status", function!(|r: &Ruby| call(r, api::status, status), 0))?;
    native.define_module_function("version", function!(|r: &Ruby| call(r, api::version, string), 0))?;
    native.define_module_function("kick_report", function!(|r: &Ruby, report: RString| { let report = bytes(report); call(r, move || api::kick_report(&report), log_lines) }, 1))?;
    native.define_module_function("kick_flush", function!(|r: &Ruby| call(r, api::kick_flush, log_lines), 0))?;
    native.define_module_function("kick_status", function!(|r: &Ruby| call(r, api::kick_status, string), 0))?;
    native.define_module_function("command", function!(|r: &Ruby, request: RString| { let request = bytes(request); call(r, move || api::command(&request), string) }, 1))?;
    native.define_module_function("run_helper", function!(|r: &Ruby, c, v, d, f, s| { let s = settings(r, c, v, d, f, s)?; call(r, || api::run_helper(s), string) }, 5))?;
    Ok(())
}

/// One embedded Ruby VM per process, bound to the thread that started it: the checks
/// run in one test, in turn.
#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    #[test]
    fn no_panic_or_broken_invariant_reaches_ruby_as_fatal() {
        // SAFETY: the only VM of this test process, started and used on this thread.
        let _cleanup = unsafe { magnus::embed::init() };
        let ruby = Ruby::get().unwrap();
        // The exception classes are the facade's: load it as Puppet does.
        let _: bool = ruby.require(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lib/puppet_kicker.rb")).unwrap();
        define(&ruby).unwrap();

        each_failure_kind_raises_the_class_the_facade_lists(&ruby);
        a_panic_in_an_entry_point_is_a_puppet_kicker_error(&ruby);
        a_panic_in_the_core_without_the_gvl_is_a_puppet_kicker_error(&ruby);
        a_server_past_the_end_of_its_index_is_a_puppet_kicker_error(&ruby);
        a_panic_or_a_ruby_exception_while_converting_is_an_error_and_leaves_the_stack_empty(&ruby);
        same_keys::tests::a_copy_is_the_hash_insertion_builds(&ruby);
        convert::tests::servers_are_deep_frozen_hashes_that_share_equal_values(&ruby);
        convert::tests::a_compacting_gc_leaves_every_converted_object_found_by_its_slot(&ruby);
    }

    fn each_failure_kind_raises_the_class_the_facade_lists(ruby: &Ruby) {
        use api::Kind;
        for (kind, class) in [
            (Kind::Query, "PuppetKicker::QueryError"),
            (Kind::Config, "PuppetKicker::ConfigError"),
            (Kind::NoData, "PuppetKicker::NoDataError"),
            (Kind::Report, "PuppetKicker::ReportError"),
            (Kind::Io, "PuppetKicker::Error"),
            (Kind::Internal, "PuppetKicker::Error"),
        ] {
            assert_eq!(unsafe { error_class(ruby, kind).name() }, class, "{kind:?}");
        }
    }

    fn assert_puppet_kicker_error(ruby: &Ruby, error: Error, message: &str) {
        let class = error_class(ruby, api::Kind::Internal);
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
        let path = |p: PathBuf| p.display().to_string();
        api::configure(settings(ruby, path(dir.join("etc")), path(dir.join("var")), None, None, None).unwrap())
            .unwrap();
        let query = Query::ServersWithRole { roles: vec!["web".into()], environment: "production".into() };
        let selected = api::select(query).unwrap();
        assert_eq!(selected.positions().len(), 1, "the fixture server is found");

        let mut converter = Converter::new(ruby, &selected).unwrap();
        let past_the_end = selected.positions().len() as u32 + 1000;
        let error = converter.server(&selected, past_the_end).unwrap_err();
        assert_puppet_kicker_error(ruby, error, &format!("no server at position {past_the_end}"));
        let found = converter.server(&selected, selected.positions()[0]).unwrap();
        assert!(RHash::from_value(found).is_some(), "the server at a valid position is a Hash");
        fs::remove_dir_all(&dir).unwrap();
    }

    fn a_panic_or_a_ruby_exception_while_converting_is_an_error_and_leaves_the_stack_empty(ruby: &Ruby) {
        let query = Query::ServersWithRole { roles: vec!["web".into()], environment: "production".into() };
        let selected = api::select(query).unwrap();
        let mut converter = Converter::new(ruby, &selected).unwrap();

        let error = converter
            .protected(|c| {
                c.push_pending(ruby.qnil().as_value());
                panic!("broken while converting")
            })
            .unwrap_err();
        assert_puppet_kicker_error(ruby, error, "puppet-kicker internal error: broken while converting");
        assert_eq!(converter.pending(), 0, "a panic leaves nothing on the stack");

        let frozen = ruby.ary_new();
        frozen.freeze();
        let error = converter
            .protected(|c| {
                c.push_pending(ruby.str_new("cut short").as_value());
                convert::store_raw(frozen, 0, ruby.qnil().as_value())
            })
            .unwrap_err();
        assert!(error.is_kind_of(ruby.exception_frozen_error()), "{error} is the FrozenError Ruby raised");
        assert_eq!(converter.pending(), 0, "a Ruby exception leaves nothing on the stack");
        let position = selected.positions()[0];
        let after_failures = converter.server(&selected, position).unwrap();
        drop(converter);

        // A panic while a converter lives (caught by `entry`, the converter dropped
        // on the way) leaves the next converter working, from a fresh start.
        let error = entry(ruby, || -> Result<(), Error> {
            let _converter = Converter::new(ruby, &selected)?;
            panic!("broken beside the converter")
        })
        .unwrap_err();
        assert_puppet_kicker_error(ruby, error, "broken beside the converter");
        let again = Converter::new(ruby, &selected).expect("a converter after a panic").server(&selected, position);
        let again = again.expect("the server converted again");
        assert!(again.eql(after_failures).unwrap(), "{again:?} is {after_failures:?}");
    }
}
