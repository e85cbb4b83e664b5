//! A hostile tool against the apply step of staged effects (issue 25),
//! with the real `cairn` binary, headless under `--yes` and under `--allow 'shell(*)'`: each test performs
//! an attack a tool can plan across calls and checks from the outside
//! (files beyond the tree, the tree byte for byte with modes and link
//! targets, allocated blocks) that it got nothing.
//!
//! - a link planted at the name cairn used to write its temporary to
//!   (`.x.cairn-apply`) must not carry the staged bytes outside the tree;
//! - setuid/setgid bits are never applied;
//! - a sparse file stays sparse;
//! - a FIFO left by a command, or one in the tree, never hangs cairn and
//!   is never applied;
//! - a file name cannot forge a line of cairn's own listing.
//!
//! Each runs as root and again as uid 65534 (staging through an
//! unprivileged user namespace). These need overlay staging; where `cairn
//! tools` says it is unavailable they fail with that reason.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::{Env, entries, require_staging, snapshot};

/// The entries of the one session file.
fn session_log(env: &Env) -> Vec<Value> {
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    entries(&files[0])
}

/// Run one shell call per command, in order, in one headless turn under
/// `flags` (each of [`FLAGS`]); cairn's stdout and stderr. A cairn that has not finished after
/// two minutes has hung (the FIFO attack): it is killed and the test fails.
fn run_calls(env: &Env, flags: &[&str], commands: &[&str]) -> String {
    let mut lines: Vec<Value> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"text": "", "toolCalls": [{"id": format!("c{i}"), "name": "shell", "arguments": {"command": c}}]})
        })
        .collect();
    lines.push(json!({"text": "done"}));
    let script = env.script(&lines);
    for f in env.session_files() {
        std::fs::remove_file(f).unwrap();
    }
    let mut child = env
        .cairn(&[&["--script", script.to_str().unwrap()][..], flags, &["run", "go"][..]].concat())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cairn hung on {commands:?} (killed after two minutes)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The headless approvals a hostile model's user may give: neither lets an
/// attack through.
const FLAGS: [&[&str]; 2] = [&["--yes"], &["--allow", "shell(*)"]];

fn types(log: &[Value]) -> Vec<String> {
    log.iter().map(|e| e["type"].as_str().unwrap_or("").to_owned()).collect()
}

fn count(log: &[Value], kind: &str) -> usize {
    log.iter().filter(|e| e["type"] == kind).count()
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".cairn-apply-"))
        .collect()
}

#[test]
fn a_planted_link_at_the_temporary_name_never_receives_the_apply() {
    for flags in FLAGS {
        a_planted_link_at_the_temporary_name_never_receives_the_apply_with(flags);
    }
}

