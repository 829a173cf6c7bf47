//! Records in the extension which Ruby it is compiled for: the `ruby_version` (MRI's
//! extension ABI: "3.1.0" for every 3.1.x) and `arch` of the RbConfig that rb-sys
//! compiled the bindings from (its `DEP_RB_*` metadata, so the record is the headers'
//! Ruby, not a guess). `src/lib.rs` keeps it in the library as one NUL-delimited
//! string, `PUPPET_KICKER_RUBY_ABI ruby_version=.. arch=.. ruby=..`, which
//! lib/puppet_kicker/ruby_abi.rb reads from the file before loading it: an extension
//! compiled for another Ruby reads that Ruby's objects with the wrong layouts, so it
//! is never loaded there (the ffi backend, whose C ABI does not depend on Ruby, is
//! used instead). The record is inside the library, so it travels with it: no file
//! beside it can be copied or lost apart from it.
use std::env;

fn main() {
    let field = |key: &str| {
        let name = format!("DEP_RB_RBCONFIG_{key}");
        println!("cargo:rerun-if-env-changed={name}");
        let value = env::var(&name).unwrap_or_default();
        // The record is space-separated `name=value`s between NULs.
        if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '\0' || c == '=') {
            panic!("puppet-kicker-ruby: rb-sys gave no usable RbConfig {key} ({name}={value:?})");
        }
        value
    };
    let record =
        format!("ruby_version={} arch={} ruby={}", field("RUBY_VERSION"), field("ARCH"), field("RUBY_PROGRAM_VERSION"));
    println!("cargo:rustc-env=PUPPET_KICKER_RUBY_ABI={record}");
    println!("cargo:rerun-if-changed=build.rs");
}
