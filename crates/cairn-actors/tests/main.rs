//! cairn-actors's integration tests gathered into one test binary (each former
//! `tests/*.rs` file is a module), so a cold build links one binary, not
//! one per file. Files that must be their own process (they measure this
//! process's memory, or re-execute themselves by test name) stay their own
//! `[[test]]` targets in Cargo.toml.

#![allow(unreachable_pub, missing_debug_implementations)]

mod cc;
mod commitfs;
mod common;
mod tools;
mod upgrade;
mod world;
