//! Listening for a server (`cairn serve`, `cairn toolsrv`): binding every
//! address, the stop signal (SIGINT/SIGTERM), printing the addresses and
//! removing unix sockets afterwards. It knows nothing of what is served.

use std::io::Write as _;

use anyhow::{Context as _, Result};
use cairn_9p::Dial;

/// Bind every dial string (the loopback rule unless `insecure`); the
/// listeners and the addresses they actually serve.
pub(crate) fn bind_all(dials: &[Dial], insecure: bool) -> Result<(Vec<cairn_9p::server::Listener>, Vec<Dial>)> {
    let mut listeners = Vec::new();
    let mut addresses = Vec::new();
    for dial in dials {
        let (listener, actual) = cairn_9p::server::Listener::bind(dial, insecure)?;
        listeners.push(listener);
        addresses.push(actual);
    }
    Ok((listeners, addresses))
}

/// A channel that receives once on SIGINT or SIGTERM.
pub(crate) fn stop_signal() -> Result<std::sync::mpsc::Receiver<()>> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .context("cannot install the SIGINT/SIGTERM handler")?;
    Ok(stop_rx)
}

/// Print the served addresses, one a line (what clients and tests wait for).
pub(crate) fn print_addresses(addresses: &[Dial]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for address in addresses {
        writeln!(out, "{address}")?;
    }
    out.flush()?;
    Ok(())
}

/// Remove the Unix sockets among `addresses` (on a clean stop).
pub(crate) fn remove_sockets(addresses: &[Dial]) {
    for address in addresses {
        if let Dial::Unix(path) = address {
            let _ = std::fs::remove_file(path);
        }
    }
}
