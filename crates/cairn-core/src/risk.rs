//! The risk tier every tool call has: its own module because the tool
//! contract, approvals and the staged-effect rules all name it and none of
//! them may depend on the others for it. It holds no rule about what a tier
//! needs (that is `approval::gate`).

use serde::{Deserialize, Serialize};

/// Risk tier. tole's ReadOnly/Write/Destructive ≙ Correx T0/T2/T4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Risk {
    /// T0: runs without approval.
    ReadOnly,
    /// T2: needs approval unless allowlisted.
    Write,
    /// T4: always needs an interactive approval; never allowlisted.
    Destructive,
}

impl Risk {
    /// The Correx tier label ("T0", "T2", "T4").
    pub fn tier(self) -> &'static str {
        match self {
            Risk::ReadOnly => "T0",
            Risk::Write => "T2",
            Risk::Destructive => "T4",
        }
    }
}
