//! Timestamps as Puppet writes them in its fact caches, to Unix seconds.
//!
//! JSON cache: `2026-11-20T10:15:30.123456789+00:00`; YAML cache (Ruby `Time`):
//! `2026-11-20 10:15:30.123456789 +00:00`. Small enough not to need a date crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// The core's one clock: milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// [`now_ms`] in whole seconds.
pub fn now() -> i64 {
    now_ms() / 1000
}

/// Parses `YYYY-MM-DD[T ]HH:MM:SS[.frac][ ](Z|±HH:MM|±HHMM)`; no offset means UTC.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let s = text.trim();
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if s.get(4..5)? != "-" || s.get(7..8)? != "-" || !matches!(s.get(10..11)?, "T" | " " | "t") {
        return None;
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if s.get(13..14)? != ":" || s.get(16..17)? != ":" {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        rest = frac.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = parse_offset(rest.trim())?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

fn parse_offset(s: &str) -> Option<i64> {
    if s.is_empty() || s == "Z" || s == "UTC" {
        return Some(0);
    }
    let sign = match s.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits: String = s[1..].chars().filter(|c| *c != ':').collect();
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let hours: i64 = digits[..2].parse().ok()?;
    let minutes: i64 = digits[2..].parse().ok()?;
    Some(sign * (hours * 3600 + minutes * 60))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The UTC calendar date and time of day of a Unix time, to write timestamps with
/// (the helper's log lines, the synthetic fleet's fact caches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CalendarTime {
    pub year: i64,
    pub month: i64,
    pub day: i64,
    pub hour: i64,
    pub minute: i64,
    pub second: i64,
}

impl CalendarTime {
    pub fn utc(unix_seconds: i64) -> CalendarTime {
        let (days, rest) = (unix_seconds.div_euclid(86_400), unix_seconds.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        CalendarTime { year, month, day, hour: rest / 3600, minute: rest / 60 % 60, second: rest % 60 }
    }
}

/// The proleptic Gregorian date of a day number since 1970-01-01 (Howard Hinnant's
/// algorithm, the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Parses a duration: whole seconds, or a number with `s`, `m`, `h`, `d` or `w`.
pub fn parse_duration(text: &str) -> Option<u64> {
    let s = text.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_cache_formats_parse_to_the_same_instant() {
        let json = parse_timestamp("2026-11-20T10:15:30.123456789+00:00");
        let yaml = parse_timestamp("2026-11-20 10:15:30.123456789 +00:00");
        assert_eq!(json, Some(1_795_169_730));
        assert_eq!(json, yaml);
        assert_eq!(parse_timestamp("2026-11-20T12:15:30+02:00"), json);
        assert_eq!(parse_timestamp("2026-11-20 05:15:30 -0500"), json);
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_timestamp("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn calendar_time_is_the_inverse_of_parsing() {
        let at = CalendarTime::utc(1_795_169_730);
        assert_eq!(at, CalendarTime { year: 2026, month: 11, day: 20, hour: 10, minute: 15, second: 30 });
        assert_eq!(CalendarTime::utc(951_782_400).day, 29); // 2000 is a leap year
        assert_eq!(
            CalendarTime::utc(-1),
            CalendarTime { year: 1969, month: 12, day: 31, hour: 23, minute: 59, second: 59 }
        );
        for days in (-800_000..800_000).step_by(997) {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days, "{year}-{month}-{day}");
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("90"), Some(90));
        assert_eq!(parse_duration("7d"), Some(604_800));
        assert_eq!(parse_duration("2h"), Some(7200));
        assert_eq!(parse_duration("10 m"), Some(600));
        assert_eq!(parse_duration("1y"), None);
        assert_eq!(parse_duration("-5"), None);
    }
}
