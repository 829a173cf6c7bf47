//! `cargo bench --bench regex_cost`: what compiling a clause's regex takes, next to
//! what `query::regex_cost` charges for it before compiling (src/query/cost.rs). A
//! charge is meant to be an upper bound, one unit a microsecond on the machine the
//! charges were set on; a row whose measured time is above its charge says so
//! (`UNDER`), which on a slower machine is expected in proportion.
//!
//! Each case compiles 50 distinct patterns (a number in each, so no cache helps) as
//! `Clause::parse` does (`RegexBuilder` with the same size limit) and reports the mean.
//! Markdown on stdout.

// The module itself, compiled into the bench: the core keeps it private.
#[allow(dead_code)]
#[path = "../src/query/cost.rs"]
mod cost;

use cost::regex_cost;
use std::time::Instant;

/// As `src/query/clause.rs` builds every clause's regex.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

const SAMPLES: usize = 50;

fn case(name: &str, pattern: impl Fn(usize) -> String) {
    let mut charged = 0;
    let start = Instant::now();
    for i in 0..SAMPLES {
        let pattern = pattern(i);
        charged = regex_cost(&pattern).expect("a valid pattern");
        let _ = regex::RegexBuilder::new(&pattern).size_limit(REGEX_SIZE_LIMIT).build();
    }
    let micros = start.elapsed().as_secs_f64() * 1e6 / SAMPLES as f64;
    let verdict = if (charged as f64) < micros { "UNDER" } else { "" };
    println!("| `{name}` | {micros:.1} µs | {charged} | {verdict} |");
}

fn main() {
    println!("| Pattern (N: a number per sample) | Compiled in (mean of {SAMPLES}) | Charged units | |");
    println!("| --- | --- | --- | --- |");
    case("(?i)^webN$", |i| format!("(?i)^web{i}$"));
    case("^webN\\w+$", |i| format!("^web{i}\\w+$"));
    case("(?i)^webN\\p{L}$", |i| format!("(?i)^web{i}\\p{{L}}$"));
    case("(?i)^webN[^a]$", |i| format!("(?i)^web{i}[^a]$"));
    case("(?i)webN[a-z0-9]", |i| format!("(?i)web{i}[a-z0-9]"));
    case("(?i)webN[a[^b]]", |i| format!("(?i)web{i}[a[^b]]"));
    case("(?i)webN[a[^b]] x8", |i| format!("(?i)web{i}{}", "[a[^b]]".repeat(8)));
    case("(?i)webN[\\w]", |i| format!("(?i)web{i}[\\w]"));
    case("(?i)webN[\\x00-\\x{10FFFF}]", |i| format!("(?i)web{i}[\\x00-\\x{{10FFFF}}]"));
    case("(?i)webN[\\x00-\\x{FFFF}] x4", |i| format!("(?i)web{i}{}", "[\\x00-\\x{FFFF}]".repeat(4)));
    case("(?i)webN[^\\x00-\\x{FF}]", |i| format!("(?i)web{i}[^\\x00-\\x{{FF}}]"));
    case("webN\\w x50", |i| format!("web{i}{}", "\\w".repeat(50)));
    case("(?i)webN\\p{L} x40", |i| format!("(?i)web{i}{}", "\\p{L}".repeat(40)));
    case("(?i)webN[^[:alpha:]] x40", |i| format!("(?i)web{i}{}", "[^[:alpha:]]".repeat(40)));
    case("webN. x200", |i| format!("web{i}{}", ".".repeat(200)));
    case("(?i)webNa{0,200}", |i| format!("(?i)web{i}a{{0,200}}"));
    case("(?i)webN[^a]{0,100}", |i| format!("(?i)web{i}[^a]{{0,100}}"));
    case("(?i)webN[a-z&&[^aeiou]]", |i| format!("(?i)web{i}[a-z&&[^aeiou]]"));
    case("(?i)webN(?:.{0,30}){0,30}", |i| format!("(?i)web{i}(?:.{{0,30}}){{0,30}}"));
    case("webN\\w{1,64}", |i| format!("web{i}\\w{{1,64}}"));
    case("(?i)webN\\w{1,64}", |i| format!("(?i)web{i}\\w{{1,64}}"));
    case("webN\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}", |i| {
        format!("web{i}\\d{{1,3}}\\.\\d{{1,3}}\\.\\d{{1,3}}\\.\\d{{1,3}}")
    });
}
