//! `cairn mount` over a running `cairn serve`: plain shell tools on the
//! FUSE tree. Needs /dev/fuse and root (or fusermount3); where either is
//! missing the test fails saying so.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_debug_implementations, unreachable_pub)]

mod util;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;
use util::Env;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `cairn mount`: on drop (a failed test) killed, and the mount point
/// detached if the kill left it mounted.
struct Mounted(Child, std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.1).stderr(Stdio::null()).status();
    }
}

fn first_line(child: &mut Child, what: &str) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    if line.is_empty() {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("{what} printed nothing; stderr: {err}");
    }
    line.trim().to_owned()
}

fn sh(script: &str) -> std::process::Output {
    Command::new("sh").arg("-c").arg(script).output().unwrap()
}

#[test]
fn tail_f_on_chat_through_the_mount_sees_a_later_turn() {
    assert!(std::path::Path::new("/dev/fuse").exists(), "this test needs /dev/fuse (FUSE), which is missing here");
    let fusermount = ["fusermount3", "fusermount"].iter().any(|b| sh(&format!("command -v {b}")).status.success());
    let root = unsafe_getuid() == 0;
    assert!(root || fusermount, "this test needs root or the fusermount3 helper to mount FUSE");

    let env = Env::new();
    let mut serve = env.cairn(&["serve"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    first_line(&mut serve, "cairn serve");
    let _serve = Killed(serve);
    let mnt = env.home.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut mount =
        env.cairn(&["mount", mnt.to_str().unwrap()]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let said = first_line(&mut mount, "cairn mount");
    let mut mount = Mounted(mount, mnt.clone());
    assert!(said.starts_with("mounted "), "{said}");
    let m = mnt.display().to_string();

    let script = env.script(&[json!({"text": "the answer, later"})]);
    let create =
        sh(&format!("echo 'cwd={} provider=scripted script={}' > {m}/s/new", env.cwd.display(), script.display()));
    assert!(create.status.success(), "{}", String::from_utf8_lossy(&create.stderr));
    let idx = std::fs::read_to_string(mnt.join("s/idx")).unwrap();
    let id = idx.split_whitespace().next().expect("a session in idx").to_owned();
    let help = std::fs::read_to_string(mnt.join("help")).unwrap();
    assert!(help.contains("s/new"), "{help}");
    let ls = sh(&format!("ls {m}/s/{id}"));
    assert_eq!(
        String::from_utf8_lossy(&ls.stdout).split_whitespace().collect::<Vec<_>>(),
        ["approvals", "chat", "ctl", "event", "log", "prompt", "state", "usage"]
    );

    // tail -f first, the turn afterwards.
    let mut tail = Command::new("tail")
        .args(["-f", "-s", "0.2", mnt.join(format!("s/{id}/chat")).to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tail.stdout.take().unwrap();
    let _tail = Killed(tail);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let prompt = sh(&format!("echo 'summarise README.md' > {m}/s/{id}/prompt"));
    assert!(prompt.status.success(), "{}", String::from_utf8_lossy(&prompt.stderr));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l == "assistant: the answer, later") {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "tail -f never showed the answer; saw {seen:?}");
        if let Ok(line) = rx.recv_timeout(left) {
            seen.push(line);
        }
    }
    assert_eq!(seen[0], "user: summarise README.md");
    // A second prompt while idle works; state reads through cat.
    let state = sh(&format!("cat {m}/s/{id}/state"));
    assert!(String::from_utf8_lossy(&state.stdout).starts_with("idle"), "{}", String::from_utf8_lossy(&state.stdout));

    // SIGINT unmounts cleanly.
    let pid = mount.0.id();
    assert!(Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap().success());
    assert!(mount.0.wait().unwrap().success());
    assert!(!mnt.join("help").exists(), "still mounted after SIGINT");
}

fn unsafe_getuid() -> u32 {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
