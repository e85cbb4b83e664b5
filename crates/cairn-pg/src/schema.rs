//! The database schema cairn keeps in PostgreSQL, created and migrated by
//! cairn itself: a version number in `cairn_meta` (read first, without a
//! lock), forward migrations applied in one transaction under an advisory
//! lock taken only when the schema is behind and waited for at most a few
//! seconds, and a database whose
//! schema is newer than this build refused (like the file format's
//! `storageVersion`).
//!
//! It owns table shapes only; what a row means (leases, the inbox, lines)
//! is in `store.rs` and `lease.rs`.

use postgres::Client;

use crate::PgError;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 3;

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

/// Version 2 (issue 47): an index on `id` in the C collation, so a
/// family's children and an id prefix are a range of it (a million finished
/// sessions cost a claim nothing); the fleet's registry (`cairn_workers`,
/// heartbeats, `cairn workers`) and the lease losses it shows with their
/// reasons; per session, the retries of transient failures and when the next
/// may start (`retries`, `not_before`), and an operator's request to stop
/// its running turn (`cancel_requested`, `cairn cancel`). Written to run
/// again harmlessly (`IF NOT EXISTS`).
const V2: &str = "
CREATE INDEX IF NOT EXISTS cairn_sessions_id_c ON cairn_sessions (id COLLATE \"C\");
ALTER TABLE cairn_sessions ADD COLUMN IF NOT EXISTS retries INT NOT NULL DEFAULT 0;
ALTER TABLE cairn_sessions ADD COLUMN IF NOT EXISTS not_before TIMESTAMPTZ;
ALTER TABLE cairn_sessions ADD COLUMN IF NOT EXISTS cancel_requested TEXT;
CREATE TABLE IF NOT EXISTS cairn_workers (
    name TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    concurrency INT NOT NULL,
    lease_ms BIGINT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    held INT NOT NULL DEFAULT 0,
    draining BOOLEAN NOT NULL DEFAULT false,
    stopped_at TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS cairn_lease_losses (
    id BIGSERIAL PRIMARY KEY,
    worker TEXT NOT NULL,
    session_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    reason TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cairn_lease_losses_worker ON cairn_lease_losses (worker, id);
";

/// Version 3 (issue 52): the application that created a session and alone
/// drives it (`app`, its label; `NULL`: the workers'), because its tools
/// live only in that application's processes: `lease::claim` never takes
/// such a session, the application's own process claims it by id
/// (`app.rs`).
const V3: &str = "ALTER TABLE cairn_sessions ADD COLUMN IF NOT EXISTS app TEXT;";

/// How long a migration waits for another process's migration lock before
/// giving up with an error (a cut-off migrator must not stall everyone).
pub const MIGRATION_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The schema version recorded in the database (0 when cairn never
/// created its tables there). A plain read: no lock, no transaction.
pub fn version(client: &mut Client) -> Result<i32, PgError> {
    let row = match client.query_opt("SELECT value FROM cairn_meta WHERE key = 'schema_version'", &[]) {
        Ok(row) => row,
        Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    match row {
        Some(row) => {
            let text: String = row.get(0);
            text.parse().map_err(|_| PgError::Schema(format!("cairn_meta.schema_version is {text:?}, not a number")))
        }
        None => Ok(0),
    }
}

fn newer(found: i32) -> PgError {
    PgError::Schema(format!(
        "the database's cairn schema is version {found}, newer than this cairn supports (version {SCHEMA_VERSION}); upgrade cairn to use it"
    ))
}

/// Create the schema, or migrate it to [`SCHEMA_VERSION`]; refuse a newer one.
///
/// The version is read first, without any lock: a database that is up to
/// date (every connection but the very first) takes no lock at all, so a
/// process cut off mid-connect holds nothing anyone waits for. Only a
/// database that is behind takes the migration lock, waiting at most
/// [`MIGRATION_LOCK_WAIT`] (`lock_timeout`) for another migrator, and
/// checks the version again under it.
pub fn ensure(client: &mut Client) -> Result<(), PgError> {
    let found = version(client)?;
    if found > SCHEMA_VERSION {
        return Err(newer(found));
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    let mut tx = client.transaction()?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = {}", MIGRATION_LOCK_WAIT.as_millis()))?;
    match tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]) {
        Ok(_) => {}
        Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
            return Err(PgError::Schema(format!(
                "another cairn has been migrating the database's schema for more than {} s (it holds cairn's migration lock); try again, or look for a stuck session in pg_stat_activity",
                MIGRATION_LOCK_WAIT.as_secs()
            )));
        }
        Err(e) => return Err(e.into()),
    }
    tx.batch_execute("CREATE TABLE IF NOT EXISTS cairn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")?;
    let found: i32 = match tx.query_opt("SELECT value FROM cairn_meta WHERE key = 'schema_version'", &[])? {
        Some(row) => {
            let text: String = row.get(0);
            text.parse().map_err(|_| PgError::Schema(format!("cairn_meta.schema_version is {text:?}, not a number")))?
        }
        None => 0,
    };
    if found > SCHEMA_VERSION {
        return Err(newer(found));
    }
    if found < 1 {
        tx.batch_execute(V1)?;
    }
    if found < 2 {
        tx.batch_execute(V2)?;
    }
    if found < 3 {
        tx.batch_execute(V3)?;
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
