//! cairn's 9P control plane: the session tree (`tree`), the sessions it
//! drives (`live`), and the 9P2000 server that serves it (`server`), a
//! second host over cairn-core next to the CLI.
//!
//! This crate owns the shape and semantics of the tree and the protocol
//! loop. It does not build providers or tools itself: the embedding binary
//! supplies them through [`Host`], so configuration is read in one place
//! (the CLI's). It keeps no state of its own beside the session files and
//! the batch queue's job directories (`batch`): everything a reader sees is
//! derived from them or from the turn running right now.
//!
//! Who may connect at all (the same uid as the server, and no process
//! cairn started as a tool) is decided in one place, [`peer`], for both
//! servers and both kinds of listener.

pub mod approver;
pub mod batch;
pub mod client;
pub mod dial;
pub mod host;
pub mod live;
#[cfg(feature = "mount")]
pub mod mount;
pub mod peer;
pub mod queue;
pub mod server;
pub mod toolsrv;
pub mod tree;

pub use dial::Dial;
pub use host::{Host, SessionSpec};
pub use live::Runtime;
pub use server::{Limits, Server};
