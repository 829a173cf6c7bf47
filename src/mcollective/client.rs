//! Blocking mcollective client: discovery and RPC over one STOMP connection
//! per call, like `mco` does.
//!
//! Runs on plain threads (no async runtime) inside the Puppet master; a
//! [`Client`] is `Send + Sync` and can be shared. Every reply is verified
//! (PSK hash, our request id, expected sender) before it is returned; what is
//! dropped is counted in [`ClientStats`] so operators can see tampering or
//! crossed wires.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::config::{BrokerHost, Config, ReplyLimits};
use super::connector::{Connector, RequestRoute};
use super::error::{Error, Result};
use super::marshal::{DecodeLimits, Value};
use super::message::{self, Filter, Reply, Request, RpcStatus};
use super::stomp::{negotiated_version, Frame, FrameReader, FrameWriter, Version};
use super::tls::BrokerStream;

/// UNSUBSCRIBE and DISCONNECT get this long (at most the connect timeout):
/// a broker that stops reading cannot hold a finished call.
const GOODBYE_TIME: Duration = Duration::from_secs(1);
/// DNS lookups left running on helper threads (std's resolver cannot be
/// cancelled); past this many, a broker name fails at once instead of piling
/// up threads behind a dead resolver.
const MAX_PENDING_LOOKUPS: usize = 8;
static PENDING_LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// Counters of what the client received, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Replies verified and returned.
    pub accepted: u64,
    /// Dropped: `:hash` did not match the PSK.
    pub bad_hash: u64,
    /// Dropped: the reply was for another request id.
    pub foreign_requestid: u64,
    /// Dropped: undecodable Marshal, missing keys, wrong agent, not "pong".
    pub malformed: u64,
    /// Dropped: a second reply from the same sender.
    pub duplicate: u64,
    /// Dropped: a directed request answered by a node it was not sent to.
    pub unexpected_sender: u64,
    /// Frames other than MESSAGE (e.g. RECEIPT) ignored while collecting.
    pub other_frames: u64,
    /// Dropped: `:msgtime` (unsigned) more than the ttl before the request or
    /// after its reception: a replay, or a clock far off.
    pub bad_msgtime: u64,
    /// Dropped: over the call's [`ReplyLimits`] (count or bytes).
    pub over_limit: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    bad_hash: AtomicU64,
    foreign_requestid: AtomicU64,
    malformed: AtomicU64,
    duplicate: AtomicU64,
    unexpected_sender: AtomicU64,
    other_frames: AtomicU64,
    bad_msgtime: AtomicU64,
    over_limit: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One node's answer to an RPC request.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcReply {
    /// The node's identity.
    pub sender: String,
    pub agent: String,
    /// The node's clock at reply time (epoch seconds).
    pub msgtime: i64,
    /// 0 OK, 1 aborted, 2 unknown action, 3 missing data, 4 invalid data, 5 error.
    pub statuscode: i64,
    pub statusmsg: String,
    /// The agent's outputs (Hash with symbol keys).
    pub data: Value,
}

impl RpcReply {
    /// The RPC reply inside a verified `reply`: its inner body read as
    /// `{:statuscode, :statusmsg, :data}`.
    pub fn from_reply(reply: Reply, limits: DecodeLimits) -> Result<RpcReply> {
        let status = RpcStatus::from_value(&reply.inner(limits)?)?;
        Ok(RpcReply {
            sender: reply.senderid,
            agent: reply.senderagent,
            msgtime: reply.msgtime,
            statuscode: status.statuscode,
            statusmsg: status.statusmsg,
            data: status.data,
        })
    }
}

/// The verified replies of an RPC call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RpcOutcome {
    /// Sorted by sender.
    pub replies: Vec<RpcReply>,
    /// Directed calls: nodes that did not answer in time (sorted).
    pub missing: Vec<String>,
    /// Senders whose exact signed body also came from another sender in this
    /// call (sorted). The psk signs only the body, so it cannot tell which of
    /// them sent it: callers whose replies must differ per server (inventory)
    /// drop these; replies alike by nature (runonce) keep them.
    pub ambiguous: Vec<String>,
}

