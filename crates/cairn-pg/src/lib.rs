//! cairn's PostgreSQL backend and worker: sessions stored in PostgreSQL
//! behind cairn-core's `Storage` trait ([`PgStore`]), the schema and its
//! migrations ([`schema`]), leases with fencing epochs and the prompt inbox
//! ([`lease`]), sessions an application drives itself ([`app`]), approvals that wait durably ([`approvals`]), the worker loop that drives sessions ([`worker`]), the
//! reads the commands make ([`catalog`]), the operators' registry and levers
//! ([`fleet`]), connections with their prepared statements ([`conn`]), and a
//! throwaway server for tests ([`test_cluster`]).
//!
//! Every SQL statement on cairn's tables is in this crate (a layout test,
//! cairn-testtools' `import_circles.rs`, fails on one elsewhere).
//!
//! It is a host-side crate: it talks to a database and spawns processes,
//! which cairn-core must not. It must not change what a turn does; it only
//! decides where records live and who may commit them.

pub mod app;
pub mod approvals;
pub mod catalog;
pub mod conn;
pub mod fleet;
pub mod lease;
pub mod schema;
pub mod store;
pub mod test_cluster;
pub mod worker;

pub use conn::{Connection, Db};
pub use lease::Fence;
pub use store::{DEFAULT_LEASE, Hold, Imported, PgStore, connect, connect_for, export, import, import_with};

/// Errors of the database layer outside a `Storage` commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// PostgreSQL refused or the connection failed (shown with the
    /// server's own message and SQLSTATE code, see [`describe`]).
    /// (Not a `source`: its own text is only "db error", and the server's
    /// message would be shown twice.)
    #[error("database error: {}", describe(.0))]
    Db(postgres::Error),
    /// The schema is missing pieces or newer than this build.
    #[error("{0}")]
    Schema(String),
    /// The request is refused (what to do instead is said).
    #[error("{0}")]
    Refused(String),
    /// No session with this id in the database.
    #[error("no session {0:?} in the database; list them with `cairn sessions --database URL`")]
    NoSuchSession(String),
}

impl From<postgres::Error> for PgError {
    fn from(e: postgres::Error) -> Self {
        Self::Db(e)
    }
}

/// A PostgreSQL error as a person needs it: for an error the server sent,
/// its severity, message, SQLSTATE code, detail and hint (the client's own
/// text for those is only "db error"); otherwise the client's text and its
/// cause ("error communicating with the server: Connection reset by peer").
pub fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; detail: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}
