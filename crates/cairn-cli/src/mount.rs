//! `cairn mount DIR`: the tree a running `cairn serve` serves, as a FUSE
//! file system (cairn-9p's `mount`, which forwards every operation over
//! 9P). Prints one line once mounted and unmounts on SIGINT/SIGTERM; after
//! a crash, `fusermount3 -u DIR` (or `umount DIR` as root) removes the
//! stale mount.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use cairn_9p::Dial;

use crate::invocation::{Invocation, exit};

/// `cairn mount`.
pub fn run(ctx: &Invocation, dir: &Path, address: Option<&str>) -> Result<u8> {
    let dial = match address {
        Some(a) => Dial::parse(a)?,
        None => Dial::Unix(ctx.paths.data.join("cairn.sock")),
    };
    if !dir.is_dir() {
        anyhow::bail!("{}: no such directory to mount on", dir.display());
    }
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .context("cannot install the SIGINT/SIGTERM handler")?;
    cairn_9p::mount::run(&dial, dir, || {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "mounted {dial} on {}", dir.display());
        let _ = out.flush();
        drop(out);
        let _ = stop_rx.recv();
    })
    .with_context(|| format!("cannot mount {dial} (is `cairn serve` running?)"))?;
    eprintln!("cairn mount: unmounted {}", dir.display());
    Ok(exit::SUCCESS)
}