/// The verified replies of an RPC call, inner bodies not decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawOutcome {
    /// Sorted by sender.
    pub replies: Vec<Reply>,
    /// As [`RpcOutcome::ambiguous`].
    pub ambiguous: Vec<String>,
}

/// Verified replies of one call, by sender.
struct Collected {
    replies: BTreeMap<String, Reply>,
    /// Senders whose body another sender sent too.
    ambiguous: BTreeSet<String>,
}

impl From<Collected> for RawOutcome {
    fn from(collected: Collected) -> RawOutcome {
        RawOutcome {
            replies: collected.replies.into_values().collect(),
            ambiguous: collected.ambiguous.into_iter().collect(),
        }
    }
}

/// Replies in hand are checked in batches of up to this many (a burst of
/// replies fills them; a trickle is checked one by one, as it arrives).
pub const VERIFY_BATCH: usize = 64;

/// What a collect kept so far.
#[derive(Default)]
struct AcceptedReplies {
    replies: BTreeMap<String, Reply>,
    ambiguous: BTreeSet<String>,
    /// The senders of each body signature; bodies are compared in full when
    /// signatures agree, so a crafted MD5 collision makes nobody ambiguous.
    by_signature: HashMap<u128, Vec<String>>,
    bytes: usize,
}

impl AcceptedReplies {
    /// Keeps `reply` when it passes every check (each refusal counted); true once
    /// `expect.count` senders are kept.
    fn accept(
        &mut self,
        reply: Result<Reply>,
        size: usize,
        expect: &Expect<'_>,
        counters: &Counters,
        limits: ReplyLimits,
    ) -> bool {
        let reply = match reply {
            Ok(r) => r,
            Err(Error::Signature(_)) => {
                bump(&counters.bad_hash);
                return false;
            }
            Err(_) => {
                bump(&counters.malformed);
                return false;
            }
        };
        if reply.requestid != expect.requestid {
            bump(&counters.foreign_requestid);
            return false;
        }
        if reply.senderagent != expect.agent {
            bump(&counters.malformed);
            return false;
        }
        let oldest = expect.sent.saturating_sub(expect.ttl);
        let newest = crate::time::now().max(expect.sent).saturating_add(expect.ttl);
        if !(oldest..=newest).contains(&reply.msgtime) {
            bump(&counters.bad_msgtime);
            return false;
        }
        if expect.only.is_some_and(|only| !only.contains(&reply.senderid)) {
            bump(&counters.unexpected_sender);
            return false;
        }
        if self.replies.contains_key(&reply.senderid) {
            bump(&counters.duplicate);
            return false;
        }
        if self.replies.len() >= limits.max_replies || self.bytes.saturating_add(size) > limits.max_bytes {
            bump(&counters.over_limit);
            return false;
        }
        self.bytes += size;
        self.note_body(&reply);
        self.replies.insert(reply.senderid.clone(), reply);
        expect.count.is_some_and(|n| self.replies.len() >= n)
    }

    /// Marks `reply`'s sender, and the first to send the same body, ambiguous.
    fn note_body(&mut self, reply: &Reply) {
        // Every verified reply carries its signature; the full compare below
        // decides either way.
        let senders = self.by_signature.entry(reply.signature.unwrap_or_default()).or_default();
        let twin = senders.iter().find(|s| self.replies.get(*s).is_some_and(|r| r.body == reply.body));
        if let Some(first) = twin {
            self.ambiguous.insert(first.clone());
            self.ambiguous.insert(reply.senderid.clone());
        }
        senders.push(reply.senderid.clone());
    }

    /// Senders kept so far.
    fn len(&self) -> usize {
        self.replies.len()
    }

    fn collected(self) -> Collected {
        Collected { replies: self.replies, ambiguous: self.ambiguous }
    }
}

