//! The one tokio runtime cairn-mcp's SDK (rmcp) runs on, for server
//! connections and `cairn mcp login` alike. Owns only its creation; it
//! must not hold anything of a server's (connections live in
//! `connection.rs`, logins in `login.rs`).

use std::sync::OnceLock;

/// The process-wide runtime the SDK runs on: one worker thread that lives
/// as long as cairn, which is also the thread every stdio server is spawned
/// from (a server's `PR_SET_PDEATHSIG` follows the spawning thread).
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            // https servers: reqwest is built without a TLS provider (see
            // Cargo.toml); ring is installed once for the process (an error
            // means one is installed already, which is as good).
            let _ = rustls::crypto::ring::default_provider().install_default();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("cairn-mcp")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the MCP client runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}
