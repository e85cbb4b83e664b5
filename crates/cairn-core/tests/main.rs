//! cairn-core's integration tests gathered into one test binary (each former
//! `tests/*.rs` file is a module), so a cold build links one binary, not
//! one per file. Files that must be their own process (they measure this
//! process's memory, or re-execute themselves by test name) stay their own
//! `[[test]]` targets in Cargo.toml.

#![allow(unreachable_pub, missing_debug_implementations)]

// The storage conformance suite (shared with cairn-pg's tests); its
// `conformance!` macro names `$crate::conformance`.
#[macro_use]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod conformance;

mod allowlist_bash;
mod storage;
mod storage_hostile;
mod storage_props;
