//! The shared state's schema, created and migrated by the module: `schema_version`
//! (one row per migration applied) and `kick_state` (the one row of the state).
//!
//! Compilers starting together migrate one at a time (a transaction-scoped advisory
//! lock). A schema whose version is newer than this module's is refused: an older
//! module must not write a state a newer one shaped. Nothing is created outside the
//! configured schema, and the schema itself only when it does not exist (a database
//! owner may create it beforehand and grant the module's user its tables).

use super::super::planner::PlannerState;
use std::fmt;

/// The version this module's tables are at.
pub const SCHEMA_VERSION: i32 = 1;

/// Each migration, from the version before to its index + 1. `{schema}` is the schema
/// (a name of `[a-z0-9_]`, quoted: a reserved word such as `window` works too).
const MIGRATIONS: &[&str] = &["CREATE TABLE \"{schema}\".kick_state (
        id smallint PRIMARY KEY CHECK (id = 1),
        generation bigint NOT NULL,
        state bytea NOT NULL,
        updated_at timestamptz NOT NULL,
        updated_by text NOT NULL
    );
    -- The state is MessagePack, rewritten whole by each change: stored out of line
    -- without compression (pglz on megabytes costs more than the bytes it saves),
    -- or with lz4 where the server has it (STORAGE).
    ALTER TABLE \"{schema}\".kick_state ALTER COLUMN state SET STORAGE EXTERNAL"];

/// Why the schema cannot be used.
#[derive(Debug)]
pub enum SchemaError {
    /// A statement failed (the server's message, or why it was not reached).
    Statement { schema: String, source: super::PgError },
    /// The schema is at a version this module does not know.
    Newer { schema: String, found: i32 },
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Statement { schema, source } => {
                write!(f, "cannot create or migrate schema {schema}: {source}")
            }
            SchemaError::Newer { schema, found } => write!(
                f,
                "schema {schema} is at version {found}, newer than this puppet-kicker's ({SCHEMA_VERSION}): \
                 upgrade the module on every compiler sharing it, or set kick.postgresql.schema to another schema"
            ),
        }
    }
}

impl std::error::Error for SchemaError {}

/// Creates the schema's tables or brings them to [`SCHEMA_VERSION`], in one
/// transaction.
pub async fn migrate(client: &mut tokio_postgres::Client, schema: &str, writer: &str) -> Result<(), SchemaError> {
    let fail = |e: tokio_postgres::Error| SchemaError::Statement {
        schema: schema.to_string(),
        source: super::PgError::of(&e),
    };
    let tx = client.transaction().await.map_err(fail)?;
    // One compiler at a time; released at the transaction's end.
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('puppet-kicker schema ' || $1))", &[&schema])
        .await
        .map_err(fail)?;
    let exists =
        tx.query_one("SELECT count(*) FROM pg_namespace WHERE nspname = $1", &[&schema]).await.map_err(fail)?;
    if exists.get::<_, i64>(0) == 0 {
        tx.batch_execute(&format!("CREATE SCHEMA \"{schema}\"")).await.map_err(fail)?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".schema_version (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            applied_by text NOT NULL
        )"
    ))
    .await
    .map_err(fail)?;
    let current: i32 = tx
        .query_one(&format!("SELECT coalesce(max(version), 0) FROM \"{schema}\".schema_version"), &[])
        .await
        .map_err(fail)?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(SchemaError::Newer { schema: schema.to_string(), found: current });
    }
    for version in current + 1..=SCHEMA_VERSION {
        tx.batch_execute(&MIGRATIONS[(version - 1) as usize].replace("{schema}", schema)).await.map_err(fail)?;
        if version == 1 {
            let empty = rmp_serde::to_vec_named(&PlannerState::default()).unwrap_or_default();
            tx.execute(
                &format!(
                    "INSERT INTO \"{schema}\".kick_state (id, generation, state, updated_at, updated_by) VALUES (1, 0, $1, clock_timestamp(), $2)"
                ),
                &[&empty, &writer],
            )
            .await
            .map_err(fail)?;
        }
        tx.execute(
            &format!("INSERT INTO \"{schema}\".schema_version (version, applied_by) VALUES ($1, $2)"),
            &[&version, &writer],
        )
        .await
        .map_err(fail)?;
    }
    tx.batch_execute(&STORAGE.replace("{schema}", schema)).await.map_err(fail)?;
    tx.commit().await.map_err(fail)
}

/// The state's storage, set where it is not yet (not a change of the tables' shape:
/// a module before it reads and writes the column the same). Compressed with lz4
/// (PostgreSQL 14 and later, built with it, as Debian's and the PGDG packages are):
/// a transaction writes the state whole, and lz4 makes it a fraction of its size for
/// little CPU, unlike pglz, which costs more than the bytes it saves. And kept in the
/// row while it fits in a page once compressed (`STORAGE MAIN`, `toast_tuple_target`
/// at its maximum), rather than in TOAST chunks: each transaction would otherwise
/// write new chunks and their index entries, and read them back (a kicking report
/// takes less with the state in the row, in runs of `cargo bench --bench
/// shared_state` alternating the two). A larger state is still moved out of line.
/// Without lz4 the column stays stored out of line, uncompressed.
const STORAGE: &str = "DO $$
DECLARE
    state_table constant regclass := '\"{schema}\".kick_state'::regclass;
BEGIN
    IF (SELECT attcompression FROM pg_attribute WHERE attrelid = state_table AND attname = 'state')
        IS DISTINCT FROM 'l' THEN
        ALTER TABLE \"{schema}\".kick_state ALTER COLUMN state SET COMPRESSION lz4;
    END IF;
    IF (SELECT attstorage FROM pg_attribute WHERE attrelid = state_table AND attname = 'state') <> 'm'
        OR NOT coalesce((SELECT reloptions FROM pg_class WHERE oid = state_table)
                        @> ARRAY['toast_tuple_target=8160'], false) THEN
        ALTER TABLE \"{schema}\".kick_state ALTER COLUMN state SET STORAGE MAIN, SET (toast_tuple_target = 8160);
    END IF;
EXCEPTION WHEN feature_not_supported OR syntax_error OR undefined_column THEN
    NULL;
END $$";
