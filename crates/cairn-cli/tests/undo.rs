//! Undo (issue 30) with the real `cairn` binary and the scripted provider:
//! for each kind of file effect (staged shell creating, editing,
//! deleting, renaming, chmod-ing files and directories, links and empty
//! directories; `write_file`; `edit_file`) a turn runs, `cairn undo`
//! reverts it and the tree equals, byte for byte, the test's own snapshot
//! taken before the turn (content, kind, mode, link target). Three turns
//! undone to the first and redone; a file edited by hand after the turn
//! refuses the undo (named, with a diff) until `--force`; SIGKILLs at
//! random moments of an undo, then `cairn undo` again: the tree ends at
//! the target.
//!
//! Oracle: `util::snapshot` of the working tree, never cairn's store.
//! Destructive effects are approved in a pseudo-terminal (rexpect), as a
//! person would. These tests need overlay staging (`require_staging`).

#![allow(clippy::unwrap_used)]

use crate::util;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use rexpect::reader::ReadUntil;
use serde_json::{Value, json};
use util::{Env, entries, require_staging, snapshot};

type Tree = BTreeMap<String, (char, u32, Vec<u8>)>;

/// A tree with text and binary files, an executable, a directory with a
/// subdirectory, an empty directory and a link.
fn fixture(dir: &Path) {
    std::fs::create_dir_all(dir.join("victim/sub")).unwrap();
    std::fs::write(dir.join("victim/data.txt"), "keep me\n").unwrap();
    std::fs::write(dir.join("victim/sub/deep.bin"), [0u8, 1, 2, 3, 255, 0, 7]).unwrap();
    let lines: String = (1..=10).map(|i| format!("line{i}\n")).collect();
    std::fs::write(dir.join("f.txt"), lines).unwrap();
    std::fs::write(dir.join("keep.txt"), "keep\n").unwrap();
    std::fs::write(dir.join("script.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(dir.join("script.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let binary: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(dir.join("bin.dat"), binary).unwrap();
    std::fs::create_dir(dir.join("empty")).unwrap();
    std::os::unix::fs::symlink("f.txt", dir.join("link")).unwrap();
}

fn shell(id: &str, command: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": id, "name": "shell", "arguments": {"command": command}}]})
}

fn write_file(id: &str, path: &str, content: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": id, "name": "write_file", "arguments": {"path": path, "content": content}}]})
}

fn edit_file(id: &str, path: &str, old: &str, new: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": id, "name": "edit_file", "arguments": {"path": path, "old": old, "new": new}}]})
}

fn done(text: &str) -> Value {
    json!({"text": text})
}

/// Run `cairn --script S --yes ARGS` in a pseudo-terminal, approving every
/// Destructive effect it asks about; its output. Fails unless it exits 0.
fn turn(env: &Env, script: &Path, args: &[&str]) -> String {
    let mut all = vec!["--script", script.to_str().unwrap(), "--yes"];
    all.extend_from_slice(args);
    let mut p = rexpect::session::spawn_command(env.cairn(&all), Some(30_000)).unwrap();
    let mut shown = String::new();
    loop {
        let (before, matched) = p.exp_any(vec![ReadUntil::String("Run it? [y/N".to_owned()), ReadUntil::EOF]).unwrap();
        shown.push_str(&before);
        if matched.starts_with("Run it?") {
            p.send_line("y").unwrap();
            p.flush().unwrap();
        } else {
            shown.push_str(&matched);
            break;
        }
    }
    match p.process().wait().unwrap() {
        rexpect::process::WaitStatus::Exited(_, 0) => shown,
        other => panic!("cairn {args:?} did not succeed: {other:?}\n{shown}"),
    }
}

fn session(env: &Env) -> PathBuf {
    let files = env.session_files();
    assert_eq!(files.len(), 1, "one session: {files:?}");
    files[0].clone()
}

fn session_id(env: &Env) -> String {
    session(env).file_stem().unwrap().to_string_lossy().into_owned()
}

/// `cairn ARGS` headless: (exit code, stdout, stderr).
fn cairn(env: &Env, args: &[&str]) -> (i32, String, String) {
    let out = env.cairn(args).stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_tree(env: &Env, expected: &Tree, what: &str) {
    let now = snapshot(&env.cwd);
    if &now != expected {
        let mut diffs = Vec::new();
        for (k, v) in expected {
            match now.get(k) {
                None => diffs.push(format!("missing {k}")),
                Some(n) if n != v => {
                    diffs.push(format!("differs {k}: {:?} {:o} vs expected {:?} {:o}", n.0, n.1, v.0, v.1))
                }
                _ => {}
            }
        }
        for k in now.keys().filter(|k| !expected.contains_key(*k)) {
            diffs.push(format!("extra {k}"));
        }
        panic!("{what}: the tree is not as expected:\n{}", diffs.join("\n"));
    }
}

/// One turn running `call`, undone: the tree equals its snapshot before,
/// and the call really changed it (so a no-op cannot pass).
fn undo_one(call: Value) {
    undo_one_in(Env::new(), call);
}

fn undo_one_in(env: Env, call: Value) {
    require_staging(&env);
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let script = env.script(&[call.clone(), done("Done.")]);
    turn(&env, &script, &["run", "go"]);
    let after = snapshot(&env.cwd);
    assert_ne!(after, before, "the call changed nothing: {call}");
    let file = session(&env);
    let staged: Vec<Value> = entries(&file).into_iter().filter(|e| e["type"] == "toolStaged").collect();
    assert_eq!(staged.len(), 1, "{call}");
    assert_eq!(staged[0]["payload"]["preimages"]["status"], "kept", "{call}");
    let (code, out, err) = cairn(&env, &["undo", &session_id(&env)]);
    assert_eq!(code, 0, "{call}: {out}{err}");
    assert_tree(&env, &before, &format!("after undo of {call}"));
    // The undo is in the log, and the lane moved back with it.
    let all = entries(&file);
    assert_eq!(all.iter().filter(|e| e["type"] == "undo").count(), 1);
    let applied: Vec<&Value> = all.iter().filter(|e| e["type"] == "undoApplied").collect();
    assert_eq!(applied.len(), 1);
    // Redo puts the turn's effect back.
    let (code, out, err) = cairn(&env, &["redo", &session_id(&env)]);
    assert_eq!(code, 0, "{call}: {out}{err}");
    assert_tree(&env, &after, &format!("after redo of {call}"));
}

#[test]
fn undo_of_shell_creating_files_directories_and_links() {
    undo_one(shell("c1", "mkdir -p newdir/sub && echo hi > newdir/sub/f && mkdir emptynew && ln -s keep.txt newlink"));
}

#[test]
fn undo_of_shell_editing_files() {
    undo_one(shell("c1", "echo more >> f.txt && sed -i s/line2/LINE2/ f.txt && printf 'x' >> victim/data.txt"));
}

#[test]
fn undo_of_shell_deleting_files_directories_and_links() {
    undo_one(shell("c1", "rm -rf victim && rm keep.txt link && rmdir empty"));
}

#[test]
fn undo_of_shell_overwriting_a_binary_file() {
    undo_one(shell("c1", "printf 'ABC' > bin.dat"));
}

#[test]
fn undo_of_shell_renaming_files_and_directories() {
    undo_one(shell("c1", "mv f.txt g.txt && mv victim moved && mv link link2"));
}

#[test]
fn undo_of_shell_chmod_of_files_and_directories() {
    undo_one(shell("c1", "chmod 600 script.sh && chmod 700 victim/sub && chmod 000 keep.txt && chmod 751 empty"));
}

#[test]
fn undo_of_write_file_creating_and_overwriting() {
    undo_one(write_file("c1", "a/b/new.txt", "new\n"));
    undo_one(write_file("c1", "f.txt", "replaced\n"));
}

/// An external tool declaring fileWrite runs staged; its effect is undone
/// like a shell command's. (Shell builtins only: without processSpawn the
/// sandbox gives the tool no fork.)
#[test]
fn undo_of_an_external_tool_with_file_write() {
    let env = Env::new();
    let tools = env.home.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let exe = tools.join("scribble");
    std::fs::write(
        &exe,
        "#!/bin/sh\nread -r args\nprintf 'scribbled\\n' > f.txt\nprintf 'new\\n' > made.txt\necho done\n",
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        tools.join("scribble.toml"),
        "description = \"Scribble\"\nrisk = \"write\"\ncapabilities = [\"fileWrite\"]\nreplay = \"never\"\n[parameters]\ntype = \"object\"\n",
    )
    .unwrap();
    undo_one_in(env, json!({"text": "", "toolCalls": [{"id": "c1", "name": "scribble", "arguments": {}}]}));
}

#[test]
fn undo_of_edit_file() {
    undo_one(edit_file("c1", "f.txt", "line3\n", "LINE THREE\n"));
}

/// Three turns (write_file, a destructive shell command, edit_file and a
/// mkdir), undone to before the first; redo twice… once: the undo of all
/// three is one undo, so one redo puts all three back.
#[test]
fn three_turns_undone_to_the_first_and_redone() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let script = env.script(&[
        write_file("c1", "notes.md", "one\ntwo\n"),
        done("Turn one."),
        shell("c2", "echo three >> notes.md && rm -r victim"),
        done("Turn two."),
        edit_file("c3", "notes.md", "two\n", "TWO\n"),
        shell("c4", "mkdir built && echo out > built/x"),
        done("Turn three."),
    ]);
    turn(&env, &script, &["run", "first"]);
    let id = session_id(&env);
    turn(&env, &script, &["resume", &id, "--prompt", "second"]);
    turn(&env, &script, &["resume", &id, "--prompt", "third"]);
    let after = snapshot(&env.cwd);
    assert_eq!(std::fs::read_to_string(env.cwd.join("notes.md")).unwrap(), "one\nTWO\nthree\n");
    // --dry-run changes nothing and says what would change.
    let (code, out, err) = cairn(&env, &["undo", &id, "--turn", "1", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("notes.md") && out.contains("victim/data.txt") && out.contains("built/x"), "{out}");
    assert_tree(&env, &after, "after a dry run");
    let (code, out, err) = cairn(&env, &["undo", &id, "--turn", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("4 effect(s)"), "{out}");
    assert_tree(&env, &before, "after undo --turn 1");
    // The conversation went back too: the lane's head is the undo, with no
    // message before it.
    let (code, out, _) = cairn(&env, &["show", &id]);
    assert_eq!(code, 0);
    assert!(out.contains("undo"), "{out}");
    let (code, out, err) = cairn(&env, &["redo", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert_tree(&env, &after, "after redo");
    // A second redo has nothing to do.
    let (code, out, _) = cairn(&env, &["redo", &id]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to redo"), "{out}");
    // Undo of the last turn only: the edit and the mkdir go, turn two stays.
    let (code, out, err) = cairn(&env, &["undo", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("notes.md")).unwrap(), "one\ntwo\nthree\n");
    assert!(!env.cwd.join("built").exists() && !env.cwd.join("victim").exists());
}

#[test]
fn a_file_changed_by_hand_after_the_turn_refuses_the_undo_until_force() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let script = env.script(&[shell("c1", "sed -i s/line2/LINE2/ f.txt && echo new > new.txt"), done("Done.")]);
    turn(&env, &script, &["run", "go"]);
    let id = session_id(&env);
    std::fs::write(env.cwd.join("f.txt"), "my own edit\n").unwrap();
    let edited = snapshot(&env.cwd);
    let (code, out, err) = cairn(&env, &["undo", &id]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("f.txt: it was changed after the turn"), "names the file: {err}");
    assert!(err.contains("+my own edit") && err.contains("-line1"), "with a diff: {err}");
    assert!(!err.contains("new.txt:"), "only the changed file: {err}");
    assert_tree(&env, &edited, "after a refused undo");
    let (code, out, err) = cairn(&env, &["undo", &id, "--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_tree(&env, &before, "after undo --force");
    // The hand edit was kept: redo puts it back.
    let (code, out, err) = cairn(&env, &["redo", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert_tree(&env, &edited, "after redo of a forced undo");
}

#[test]
fn an_unstaged_effect_makes_undo_refuse_and_show_tools_says_so() {
    let env = Env::new();
    fixture(&env.cwd);
    std::fs::create_dir_all(&env.home).unwrap();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let script = env.script(&[shell("c1", "echo hi > made.txt"), done("Done.")]);
    turn(&env, &script, &["run", "go"]);
    let id = session_id(&env);
    let (code, _, err) = cairn(&env, &["undo", &id]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot be undone") && err.contains("shell"), "{err}");
    assert!(env.cwd.join("made.txt").exists(), "nothing changed");
    let (code, out, _) = cairn(&env, &["show", &id, "--tools"]);
    assert_eq!(code, 0);
    assert!(out.contains("cannot be undone"), "{out}");
}

/// SIGKILL at random moments of an undo of a turn that changed hundreds
/// of files, then `cairn undo` again: the tree is exactly as before the
/// turn, and the log holds one finished undo.
#[test]
fn sigkill_during_undo_then_undo_again_ends_at_the_target() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    std::fs::create_dir(env.cwd.join("many")).unwrap();
    for i in 0..300 {
        std::fs::write(env.cwd.join(format!("many/{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let script = env.script(&[
        write_file("c0", "first.txt", "first\n"),
        done("Turn one."),
        shell("c1", "for i in $(seq 0 299); do echo changed $i >> many/$i.txt; done; rm -rf victim; mkdir -p gen; for i in $(seq 0 199); do echo $i > gen/$i; done"),
        done("Turn two."),
    ]);
    turn(&env, &script, &["run", "first"]);
    let id = session_id(&env);
    let target = snapshot(&env.cwd);
    // The entry the undo goes back to: the last of turn one.
    let last_of_one = entries(&session(&env)).last().unwrap()["id"].as_str().unwrap().to_owned();
    turn(&env, &script, &["resume", &id, "--prompt", "second"]);
    assert_ne!(snapshot(&env.cwd), target);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut killed = 0;
    let mut mid_apply = 0;
    for round in 0..30 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut child = env
            .cairn(&["undo", &id, "--to", &last_of_one])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_micros(seed % 120_000));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.code().is_none() {
            killed += 1;
        }
        // Whether this kill left a plan without its completion (so the
        // next run must finish it): seen, not required (timing decides).
        let all = entries(&session(&env));
        let plans = all.iter().filter(|e| e["type"] == "undo").count();
        let applied = all.iter().filter(|e| e["type"] == "undoApplied").count();
        if plans > applied {
            mid_apply += 1;
        }
        eprintln!("round {round}: killed {killed}, interrupted after the plan {mid_apply}");
    }
    let (code, out, err) = cairn(&env, &["undo", &id, "--to", &last_of_one]);
    assert_eq!(code, 0, "{out}{err}");
    // Finishing an interrupted undo stops there; the next run has nothing left.
    let (code, out, err) = cairn(&env, &["undo", &id, "--to", &last_of_one]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("nothing to undo"), "{out}");
    assert_tree(&env, &target, "after killed undos and a final one");
    assert!(killed > 0, "no undo was killed; the test proved nothing");
    let all = entries(&session(&env));
    let applied = all.iter().filter(|e| e["type"] == "undoApplied").count();
    assert_eq!(applied, 1, "one finished undo");
    let plans = all.iter().filter(|e| e["type"] == "undo").count();
    assert_eq!(plans, 1, "one plan, finished by whichever run came after it");
}

/// Past the budget (`tools.undo_max_bytes`), an effect is applied without
/// its prior contents: it is marked not undoable in the log and in
/// `cairn show --tools`, and undo refuses (naming it) unless `--force`.
#[test]
fn an_effect_over_the_undo_budget_is_applied_but_cannot_be_undone() {
    let env = Env::new();
    fixture(&env.cwd);
    std::fs::write(env.home.join("config.toml"), "[tools]\nundo_max_bytes = 16\n").unwrap();
    // f.txt is 60 bytes: over the budget; a new file has no prior content.
    let script =
        env.script(&[write_file("c1", "small.txt", "new\n"), write_file("c2", "f.txt", "replaced\n"), done("Done.")]);
    turn(&env, &script, &["run", "go"]);
    let id = session_id(&env);
    assert_eq!(std::fs::read_to_string(env.cwd.join("f.txt")).unwrap(), "replaced\n", "applied all the same");
    let staged: Vec<Value> = entries(&session(&env)).into_iter().filter(|e| e["type"] == "toolStaged").collect();
    assert_eq!(staged.len(), 2);
    assert_eq!(staged[0]["payload"]["preimages"]["status"], "kept");
    assert_eq!(staged[1]["payload"]["preimages"]["status"], "notKept");
    let (code, _, err) = cairn(&env, &["undo", &id]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("write_file") && err.contains("over the undo budget of 16 bytes"), "{err}");
    assert!(env.cwd.join("small.txt").exists(), "nothing changed");
    let (_, out, _) = cairn(&env, &["show", &id, "--tools"]);
    assert!(out.contains("cannot be undone: its prior state was not kept"), "{out}");
    assert!(out.contains("can be undone (its prior state is kept)"), "{out}");
    // --force reverts what it can: the new file goes, f.txt stays.
    let (code, out, err) = cairn(&env, &["undo", &id, "--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("not undone: write_file"), "{out}");
    assert!(!env.cwd.join("small.txt").exists());
    assert_eq!(std::fs::read_to_string(env.cwd.join("f.txt")).unwrap(), "replaced\n");
}

/// An undo killed after its plan was committed, then `cairn resume` with a
/// new prompt: the undo is finished first (the tree at its target), and
/// the new turn continues from where the undo moved the lane.
#[test]
fn resume_finishes_an_interrupted_undo_before_the_next_turn() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    std::fs::create_dir(env.cwd.join("many")).unwrap();
    for i in 0..300 {
        std::fs::write(env.cwd.join(format!("many/{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let script = env.script(&[
        write_file("c0", "first.txt", "first\n"),
        done("Turn one."),
        shell("c1", "for i in $(seq 0 299); do echo changed $i >> many/$i.txt; done; rm -rf victim"),
        done("Turn two."),
    ]);
    turn(&env, &script, &["run", "first"]);
    let id = session_id(&env);
    let target = snapshot(&env.cwd);
    turn(&env, &script, &["resume", &id, "--prompt", "second"]);
    // Kill the undo once its plan is in the session file, before its
    // completion: on the event (the plan line), not after a guessed delay,
    // which a loaded machine outran (no kill in 200 landed, 42 s lost).
    // Restoring 300 files takes far longer than one read of the file.
    let file = session(&env);
    // Complete lines only: the undo may be writing the last one.
    let count = |kind: &str| {
        let text = std::fs::read_to_string(&file).unwrap();
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        util::entries_of_text(complete).iter().filter(|e| e["type"] == kind).count()
    };
    let mut child =
        env.cairn(&["undo", &id]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    while count("undo") == 0 && child.try_wait().unwrap().is_none() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let _ = child.kill();
    let _ = child.wait();
    let (plans, applied) = (count("undo"), count("undoApplied"));
    assert_eq!(plans, 1, "the undo wrote no plan before it ended (or was killed)");
    assert_eq!(applied, 0, "the undo finished before the kill; the test cannot show what it is for");
    let script = env.script(&[done("-"), done("-"), done("Turn three.")]);
    let out = turn(&env, &script, &["resume", &id, "--prompt", "third"]);
    assert!(out.contains("finished the interrupted undo"), "{out}");
    assert!(out.contains("Turn three."), "{out}");
    assert_tree(&env, &target, "after resume finished the undo");
    let all = entries(&session(&env));
    assert_eq!(all.iter().filter(|e| e["type"] == "undoApplied").count(), 1);
}

/// `/undo` and `/redo` in `cairn chat`, in a pseudo-terminal.
#[test]
fn chat_undo_and_redo() {
    let env = Env::new();
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let script = env.script(&[write_file("c1", "a.txt", "from chat\n"), done("Wrote it.")]);
    let mut p = rexpect::session::spawn_command(
        env.cairn(&["--script", script.to_str().unwrap(), "--yes", "chat"]),
        Some(30_000),
    )
    .unwrap();
    p.exp_string("/undo").unwrap();
    p.send_line("write a.txt").unwrap();
    p.exp_string("Wrote it.").unwrap();
    assert_eq!(std::fs::read_to_string(env.cwd.join("a.txt")).unwrap(), "from chat\n");
    let after = snapshot(&env.cwd);
    p.send_line("/undo").unwrap();
    p.exp_string("path(s) restored").unwrap();
    assert_tree(&env, &before, "after /undo");
    p.send_line("/undo 7").unwrap();
    p.exp_string("no turn 7").unwrap();
    p.send_line("/redo").unwrap();
    p.exp_string("path(s) restored").unwrap();
    assert_tree(&env, &after, "after /redo");
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}

/// The tests above rerun as uid 65534, whose staging goes through an
/// unprivileged user namespace and who cannot read a file it made mode
/// 000 without cairn's care (`util::rerun_as_non_root`).
#[test]
fn the_undo_tests_pass_as_a_non_root_user() {
    if std::env::var_os(util::AS_NON_ROOT).is_some() {
        return;
    }
    let passed = util::rerun_as_non_root("the_undo_tests_pass_as_a_non_root_user");
    assert!(passed >= 15, "as uid 65534 only {passed} tests ran");
}

/// A subagent's calls are its own session's: undoing the parent's turn
/// that spawned it refuses, naming spawn_agent, instead of leaving the
/// child's files silently in place.
#[test]
fn undo_of_a_turn_that_spawned_a_subagent_refuses_naming_it() {
    let env = Env::new();
    fixture(&env.cwd);
    let write = |name: &str, lines: &[Value]| {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(env.home.join(name), text).unwrap();
    };
    write(
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "write it", "script": "child.jsonl"}}]}),
            done("The child wrote it."),
        ],
    );
    write("child.jsonl", &[write_file("c1", "child.txt", "from the child\n"), done("Wrote it.")]);
    let parent = env.home.join("parent.jsonl");
    let (code, out, err) = cairn(&env, &["--script", parent.to_str().unwrap(), "--yes", "run", "go"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(env.cwd.join("child.txt").exists(), "the child wrote: {out}{err}");
    let ids: Vec<String> =
        env.session_files().iter().map(|f| f.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    let parent_id = ids.iter().find(|id| !id.contains('+')).unwrap();
    let child_id = ids.iter().find(|id| id.contains('+')).unwrap();
    let (code, out, err) = cairn(&env, &["undo", parent_id]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("spawn_agent") && err.contains("another session"), "{err}");
    assert!(env.cwd.join("child.txt").exists(), "nothing changed");
    // The child's own session undoes its write.
    let (code, out, err) = cairn(&env, &["undo", child_id]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!env.cwd.join("child.txt").exists());
}

/// `cairn show --tools` (human and `--json`) marks each call of a turn
/// holding an undoable effect (`write_file`), one that is not (a
/// `spawn_agent`, whose child's calls are its own session's) and one with
/// no effect (`read_file`) by the rule undo itself uses: the calls show
/// marks not undoable are exactly those the undo refuses naming, with the
/// turn, and `--force` reverts the rest and says what it did not.
#[test]
fn show_tools_marks_each_call_as_undo_judges_it() {
    let env = Env::new();
    fixture(&env.cwd);
    let write = |name: &str, lines: &[Value]| {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(env.home.join(name), text).unwrap();
    };
    write(
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [
                {"id": "w1", "name": "write_file", "arguments": {"path": "mine.txt", "content": "parent\n"}},
                {"id": "r1", "name": "read_file", "arguments": {"path": "keep.txt"}},
                {"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "write it", "script": "child.jsonl"}},
            ]}),
            done("Both wrote."),
        ],
    );
    write("child.jsonl", &[write_file("c1", "child.txt", "from the child\n"), done("Wrote it.")]);
    let parent = env.home.join("parent.jsonl");
    let (code, out, err) = cairn(&env, &["--script", parent.to_str().unwrap(), "--yes", "run", "go"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(env.cwd.join("mine.txt").exists() && env.cwd.join("child.txt").exists(), "{out}{err}");
    let parent_id = env
        .session_files()
        .iter()
        .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
        .find(|id| !id.contains('+'))
        .unwrap();

    let (code, json_out, err) = cairn(&env, &["--json", "show", "--tools", &parent_id]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Value> = json_out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let row = |tool: &str| rows.iter().find(|r| r["tool"] == tool).unwrap_or_else(|| panic!("{tool}: {json_out}"));
    assert_eq!(row("write_file")["undo"]["status"], "undoable", "{json_out}");
    assert_eq!(row("read_file")["undo"]["status"], "noEffect", "{json_out}");
    assert_eq!(row("spawn_agent")["undo"]["status"], "notUndoable", "{json_out}");
    assert!(row("spawn_agent")["undo"]["reason"].as_str().unwrap().contains("another session"), "{json_out}");

    let (code, human, _) = cairn(&env, &["show", "--tools", &parent_id]);
    assert_eq!(code, 0);
    let block = |tool: &str| {
        human
            .split("\n\n")
            .find(|b| b.split_whitespace().nth(1).is_some_and(|t| t.trim_end_matches(':') == tool))
            .unwrap_or_else(|| panic!("{tool}: {human}"))
    };
    assert!(block("write_file").contains("undo      can be undone"), "{human}");
    assert!(block("read_file").contains("undo      nothing to undo"), "{human}");
    assert!(block("spawn_agent").contains("undo      cannot be undone: spawn_agent ran in another session"), "{human}");

    // Undo refuses naming exactly the calls show marks not undoable, and
    // the turn they are in.
    let (code, out, err) = cairn(&env, &["undo", &parent_id]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("these effects of turn 1 cannot be undone"), "{err}");
    for r in &rows {
        let named = err.contains(&format!("({}, turn 1)", r["invocationId"].as_str().unwrap()));
        assert_eq!(named, r["undo"]["status"] == "notUndoable", "{r}\nundo said:\n{err}");
    }
    assert!(env.cwd.join("mine.txt").exists(), "nothing changed");

    // --force reverts the parent's own write and says what it did not revert.
    let (code, out, err) = cairn(&env, &["undo", &parent_id, "--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("not fully reverted (turn 1)") && out.contains("not undone: spawn_agent"), "{out}");
    assert!(!env.cwd.join("mine.txt").exists(), "{out}");
    assert!(env.cwd.join("child.txt").exists(), "the child's session holds its write: {out}");
}

/// The blob of the prior content of `path` a session's `toolStaged`
/// recorded.
fn kept_blob(env: &Env, session: &Path, path: &str) -> PathBuf {
    let staged = entries(session).into_iter().find(|e| e["type"] == "toolStaged").unwrap();
    let change = staged["payload"]["changeSet"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == path)
        .unwrap()
        .clone();
    let sha = change["before"]["sha256"].as_str().unwrap().to_owned();
    env.home.join("preimages").join(&sha[..2]).join(&sha)
}

/// Every file of the pre-image store made two days old (past the grace).
fn age_store(env: &Env) {
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 24 * 3600);
    for shard in std::fs::read_dir(env.home.join("preimages")).unwrap() {
        let shard = shard.unwrap().path();
        if shard.is_dir() {
            for blob in std::fs::read_dir(&shard).unwrap() {
                let f = std::fs::OpenOptions::new().write(true).open(blob.unwrap().path()).unwrap();
                f.set_modified(old).unwrap();
            }
        }
    }
}

/// A turn in a new session writing `path`; (its session file, the blob of
/// the prior content of `path`).
fn session_writing(env: &Env, path: &str, content: &str) -> (PathBuf, PathBuf) {
    let before: Vec<PathBuf> = env.session_files();
    let script = env.script(&[write_file("c1", path, content), done("Done.")]);
    let (code, out, err) = cairn(env, &["--script", script.to_str().unwrap(), "--yes", "run", "go"]);
    assert_eq!(code, 0, "{out}{err}");
    let file = env.session_files().into_iter().find(|f| !before.contains(f)).unwrap();
    let blob = kept_blob(env, &file, path);
    assert!(blob.is_file(), "the prior content of {path} is kept");
    (file, blob)
}

/// The pre-image store's garbage collection: a pre-image a session names
/// survives (and that session still undoes), one whose session is gone
/// goes — by `cairn undo --gc`, and after a turn once the store is over
/// `tools.undo_store_max_bytes`; a young one stays (the grace); a dry run
/// removes nothing.
#[test]
fn gc_removes_only_the_pre_images_no_session_names() {
    let env = Env::new();
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let (kept_session, named) = session_writing(&env, "f.txt", "replaced\n");
    let (gone_session, orphan) = session_writing(&env, "keep.txt", "changed\n");
    std::fs::remove_file(&gone_session).unwrap();
    // Young: nothing is removed yet, even unnamed.
    let (code, out, err) = cairn(&env, &["undo", "--gc"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("removed 0 pre-image(s)"), "{out}");
    assert!(orphan.is_file() && named.is_file());
    age_store(&env);
    let (code, out, err) = cairn(&env, &["undo", "--gc", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("would remove 1 pre-image(s)"), "{out}");
    assert!(orphan.is_file(), "a dry run removes nothing");
    let (code, out, err) = cairn(&env, &["undo", "--gc"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("removed 1 pre-image(s)") && out.contains("kept 1 a session names"), "{out}");
    assert!(!orphan.exists(), "the pre-image no session names went");
    assert!(named.is_file(), "the pre-image a session names stayed");

    // Past the store's budget, a turn collects by itself.
    let (gone_session, orphan) = session_writing(&env, "victim/data.txt", "changed\n");
    std::fs::remove_file(&gone_session).unwrap();
    age_store(&env);
    std::fs::write(env.home.join("config.toml"), "[tools]\nundo_store_max_bytes = 1\n").unwrap();
    let script = env.script(&[done("Hello.")]);
    let (code, out, err) = cairn(&env, &["--script", script.to_str().unwrap(), "run", "hi"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("over its budget") && err.contains("removed 1 pre-image(s)"), "{err}");
    assert!(!orphan.exists() && named.is_file());
    // The session that names its pre-image still undoes exactly.
    std::fs::write(env.cwd.join("keep.txt"), "keep\n").unwrap();
    std::fs::write(env.cwd.join("victim/data.txt"), "keep me\n").unwrap();
    let id = kept_session.file_stem().unwrap().to_string_lossy().into_owned();
    let (code, out, err) = cairn(&env, &["undo", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert_tree(&env, &before, "after undo of the session whose pre-image was kept");
}

/// `cairn --script S --yes ARGS` in a pseudo-terminal that answers `n` to
/// every question; its exit code.
fn declined_turn(env: &Env, script: &Path, args: &[&str]) -> i32 {
    let mut all = vec!["--script", script.to_str().unwrap(), "--yes"];
    all.extend_from_slice(args);
    let mut p = rexpect::session::spawn_command(env.cairn(&all), Some(30_000)).unwrap();
    loop {
        let (_, matched) = p.exp_any(vec![ReadUntil::String("Run it? [y/N".to_owned()), ReadUntil::EOF]).unwrap();
        if !matched.starts_with("Run it?") {
            break;
        }
        p.send_line("n").unwrap();
        p.flush().unwrap();
    }
    match p.process().wait().unwrap() {
        rexpect::process::WaitStatus::Exited(_, code) => code,
        other => panic!("cairn {args:?} did not exit: {other:?}"),
    }
}

/// Issue 49.5: staged calls that changed nothing — a Destructive effect
/// refused headless, one a person declined, one cancelled by Ctrl-C while
/// it ran — block no undo: each turn is undone without `--force`, the
/// cancelled turn included (no `cairn resume`, no model call), down to the
/// first turn, whose file goes.
#[test]
fn staged_calls_that_never_applied_block_no_undo() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let script = env.script(&[
        write_file("c1", "notes.md", "one\n"),
        done("Turn one."),
        // Spelled so no word says `rm`: only the staged effect is Destructive.
        shell("c2", "R=r; ${R}m -r victim"),
        done("Turn two."),
        shell("c3", "R=r; ${R}m -r victim"),
        done("Turn three."),
        shell("c4", "echo started > started.txt; sleep 600"),
        done("Turn four."),
    ]);
    turn(&env, &script, &["run", "first"]);
    let id = session_id(&env);
    // Headless: refused, nothing applied.
    let (_, out, err) =
        cairn(&env, &["--script", script.to_str().unwrap(), "--yes", "resume", &id, "--prompt", "second"]);
    assert!(env.cwd.join("victim/data.txt").exists(), "refused headless: {out}{err}");
    // A person says n.
    declined_turn(&env, &script, &["resume", &id, "--prompt", "third"]);
    assert!(env.cwd.join("victim/data.txt").exists(), "declined");
    // Ctrl-C while the staged command runs.
    let all = ["--script", script.to_str().unwrap(), "--yes", "resume", &id, "--prompt", "fourth"];
    let mut cmd = env.cairn(&all);
    cmd.env("CAIRN_CTRL_C_WINDOW_MS", "600000");
    let mut p = rexpect::session::spawn_command(cmd, Some(30_000)).unwrap();
    let start = std::time::Instant::now();
    while !env.staged_file_exists("started.txt") {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "the staged command never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    p.send_control('c').unwrap();
    p.exp_eof().unwrap();
    let _ = p.process().wait();
    assert!(!env.cwd.join("started.txt").exists(), "a cancelled staged run applies nothing");
    let file = session(&env);
    let kinds = |t: &str| entries(&file).into_iter().filter(|e| e["type"] == t).count();
    assert_eq!(kinds("turnCancelled"), 1, "the fourth turn was cancelled");
    let answers =
        entries(&file).iter().filter(|e| e["type"] == "message" && e["payload"]["role"] == "assistant").count();
    // Four undos, newest first, none forced.
    for k in (1..=4).rev() {
        let (code, out, err) = cairn(&env, &["undo", &id]);
        assert_eq!(code, 0, "undo of turn {k} without --force: {out}{err}");
    }
    assert_tree(&env, &before, "after undoing the four turns");
    let after = entries(&file);
    assert_eq!(
        after.iter().filter(|e| e["type"] == "message" && e["payload"]["role"] == "assistant").count(),
        answers,
        "no model call was made"
    );
    assert_eq!(after.iter().filter(|e| e["type"] == "undoApplied").count(), 4);
}

/// Issue 49.5, in chat: after Ctrl-C stops a staged command, `/undo`
/// reverts the cancelled turn at once (no "finish the turn first", no
/// model call), and a second `/undo` the turn before it.
#[test]
fn chat_undo_right_after_ctrl_c() {
    let env = Env::new();
    require_staging(&env);
    fixture(&env.cwd);
    let before = snapshot(&env.cwd);
    let script = env.script(&[
        write_file("c1", "a.txt", "from chat\n"),
        done("Wrote it."),
        shell("c2", "echo started > started.txt; sleep 600"),
        done("Slept."),
        done("A model call was made."),
    ]);
    let mut cmd = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "chat"]);
    cmd.env("CAIRN_CTRL_C_WINDOW_MS", "600000");
    let mut p = rexpect::session::spawn_command(cmd, Some(30_000)).unwrap();
    p.exp_string("/undo").unwrap();
    p.send_line("write a.txt").unwrap();
    p.exp_string("Wrote it.").unwrap();
    p.send_line("sleep").unwrap();
    let start = std::time::Instant::now();
    while !env.staged_file_exists("started.txt") {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "the staged command never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    p.send_control('c').unwrap();
    p.exp_string("turn cancelled").unwrap();
    p.send_line("/undo").unwrap();
    p.exp_string("path(s) restored").unwrap();
    assert!(env.cwd.join("a.txt").exists(), "the first /undo reverts only the cancelled turn");
    p.send_line("/undo").unwrap();
    p.exp_string("path(s) restored").unwrap();
    assert_tree(&env, &before, "after two /undo");
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
    let file = session(&env);
    let all = entries(&file);
    assert!(
        !all.iter().any(|e| e["type"] == "message" && e["payload"]["content"][0]["text"] == "A model call was made."),
        "no model call was made"
    );
    assert_eq!(all.iter().filter(|e| e["type"] == "undoApplied").count(), 2);
}
