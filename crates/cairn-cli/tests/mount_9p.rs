//! `cairn mount` over a running `cairn serve`: plain shell tools on the
//! FUSE tree. Needs /dev/fuse and root (or fusermount3); where either is
//! missing the test fails saying so.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_debug_implementations, unreachable_pub)]

use crate::util;

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
        ["approvals", "chat", "ctl", "enqueue", "event", "log", "prompt", "state", "usage"]
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

fn require_fuse() {
    assert!(std::path::Path::new("/dev/fuse").exists(), "this test needs /dev/fuse (FUSE), which is missing here");
    let fusermount = ["fusermount3", "fusermount"].iter().any(|b| sh(&format!("command -v {b}")).status.success());
    assert!(unsafe_getuid() == 0 || fusermount, "this test needs root or the fusermount3 helper to mount FUSE");
}

/// `cairn serve` and `cairn mount` on `env.home/mnt`.
fn serve_and_mount(env: &Env) -> (Killed, Mounted, std::path::PathBuf) {
    require_fuse();
    let mut serve = env.cairn(&["serve"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    first_line(&mut serve, "cairn serve");
    let mnt = env.home.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut mount =
        env.cairn(&["mount", mnt.to_str().unwrap()]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let said = first_line(&mut mount, "cairn mount");
    assert!(said.starts_with("mounted "), "{said}");
    (Killed(serve), Mounted(mount, mnt.clone()), mnt)
}

/// A scripted session created through the mount; its id.
fn mounted_session(env: &Env, mnt: &std::path::Path, script: &std::path::Path) -> String {
    let m = mnt.display();
    let create =
        sh(&format!("echo 'cwd={} provider=scripted script={}' > {m}/s/new", env.cwd.display(), script.display()));
    assert!(create.status.success(), "{}", String::from_utf8_lossy(&create.stderr));
    let idx = std::fs::read_to_string(mnt.join("s/idx")).unwrap();
    idx.split_whitespace().next().expect("a session in idx").to_owned()
}

/// Wait for `child` with a generous deadline; None if it is still running.
fn wait_child(child: &mut Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `sh -c script` with a generous deadline: its output, or a panic naming
/// `what` if it hangs.
fn sh_within(script: &str, what: &str) -> std::process::Output {
    let mut child =
        Command::new("sh").arg("-c").arg(script).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    assert!(wait_child(&mut child).is_some(), "{what} hung");
    child.wait_with_output().unwrap()
}

#[test]
fn prompts_larger_than_msize_go_through_the_mount_and_it_keeps_answering() {
    let env = Env::new();
    let (_serve, _mount, mnt) = serve_and_mount(&env);
    let script = env.script(&[json!({"text": "read the long one"}), json!({"text": "read the longer one"})]);
    let id = mounted_session(&env, &mnt, &script);
    let m = mnt.display().to_string();
    for (n, size) in [(1, 70_000usize), (2, 200_000)] {
        // A prompt of `size` bytes whose instruction is at its very end.
        let file = env.home.join(format!("prompt{n}.txt"));
        let mut text = "x".repeat(size - 40);
        text.push_str(&format!(" the instruction at the end #{n}\n"));
        std::fs::write(&file, &text).unwrap();
        let out = sh_within(&format!("cat {} > {m}/s/{id}/prompt", file.display()), "a large prompt write");
        assert!(out.status.success(), "a {size}-byte prompt failed: {}", String::from_utf8_lossy(&out.stderr));
        let ls = sh_within(&format!("ls {m}/s"), "ls after a large write");
        assert!(ls.status.success(), "ls after a {size}-byte prompt: {}", String::from_utf8_lossy(&ls.stderr));
        assert!(String::from_utf8_lossy(&ls.stdout).contains(&id));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let chat = std::fs::read_to_string(mnt.join(format!("s/{id}/chat"))).unwrap();
            if chat.contains(&format!("the instruction at the end #{n}")) && chat.matches("assistant:").count() >= n {
                break;
            }
            assert!(Instant::now() < deadline, "the {size}-byte prompt never ran whole; chat ends {:?}", tail(&chat));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn tail(s: &str) -> &str {
    &s[s.len().saturating_sub(200)..]
}

#[test]
fn blocked_stream_readers_leave_the_mount_answering_and_end_on_a_signal() {
    let env = Env::new();
    let (_serve, mut mount, mnt) = serve_and_mount(&env);
    let script = env.script(&[json!({"text": "x"})]);
    let id = mounted_session(&env, &mnt, &script);
    // One turn first, so `event` has lines before its end.
    let m = mnt.display();
    let prompt = sh_within(&format!("echo hello > {m}/s/{id}/prompt"), "a prompt");
    assert!(prompt.status.success(), "{}", String::from_utf8_lossy(&prompt.stderr));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(mnt.join(format!("s/{id}/state"))).unwrap().starts_with("idle") {
        assert!(Instant::now() < deadline, "the turn never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let event = mnt.join(format!("s/{id}/event"));
    // Four readers at the end of the stream (more than the mount's FUSE
    // workers), each blocked in read(2).
    // Each with SIGINT's default action: a shell that starts the suite in
    // the background (`cmd &` without job control) leaves SIGINT ignored,
    // and an ignored signal stays ignored across exec, so cat would never
    // see it.
    let mut readers: Vec<Child> = (0..4)
        .map(|_| {
            let mut cat = Command::new("cat");
            cat.arg(&event).stdout(Stdio::piped()).stderr(Stdio::null());
            // SAFETY: signal(2) is async-signal-safe; nothing else runs
            // between fork and exec here.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cat, || {
                    libc::signal(libc::SIGINT, libc::SIG_DFL);
                    Ok(())
                });
            }
            cat.spawn().unwrap()
        })
        .collect();
    for r in &mut readers {
        // The first read answers what is there; the next one blocks.
        let mut line = String::new();
        BufReader::new(r.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains("\"type\""), "{line}");
    }
    let ls = sh_within(&format!("ls {}", mnt.join("s").display()), "ls while four readers block");
    assert!(String::from_utf8_lossy(&ls.stdout).contains(&id));
    // SIGINT ends a blocked reader (the read is flushed, cat dies of it).
    let mut first = readers.remove(0);
    assert!(Command::new("kill").args(["-INT", &first.id().to_string()]).status().unwrap().success());
    let status = wait_child(&mut first).expect("cat ignored SIGINT while blocked in read on the mount");
    assert!(!status.success());
    // SIGKILL too (no reader left in D state until the next event).
    let mut second = readers.remove(0);
    second.kill().unwrap();
    assert!(wait_child(&mut second).is_some(), "cat stayed after SIGKILL while blocked in read on the mount");
    // SIGINT of the mount with two readers still blocked unmounts cleanly.
    let pid = mount.0.id();
    assert!(Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap().success());
    let status = wait_child(&mut mount.0).expect("cairn mount did not exit on SIGINT");
    assert!(status.success(), "{status:?}");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(mnt.to_str().unwrap()), "still mounted after SIGINT: {mounts}");
    for mut r in readers {
        let _ = r.kill();
        assert!(wait_child(&mut r).is_some(), "a reader stayed after the mount went");
    }
}

#[test]
fn a_prompt_that_cannot_start_fails_its_write_through_the_mount() {
    let env = Env::new();
    let (_serve, _mount, mnt) = serve_and_mount(&env);
    let m = mnt.display();
    // A provider whose key is missing (the environment has none).
    let create = sh_within(&format!("echo 'cwd={} provider=anthropic' > {m}/s/new", env.cwd.display()), "s/new");
    assert!(create.status.success(), "{}", String::from_utf8_lossy(&create.stderr));
    let idx = std::fs::read_to_string(mnt.join("s/idx")).unwrap();
    let id = idx.split_whitespace().next().expect("a session in idx").to_owned();
    let prompt = sh_within(&format!("echo hello > {m}/s/{id}/prompt"), "a prompt");
    assert!(!prompt.status.success(), "a prompt that cannot start was written without an error");
    assert_eq!(std::fs::read_to_string(mnt.join(format!("s/{id}/state"))).unwrap(), "idle\n");
}

#[test]
fn rmdir_archives_a_session_as_help_says_and_so_does_rm_r() {
    let env = Env::new();
    let (_serve, _mount, mnt) = serve_and_mount(&env);
    let script = env.script(&[json!({"text": "x"})]);
    let id = mounted_session(&env, &mnt, &script);
    let m = mnt.display();
    let help = std::fs::read_to_string(mnt.join("help")).unwrap();
    assert!(help.contains("rmdir s/ID") && help.contains("rm -r s/ID"), "{help}");
    // A file outside a session cannot be removed, and says so.
    let rm = sh_within(&format!("rm {m}/help"), "rm");
    assert!(!rm.status.success());
    let rmdir = sh_within(&format!("rmdir {m}/s/{id}"), "rmdir");
    assert!(rmdir.status.success(), "{}", String::from_utf8_lossy(&rmdir.stderr));
    assert!(!std::fs::read_to_string(mnt.join("s/idx")).unwrap().contains(&id));
    assert!(env.home.join("archive").read_dir().unwrap().count() == 1, "nothing archived");
    // 53.9: `rm -r` removes the files first (which changes nothing), then
    // the directory, which archives the session.
    let other = mounted_session(&env, &mnt, &script);
    let rm_r = sh_within(&format!("rm -r {m}/s/{other}"), "rm -r");
    assert!(rm_r.status.success(), "{}", String::from_utf8_lossy(&rm_r.stderr));
    assert!(!std::fs::read_to_string(mnt.join("s/idx")).unwrap().contains(&other));
    assert!(env.home.join("archive").join(format!("{other}.jsonl")).exists(), "rm -r did not archive");
}