/// A blocking mcollective client.
pub struct Client {
    config: Config,
    connector: Connector,
    counters: Counters,
}

/// What the collector waits for.
struct Expect<'a> {
    requestid: &'a str,
    agent: &'a str,
    /// The request's `:msgtime` and ttl: a reply's `:msgtime` must lie within
    /// `sent - ttl ..= now + ttl` (clocks may differ by up to the ttl, as
    /// daemons allow for requests).
    sent: i64,
    ttl: i64,
    /// Stop once this many distinct senders answered.
    count: Option<usize>,
    /// Directed: only these senders are accepted.
    only: Option<&'a [String]>,
    deadline: Instant,
}

impl Client {
    pub fn new(config: Config) -> Client {
        Client { connector: Connector::new(&config), config, counters: Counters::default() }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Snapshot of the drop/accept counters.
    pub fn stats(&self) -> ClientStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            accepted: l(&c.accepted),
            bad_hash: l(&c.bad_hash),
            foreign_requestid: l(&c.foreign_requestid),
            malformed: l(&c.malformed),
            duplicate: l(&c.duplicate),
            unexpected_sender: l(&c.unexpected_sender),
            other_frames: l(&c.other_frames),
            bad_msgtime: l(&c.bad_msgtime),
            over_limit: l(&c.over_limit),
        }
    }

    /// Sends a discovery "ping" and returns the sorted identities that said
    /// "pong". Waits the whole `timeout`, as mco does, unless `expected`
    /// distinct nodes answered earlier.
    pub fn discover(
        &self,
        collective: &str,
        filter: &Filter,
        timeout: Duration,
        expected: Option<usize>,
    ) -> Result<Vec<String>> {
        self.check_collective(collective)?;
        let mut filter = filter.clone();
        // mco names the collective in a discovery filter, but daemons treat a filter
        // holding nothing else as non-empty and unmatched: nobody would answer.
        let unfiltered = filter.fact.is_empty()
            && filter.cf_class.is_empty()
            && filter.agent.is_empty()
            && filter.identity.is_empty()
            && filter.compound.is_empty();
        filter.collective = if unfiltered { None } else { Some(collective.to_string()) };
        let body = message::discovery_body()?;
        // Every "pong" is alike: `ambiguous` means nothing here.
        let replies = self.call(collective, "discovery", &filter, body, None, expected, timeout)?.replies;
        let mut nodes = Vec::new();
        for reply in replies.into_values() {
            match reply.inner(self.config.marshal_limits) {
                Ok(v) if message::is_pong(&v) => nodes.push(reply.senderid),
                _ => bump(&self.counters.malformed),
            }
        }
        self.account_accepted(nodes.len());
        Ok(nodes) // BTreeMap order: sorted
    }

    /// Broadcasts `agent#action` to every node matching `filter`; collects
    /// replies until `expected` nodes answered or `timeout` passed.
    #[allow(clippy::too_many_arguments)]
    pub fn rpc_broadcast(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        filter: &Filter,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<RpcOutcome> {
        let replies = self.broadcast(collective, agent, action, inputs, filter, expected, timeout)?;
        Ok(self.rpc_outcome(replies, None))
    }

    /// [`Client::rpc_broadcast`] with the replies' inner bodies left as their signed
    /// bytes, for a caller that reads them in place (`source::mcollective`). It
    /// reports what it made of them with [`Client::record_inner`].
    #[allow(clippy::too_many_arguments)]
    pub fn rpc_broadcast_raw(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        filter: &Filter,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<RawOutcome> {
        Ok(self.broadcast(collective, agent, action, inputs, filter, expected, timeout)?.into())
    }

    /// What both broadcasts do: the names checked, the request sent to every node
    /// matching `filter`, the replies collected.
    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        filter: &Filter,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<Collected> {
        self.check_collective(collective)?;
        check_name("agent", agent)?;
        check_name("action", action)?;
        let body = message::rpc_body(agent, action, &self.config.callerid, inputs, true)?;
        self.call(collective, agent, filter, body, None, expected, timeout)
    }

    /// Counts inner bodies of [`Client::rpc_broadcast_raw`] replies as accepted or
    /// malformed, as [`Client::rpc_broadcast`] counts those it decodes.
    pub fn record_inner(&self, accepted: usize, malformed: usize) {
        self.account_accepted(accepted);
        self.counters.malformed.fetch_add(u64::try_from(malformed).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Sends `agent#action` to each of `nodes` directly (no discovery);
    /// collects replies until all answered or `timeout` passed.
    pub fn rpc_directed(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        nodes: &[String],
        timeout: Duration,
    ) -> Result<RpcOutcome> {
        self.check_collective(collective)?;
        check_name("agent", agent)?;
        check_name("action", action)?;
        let mut nodes: Vec<String> = nodes.to_vec();
        nodes.sort();
        nodes.dedup();
        if nodes.is_empty() {
            return Ok(RpcOutcome::default());
        }
        for n in &nodes {
            check_identity(n)?;
        }
        // mco sends directed requests with an agent filter only.
        let filter = Filter { agent: vec![agent.to_string()], ..Filter::default() };
        let body = message::rpc_body(agent, action, &self.config.callerid, inputs, true)?;
        let replies = self.call(collective, agent, &filter, body, Some(&nodes), Some(nodes.len()), timeout)?;
        Ok(self.rpc_outcome(replies, Some(&nodes)))
    }

    fn rpc_outcome(&self, collected: Collected, nodes: Option<&[String]>) -> RpcOutcome {
        let mut out = RpcOutcome { ambiguous: collected.ambiguous.into_iter().collect(), ..RpcOutcome::default() };
        for reply in collected.replies.into_values() {
            match RpcReply::from_reply(reply, self.config.marshal_limits) {
                Ok(rpc) => out.replies.push(rpc),
                Err(_) => bump(&self.counters.malformed),
            }
        }
        self.account_accepted(out.replies.len());
        if let Some(nodes) = nodes {
            out.missing = nodes.iter().filter(|n| !out.replies.iter().any(|r| &r.sender == *n)).cloned().collect();
        }
        out
    }

    fn account_accepted(&self, n: usize) {
        self.counters.accepted.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn check_collective(&self, collective: &str) -> Result<()> {
        if self.config.collectives.iter().any(|c| c == collective) {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "unknown collective {collective:?} (configured: {})",
                self.config.collectives.join(",")
            )))
        }
    }

    /// One request: connect, (subscribe), send, collect, (unsubscribe), disconnect.
    /// Returns verified replies by sender.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        collective: &str,
        agent: &str,
        filter: &Filter,
        body: Vec<u8>,
        nodes: Option<&[String]>,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<Collected> {
        let now = crate::time::now();
        let request = Request {
            senderid: self.config.identity.clone(),
            requestid: message::new_request_id()?,
            filter: filter.clone(),
            collective: collective.to_string(),
            agent: agent.to_string(),
            callerid: self.config.callerid.clone(),
            ttl: i64::from(self.config.ttl),
            msgtime: now,
            body,
        };
        let payload = request.encode(&self.config.psk)?;

        let mut session = self.open()?;
        let reply_to = self.connector.reply_queue(collective, agent);
        // Subscribing and sending count against the call's timeout too.
        let deadline = deadline_after(timeout);
        let result = (|| {
            if let Some(f) = self.connector.subscribe(&reply_to, session.version) {
                session.send(&f, deadline)?;
            }
            let targets: Vec<Option<&str>> = match nodes {
                None => vec![None],
                Some(nodes) => nodes.iter().map(|n| Some(n.as_str())).collect(),
            };
            for node in targets {
                let route = RequestRoute {
                    collective,
                    agent,
                    node,
                    reply_to: &reply_to,
                    ttl: self.config.ttl,
                    now_secs: u64::try_from(now).unwrap_or(0),
                };
                session.send(&self.connector.request(&route, payload.clone()), deadline)?;
            }
            let expect = Expect {
                requestid: &request.requestid,
                agent,
                sent: now,
                ttl: request.ttl,
                count: expected,
                only: nodes,
                deadline,
            };
            self.collect(&mut session, &expect)
        })();
        let goodbye = deadline_after(GOODBYE_TIME.min(self.config.connect_timeout));
        if result.is_ok() {
            if let Some(f) = self.connector.unsubscribe(&reply_to, session.version) {
                // The replies are in hand; a failing goodbye does not undo them.
                let _ = session.send(&f, goodbye);
            }
        }
        session.close(&self.connector, goodbye);
        result
    }

    /// Replies until `expect` is met or its deadline passes. Frames that arrive
    /// together are held (up to [`VERIFY_BATCH`]) and checked as one batch, their
    /// PSK signatures several at a time; what is held is checked before waiting on
    /// the broker, so a reply is never held back by a quiet connection.
    ///
    /// From the second full batch on, batches are decoded and their signatures
    /// checked on a second thread ([`Verifier`]) while this one reads the next
    /// frames: a fleet's burst of replies costs the receiving thread the reading
    /// only. Replies are still kept one by one here, in arrival order, each batch
    /// the answer it gets alone; and no frame is read past a batch that may meet
    /// `expect.count` before that batch has been kept, as without the thread.
    fn collect(&self, session: &mut impl Frames, expect: &Expect<'_>) -> Result<Collected> {
        let mut kept = AcceptedReplies::default();
        if expect.count == Some(0) {
            return Ok(kept.collected());
        }
        std::thread::scope(|scope| {
            let mut verifier = Verifier::new(self, scope);
            let mut held: Vec<Vec<u8>> = Vec::with_capacity(VERIFY_BATCH);
            loop {
                // Batches under way that may meet the count are kept before any
                // further frame is read.
                if expect.count.is_some_and(|count| kept.len() + verifier.replies_in_flight() >= count)
                    && verifier.keep_all(&mut kept, expect)
                {
                    return Ok(kept.collected());
                }
                let frame = match session.frame_if_ready(expect.deadline)? {
                    Some(frame) => frame,
                    None => {
                        verifier.send(&mut held);
                        if verifier.keep_all(&mut kept, expect) {
                            return Ok(kept.collected());
                        }
                        match session.next_frame(expect.deadline)? {
                            Some(frame) => frame,
                            None => break,
                        }
                    }
                };
                match frame.command.as_str() {
                    "MESSAGE" => held.push(frame.body),
                    "ERROR" => {
                        // Replies that came before it may already meet the count, as
                        // when each was checked on arrival.
                        verifier.send(&mut held);
                        if verifier.keep_all(&mut kept, expect) {
                            return Ok(kept.collected());
                        }
                        return Err(Error::Broker { host: session.host().to_string(), message: error_text(&frame) });
                    }
                    _ => bump(&self.counters.other_frames),
                }
                if held.len() >= VERIFY_BATCH {
                    verifier.send(&mut held);
                    if verifier.keep_ready(&mut kept, expect) {
                        return Ok(kept.collected());
                    }
                }
            }
            verifier.send(&mut held);
            verifier.keep_all(&mut kept, expect);
            Ok(kept.collected())
        })
    }

    /// What [`Client::rpc_broadcast_raw`] keeps of the replies in `recorded` (STOMP
    /// frames as a broker delivered them) to request `requestid` for `agent`, sent
    /// at `sent`: the same collect loop, reading the recording in place of a
    /// broker; its end is the deadline. For benchmarks and recorded traffic.
    pub fn collect_recorded(
        &self,
        recorded: &[u8],
        requestid: &str,
        agent: &str,
        sent: i64,
        expected: Option<usize>,
    ) -> Result<RawOutcome> {
        let expect = Expect {
            requestid,
            agent,
            sent,
            ttl: i64::from(self.config.ttl),
            count: expected,
            only: None,
            deadline: deadline_after(Duration::from_secs(3600)),
        };
        let mut reader = FrameReader::new(recorded, self.config.stomp_limits);
        Ok(self.collect(&mut reader, &expect)?.into())
    }

    /// Connects to the first pool host that completes the STOMP handshake.
    fn open(&self) -> Result<Session> {
        let mut failures = Vec::new();
        for broker in &self.config.pool {
            match self.open_one(broker) {
                Ok(s) => return Ok(s),
                Err(e) => failures.push((broker.address(), e.to_string())),
            }
        }
        Err(Error::NoBroker(failures))
    }

    /// DNS, TCP connect and the STOMP handshake, all within `connect_timeout`.
    fn open_one(&self, broker: &BrokerHost) -> Result<Session> {
        let host = broker.address();
        let deadline = deadline_after(self.config.connect_timeout);
        let addrs = resolve_before(&broker.host, broker.port, deadline, system_lookup)
            .map_err(|e| Error::io(format!("resolving {host}"), e))?;
        let mut last = None;
        let mut stream = None;
        for addr in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(Error::io(format!("connecting to {addr}"), e)),
            }
        }
        let stream = match stream {
            Some(s) => s,
            None => return Err(last.unwrap_or_else(|| Error::InvalidInput(format!("{host} resolves to no address")))),
        };
        let io_err = |what: &str, e| Error::io(format!("{what} {host}"), e);
        stream.set_nodelay(true).map_err(|e| io_err("configuring", e))?;
        // The TLS handshake, when configured, is part of the connect timeout.
        let stream = BrokerStream::connect(stream, broker.tls.as_ref(), &broker.host, &host, deadline)?;
        let write_half = stream.try_clone().map_err(|e| io_err("configuring", e))?;
        let mut session = Session {
            reader: FrameReader::new(stream, self.config.stomp_limits),
            writer: FrameWriter::new(write_half),
            version: Version::V1_0,
            host: host.clone(),
        };
        let versions = &self.config.stomp_versions;
        session.send(&self.connector.connect(broker, versions), deadline)?;
        let Some(frame) = session.next_frame(deadline)? else {
            return Err(Error::Broker { host, message: "no CONNECTED frame within the connect timeout".into() });
        };
        match frame.command.as_str() {
            "CONNECTED" => {}
            "ERROR" => return Err(Error::Broker { host, message: error_text(&frame) }),
            other => return Err(Error::Broker { host, message: format!("expected CONNECTED, got {other}") }),
        }
        let version = negotiated_version(&frame, versions)?;
        session.version = version;
        session.reader.set_version(version);
        session.writer.set_version(version);
        Ok(session)
    }
}

