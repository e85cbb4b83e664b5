//! A SIGKILL of the host process mid-write leaves the old or the new file,
//! never a mix, and the temp files it leaves are removed before the actor
//! runs again.
//!
//! Needs a real separate process, so this test target has no harness: run
//! plainly it is the parent; it re-executes itself with
//! `CAIRN_COMMIT_KILL_CHILD=<world dir>` to be a child that opens the world
//! (whose actor `writer`, `tests/actors/writer.c`, rewrites a 4 MiB file in
//! a loop, one letter per generation) and waits to be killed. The parent
//! kills children at random moments after their actor committed at least
//! once, and checks the file after every kill and every time it looks at
//! it while a child runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "common/clang.rs"]
mod clang;

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_actors::{World, WorldConfig};
use serde_json::json;

const CHILD: &str = "CAIRN_COMMIT_KILL_CHILD";
const SPAWN: &str = "CAIRN_COMMIT_KILL_SPAWN";
const SIZE: usize = 4 << 20;
const ROUNDS: usize = 8;
const TMP_PREFIX: &str = cairn_actors::commitfs::TMP_PREFIX;

fn main() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir));
        return;
    }
    parent();
}

/// Opens the world (spawning `writer` if asked) and waits to be killed.
fn child(dir: &Path) {
    let world = World::open(dir, WorldConfig::default()).unwrap();
    if let Ok(wasm) = std::env::var(SPAWN) {
        let r =
            world.request(json!({"type": "spawn", "id": "writer", "wasm": wasm}), Duration::from_secs(120)).unwrap();
        assert_eq!(r["type"], "ok", "{r}");
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A child world that is SIGKILLed when dropped, so a failing check never
/// leaves one running.
struct ChildWorld(Child);

impl Drop for ChildWorld {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The generation letter of a complete file; panics on a mix or a short
/// file (`None`: no file yet).
fn check(path: &Path, when: &str) -> Option<u8> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    assert_eq!(bytes.len(), SIZE, "{when}: the file is {} bytes, not {SIZE}: a partial write", bytes.len());
    let first = bytes[0];
    assert!(first.is_ascii_lowercase(), "{when}: unexpected byte {first}");
    if let Some(i) = bytes.iter().position(|b| *b != first) {
        panic!("{when}: the file mixes generations: {:?} at 0, {:?} at {i}", first as char, bytes[i] as char);
    }
    Some(first)
}

fn temps(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(TMP_PREFIX))
        .collect()
}

/// Waits (checking the file each time) until it holds a generation other
/// than `before`; fails if the child dies or after 120 s.
fn wait_new_generation(big: &Path, before: Option<u8>, mut child: Option<&mut Child>, round: usize) -> u8 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(g) = check(big, &format!("round {round}, while the writer runs"))
            && Some(g) != before
        {
            return g;
        }
        if let Some(c) = child.as_deref_mut()
            && let Some(st) = c.try_wait().unwrap()
        {
            panic!("round {round}: the child world exited ({st}) before its actor wrote");
        }
        assert!(Instant::now() < deadline, "round {round}: no new generation within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn parent() {
    let base = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/actors/writer.c");
    let wasm = base.path().join("writer.wasm");
    clang::build_c_actor(&src, &wasm);
    let root = base.path().join("w");
    cairn_actors::init(&root).unwrap();
    let data = root.join("data/writer");
    let big = data.join("big");
    let exe = std::env::current_exe().unwrap();
    let mut leftovers = Vec::new();
    let mut before = None;
    for round in 0..ROUNDS {
        let mut cmd = Command::new(&exe);
        cmd.env(CHILD, &root).stdin(Stdio::null()).stdout(Stdio::null());
        if round == 0 {
            cmd.env(SPAWN, &wasm);
        }
        let mut child = ChildWorld(cmd.spawn().unwrap());
        let g = wait_new_generation(&big, before, Some(&mut child.0), round);
        // A random moment within the next generations' writes.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(round);
        std::thread::sleep(Duration::from_millis(h.finish() % 150));
        child.0.kill().unwrap(); // SIGKILL
        child.0.wait().unwrap();
        let after = check(&big, &format!("round {round}, after SIGKILL")).unwrap();
        println!("round {round}: saw {:?}, after the kill {:?}", g as char, after as char);
        leftovers.extend(temps(&data));
        before = Some(after);
    }
    println!("{} temp files left by the killed hosts", leftovers.len());
    // The next world removes the leftovers before its writer starts, and a
    // graceful quit (the writer is killed after 5 s: it never reads stdin)
    // discards the write in progress.
    let world = World::open(&root, WorldConfig::default()).unwrap();
    wait_new_generation(&big, before, None, ROUNDS);
    for l in &leftovers {
        assert!(!l.exists(), "{} survived the next start", l.display());
    }
    world.quit();
    check(&big, "after the last quit").unwrap();
    assert_eq!(temps(&data), Vec::<PathBuf>::new());
    println!("commit_kill: {ROUNDS} SIGKILLs, the file was always one whole generation");
}
