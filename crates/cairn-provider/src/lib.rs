//! cairn-provider: the model providers behind `cairn_core::provider::Provider`.
//!
//! One adapter type, [`HttpProvider`], speaks the three HTTP APIs users
//! already have: OpenAI Chat Completions (and every server that speaks it:
//! Ollama, llama.cpp, vLLM, LM Studio), OpenAI Responses and Anthropic
//! Messages. [`ScriptedProvider`] replays a JSONL script for tests and demos.
//! Hosts turn a name into a provider with [`ProviderConfig::resolve`] and
//! [`build`].
//!
//! Design choices:
//! - `Provider::complete` is blocking, so the HTTP client is the blocking
//!   `ureq` (rustls): no async runtime. The socket is read on a worker
//!   thread and handed over a channel, so the calling thread can poll the
//!   cancel token and enforce first-byte and idle timeouts while the socket
//!   blocks.
//! - SSE framing is parsed here ([`sse`]), incrementally and bounded, because
//!   every failure mode of a hostile stream must map to a clear error.
//! - The settled message is built only after the API's terminal event, so a
//!   cut or malformed stream never settles half an answer; every attempt,
//!   failed ones included, yields one `AttemptUsage` row.
//! - Keys live in [`Secret`], which never prints itself; error texts are
//!   scrubbed of the key before they leave the crate.
//!
//! # Layout
//! - [`config`]: names, `[providers.NAME]` tables, environment conventions,
//!   [`build`].
//! - `http`: [`HttpProvider`] and the attempt loop (retries, backoff, rows).
//! - `transport`: the blocking request on its worker thread.
//! - [`retry`]: retryable statuses, backoff with jitter, `retry-after`.
//! - [`sse`]: server-sent events framing.
//! - `wire`: request bodies and stream decoders of the three APIs.
//! - `scripted`: [`ScriptedProvider`].
//! - [`secret`]: the [`Secret`] type for keys.
#![deny(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod config;
mod http;
pub mod retry;
pub mod scripted;
pub mod secret;
pub mod sse;
mod transport;
mod wire;

pub use config::{BUILTIN_NAMES, ConfigError, ProviderConfig, ProviderKind, ProviderTable, Timeouts, build};
pub use http::HttpProvider;
pub use retry::RetryPolicy;
pub use scripted::ScriptedProvider;
pub use secret::Secret;
