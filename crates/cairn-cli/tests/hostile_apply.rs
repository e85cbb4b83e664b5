//! A hostile tool against the apply step of staged effects (issue 25),
//! with the real `cairn` binary, headless under `--yes` and under `--allow 'shell(*)'`: each test performs
//! an attack a tool can plan across calls and checks from the outside
//! (files beyond the tree, the tree byte for byte with modes and link
//! targets, allocated blocks) that it got nothing.
//!
//! - a link planted at the name cairn used to write its temporary to
//!   (`.x.cairn-apply`) must not carry the staged bytes outside the tree;
//! - setuid/setgid bits are never applied;
//! - a sparse file stays sparse, and its holes are never read (46.7);
//! - a FIFO left by a command, or one in the tree, never hangs cairn and
//!   is never applied;
//! - a file name cannot forge a line of cairn's own listing;
//! - a planted `.git/commondir -> /dev/zero`, or a `.git` file pointing
//!   outside the tree, never makes the judge read without bound (46.3);
//! - a change set of thousands of paths is listed in part (46.7);
//! - an apply failing with ENOSPC leaves no temporary (46.6, root only);
//! - unstaged, a hard link to a file outside the tree is read-only to the
//!   command (46.7).
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
    run_calls_capped(env, flags, commands, None).0
}

