//! A connection with the statements prepared on it ([`Connection`]), what
//! cairn-pg's functions run their SQL through ([`Db`]), and one
//! connection per thread for short reads ([`with_thread`]).
//!
//! Why: a statement sent as text is prepared afresh every time (a parse, a
//! plan and one more round trip each); a worker runs the same few dozen
//! statements for every session it drives, so they are prepared once per
//! connection and reused. A prepared statement belongs to the connection it
//! was prepared on, so the cache lives beside its client and dies with it
//! (a reconnect starts a new one). It owns no SQL of its own and decides
//! nothing about sessions.

use std::cell::RefCell;
use std::collections::HashMap;
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

thread_local! {
    /// This thread's connection for short reads (URL, lease, connection).
    static THREAD: RefCell<Option<(String, Duration, Connection)>> = const { RefCell::new(None) };
}

/// Run `f` on this thread's connection to `url` (made with
/// [`crate::connect_for`]`(url, lease)` the first time, and again after it
/// broke): the reads a worker thread makes for every session it drives (a
/// family's children, whether a row exists) cost no connect and no schema
/// check after the first. A connection whose use failed is dropped, so the
/// next call connects again.
pub fn with_thread<T>(
    url: &str,
    lease: Duration,
    f: impl FnOnce(&mut Connection) -> Result<T, PgError>,
) -> Result<T, PgError> {
    let taken = THREAD.with(|slot| slot.borrow_mut().take());
    let mut conn = match taken {
        Some((u, l, c)) if u == url && l == lease && !c.is_closed() => c,
        _ => Connection::from(crate::connect_for(url, lease)?),
    };
    let out = f(&mut conn);
    if out.is_ok() && !conn.is_closed() {
        THREAD.with(|slot| *slot.borrow_mut() = Some((url.to_owned(), lease, conn)));
    }
    out
}