fn a_planted_link_at_the_temporary_name_never_receives_the_apply_with(flags: &[&str]) {
    let env = Env::new();
    require_staging(&env);
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    let secret2 = outside.path().join("secret2.txt");
    std::fs::write(&secret, "secret\n").unwrap();
    std::fs::write(&secret2, "second secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Planted before the session (a tool of an earlier session, or the
    // first call below): links at the names the old apply wrote through.
    std::fs::write(env.cwd.join("b.txt"), "b\n").unwrap();
    std::os::unix::fs::symlink(&secret2, env.cwd.join(".b.txt.cairn-apply")).unwrap();
    let plant = format!("ln -s {} .x.cairn-apply", secret.display());
    let log_text = run_calls(&env, flags, &[&plant, "printf 'owned\\n' > x; chmod 755 x", "echo more >> b.txt"]);
    let log = session_log(&env);
    assert_eq!(count(&log, "toolCompleted"), 3, "{:?}\n{log_text}", types(&log));
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret\n", "the staged bytes landed outside the tree");
    assert_eq!(std::fs::metadata(&secret).unwrap().mode() & 0o7777, 0o600, "the mode landed outside the tree");
    assert_eq!(std::fs::read_to_string(&secret2).unwrap(), "second secret\n");
    let x = std::fs::symlink_metadata(env.cwd.join("x")).unwrap();
    assert!(x.is_file(), "x is not a regular file");
    assert_eq!(x.mode() & 0o7777, 0o755);
    assert_eq!(std::fs::read_to_string(env.cwd.join("x")).unwrap(), "owned\n");
    let b = std::fs::symlink_metadata(env.cwd.join("b.txt")).unwrap();
    assert!(b.is_file(), "b.txt became a link");
    assert_eq!(std::fs::read_to_string(env.cwd.join("b.txt")).unwrap(), "b\nmore\n");
    // The tool's own links are left as they are, and no temporary is.
    assert_eq!(std::fs::read_link(env.cwd.join(".x.cairn-apply")).unwrap(), secret);
    assert_eq!(std::fs::read_link(env.cwd.join(".b.txt.cairn-apply")).unwrap(), secret2);
    assert!(leftovers(&env.cwd).is_empty(), "{:?}", leftovers(&env.cwd));
}

#[test]
fn setuid_and_setgid_bits_are_never_applied() {
    for flags in FLAGS {
        setuid_and_setgid_bits_are_never_applied_with(flags);
    }
}

fn setuid_and_setgid_bits_are_never_applied_with(flags: &[&str]) {
    let env = Env::new();
    require_staging(&env);
    run_calls(
        &env,
        flags,
        &[
            "cp /usr/bin/id ./myid && chmod 4755 myid && mkdir sg && chmod 2775 sg && cp myid sg/gid && chmod 2755 sg/gid",
        ],
    );
    let log = session_log(&env);
    assert_eq!(count(&log, "toolCompleted"), 1, "{:?}", types(&log));
    for (path, mode) in [("myid", 0o755), ("sg", 0o775), ("sg/gid", 0o755)] {
        let got = std::fs::symlink_metadata(env.cwd.join(path)).unwrap().mode() & 0o7777;
        assert_eq!(got, mode, "{path}: mode {got:o}");
    }
    assert_eq!(std::fs::read(env.cwd.join("myid")).unwrap(), std::fs::read("/usr/bin/id").unwrap());
}

#[test]
fn a_sparse_file_stays_sparse() {
    for flags in FLAGS {
        a_sparse_file_stays_sparse_with(flags);
    }
}

fn a_sparse_file_stays_sparse_with(flags: &[&str]) {
    let env = Env::new();
    require_staging(&env);
    run_calls(&env, flags, &["truncate -s 1G big && printf end >> big"]);
    let log = session_log(&env);
    assert_eq!(count(&log, "toolCompleted"), 1, "{:?}", types(&log));
    let meta = std::fs::metadata(env.cwd.join("big")).unwrap();
    assert_eq!(meta.len(), (1 << 30) + 3);
    let allocated = meta.blocks() * 512;
    assert!(allocated < 1 << 20, "1 GiB of holes became {allocated} allocated bytes");
}

#[test]
fn a_fifo_never_hangs_cairn_and_is_never_applied() {
    for flags in FLAGS {
        a_fifo_never_hangs_cairn_and_is_never_applied_with(flags);
    }
}

fn a_fifo_never_hangs_cairn_and_is_never_applied_with(flags: &[&str]) {
    let env = Env::new();
    require_staging(&env);
    std::fs::write(env.cwd.join("keep.txt"), "keep\n").unwrap();
    let before = snapshot(&env.cwd);
    let output = run_calls(&env, flags, &["mkfifo p && echo new > new.txt"]);
    let log = session_log(&env);
    let rejected = log.iter().find(|e| e["type"] == "toolRejected").unwrap_or_else(|| {
        panic!("the FIFO's change set was not refused: {:?}\n{output}", types(&log));
    });
    let reason = rejected["payload"]["reason"].as_str().unwrap();
    assert!(reason.contains("FIFO") && reason.contains("nothing was applied"), "{reason}");
    assert_eq!(snapshot(&env.cwd), before, "part of the change set was applied");

    // A FIFO already in the tree, which a command replaces: read without
    // opening it (a deletion of what existed: Destructive, refused
    // headless).
    let made = std::process::Command::new("mkfifo").arg(env.cwd.join("q")).status().unwrap();
    assert!(made.success());
    let before = snapshot(&env.cwd);
    run_calls(&env, flags, &["rm q && echo x > q"]);
    let log = session_log(&env);
    assert_eq!(count(&log, "toolRejected"), 1, "{:?}", types(&log));
    assert_eq!(snapshot(&env.cwd), before);
}

#[test]
fn a_file_name_cannot_forge_a_line_of_the_listing() {
    for flags in FLAGS {
        a_file_name_cannot_forge_a_line_of_the_listing_with(flags);
    }
}

fn a_file_name_cannot_forge_a_line_of_the_listing_with(flags: &[&str]) {
    let env = Env::new();
    require_staging(&env);
    std::fs::write(env.cwd.join("keep.txt"), "keep\n").unwrap();
    // Created (Write, applied under --yes) next to a real deletion
    // (Destructive, refused): the name tries to pass for more lines of the
    // listing and for cairn's verdict.
    let forged = "a\n- keep.txt (nothing else deleted)\ncairn: verdict Write, approved";
    let command =
        "touch \"$(printf 'a\\n- keep.txt (nothing else deleted)\\ncairn: verdict Write, approved')\"; rm keep.txt";
    let output = run_calls(&env, flags, &[command]);
    let log = session_log(&env);
    let rejected = log.iter().find(|e| e["type"] == "toolRejected").unwrap_or_else(|| panic!("{:?}", types(&log)));
    let reason = rejected["payload"]["reason"].as_str().unwrap();
    for text in [reason, output.as_str()] {
        for line in text.lines() {
            assert!(!line.starts_with("cairn: verdict"), "a forged line was shown:\n{text}");
            assert!(!line.starts_with("- keep.txt (nothing"), "a forged line was shown:\n{text}");
        }
    }
    assert!(reason.contains("\\n- keep.txt"), "the name is shown escaped: {reason}");
    assert!(!env.cwd.join(forged).exists());
    assert!(env.cwd.join("keep.txt").exists());
}

/// Every attack above, as uid 65534 (staging through an unprivileged user
/// namespace): the same answers.
#[test]
fn the_attacks_fail_as_a_non_root_user_too() {
    let passed = util::rerun_as_non_root("the_attacks_fail_as_a_non_root_user_too");
    assert_eq!(passed, 5, "as uid 65534 not every attack test ran");
}