/// [`run_calls`] with cairn's data segment (heap and private mappings,
/// `RLIMIT_DATA`) capped at `data_cap` bytes: a read without bound makes
/// cairn fail there instead of taking the machine's memory. Also returns
/// how many bytes cairn read with read-class syscalls in all (`rchar` of
/// `/proc/PID/io`, read while it is a zombie: its threads and the children
/// it reaped included).
fn run_calls_capped(env: &Env, flags: &[&str], commands: &[&str], data_cap: Option<u64>) -> (String, Option<u64>) {
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
    let mut cmd = env.cairn(&[&["--script", script.to_str().unwrap()][..], flags, &["run", "go"][..]].concat());
    if let Some(cap) = data_cap {
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                let limit = libc::rlimit { rlim_cur: cap, rlim_max: cap };
                if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    let pid = child.id();
    loop {
        // Wait for the exit without reaping, so /proc/PID/io stays.
        // SAFETY: a zeroed siginfo_t is valid; waitid fills it.
        let exited = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let rc = libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT | libc::WNOHANG);
            assert_eq!(rc, 0, "waitid: {}", std::io::Error::last_os_error());
            info.si_pid() == pid as i32
        };
        if exited {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cairn hung on {commands:?} (killed after two minutes)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // cairn makes itself non-dumpable (its memory holds provider keys), so
    // only root may read its `/proc/PID/io`: the non-root rerun gets None
    // and its callers check everything but the byte count, which the run
    // as root checks.
    let rchar = match std::fs::read_to_string(format!("/proc/{pid}/io")) {
        Ok(io) => Some(io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && std::env::var_os(util::AS_NON_ROOT).is_some() => {
            None
        }
        Err(e) => panic!("cannot read cairn's /proc/{pid}/io: {e}"),
    };
    let out = child.wait_with_output().unwrap();
    (format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)), rchar)
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
    // Issue 46.7: 4 GiB of holes are judged and applied without being
    // read (they took 21–29 s, hashed as zeros): what cairn read in all
    // is counted, not timed.
    let (output, rchar) = run_calls_capped(&env, flags, &["truncate -s 4G big && printf end >> big"], None);
    let log = session_log(&env);
    assert_eq!(count(&log, "toolCompleted"), 1, "{:?}\n{output}", types(&log));
    let meta = std::fs::metadata(env.cwd.join("big")).unwrap();
    assert_eq!(meta.len(), (4 << 30) + 3);
    let allocated = meta.blocks() * 512;
    assert!(allocated < 1 << 20, "4 GiB of holes became {allocated} allocated bytes");
    if let Some(rchar) = rchar {
        assert!(rchar < 256 << 20, "cairn read {rchar} bytes to judge and apply 4 GiB of holes");
    }
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

/// The data segment cairn gets in the git tests: a staged call's judge
/// and apply need a few tens of MiB; reading `/dev/zero` whole (the old
/// `fs::read_to_string` of a planted `commondir`) reaches it within
/// seconds, so an unbounded read cannot take the machine's memory.
const JUDGE_DATA_CAP: u64 = 512 << 20;

/// Issue 46.3: a tree file git information is read from is a link to
/// `/dev/zero` (`.git/commondir`), or the tree's `.git` *file* points
/// outside the tree at a directory whose `config` is one. Planted before
/// the session (a hostile repository, or a tool of an earlier call: h1's
/// protection makes writing under `.git` Destructive, so the plant is made
/// here directly), the next staged call must be judged and applied with
/// bounded memory: every such read goes through `Beneath` with a cap and
/// nothing it cannot read safely is followed.
#[test]
fn planted_git_links_and_pointers_never_make_the_judge_read_without_bound() {
    for flags in FLAGS {
        for plant in ["commondir", "gitdir"] {
            planted_git_links_and_pointers_never_make_the_judge_read_without_bound_with(flags, plant);
        }
    }
}

fn planted_git_links_and_pointers_never_make_the_judge_read_without_bound_with(flags: &[&str], plant: &str) {
    let env = Env::new();
    require_staging(&env);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(env.cwd.join("a.txt"), "a\n").unwrap();
    match plant {
        "commondir" => {
            std::fs::create_dir_all(env.cwd.join(".git/objects/pack")).unwrap();
            std::os::unix::fs::symlink("/dev/zero", env.cwd.join(".git/commondir")).unwrap();
        }
        _ => {
            let gitdir = outside.path().join("g");
            std::fs::create_dir_all(gitdir.join("objects/pack")).unwrap();
            std::os::unix::fs::symlink("/dev/zero", gitdir.join("config")).unwrap();
            std::fs::write(env.cwd.join(".git"), format!("gitdir: {}\n", gitdir.display())).unwrap();
        }
    }
    let (output, rchar) =
        run_calls_capped(&env, flags, &["echo more >> a.txt; echo new > new.txt"], Some(JUDGE_DATA_CAP));
    // The data cap alone does not show the fault: std's read_to_end fails
    // with OutOfMemory under it instead of aborting, so an unbounded read
    // of `/dev/zero` ends in "no git information" too, after reading
    // hundreds of MB. The byte count does (root's run; see run_calls_capped).
    if let Some(rchar) = rchar {
        assert!(rchar < 64 << 20, "{plant}: cairn read {rchar} bytes judging a two-line change");
    }
    let log = session_log(&env);
    assert_eq!(
        count(&log, "toolCompleted"),
        1,
        "{plant}: the call was not judged and applied: {:?}\n{output}",
        types(&log)
    );
    assert_eq!(std::fs::read_to_string(env.cwd.join("a.txt")).unwrap(), "a\nmore\n");
    assert_eq!(std::fs::read_to_string(env.cwd.join("new.txt")).unwrap(), "new\n");
    assert!(output.contains("done"), "{plant}: the turn did not finish: {output}");
}

/// Issue 46.7: a rejected change set of thousands of paths is listed in
/// part in its refusal (the rest counted), so no session line carries the
/// whole path list.
#[test]
fn a_huge_rejected_change_set_is_listed_in_part() {
    for flags in FLAGS {
        a_huge_rejected_change_set_is_listed_in_part_with(flags);
    }
}

fn a_huge_rejected_change_set_is_listed_in_part_with(flags: &[&str]) {
    let env = Env::new();
    require_staging(&env);
    // 5,000 paths of 60 bytes' names: the whole listing would be ~450 KB.
    // Each file exists and is emptied (Destructive): since issue 49.10 a
    // change set that only creates files is a Write however large.
    let name = "n".repeat(48);
    std::fs::create_dir(env.cwd.join("d")).unwrap();
    for i in 1..=5000 {
        std::fs::write(env.cwd.join(format!("d/{name}{i}")), "kept\n").unwrap();
    }
    let command = format!("cd d && for i in $(seq 1 5000); do : > {name}$i; done");
    let output = run_calls(&env, flags, &[&command]);
    let log = session_log(&env);
    let rejected =
        log.iter().find(|e| e["type"] == "toolRejected").unwrap_or_else(|| panic!("{:?}\n{output}", types(&log)));
    let reason = rejected["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("5000 changes in all"),
        "the rest is not counted: {}",
        &reason[reason.len().saturating_sub(400)..]
    );
    // 100 listed paths, and one line of reasons naming 10 (the rest counted).
    assert!(reason.lines().filter(|l| l.contains(&name)).count() <= 101, "more than 100 paths listed");
    assert!(reason.contains("… and 499"), "the reasons are not counted");
    let file = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    let longest = file.lines().map(str::len).max().unwrap();
    assert!(longest < 64 * 1024, "a session line of {longest} bytes");
    assert_eq!(
        std::fs::read_to_string(env.cwd.join(format!("d/{name}77"))).unwrap(),
        "kept\n",
        "the refused change set was applied"
    );
}

/// Issue 46.6: an apply that fails part-way (ENOSPC on a 4 MiB tmpfs
/// holding the tree, after two of three 1.5 MB files were written to
/// their temporaries) leaves no `.cairn-apply-*` temporary and none of
/// the files. Mounting the tmpfs needs root: as another user this test
/// fails saying so (the non-root rerun skips it).
#[test]
fn a_failed_apply_leaves_no_temporaries_needs_root() {
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap();
    assert_eq!(uid, 0, "this test mounts a small tmpfs to make the apply fail with ENOSPC, which needs root");
    let env = Env::new();
    require_staging(&env);
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs"])
        .arg(&env.cwd)
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs on {}", env.cwd.display());
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&env.cwd);
    std::fs::write(env.cwd.join("keep.txt"), "keep\n").unwrap();
    let before = snapshot(&env.cwd);
    let write = |name: &str| format!("head -c 1500000 /dev/urandom > {name}");
    let command = [write("a"), write("b"), write("c")].join(" && ");
    let output = run_calls(&env, &["--yes"], &[&command]);
    let log = session_log(&env);
    let failed =
        log.iter().find(|e| e["type"] == "toolFailed").unwrap_or_else(|| panic!("{:?}\n{output}", types(&log)));
    let error = failed["payload"].to_string();
    assert!(error.contains("No space left"), "not the ENOSPC under test: {error}");
    assert!(leftovers(&env.cwd).is_empty(), "temporaries left: {:?}", leftovers(&env.cwd));
    assert_eq!(snapshot(&env.cwd), before, "part of the failed change set is in the tree");
}

