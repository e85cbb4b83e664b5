//! The PostgreSQL commands when cairn is built without the `postgres`
//! feature: each says how to get them. Nothing else.

use std::path::Path;

use anyhow::{Result, bail};

use crate::invocation::Invocation;

const OFF: &str = crate::parts::NO_POSTGRES;

/// Any whole number: `cairn worker` says what is missing when run.
pub fn lease_secs(text: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|e| format!("{e}"))
}

pub fn worker(_: Invocation, _: usize, _: u64) -> Result<u8> {
    bail!(OFF)
}

pub fn submit(_: &Invocation, _: Option<&str>, _: Option<String>, _: Option<&Path>) -> Result<u8> {
    bail!(OFF)
}

pub fn show(_: &Invocation, _: &str, _: bool, _: bool) -> Result<u8> {
    bail!(OFF)
}

pub fn log(_: &Invocation, _: &str, _: bool) -> Result<u8> {
    bail!(OFF)
}

pub fn export(_: &Invocation, _: &str) -> Result<u8> {
    bail!(OFF)
}

pub fn import(_: &Invocation, _: &Path, _: Option<&Path>) -> Result<u8> {
    bail!(OFF)
}

pub fn approvals(_: &Invocation) -> Result<u8> {
    bail!(OFF)
}

pub fn workers(_: &Invocation) -> Result<u8> {
    bail!(OFF)
}

pub fn requeue(_: &Invocation, _: &str) -> Result<u8> {
    bail!(OFF)
}

pub fn cancel(_: &Invocation, _: &str) -> Result<u8> {
    bail!(OFF)
}

pub fn approve(_: &Invocation, _: &str, _: &str, _: Option<&str>) -> Result<u8> {
    bail!(OFF)
}
