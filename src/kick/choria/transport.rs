//! The Choria kick transport: `puppet#runonce` over NATS to one server, its reply
//! read as the planner's outcome.
//!
//! The NATS client is async-nats, on a current-thread tokio runtime of the
//! transport's own, driven by one Rust thread (`puppet-kicker-choria`) for the
//! transport's life: the connection answers the broker's pings between kicks, and
//! [`Transport::runonce`] (called from the dispatcher's thread) hands each kick to
//! that runtime and waits for its outcome, bounded by the connect and reply timeouts.
//!
//! Connection: TLS always (rustls with `ring`, never the process-wide provider),
//! the broker verified against `choria.ssl_ca`, our certificate and key sent (Choria
//! brokers require them). Brokers are tried in order, each within
//! `choria.connect_timeout`; a connection found lost at the next kick is dropped
//! and made again then (no reconnecting in the background between kicks: the
//! planner's retries pace it).
//!
//! Per kick: subscribe to the reply subject, publish the signed request, wait up
//! to `kick.reply_timeout` for a reply that [`decode_reply`] accepts (hash, request
//! id, sender). A reply it refuses is set aside, and the wait goes on: a forged
//! reply cannot hide the real one. Nothing here panics into the dispatcher, and no
//! message carries the key's contents: only the files' paths.

use super::reply::{decode_reply, Expected};
use super::request::{runonce_request, DirectedRequest, RequestId, RunOnce};
use super::settings::{Broker, ChoriaSettings, Resolved, SetupError};
use crate::kick::{Dispatch, Outcome, Transport};
use crate::mcollective::tls::{Setting, TlsSettings};
use crate::puppet_settings::PuppetSettings;
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Replies buffered per kick before the client drops more (a flood on our reply
/// subject cannot fill memory); a kick expects one.
const REPLIES_BUFFERED: usize = 16;
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
}

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

impl Transport for ChoriaTransport {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        let (sent, outcome) = std::sync::mpsc::sync_channel(1);
        // Signed here, on the dispatcher's sending thread: the runtime's one thread
        // then only moves bytes, and up to `max_parallel` requests sign at once.
        let request = match self.shared.request(dispatch) {
            Ok(request) => request,
            Err(failed) => return failed,
        };
        let shared = self.shared.clone();
        let target = dispatch.target.clone();
        self.runtime.spawn(async move {
            let _ = sent.send(shared.runonce(&request, &target).await);
        });
        let settings = &self.shared.resolved.settings;
        let brokers = u32::try_from(settings.brokers.len()).unwrap_or(u32::MAX);
        let bound = settings.connect_timeout.saturating_mul(brokers) + self.shared.reply_timeout + HANDOFF_MARGIN;
        // A task that panicked drops its sender: an error here, never a panic.
        outcome.recv_timeout(bound).unwrap_or_else(|_| {
            Outcome::Failed(format!("choria: no outcome for {} from the transport's thread", dispatch.target))
        })
    }

    fn max_parallel(&self) -> usize {
        self.shared.resolved.settings.max_parallel
    }
}

impl Shared {
    /// The signed `runonce` request of a kick.
    fn request(&self, dispatch: &Dispatch) -> Result<DirectedRequest, Outcome> {
        let settings = &self.resolved.settings;
        let collective = if settings.collectives.contains(&dispatch.environment) {
            dispatch.environment.as_str()
        } else {
            settings.collective.as_str()
        };
        let inputs = RunOnce {
            environment: settings.send_environment.then(|| dispatch.environment.clone()),
            ..self.inputs.clone()
        };
        RequestId::random().and_then(|id| {
            let to = super::Destination { collective, target: &dispatch.target };
            runonce_request(
                &self.resolved.credentials,
                &self.resolved.caller,
                to,
                &inputs,
                id,
                settings.ttl,
                unix_now(),
            )
        })
        .map_err(|e| Outcome::Failed(format!("choria: no request for {}: {e}", dispatch.target)))
    }

    /// Sends `request` to `target` and reads its reply.
    async fn runonce(&self, request: &DirectedRequest, target: &str) -> Outcome {
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(why) => return Outcome::Failed(format!("choria: kick of {target} not sent: {why}")),
        };
        let outcome = self.exchange(&connection, request, target).await;
        if let Err(lost) = &outcome {
            // Made again at the next kick.
            if lost.connection_lost {
                *self.connection.lock().await = None;
            }
        }
        outcome.unwrap_or_else(|e| Outcome::Failed(e.reason))
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

    /// Subscribes, publishes, and waits for a reply the codec accepts.
    async fn exchange(
        &self,
        connection: &Connection,
        request: &DirectedRequest,
        target: &str,
    ) -> Result<Outcome, Failure> {
        let broker = &connection.broker;
        let lost = |what: &str, e: &dyn std::fmt::Display| Failure {
            reason: format!("choria: kick of {target} not sent: {what} on broker {broker} failed: {e}"),
            connection_lost: true,
        };
        let client = &connection.client;
        let deadline = Instant::now() + self.reply_timeout;
        // The broker must take the request within the reply timeout too: a broker
        // that stops reading cannot hold the kick longer.
        let sent = tokio::time::timeout(self.reply_timeout, async {
            let replies = client.subscribe(request.reply_to.clone()).await.map_err(|e| lost("subscribe", &e))?;
            let payload = request.payload.clone().into();
            client.publish(request.subject.clone(), payload).await.map_err(|e| lost("publish", &e))?;
            client.flush().await.map_err(|e| lost("flush", &e))?;
            Ok(replies)
        });
        let mut replies = match sent.await {
            Ok(replies) => replies?,
            Err(_) => {
                let seconds = self.reply_timeout.as_secs_f64();
                return Err(Failure {
                    reason: format!(
                        "choria: kick of {target} not sent: broker {broker} did not take it within {seconds} s"
                    ),
                    connection_lost: true,
                });
            }
        };

        let expected = Expected { request_id: &request.request_id, target };
        let mut refused = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, replies.next()).await {
                Ok(Some(message)) => match decode_reply(&message.payload, &expected) {
                    Ok(reply) => {
                        let _ = replies.unsubscribe().await;
                        return Ok(reply.outcome());
                    }
                    Err(e) => refused = Some(e),
                },
                Ok(None) => {
                    return Err(Failure {
                        reason: format!("choria: the connection to broker {broker} closed before {target} replied"),
                        connection_lost: true,
                    })
                }
                Err(_) => break,
            }
        }
        let _ = replies.unsubscribe().await;
        let seconds = self.reply_timeout.as_secs_f64();
        let reason = match refused {
            Some(e) => format!("choria: reply for {target} via broker {broker} refused: {e}"),
            None => {
                let said = crate::unpoisoned::lock(&connection.server_error).take();
                let said = said.map(|e| format!(" (the broker said: {e})")).unwrap_or_default();
                format!("choria: no reply from {target} within {seconds} s via broker {broker}{said}")
            }
        };
        Err(Failure { reason, connection_lost: false })
    }
}

struct Failure {
    reason: String,
    connection_lost: bool,
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
