//! `kick.state: postgresql`: the kick state shared by several compilers in one row of
//! a PostgreSQL table, so that N compilers coalesce, rate-limit, follow the role graph
//! and stop loops as one.
//!
//! A transaction is the file store's, with the row's lock for `kicks.lock`: `SELECT
//! ... FOR UPDATE` of the row (waiting for another compiler's transaction, at most
//! `statement_timeout`), the planner's change, `UPDATE` and `COMMIT`. The state is
//! read only when its generation moved since this process last saw it. The time is
//! the database's (`clock_timestamp()`), so that every compiler's coalescing
//! windows, leases and rate windows agree whatever their clocks.
//!
//! A due kick is claimed in such a transaction (marked in flight, with the time),
//! then sent; its outcome is saved in another. A compiler that dies in between
//! holds the claim until `kick.in_flight_timeout` (the lease) has passed by the
//! database's clock; then any compiler sends it again. So a kick is sent at least
//! once, and at most once more for each compiler that died holding it: twice, when
//! one did. (The sender renews its claim just before sending, and
//! `kick.reply_timeout` is at most half the lease, so a live sender never loses it.)
//!
//! With the database unreachable ([`SharedStore`]), reports are still taken in:
//! the state goes to this host's `kicks.msgpack` (with `kicks.unshared` marking it
//! as not yet shared), due kicks wait, and the database is tried again with a
//! backoff. When it answers, this host's state is merged into the shared one (this
//! host's view wins where both know a server: at worst a kick twice, never none).

mod client;
mod schema;
mod settings;

pub use schema::{SchemaError, SCHEMA_VERSION};
pub use settings::{valid_schema, Connection, PgSettings, SetupError, SslMode, StateKind};

use super::planner::{merge_states, PlannerState};
use super::store::{decode_state, Begun, FileStore, Health, Outage, StateError, StateStore, MAX_STATE_SIZE};
use super::Millis;
use crate::time::now_ms;
use client::{Client, ConnectError};
use futures_util::future::join;
use std::path::PathBuf;

/// The database's now, in milliseconds since the epoch.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";
/// The first retry after an outage begins; doubled each failure, up to [`MAX_BACKOFF_MS`].
const FIRST_BACKOFF_MS: Millis = 1_000;
const MAX_BACKOFF_MS: Millis = 60_000;
/// Marks `kicks.msgpack` as holding changes the shared state has not seen.
pub const UNSHARED_MARKER: &str = "kicks.unshared";

/// One open connection and its prepared statements.
struct Session {
    client: Client,
    select: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
}

/// The shared state's row, reached through `connection`.
pub struct PgStore {
    connection: Connection,
    schema: String,
    /// Connections kept open at most (`kick.postgresql.pool_size`).
    pool_size: usize,
    idle: Vec<Session>,
    /// The session of the transaction in progress.
    current: Option<Session>,
    /// Who writes, for the row's `updated_by`.
    writer: String,
    /// The schema was found at this module's version (or brought to it).
    migrated: bool,
}

/// A failure of the database, and whether it is an outage (see [`PgStore::check`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgError {
    pub reason: String,
    pub outage: bool,
}

impl PgError {
    fn of(e: &tokio_postgres::Error) -> PgError {
        PgError { reason: error_text(e), outage: is_outage(e) }
    }

    /// Not an outage: the state itself, or the schema, is wrong.
    fn fatal(reason: String) -> PgError {
        PgError { reason, outage: false }
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The server unreachable, or not taking connections now: worth retrying, unlike a
/// refusal (authentication, a certificate, a missing database or table, privileges).
fn is_outage(e: &tokio_postgres::Error) -> bool {
    if let Some(db) = e.as_db_error() {
        // 08: connection exception; 53: insufficient resources (too many
        // connections); 57: operator intervention (shutting down, starting up);
        // 40: rollback (a serialization failure or deadlock); 55P03: lock not
        // available; 57014: query canceled (the statement timeout).
        let code = db.code().code();
        return ["08", "53", "57", "40"].iter().any(|class| code.starts_with(class)) || code == "55P03";
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.is::<rustls::Error>() {
            return false;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
                return false;
            }
        }
        source = cause.source();
    }
    true
}

impl PgStore {
    /// A store of `connection`'s database, not yet connected: the first transaction
    /// connects, and creates or migrates the schema.
    pub fn new(connection: Connection, schema: &str, pool_size: usize, writer: &str) -> PgStore {
        PgStore {
            connection,
            schema: schema.to_string(),
            pool_size: pool_size.max(1),
            idle: Vec::new(),
            current: None,
            writer: writer.to_string(),
            migrated: false,
        }
    }