/// Issue 46.7: unstaged (`staged = false`), a sandboxed command may write
/// the tree, and Landlock checks the path it writes: a file of the tree
/// that is a hard link to a file outside it would carry the write out.
/// Such files are read-only in the call's mount namespace: neither their
/// bytes nor their mode change, the outside file keeps its own, and the
/// rest of the tree stays writable.
#[test]
fn an_unstaged_write_never_goes_through_a_hard_link_out_of_the_tree() {
    for flags in FLAGS {
        an_unstaged_write_never_goes_through_a_hard_link_out_of_the_tree_with(flags);
    }
}

fn an_unstaged_write_never_goes_through_a_hard_link_out_of_the_tree_with(flags: &[&str]) {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&secret, env.cwd.join("linked.txt")).unwrap();
    std::fs::write(env.cwd.join("src.txt"), "owned\n").unwrap();
    let mtime = std::fs::metadata(&secret).unwrap().modified().unwrap();
    // Commands the unstaged judge lets through under --yes (an overwrite
    // such as `cp src linked` needs a person since issue 46.5): a change of
    // mode and of times would reach the outside file through the link.
    let output = run_calls(
        &env,
        flags,
        &["chmod 666 linked.txt; touch -d 2001-01-01 linked.txt; cp -n src.txt other.txt; echo end"],
    );
    let log = session_log(&env);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret\n", "the write went through the link\n{output}");
    assert_eq!(std::fs::metadata(&secret).unwrap().mode() & 0o7777, 0o600, "the mode went through the link\n{output}");
    assert_eq!(std::fs::metadata(&secret).unwrap().modified().unwrap(), mtime, "the times went through the link");
    let completed =
        log.iter().find(|e| e["type"] == "toolCompleted").unwrap_or_else(|| panic!("{:?}\n{output}", types(&log)));
    assert!(completed.to_string().contains("Read-only file system"), "{completed}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("other.txt")).unwrap(), "owned\n", "the tree stays writable");
}

/// Every attack above, as uid 65534 (staging through an unprivileged user
/// namespace): the same answers.
#[test]
fn the_attacks_fail_as_a_non_root_user_too() {
    let passed = util::rerun_as_non_root_skipping(&["the_attacks_fail_as_a_non_root_user_too", "_needs_root"]);
    assert_eq!(passed, 8, "as uid 65534 not every attack test ran");
}
