//! The Choria kick transport: `puppet#runonce` over NATS to the servers kicked,
//! their replies read as the planner's outcomes; and, for a rollout and for
//! confirming kicks, `puppet#disable`, `enable` and `last_run_summary`, one server
//! at a time.
//!
//! The NATS client is async-nats, on a current-thread tokio runtime of the
//! transport's own, driven by one Rust thread (`puppet-kicker-choria`) for the
//! transport's life: the connection answers the broker's pings between kicks, and
//! [`Transport::runonce`] (called from the dispatcher's sending threads) hands each
//! kick to that runtime and waits for its outcome, bounded by the connect and reply
//! timeouts.
//!
//! Kicks sent at once share a request (group commit): a sending thread queues its
//! kick, then takes the signing turn and signs one request for every kick queued by
//! then (per collective and environment, at most [`MAX_TARGETS`] each), as go-choria
//! signs one request for all the servers of a directed call. A lone kick is signed
//! at once, alone; while one request signs, the kicks that arrive wait for the next
//! one. An RSA signature was most of a kick's cost; this makes it one per batch.
//!
//! Connection: TLS always (rustls with `ring`, never the process-wide provider),
//! the broker verified against `choria.ssl_ca`, our certificate and key sent (Choria
//! brokers require them). Brokers are tried in order, each within
//! `choria.connect_timeout`; a connection found lost at the next kick is dropped
//! and made again then (no reconnecting in the background between kicks: the
//! planner's retries pace it).
//!
//! Per request: subscribe to its reply subject, publish it to each target's
//! subject, wait up to `kick.reply_timeout` for a reply from each that
//! [`decode_reply`] accepts (hash, request id, a sender that is one of the targets),
//! each handed to its target's kick. A reply it refuses is set aside, and the wait
//! goes on: a forged reply cannot hide the real one. Nothing here panics into the
//! dispatcher, and no message carries the key's contents: only the files' paths.