    /// Connects (creating or migrating the schema, the first time). The error says
    /// why, and whether it is an outage (the server unreachable or not accepting
    /// connections yet) or a configuration to fix (a password or a certificate the
    /// server refuses, a CA that does not verify the server, a database that does not
    /// exist, a schema newer than this module).
    pub fn check(&mut self) -> Result<(), PgError> {
        let (session, _) = self.take_session()?;
        self.give_back(session);
        Ok(())
    }

    pub fn name(&self) -> String {
        format!("{} (schema {})", self.connection.name, self.schema)
    }

    fn connect_client(&mut self) -> Result<Client, PgError> {
        let config = &self.connection.config;
        let connected = match &self.connection.tls {
            Some(tls) => Client::connect(config, tls.clone()),
            None => Client::connect(config, tokio_postgres::NoTls),
        };
        let mut client = connected.map_err(|e| match e {
            ConnectError::Postgres(e) => PgError::of(&e),
            ConnectError::Runtime(e) => PgError { reason: format!("no connection could be made: {e}"), outage: true },
        })?;
        if !self.migrated {
            let (schema, writer) = (&self.schema, &self.writer);
            client.run(|c| schema::migrate(c, schema, writer)).map_err(|e| match e {
                schema::SchemaError::Statement { ref source, .. } => {
                    PgError { outage: source.outage, reason: e.to_string() }
                }
                schema::SchemaError::Newer { .. } => PgError::fatal(e.to_string()),
            })?;
            self.migrated = true;
        }
        Ok(client)
    }

    fn session(&self, mut client: Client) -> Result<Session, PgError> {
        let schema = &self.schema;
        let select = format!(
            "SELECT generation, {DB_NOW_MS}, CASE WHEN generation <> $1 AND octet_length(state) <= $2 THEN state END, octet_length(state) \
             FROM \"{schema}\".kick_state WHERE id = 1 FOR UPDATE"
        );
        let update = format!(
            "UPDATE \"{schema}\".kick_state SET generation = $1, state = $2, updated_at = clock_timestamp(), updated_by = $3 WHERE id = 1"
        );
        let (select, update) = client.run(|c| join(c.prepare(&select), c.prepare(&update)));
        let select = select.map_err(|e| PgError::of(&e))?;
        let update = update.map_err(|e| PgError::of(&e))?;
        Ok(Session { client, select, update })
    }

    /// A session of the pool, or a new one; and whether it was the pool's.
    fn take_session(&mut self) -> Result<(Session, bool), PgError> {
        while let Some(session) = self.idle.pop() {
            if !session.client.is_closed() {
                return Ok((session, true));
            }
        }
        let client = self.connect_client()?;
        Ok((self.session(client)?, false))
    }

    fn give_back(&mut self, session: Session) {
        if !session.client.is_closed() && self.idle.len() < self.pool_size {
            self.idle.push(session);
        }
    }

    /// `BEGIN` and the row, locked (one round trip): its generation, the database's
    /// clock, and the state when its generation is not `known`.
    ///
    /// A pooled connection fails at its first use after the server restarted (the
    /// client notices a closed connection only when it uses it): that is not
    /// an outage, so the pool is emptied and a new connection tried once.
    fn lock_row(&mut self, known: u64) -> Result<(Option<PlannerState>, Millis), PgError> {
        let (session, pooled) = self.take_session()?;
        match self.lock_row_in(session, known) {
            Err(e) if pooled && e.outage => {
                self.idle.clear();
                let (session, _) = self.take_session()?;
                self.lock_row_in(session, known)
            }
            read => read,
        }
    }