/// The addresses of `host`, waiting for DNS no later than `deadline`. A
/// literal IP needs no lookup; a name is looked up on a helper thread, which
/// is left to finish on its own if the resolver hangs.
fn resolve_before<L>(host: &str, port: u16, deadline: Instant, lookup: L) -> io::Result<Vec<SocketAddr>>
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

fn system_lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

/// `now + d`, capped at a day so a huge caller timeout cannot overflow.
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d.min(Duration::from_secs(86_400))).unwrap_or(now)
}

/// An ERROR frame's `message` header and body, for error text.
fn error_text(frame: &Frame) -> String {
    let mut s = frame.get("message").unwrap_or("ERROR frame").to_string();
    let body = String::from_utf8_lossy(&frame.body);
    let body = body.trim();
    if !body.is_empty() {
        s.push_str(": ");
        s.extend(body.chars().take(500));
    }
    s
}

/// Agent and action names become parts of destinations: keep them `\w+`.
fn check_name(what: &str, name: &str) -> Result<()> {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("{what} {name:?} is not a \\w+ name")))
    }
}

/// mcollective identities match `/^[\w.\-]+$/`.
fn check_identity(node: &str) -> Result<()> {
    if !node.is_empty() && node.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("node identity {node:?} does not match /^[\\w.\\-]+$/")))
    }
}

