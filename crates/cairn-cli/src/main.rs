//! The `cairn` binary: argument parsing and wiring only; all logic lives in
//! the library crates.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("cairn: no commands yet")
}
