//! cairn-testtools's integration tests gathered into one test binary (each former
//! `tests/*.rs` file is a module), so a cold build links one binary, not
//! one per file. Files that must be their own process (they measure this
//! process's memory, or re-execute themselves by test name) stay their own
//! `[[test]]` targets in Cargo.toml.

#![allow(unreachable_pub, missing_debug_implementations)]

mod context;
mod crash_turn;
mod hostile_provider;
mod import_circles;
mod kill_staged;
mod turn;
