//! The operator's other configuration files, as the sources read them: mcollective's
//! `client.cfg` (`mcollective::Config::resolve`: brokers and their TLS settings, the
//! PSK, collectives, timeouts and limits) and PuppetDB's `puppetdb.conf`
//! (`conf::parse_server_urls`). An error names client.cfg; a config taken has a
//! broker; every PuppetDB URL taken is an `https://` URL with a host.
//!
//! client.cfg's TLS files are read as it is: here each (`ssl.ca`, `ssl.cert`,
//! `ssl.key`) names a file of a sandbox instead (`ca.pem` is `fca.pem` there), so
//! that a fuzzed path cannot name a device that blocks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::mcollective::{Config, Overrides};
use puppet_kicker::source::puppetdb::conf;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const TLS_KEYS: [&str; 3] = ["ssl.ca", "ssl.cert", "ssl.key"];

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Ok(text) = std::str::from_utf8(input) else { return };
    let client_cfg = sandboxed(text);
    let path = Path::new("/etc/puppetlabs/mcollective/client.cfg");
    match Config::resolve(&client_cfg, Some(path), &Overrides::default(), None) {
        Ok(config) => assert!(!config.pool.is_empty()),
        Err(e) => assert!(e.to_string().contains("client.cfg"), "{e}"),
    }
    // With the PSK from the environment, as MCOLLECTIVE_PSK gives it.
    let _ = Config::resolve(&client_cfg, None, &Overrides::default(), Some("psk".to_string()));
    if let Ok(urls) = conf::parse_server_urls(text) {
        assert!(urls.iter().all(|url| conf::is_https_url(url)), "{urls:?}");
    }
});

/// `text` with the files of its TLS keys in the sandbox (lines read as client.cfg's are).
fn sandboxed(text: &str) -> String {
    let lines = text.lines().map(|line| match line.trim().split_once('=') {
        Some((key, value)) if TLS_KEYS.iter().any(|k| key.trim().ends_with(k)) => {
            let files: Vec<String> = value
                .split(',')
                .map(str::trim)
                .map(|file| if file.is_empty() { String::new() } else { sandbox(file).display().to_string() })
                .collect();
            format!("{key}={}", files.join(","))
        }
        _ => line.to_string(),
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// `file` in the sandbox: its slashes made part of one name, prefixed so that no
/// name is `.` or `..`.
fn sandbox(file: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = puppet_kicker_fuzz::scratch_dir().join("tls");
        std::fs::create_dir_all(&dir).expect("the sandbox");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
        std::fs::write(dir.join("fca.pem"), pem).expect("a PEM file");
        std::fs::write(dir.join("fempty.pem"), "").expect("an empty file");
        dir
    });
    dir.join(format!("f{}", file.replace('/', "_")))
}
