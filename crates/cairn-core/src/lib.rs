//! cairn-core: the pure heart of cairn.
//!
//! It owns the durable session store, the neutral message model, the
//! provider/tool/approver contracts and the turn loop that drives them. It
//! performs no terminal I/O, no HTTP, no process spawning and never panics:
//! every fallible operation returns a `Result` with a per-module error enum.
//! Hosts (the CLI, a 9P server, an embedder) inject providers, tools and
//! approvers through the traits defined here.
//!
//! # Layout
//! - [`storage`]: the session file (records, the `Storage` trait, backends).
//! - [`message`]: the neutral conversation model every provider converts from.
//! - [`provider`]: the `Provider` trait (one model call, streamed).
//! - [`tool`]: the tool contract (Correx vocabulary: request, receipt, risk,
//!   capabilities, replay policy).
//! - [`approval`]: the `Approver` trait, the approval gate and the allowlist.
//! - [`authority`]: which paths configure later execution (issue 46).
//! - [`cancel`]: the cooperative cancellation token.
//! - [`schema`]: argument validation against a tool's JSON schema (subset).
//! - [`registry`]: the tools a session offers, by name.
//! - [`events`]: lifecycle entry payloads and the observer's [`TurnEvent`]s.
//! - [`history`]: the events a log re-tells, for readers that arrive late.
//! - [`report`]: the read side every face shares: usage totals, a
//!   session's descendants, its last answer.
//! - [`projection`]: the `ToolState` reducer over the log.
//! - [`turn`]: the [`Session`], its state machine, the effect sandwich and
//!   resume.
#![deny(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod approval;
pub mod authority;
pub mod cancel;
pub mod context;
pub mod elicit;
pub mod events;
pub mod history;
pub mod hooks;
mod idset;
pub mod message;
mod payload_shape;
pub mod projection;
pub mod provider;
pub mod registry;
pub mod report;
pub mod risk;
pub mod schema;
pub mod staged;
pub mod storage;
pub mod tool;
pub mod turn;
pub mod undo;

pub use cancel::CancelToken;
pub use events::TurnEvent;
pub use payload_shape::{ToolCompletedLine, tool_completed_line};
pub use registry::{RegistryError, ToolRegistry};
pub use turn::{PromptTooLarge, Reopen, Session, SessionConfig, TurnEnv, TurnError, TurnOutcome, TurnStop};