/// One STOMP connection.
struct Session {
    reader: FrameReader<BrokerStream>,
    writer: FrameWriter<BrokerStream>,
    version: Version,
    host: String,
}

/// Where [`Client::collect`] reads frames: a broker's session, or a recording.
/// Where [`Client::collect`]'s batches are decoded and verified
/// ([`message::decode_replies_verified`]): on the collecting thread for the first,
/// then on a thread of its own, started at the second full batch (a collect of a
/// few replies starts none), which gives each batch back in the order sent.
struct Verifier<'scope, 'env> {
    client: &'env Client,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    worker: Option<VerifyWorker>,
    /// Batches decoded on this thread, not kept yet.
    ready: std::collections::VecDeque<Decoded>,
    /// Batches sent to the worker and not yet back, and their replies.
    in_flight: usize,
    replies_in_flight: usize,
    /// Full batches seen, to start the worker at the second.
    full_batches: usize,
}

struct VerifyWorker {
    batches: crossbeam_channel::Sender<Vec<Vec<u8>>>,
    decoded: crossbeam_channel::Receiver<Decoded>,
}

/// A batch's replies, decoded and verified, with each one's size.
type Decoded = Vec<(Result<Reply>, usize)>;

impl<'scope, 'env> Verifier<'scope, 'env> {
    fn new(client: &'env Client, scope: &'scope std::thread::Scope<'scope, 'env>) -> Self {
        Verifier {
            client,
            scope,
            worker: None,
            ready: std::collections::VecDeque::new(),
            in_flight: 0,
            replies_in_flight: 0,
            full_batches: 0,
        }
    }

