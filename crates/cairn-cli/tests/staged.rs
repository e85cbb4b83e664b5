//! Staged effects with the real `cairn` binary (issue 16): command lines
//! that delete, truncate or overwrite existing files — through quoting,
//! escapes, variables, command substitution, wrappers, `find`, `xargs`,
//! interpreters, git, redirections, `dd`, `mv` — run headless under `--yes`
//! and under `--allow 'shell(*)'`: the real tree is unchanged and the call
//! is settled Rejected, with the staged list in its reason whenever the
//! command ran staged. Commands that only add or edit apply under `--yes`
//! with their diff recorded. The sandbox still holds inside the overlay.
//!
//! Oracle: each destructive line is first run by plain bash on a copy of
//! the fixture, and must change that copy (so a line that does nothing
//! cannot pass); the tree cairn ran in is compared byte for byte (content,
//! kind, mode, `.git` included) with its state before.
//!
//! These tests need overlay staging (as root, or as any user through an
//! unprivileged user namespace): where `cairn tools` says staging is
//! unavailable they fail with that reason. They run a second time as uid
//! 65534 (`the_staged_tests_pass_as_a_non_root_user`). The attacks of
//! issue 46 (planting what runs later: git code, other agents' and cairn's
//! own configuration) are in `staged/authority.rs`, rerun the same way.

#![allow(clippy::unwrap_used)]

use crate::util;

