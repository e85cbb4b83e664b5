//! The database schema cairn keeps in PostgreSQL, created and migrated by
//! cairn itself: a version number in `cairn_meta`, forward migrations
//! applied in one transaction under an advisory lock, and a database whose
//! schema is newer than this build refused (like the file format's
//! `storageVersion`).
//!
//! It owns table shapes only; what a row means (leases, the inbox, lines)
//! is in `store.rs` and `lease.rs`.

use postgres::Client;

use crate::PgError;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// Advisory lock key serialising migrations ("cairn" in ASCII).
const MIGRATION_LOCK: i64 = 0x0063_6169_726e;

/// Version 1: sessions (header line, last seq, lease, status), lines (the
/// JSONL lines of each commit, with the epoch and owner that wrote them),
/// the inbox of submitted prompts, approvals waiting for a person, and the
/// claim history.
const V1: &str = "
CREATE TABLE cairn_sessions (
    id TEXT PRIMARY KEY,
    header TEXT NOT NULL,
    last_seq BIGINT NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'idle' CHECK (status IN ('idle', 'queued', 'running', 'failed')),
    lease_owner TEXT,
    lease_expires TIMESTAMPTZ,
    epoch BIGINT NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    note TEXT
);
CREATE INDEX cairn_sessions_runnable ON cairn_sessions (updated_at) WHERE status IN ('queued', 'running');
CREATE TABLE cairn_lines (
    session_id TEXT NOT NULL REFERENCES cairn_sessions (id),
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    line TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    owner TEXT,
    committed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (session_id, first_seq)
);
CREATE TABLE cairn_inbox (
    id BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES cairn_sessions (id),
    prompt TEXT NOT NULL,
    submitted_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX cairn_inbox_session ON cairn_inbox (session_id, id);
CREATE TABLE cairn_approvals (
    session_id TEXT NOT NULL REFERENCES cairn_sessions (id),
    invocation_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    asked_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    decision TEXT CHECK (decision IN ('approve', 'deny')),
    reason TEXT,
    answered_by TEXT,
    answered_at TIMESTAMPTZ,
    PRIMARY KEY (session_id, invocation_id)
);
CREATE TABLE cairn_claims (
    session_id TEXT NOT NULL REFERENCES cairn_sessions (id),
    epoch BIGINT NOT NULL,
    owner TEXT NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (session_id, epoch)
);
";

/// Create the schema, or migrate it to [`SCHEMA_VERSION`]; refuse a newer one.
pub fn ensure(client: &mut Client) -> Result<(), PgError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS cairn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")?;
    let found: i32 = match tx.query_opt("SELECT value FROM cairn_meta WHERE key = 'schema_version'", &[])? {
        Some(row) => {
            let text: String = row.get(0);
            text.parse().map_err(|_| PgError::Schema(format!("cairn_meta.schema_version is {text:?}, not a number")))?
        }
        None => 0,
    };
    if found > SCHEMA_VERSION {
        return Err(PgError::Schema(format!(
            "the database's cairn schema is version {found}, newer than this cairn supports (version {SCHEMA_VERSION}); upgrade cairn to use it"
        )));
    }
    if found < 1 {
        tx.batch_execute(V1)?;
    }
    if found < SCHEMA_VERSION {
        tx.execute(
            "INSERT INTO cairn_meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&SCHEMA_VERSION.to_string()],
        )?;
    }
    tx.commit()?;
    Ok(())
}
