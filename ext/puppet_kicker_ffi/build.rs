//! Marks the library "nodelete" on Linux: a dlclose (a JRuby instance being flushed by
//! puppetserver, say) must never unmap code that the core's refresh thread is running.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
