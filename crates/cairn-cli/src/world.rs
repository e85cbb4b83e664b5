//! `cairn world init|run`: a world of WASM actors (cairn-actors) driven by
//! the line console on standard input. Wiring only: the broker and the
//! console live in cairn-actors.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use crate::context::exit;

/// `cairn world …`.
#[derive(Debug, Subcommand)]
pub enum WorldAction {
    /// Create an empty world directory.
    Init {
        /// The world directory (default: ./world).
        dir: Option<PathBuf>,
    },
    /// Run the world; read console commands from standard input (/help).
    Run {
        /// The world directory (default: ./world).
        dir: Option<PathBuf>,
        /// Memory cap per actor instance, in MiB.
        #[arg(long, default_value_t = 64)]
        memory_mib: usize,
        /// Fuel per actor instance (default: unlimited; the epoch still applies).
        #[arg(long)]
        fuel: Option<u64>,
    },
}

/// Runs a `cairn world` command.
pub fn run(action: WorldAction) -> Result<u8> {
    let dir = |d: Option<PathBuf>| d.unwrap_or_else(|| PathBuf::from("world"));
    match action {
        WorldAction::Init { dir: d } => {
            let d = dir(d);
            cairn_actors::init(&d)?;
            println!("world ready in {}; run it with `cairn world run {}`", d.display(), d.display());
        }
        WorldAction::Run { dir: d, memory_mib, fuel } => {
            let cfg =
                cairn_actors::WorldConfig { limits: cairn_actors::Limits { memory_bytes: memory_mib << 20, fuel } };
            let world = cairn_actors::World::open(&dir(d), cfg)?;
            let stdin = std::io::stdin().lock();
            cairn_actors::console::run(world, stdin, &mut std::io::stdout().lock())?;
        }
    }
    Ok(exit::SUCCESS)
}