    /// Replies sent and not kept yet.
    fn replies_in_flight(&self) -> usize {
        self.replies_in_flight
    }

    fn decode(client: &Client, outers: Vec<Vec<u8>>) -> Decoded {
        let sizes: Vec<usize> = outers.iter().map(Vec::len).collect();
        let decoded = message::decode_replies_verified(outers, &client.config.psk, client.config.marshal_limits);
        decoded.into_iter().zip(sizes).collect()
    }

    /// Hands over what is held (emptying it), to be decoded and verified.
    fn send(&mut self, held: &mut Vec<Vec<u8>>) {
        if held.is_empty() {
            return;
        }
        let outers = std::mem::replace(held, Vec::with_capacity(VERIFY_BATCH));
        self.replies_in_flight += outers.len();
        if outers.len() >= VERIFY_BATCH {
            self.full_batches += 1;
        }
        if self.worker.is_none() && self.full_batches >= 2 {
            self.worker = self.start_worker();
        }
        let unsent = match &self.worker {
            Some(worker) => worker.batches.send(outers).err().map(|unsent| unsent.into_inner()),
            None => Some(outers),
        };
        match unsent {
            None => self.in_flight += 1,
            Some(outers) => self.ready.push_back(Self::decode(self.client, outers)),
        }
    }