use super::error::ReplyError;
use super::reply::{claimed_sender, decode_reply, ActionReply, Expected};
use super::request::{directed_request, Action, DirectedRequest, RequestId, RunOnce, MAX_TARGETS};
use super::settings::{Broker, ChoriaSettings, Resolved, SetupError};
use crate::kick::{Dispatch, LastRun, Outcome, Server, Transport};
use crate::mcollective::tls::{Setting, TlsSettings};
use crate::puppet_settings::PuppetSettings;
use futures_util::StreamExt;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Replies buffered per request before the client drops more (a flood on our reply
/// subject cannot fill memory); a request expects one from each target.
const REPLIES_BUFFERED: usize = 2 * MAX_TARGETS;
/// Beyond the connect and reply timeouts, how long the dispatcher waits for the
/// runtime to hand back an outcome before it gives the kick up as failed.
const HANDOFF_MARGIN: Duration = Duration::from_secs(5);

/// The Choria transport; see the module's documentation.
pub struct ChoriaTransport {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    resolved: Resolved,
    tls: rustls::ClientConfig,
    /// `runonce`'s inputs but `environment` (the kick's, when `choria.send_environment`).
    inputs: RunOnce,
    reply_timeout: Duration,
    connection: tokio::sync::Mutex<Option<Connection>>,
    /// Kicks waiting to be signed; whoever holds `signing` takes them all.
    queued: Mutex<Vec<Kick>>,
    /// The signing turn.
    signing: Mutex<()>,
}

/// A request's target on its way: where its reply, or why none, goes.
struct Kick {
    target: String,
    environment: String,
    answer: SyncSender<Answer>,
}

/// A target's reply, or why there is none.
type Answer = Result<ActionReply, String>;

#[derive(Clone)]
struct Connection {
    client: async_nats::Client,
    broker: String,
    /// The last error the broker sent (a permissions violation on a subject), for
    /// the reason of a kick that got no reply.
    server_error: Arc<Mutex<Option<String>>>,
}

impl ChoriaTransport {
    /// Reads and checks the files (the certificate must be `choria.certname`'s) and
    /// starts the runtime's thread; connects at the first kick.
    pub fn new(
        settings: &ChoriaSettings,
        puppet: &PuppetSettings,
        inputs: RunOnce,
        reply_timeout: Duration,
    ) -> Result<ChoriaTransport, SetupError> {
        let resolved = settings.resolve(puppet)?;
        let tls = TlsSettings {
            ca: vec![resolved.ca.clone()],
            cert: Some(resolved.cert.clone()),
            key: Some(resolved.key.clone()),
        }
        .client_config()
        .map_err(|e| SetupError::Tls {
            key: match e.setting {
                Setting::Ca => "choria.ssl_ca",
                Setting::Cert => "choria.ssl_cert",
                Setting::Key => "choria.ssl_key",
            },
            reason: e.reason,
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SetupError::Runtime(e.to_string()))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("puppet-kicker-choria".into())
            .spawn(move || {
                // Runs the connection's tasks until the transport is dropped; dropping
                // the runtime then ends them (and closes the connection).
                runtime.block_on(async move {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| SetupError::Runtime(e.to_string()))?;
        let shared = Shared {
            tls: (*tls).clone(),
            resolved,
            inputs: RunOnce { environment: None, ..inputs },
            reply_timeout,
            connection: tokio::sync::Mutex::new(None),
            queued: Mutex::new(Vec::new()),
            signing: Mutex::new(()),
        };
        Ok(ChoriaTransport { shared: Arc::new(shared), runtime: handle, stop: Some(stop), thread: Some(thread) })
    }

    /// The caller id requests are signed as (`choria=<certname>`).
    pub fn caller_id(&self) -> String {
        self.shared.resolved.caller.caller_id()
    }
}

impl Drop for ChoriaTransport {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl ChoriaTransport {
    /// The bound on waiting for the runtime's answer: every broker's connect timeout,
    /// the reply timeout, and a margin.
    fn bound(&self) -> Duration {
        let settings = &self.shared.resolved.settings;
        let brokers = u32::try_from(settings.brokers.len()).unwrap_or(u32::MAX);
        settings.connect_timeout.saturating_mul(brokers) + self.shared.reply_timeout + HANDOFF_MARGIN
    }

    /// One `action` to `target` alone, in a request of its own: its reply, or why none.
    fn call(&self, target: &Server<'_>, action: Action<'_>) -> Answer {
        let (sent, answer) = sync_channel(1);
        let kick =
            Kick { target: target.certname.to_string(), environment: target.environment.to_string(), answer: sent };
        let Some(request) = self.shared.request(action, vec![kick]) else {
            return answer.try_recv().unwrap_or_else(|_| Err(format!("choria: no request for {}", target.certname)));
        };
        let shared = self.shared.clone();
        self.runtime.spawn(async move { shared.send(&request.0, request.1).await });
        answer
            .recv_timeout(self.bound())
            .unwrap_or_else(|_| Err(format!("choria: no answer for {} from the transport's thread", target.certname)))
    }
}

impl Transport for ChoriaTransport {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        let (sent, answer) = sync_channel(1);
        let kick = Kick { target: dispatch.target.clone(), environment: dispatch.environment.clone(), answer: sent };
        crate::unpoisoned::lock(&self.shared.queued).push(kick);
        {
            // Signed here, on the dispatcher's sending threads, one at a time: the
            // runtime's one thread only moves bytes. This kick is in the batch taken
            // now, or was in one that an earlier turn took.
            let _turn = crate::unpoisoned::lock(&self.shared.signing);
            let batch = std::mem::take(&mut *crate::unpoisoned::lock(&self.shared.queued));
            for (request, kicks) in self.shared.requests(batch) {
                let shared = self.shared.clone();
                self.runtime.spawn(async move { shared.send(&request, kicks).await });
            }
        }
        // A task that panicked drops its senders: an error here, never a panic.
        match answer.recv_timeout(self.bound()) {
            Ok(Ok(reply)) => reply.outcome(),
            Ok(Err(why)) => Outcome::Failed(why),
            Err(_) => {
                Outcome::Failed(format!("choria: no outcome for {} from the transport's thread", dispatch.target))
            }
        }
    }

    fn max_parallel(&self) -> usize {
        self.shared.resolved.settings.max_parallel
    }

    fn controls_agents(&self) -> bool {
        true
    }

    fn disable(&self, target: &Server<'_>, message: &str) -> Result<(), String> {
        self.call(target, Action::Disable { message })?.done()
    }

    fn enable(&self, target: &Server<'_>) -> Result<(), String> {
        self.call(target, Action::Enable)?.done()
    }

    fn last_run(&self, target: &Server<'_>) -> Result<LastRun, String> {
        self.call(target, Action::LastRunSummary)?.last_run()
    }
}

impl Shared {
    /// The signed `runonce` requests of queued kicks: one per collective and
    /// environment sent, of at most [`MAX_TARGETS`] kicks each, in the order queued.
    /// A kick whose request cannot be made gets its failure here.
    fn requests(&self, batch: Vec<Kick>) -> Vec<(DirectedRequest, Vec<Kick>)> {
        let settings = &self.resolved.settings;
        let mut groups: Vec<(String, Option<String>, Vec<Kick>)> = Vec::new();
        for kick in batch {
            let collective = self.collective_for(&kick.environment).to_string();
            let environment = settings.send_environment.then(|| kick.environment.clone());
            // A target already in the group is kicked in a request of its own.
            let fits = |(c, e, kicks): &&mut (String, Option<String>, Vec<Kick>)| {
                *c == collective
                    && *e == environment
                    && kicks.len() < MAX_TARGETS
                    && !kicks.iter().any(|k| k.target == kick.target)
            };
            match groups.iter_mut().find(|group| fits(group)) {
                Some(group) => group.2.push(kick),
                None => groups.push((collective, environment, vec![kick])),
            }
        }
        groups
            .into_iter()
            .filter_map(|(_, environment, kicks)| {
                let inputs = RunOnce { environment, ..self.inputs.clone() };
                self.request(Action::RunOnce(&inputs), kicks)
            })
            .collect()
    }

    /// The collective a server of `environment` is reached in: its environment's
    /// when that is one of `choria.collectives`, else `choria.collective`.
    fn collective_for<'a>(&'a self, environment: &'a str) -> &'a str {
        let settings = &self.resolved.settings;
        if settings.collectives.iter().any(|c| c == environment) {
            environment
        } else {
            &settings.collective
        }
    }

    /// The signed request of `action` to `kicks`' targets (one collective: the first
    /// kick's), or `None` when it cannot be made: each kick then has its failure.
    fn request(&self, action: Action<'_>, kicks: Vec<Kick>) -> Option<(DirectedRequest, Vec<Kick>)> {
        let settings = &self.resolved.settings;
        let collective = self.collective_for(&kicks.first()?.environment);
        let targets: Vec<&str> = kicks.iter().map(|k| k.target.as_str()).collect();
        let to = super::Destination { collective, targets: &targets };
        let request = RequestId::random().and_then(|id| {
            directed_request(
                &self.resolved.credentials,
                &self.resolved.caller,
                to,
                action,
                id,
                settings.ttl,
                unix_now(),
            )
        });
        match request {
            Ok(request) => Some((request, kicks)),
            Err(e) => {
                for kick in kicks {
                    let _ = kick.answer.send(Err(format!("choria: no request for {}: {e}", kick.target)));
                }
                None
            }
        }
    }

    /// Sends `request` to its targets and hands each its reply, or why none.
    async fn send(&self, request: &DirectedRequest, kicks: Vec<Kick>) {
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(why) => {
                for kick in kicks {
                    let _ = kick.answer.send(Err(format!("choria: kick of {} not sent: {why}", kick.target)));
                }
                return;
            }
        };
        if self.exchange(&connection, request, kicks).await {
            // Made again at the next kick.
            *self.connection.lock().await = None;
        }
    }

    /// The connection, made if there is none or the last one was lost.
    async fn connection(&self) -> Result<Connection, String> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref() {
            if c.client.connection_state() == async_nats::connection::State::Connected {
                return Ok(c.clone());
            }
        }
        *slot = None;
        let mut failures = Vec::new();
        for broker in &self.resolved.settings.brokers {
            match self.connect(broker).await {
                Ok(connection) => {
                    *slot = Some(connection.clone());
                    return Ok(connection);
                }
                Err(why) => failures.push(format!("{broker}: {why}")),
            }
        }
        Err(format!("no Choria broker reachable ({})", failures.join("; ")))
    }

    async fn connect(&self, broker: &Broker) -> Result<Connection, String> {
        let timeout = self.resolved.settings.connect_timeout;
        let server_error = Arc::new(Mutex::new(None));
        let seen = server_error.clone();
        let address = format!("tls://{broker}");
        let options = async_nats::ConnectOptions::new()
            .name("puppet-kicker")
            .require_tls(true)
            .tls_client_config(self.tls.clone())
            .connection_timeout(timeout)
            .ignore_discovered_servers()
            .subscription_capacity(REPLIES_BUFFERED)
            // A lost connection is made again by the next kick, through every broker.
            .max_reconnects(1)
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        *crate::unpoisoned::lock(&seen) = Some(e.to_string());
                    }
                }
            });
        let client = match tokio::time::timeout(timeout, options.connect(address.as_str())).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(connect_error(&e)),
            Err(_) => return Err(format!("no connection within {} s", timeout.as_secs())),
        };
        Ok(Connection { client, broker: broker.to_string(), server_error })
    }

    /// Subscribes, publishes to each target, and waits for a reply the codec
    /// accepts from each; every target gets its reply or why none. True when the
    /// connection was found lost.
    async fn exchange(&self, connection: &Connection, request: &DirectedRequest, kicks: Vec<Kick>) -> bool {
        let broker = &connection.broker;
        let fail_all = |kicks: Vec<Kick>, why: &dyn Fn(&str) -> String| {
            for kick in kicks {
                let _ = kick.answer.send(Err(why(&kick.target)));
            }
        };
        let client = &connection.client;
        let deadline = Instant::now() + self.reply_timeout;
        // The broker must take the request within the reply timeout too: a broker
        // that stops reading cannot hold the kicks longer.
        let sent = tokio::time::timeout(self.reply_timeout, async {
            let replies = client.subscribe(request.reply_to.clone()).await.map_err(|e| ("subscribe", e.to_string()))?;
            let payload = bytes::Bytes::from(request.payload.clone());
            for subject in &request.subjects {
                client.publish(subject.clone(), payload.clone()).await.map_err(|e| ("publish", e.to_string()))?;
            }
            client.flush().await.map_err(|e| ("flush", e.to_string()))?;
            Ok::<_, (&str, String)>(replies)
        });
        let mut replies = match sent.await {
            Ok(Ok(replies)) => replies,
            Ok(Err((what, e))) => {
                fail_all(kicks, &|target| {
                    format!("choria: kick of {target} not sent: {what} on broker {broker} failed: {e}")
                });
                return true;
            }
            Err(_) => {
                let seconds = self.reply_timeout.as_secs_f64();
                fail_all(kicks, &|target| {
                    format!("choria: kick of {target} not sent: broker {broker} did not take it within {seconds} s")
                });
                return true;
            }
        };

        let targets: Vec<&str> = kicks.iter().map(|k| k.target.as_str()).collect();
        let expected = Expected { request_id: &request.request_id, targets: &targets };
        let mut waiting: Vec<Option<&Kick>> = kicks.iter().map(Some).collect();
        let mut left_to_answer = kicks.len();
        // A refused reply is reported against the target it claims to be from, or,
        // claiming none of them, against every target left without a reply.
        let mut refused_for: Vec<Option<ReplyError>> = vec![None; kicks.len()];
        let mut refused = None;
        let mut lost = false;
        while left_to_answer > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, replies.next()).await {
                Ok(Some(message)) => match decode_reply(&message.payload, &expected) {
                    Ok(reply) => {
                        // A second reply from a target already answered is ignored.
                        if let Some(slot) = waiting.iter_mut().find(|k| k.is_some_and(|k| k.target == reply.sender)) {
                            if let Some(kick) = slot.take() {
                                let _ = kick.answer.send(Ok(reply));
                                left_to_answer -= 1;
                            }
                        }
                    }
                    Err(e) => {
                        let claimed = claimed_sender(&message.payload);
                        match claimed.and_then(|sender| targets.iter().position(|t| *t == sender)) {
                            Some(at) => refused_for[at] = Some(e),
                            None => refused = Some(e),
                        }
                    }
                },
                Ok(None) => {
                    lost = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let _ = replies.unsubscribe().await;
        let seconds = self.reply_timeout.as_secs_f64();
        let said =
            if left_to_answer > 0 && !lost { crate::unpoisoned::lock(&connection.server_error).take() } else { None };
        for (kick, refused_for) in waiting.into_iter().zip(refused_for).filter_map(|(k, r)| Some((k?, r))) {
            let target = &kick.target;
            let reason = match (refused_for.as_ref().or(refused.as_ref()), lost) {
                (_, true) => format!("choria: the connection to broker {broker} closed before {target} replied"),
                (Some(e), false) => format!("choria: reply for {target} via broker {broker} refused: {e}"),
                (None, false) => {
                    let said = said.as_ref().map(|e| format!(" (the broker said: {e})")).unwrap_or_default();
                    format!("choria: no reply from {target} within {seconds} s via broker {broker}{said}")
                }
            };
            let _ = kick.answer.send(Err(reason));
        }
        lost
    }
}

/// async-nats' error, with its source (the TLS or I/O reason) when it has one.
fn connect_error(e: &async_nats::ConnectError) -> String {
    use std::error::Error;
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}
