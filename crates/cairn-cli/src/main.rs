//! The `cairn` binary: argument parsing, configuration and wiring only. All
//! logic lives in the library crates (cairn-core drives the turn; this crate
//! supplies the provider, the tools, the terminal approver and the output).

// A binary has no public API: `pub` items in its modules are crate-wide.
#![allow(unreachable_pub)]

mod approver;
mod ask;
mod batch;
mod cli;
mod commands;
mod compaction;
mod faces;
mod highlight;
mod invocation;
mod lineedit;
mod listen;
mod markdown;
mod mount;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(not(feature = "postgres"))]
#[path = "pg_off.rs"]
mod pg;
mod render;
mod serve;
mod slash;
mod state;
mod status;
mod style;
mod toolsrv;
mod turns;
mod typeahead;
#[cfg(feature = "actors")]
mod world;

// The session runtime, under the names the binary's modules use for it.
use cairn_runtime::{
    config, discover, equip, escape, family, hosting, local, parts, paths, secrets, sessions, subagents, trust, undo,
};

use std::process::ExitCode;

fn main() -> ExitCode {
    // SAFETY: the first statement of `main`: cairn has a single thread, so
    // nothing reads the environment while credentials are taken out of it.
    if let Err(e) = unsafe { secrets::take_at_startup() } {
        eprintln!("error: cannot make cairn non-dumpable ({e}); refusing to run tools that could read its keys");
        return ExitCode::from(1);
    }
    cli::main()
}