    /// A thread decoding batches in order; None if it cannot be started (the
    /// batches are then decoded here).
    fn start_worker(&self) -> Option<VerifyWorker> {
        // Unbounded: what waits in them is replies already received, and neither
        // side may block on the other (the collecting thread takes what is decoded
        // only between frames).
        let (batches, to_decode) = crossbeam_channel::unbounded::<Vec<Vec<u8>>>();
        let (done, decoded) = crossbeam_channel::unbounded::<Decoded>();
        let client = self.client;
        std::thread::Builder::new()
            .name("puppet-kicker-verify".into())
            .spawn_scoped(self.scope, move || {
                for outers in to_decode {
                    if done.send(Self::decode(client, outers)).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(VerifyWorker { batches, decoded })
    }

    /// Keeps the batches already decoded, in order, without waiting; true once the
    /// count is met.
    fn keep_ready(&mut self, kept: &mut AcceptedReplies, expect: &Expect<'_>) -> bool {
        self.keep(kept, expect, false)
    }

    /// Keeps every batch sent, in order, waiting for those under way; true once the
    /// count is met (the rest is then dropped, as replies after the last expected).
    fn keep_all(&mut self, kept: &mut AcceptedReplies, expect: &Expect<'_>) -> bool {
        self.keep(kept, expect, true)
    }

    fn keep(&mut self, kept: &mut AcceptedReplies, expect: &Expect<'_>, wait: bool) -> bool {
        loop {
            // Decoded here only before the worker started: all of them come first.
            let batch = match self.ready.pop_front() {
                Some(batch) => batch,
                None if self.in_flight == 0 => return false,
                None => {
                    let worker = self.worker.as_ref().expect("batches in flight have a worker");
                    let next = if wait { worker.decoded.recv().ok() } else { worker.decoded.try_recv().ok() };
                    match next {
                        Some(batch) => {
                            self.in_flight -= 1;
                            batch
                        }
                        None if wait => {
                            // The worker is gone (it panicked): its batches are lost.
                            (self.in_flight, self.replies_in_flight) = (0, 0);
                            return false;
                        }
                        None => return false,
                    }
                }
            };
            self.replies_in_flight -= batch.len();
            let client = self.client;
            for (reply, size) in batch {
                if kept.accept(reply, size, expect, &client.counters, client.config.reply_limits) {
                    return true;
                }
            }
        }
    }
}

trait Frames {
    /// The next frame if it is already here, without waiting.
    fn frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>>;
    /// The next frame, or `None` once `deadline` has passed.
    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>>;
    /// Who sent the frames, for errors.
    fn host(&self) -> &str;
}

impl Frames for Session {
    fn frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        Session::frame_if_ready(self, deadline)
    }

    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        Session::next_frame(self, deadline)
    }

    fn host(&self) -> &str {
        &self.host
    }
}

/// A recording: every frame is here at once, and its end is the deadline.
impl Frames for FrameReader<&[u8]> {
    fn frame_if_ready(&mut self, _deadline: Instant) -> Result<Option<Frame>> {
        self.read_frame_or_end()
    }

