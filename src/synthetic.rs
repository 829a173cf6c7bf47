//! A deterministic synthetic fleet, for benchmarks and tests only: servers with
//! Facter-4-like facts (about 150 top-level facts each, structured and legacy flat
//! ones), a skewed mix of roles, three environments and a few stale servers.
//!
//! Everything comes from a small hand-written PRNG seeded by `seed` and the server's
//! number, so the same `(count, seed, now)` always gives the same fleet, and a fleet
//! of `n` servers is the first `n` of any larger one with the same seed. Only the
//! timestamps depend on `now`, so that the fleet is fresh whenever it is generated.
//! [`write_puppet_cache`] writes a fleet the way puppetserver caches facts, to
//! benchmark the real load path (`pk-synthetic-facts DIR N [SEED]` on the command line).

use crate::facts::{Facts, Node};
use crate::time::CalendarTime;
use serde::Serialize;
use serde_json::{json, Value};
use std::fs;
use std::io::{BufWriter, Write};
use std::path::Path;

/// Roles and their weights (per mille): many plain nodes, few load balancers.
pub const ROLES: &[(&str, u32)] = &[
    ("node", 550),
    ("web", 120),
    ("worker", 80),
    ("db", 70),
    ("cache", 60),
    ("haproxy", 30),
    ("mq", 40),
    ("monitoring", 20),
    ("bastion", 30),
];

/// Environments and their weights (per cent).
pub const ENVIRONMENTS: &[(&str, u32)] = &[("production", 70), ("staging", 20), ("dev", 10)];

/// Share of servers whose facts are weeks old (decommissioned, agent broken): older
/// than the default `max_age` of seven days.
pub const STALE_SHARE: f64 = 0.015;

const DATACENTERS: &[&str] = &["ams1", "fra1", "lon1", "par1"];

/// A hand-written SplitMix64: tiny, fast, and good enough for test data. Not for
/// anything that needs unpredictability.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift: no modulo bias worth naming.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    pub fn weighted<'a, T>(&mut self, items: &'a [(T, u32)]) -> &'a T {
        let total: u64 = items.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut ticket = self.below(total);
        for (item, weight) in items {
            if ticket < u64::from(*weight) {
                return item;
            }
            ticket -= u64::from(*weight);
        }
        &items[items.len() - 1].0
    }

    pub fn hex(&mut self, len: usize) -> String {
        (0..len).map(|_| char::from(b"0123456789abcdef"[self.below(16) as usize])).collect()
    }

    fn base64(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        (0..len).map(|_| char::from(ALPHABET[self.below(64) as usize])).collect()
    }
}

/// `count` servers; see the module documentation.
pub fn fleet(count: usize, seed: u64, now: i64) -> Vec<Node> {
    (0..count).map(|i| node(i, seed, now)).collect()
}

