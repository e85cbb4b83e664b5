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
mod config;
mod context;
mod discover;
mod equip;
mod escape;
mod faces;
mod family;
mod highlight;
mod host;
mod hosting;
mod lineedit;
mod listen;
mod local;
mod markdown;
mod mount;
mod paths;
mod peers;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(not(feature = "postgres"))]
#[path = "pg_off.rs"]
mod pg;
mod redact;
mod render;
mod secrets;
mod serve;
mod sessions;
mod slash;
mod status;
mod style;
mod subagents;
mod toolsrv;
mod trust;
mod undo;
mod wiring;
#[cfg(feature = "actors")]
mod world;

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