    fn next_frame(&mut self, _deadline: Instant) -> Result<Option<Frame>> {
        self.read_frame_or_end()
    }

    fn host(&self) -> &str {
        "the recording"
    }
}

impl Session {
    fn send(&mut self, frame: &Frame, deadline: Instant) -> Result<()> {
        self.writer.write_frame_before(frame, deadline).map_err(|e| match e {
            Error::Io { context, source } => Error::io(format!("{context} to {}", self.host), source),
            other => other,
        })
    }

    /// The next frame if it is already here, without waiting on the broker.
    fn frame_if_ready(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.reader.read_frame_if_ready(deadline).map_err(|e| self.naming_broker(e))
    }

    /// The next frame, or None once `deadline` passed, whatever the broker
    /// sends meanwhile (heart-beats, a frame a byte at a time).
    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.reader.read_frame_before(deadline).map_err(|e| self.naming_broker(e))
    }

    /// A reading error that names the broker.
    fn naming_broker(&self, e: Error) -> Error {
        match e {
            Error::Io { context, source } => Error::io(format!("{context} from {}", self.host), source),
            Error::Frame(m) => Error::Frame(format!("from {}: {m}", self.host)),
            e => e,
        }
    }

    /// DISCONNECT and close; errors are moot at this point.
    fn close(mut self, connector: &Connector, deadline: Instant) {
        let _ = self.send(&connector.disconnect(), deadline);
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("agent", "rpc_util2").is_ok());
        assert!(check_name("agent", "a/b").is_err());
        assert!(check_name("agent", "").is_err());
        assert!(check_identity("node-1.example.com").is_ok());
        assert!(check_identity("node 1").is_err());
        assert!(check_identity("../x/").is_err());
    }

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

    #[test]
    fn error_frames_are_summarised() {
        let f = Frame::new("ERROR").header("message", "Bad CONNECT").body(b"Access refused\n".to_vec());
        assert_eq!(error_text(&f), "Bad CONNECT: Access refused");
    }
}
