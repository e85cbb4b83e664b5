//! Issue 25, end to end through the real `cairn` binary: a hostile tool
//! gets nothing.
//! - descriptors cairn inherited (`exec 7<tree; cairn run …`) reach no
//!   tool: no `/proc/self/fd/N` walk around the overlay, no read past
//!   Landlock;
//! - where staging is off, a line that runs a file of the tree (a script
//!   the model just wrote with `write_file`, a Makefile, `npm run`) needs a
//!   person: refused headless, also under `--yes`;
//! - a staged call has a private `/tmp`;
//! - a tool cannot see cairn's home nor connect to `cairn serve`'s socket;
//! - where staging is off, overwriting programs, archive extraction,
//!   patching and git (which runs what the repository's configuration
//!   names) need a person (issue 46.5).
//! - what sandboxed processes may read (`reads`: `/etc` secrets, git's
//!   configuration, `sandbox_read_paths`, a hook's neighbours).
//!
//! Each test performs the attack; the oracles are the tree (byte for byte),
//! the files outside it and the session log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "isolation/reads.rs"]
mod reads;
use crate::util;

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use util::{Env, require_staging, snapshot};

/// The records of the only session file under the env's home.
fn session_text(env: &Env) -> String {
    let files = env.session_files();
    assert_eq!(files.len(), 1, "one session: {files:?}");
    std::fs::read_to_string(&files[0]).unwrap()
}

/// The entries of a session file's text.
fn entries(text: &str) -> Vec<Value> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    util::entries(file.path())
}

/// What the tool calls printed: the payloads of their results (not the
/// calls, whose command lines would match any word they hold).
fn results(text: &str) -> String {
    entries(text)
        .into_iter()
        .filter(|e| matches!(e["type"].as_str(), Some("toolCompleted" | "toolFailed" | "toolRejected")))
        .map(|e| e["payload"].to_string())
        .collect()
}

fn types(log: &[Value]) -> Vec<String> {
    log.iter().map(|e| e["type"].as_str().unwrap_or("").to_owned()).collect()
}

/// `cairn --script … FLAGS run go` with the shell calls `commands` (one
/// per turn step), then "done"; fresh session files.
fn script_calls(env: &Env, calls: &[(&str, Value)]) -> std::path::PathBuf {
    for f in env.session_files() {
        std::fs::remove_file(f).unwrap();
    }
    let mut lines: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"text": "", "toolCalls": [{"id": format!("c{i}"), "name": name, "arguments": args}]})
        })
        .collect();
    lines.push(json!({"text": "done"}));
    env.script(&lines)
}

fn shell(command: &str) -> (&'static str, Value) {
    ("shell", json!({ "command": command }))
}

