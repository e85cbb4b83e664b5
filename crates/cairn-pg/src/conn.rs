//! A connection with the statements prepared on it ([`Connection`]), what
//! cairn-pg's functions run their SQL through ([`Db`]), and the
//! connections kept between short reads ([`with_thread`]), shared by a
//! worker's threads.
//!
//! Why: a statement sent as text is prepared afresh every time (a parse, a
//! plan and one more round trip each); a worker runs the same few dozen
//! statements for every session it drives, so they are prepared once per
//! connection and reused. A prepared statement belongs to the connection it
//! was prepared on, so the cache lives beside its client and dies with it
//! (a reconnect starts a new one). It owns no SQL of its own and decides
//! nothing about sessions.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use postgres::{Client, Statement};

use crate::PgError;

/// A client and the statements prepared on it.
pub struct Connection {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("prepared", &self.prepared.len()).finish_non_exhaustive()
    }
}

impl From<Client> for Connection {
    fn from(client: Client) -> Self {
        Self { client, prepared: HashMap::new() }
    }
}

impl Connection {
    /// The client (its prepared statements stay valid).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// The client back (the prepared statements are closed).
    pub fn into_client(self) -> Client {
        self.client
    }

    /// Whether the connection is known to be closed.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// How many statements are prepared on this connection.
    pub fn prepared(&self) -> usize {
        self.prepared.len()
    }
}

/// Where cairn-pg's functions run a statement: a bare [`Client`] (each
/// statement prepared for the one use, as the client does for text) or a
/// [`Connection`] (prepared once, reused).
pub trait Db {
    /// The client.
    fn client(&mut self) -> &mut Client;
    /// `sql` prepared on this client.
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error>;
}

impl Db for Client {
    fn client(&mut self) -> &mut Client {
        self
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        self.prepare(sql)
    }
}

impl Db for Connection {
    fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.prepared.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.prepared.insert(sql, s.clone());
        Ok(s)
    }
}

/// Connections kept for short reads (URL, lease, connection), shared by a
/// worker's threads: taken for one use and put back. Not a thread-local:
/// a `postgres::Client` dropped in a thread-local's destructor enters its
/// tokio runtime after tokio's own thread-locals are gone, which panics and
/// aborts the worker whenever a thread that used one ends (a child's
/// thread, a drained worker thread). A static is never dropped, and a
/// connection over the cap is dropped in an ordinary call.
static KEPT: Mutex<Vec<(String, Duration, Connection)>> = Mutex::new(Vec::new());

/// The most connections [`with_thread`] keeps between uses (more are
/// closed): one per thread that reads at once is enough.
const KEPT_MAX: usize = 16;

/// Run `f` on a kept connection to `url` (made with
/// [`crate::connect_for`]`(url, lease)` when none is kept, and again after
/// one broke): the reads a worker thread makes for every session it drives
/// (a family's children, whether a row exists) cost no connect and no
/// schema check after the first. A connection whose use failed is
/// dropped, so the next call connects again.
pub fn with_thread<T>(
    url: &str,
    lease: Duration,
    f: impl FnOnce(&mut Connection) -> Result<T, PgError>,
) -> Result<T, PgError> {
    let taken = {
        let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = kept.iter().position(|(u, l, c)| u == url && *l == lease && !c.is_closed());
        i.map(|i| kept.swap_remove(i).2)
    };
    let mut conn = match taken {
        Some(c) => c,
        None => Connection::from(crate::connect_for(url, lease)?),
    };
    let out = f(&mut conn);
    if out.is_ok() && !conn.is_closed() {
        let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() < KEPT_MAX {
            kept.push((url.to_owned(), lease, conn));
            return out;
        }
    }
    out
}