#[path = "staged/authority.rs"]
mod authority;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use util::{Env, entries, require_staging, snapshot};

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The fixture: a tree with a directory, text and binary files, and a git
/// repository with a dirty tracked file and an untracked one.
fn fixture(dir: &Path) {
    std::fs::create_dir_all(dir.join("victim/sub")).unwrap();
    std::fs::write(dir.join("victim/data.txt"), "keep me\n").unwrap();
    std::fs::write(dir.join("victim/sub/deep.bin"), [0u8, 1, 2, 3, 255, 0, 7]).unwrap();
    let lines: String = (1..=10).map(|i| format!("line{i}\n")).collect();
    std::fs::write(dir.join("f.txt"), lines).unwrap();
    std::fs::write(dir.join("keep.txt"), "keep\n").unwrap();
    std::fs::write(dir.join("tracked.txt"), "base\n").unwrap();
    // Binary and large files: overwriting their bytes is as destructive as
    // overwriting a small text file's (issue 25).
    let binary: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(dir.join("bin.dat"), &binary).unwrap();
    let big: String = (0..40_000).map(|i| format!("row {i} of a large text file\n")).collect();
    assert!(big.len() > 1 << 20);
    std::fs::write(dir.join("big.txt"), big).unwrap();
    let notes: String = (1..=10).map(|i| format!("note {i}\n")).collect();
    std::fs::write(dir.join("notes.txt"), notes).unwrap();
    git(dir, &["init", "-q"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "base"]);
    std::fs::write(dir.join("tracked.txt"), "base\ndirty one\ndirty two\ndirty three\n").unwrap();
    std::fs::write(dir.join("untracked.txt"), "untracked work\n").unwrap();
    // Two uncommitted lines in a file of ten: discarding them keeps most
    // lines, but loses work no one can get back.
    let mut notes = std::fs::read_to_string(dir.join("notes.txt")).unwrap();
    notes.push_str("uncommitted idea one\nuncommitted idea two\n");
    std::fs::write(dir.join("notes.txt"), notes).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    let out = Command::new("cp").arg("-a").arg(from).arg(to).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Lines that destroy something the fixture holds.
const DESTRUCTIVE: &[&str] = &[
    "rm -rf victim",
    "'rm' -rf victim",
    "\"rm\" -rf victim",
    "r\\m -rf victim",
    "r''m -rf victim",
    "\\rm -rf victim",
    "/bin/rm -fr victim",
    "{rm,-rf,victim}",
    "rm${IFS}-rf${IFS}victim",
    "x=-rf; rm $x victim",
    "$(echo rm) -rf victim",
    "R=rm; $R -rf victim",
    "`echo rm` -rf victim",
    "find victim -exec /bin/rm -rf {} +",
    "find victim '-delete'",
    "find . -name '*.txt' -delete",
    "find victim -type f -exec shred -u {} \\;",
    "find . -maxdepth 1 -name keep.txt -exec rm {} \\;",
    "chmod '-R' 000 victim",
    "chmod 000 keep.txt",
    "/usr/bin/python3 -c \"import shutil; shutil.rmtree('victim')\"",
    "/usr/bin/python3 -c \"import os; os.remove('keep.txt')\"",
    "/usr/bin/python3 -c \"open('f.txt','w').write('x')\"",
    "perl -e 'unlink \"keep.txt\"'",
    "perl -e 'use File::Path; rmtree(\"victim\")'",
    "node -e \"require('fs').rmSync('victim',{recursive:true})\"",
    "sh -c 'rm -rf victim'",
    "bash -c \"rm -rf victim\"",
    "eval 'rm -rf victim'",
    "echo rm -rf victim | sh",
    "env rm -rf victim",
    "env -i /bin/rm -rf victim",
    "command rm -rf victim",
    "nice -n 5 rm -rf victim",
    "nohup rm -rf victim",
    "timeout 30 rm -rf victim",
    "exec rm -rf victim",
    "xargs rm -rf <<< victim",
    "echo victim | xargs rm -rf",
    "ls -d victim | xargs -I{} rm -rf {}",
    "git clean -fdx",
    "git -C . clean -fdx",
    "'git' clean -f",
    "git checkout -- .",
    "git checkout .",
    "git restore .",
    "git reset --hard",
    "git -c x.y=1 reset --hard",
    "git stash",
    "git stash -u",
    "git rm -qf tracked.txt",
    "truncate -s 0 keep.txt",
    "truncate -s 2 f.txt",
    ": > keep.txt",
    "> keep.txt",
    "echo > keep.txt",
    "echo x > f.txt",
    "printf '' > keep.txt",
    "cat /dev/null > f.txt",
    "tee f.txt < /dev/null",
    "sort -o f.txt /dev/null",
    "dd if=/dev/zero of=f.txt bs=1 count=3",
    "mv keep.txt f.txt",
    "mv victim/data.txt keep.txt",
    "cp keep.txt f.txt",
    "ln -sf keep.txt f.txt",
    "unlink keep.txt",
    "rm keep.txt",
    "rm -f f.txt keep.txt",
    "rm -r victim/sub",
    "shred -u keep.txt",
    "sed -i d f.txt",
    "sed -i '2,10d' f.txt",
    "perl -pi -e '$_=\"\"' f.txt",
    "for f in victim/*; do rm -rf \"$f\"; done",
    "rm -rf vic*",
    "(cd victim && rm -rf sub)",
    "{ rm -rf victim; }",
    "true && rm -rf victim",
    "false || rm -rf victim",
    "tar -cf /dev/null --remove-files victim",
    "install -m 644 /dev/null keep.txt",
    // Overwriting bytes of files a person cannot read as a diff (issue 25):
    // in place, same size or larger, binary or over 1 MiB.
    "dd if=/dev/zero of=f.txt bs=1 count=5 conv=notrunc",
    "dd if=/dev/zero of=bin.dat bs=1k count=8",
    "/usr/bin/python3 -c \"open('keep.txt','wb').write(bytes(1000))\"",
    "shred -n1 bin.dat",
    "openssl enc -aes-256-cbc -pbkdf2 -pass pass:x -in bin.dat -out bin.enc && mv bin.enc bin.dat",
    "tr a-z n-za-m < big.txt > big.rot && mv big.rot big.txt",
    "sed -i 's/row/ROW/' big.txt",
    // Putting back what git stores over uncommitted lines.
    "git checkout -- notes.txt",
    "git restore notes.txt",
    "git show HEAD:notes.txt > notes.txt",
];

/// Run one shell call headless with `flags`; the session's entries.
fn run_call(env: &Env, command: &str, flags: &[&str]) -> Vec<Value> {
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    for f in env.session_files() {
        std::fs::remove_file(f).unwrap();
    }
    let mut args = vec!["--script", script.to_str().unwrap()];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["run", "go"]);
    let out = env.cairn(&args).stdin(Stdio::null()).output().unwrap();
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    entries(&files[0])
}

fn payload_of<'a>(entries: &'a [Value], kind: &str) -> Option<&'a Value> {
    entries.iter().find(|e| e["type"] == kind).map(|e| &e["payload"])
}

