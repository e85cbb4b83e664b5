//! Builds C test actors with Debian's clang and wasi-libc, independently of
//! the `cc` participant under test (the same flags a user would type).
//! Shared by cairn-actors' tests and cairn-cli's `world_console` (through
//! `#[path]`). Fails the test, never skips it, without clang.

use std::path::Path;

/// Compiles `src` (a `.c` file) into the WASI p1 module `out`.
#[allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]
pub fn build_c_actor(src: &Path, out: &Path) {
    let st = std::process::Command::new("clang")
        .args(["--target=wasm32-wasi", "--sysroot=/usr", "-O2"])
        .arg(src)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("clang is needed for C test actors (run ./scripts/ensure-wasi-clang): {e}"));
    assert!(st.success(), "clang failed to build {} (run ./scripts/ensure-wasi-clang)", src.display());
}
