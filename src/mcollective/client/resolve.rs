//! A broker's name to its addresses within the connect timeout. std's resolver
//! cannot be cancelled, so a name is looked up on a thread of its own, left to
//! finish alone when the resolver hangs; a bounded number of them at a time.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// DNS lookups left running on helper threads (std's resolver cannot be
/// cancelled); past this many, a broker name fails at once instead of piling
/// up threads behind a dead resolver.
const MAX_PENDING_LOOKUPS: usize = 8;
static PENDING_LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// The addresses of `host`, waiting for DNS no later than `deadline`. A
/// literal IP needs no lookup; a name is looked up on a helper thread, which
/// is left to finish on its own if the resolver hangs.
pub(super) fn resolve_before<L>(host: &str, port: u16, deadline: Instant, lookup: L) -> io::Result<Vec<SocketAddr>>
where
    L: FnOnce(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + 'static,
{
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if PENDING_LOOKUPS.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_LOOKUPS {
        PENDING_LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{MAX_PENDING_LOOKUPS} earlier DNS lookups are still hanging"),
        ));
    }
    let (tx, rx) = mpsc::channel();
    let name = host.to_string();
    let spawned = std::thread::Builder::new().name("puppet-kicker-dns".into()).spawn(move || {
        let result = lookup(&name, port);
        PENDING_LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        let _ = tx.send(result);
    });
    if let Err(e) = spawned {
        PENDING_LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left) {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no DNS answer within the connect timeout")),
    }
}

pub(super) fn system_lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcollective::client::deadline_after;
    use std::time::Duration;

    #[test]
    fn literal_ips_skip_dns_and_a_hanging_lookup_stops_at_the_deadline() {
        let never = |_: &str, _: u16| -> io::Result<Vec<SocketAddr>> { panic!("looked up a literal IP") };
        let soon = deadline_after(Duration::from_millis(50));
        assert_eq!(resolve_before("127.0.0.1", 61613, soon, never).unwrap(), ["127.0.0.1:61613".parse().unwrap()]);
        assert_eq!(resolve_before("::1", 1, soon, never).unwrap(), ["[::1]:1".parse().unwrap()]);

        let hang = |_: &str, _: u16| -> io::Result<Vec<SocketAddr>> {
            std::thread::sleep(Duration::from_secs(3));
            Ok(Vec::new())
        };
        let start = Instant::now();
        let err =
            resolve_before("mq.example.com", 61613, deadline_after(Duration::from_millis(200)), hang).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("no DNS answer within the connect timeout"), "{err}");

        let found = |_: &str, p: u16| -> io::Result<Vec<SocketAddr>> { Ok(vec![SocketAddr::from(([10, 0, 0, 1], p))]) };
        let soon = deadline_after(Duration::from_secs(2));
        assert_eq!(resolve_before("mq.example.com", 7, soon, found).unwrap(), ["10.0.0.1:7".parse().unwrap()]);
    }
}