/// Issue 25 (high): `exec 7<tree; cairn run …` let a staged
/// `rm -rf /proc/self/fd/7/sub` delete the real tree, and `: >
/// /proc/self/fd/8` empty a real file. Here cairn inherits a directory fd
/// on the tree, a read-write fd on a file of it, a read fd on a secret
/// outside it and a directory fd outside it; the staged call attacks
/// through all four.
#[test]
fn descriptors_cairn_inherited_reach_no_tool() {
    let env = Env::new();
    require_staging(&env);
    std::fs::create_dir_all(env.cwd.join("victim/sub")).unwrap();
    std::fs::write(env.cwd.join("victim/sub/deep.txt"), "deep\n").unwrap();
    std::fs::write(env.cwd.join("f.txt"), "line1\nline2\n").unwrap();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "INHERITED-SECRET\n").unwrap();
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    std::fs::write(outside.path().join("sub/keep.txt"), "keep\n").unwrap();
    let tree_before = snapshot(&env.cwd);
    let outside_before = snapshot(outside.path());

    let files = [
        std::fs::File::open(&env.cwd).unwrap(),
        std::fs::OpenOptions::new().read(true).write(true).open(env.cwd.join("f.txt")).unwrap(),
        std::fs::File::open(outside.path().join("secret.txt")).unwrap(),
        std::fs::File::open(outside.path()).unwrap(),
    ];
    // Out of the way of 7..=10 first (close-on-exec copies), so the dup2s
    // in the child cannot clobber each other.
    let high: Vec<i32> =
        files.iter().map(|f| unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) }).collect();
    assert!(high.iter().all(|fd| *fd >= 100));
    let attack = "rm -rf /proc/self/fd/7/victim; : > /proc/self/fd/8; cat <&9; cat /proc/self/fd/9; \
                  rm -rf /proc/self/fd/10/sub; ls -l /proc/self/fd/; echo END";
    let script = script_calls(&env, &[shell(attack)]);
    let mut cmd = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "go"]);
    let fds = high.clone();
    // SAFETY: dup2 only (async-signal-safe); the new fds 7..=10 are not
    // close-on-exec, exactly as a shell's `exec 7<dir` leaves them.
    unsafe {
        cmd.pre_exec(move || {
            for (i, fd) in fds.iter().enumerate() {
                if libc::dup2(*fd, 7 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    for fd in high {
        unsafe { libc::close(fd) };
    }
    drop(files);
    let text = session_text(&env);
    let log = entries(&text);
    assert!(
        types(&log).contains(&"toolStarted".to_owned()),
        "{:?} {}",
        types(&log),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(results(&text).contains("END"), "the attack ran to its end: {text}");
    assert_eq!(snapshot(&env.cwd), tree_before, "the tree changed through an inherited descriptor");
    assert_eq!(snapshot(outside.path()), outside_before, "a file outside changed through an inherited descriptor");
    assert!(!text.contains("INHERITED-SECRET"), "the secret was read through an inherited descriptor");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("INHERITED-SECRET"));
}

/// Issue 25 (high): without staging, `write_file cleanup.sh` then `bash
/// cleanup.sh` under `--yes` deleted `a.txt` without a person. Every
/// spelling that runs a file of the tree is now refused headless, also
/// under `--yes`. Oracle: plain bash running the same line on a copy does
/// delete `a.txt` (so the table cannot hold a line that does nothing).
#[test]
fn where_staging_is_off_running_a_file_of_the_tree_needs_a_person() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let tools = String::from_utf8_lossy(&env.cairn(&["tools"]).output().unwrap().stdout).into_owned();
    assert!(tools.contains("staging: off"), "{tools}");
    let sh = "rm -f a.txt\n";
    let cases: &[(&str, &str, &str)] = &[
        ("cleanup.sh", sh, "bash cleanup.sh"),
        ("cleanup.sh", sh, "sh cleanup.sh"),
        ("cleanup.sh", sh, "source cleanup.sh"),
        ("cleanup.sh", sh, ". ./cleanup.sh"),
        ("cleanup.sh", sh, "chmod +x cleanup.sh && ./cleanup.sh"),
        ("clean.py", "import os\nos.remove('a.txt')\n", "/usr/bin/python3 clean.py"),
        ("clean.py", "import os\nos.remove('a.txt')\n", "/usr/bin/python3 - < clean.py"),
        ("clean.js", "require('fs').unlinkSync('a.txt')\n", "node clean.js"),
        ("clean.pl", "unlink 'a.txt';\n", "perl clean.pl"),
        ("Makefile", "all:\n\trm -f a.txt\n", "make"),
        ("package.json", "{\"scripts\": {\"clean\": \"rm -f a.txt\"}}\n", "npm run clean"),
    ];
    let scratch = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (i, (file, content, line)) in cases.iter().enumerate() {
        // The oracle.
        let copy = scratch.path().join(format!("oracle{i}"));
        std::fs::create_dir(&copy).unwrap();
        std::fs::write(copy.join("a.txt"), "precious\n").unwrap();
        std::fs::write(copy.join(file), content).unwrap();
        let _ = Command::new("bash").arg("-c").arg(line).current_dir(&copy).env("HOME", &copy).output().unwrap();
        if copy.join("a.txt").exists() {
            failures.push(format!("{line:?}: plain bash did not delete a.txt (the table is wrong)"));
            continue;
        }
        // The attack: the model writes the file, then runs it, under
        // `--yes` and under rules allowing both tools whole.
        for flags in [&["--yes"][..], &["--allow", "shell(*)", "--allow", "write_file"][..]] {
            std::fs::remove_dir_all(&env.cwd).unwrap();
            std::fs::create_dir(&env.cwd).unwrap();
            std::fs::write(env.cwd.join("a.txt"), "precious\n").unwrap();
            let script = script_calls(&env, &[("write_file", json!({"path": file, "content": content})), shell(line)]);
            let args = [&["--script", script.to_str().unwrap()][..], flags, &["run", "go"][..]].concat();
            let out = env.cairn(&args).stdin(Stdio::null()).output().unwrap();
            let log = entries(&session_text(&env));
            let t = types(&log);
            if !env.cwd.join(file).exists() {
                failures.push(format!("{line:?} {flags:?}: write_file did not write {file}: {t:?}"));
            }
            if std::fs::read_to_string(env.cwd.join("a.txt")).ok().as_deref() != Some("precious\n") {
                let err = String::from_utf8_lossy(&out.stderr);
                failures.push(format!("{line:?} {flags:?}: A.TXT WAS DELETED: {t:?} {err}"));
            }
            if !t.contains(&"toolRejected".to_owned()) {
                failures.push(format!("{line:?} {flags:?}: not refused: {t:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The tree the item 46.5 attacks start from: a git repository with
/// `a.txt` committed and then changed (uncommitted "precious"), `b.txt`,
/// and files a tool planted earlier: an archive and a zip holding another
/// `a.txt`, a patch to it, a sed script with an `e` command and an
/// executable `x` that touches MARK. Built with bash, tar, zip and git.
fn git_fixture(dir: &Path) {
    let script = r#"set -e
git init -q .
printf 'committed\n' > a.txt
printf 'other\n' > b.txt
git add a.txt b.txt
git -c user.name=t -c user.email=t@example.org commit -qm init
printf 'precious\n' > a.txt
mkdir pack
printf 'from-tar\n' > pack/a.txt
tar cf evil.tar -C pack a.txt
printf 'from-zip\n' > pack/a.txt
(cd pack && zip -q ../evil.zip a.txt)
rm -r pack
printf -- '--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n-precious\n+patched\n' > evil.patch
printf '1e touch MARK\n' > x.sed
printf '#!/bin/sh\ntouch MARK\n' > x
chmod 755 x
"#;
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "the fixture needs bash, git, tar and zip: {}", String::from_utf8_lossy(&out.stderr));
}

/// Run `lines` with plain bash in `dir` (the oracle, and planting).
fn bash_in(dir: &Path, lines: &[&str]) {
    for line in lines {
        let _ = Command::new("bash")
            .arg("-c")
            .arg(line)
            .current_dir(dir)
            .env("HOME", dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
    }
}

/// The damage an attack does: `a.txt` no longer "precious", or MARK made
/// (a program run that the words did not show).
#[derive(Debug, Clone, Copy)]
enum Damage {
    AText,
    Mark,
}

impl Damage {
    fn done(self, dir: &Path) -> bool {
        match self {
            Damage::AText => std::fs::read_to_string(dir.join("a.txt")).ok().as_deref() != Some("precious\n"),
            Damage::Mark => dir.join("MARK").exists(),
        }
    }
}

/// Issue 46.5: without staging (`staged = false`), 16 of 40 destructive
/// lines went through headless under `--yes`: overwriting programs,
/// archive extraction, patching, and git commands that run what the
/// repository's configuration names — planned across calls (`git config
/// core.fsmonitor 'touch MARK'`, then `git status`), and with the
/// configuration planted before (`plant`, run here with bash). Each call
/// is now refused before it runs, under `--yes` and under a rule allowing
/// the whole tool. Oracle: plain bash running the same lines on a copy
/// does the damage, so no case is a line that does nothing.
#[test]
fn where_staging_is_off_overwriting_extracting_patching_and_git_need_a_person() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let tools = String::from_utf8_lossy(&env.cairn(&["tools"]).output().unwrap().stdout).into_owned();
    assert!(tools.contains("staging: off"), "{tools}");
    let fsmonitor = "git config core.fsmonitor 'touch MARK'";
    let alias = "git config alias.x '!rm a.txt'";
    let external = "git config diff.external ./x";
    // (planted before, the calls, the damage, a word of the reason)
    let cases: &[(&[&str], &[&str], Damage, &str)] = &[
        (&[], &["tee a.txt"], Damage::AText, "truncates"),
        (&[], &["sort -o a.txt b.txt"], Damage::AText, "over the file"),
        (&[], &["uniq b.txt a.txt"], Damage::AText, "second operand"),
        (&[], &["cp /dev/null a.txt"], Damage::AText, "replaces"),
        (&[], &["mv b.txt a.txt"], Damage::AText, "replaces"),
        (&[], &["install -m 644 b.txt a.txt"], Damage::AText, "replaces"),
        (&[], &["ln -sf b.txt a.txt"], Damage::AText, "replaces"),
        (&[], &["tar xf evil.tar"], Damage::AText, "extracts"),
        (&[], &["unzip -o evil.zip"], Damage::AText, "extracts"),
        (&[], &["patch -i evil.patch"], Damage::AText, "patch"),
        (&[], &["sed -f x.sed a.txt"], Damage::Mark, "script from a file"),
        (&[], &[alias, "git x"], Damage::AText, "configuration"),
        (&[alias], &["git x"], Damage::AText, "alias"),
        (&[], &[fsmonitor, "git status"], Damage::Mark, "configuration"),
        (&[fsmonitor], &["git status"], Damage::Mark, "configuration"),
        (&[], &[external, "git diff"], Damage::Mark, "configuration"),
        (&[external], &["git diff"], Damage::Mark, "configuration"),
        (&[], &["git checkout a.txt"], Damage::AText, "overwrites working files"),
        (&[], &["git stash"], Damage::AText, "uncommitted changes"),
        // Hostile spellings.
        (&[], &["command tee a.txt"], Damage::AText, "truncates"),
        (&[], &["sort --outp=a.txt b.txt"], Damage::AText, "over the file"),
        (&[], &["cp -f b.txt a.txt"], Damage::AText, "replaces"),
        (&[], &["tar --extract -f evil.tar"], Damage::AText, "extracts"),
        (&[], &["env git -c core.fsmonitor='touch MARK' status"], Damage::Mark, "configuration"),
        (&[fsmonitor], &["/usr/bin/env git --no-pager status"], Damage::Mark, "configuration"),
        (&[], &["'git' stash"], Damage::AText, "uncommitted changes"),
    ];
    let scratch = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (i, (plant, calls, damage, why)) in cases.iter().enumerate() {
        // The oracle.
        let copy = scratch.path().join(format!("oracle{i}"));
        std::fs::create_dir(&copy).unwrap();
        git_fixture(&copy);
        bash_in(&copy, plant);
        bash_in(&copy, calls);
        if !damage.done(&copy) {
            failures.push(format!("{calls:?}: plain bash did no {damage:?} damage (the table is wrong)"));
            continue;
        }
        for flags in [&["--yes"][..], &["--allow", "shell(*)"][..]] {
            std::fs::remove_dir_all(&env.cwd).unwrap();
            std::fs::create_dir(&env.cwd).unwrap();
            git_fixture(&env.cwd);
            bash_in(&env.cwd, plant);
            let before = snapshot(&env.cwd);
            let script = script_calls(&env, &calls.iter().map(|c| shell(c)).collect::<Vec<_>>());
            let args = [&["--script", script.to_str().unwrap()][..], flags, &["run", "go"][..]].concat();
            let out = env.cairn(&args).stdin(Stdio::null()).output().unwrap();
            let text = session_text(&env);
            let log = entries(&text);
            let t = types(&log);
            if damage.done(&env.cwd) || snapshot(&env.cwd) != before {
                let err = String::from_utf8_lossy(&out.stderr);
                failures.push(format!("{calls:?} {flags:?}: THE TREE CHANGED ({damage:?}): {t:?} {err}"));
            }
            let rejected = t.iter().filter(|x| *x == "toolRejected").count();
            if rejected != calls.len() || t.iter().any(|x| x == "toolStarted") {
                failures.push(format!("{calls:?} {flags:?}: not every call refused before it ran: {t:?}"));
            }
            if !results(&text).contains(why) {
                failures.push(format!("{calls:?} {flags:?}: the reason does not say {why:?}: {}", results(&text)));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Issue 25 (low): a staged call's `/tmp` is a tmpfs of its own: it writes
/// there, the host's `/tmp` never sees it, and the host's `/tmp` cannot be
/// listed.
#[test]
fn a_staged_call_has_a_private_tmp() {
    let env = Env::new();
    require_staging(&env);
    let marker = format!("cairn-cli-host-marker-{}", std::process::id());
    let probe = format!("cairn-cli-private-probe-{}", std::process::id());
    std::fs::write(Path::new("/tmp").join(&marker), "host\n").unwrap();
    let line = format!("echo PRIVATE-TMP > /tmp/{probe} && cat /tmp/{probe}; ls -A /tmp; echo END");
    let script = script_calls(&env, &[shell(&line)]);
    let out =
        env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "go"]).stdin(Stdio::null()).output().unwrap();
    let host_probe = Path::new("/tmp").join(&probe).exists();
    let _ = std::fs::remove_file(Path::new("/tmp").join(&probe));
    let _ = std::fs::remove_file(Path::new("/tmp").join(&marker));
    let text = results(&session_text(&env));
    assert!(text.contains("END"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("PRIVATE-TMP"), "the call could not write its /tmp: {text}");
    assert!(!host_probe, "the call's /tmp write reached the host's /tmp");
    assert!(!text.contains(&marker), "the call listed the host's /tmp: {text}");
}

/// Issue 25 (high): a `shell` call spoke 9P to `$CAIRN_HOME/cairn.sock`
/// and escalated. With `cairn serve` listening on its home, a session's
/// tool can neither list the home nor connect to the socket (Landlock
/// before ABI 9 does not check `connect()` on a pathname socket: only the
/// cover over the home stops it).
#[test]
fn a_tool_cannot_see_cairns_home_nor_reach_cairn_serve() {
    let env = Env::new();
    let tools = String::from_utf8_lossy(&env.cairn(&["tools"]).output().unwrap().stdout).into_owned();
    assert!(tools.contains("cairn's home: hidden from tools"), "{tools}");
    let mut served = env.cairn(&["serve"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(served.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let sock = env.home.join("cairn.sock");
    assert!(sock.exists(), "cairn serve listens on {}: printed {first:?}", sock.display());
    // Control: the test itself can connect (the socket is live).
    std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let line = format!(
        "ls -A {h}; /usr/bin/python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); \
         print('CONNECTED-TO-SERVE')\" {s}; echo END",
        h = env.home.display(),
        s = sock.display()
    );
    for flags in [&["--yes"][..], &["--allow", "shell(*)"][..]] {
        let script = script_calls(&env, &[shell(&line)]);
        let mut args = vec!["--script", script.to_str().unwrap()];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["run", "go"]);
        let out = env.cairn(&args).stdin(Stdio::null()).output().unwrap();
        let text = session_text(&env);
        let result = results(&text);
        assert!(result.contains("END"), "{flags:?}: the call ran: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(!result.contains("CONNECTED-TO-SERVE"), "{flags:?}: a tool connected to cairn serve: {result}");
        assert!(
            !result.contains("config.toml") && !result.contains("script.jsonl"),
            "{flags:?}: listed the home: {result}"
        );
    }
    let _ = served.kill();
    let _ = served.wait();
}

/// The isolation attacks above and in `reads`, as uid 65534 (a user
/// namespace instead of root's namespaces): the same answers.
#[test]
fn the_isolation_holds_for_a_non_root_user_too() {
    let passed = util::rerun_as_non_root("the_isolation_holds_for_a_non_root_user_too");
    assert_eq!(passed, 9, "as uid 65534 not every isolation test ran");
}
