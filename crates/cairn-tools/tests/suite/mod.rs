//! Integration suites: built-ins, the sandbox, external tools, limits.
mod builtins;
mod external;
mod isolation;
mod limits;
mod sandbox;
mod staged;
pub(crate) mod util;
