//! One blocking connection to PostgreSQL whose requests can be pipelined:
//! tokio-postgres on a current-thread runtime of the connection's own, driven only
//! while a request waits (on the caller's thread, never a thread of its own).
//!
//! Why not the sync `postgres` crate, which does the same: it sends a request and
//! waits for its answer before the next, so a transaction of the shared state took
//! four round trips to the server (`BEGIN`, the row, `UPDATE`, `COMMIT`), with the
//! row locked for the last three. Here `BEGIN` goes with the row's `SELECT` and
//! `UPDATE` with `COMMIT`: two round trips, each one a wakeup of the server's
//! process fewer, which on a loaded compiler is what a round trip mostly costs.

use std::future::Future;
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Config, Error, Socket};

/// How long a closing connection may take to say goodbye to the server.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    /// The runtime's I/O driver could not be created (no file descriptor left).
    Runtime(std::io::Error),
    Postgres(Error),
}

pub struct Client {
    runtime: Runtime,
    /// `None` only while dropped.
    client: Option<tokio_postgres::Client>,
    /// The connection's socket, run by `runtime` while a request waits.
    connection: JoinHandle<()>,
}

impl Client {
    /// Connects with `config`, through `tls` (`NoTls`: a Unix socket).
    pub fn connect<T>(config: &Config, tls: T) -> Result<Client, ConnectError>
    where
        T: MakeTlsConnect<Socket> + 'static + Send,
        T::TlsConnect: Send,
        T::Stream: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(ConnectError::Runtime)?;
        let (client, connection) = runtime.block_on(config.connect(tls)).map_err(ConnectError::Postgres)?;
        // A failure of the socket ends the task; the requests then fail with it.
        let connection = runtime.spawn(async move {
            let _ = connection.await;
        });
        Ok(Client { runtime, client: Some(client), connection })
    }

    /// Runs `request` on this connection's client until it ends.
    pub fn run<'a, F, R>(&'a mut self, request: impl FnOnce(&'a mut tokio_postgres::Client) -> F) -> R
    where
        F: Future<Output = R> + 'a,
    {
        // Taken only by `drop`.
        let client = self.client.as_mut().expect("a client lives until it is dropped");
        self.runtime.block_on(request(client))
    }

    /// Whether the server closed the connection (known only after a request failed).
    pub fn is_closed(&self) -> bool {
        self.client.as_ref().is_none_or(|c| c.is_closed())
    }
}

impl Drop for Client {
    /// Ends the session the way a client should (`Terminate`, the TLS close), as the
    /// sync crate did, rather than by dropping the socket under the server.
    fn drop(&mut self) {
        drop(self.client.take());
        let connection = &mut self.connection;
        let _ = self.runtime.block_on(async { tokio::time::timeout(CLOSE_TIMEOUT, connection).await });
    }
}
