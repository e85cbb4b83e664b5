//! The `cairn` binary: argument parsing, configuration and wiring only. All
//! logic lives in the library crates (cairn-core drives the turn; this crate
//! supplies the provider, the tools, the terminal approver and the output).

// A binary has no public API: `pub` items in its modules are crate-wide.
#![allow(unreachable_pub)]

mod approver;
mod cli;
mod commands;
mod config;
mod context;
mod host;
mod local;
mod paths;
mod render;
mod sessions;
mod style;
mod trust;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
