//! WASM actors for cairn (the "sausage" world): actors are WASI command
//! components talking newline-delimited JSON through a broker, with durable
//! mailboxes, versioned upgrades gated by transcript tests, restart backoff
//! and crash-loop rollback. This crate is a host: it owns processes,
//! threads and files, and uses `anyhow` at its edges.
//!
//! Modules: `message` (formats, ids), `cc` (the native C compiler
//! participant), `http` (the native HTTP participant), `layout` (world directory, registry,
//! path rules), `mailbox` (bounded durable queues), `queue` (bounded in-memory queues), `runtime` (wasmtime),
//! `commitfs` (commit-on-close files), `transcript` (upgrade gates),
//! `broker` (routing and lifecycle),
//! `console` (the line-oriented console of `cairn world run`), `tools`
//! (the agent's `actor_*` tools).

pub mod broker;
pub mod cc;
pub mod commitfs;
pub mod console;
pub mod http;
pub mod layout;
pub mod mailbox;
pub mod message;
pub mod queue;
pub mod runtime;
pub mod tools;
pub mod transcript;

pub use broker::{World, WorldConfig, init};
pub use runtime::Limits;
