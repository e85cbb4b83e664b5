//! The MCP servers of this process: one running connection per server,
//! working directory and configuration, shared by every session and turn
//! that uses them, started on first use and restarted when found dead (at
//! most once per turn during calls; the restart is reported).
//!
//! It must not decide what a tool may do (`tool.rs`) or how a server is
//! started (`connection.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cairn_tools::ToolsConfig;
use sha2::Digest as _;

use crate::config::ServerConfig;
use crate::connection::{Connection, ServerError};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One server for one working directory.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) name: String,
    config: ServerConfig,
    cwd: PathBuf,
    tools: ToolsConfig,
    conn: Mutex<Option<Arc<Connection>>>,
}

type Key = (String, PathBuf, String);

/// The slot for `name` with `config` in `cwd` (a changed configuration is
/// a different server).
pub(crate) fn slot(name: &str, config: &ServerConfig, cwd: &Path, tools: &ToolsConfig) -> Arc<Slot> {
    static POOL: OnceLock<Mutex<HashMap<Key, Arc<Slot>>>> = OnceLock::new();
    // Values a client gave are part of what makes the server (two
    // sessions giving different tokens get two servers), kept as a digest.
    let values =
        sha2::Sha256::digest(serde_json::to_vec(&(&config.env_values, &config.header_values)).unwrap_or_default());
    let fingerprint = format!("{}{values:x}", serde_json::to_string(config).unwrap_or_default());
    let key = (name.to_owned(), cwd.to_path_buf(), fingerprint);
    let mut pool = lock(POOL.get_or_init(Mutex::default));
    pool.entry(key)
        .or_insert_with(|| {
            Arc::new(Slot {
                name: name.to_owned(),
                config: config.clone(),
                cwd: cwd.to_path_buf(),
                tools: tools.clone(),
                conn: Mutex::new(None),
            })
        })
        .clone()
}

/// What [`Slot::ensure`] found.
#[derive(Debug)]
pub(crate) enum Found {
    /// It was running.
    Running(Arc<Connection>),
    /// It was started now (first use).
    Started(Arc<Connection>),
    /// It had died and was started again; why it died.
    Restarted(Arc<Connection>, String),
}

impl Found {
    pub(crate) fn connection(&self) -> &Arc<Connection> {
        match self {
            Found::Running(c) | Found::Started(c) | Found::Restarted(c, _) => c,
        }
    }
}

impl Slot {
    /// The running connection, started (or restarted, when `restart` allows
    /// it) if needed. One start at a time per slot.
    pub(crate) fn ensure(&self, restart: bool) -> Result<Found, ServerError> {
        let mut conn = lock(&self.conn);
        let died = match conn.as_ref() {
            Some(c) => match c.alive() {
                Ok(()) => return Ok(Found::Running(c.clone())),
                Err(why) => Some(why),
            },
            None => None,
        };
        if let Some(why) = &died
            && !restart
        {
            return Err(ServerError::Gone {
                server: self.name.clone(),
                reason: format!("{why}; it was already restarted once this turn"),
            });
        }
        // Dropping the old connection kills what is left of its process.
        *conn = None;
        let fresh = Arc::new(Connection::start(&self.name, &self.config, &self.cwd, &self.tools)?);
        *conn = Some(fresh.clone());
        Ok(match died {
            Some(why) => Found::Restarted(fresh, why),
            None => Found::Started(fresh),
        })
    }

    /// Whether its server is running now (started and not found dead).
    pub(crate) fn is_running(&self) -> bool {
        lock(&self.conn).as_ref().is_some_and(|c| c.alive().is_ok())
    }

    /// The server's configuration.
    pub(crate) fn config(&self) -> &ServerConfig {
        &self.config
    }
}
