#![allow(clippy::unwrap_used)]
mod util;