    fn lock_row_in(&mut self, mut session: Session, known: u64) -> Result<(Option<PlannerState>, Millis), PgError> {
        let read = (|| {
            let select = &session.select;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&(known as i64), &(MAX_STATE_SIZE as i32)];
            let (begun, row) = session.client.run(|c| join(c.batch_execute("BEGIN"), c.query_opt(select, &params)));
            begun.map_err(|e| PgError::of(&e))?;
            let row = row
                .map_err(|e| PgError::of(&e))?
                .ok_or_else(|| PgError::fatal(format!("the row of {}.kick_state is missing", self.schema)))?;
            let db_now: i64 = row.get(1);
            let offset = db_now - now_ms();
            let generation: i64 = row.get(0);
            if generation as u64 == known {
                return Ok((None, offset));
            }
            let bytes: Option<Vec<u8>> = row.get(2);
            let Some(bytes) = bytes else {
                let size: i32 = row.get(3);
                return Err(PgError::fatal(format!(
                    "the saved state is {size} bytes, over the {} MiB limit",
                    MAX_STATE_SIZE >> 20
                )));
            };
            let state = decode_state(&PathBuf::from(format!("{}.kick_state", self.schema)), &bytes)
                .map_err(|e| PgError::fatal(e.to_string()))?;
            Ok((Some(state), offset))
        })();
        match read {
            Ok(read) => {
                self.current = Some(session);
                Ok(read)
            }
            Err(e) => {
                let _ = session.client.run(|c| c.batch_execute("ROLLBACK"));
                self.give_back(session);
                Err(e)
            }
        }
    }

    fn write_row(&mut self, state: &PlannerState) -> Result<(), PgError> {
        let mut session = self.current.take().ok_or(PgError::fatal("no transaction in progress".into()))?;
        let written = (|| {
            let bytes = rmp_serde::to_vec_named(state).map_err(|e| PgError::fatal(e.to_string()))?;
            let generation = state.generation as i64;
            let update = &session.update;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&generation, &bytes, &self.writer];
            // One round trip. A failed UPDATE makes the COMMIT a rollback (PostgreSQL
            // answers COMMIT in a failed transaction with ROLLBACK, not an error): its
            // own error is the one that counts.
            let (updated, committed) =
                session.client.run(|c| join(c.execute(update, &params), c.batch_execute("COMMIT")));
            updated.map_err(|e| PgError::of(&e))?;
            committed.map_err(|e| PgError::of(&e))
        })();
        if written.is_err() {
            let _ = session.client.run(|c| c.batch_execute("ROLLBACK"));
        }
        self.give_back(session);
        written
    }

    fn unlock_row(&mut self) {
        if let Some(mut session) = self.current.take() {
            let _ = session.client.run(|c| c.batch_execute("ROLLBACK"));
            self.give_back(session);
        }
    }

    /// The state as saved, read outside a transaction.
    fn read(&mut self) -> Result<PlannerState, PgError> {
        let (state, _) = self.lock_row(u64::MAX)?;
        self.unlock_row();
        Ok(state.unwrap_or_default())
    }
}

/// The error's text with its cause: tokio-postgres's own says "db error" or "error
/// connecting to server" and keeps the server's message (a wrong password) or the
/// TLS failure (an unknown CA) in its source.
fn error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// Which store the transaction in progress is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum In {
    Shared,
    Local,
}

/// The shared state, with this host's `kicks.msgpack` to keep changes in while the
/// database is unreachable (see the module's documentation).
pub struct SharedStore {
    pg: PgStore,
    local: FileStore,
    /// `kicks.unshared`: present while `kicks.msgpack` holds changes not yet shared.
    marker: PathBuf,
    outage: Option<Outage>,
    backoff_ms: Millis,
    current: In,
    clock_offset: Millis,
    /// `load` failed (the database unreachable at start): the next local transaction
    /// is the outage's first.
    unloaded: bool,
    /// `kick.keep_outcomes`, for merging histories.
    keep_outcomes: usize,
}

impl SharedStore {
    /// Over `pg`, keeping changes in `cache_dir` during an outage.
    pub fn new(pg: PgStore, cache_dir: &std::path::Path, keep_outcomes: usize) -> SharedStore {
        SharedStore {
            pg,
            local: FileStore::new(cache_dir.join(super::STATE_FILE)),
            marker: cache_dir.join(UNSHARED_MARKER),
            outage: None,
            backoff_ms: FIRST_BACKOFF_MS,
            current: In::Local,
            clock_offset: 0,
            unloaded: false,
            keep_outcomes,
        }
    }

    fn unshared(&self) -> bool {
        self.marker.exists()
    }

    fn mark_unshared(&self) {
        if !self.unshared() {
            let _ =
                crate::atomic_file::write(&self.marker, &[b"kicks.msgpack holds kicks not yet in the shared state\n"]);
        }
    }

