//! The integration tests of cairn-tools: real processes, real Landlock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod suite;