#[test]
fn destructive_lines_are_rejected_headless_and_the_tree_is_untouched() {
    assert!(DESTRUCTIVE.len() >= 60, "the table holds {} lines", DESTRUCTIVE.len());
    let env = Env::new();
    require_staging(&env);
    let template = tempfile::tempdir().unwrap();
    let base = template.path().join("base");
    std::fs::create_dir(&base).unwrap();
    fixture(&base);
    let original = snapshot(&base);
    let mut failures = Vec::new();
    for (i, line) in DESTRUCTIVE.iter().enumerate() {
        // The oracle: plain bash on a copy changes it.
        let copy = template.path().join(format!("oracle{i}"));
        copy_tree(&base, &copy);
        let _ = Command::new("bash").arg("-c").arg(line).current_dir(&copy).env("HOME", &copy).output().unwrap();
        if snapshot(&copy) == original {
            failures.push(format!("{line:?}: bash changed nothing (the table is wrong)"));
            continue;
        }
        for flags in [&["--yes"][..], &["--allow", "shell(*)"][..]] {
            std::fs::remove_dir_all(&env.cwd).unwrap();
            copy_tree(&base, &env.cwd);
            let before = snapshot(&env.cwd);
            let log = run_call(&env, line, flags);
            if snapshot(&env.cwd) != before {
                failures.push(format!("{line:?} {flags:?}: THE TREE CHANGED"));
                continue;
            }
            match payload_of(&log, "toolRejected") {
                None => failures.push(format!(
                    "{line:?} {flags:?}: not rejected: {:?}",
                    log.iter().map(|e| e["type"].as_str().unwrap_or("")).collect::<Vec<_>>()
                )),
                Some(p) => {
                    let reason = p["reason"].as_str().unwrap_or("");
                    let staged = payload_of(&log, "toolStarted").is_some();
                    // Run staged: the reason lists the staged changes.
                    // Refused before it ran: only a line whose damage would
                    // land beyond the tree (staging cannot show it), never
                    // because a pattern could not read it (staged, the
                    // effect decides).
                    let ok = if staged {
                        reason.contains("Staged changes:") && reason.contains("Destructive")
                    } else {
                        reason.contains("beyond") || reason.contains("outside the working tree")
                    };
                    if !ok {
                        failures.push(format!("{line:?} {flags:?}: reason without the staged list: {reason}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn adding_and_editing_apply_under_yes_with_the_diff_recorded() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let log = run_call(
        &env,
        "mkdir -p out && echo hello > out/new.txt && sed -i 's/line3/LINE3/' f.txt && echo appended >> keep.txt \
         && head -c 100 bin.dat >> bin.dat && echo 'one more row' >> big.txt",
        &["--yes"],
    );
    let completed = payload_of(&log, "toolCompleted").unwrap_or_else(|| panic!("not completed: {log:?}"));
    let after = snapshot(&env.cwd);
    assert_eq!(std::fs::read_to_string(env.cwd.join("out/new.txt")).unwrap(), "hello\n");
    assert!(std::fs::read_to_string(env.cwd.join("f.txt")).unwrap().contains("LINE3\nline4"));
    assert_eq!(std::fs::read_to_string(env.cwd.join("keep.txt")).unwrap(), "keep\nappended\n");
    // Nothing else changed.
    let changed: Vec<&String> = after.keys().chain(before.keys()).filter(|k| after.get(*k) != before.get(*k)).collect();
    let mut changed: Vec<&str> = changed.into_iter().map(String::as_str).collect();
    changed.sort();
    changed.dedup();
    assert_eq!(changed, ["big.txt", "bin.dat", "f.txt", "keep.txt", "out", "out/new.txt"]);
    let text = completed.to_string();
    assert!(text.contains("+LINE3") && text.contains("-line3"), "diff recorded: {text}");
    assert!(text.contains("\"overlay\""), "mode recorded: {text}");
    let affected = &completed["receipt"]["affectedEntities"];
    assert!(affected.to_string().contains("out/new.txt"), "affected entities: {completed}");
}

/// Issue 49.10: a build that writes 1,000 new files (more than
/// `staged_max_files`, 200) destroys nothing, so it is one Write and
/// applies headless under `--yes`, its listing capped; 201 appends to files
/// that existed are still over the limit and refused.
#[test]
fn a_build_writing_a_thousand_new_files_applies_under_yes() {
    let env = Env::new();
    require_staging(&env);
    std::fs::write(env.cwd.join("keep.txt"), "keep\n").unwrap();
    let log =
        run_call(&env, "mkdir -p out && for i in $(seq 1 1000); do echo \"object $i\" > out/f$i.o; done", &["--yes"]);
    let completed = payload_of(&log, "toolCompleted").unwrap_or_else(|| {
        panic!("not completed: {:?}", payload_of(&log, "toolRejected").map(|p| p["reason"].to_string()))
    });
    assert_eq!(std::fs::read_dir(env.cwd.join("out")).unwrap().count(), 1000);
    assert_eq!(std::fs::read_to_string(env.cwd.join("out/f777.o")).unwrap(), "object 777\n");
    assert_eq!(completed["receipt"]["tier"], "write", "{}", completed["receipt"]["tier"]);
    let summary = completed["receipt"]["outputSummary"].as_str().unwrap_or("");
    assert!(summary.len() < 64 * 1024, "the summary is capped: {} bytes", summary.len());
    // Edits of files that existed still count against the limit.
    for i in 0..201 {
        std::fs::write(env.cwd.join(format!("out/f{}.o", i + 1)), "x\n").unwrap();
    }
    let before = snapshot(&env.cwd);
    let log = run_call(&env, "for i in $(seq 1 201); do echo more >> out/f$i.o; done", &["--yes"]);
    let rejected = payload_of(&log, "toolRejected").unwrap_or_else(|| panic!("not rejected: {log:?}"));
    assert!(rejected["reason"].to_string().contains("201 paths that existed"), "{rejected}");
    assert_eq!(snapshot(&env.cwd), before, "nothing applied");
}

/// Issue 49.10, unstaged (`staged = false`): a `for` loop writing new files
/// is judged (a Write) and runs headless under `--yes`, under noclobber: a
/// `>` onto a file that exists fails and the file keeps its bytes; a loop
/// planting git hooks stays Destructive and is refused.
#[test]
fn unstaged_a_build_loop_writes_new_files_and_replaces_none() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    git(&env.cwd, &["init", "-q"]);
    std::fs::write(env.cwd.join("keep.txt"), "keep me\n").unwrap();
    let log =
        run_call(&env, "mkdir -p out && for i in $(seq 1 1000); do echo \"object $i\" > out/f$i.o; done", &["--yes"]);
    let completed = payload_of(&log, "toolCompleted").unwrap_or_else(|| {
        panic!("not completed: {:?}", payload_of(&log, "toolRejected").map(|p| p["reason"].to_string()))
    });
    assert_eq!(completed["receipt"]["exitCode"], 0, "{completed}");
    assert_eq!(std::fs::read_dir(env.cwd.join("out")).unwrap().count(), 1000);
    assert_eq!(std::fs::read_to_string(env.cwd.join("out/f1000.o")).unwrap(), "object 1000\n");
    // Overwriting is not what the judgement let through.
    let before = snapshot(&env.cwd);
    let log = run_call(&env, "for f in keep x1; do echo gone > $f.txt; done; echo x > keep.txt", &["--yes"]);
    assert_eq!(std::fs::read_to_string(env.cwd.join("keep.txt")).unwrap(), "keep me\n", "{log:?}");
    let completed = payload_of(&log, "toolCompleted").unwrap_or_else(|| panic!("{log:?}"));
    assert!(completed.to_string().contains("cannot overwrite existing file"), "{completed}");
    let after = snapshot(&env.cwd);
    let added: Vec<&String> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    assert_eq!(added, ["x1.txt"], "only the new file was created");
    // Planting hooks is still refused headless.
    for line in [
        "for h in pre-commit post-checkout; do echo 'touch PWNED' > .git/hooks/$h; done",
        "echo x >| keep.txt",
        "cd out && echo x > f2.o",
    ] {
        let before = snapshot(&env.cwd);
        let log = run_call(&env, line, &["--yes"]);
        assert!(payload_of(&log, "toolRejected").is_some(), "{line}: {log:?}");
        assert_eq!(snapshot(&env.cwd), before, "{line}: the tree changed");
    }
}

#[test]
fn the_sandbox_still_holds_inside_the_overlay() {
    let env = Env::new();
    require_staging(&env);
    // Outside /tmp: the call's /tmp is its own (a write there succeeds and
    // the host never sees it, asserted below), where this directory would
    // be missing rather than denied.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let target = outside.path().join("escaped");
    let line = format!(
        "echo x > {} ; echo y > /tmp/cairn-staged-escape-probe ; (exec 3<>/dev/tcp/127.0.0.1/9) ; echo inside > in.txt",
        target.display()
    );
    let log = run_call(&env, &line, &["--yes"]);
    assert!(payload_of(&log, "toolCompleted").is_some(), "{log:?}");
    assert!(!target.exists(), "wrote outside the working tree");
    assert!(!Path::new("/tmp/cairn-staged-escape-probe").exists(), "wrote /tmp");
    let completed = payload_of(&log, "toolCompleted").unwrap().to_string();
    assert!(completed.contains("Permission denied") || completed.contains("denied"), "{completed}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("in.txt")).unwrap(), "inside\n");
}

/// Issue 46.7: `shell_network` in `[tools]` (documented in docs/tools.md)
/// is accepted and means what the docs say: `shell` may reach a TCP
/// server, which it may not without it; `cairn config` shows the value.
#[test]
fn shell_network_in_the_config_gives_shell_the_network() {
    let env = Env::new();
    require_staging(&env);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 1024];
            let _ = std::io::Read::read(&mut stream, &mut buf);
            let _ = std::io::Write::write_all(&mut stream, b"HTTP/1.0 200 OK\r\n\r\nhello-net\n");
        }
    });
    let line = format!("curl -s http://127.0.0.1:{port}/; echo end");
    for (config, connects) in [("", false), ("[tools]\nshell_network = true\n", true)] {
        std::fs::write(env.home.join("config.toml"), config).unwrap();
        let shown = env.cairn(&["config"]).output().unwrap();
        let shown = format!("{}{}", String::from_utf8_lossy(&shown.stdout), String::from_utf8_lossy(&shown.stderr));
        let row = shown.lines().find(|l| l.contains("tools.shell_network")).unwrap_or_else(|| panic!("{shown}"));
        assert!(row.contains(if connects { "true" } else { "false" }), "{row}");
        let log = run_call(&env, &line, &["--yes"]);
        let completed = payload_of(&log, "toolCompleted").unwrap_or_else(|| panic!("{config:?}: {log:?}")).to_string();
        assert_eq!(completed.contains("hello-net"), connects, "{config:?}: {completed}");
    }
}

/// Damage staging cannot hold (remotes, disks, the machine) is Destructive
/// before the run, whatever the spelling: refused headless, never started.
#[test]
fn damage_beyond_the_tree_is_refused_before_it_runs() {
    let env = Env::new();
    require_staging(&env);
    for line in [
        "git push -f origin main",
        "git -C . push --force",
        "'git' push -f",
        "git -c user.name=x push --mirror",
        "command git push origin +main",
        "dd if=/dev/zero of=/dev/sda",
        "mkfs.ext4 /dev/sdb1",
        "sudo reboot",
        "kill -9 -1",
    ] {
        for flags in [&["--yes"][..], &["--allow", "shell(*)"][..]] {
            let log = run_call(&env, line, flags);
            let types: Vec<&str> = log.iter().map(|e| e["type"].as_str().unwrap_or("")).collect();
            assert!(
                types.contains(&"toolRejected") && !types.contains(&"toolStarted"),
                "{line:?} {flags:?}: {types:?}"
            );
        }
    }
}

/// Probing whether overlays work (every `cairn` that stages probes once)
/// leaves nothing in the temp directory. The overlay leaves its work
/// directory mode 000, which only root could remove without opening it
/// up first: as uid 65534 (the rerun below) every run left a
/// `cairn-overlay-probe-*` directory behind.
#[test]
fn probing_for_overlays_leaves_no_directory_behind() {
    let env = Env::new();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let out = env.cairn(&["tools"]).env("TMPDIR", tmp.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("staging: overlay"), "the probe must succeed for this test to mean anything:\n{text}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "the overlay probe left {left:?} in TMPDIR");
}

/// Issue 25: staging holds for a non-root user too: the tests above rerun
/// as uid 65534, whose staging goes through an unprivileged user
/// namespace (`util::rerun_as_non_root`).
#[test]
fn the_staged_tests_pass_as_a_non_root_user() {
    let passed = util::rerun_as_non_root("the_staged_tests_pass_as_a_non_root_user");
    assert!(passed >= 4, "as uid 65534 only {passed} tests ran");
}
