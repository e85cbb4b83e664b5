//! cairn's PostgreSQL backend and worker: sessions stored in PostgreSQL
//! behind cairn-core's `Storage` trait ([`PgStore`]), the schema and its
//! migrations ([`schema`]), leases with fencing epochs and the prompt inbox
//! ([`lease`]), approvals that wait durably ([`approvals`]), the worker loop that drives sessions ([`worker`]), and a
//! throwaway server for tests ([`test_cluster`]).
//!
//! It is a host-side crate: it talks to a database and spawns processes,
//! which cairn-core must not. It must not change what a turn does; it only
//! decides where records live and who may commit them.

pub mod approvals;
pub mod lease;
pub mod schema;
pub mod store;
pub mod test_cluster;
pub mod worker;

pub use store::{Fence, PgStore, connect, export, import};

/// Errors of the database layer outside a `Storage` commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// PostgreSQL refused or the connection failed.
    #[error("database error: {0}")]
    Db(#[from] postgres::Error),
    /// The schema is missing pieces or newer than this build.
    #[error("{0}")]
    Schema(String),
    /// No session with this id in the database.
    #[error("no session {0:?} in the database; list them with `cairn sessions --database URL`")]
    NoSuchSession(String),
}
