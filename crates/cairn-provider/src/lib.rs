//! cairn-provider: the model providers behind `cairn_core::provider::Provider`.
//!
//! One adapter type, [`HttpProvider`], speaks the three HTTP APIs users
//! already have: OpenAI Chat Completions (and every server that speaks it:
//! Ollama, llama.cpp, vLLM, LM Studio), OpenAI Responses and Anthropic
//! Messages. [`ScriptFileProvider`] replays a JSONL script file for tests and
//! demos.
//! Hosts turn a name into a provider with [`ProviderConfig::resolve`] and
//! [`build`].
//!
//! Design choices:
//! - `Provider::complete` is blocking, so the HTTP client is the blocking
//!   `ureq` (rustls): no async runtime. The socket is read on a worker
//!   thread and handed over a channel, so the calling thread can poll the
//!   cancel token and enforce the first-byte, idle and total deadlines while
//!   the socket blocks.
//! - A hostile or broken server is bounded: the idle timeout counts only
//!   content (keepalive comments and empty events do not reset it), a total
//!   deadline bounds each call, the content of one answer is capped
//!   (`max_response_bytes`) and so is each server-sent event; the turn runs
//!   at most [`ProviderConfig::max_tool_calls`] calls of one answer.
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
//!   defaults and limits (the bottom layer).
//! - `factory`: [`build`], a config to a ready provider (the top layer).
//! - `http`: [`HttpProvider`] and the attempt loop (retries, backoff, rows).
//! - `transport`: the blocking request on its worker thread.
//! - [`retry`]: retryable statuses, backoff with jitter, `retry-after`.
//! - [`sse`]: server-sent events framing.
//! - `wire`: request bodies and stream decoders of the three APIs.
//! - [`price`]: prices the user states per provider, and cost sums.
//! - [`script_file`]: [`ScriptFileProvider`] and the script line format.
//! - [`secret`]: the [`Secret`] type for keys.
#![deny(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod config;
mod factory;
mod http;
pub mod price;
pub mod retry;
pub mod script_file;
pub mod secret;
pub mod sse;
mod transport;
pub mod window;
mod wire;

pub use config::{BUILTIN_NAMES, ConfigError, ProviderConfig, ProviderKind, ProviderTable, Timeouts, Unpriced};
pub use factory::build;
pub use http::HttpProvider;
pub use price::{Prices, Usd, UsdPerMtok};
pub use retry::RetryPolicy;
pub use script_file::ScriptFileProvider;
pub use secret::Secret;
