//! How cairn builds and runs a session, for every face that runs one: the
//! `cairn` command's own turns (`run`, `chat`, `resume`, `ask`), the 9P
//! tree and its batch queue, ACP and MCP, PostgreSQL workers and the
//! actors' agent. From the resolved configuration ([`setup`],
//! [`config`], [`paths`]) it builds a session's parts ([`parts`]: the
//! provider, the approval policy, the settings, the session file), reads a
//! turn's tools once, in-process or from a tool service ([`toolsrv`], its
//! client), into one carrier ([`tools`]), records discovery's choice
//! ([`discover`]), adds
//! the subagent family and its peer links ([`subagents`], [`peers`],
//! [`family`]) and the hooks, in one place ([`equip`]); it keeps undo's
//! pre-images ([`undo`]) and the trusted workspaces ([`trust`]), and
//! implements `cairn_host::SessionHost` once ([`hosting`]) so the faces,
//! which depend only on that trait, all get the same session.
//!
//! Its API is data: functions take the resolved settings ([`setup`]:
//! plain structs, no command line) and return values; the commands over
//! its own state (`cairn trust`, `cairn sessions`, `cairn undo`, `cairn
//! tools --discover`, `cairn model install`) return what they found or
//! did, one function each whatever the backend keeps the sessions, and
//! notes on the way go to the embedder's `setup::Notes`.
//!
//! Must not: parse a command line (no clap), print or hold stdout/stderr
//! (the CLI renders results, `--json` included), speak a face's protocol,
//! render a turn or ask a person (the faces and the binary do: their
//! approver and observer). Checked by cairn-testtools' `import_circles.rs`
//! (`the_runtime_does_not_depend_on_clap`, `the_runtime_does_not_print`).

pub mod config;
pub mod discover;
pub mod equip;
pub mod escape;
pub mod family;
pub mod hosting;
pub mod local;
pub mod parts;
pub mod paths;
pub mod peers;
pub mod redact;
pub mod secrets;
pub mod sessions;
pub mod setup;
pub mod subagents;
pub mod telemetry;
pub mod tools;
pub mod toolsrv;
pub mod trust;
pub mod undo;

/// What every face's turns run with and how a turn is started: the one
/// place core's `TurnEnv` is put together (cairn-host's `running.rs`);
/// the host contract a face equips its turns through.
pub use cairn_host::{Equipment, HostTools, SessionHost, Step};