    /// Records a failure of the database: an outage begins, or goes on with a longer
    /// backoff.
    fn failed(&mut self, reason: String) {
        let now = now_ms();
        let since = self.outage.as_ref().map_or(now, |o| o.since);
        if self.outage.is_some() {
            self.backoff_ms = (self.backoff_ms * 2).min(MAX_BACKOFF_MS);
        } else {
            self.backoff_ms = FIRST_BACKOFF_MS;
        }
        self.outage = Some(Outage { reason, since, retry_at: now + self.backoff_ms });
    }

    /// A transaction in `kicks.msgpack`. The first of an outage saves this process's
    /// state there (`merge`), rather than reading a file older than the shared state;
    /// unless another process of this host already keeps its changes there: those are
    /// taken in.
    fn begin_local(&mut self, known: u64, first: bool) -> Begun {
        self.current = In::Local;
        let mut begun = self.local.begin(known);
        if first {
            if !self.unshared() {
                begun.theirs = None;
            }
            begun.merge = true;
            begun.save = true;
        }
        begun
    }
}

impl StateStore for SharedStore {
    fn describe(&self) -> String {
        self.pg.name()
    }

    fn begin(&mut self, known: u64) -> Begun {
        if self.outage.as_ref().is_some_and(|o| now_ms() < o.retry_at) {
            // The first transaction after a failed `load` is the outage's first here.
            let first = std::mem::take(&mut self.unloaded);
            return self.begin_local(known, first);
        }
        let had_outage = self.outage.is_some();
        // Kicks kept during an outage (by this process, or by another of this host)
        // are merged with the whole shared state: it is read whatever its generation
        // (another compiler may have reached the same generation meanwhile).
        let unshared = !had_outage && self.unshared();
        match self.pg.lock_row(if unshared || had_outage { u64::MAX } else { known }) {
            Ok((theirs, offset)) => {
                self.outage = None;
                self.current = In::Shared;
                self.clock_offset = offset;
                if had_outage {
                    // This process holds what it kept during the outage (and what the
                    // other processes of this host kept: it read them): merged, saved.
                    return Begun { theirs, merge: true, save: true, warnings: Vec::new() };
                }
                if !unshared {
                    return Begun { theirs, ..Begun::default() };
                }
                // Another process of this host kept kicks during an outage this one
                // did not see: they win over the shared state, which wins over this
                // process's view; then saved.
                let mut begun = Begun { save: true, ..Begun::default() };
                match self.local.load() {
                    Ok(mut kept) => {
                        if let Some(shared) = theirs {
                            merge_states(&mut kept, shared, self.keep_outcomes);
                        }
                        begun.theirs = Some(kept);
                    }
                    Err(e) => {
                        begun.warnings.push(format!("the kicks kept during an outage are lost: {e}"));
                        begun.theirs = theirs;
                    }
                }
                begun
            }
            Err(e) => {
                self.failed(e.reason);
                let first = !had_outage || std::mem::take(&mut self.unloaded);
                self.begin_local(known, first)
            }
        }
    }

    fn commit(&mut self, state: &PlannerState) -> Result<(), String> {
        if self.current == In::Shared {
            match self.pg.write_row(state) {
                Ok(()) => {
                    if self.unshared() {
                        let _ = std::fs::remove_file(&self.marker);
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.failed(e.reason);
                    self.current = In::Local;
                    let _ = self.local.begin(state.generation);
                }
            }
        }
        // During an outage: this host's file, marked as not yet shared.
        self.mark_unshared();
        self.local.commit(state)
    }

    fn release(&mut self) {
        match self.current {
            In::Shared => self.pg.unlock_row(),
            In::Local => self.local.release(),
        }
    }

    fn load(&mut self) -> Result<PlannerState, StateError> {
        if self.unshared() {
            // This host kept kicks during an outage: they are the freshest it knows,
            // and the first transaction merges them into the shared state.
            return self.local.load();
        }
        self.pg.read().map_err(|e| {
            self.failed(e.reason.clone());
            // The process starts without the state: its first transaction must not take
            // this host's file (older than the shared state) for it.
            self.unloaded = true;
            StateError::Shared { store: self.pg.name(), reason: e.reason }
        })
    }

    fn health(&self) -> Health {
        Health { outage: self.outage.clone(), clock_offset_ms: self.clock_offset, shared: true }
    }
}
