//! `cairn serve`: the 9P control plane (crate `cairn-9p`) over this
//! `$CAIRN_HOME`, with each turn equipped as every face's is
//! (`hosting.rs`; this file adds what the tree needs besides:
//! `cairn_9p::Host`). Owns: the one-server-per-home lock
//! (`$CAIRN_HOME/serve.lock`, holding the pid and addresses), binding the
//! listeners, and the clean shutdown on SIGINT/SIGTERM (running turns are
//! cancelled and settled durably; `ctl resume` or `cairn resume` continues
//! them).

use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use cairn_9p::{Dial, Limits, Runtime, Server};

use crate::hosting::RuntimeHost;
use crate::invocation::{Invocation, exit};
use crate::listen::{bind_all, print_addresses, remove_sockets, stop_signal};

/// Whether the server a lock file names (`pid N on …`, written by
/// `ServeLock::record`) no longer exists. False when it names none (a
/// `cairn batch`, or a server still starting): then the lock is live.
fn holder_is_gone(text: &str) -> bool {
    let pid =
        text.strip_prefix("pid ").and_then(|rest| rest.split_whitespace().next()).and_then(|p| p.parse::<u32>().ok());
    pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// The one-server-per-home lock, held while serving (and by `cairn batch`,
/// which runs the same queue).
pub(crate) struct ServeLock {
    file: std::fs::File,
}

impl ServeLock {
    pub(crate) fn take(data: &Path) -> Result<Self> {
        let path = data.join("serve.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        // A server killed a moment ago can leave its lock held for a few
        // milliseconds more by processes it forked (a sandbox's waiter, a
        // probe) that are still being torn down: when the pid the lock
        // records is gone, wait for them, briefly. A live holder is
        // refused at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while file.try_lock().is_err() {
            let mut holder = String::new();
            file.rewind()?;
            let _ = file.read_to_string(&mut holder);
            if holder_is_gone(&holder) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            let holder = holder.trim().replace('\n', ", ");
            bail!(
                "another cairn serve is already serving {} ({}); stop it first (kill -INT PID) or connect to it",
                data.display(),
                if holder.is_empty() { "pid unknown".to_owned() } else { holder }
            );
        }
        Ok(Self { file })
    }

    fn record(&mut self, addresses: &[Dial]) -> Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        writeln!(self.file, "pid {} on {}", std::process::id(), list.join(" "))?;
        self.file.sync_all()?;
        Ok(())
    }
}

/// `cairn serve`.
pub fn run(ctx: Invocation, listen: &[String], insecure: bool, handshake_timeout: Duration) -> Result<u8> {
    let data = ctx.paths.data.clone();
    let mut dials = listen.iter().map(|d| Dial::parse(d)).collect::<Result<Vec<_>>>()?;
    if dials.is_empty() {
        // The default socket lives in cairn's own data directory, which is
        // made private (9P has no authentication here).
        std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
        let mode = std::fs::metadata(&data)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))?;
            eprintln!("cairn serve: made {} private (mode 700) for its socket", data.display());
        }
        dials.push(Dial::Unix(data.join("cairn.sock")));
    }
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    let mut lock = ServeLock::take(&data)?;
    let (listeners, addresses) = bind_all(&dials, insecure)?;
    lock.record(&addresses)?;
    let runtime = Runtime::new(Arc::new(RuntimeHost { ctx: ctx.setup }));
    let server = Server::new(Arc::clone(&runtime), Limits { handshake_timeout, ..Limits::default() });
    let stop = stop_signal()?;
    for listener in listeners {
        server.spawn(listener)?;
    }
    print_addresses(&addresses)?;
    // Prompts queued before a crash or a stop run now, in idle sessions.
    runtime.start_queues();
    let _ = stop.recv();
    eprintln!("cairn serve: stopping; running turns are cancelled and saved (continue them with ctl resume)");
    runtime.shutdown();
    remove_sockets(&addresses);
    drop(lock);
    Ok(exit::SUCCESS)
}