/// Server number `index` of the fleet of `seed`.
pub fn node(index: usize, seed: u64, now: i64) -> Node {
    let base = Rng::new(seed).next_u64();
    let mut rng = Rng::new(base ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let (certname, facts) = facts(index, &mut rng);
    let age = if rng.chance(STALE_SHARE) { rng.range(8 * 86_400, 60 * 86_400) } else { rng.below(1800) };
    Node::new(certname, facts, now - age as i64, None)
}

/// One row of the operating systems a fleet runs, with its weight.
struct Os {
    family: &'static str,
    name: &'static str,
    full: &'static str,
    major: &'static str,
    minor: Option<&'static str>,
    codename: &'static str,
    description: &'static str,
    kernelrelease: &'static str,
    weight: u32,
}

#[rustfmt::skip]
const OPERATING_SYSTEMS: &[Os] = &[
    Os { family: "Debian", name: "Debian", full: "12.7", major: "12", minor: Some("7"), codename: "bookworm", description: "Debian GNU/Linux 12 (bookworm)", kernelrelease: "6.1.0-25-amd64", weight: 30 },
    Os { family: "Debian", name: "Debian", full: "12.5", major: "12", minor: Some("5"), codename: "bookworm", description: "Debian GNU/Linux 12 (bookworm)", kernelrelease: "6.1.0-18-amd64", weight: 10 },
    Os { family: "Debian", name: "Debian", full: "11.11", major: "11", minor: Some("11"), codename: "bullseye", description: "Debian GNU/Linux 11 (bullseye)", kernelrelease: "5.10.0-32-amd64", weight: 15 },
    Os { family: "Debian", name: "Debian", full: "11.9", major: "11", minor: Some("9"), codename: "bullseye", description: "Debian GNU/Linux 11 (bullseye)", kernelrelease: "5.10.0-28-amd64", weight: 5 },
    Os { family: "Debian", name: "Debian", full: "10.13", major: "10", minor: Some("13"), codename: "buster", description: "Debian GNU/Linux 10 (buster)", kernelrelease: "4.19.0-27-amd64", weight: 5 },
    Os { family: "Debian", name: "Ubuntu", full: "22.04", major: "22.04", minor: None, codename: "jammy", description: "Ubuntu 22.04.4 LTS", kernelrelease: "5.15.0-119-generic", weight: 12 },
    Os { family: "Debian", name: "Ubuntu", full: "24.04", major: "24.04", minor: None, codename: "noble", description: "Ubuntu 24.04.1 LTS", kernelrelease: "6.8.0-45-generic", weight: 8 },
    Os { family: "Debian", name: "Ubuntu", full: "20.04", major: "20.04", minor: None, codename: "focal", description: "Ubuntu 20.04.6 LTS", kernelrelease: "5.4.0-196-generic", weight: 5 },
    Os { family: "RedHat", name: "Rocky", full: "9.4", major: "9", minor: Some("4"), codename: "Blue Onyx", description: "Rocky Linux release 9.4 (Blue Onyx)", kernelrelease: "5.14.0-427.13.1.el9_4.x86_64", weight: 6 },
    Os { family: "RedHat", name: "Rocky", full: "8.10", major: "8", minor: Some("10"), codename: "Green Obsidian", description: "Rocky Linux release 8.10 (Green Obsidian)", kernelrelease: "4.18.0-553.el8_10.x86_64", weight: 4 },
];

const CPU_MODELS: &[&str] =
    &["AMD EPYC 7763 64-Core Processor", "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "AMD EPYC 9454 48-Core Processor"];

const GIB: u64 = 1 << 30;

/// The certname and facts of server `index`.
fn facts(index: usize, rng: &mut Rng) -> (String, Facts) {
    let role = *rng.weighted(ROLES);
    let environment = *rng.weighted(ENVIRONMENTS);
    let env_number = ENVIRONMENTS.iter().position(|(e, _)| *e == environment).unwrap_or(0);
    let dc_number = rng.below(DATACENTERS.len() as u64) as usize;
    let dc = DATACENTERS[dc_number];
    let domain = if environment == "production" {
        format!("{dc}.example.com")
    } else {
        format!("{environment}.{dc}.example.com")
    };
    let hostname = format!("{role}{index:05}");
    let fqdn = format!("{hostname}.{domain}");

    let os_weights: Vec<(usize, u32)> = OPERATING_SYSTEMS.iter().enumerate().map(|(i, os)| (i, os.weight)).collect();
    let os = &OPERATING_SYSTEMS[*rng.weighted(&os_weights)];
    let redhat = os.family == "RedHat";
    let physical = matches!(role, "db" | "cache") && rng.chance(0.4);

    let cpus: u64 = match role {
        "db" | "cache" => *rng.weighted(&[(8, 30), (16, 45), (32, 25)]),
        "haproxy" | "bastion" | "monitoring" => *rng.weighted(&[(2, 50), (4, 50)]),
        _ => *rng.weighted(&[(2, 30), (4, 35), (8, 20), (16, 10), (32, 5)]),
    };
    let cpu_model = *rng.pick(CPU_MODELS);
    let memory_total = cpus * *rng.pick(&[2, 4, 8]) * GIB;
    let memory_used = memory_total / 100 * rng.range(15, 85);
    let swap_total = if redhat { 2 * GIB } else { GIB };
    let swap_used = swap_total / 100 * rng.range(0, 20);

    let octet2 = 16 * env_number + dc_number;
    let host = index + 10;
    let ip = format!("10.{octet2}.{}.{}", (host >> 8) & 255, host & 255);
    let network = format!("10.{octet2}.0.0");
    let netmask = "255.255.0.0";
    let mac_tail = rng.hex(6);
    let mac = format!("52:54:00:{}:{}:{}", &mac_tail[0..2], &mac_tail[2..4], &mac_tail[4..6]);
    let ip6 = format!("fe80::5054:ff:fe{}:{}", &mac_tail[0..2], &mac_tail[2..6]);
    let uuid = format!("{}-{}-4{}-a{}-{}", rng.hex(8), rng.hex(4), rng.hex(3), rng.hex(3), rng.hex(12));

    let disk = if physical { "sda" } else { "vda" };
    let disk_size = if matches!(role, "db" | "mq") { 200 * GIB } else { 40 * GIB };
    let root_size = disk_size - 2 * GIB;
    let root_used = root_size / 100 * rng.range(10, 90);
    let boot_size = 943 << 20;
    let boot_used = boot_size / 100 * rng.range(10, 40);

    let uptime_seconds =
        if rng.chance(0.1) { rng.below(86_400) } else { rng.range(86_400, 400 * 86_400) } + rng.below(3600);
    let (uptime_days, uptime_hours) = (uptime_seconds / 86_400, uptime_seconds / 3600);
    let uptime = match uptime_days {
        0 => format!("{}:{:02} hours", uptime_hours, uptime_seconds / 60 % 60),
        1 => "1 day".to_string(),
        d => format!("{d} days"),
    };
    let mut load = || (rng.unit() * cpus as f64 * 0.6 * 100.0).round() / 100.0;
    let load_averages = json!({"1m": load(), "5m": load(), "15m": load()});

    let rsa_key = format!("AAAAB3NzaC1yc2EAAAADAQABAAABgQ{}", rng.base64(514));
    let ecdsa_key = format!("AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBB{}", rng.base64(88));
    let ed25519_key = format!("AAAAC3NzaC1lZDI1NTE5AAAAI{}", rng.base64(43));
    let mut fingerprints = |algorithm: u32| json!({"sha1": format!("SSHFP {algorithm} 1 {}", rng.hex(40)), "sha256": format!("SSHFP {algorithm} 2 {}", rng.hex(64))});
    let (rsa_fp, ecdsa_fp, ed25519_fp) = (fingerprints(1), fingerprints(3), fingerprints(4));
    let sshfp = |fp: &Value| format!("{}\n{}", fp["sha1"].as_str().unwrap_or(""), fp["sha256"].as_str().unwrap_or(""));

    let serial = if physical { rng.hex(7).to_uppercase() } else { String::new() };
    let architecture = if redhat { "x86_64" } else { "amd64" };
    let (kernel_major, kernel_version) = {
        let numeric = os.kernelrelease.split('-').next().unwrap_or(os.kernelrelease);
        let mut parts = numeric.split('.');
        let major = format!("{}.{}", parts.next().unwrap_or("0"), parts.next().unwrap_or("0"));
        (major, numeric.to_string())
    };
    let release = match os.minor {
        Some(minor) => json!({"full": os.full, "major": os.major, "minor": minor}),
        None => json!({"full": os.full, "major": os.major}),
    };
    let selinux = redhat && rng.chance(0.5);
    let rack = format!("{dc}-r{:02}", rng.range(1, 40));

    let mut f = Facts::new();
    let mut set = |name: &str, value: Value| {
        f.insert(name.to_string(), value);
    };

    // Site facts: what a fleet adds through custom facts and the agent.
    set("role", json!(role));
    set("environment", json!(environment));
    set("agent_specified_environment", json!(environment));
    set("datacenter", json!(dc));
    set("rack", json!(rack));
    set(
        "team",
        json!(match role {
            "db" | "cache" | "mq" => "data",
            "haproxy" | "bastion" | "monitoring" => "infra",
            _ => "product",
        }),
    );
    set("clientcert", json!(fqdn));
    set("clientversion", json!("8.10.0"));
    set("clientnoop", json!(false));

    // Facter 4 structured facts.
    set(
        "os",
        json!({
            "architecture": architecture,
            "family": os.family,
            "hardware": "x86_64",
            "name": os.name,
            "release": release,
            "distro": {
                "codename": os.codename,
                "description": os.description,
                "id": os.name,
                "release": release,
            },
            "selinux": {"enabled": selinux},
        }),
    );
    let lo = json!({
        "bindings": [{"address": "127.0.0.1", "netmask": "255.0.0.0", "network": "127.0.0.0"}],
        "bindings6": [{"address": "::1", "netmask": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "network": "::1", "scope6": "host"}],
        "ip": "127.0.0.1", "ip6": "::1", "mtu": 65536, "netmask": "255.0.0.0",
        "netmask6": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "network": "127.0.0.0", "network6": "::1", "scope6": "host",
    });
    let eth0 = json!({
        "bindings": [{"address": ip, "netmask": netmask, "network": network}],
        "bindings6": [{"address": ip6, "netmask": "ffff:ffff:ffff:ffff::", "network": "fe80::", "scope6": "link"}],
        "ip": ip, "ip6": ip6, "mac": mac, "mtu": 1500, "netmask": netmask, "netmask6": "ffff:ffff:ffff:ffff::",
        "network": network, "network6": "fe80::", "scope6": "link", "speed": 10000, "duplex": "full",
    });
    set(
        "networking",
        json!({
            "domain": domain, "fqdn": fqdn, "hostname": hostname,
            "interfaces": {"eth0": eth0, "lo": lo},
            "ip": ip, "ip6": ip6, "mac": mac, "mtu": 1500, "netmask": netmask, "netmask6": "ffff:ffff:ffff:ffff::",
            "network": network, "network6": "fe80::", "primary": "eth0", "scope6": "link",
        }),
    );
    set(
        "processors",
        json!({
            "count": cpus,
            "isa": "x86_64",
            "models": vec![cpu_model; cpus as usize],
            "physicalcount": if physical { 2 } else { 1 },
            "speed": "2.45 GHz",
            "extensions": ["x86_64", "x86_64-v1", "x86_64-v2", "x86_64-v3"],
        }),
    );
    set(
        "memory",
        json!({
            "system": sizes(memory_total, memory_used),
            "swap": sizes(swap_total, swap_used),
        }),
    );
    let mut disks = Facts::new();
    disks.insert(disk.to_string(), disk_facts(physical, disk_size, rng));
    if matches!(role, "db" | "mq") {
        disks.insert(if physical { "sdb" } else { "vdb" }.to_string(), disk_facts(physical, 4 * disk_size, rng));
    }
    let disk_names: Vec<String> = disks.keys().cloned().collect();
    let blockdevices: Vec<(String, Value)> = disks
        .iter()
        .flat_map(|(name, disk)| {
            ["size_bytes", "vendor", "model"].into_iter().filter_map(move |key| {
                let legacy = if key == "size_bytes" { "size" } else { key };
                disk.get(key).map(|v| (format!("blockdevice_{name}_{legacy}"), v.clone()))
            })
        })
        .collect();
    set("disks", Value::Object(disks));
    let mut mountpoints = Facts::new();
    mountpoints.insert("/".into(), mountpoint(&format!("/dev/{disk}1"), root_size, root_used, "errors=remount-ro"));
    mountpoints.insert("/boot".into(), mountpoint(&format!("/dev/{disk}2"), boot_size, boot_used, "nodev"));
    if role == "db" {
        let size = 4 * disk_size;
        let device = format!("/dev/{}1", if physical { "sdb" } else { "vdb" });
        mountpoints.insert("/var/lib/postgresql".into(), mountpoint(&device, size, size / 100 * 55, "noatime"));
    }
    set("mountpoints", Value::Object(mountpoints));
    let mut partitions = Facts::new();
    for (number, mount, size) in [(1, "/", root_size), (2, "/boot", boot_size)] {
        partitions.insert(
            format!("/dev/{disk}{number}"),
            json!({
                "filesystem": "ext4", "mount": mount, "partuuid": format!("{}-0{number}", rng.hex(8)),
                "size": human(size), "size_bytes": size, "uuid": format!("{}-{}-{}-{}-{}", rng.hex(8), rng.hex(4), rng.hex(4), rng.hex(4), rng.hex(12)),
            }),
        );
    }
    set("partitions", Value::Object(partitions));
    let dmi = if physical {
        json!({
            "bios": {"release_date": "02/13/2024", "vendor": "Dell Inc.", "version": "1.13.2"},
            "board": {"manufacturer": "Dell Inc.", "product": "0JMK61", "serial_number": format!(".{serial}.CNFCP0043A00R8.")},
            "chassis": {"asset_tag": "", "type": "Rack Mount Chassis"},
            "manufacturer": "Dell Inc.",
            "product": {"name": "PowerEdge R650", "serial_number": serial, "uuid": uuid},
        })
    } else {
        json!({
            "bios": {"release_date": "04/01/2014", "vendor": "SeaBIOS", "version": "1.16.2-debian-1.16.2-1"},
            "chassis": {"type": "Other"},
            "manufacturer": "QEMU",
            "product": {"name": "Standard PC (Q35 + ICH9, 2009)", "uuid": uuid},
        })
    };
    set("dmi", dmi.clone());
    set(
        "system_uptime",
        json!({"days": uptime_days, "hours": uptime_hours, "seconds": uptime_seconds, "uptime": uptime}),
    );
    set("load_averages", load_averages);
    set("identity", json!({"gid": 0, "group": "root", "privileged": true, "uid": 0, "user": "root"}));
    let ruby = json!({"platform": "x86_64-linux", "sitedir": "/opt/puppetlabs/puppet/lib/ruby/site_ruby/3.2.0", "version": "3.2.5"});
    set("ruby", ruby.clone());
    set(
        "ssh",
        json!({
            "ecdsa": {"fingerprints": ecdsa_fp, "key": ecdsa_key, "type": "ecdsa-sha2-nistp256"},
            "ed25519": {"fingerprints": ed25519_fp, "key": ed25519_key, "type": "ssh-ed25519"},
            "rsa": {"fingerprints": rsa_fp, "key": rsa_key, "type": "ssh-rsa"},
        }),
    );
    set("kernel", json!("Linux"));
    set("kernelmajversion", json!(kernel_major));
    set("kernelrelease", json!(os.kernelrelease));
    set("kernelversion", json!(kernel_version));
    set("facterversion", json!("4.10.0"));
    set("puppetversion", json!("8.10.0"));
    set("aio_agent_version", json!("8.10.0"));
    set("timezone", json!("UTC"));
    set("is_virtual", json!(!physical));
    set("virtual", json!(if physical { "physical" } else { "kvm" }));
    if !physical {
        set("hypervisors", json!({"kvm": {}}));
    }
    set("fips_enabled", json!(false));
    set("filesystems", json!("ext2,ext3,ext4,vfat"));
    set("augeas", json!({"version": "1.14.1"}));
    set("path", json!("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/puppetlabs/bin"));

    // Legacy flat facts, which puppetserver still caches next to the structured ones.
    for (name, value) in [
        ("architecture", json!(architecture)),
        ("hardwareisa", json!("x86_64")),
        ("hardwaremodel", json!("x86_64")),
        ("operatingsystem", json!(os.name)),
        ("operatingsystemrelease", json!(os.full)),
        ("operatingsystemmajrelease", json!(os.major)),
        ("osfamily", json!(os.family)),
        ("lsbdistcodename", json!(os.codename)),
        ("lsbdistdescription", json!(os.description)),
        ("lsbdistid", json!(os.name)),
        ("lsbdistrelease", json!(os.full)),
        ("lsbmajdistrelease", json!(os.major)),
        ("fqdn", json!(fqdn)),
        ("hostname", json!(hostname)),
        ("domain", json!(domain)),
        ("ipaddress", json!(ip)),
        ("ipaddress6", json!(ip6)),
        ("macaddress", json!(mac)),
        ("netmask", json!(netmask)),
        ("netmask6", json!("ffff:ffff:ffff:ffff::")),
        ("network", json!(network)),
        ("network6", json!("fe80::")),
        ("interfaces", json!("eth0,lo")),
        ("ipaddress_eth0", json!(ip)),
        ("ipaddress6_eth0", json!(ip6)),
        ("macaddress_eth0", json!(mac)),
        ("mtu_eth0", json!(1500)),
        ("netmask_eth0", json!(netmask)),
        ("netmask6_eth0", json!("ffff:ffff:ffff:ffff::")),
        ("network_eth0", json!(network)),
        ("network6_eth0", json!("fe80::")),
        ("scope6_eth0", json!("link")),
        ("ipaddress_lo", json!("127.0.0.1")),
        ("ipaddress6_lo", json!("::1")),
        ("mtu_lo", json!(65536)),
        ("netmask_lo", json!("255.0.0.0")),
        ("netmask6_lo", json!("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")),
        ("network_lo", json!("127.0.0.0")),
        ("network6_lo", json!("::1")),
        ("scope6_lo", json!("host")),
        ("processorcount", json!(cpus)),
        ("physicalprocessorcount", json!(if physical { 2 } else { 1 })),
        ("memorysize", json!(human(memory_total))),
        ("memorysize_mb", json!(mb(memory_total))),
        ("memoryfree", json!(human(memory_total - memory_used))),
        ("memoryfree_mb", json!(mb(memory_total - memory_used))),
        ("swapsize", json!(human(swap_total))),
        ("swapsize_mb", json!(mb(swap_total))),
        ("swapfree", json!(human(swap_total - swap_used))),
        ("swapfree_mb", json!(mb(swap_total - swap_used))),
        ("blockdevices", json!(disk_names.join(","))),
        ("uptime", json!(uptime)),
        ("uptime_days", json!(uptime_days)),
        ("uptime_hours", json!(uptime_hours)),
        ("uptime_seconds", json!(uptime_seconds)),
        ("uniqueid", json!(rng.hex(8))),
        ("manufacturer", dmi["manufacturer"].clone()),
        ("productname", dmi["product"]["name"].clone()),
        ("uuid", json!(uuid)),
        ("bios_vendor", dmi["bios"]["vendor"].clone()),
        ("bios_version", dmi["bios"]["version"].clone()),
        ("bios_release_date", dmi["bios"]["release_date"].clone()),
        ("chassistype", dmi["chassis"]["type"].clone()),
        ("sshrsakey", json!(rsa_key)),
        ("sshecdsakey", json!(ecdsa_key)),
        ("sshed25519key", json!(ed25519_key)),
        ("sshfp_rsa", json!(sshfp(&rsa_fp))),
        ("sshfp_ecdsa", json!(sshfp(&ecdsa_fp))),
        ("sshfp_ed25519", json!(sshfp(&ed25519_fp))),
        ("id", json!("root")),
        ("gid", json!("root")),
        ("rubyversion", ruby["version"].clone()),
        ("rubyplatform", ruby["platform"].clone()),
        ("rubysitedir", ruby["sitedir"].clone()),
        ("selinux", json!(selinux)),
        ("augeasversion", json!("1.14.1")),
    ] {
        set(name, value);
    }
    if physical {
        set("serialnumber", json!(serial));
        set("boardmanufacturer", json!("Dell Inc."));
        set("boardproductname", json!("0JMK61"));
        set("boardserialnumber", dmi["board"]["serial_number"].clone());
    }
    f.extend(blockdevices);
    for cpu in 0..cpus {
        f.insert(format!("processor{cpu}"), json!(cpu_model));
    }
    module_facts(&mut f, role, redhat, &network, rng);
    (fqdn, f)
}

/// Facts from the modules a fleet usually installs (stdlib, apt, systemd) and from
/// role-specific custom facts.
fn module_facts(f: &mut Facts, role: &str, redhat: bool, network: &str, rng: &mut Rng) {
    let mut set = |name: &str, value: Value| {
        f.insert(name.to_string(), value);
    };
    set("root_home", json!("/root"));
    set("service_provider", json!("systemd"));
    set("package_provider", json!(if redhat { "dnf" } else { "apt" }));
    set("puppet_vardir", json!("/opt/puppetlabs/puppet/cache"));
    set("puppet_environmentpath", json!("/etc/puppetlabs/code/environments"));
    set("puppet_server", json!("puppet.example.com"));
    set("is_pe", json!(false));
    set("iptables_version", json!("1.8.9"));
    set("ip6tables_version", json!("1.8.9"));
    set("systemd", json!(true));
    set("systemd_version", json!(if redhat { "252" } else { "252.30" }));
    set(
        "systemd_internal_services",
        json!({
            "systemd-journald.service": "static", "systemd-logind.service": "static",
            "systemd-networkd.service": "disabled", "systemd-resolved.service": "disabled",
            "systemd-timesyncd.service": "enabled",
        }),
    );
    set("dhcp_servers", json!({"eth0": network.replace(".0.0", ".0.1"), "system": network.replace(".0.0", ".0.1")}));
    if !redhat {
        let updates: Vec<&str> = ["openssl", "libssl3", "curl", "libcurl4", "tzdata", "linux-image-amd64", "sudo"]
            .into_iter()
            .filter(|_| rng.chance(0.3))
            .collect();
        let security = updates.iter().filter(|p| p.contains("ssl") || **p == "sudo").count();
        set("apt_has_updates", json!(!updates.is_empty()));
        set("apt_has_dist_updates", json!(!updates.is_empty()));
        set("apt_updates", json!(updates.len()));
        set("apt_dist_updates", json!(updates.len()));
        set("apt_security_updates", json!(security));
        set("apt_security_dist_updates", json!(security));
        set("apt_package_updates", json!(updates));
        set("apt_package_dist_updates", json!(updates));
        set("apt_update_last_success", json!(1_795_000_000 + rng.below(170_000)));
        set("apt_reboot_required", json!(rng.chance(0.05)));
    }
    match role {
        "db" => set("postgres_version", json!("15.8")),
        "haproxy" => set("haproxy_version", json!("2.6.12")),
        "cache" => set("redis_version", json!("7.0.15")),
        "mq" => set("rabbitmq_version", json!("3.12.1")),
        "web" | "node" => set("nginx_version", json!("1.22.1")),
        _ => {}
    }
}

fn disk_facts(physical: bool, size: u64, rng: &mut Rng) -> Value {
    if physical {
        json!({"model": "SAMSUNG MZ7L3960", "serial": format!("S6KN{}", rng.hex(10).to_uppercase()), "size": human(size), "size_bytes": size, "type": "ssd", "vendor": "ATA"})
    } else {
        json!({"size": human(size), "size_bytes": size, "type": "hdd", "vendor": "0x1af4"})
    }
}

fn mountpoint(device: &str, size: u64, used: u64, option: &str) -> Value {
    json!({
        "available": human(size - used), "available_bytes": size - used,
        "capacity": format!("{:.2}%", used as f64 * 100.0 / size as f64),
        "device": device, "filesystem": "ext4", "options": ["rw", "relatime", option],
        "size": human(size), "size_bytes": size, "used": human(used), "used_bytes": used,
    })
}

fn sizes(total: u64, used: u64) -> Value {
    json!({
        "available": human(total - used), "available_bytes": total - used,
        "capacity": format!("{:.2}%", used as f64 * 100.0 / total as f64),
        "total": human(total), "total_bytes": total, "used": human(used), "used_bytes": used,
    })
}

fn mb(bytes: u64) -> f64 {
    (bytes as f64 / (1 << 20) as f64 * 100.0).round() / 100.0
}

/// Facter's human-readable size: `15.62 GiB`.
fn human(bytes: u64) -> String {
    const UNITS: &[&str] = &["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// One file of puppetserver's JSON fact cache (`Puppet::Node::Facts#to_data_hash`).
#[derive(Serialize)]
struct CacheFile<'a> {
    name: &'a str,
    values: &'a Facts,
    timestamp: String,
    expiration: String,
}

/// Writes `nodes` as puppetserver's JSON fact cache (`$server_datadir/facts`): one
/// `<certname>.json` per server, `{"name", "values", "timestamp", "expiration"}`.
/// Returns the bytes written.
pub fn write_puppet_cache(dir: &Path, nodes: &[Node]) -> std::io::Result<u64> {
    fs::create_dir_all(dir)?;
    let mut written = 0;
    for node in nodes {
        // Sub-second digits as Puppet writes them, derived from the data so that
        // the same fleet always gives the same bytes.
        let nanos = (node.timestamp as u64).wrapping_mul(0x9E37_79B9) % 1_000_000_000;
        let file = CacheFile {
            name: &node.certname,
            values: &node.facts,
            timestamp: rfc3339(node.timestamp, nanos as u32),
            expiration: rfc3339(node.timestamp + 1800, nanos as u32),
        };
        let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        let mut out = BufWriter::new(fs::File::create(dir.join(format!("{}.json", node.certname)))?);
        out.write_all(&bytes)?;
        out.flush()?;
        written += bytes.len() as u64;
    }
    Ok(written)
}

/// `node` as an older master's YAML fact file (`$vardir/yaml/facts`): block style
/// under Puppet's Ruby tag, as Psych wrote it.
pub fn yaml_fact_file(node: &Node) -> String {
    use yaml_rust2::yaml::Hash;
    use yaml_rust2::{Yaml, YamlEmitter};
    fn yaml(value: &Value) -> Yaml {
        match value {
            Value::Null => Yaml::Null,
            Value::Bool(b) => Yaml::Boolean(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Yaml::Integer(i),
                None => Yaml::Real(n.to_string()),
            },
            Value::String(s) => Yaml::String(s.clone()),
            Value::Array(items) => Yaml::Array(items.iter().map(yaml).collect()),
            Value::Object(map) => Yaml::Hash(map.iter().map(|(k, v)| (Yaml::String(k.clone()), yaml(v))).collect()),
        }
    }
    let mut top = Hash::new();
    top.insert(Yaml::String("name".into()), Yaml::String(node.certname.clone()));
    let values = node.facts.iter().map(|(k, v)| (Yaml::String(k.clone()), yaml(v))).collect();
    top.insert(Yaml::String("values".into()), Yaml::Hash(values));
    top.insert(Yaml::String("timestamp".into()), Yaml::String(rfc3339(node.timestamp, 0)));
    let mut text = String::new();
    YamlEmitter::new(&mut text).dump(&Yaml::Hash(top)).expect("emitting YAML into a String");
    text.replacen("---", "--- !ruby/object:Puppet::Node::Facts", 1)
}

/// `2026-11-20T10:15:30.123456789+00:00`, as puppetserver writes fact timestamps.
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let t = CalendarTime::utc(secs);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{nanos:09}+00:00", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::FactPath;
    use crate::time::parse_timestamp;

    const NOW: i64 = 1_795_169_730;

    #[test]
    fn the_same_seed_gives_the_same_fleet_and_prefixes_agree() {
        assert_eq!(fleet(50, 7, NOW), fleet(50, 7, NOW));
        assert_eq!(fleet(20, 7, NOW)[..], fleet(50, 7, NOW)[..20]);
        assert_ne!(fleet(20, 7, NOW), fleet(20, 8, NOW));
    }

    #[test]
    fn servers_look_like_facter_4_output() {
        let nodes = fleet(1000, 1, NOW);
        let average = nodes.iter().map(|n| n.facts.len()).sum::<usize>() / nodes.len();
        assert!((130..=170).contains(&average), "{average} top-level facts on average");
        let mut names: Vec<&str> = nodes.iter().map(|n| n.certname.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), nodes.len(), "certnames are unique");
        for path in
            ["os.release.full", "networking.interfaces.eth0.ip", "processors.count", "memory.system.total_bytes"]
        {
            assert!(nodes.iter().all(|n| n.fact(&FactPath::new(path)).is_some()), "{path}");
        }
        let share = |role: &str| nodes.iter().filter(|n| n.facts["role"] == role).count();
        assert!(share("node") > 450 && share("node") < 650, "{}", share("node"));
        assert!(share("haproxy") > 5 && share("haproxy") < 70, "{}", share("haproxy"));
        let production = nodes.iter().filter(|n| n.environment == "production").count();
        assert!((600..800).contains(&production), "{production}");
        let stale = nodes.iter().filter(|n| NOW - n.timestamp > 7 * 86_400).count();
        assert!((3..40).contains(&stale), "{stale}");
    }

    #[test]
    fn timestamps_are_written_the_way_puppet_reads_them() {
        for secs in [0, 951_782_400, NOW, 4_102_444_799] {
            assert_eq!(parse_timestamp(&rfc3339(secs, 123_456_789)), Some(secs));
        }
        assert_eq!(rfc3339(NOW, 5), "2026-11-20T10:15:30.000000005+00:00");
    }

    #[test]
    fn a_written_cache_loads_back_unchanged() {
        let dir = std::env::temp_dir().join(format!("pk-synthetic-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let nodes = fleet(25, 3, NOW);
        assert!(write_puppet_cache(&dir, &nodes).unwrap() > 25 * 5000);
        let read = crate::source::puppet_cache::load(std::slice::from_ref(&dir)).unwrap();
        assert!(read.warnings.is_empty(), "{:?}", read.warnings);
        let mut loaded: Vec<Node> = read.observations.iter().map(|o| read.node(o, None)).collect();
        let mut expected = nodes;
        loaded.sort_by(|a, b| a.certname.cmp(&b.certname));
        expected.sort_by(|a, b| a.certname.cmp(&b.certname));
        assert_eq!(loaded, expected);
        fs::remove_dir_all(&dir).unwrap();
    }
}
