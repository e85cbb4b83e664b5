//! The `cairn` binary: argument parsing, configuration and wiring only. All
//! logic lives in the library crates (cairn-core drives the turn; this crate
//! supplies the provider, the tools, the terminal approver and the output).

mod approver;
mod cli;
mod commands;
mod config;
mod paths;
mod style;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
