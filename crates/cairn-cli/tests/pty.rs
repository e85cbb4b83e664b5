//! The CLI as a person uses it: the real `cairn` binary in a real
//! pseudo-terminal (rexpect), with the scripted provider. Approval prompts
//! answered with y, n, Enter and a; a Destructive call under `--yes`; Ctrl-C
//! during a tool call and at the approval prompt, then `cairn resume`;
//! `cairn chat` left with Ctrl-D and with Ctrl-C.
//!
//! Every test checks what a person would check afterwards: files on disk,
//! the session file and the exit status, not only what was printed.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rexpect::process::WaitStatus;
use rexpect::session::PtySession;
use serde_json::{Value, json};
use util::Env;

/// Bound on every expectation (the tests never wait on the clock otherwise).
const TIMEOUT_MS: u64 = 20_000;

/// Spawn `cmd` with its stdin, stdout and stderr on a new pty.
fn spawn(cmd: Command) -> PtySession {
    rexpect::session::spawn_command(cmd, Some(TIMEOUT_MS)).unwrap()
}

/// `text` as rexpect sees it: it reads the pty byte by byte, one `char`
/// per byte, so non-ASCII needles must be spelled that way.
fn raw(text: &str) -> String {
    text.bytes().map(char::from).collect()
}

/// Type a line, as a person pressing Enter.
fn answer(p: &mut PtySession, line: &str) {
    p.send_line(line).unwrap();
    p.flush().unwrap();
}

/// Wait for the process to end; return the rest of its output and its exit code.
fn finish(p: &mut PtySession) -> (String, i32) {
    let rest = p.exp_eof().unwrap();
    match p.process().wait().unwrap() {
        WaitStatus::Exited(_, code) => (rest, code),
        other => panic!("cairn did not exit normally: {other:?}; output: {rest}"),
    }
}

/// Every record of a session file (array lines flattened), header skipped.
fn records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        match serde_json::from_str(line).unwrap() {
            Value::Array(items) => out.extend(items),
            one => out.push(one),
        }
    }
    out
}

/// The entries of a session file, in order.
fn entries(path: &Path) -> Vec<Value> {
    records(path).into_iter().filter(|r| r["kind"] == "entry").collect()
}

fn entries_of_type(path: &Path, entry_type: &str) -> Vec<Value> {
    entries(path).into_iter().filter(|e| e["type"] == entry_type).collect()
}

/// Keys of the `pending` registers still set at the end of the file.
fn live_pending(path: &Path) -> Vec<String> {
    let mut live: Vec<String> = Vec::new();
    for r in records(path).into_iter().filter(|r| r["kind"] == "register" && r["namespace"] == "pending") {
        let key = r["key"].as_str().unwrap().to_owned();
        if r["op"] == "set" {
            live.push(key);
        } else {
            live.retain(|k| *k != key);
        }
    }
    live
}

/// Settlements (completed, failed, rejected) of one invocation.
fn settlements(path: &Path, invocation: &str) -> usize {
    entries(path)
        .iter()
        .filter(|e| ["toolCompleted", "toolFailed", "toolRejected"].contains(&e["type"].as_str().unwrap()))
        .filter(|e| e["payload"]["invocationId"] == invocation)
        .count()
}

/// The only session file of `env`.
fn session(env: &Env) -> std::path::PathBuf {
    let files = env.session_files();
    assert_eq!(files.len(), 1, "one session: {files:?}");
    files[0].clone()
}

fn write_call(id: &str, path: &str, content: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": id, "name": "write_file", "arguments": {"path": path, "content": content}}]})
}

fn shell_call(command: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]})
}

/// A second Ctrl-C leaves when it follows the first within this window;
/// the tests widen it so a loaded machine cannot make a quick second press
/// look slow (`ctrl_c_presses_further_apart_than_the_window_never_leave`
/// narrows it instead).
const WIDE_WINDOW: (&str, &str) = ("CAIRN_CTRL_C_WINDOW_MS", "600000");

/// Run `cairn --script S ARGS` in a pty.
fn cairn_pty(env: &Env, script: &Path, args: &[&str]) -> PtySession {
    let mut all = vec!["--script", script.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut cmd = env.cairn(&all);
    cmd.env(WIDE_WINDOW.0, WIDE_WINDOW.1);
    spawn(cmd)
}

#[test]
fn approving_a_write_with_y_writes_the_file() {
    let env = Env::new();
    let script = env.script(&[write_call("c1", "out.txt", "hello\n"), json!({"text": "Wrote it."})]);
    let mut p = cairn_pty(&env, &script, &["run", "write hello to out.txt"]);
    let shown = p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
    assert!(shown.contains("approve write_file (write)"), "tool and risk: {shown}");
    assert!(shown.contains("out.txt") && shown.contains("+hello"), "a diff preview: {shown}");
    assert!(!env.cwd.join("out.txt").exists(), "nothing written before the answer");
    answer(&mut p, "y");
    p.exp_string("Wrote it.").unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hello\n");
    let file = session(&env);
    let started = entries_of_type(&file, "toolStarted");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["payload"]["verdict"]["by"], "user:terminal");
    assert_eq!(started[0]["payload"]["verdict"]["decision"], "approve");
    assert_eq!(settlements(&file, started[0]["payload"]["invocationId"].as_str().unwrap()), 1);
    assert!(live_pending(&file).is_empty());
}

#[test]
fn declining_a_write_with_n_or_enter_leaves_the_disk_alone() {
    for reply in ["n", ""] {
        let env = Env::new();
        let script = env.script(&[write_call("c1", "out.txt", "hello\n"), json!({"text": "Not written."})]);
        let mut p = cairn_pty(&env, &script, &["run", "write hello to out.txt"]);
        p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
        answer(&mut p, reply);
        let (rest, code) = finish(&mut p);
        assert_eq!(code, 4, "denied → exit 4 (reply {reply:?}): {rest}");
        assert!(rest.contains("Not written."), "the turn still finishes: {rest}");
        assert!(!env.cwd.join("out.txt").exists(), "reply {reply:?} wrote the file");
        let file = session(&env);
        assert!(entries_of_type(&file, "toolStarted").is_empty());
        let rejected = entries_of_type(&file, "toolRejected");
        assert_eq!(rejected.len(), 1, "reply {reply:?}");
        assert_eq!(rejected[0]["payload"]["verdict"]["by"], "user:terminal");
        assert!(live_pending(&file).is_empty());
    }
}

#[test]
fn always_for_this_session_stops_asking_for_that_tool() {
    let env = Env::new();
    let script = env.script(&[
        write_call("c1", "a.txt", "one\n"),
        write_call("c2", "b.txt", "two\n"),
        json!({"text": "Both written."}),
    ]);
    let mut p = cairn_pty(&env, &script, &["run", "write two files"]);
    p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
    answer(&mut p, "a");
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    assert!(!rest.contains("Run it?"), "the second write was not asked: {rest}");
    assert!(rest.contains("Both written."), "{rest}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("a.txt")).unwrap(), "one\n");
    assert_eq!(std::fs::read_to_string(env.cwd.join("b.txt")).unwrap(), "two\n");
    let file = session(&env);
    let by: Vec<String> = entries_of_type(&file, "toolStarted")
        .iter()
        .map(|e| e["payload"]["verdict"]["by"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(by, ["user:terminal", "session:write_file"], "who approved each write");
    let rule = records(&file).into_iter().any(|r| r["kind"] == "register" && r["key"] == "allow:write_file");
    assert!(rule, "the session rule is recorded");
}

#[test]
fn destructive_still_asks_under_yes_and_n_keeps_the_directory() {
    let env = Env::new();
    std::fs::create_dir(env.cwd.join("somedir")).unwrap();
    std::fs::write(env.cwd.join("somedir/data"), "keep me").unwrap();
    let script = env.script(&[shell_call("rm -rf somedir"), json!({"text": "Kept it."})]);
    let mut p = cairn_pty(&env, &script, &["--yes", "run", "clean up"]);
    let shown = p.exp_string("Run it? [y/N] ").unwrap();
    assert!(shown.contains("approve shell (DESTRUCTIVE)"), "{shown}");
    assert!(shown.contains("$ rm -rf somedir"), "the exact command: {shown}");
    assert!(shown.contains(&format!("in {}", env.cwd.display())), "the working directory: {shown}");
    assert!(!shown.contains("always"), "no 'always' for Destructive: {shown}");
    answer(&mut p, "n");
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 4, "{rest}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("somedir/data")).unwrap(), "keep me");
    let file = session(&env);
    // Staged (overlay available), the command ran in its staging layer and
    // the prompt shows its actual effect; unstaged, it never started.
    let staged = cairn_tools::staging::overlay_status().is_ok();
    if staged {
        assert!(shown.contains("- somedir/data") && shown.contains("deleted: somedir"), "the staged list: {shown}");
    } else {
        assert!(entries_of_type(&file, "toolStarted").is_empty());
    }
    assert!(entries_of_type(&file, "toolStaged").is_empty(), "nothing committed to apply");
    let rejected = entries_of_type(&file, "toolRejected");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["payload"]["verdict"]["by"], "user:terminal");
    assert_eq!(rejected[0]["payload"]["tier"], "destructive");
}

#[test]
fn a_destructive_call_says_why_it_asks() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\ndestructive_patterns = [\"^git push\"]\n").unwrap();
    let script = env.script(&[shell_call("git push origin main"), json!({"text": "Not pushed."})]);
    let mut p = cairn_pty(&env, &script, &["--yes", "run", "push it"]);
    let shown = p.exp_string("Run it? [y/N] ").unwrap();
    assert!(shown.contains("approve shell (DESTRUCTIVE)"), "the tier: {shown}");
    assert!(shown.contains("why: matches the destructive pattern ^git push"), "why: {shown}");
    assert!(shown.contains("$ git push origin main"), "the exact command: {shown}");
    answer(&mut p, "n");
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 4, "{rest}");
    assert!(entries_of_type(&session(&env), "toolStarted").is_empty(), "nothing ran");
}

/// Issue 53.2: a hook's `permissionDecision: "ask"` (Claude Code's) puts
/// the call to the person even under `--yes`, with the hook's reason, and
/// offers no "always" (it is never remembered).
#[test]
fn a_hook_s_ask_is_put_to_the_person_under_yes_without_always() {
    let env = Env::new();
    let hook = env.python_hook("ask_for_writes.py");
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"Write\"\n", hook.display()),
    )
    .unwrap();
    let script = env.script(&[write_call("c1", "out.txt", "hello\n"), json!({"text": "Wrote it."})]);
    let mut p = cairn_pty(&env, &script, &["--yes", "run", "write hello to out.txt"]);
    let shown = p.exp_string("Run it? [y/N] ").unwrap();
    assert!(shown.contains("need a person's look"), "the hook's reason: {shown}");
    assert!(!env.cwd.join("out.txt").exists(), "nothing written before the answer");
    answer(&mut p, "y");
    p.exp_string("Wrote it.").unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hello\n");
    let started = entries_of_type(&session(&env), "toolStarted");
    assert_eq!(started[0]["payload"]["verdict"]["by"], "user:terminal");
}

#[test]
fn a_staged_destructive_effect_answered_y_applies_exactly_that_change() {
    cairn_tools::staging::overlay_status().expect("overlay staging is needed for this test");
    let env = Env::new();
    std::fs::create_dir(env.cwd.join("somedir")).unwrap();
    std::fs::write(env.cwd.join("somedir/data"), "old\n").unwrap();
    std::fs::write(env.cwd.join("other.txt"), "line1\nline2\nline3\n").unwrap();
    // Spelled so no word says `rm`: only the observed effect can tell.
    let command = "R=r; ${R}m -r somedir; echo new > new.txt; sed -i s/line2/LINE2/ other.txt";
    let script = env.script(&[shell_call(command), json!({"text": "Done."})]);
    let mut p = cairn_pty(&env, &script, &["--yes", "run", "clean up"]);
    let shown = p.exp_string("Run it? [y/N] ").unwrap();
    assert!(shown.contains("approve shell (DESTRUCTIVE)"), "{shown}");
    assert!(shown.contains("deletes somedir"), "the reason: {shown}");
    assert!(shown.contains("+ new.txt") && shown.contains("-line2") && shown.contains("+LINE2"), "the diff: {shown}");
    assert!(env.cwd.join("somedir/data").exists(), "nothing applied before the answer");
    answer(&mut p, "y");
    p.exp_string("Done.").unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
    assert!(!env.cwd.join("somedir").exists());
    assert_eq!(std::fs::read_to_string(env.cwd.join("new.txt")).unwrap(), "new\n");
    assert_eq!(std::fs::read_to_string(env.cwd.join("other.txt")).unwrap(), "line1\nLINE2\nline3\n");
    let mut names: Vec<String> =
        std::fs::read_dir(&env.cwd).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["new.txt", "other.txt"], "exactly that change");
    let file = session(&env);
    let staged = entries_of_type(&file, "toolStaged");
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0]["payload"]["verdict"]["by"], "user:terminal");
    assert_eq!(entries_of_type(&file, "toolCompleted").len(), 1);
}

#[test]
fn ctrl_c_during_a_tool_call_settles_it_and_resume_finishes_the_turn() {
    let env = Env::new();
    let marker = env.cwd.join("marker");
    let script =
        env.script(&[shell_call("echo started >> marker; sleep 30"), json!({"text": "Finished after resume."})]);
    let mut p = cairn_pty(&env, &script, &["--yes", "run", "do the long thing"]);
    let deadline = Instant::now() + Duration::from_millis(TIMEOUT_MS);
    // Staged, the marker is in the call's staging layer until it applies.
    let staged = cairn_tools::staging::overlay_status().is_ok();
    while !marker.exists() && !env.staged_file_exists("marker") {
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    p.send_control('c').unwrap();
    p.exp_string("interrupting").unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 3, "cancelled → exit 3: {rest}");
    assert!(rest.contains("cairn resume"), "says how to continue: {rest}");

    let file = session(&env);
    let started = entries_of_type(&file, "toolStarted");
    assert_eq!(started.len(), 1);
    let invocation = started[0]["payload"]["invocationId"].as_str().unwrap().to_owned();
    assert!(live_pending(&file).is_empty(), "no pending register left live");
    assert_eq!(settlements(&file, &invocation), 1, "settled exactly once");
    assert_eq!(entries_of_type(&file, "turnCancelled").len(), 1);

    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "resume", "--last"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Finished after resume."), "{stdout}");
    assert_eq!(settlements(&file, &invocation), 1, "still settled exactly once");
    assert_eq!(entries_of_type(&file, "toolStarted").len(), 1, "not started again");
    assert!(live_pending(&file).is_empty());
    if staged {
        // A cancelled staged call applies nothing, and resume re-runs nothing.
        assert!(!marker.exists(), "a cancelled staged call applied its effect");
    } else {
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "started\n", "the command ran once");
    }
    let last = entries(&file).pop().unwrap();
    assert_eq!(last["payload"]["role"], "assistant", "the turn ends with the answer: {last}");
}

#[test]
fn ctrl_c_at_the_approval_prompt_interrupts_at_once_and_nothing_runs() {
    let env = Env::new();
    let script = env.script(&[write_call("c1", "out.txt", "hello\n"), json!({"text": "Wrote it."})]);
    let mut p = cairn_pty(&env, &script, &["run", "write hello"]);
    p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
    p.send_control('c').unwrap();
    // Shown while the prompt still waits for its answer.
    p.exp_string("interrupting").unwrap();
    answer(&mut p, "y");
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 3, "cancelled → exit 3: {rest}");
    assert!(!env.cwd.join("out.txt").exists(), "a cancelled turn runs nothing");
    let file = session(&env);
    assert!(entries_of_type(&file, "toolStarted").is_empty());
    let rejected = entries_of_type(&file, "toolRejected");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["payload"]["verdict"]["by"], "host:cancel");
    assert!(live_pending(&file).is_empty());
}

#[test]
fn a_second_ctrl_c_at_the_approval_prompt_leaves_and_resume_asks_again() {
    let env = Env::new();
    let script = env.script(&[write_call("c1", "out.txt", "hello\n"), json!({"text": "Wrote it."})]);
    let mut p = cairn_pty(&env, &script, &["run", "write hello"]);
    p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("interrupting").unwrap();
    p.send_control('c').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 3, "{rest}");
    assert!(!env.cwd.join("out.txt").exists());

    let mut p = cairn_pty(&env, &script, &["resume", "--last"]);
    p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
    answer(&mut p, "y");
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    assert!(rest.contains("Wrote it."), "{rest}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hello\n");
    let file = session(&env);
    let started = entries_of_type(&file, "toolStarted");
    assert_eq!(started.len(), 1);
    assert_eq!(settlements(&file, started[0]["payload"]["invocationId"].as_str().unwrap()), 1);
    assert!(live_pending(&file).is_empty());
}

#[test]
fn chat_answers_two_prompts_and_ctrl_d_leaves() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "first reply"}), json!({"text": "second reply"})]);
    let mut p = cairn_pty(&env, &script, &["chat"]);
    p.exp_string("Ctrl-D leaves").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "hello there");
    p.exp_string("first reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "and again");
    p.exp_string("second reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let file = session(&env);
    let messages = entries_of_type(&file, "message");
    let said = |role: &str| -> Vec<String> {
        messages
            .iter()
            .filter(|m| m["payload"]["role"] == role)
            .map(|m| m["payload"]["content"][0]["text"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(said("user"), ["hello there", "and again"]);
    assert_eq!(said("assistant"), ["first reply", "second reply"]);
}

#[test]
fn ctrl_c_at_an_idle_chat_prompt_clears_the_line_and_a_second_leaves() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "only reply"})]);
    let mut p = cairn_pty(&env, &script, &["chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "hello");
    p.exp_string("only reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    // Half a prompt, then Ctrl-C: the line is dropped, the chat stays.
    p.send("never sent").unwrap();
    p.flush().unwrap();
    p.send_control('c').unwrap();
    p.exp_string("press Ctrl-C again to leave").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('c').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "nothing was cancelled: {rest}");
    let file = session(&env);
    assert!(entries_of_type(&file, "turnCancelled").is_empty());
    assert_eq!(entries_of_type(&file, "message").len(), 2, "the cleared line was never a prompt");
}

#[test]
fn ctrl_c_presses_further_apart_than_the_window_never_leave() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "first reply"}), json!({"text": "second reply"})]);
    let mut cmd = env.cairn(&["--script", script.to_str().unwrap(), "chat"]);
    // A window of 0 ms: no second press is ever quick enough.
    cmd.env("CAIRN_CTRL_C_WINDOW_MS", "0");
    let mut p = spawn(cmd);
    p.exp_string(&raw("› ")).unwrap();
    for _ in 0..3 {
        p.send_control('c').unwrap();
        p.exp_string("press Ctrl-C again to leave").unwrap();
        p.exp_string(&raw("› ")).unwrap();
    }
    answer(&mut p, "still here?");
    p.exp_string("first reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    assert_eq!(user_prompts(&session(&env)), ["still here?"]);
}

#[test]
fn chat_slash_commands_are_never_prompts_and_at_paths_attach_files() {
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "the launch code is 7-4-1\n").unwrap();
    let script = env.script(&[json!({"text": "first reply"}), json!({"text": "second reply"})]);
    let mut p = cairn_pty(&env, &script, &["chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "/help");
    let help = p.exp_string(&raw("› ")).unwrap();
    for command in ["/status", "/model", "/tools", "/diff", "/sessions", "/clear", "/quit", "@PATH"] {
        assert!(help.contains(command), "/help lists {command}: {help}");
    }
    answer(&mut p, "/hepl");
    let refused = p.exp_string(&raw("› ")).unwrap();
    assert!(refused.contains("unknown command") && refused.contains("nothing was sent"), "{refused}");
    answer(&mut p, "what does @notes.txt say?");
    p.exp_string("first reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "//etc is a directory");
    p.exp_string("second reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "/status");
    let status = p.exp_string(&raw("› ")).unwrap();
    assert!(status.contains("session ") && status.contains("lane main") && status.contains("scripted"), "{status}");
    answer(&mut p, "/quit");
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let file = session(&env);
    let users: Vec<Value> =
        entries_of_type(&file, "message").into_iter().filter(|m| m["payload"]["role"] == "user").collect();
    assert_eq!(users.len(), 2, "only the two prompts reached the model: {users:#?}");
    let first = users[0]["payload"]["content"][0]["text"].as_str().unwrap();
    assert!(first.starts_with("what does @notes.txt say?"), "{first}");
    assert!(first.contains("[attached @notes.txt (25 bytes)]") && first.contains("7-4-1"), "{first}");
    assert_eq!(users[1]["payload"]["content"][0]["text"], "/etc is a directory");
}

#[test]
fn chat_edits_lines_recalls_history_completes_commands_and_keeps_a_paste_whole() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let script = env.script(&[json!({"text": "one"}), json!({"text": "two"}), json!({"text": "three"})]);
    let mut p = cairn_pty(&env, &script, &["chat"]);
    p.exp_string(&raw("› ")).unwrap();
    // Typed with a mistake fixed by Left, Backspace, Right and End.
    p.send("hello wrold").unwrap();
    p.send("\x1b[D\x1b[D\x1b[D").unwrap(); // Left ×3: "hello wr|old"
    p.send("\x7f").unwrap(); // Backspace: "hello w|old"
    p.send("\x1b[C").unwrap(); // Right: "hello wo|ld"
    p.send("r").unwrap(); // "hello wor|ld"
    p.send("\x1b[F").unwrap(); // End
    p.send("\r").unwrap();
    p.flush().unwrap();
    p.exp_string("one").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    // Up recalls the last prompt.
    p.send("\x1b[A\r").unwrap();
    p.flush().unwrap();
    p.exp_string("two").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    // A bracketed paste with newlines stays one prompt.
    p.send("\x1b[200~first line\nsecond line\x1b[201~\r").unwrap();
    p.flush().unwrap();
    p.exp_string("three").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    // Tab completes a command.
    p.send("/hel\t\r").unwrap();
    p.flush().unwrap();
    p.exp_string("commands:").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let file = session(&env);
    let users: Vec<String> = entries_of_type(&file, "message")
        .into_iter()
        .filter(|m| m["payload"]["role"] == "user")
        .map(|m| m["payload"]["content"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, ["hello world", "hello world", "first line\nsecond line"]);
    // The history is kept per directory, private.
    let history: Vec<_> = std::fs::read_dir(env.home.join("history")).unwrap().flatten().collect();
    assert_eq!(history.len(), 1);
    let mode = history[0].metadata().unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "history is private");
    let kept = std::fs::read_to_string(history[0].path()).unwrap();
    assert!(kept.contains("hello world") && kept.contains("/help"), "{kept}");
}

#[test]
fn answers_on_a_terminal_are_rendered_as_markdown_unless_plain() {
    let env = Env::new();
    let answer_text = "# Plan\n- read **notes**\n```sh\nls -la\n```\nhostile \u{1b}]52;c;eA==\u{7} end\n";
    let script = env.script(&[json!({"text": answer_text})]);
    let mut p = cairn_pty(&env, &script, &["run", "go"]);
    let (shown, code) = finish(&mut p);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("Plan") && !shown.contains("# Plan"), "the heading's marker is rendered: {shown}");
    assert!(shown.contains(&raw("• read notes")), "{shown}");
    assert!(shown.contains(&raw("┌──── sh")) && shown.contains("ls -la"), "{shown}");
    assert!(!shown.contains("\u{1b}]52"), "an OSC 52 from the model never reaches the terminal: {shown}");
    assert!(shown.contains("\\u{1b}]52"), "it is shown escaped: {shown}");

    let mut p = cairn_pty(&env, &script, &["--plain", "run", "go"]);
    let (shown, code) = finish(&mut p);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("# Plan") && shown.contains("- read **notes**") && shown.contains("```sh"), "{shown}");
    assert!(!shown.contains("\u{1b}]52"), "{shown}");
}

#[test]
fn a_long_change_is_shown_in_part_and_e_shows_all_of_it_before_asking_again() {
    let env = Env::new();
    let content: String = (1..=100).map(|i| format!("line {i}\n")).collect();
    let script = env.script(&[write_call("c1", "long.txt", &content), json!({"text": "Wrote it."})]);
    let mut p = cairn_pty(&env, &script, &["run", "write the long file"]);
    let first = p.exp_string("e=explain] ").unwrap();
    assert!(first.contains("+line 30") && !first.contains("+line 99"), "only the start is shown: {first}");
    assert!(first.contains("more lines; e shows the whole change"), "{first}");
    answer(&mut p, "e");
    let all = p.exp_string("e=explain] ").unwrap();
    assert!(all.contains("+line 99") && all.contains("+line 100"), "e shows the whole change: {all}");
    assert!(!env.cwd.join("long.txt").exists(), "nothing written before the answer");
    answer(&mut p, "y");
    p.exp_string("Wrote it.").unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(env.cwd.join("long.txt")).unwrap(), content);
}

#[test]
fn long_tool_output_is_folded_on_screen_and_slash_last_shows_all_of_it() {
    let env = Env::new();
    let script = env.script(&[shell_call("seq 1 40"), json!({"text": "counted"})]);
    let mut p = cairn_pty(&env, &script, &["--yes", "chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "count to forty");
    let turn = p.exp_string("counted").unwrap();
    assert!(turn.contains("12\r\n") && !turn.contains("\n13\r\n"), "the first 12 lines are shown: {turn}");
    assert!(turn.contains("28 more lines of output folded"), "{turn}");
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "/last");
    let last = p.exp_string(&raw("› ")).unwrap();
    assert!(last.contains("shell (toolCompleted)") && last.contains("39\r\n40"), "{last}");
    p.send_control('d').unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
}

#[test]
fn slash_allow_approves_matching_writes_for_the_session_and_is_recorded() {
    let env = Env::new();
    let script = env.script(&[write_call("c1", "out.txt", "hello\n"), json!({"text": "Wrote it."})]);
    let mut p = cairn_pty(&env, &script, &["chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "/allow sh(ell");
    let refused = p.exp_string(&raw("› ")).unwrap();
    assert!(refused.contains("not allowed"), "{refused}");
    answer(&mut p, "/allow write_file(path=out.txt)");
    let allowed = p.exp_string(&raw("› ")).unwrap();
    assert!(allowed.contains("allowed for this session: write_file(path=out.txt)"), "{allowed}");
    answer(&mut p, "write hello");
    let turn = p.exp_string("Wrote it.").unwrap();
    assert!(!turn.contains("Run it?"), "no question for a call the rule covers: {turn}");
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hello\n");
    let started = entries_of_type(&session(&env), "toolStarted");
    assert_eq!(started[0]["payload"]["verdict"]["by"], "session:write_file(path=out.txt)");
}

#[test]
fn slash_fork_continues_on_a_new_lane_and_compact_says_when_there_is_nothing() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "first reply"}), json!({"text": "second reply"})]);
    let mut p = cairn_pty(&env, &script, &["chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "/fork early");
    let refused = p.exp_string(&raw("› ")).unwrap();
    assert!(refused.contains("nothing to fork yet"), "{refused}");
    answer(&mut p, "/compact");
    let nothing = p.exp_string(&raw("› ")).unwrap();
    assert!(nothing.contains("nothing to compact"), "{nothing}");
    answer(&mut p, "hello");
    p.exp_string("first reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "/fork alt");
    let forked = p.exp_string(&raw("› ")).unwrap();
    assert!(forked.contains("now on lane alt"), "{forked}");
    answer(&mut p, "/status");
    let status = p.exp_string(&raw("› ")).unwrap();
    assert!(status.contains("lane alt"), "{status}");
    answer(&mut p, "and on the new lane?");
    p.exp_string("second reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (_, code) = finish(&mut p);
    assert_eq!(code, 0);
    let lanes: Vec<Value> = records(&session(&env))
        .into_iter()
        .filter(|r| r["kind"] == "register" && r["namespace"] == "lane" && r["op"] == "set")
        .collect();
    assert!(lanes.iter().any(|r| r["key"] == "alt"), "{lanes:#?}");
}

// ---- The screen a person sees (issue 32): cairn's bytes rendered by a
// terminal emulator (vt100), the final text asserted.

use crate::screen;
use screen::Screen;

/// `cairn ARGS` on an emulated terminal of `rows`×`cols`.
fn on_screen(env: &Env, args: &[&str], rows: u16, cols: u16) -> Screen {
    Screen::spawn(env.cairn(args), rows, cols, 5_000)
}

/// A config whose default provider is the loopback test server.
fn loop_provider(env: &Env, server: &cairn_test_server::TestServer, window: Option<u32>) {
    let window = window.map(|w| format!("context_window = {w}\n")).unwrap_or_default();
    loop_provider_with(env, server, &window);
}

/// [`loop_provider`] with more keys (`extra`) in its table.
fn loop_provider_with(env: &Env, server: &cairn_test_server::TestServer, extra: &str) {
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"loop\"\n[providers.loop]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\napi_key_env = \"LOOP_KEY\"\n{extra}",
            server.url()
        ),
    )
    .unwrap();
}

/// `cairn ARGS` with the loopback provider's key set.
fn looped(env: &Env, args: &[&str]) -> Command {
    let mut cmd = env.cairn(args);
    cmd.env("LOOP_KEY", "k").env(WIDE_WINDOW.0, WIDE_WINDOW.1);
    cmd
}

/// A Chat Completions stream of `n` lines `WORD 1`…`WORD n`, one per event,
/// then usage (100 in, 20 out) and `[DONE]`.
fn lines_stream(word: &str, n: usize) -> String {
    use cairn_test_server::streams::event;
    let mut out = String::new();
    for k in 1..=n {
        out.push_str(&event("", &format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{word} {k}\n"}}}}]}}"#)));
    }
    out.push_str(&event("", r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#));
    out.push_str(&event(
        "",
        r#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120}}"#,
    ));
    out.push_str(&event("", "[DONE]"));
    out
}

/// A slow model: `lines_stream(n)`, one event every `ms` milliseconds.
fn paced(n: usize, ms: u64) -> cairn_test_server::Reply {
    cairn_test_server::Reply::sse(lines_stream("line", n))
        .split(cairn_test_server::Split::PerEvent)
        .pace(Duration::from_millis(ms))
}

/// The user prompts of a session file.
fn user_prompts(file: &Path) -> Vec<String> {
    entries_of_type(file, "message")
        .into_iter()
        .filter(|m| m["payload"]["role"] == "user")
        .map(|m| m["payload"]["content"][0]["text"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn screen_editing_history_paste_help_model_unknown_command_and_at_file() {
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "the launch code is 7-4-1\n").unwrap();
    let script = env.script(&[
        json!({"text": "# Heading one\n- a **bold** item\n"}),
        json!({"text": "two"}),
        json!({"text": "three"}),
        json!({"text": "four"}),
    ]);
    let mut s = on_screen(&env, &["--script", script.to_str().unwrap(), "chat"], 300, 120);
    s.wait_prompt();
    // A typo mended with Left, Backspace, Right and End.
    s.send("hello wrold");
    s.send("\x1b[D\x1b[D\x1b[D\x7f\x1b[Cr\x1b[F\r");
    let shown = s.wait_for("Heading one");
    assert!(shown.contains("› hello world"), "the mended line on screen:\n{shown}");
    let shown = s.wait_for("• a bold item");
    assert!(!shown.contains("# Heading") && !shown.contains("**"), "Markdown rendered:\n{shown}");
    s.wait_prompt();
    // Up recalls the last prompt.
    s.send("\x1b[A\r");
    s.wait_for("two");
    s.wait_prompt();
    // A bracketed paste with a newline stays one prompt.
    s.send("\x1b[200~first line\nsecond line\x1b[201~\r");
    s.wait_for("three");
    s.wait_prompt();
    s.line("/help");
    let help = s.wait_for("/quit");
    for command in ["/status", "/model", "/provider", "/resume ID", "/fork NAME", "/allow PATTERN", "/undo", "@PATH"] {
        assert!(help.contains(command), "/help lists {command}:\n{help}");
    }
    s.wait_prompt();
    s.line("/model");
    s.wait_for("scripted · script.jsonl");
    s.wait_prompt();
    s.line("/hepl");
    let refused = s.wait_for("unknown command");
    assert!(refused.contains("nothing was sent to the model"), "{refused}");
    s.wait_prompt();
    s.line("what does @notes.txt say?");
    s.wait_for("four");
    s.wait_prompt();
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    let prompts = user_prompts(&session(&env));
    assert_eq!(prompts.len(), 4, "/help, /model and /hepl never reached the model: {prompts:#?}");
    assert_eq!(prompts[..3], ["hello world", "hello world", "first line\nsecond line"]);
    assert!(prompts[3].contains("[attached @notes.txt (25 bytes)]") && prompts[3].contains("7-4-1"), "{}", prompts[3]);
}

#[test]
fn screen_ctrl_r_alt_enter_and_at_completion_with_the_history_kept_private_per_directory() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "the launch code is 7-4-1\n").unwrap();
    let script =
        env.script(&[json!({"text": "answer one"}), json!({"text": "answer two"}), json!({"text": "answer three"})]);
    let mut s = on_screen(&env, &["--script", script.to_str().unwrap(), "chat"], 60, 100);
    s.wait_prompt();
    s.line("alpha prompt");
    s.wait_for("answer one");
    s.wait_prompt();
    s.line("beta prompt");
    s.wait_for("answer two");
    s.wait_prompt();
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    let first = session(&env);
    // The history of this directory: kept, private.
    let history: Vec<_> = std::fs::read_dir(env.home.join("history")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(std::fs::metadata(&history[0]).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(env.home.join("history")).unwrap().permissions().mode() & 0o777, 0o700);

    // A new chat in the same directory: Ctrl-R finds the older prompt.
    let mut s = on_screen(&env, &["--script", script.to_str().unwrap(), "chat"], 60, 100);
    s.wait_prompt();
    s.send("\x12alph");
    s.wait_for("alpha prompt");
    s.send("\r");
    s.wait_for("answer one");
    s.wait_prompt();
    // Alt-Enter (ESC, Enter) puts a newline in the prompt instead of sending it.
    s.send("first\x1b\r");
    s.send("second\r");
    s.wait_for("answer two");
    s.wait_prompt();
    // Tab completes an @path of the session's directory.
    s.send("read @no\t");
    s.wait_for("read @notes.txt");
    s.send("\r");
    s.wait_for("answer three");
    s.wait_prompt();
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    let files = env.session_files();
    assert_eq!(files.len(), 2);
    let second = files.iter().find(|f| **f != first).unwrap();
    let prompts = user_prompts(second);
    assert_eq!(prompts.len(), 3, "{prompts:#?}");
    assert_eq!(prompts[..2], ["alpha prompt", "first\nsecond"]);
    assert!(prompts[2].starts_with("read @notes.txt") && prompts[2].contains("7-4-1"), "attached: {}", prompts[2]);
}

#[test]
fn screen_an_approval_answered_with_each_key() {
    let env = Env::new();
    let long: String = (1..=100).map(|i| format!("line {i}\n")).collect();
    let script = env.script(&[
        write_call("c1", "long.txt", &long),
        json!({"text": "Wrote the long file."}),
        write_call("c2", "no.txt", "no\n"),
        json!({"text": "Left it."}),
        write_call("c3", "a.txt", "a\n"),
        write_call("c4", "b.txt", "b\n"),
        json!({"text": "Both written."}),
    ]);
    let mut s = on_screen(&env, &["--script", script.to_str().unwrap(), "chat"], 500, 120);
    s.wait_prompt();
    s.line("write the long file");
    let first = s.wait_for("e=explain]");
    assert!(first.contains("approve write_file (write)") && first.contains("+line 30"), "{first}");
    assert!(!first.contains("+line 99"), "only the start of a long change:\n{first}");
    s.line("e");
    let all = s.wait_for("+line 100");
    assert!(all.contains("+line 99"), "e shows all of it:\n{all}");
    s.wait_for_n("e=explain]", 2);
    assert!(!env.cwd.join("long.txt").exists(), "nothing written before y");
    s.line("y");
    s.wait_for("Wrote the long file.");
    s.wait_prompt();
    s.line("write no.txt");
    s.wait_for("+no");
    s.wait_question();
    s.line("n");
    s.wait_for("Left it.");
    s.wait_prompt();
    s.line("write a and b");
    s.wait_for("+a");
    s.wait_question();
    s.line("a");
    let end = s.wait_for("Both written.");
    assert_eq!(end.matches("Run it?").count(), 4, "b.txt was not asked after a:\n{end}");
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    assert_eq!(std::fs::read_to_string(env.cwd.join("long.txt")).unwrap(), long);
    assert!(!env.cwd.join("no.txt").exists(), "n wrote nothing");
    assert_eq!(std::fs::read_to_string(env.cwd.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(env.cwd.join("b.txt")).unwrap(), "b\n");
    let by: Vec<String> = entries_of_type(&session(&env), "toolStarted")
        .iter()
        .map(|e| e["payload"]["verdict"]["by"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(by, ["user:terminal", "user:terminal", "session:write_file"]);
}

#[test]
fn screen_ctrl_c_mid_turn_interrupts_and_the_chat_goes_on() {
    let env = Env::new();
    let server = cairn_test_server::TestServer::start(vec![
        paced(1_200, 50),
        cairn_test_server::Reply::sse(lines_stream("again", 2)),
    ])
    .unwrap();
    loop_provider(&env, &server, None);
    let mut s = Screen::spawn(looped(&env, &["chat"]), 40, 100, 5_000);
    s.wait_prompt();
    s.line("count slowly");
    s.wait_for("line 3");
    s.send("\x03");
    s.wait_for("turn cancelled");
    s.wait_prompt();
    s.line("again");
    s.wait_for("again 2");
    s.wait_prompt();
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    let file = session(&env);
    assert_eq!(entries_of_type(&file, "turnCancelled").len(), 1);
    assert_eq!(user_prompts(&file), ["count slowly", "again"]);
}

#[test]
fn screen_a_second_ctrl_c_leaves() {
    let env = Env::new();
    let server = cairn_test_server::TestServer::start(vec![paced(1_200, 50)]).unwrap();
    loop_provider(&env, &server, None);
    let mut s = Screen::spawn(looped(&env, &["chat"]), 40, 100, 5_000);
    s.wait_prompt();
    s.line("count slowly");
    s.wait_for("line 3");
    s.send("\x03");
    s.wait_for("interrupting");
    // The second press leaves, whether the turn is still winding down
    // (exit 3: cancelled) or the chat is back at its prompt (exit 0).
    s.send("\x03");
    let code = s.wait_exit();
    assert!(code == 3 || code == 0, "exit {code}:\n{}", s.contents());
    let file = session(&env);
    assert!(live_pending(&file).is_empty());
    let cancelled = entries_of_type(&file, "turnCancelled").len();
    if code == 0 || cancelled > 0 {
        assert_eq!(cancelled, 1, "the turn was settled as cancelled (exit {code})");
    } else {
        // The second press came while the turn was still winding down (a
        // loaded machine) and left at once, as it should: the file is whole
        // and the turn resumable, as after a kill.
        let out = env.cairn(&["check", file.to_str().unwrap()]).stdin(Stdio::null()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn screen_a_resize_mid_stream_keeps_the_screen_whole() {
    let env = Env::new();
    let server = cairn_test_server::TestServer::start(vec![paced(60, 30)]).unwrap();
    loop_provider(&env, &server, Some(8_000));
    let mut s = Screen::spawn(looped(&env, &["chat"]), 40, 100, 5_000);
    s.wait_prompt();
    s.line("count");
    s.wait_for("line 5");
    s.resize(30, 50);
    s.wait_for("line 20");
    s.resize(50, 120);
    s.wait_for("line 60");
    s.wait_for("so far");
    let end = s.wait_prompt();
    // Every line of the answer is on its own row, whole, in order.
    let rows: Vec<&str> = end.lines().map(str::trim_end).collect();
    let at = |k: usize| rows.iter().position(|r| *r == format!("line {k}"));
    let positions: Vec<Option<usize>> = (41..=60).map(at).collect();
    assert!(positions.iter().all(Option::is_some), "each line on a row of its own:\n{end}");
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in order:\n{end}");
    assert!(end.contains("m · context 2% of 8k"), "the status line after the turn:\n{end}");
    // The editor knows the new width: a long line typed now wraps cleanly.
    s.line("/status");
    let status = s.wait_for("tools offered");
    assert!(status.contains("context 2% used: 100 of 8,000 tokens"), "{status}");
    assert!(status.contains("cost unknown"), "{status}");
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
}

/// The seconds the spinner shows (`⠁ thinking 3s`), if it is on screen.
fn spinner_seconds(screen: &str) -> Option<u64> {
    screen.lines().find_map(|l| l.split_once(" thinking ")?.1.trim_end().strip_suffix('s')?.parse().ok())
}

#[test]
fn screen_a_resize_while_the_spinner_is_drawn_keeps_the_screen_whole() {
    let env = Env::new();
    // The model thinks (headers sent, no token) until the gate opens, so
    // both resizes happen while the spinner is drawn, with no clock.
    let gate = cairn_test_server::Gate::new();
    let server = cairn_test_server::TestServer::start(vec![
        cairn_test_server::Reply::sse(lines_stream("line", 3)).hold(gate.clone()),
    ])
    .unwrap();
    // $3 in and $15 out per million tokens: the answer's 100 tokens in and
    // 20 out cost 100 × 3 + 20 × 15 = 600 µ$ = $0.0006 (by hand).
    loop_provider_with(&env, &server, "context_window = 8000\ninput_per_mtok = 3\noutput_per_mtok = 15\n");
    let mut chat = looped(&env, &["chat"]);
    // As a terminal sets it: without TERM (the tests' cleared environment)
    // indicatif draws no spinner at all.
    chat.env("TERM", "xterm-256color");
    let mut s = Screen::spawn(chat, 24, 100, 5_000);
    s.wait_prompt();
    s.line("think first");
    let drawn = s.wait_until("the spinner", |t| spinner_seconds(t).is_some());
    let first = spinner_seconds(&drawn).unwrap();
    s.resize(16, 40);
    // Still held: the spinner is redrawn at the new width as its clock moves.
    let narrow = s.wait_until("the spinner redrawn at 40 columns", |t| spinner_seconds(t).is_some_and(|n| n > first));
    let second = spinner_seconds(&narrow).unwrap();
    s.resize(20, 200);
    s.wait_until("the spinner redrawn at 200 columns", |t| spinner_seconds(t).is_some_and(|n| n > second));
    assert_eq!(server.request_count(), 1, "the model is still thinking");
    gate.open();
    s.wait_for("so far");
    let end = s.wait_prompt();
    let id = session(&env).file_stem().unwrap().to_str().unwrap().to_owned();
    let rows: Vec<&str> = end.lines().map(str::trim_end).collect();
    let from = rows.iter().position(|r| *r == "› think first").unwrap_or_else(|| panic!("the prompt's row:\n{end}"));
    let to = rows.iter().rposition(|r| !r.is_empty()).unwrap();
    let shown = &rows[from..=to];
    // The turn's time is the one figure not known beforehand.
    let status = shown.get(4).copied().unwrap_or_default();
    let time = status.split(" · ").nth(5).unwrap_or_default();
    assert!(
        time.strip_suffix('s').is_some_and(|t| t.split_once('.').is_some_and(|(a, b)| {
            !a.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.len() == 1
                && b.bytes().all(|c| c.is_ascii_digit())
        })),
        "the turn's time in the status line: {status:?}\n{end}"
    );
    let expected = [
        "› think first".to_owned(),
        "line 1".to_owned(),
        "line 2".to_owned(),
        "line 3".to_owned(),
        format!(
            "m · context 2% of 8k · 100 in / 20 out tokens · 1 attempt · 0 tool calls · {time} · so far 120 tokens, $0.0006 · session {id}"
        ),
        "›".to_owned(),
    ];
    assert_eq!(shown, expected, "nothing of the spinner is left and nothing is torn:\n{end}");
    s.line("/status");
    let status = s.wait_for("tools offered");
    let rows: Vec<&str> = status.lines().map(str::trim_end).collect();
    for row in ["tokens 100 in / 20 out over 1 provider attempt", "cost $0.0006"] {
        assert!(rows.contains(&row), "/status shows {row:?}:\n{status}");
    }
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
}

#[test]
fn screen_hostile_text_is_shown_escaped_and_bounded() {
    let env = Env::new();
    let hostile = "before\n\u{1b}[2J\u{1b}[H\u{1b}]52;c;cGF3bmVk\u{7}clip \u{202e}evil\u{202c} \u{1b}]0;title\u{7}\u{9b}31m\rafter\n";
    let megabyte_line = format!("{}\nshort tail\n", "x".repeat(1 << 20));
    let ten_megabytes: String = (0..100_000).map(|k| format!("row {k:06} {}\n", "y".repeat(88))).collect();
    let script = env.script(&[
        json!({"text": hostile}),
        json!({"text": megabyte_line}),
        json!({"text": ten_megabytes}),
        json!({"text": "```rust\nfn main() { let answer = 42; }\n```\n"}),
    ]);
    let mut cmd = env.cairn(&["--script", script.to_str().unwrap(), "chat"]);
    cmd.env_remove("NO_COLOR");
    let mut s = Screen::spawn(cmd, 40, 100, 200);
    s.keep_bytes(4 << 20);
    s.wait_prompt();
    s.line("be hostile");
    let shown = s.wait_for("after");
    assert!(shown.contains("before"), "nothing cleared the screen:\n{shown}");
    assert!(
        shown.contains("\\u{1b}[2J") && shown.contains("\\u{1b}]52;c;cGF3bmVk\\u{7}clip"),
        "shown escaped:\n{shown}"
    );
    assert!(shown.contains("\\u{202e}evil"), "a bidi override is shown, not obeyed:\n{shown}");
    s.wait_prompt();
    let bytes = s.bytes();
    let raw = String::from_utf8_lossy(&bytes);
    assert!(!raw.contains("\u{1b}]52") && !raw.contains("\u{1b}]0;") && !raw.contains("\u{1b}[2J"), "never sent raw");
    assert!(!raw.contains('\u{202e}') && !raw.contains('\u{9b}'), "never sent raw");

    let before = s.total_bytes();
    s.line("one long line");
    let shown = s.wait_for("short tail");
    assert!(shown.contains("more bytes of this line not shown"), "{shown}");
    s.wait_prompt();
    let written = s.total_bytes() - before;
    assert!(written < 64 * 1024, "a 1 MB line is shown in part: {written} bytes written");

    let before = s.total_bytes();
    s.line("ten megabytes");
    let shown = s.wait_for("row 099999");
    s.wait_prompt();
    let written = s.total_bytes() - before;
    assert!(written >= ten_megabytes.len() && written < ten_megabytes.len() + (1 << 20), "{written} bytes\n{shown}");

    s.line("some code");
    s.wait_for("let answer = 42;");
    s.wait_prompt();
    {
        // The code is coloured: `fn` and `42` in the theme's colours, not
        // the terminal's default.
        let (row, col) = s.find("fn main()").unwrap();
        let keyword = s.fg(row, col);
        assert!(matches!(keyword, vt100::Color::Idx(_)), "fn is highlighted: {keyword:?}\n{}", s.contents());
        let (row, col) = s.find("= 42;").unwrap();
        let number = s.fg(row, col + 2);
        assert!(
            matches!(number, vt100::Color::Idx(_)) && number != keyword,
            "42 too, in another colour than fn: {number:?} vs {keyword:?}"
        );
    }
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
}

#[test]
fn screen_provider_lists_and_switches_and_resume_continues_another_session() {
    let env = Env::new();
    let server = cairn_test_server::TestServer::start(vec![
        cairn_test_server::Reply::sse(lines_stream("served", 1)),
        cairn_test_server::Reply::sse(lines_stream("resumed", 1)),
    ])
    .unwrap();
    loop_provider(&env, &server, None);
    let script = env.script(&[json!({"text": "first session answer"})]);
    let out =
        env.cairn(&["--script", script.to_str().unwrap(), "run", "remember me"]).stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first = session(&env);
    let first_id = first.file_stem().unwrap().to_str().unwrap().to_owned();

    let mut s = Screen::spawn(looped(&env, &["--script", script.to_str().unwrap(), "chat"]), 300, 120, 100);
    s.wait_prompt();
    s.line("/provider");
    let shown = s.wait_for("switches for the next turns");
    assert!(shown.contains("provider scripted · model script.jsonl"), "{shown}");
    assert!(shown.contains("config.toml): loop"), "the configured providers:\n{shown}");
    s.wait_prompt();
    s.line("/provider nosuch");
    s.wait_for("cannot use provider nosuch");
    s.wait_prompt();
    s.line("/provider loop");
    s.wait_for("the next turns use loop · m");
    s.wait_prompt();
    s.line("hi");
    s.wait_for("served 1");
    s.wait_prompt();
    s.line("/resume nosuch");
    s.wait_for("cannot resume");
    s.wait_prompt();
    s.line(&format!("/resume {first_id}"));
    s.wait_for(&format!("now in session {first_id}"));
    s.wait_prompt();
    s.line("and more");
    s.wait_for("resumed 1");
    s.wait_prompt();
    s.line("/status");
    let status = s.wait_for("tools offered");
    assert!(status.contains(&format!("session {first_id}")) && status.contains("provider loop · model m"), "{status}");
    s.wait_prompt();
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    assert_eq!(user_prompts(&first), ["remember me", "and more"], "the resumed session got the prompt");
    let files = env.session_files();
    assert_eq!(files.len(), 2);
    let chat = files.iter().find(|f| **f != first).unwrap();
    assert_eq!(user_prompts(chat), ["hi"]);
}

#[test]
#[ignore = "records the README's chat"]
fn record_readme_chat() {
    let env = Env::new();
    std::fs::write(env.cwd.join("config.ini"), "retries = 3\ntimeout = 10\n").unwrap();
    // Prices on the script's table, to show a cost (a script is otherwise free).
    std::fs::write(
        env.home.join("config.toml"),
        "[providers.scripted]\ncontext_window = 8000\ninput_per_mtok = 3\noutput_per_mtok = 15\n",
    )
    .unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "config.ini"}}]}),
        json!({"text": "", "toolCalls": [{"id": "c2", "name": "edit_file", "arguments": {"path": "config.ini", "old": "retries = 3", "new": "retries = 5"}}]}),
        json!({"text": "## Done\n`config.ini` now reads:\n```ini\nretries = 5\ntimeout = 10\n```\n- **retries** is now 5\n- *timeout* is unchanged\n"}),
    ]);
    let mut s = on_screen(&env, &["--script", script.to_str().unwrap(), "chat"], 300, 100);
    s.wait_prompt();
    s.line("/tools");
    s.wait_for("wait_for_messages");
    s.wait_prompt();
    s.line("set retries to 5 in @config.ini");
    s.wait_question();
    s.line("y");
    s.wait_for("so far");
    s.wait_prompt();
    s.line("/status");
    s.wait_for("tools offered");
    s.wait_prompt();
    s.line("/diff");
    s.wait_until("the diff's files", |t| t.contains("› /diff\nconfig.ini"));
    s.wait_prompt();
    s.line("/hepl");
    s.wait_for("unknown command");
    s.wait_prompt();
    println!("{}", s.contents());
    s.send("\x04");
    s.wait_exit();
}

/// What a tool runs to find out whether it has a controlling terminal
/// (`/proc/self/stat` field 7, `tty_nr`), and, when `/dev/tty` opens,
/// pushes `INJECTED-BY-TOOL` into the terminal's input queue with
/// `TIOCSTI` (the attack of issue 46.4: the text lands in cairn's own
/// input line).
const TTY_PROBE: &str = r#"import fcntl, os, termios
stat = open('/proc/self/stat').read()
print('tty_nr=' + stat.rsplit(')', 1)[1].split()[4])
try:
    fd = os.open('/dev/tty', os.O_RDWR)
    for c in b'INJECTED-BY-TOOL':
        fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
    print('injected')
except OSError as e:
    print('no terminal: ' + e.strerror)
"#;

/// Issue 46.4: every process cairn starts runs in a session of its own
/// with no controlling terminal. In `cairn chat` on a real pty: a
/// `pre_tool` hook (sandboxed) and a `shell` call a person approved to run
/// once without the sandbox both find `tty_nr` 0 and cannot open
/// `/dev/tty`, and the bypassed call's `TIOCSTI` puts nothing into the
/// chat's next input line (the next prompt recorded is exactly what was
/// typed).
#[test]
fn tools_hooks_and_bypassed_calls_have_no_controlling_terminal() {
    let env = Env::new();
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "this test runs its probe with /usr/bin/python3, which is missing");
    // The hook: reports the probe's answer as its refusal of read_file.
    let hooks = env.home.parent().unwrap().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = hooks.join("probe-hook");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\ncat >/dev/null\nr=$(/usr/bin/python3 -c \"$(cat <<'PY'\n{TTY_PROBE}PY\n)\" | tr '\\n' ' ')\n\
             printf '{{\"hookSpecificOutput\":{{\"hookEventName\":\"PreToolUse\",\"permissionDecision\":\"deny\",\
             \"permissionDecisionReason\":\"hook probe: %s\"}}}}' \"$r\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"read_file\"\n", hook.display()),
    )
    .unwrap();
    // The shell call: the probe, then a read the sandbox denies (cairn
    // then offers to run the command once more without it).
    std::fs::write(env.cwd.join("probe.py"), TTY_PROBE).unwrap();
    let denied = tempfile::Builder::new().prefix("cairn-tty-").tempdir_in("/var/tmp").unwrap();
    std::fs::write(denied.path().join("f"), "outside\n").unwrap();
    let command = format!("/usr/bin/python3 probe.py; cat {}", denied.path().join("f").display());
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "r1", "name": "read_file", "arguments": {"path": "probe.py"}}]}),
        shell_call(&command),
        json!({"text": "first reply"}),
        json!({"text": "second reply"}),
    ]);
    let mut p = cairn_pty(&env, &script, &["--yes", "chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "probe");
    let shown = p.exp_string("Run it? [y/N] ").unwrap();
    assert!(shown.contains("sandbox bypass"), "the bypass is asked: {shown}");
    answer(&mut p, "y");
    p.exp_string("first reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "second");
    p.exp_string("second reply").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let file = session(&env);
    let hook_said = entries_of_type(&file, "toolRejected")
        .iter()
        .map(|e| e["payload"].to_string())
        .find(|p| p.contains("hook probe"))
        .unwrap_or_else(|| panic!("the hook's refusal is missing: {:?}", entries(&file)));
    assert!(hook_said.contains("tty_nr=0 "), "the hook has a controlling terminal: {hook_said}");
    assert!(hook_said.contains("no terminal"), "the hook opened /dev/tty: {hook_said}");
    let completed = entries_of_type(&file, "toolCompleted");
    let shell =
        completed.iter().map(|e| e["payload"].to_string()).find(|p| p.contains("outside")).unwrap_or_else(|| {
            panic!("the bypassed call did not complete: {:?}", entries(&file));
        });
    assert!(shell.contains("tty_nr=0\\n"), "the bypassed call has a controlling terminal: {shell}");
    assert!(shell.contains("no terminal") && !shell.contains("injected"), "the bypassed call opened /dev/tty: {shell}");
    assert_eq!(user_prompts(&file), ["probe", "second"], "the tool typed into cairn's input line");
}

/// Issue 49.1: a Destructive staged effect asks its second question while
/// the spinner of the running call is drawn; the question must stay on the
/// screen (a real TERM, so indicatif draws) for as long as cairn waits,
/// every time. Each round waits past many spinner ticks (100 ms each)
/// before the question is looked at again.
#[test]
fn screen_a_staged_destructive_question_stays_on_screen_while_cairn_waits() {
    cairn_tools::staging::overlay_status().expect("overlay staging is needed for this test");
    const ROUNDS: usize = 20;
    let env = Env::new();
    let mut script = Vec::new();
    for k in 0..ROUNDS {
        std::fs::create_dir(env.cwd.join(format!("dir{k}"))).unwrap();
        std::fs::write(env.cwd.join(format!("dir{k}/data")), "old\n").unwrap();
        // Spelled so no word says `rm`: only the staged effect is Destructive.
        script.push(shell_call(&format!("R=r; ${{R}}m -r dir{k}")));
        script.push(json!({"text": format!("Round {k} done.")}));
    }
    let script = env.script(&script);
    let mut chat = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "chat"]);
    chat.env("TERM", "xterm-256color").env(WIDE_WINDOW.0, WIDE_WINDOW.1);
    let mut s = Screen::spawn(chat, 40, 120, 5_000);
    let last_row_asks =
        |t: &str| t.lines().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| l.starts_with("Run it?"));
    let mut still_shown = 0;
    for k in 0..ROUNDS {
        s.wait_prompt();
        s.line(&format!("clean dir{k}"));
        s.wait_until("the staged effect's question", |t| t.contains(&format!("-r dir{k}")) && last_row_asks(t));
        // cairn waits for the answer; the spinner ticks every 100 ms.
        std::thread::sleep(Duration::from_millis(1_200));
        let now = s.contents();
        if last_row_asks(&now) {
            still_shown += 1;
        } else {
            eprintln!("round {k}: the question is gone from the last row:\n{now}");
        }
        // The last round says y: chat exits with its last turn's code.
        let answer = if k % 2 == 1 { "y" } else { "n" };
        s.line(answer);
        s.wait_for(&format!("Round {k} done."));
    }
    s.wait_prompt();
    s.send("\x04");
    assert_eq!(s.wait_exit(), 0);
    assert_eq!(still_shown, ROUNDS, "the question was on screen after the wait in {still_shown}/{ROUNDS} rounds");
    for k in 0..ROUNDS {
        assert_eq!(env.cwd.join(format!("dir{k}")).exists(), k % 2 == 0, "dir{k}: y applied, n kept");
    }
}

/// Issue 49.2 in chat: a pasted prompt that cannot fit the window is
/// refused on screen before it is recorded (nothing reaches the model),
/// and the chat goes on: the next prompt is answered and `/undo` works.
#[test]
fn screen_a_paste_larger_than_the_window_is_refused_and_the_chat_goes_on() {
    let env = Env::new();
    let server =
        cairn_test_server::TestServer::start(vec![cairn_test_server::Reply::sse(lines_stream("small", 1))]).unwrap();
    loop_provider_with(&env, &server, "context_window = 8000\nmax_output_tokens = 1024\n");
    let mut chat = looped(&env, &["chat"]);
    chat.env("TERM", "xterm-256color");
    let mut s = Screen::spawn(chat, 40, 200, 5_000);
    s.wait_prompt();
    let big = "lorem ipsum dolor sit amet ".repeat(2_000);
    s.send(&format!("\x1b[200~{big}\x1b[201~\r"));
    let joined = |t: &str| t.replace('\n', "");
    // The size said is the line's (a trailing blank may be trimmed).
    let said = |t: &str| {
        let t = joined(t);
        t.contains("cannot fit the model's context window")
            && (t.contains(&format!("the prompt is {} bytes", big.len()))
                || t.contains(&format!("the prompt is {} bytes", big.trim_end().len())))
    };
    s.wait_until("the refusal", said);
    s.wait_prompt();
    assert_eq!(server.request_count(), 0, "nothing was sent");
    s.line("a small question");
    s.wait_for("small 1");
    s.wait_prompt();
    s.line("/undo");
    s.wait_for("path(s) restored");
    s.wait_prompt();
    s.send("\x04");
    s.wait_exit();
    assert_eq!(server.request_count(), 1);
    assert_eq!(user_prompts(&session(&env)), ["a small question"]);
}

/// A Chat Completions stream of `parts` as text deltas and nothing after
/// them (no finish, no `[DONE]`): with [`cairn_test_server::Ending::StallAtEnd`]
/// the model goes quiet mid-paragraph, as a slow model does between words.
fn partial_stream(parts: &[&str]) -> String {
    use cairn_test_server::streams::event;
    parts.iter().map(|p| event("", &json!({"choices": [{"index": 0, "delta": {"content": p}}]}).to_string())).collect()
}

/// Issue 49.6: the first words of a paragraph streamed slowly reach the
/// screen, Markdown rendered, while the rest of the paragraph (and its
/// newline) has not arrived; the model stays silent after them for longer
/// than the screen's deadline, so the words can only be there if cairn
/// shows them before the line ends.
#[test]
fn screen_the_first_words_of_a_streamed_paragraph_show_before_it_ends() {
    let env = Env::new();
    let server = cairn_test_server::TestServer::start(vec![
        cairn_test_server::Reply::sse(partial_stream(&["The **first** wor", "ds of a long paragraph that ", "eventu"]))
            .split(cairn_test_server::Split::PerEvent)
            .ending(cairn_test_server::Ending::StallAtEnd(Duration::from_secs(600))),
    ])
    .unwrap();
    loop_provider(&env, &server, Some(8000));
    let mut chat = looped(&env, &["chat"]);
    // A colour terminal, so bold is drawn.
    chat.env("TERM", "xterm-256color").env_remove("NO_COLOR");
    let mut s = Screen::spawn(chat, 30, 120, 5_000);
    s.wait_prompt();
    s.line("tell me");
    let shown = s.wait_for("The first words of a long paragraph that");
    assert!(!shown.contains("**"), "Markdown rendered: {shown}");
    // The word still arriving ("eventu…") waits for its end.
    assert!(!shown.contains("eventu"), "{shown}");
    // Bold is an attribute, not text.
    let (row, col) = s.find("first").unwrap();
    assert!(s.bold(row, col), "`first` is bold:\n{shown}");
    s.send("\x03");
    s.wait_prompt();
    s.send("\x04");
    s.wait_exit();
}

/// Issue 49.6: keys typed while a turn runs are not echoed into the answer;
/// they become the next prompt with their editing keys applied (a Left
/// arrow mends a typo), and Esc interrupts the turn.
#[test]
fn screen_keys_typed_during_a_turn_become_the_next_prompt_and_esc_interrupts() {
    let env = Env::new();
    let server = cairn_test_server::TestServer::start(vec![
        cairn_test_server::Reply::sse(partial_stream(&["Thinking it over "]))
            .split(cairn_test_server::Split::PerEvent)
            .ending(cairn_test_server::Ending::StallAtEnd(Duration::from_secs(600))),
        cairn_test_server::Reply::sse(lines_stream("second", 1)),
    ])
    .unwrap();
    loop_provider(&env, &server, Some(8000));
    let mut chat = looped(&env, &["chat"]);
    chat.env("TERM", "xterm-256color");
    let mut s = Screen::spawn(chat, 30, 120, 5_000);
    s.wait_prompt();
    s.line("first question");
    s.wait_for("Thinking it over");
    // A typo mended with three Lefts, then Esc.
    s.send("next quesion\x1b[D\x1b[D\x1b[Dt");
    s.send("\x1b");
    s.wait_for("interrupting");
    let shown = s.wait_until("the typed line at the prompt", |t| {
        t.lines().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| l.trim_end() == "› next question")
    });
    assert!(!shown.contains("quesion"), "the keys were echoed raw:\n{shown}");
    s.send("\r");
    s.wait_for("second 1");
    s.wait_prompt();
    s.send("\x04");
    s.wait_exit();
    assert_eq!(user_prompts(&session(&env)), ["first question", "next question"]);
}

/// A `[mcp_servers.ask]` config running `tests/mcp/elicit_server.py` on
/// the official Python SDK (`scripts/venv mcpservers`): its tools ask the
/// person (`elicitation/create`) while they run.
fn elicit_server(env: &Env) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(repo.join("../../scripts/venv")).arg("mcpservers").output().unwrap();
    assert!(out.status.success(), "scripts/venv mcpservers: {}", String::from_utf8_lossy(&out.stderr));
    let python = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let server = env.cwd.canonicalize().unwrap().join("elicit_server.py");
    std::fs::copy(repo.join("tests/mcp/elicit_server.py"), &server).unwrap();
    let config = format!(
        "[discovery]\nmax_tools = 64\n\n[mcp_servers.ask]\ncommand = \"{python}\"\nargs = [\"{}\"]\n",
        server.display()
    );
    std::fs::write(env.home.join("config.toml"), config).unwrap();
}

fn mcp_call(id: &str, tool: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": id, "name": tool, "arguments": {}}]})
}

/// What the server answered each call of `tool`, in order.
fn summaries(env: &Env, tool: &str) -> Vec<String> {
    entries_of_type(&session(env), "toolCompleted")
        .iter()
        .filter(|e| e["payload"]["tool"] == tool)
        .map(|e| e["payload"]["receipt"]["outputSummary"].as_str().unwrap().to_owned())
        .collect()
}

/// 53.8: `cairn chat` puts a server's form to the person: its message and
/// each field with what it takes; a wrong answer is refused with the
/// reason and asked again; Enter takes a default; the answer reaches the
/// server (the SDK validates it against its own model and echoes it).
#[test]
fn chat_fills_in_a_servers_form_field_by_field_and_re_asks_wrong_answers() {
    let env = Env::new();
    elicit_server(&env);
    let script = env.script(&[mcp_call("c1", "mcp__ask__signup"), json!({"text": "You are signed up."})]);
    let mut p = cairn_pty(&env, &script, &["--allow", "mcp__ask__*", "chat"]);
    p.exp_string(&raw("› ")).unwrap();
    answer(&mut p, "sign me up");
    let shown = p.exp_string("Answer it? [y/N=decline/c=cancel] ").unwrap();
    assert!(shown.contains("question from mcp__ask__signup"), "{shown}");
    assert!(shown.contains("Sign up for the club?"), "the server's message: {shown}");
    answer(&mut p, "y");
    let shown = p.exp_string("name (text, length at least 1, required): ").unwrap();
    assert!(shown.contains(&raw("Name — as you like to be called")), "title and description: {shown}");
    answer(&mut p, "");
    p.exp_string("an answer is required").unwrap();
    answer(&mut p, "Ada");
    p.exp_string("email (email address, required): ").unwrap();
    answer(&mut p, "ada at example");
    p.exp_string("is not a valid email address").unwrap();
    answer(&mut p, "ada@example.org");
    p.exp_string("age (whole number 0 to 150, required): ").unwrap();
    answer(&mut p, "old");
    p.exp_string("`old` is not a whole number").unwrap();
    answer(&mut p, "200");
    p.exp_string("more than the most allowed, 150").unwrap();
    answer(&mut p, "36");
    let shown = p.exp_string("colour (one of the options: its number or its name; Enter: green): ").unwrap();
    assert!(shown.contains("1. red") && shown.contains("3. blue"), "the options: {shown}");
    answer(&mut p, "purple");
    p.exp_string("`purple` is not one of the options (red, green, blue)").unwrap();
    answer(&mut p, "3");
    p.exp_string("newsletter (y/n; Enter: no): ").unwrap();
    answer(&mut p, "");
    p.exp_string("You are signed up.").unwrap();
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let said = summaries(&env, "mcp__ask__signup");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with(
            r#"signed up {"name":"Ada","email":"ada@example.org","age":36,"colour":"blue","newsletter":false}"#
        ),
        "the server got the answers, typed: {}",
        said[0]
    );
    assert!(said[0].contains("the person answered"), "the model is told: {}", said[0]);
}

/// 53.8: the person may decline a server's question (n, or Enter), or
/// dismiss it (c, or Ctrl-D in the middle of the form); the server is told
/// which, and the chat goes on.
#[test]
fn chat_declines_or_cancels_a_servers_question_as_the_person_says() {
    let env = Env::new();
    elicit_server(&env);
    let script = env.script(&[
        mcp_call("c1", "mcp__ask__greet"),
        json!({"text": "first done"}),
        mcp_call("c2", "mcp__ask__greet"),
        json!({"text": "second done"}),
        mcp_call("c3", "mcp__ask__greet"),
        json!({"text": "third done"}),
    ]);
    let mut p = cairn_pty(&env, &script, &["--allow", "mcp__ask__*", "chat"]);
    for (prompt, reply, done) in [("one", "", "first done"), ("two", "c", "second done"), ("three", "y", "third done")]
    {
        p.exp_string(&raw("› ")).unwrap();
        answer(&mut p, prompt);
        p.exp_string("What is your name?").unwrap();
        p.exp_string("Answer it? [y/N=decline/c=cancel] ").unwrap();
        answer(&mut p, reply);
        if reply == "y" {
            p.exp_string("name (text, required): ").unwrap();
            p.send_control('d').unwrap();
        }
        p.exp_string(done).unwrap();
    }
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let said = summaries(&env, "mcp__ask__greet");
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(said[0].starts_with("no name: decline") && said[0].contains("the person declined"), "{}", said[0]);
    assert!(said[1].starts_with("no name: cancel") && said[1].contains("dismissed"), "{}", said[1]);
    assert!(said[2].starts_with("no name: cancel"), "Ctrl-D in the form dismisses it: {}", said[2]);
}

/// 53.8: a server asking the person to open a URL (MCP's URL mode): chat
/// shows it whole with its site set apart and opens it only on yes (with
/// `$BROWSER`, here a script that notes what it was given); no leaves it
/// unopened. The server is told which.
#[test]
fn chat_asks_before_opening_a_servers_url_and_opens_it_with_the_browser() {
    let env = Env::new();
    elicit_server(&env);
    let opened = env.cwd.join("opened.txt");
    let browser = env.home.join("browser.sh");
    std::fs::write(&browser, format!("#!/bin/sh\nprintf '%s\\n' \"$1\" >> '{}'\n", opened.display())).unwrap();
    std::fs::set_permissions(&browser, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = env.script(&[
        mcp_call("c1", "mcp__ask__connect"),
        json!({"text": "first done"}),
        mcp_call("c2", "mcp__ask__connect"),
        json!({"text": "second done"}),
    ]);
    let mut cmd = env.cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__ask__*", "chat"]);
    cmd.env(WIDE_WINDOW.0, WIDE_WINDOW.1).env("BROWSER", &browser);
    let mut p = spawn(cmd);
    for (prompt, reply, done) in [("one", "n", "first done"), ("two", "y", "second done")] {
        p.exp_string(&raw("› ")).unwrap();
        answer(&mut p, prompt);
        let shown = p.exp_string("Open it? [y/N=decline/c=cancel] ").unwrap();
        assert!(shown.contains("Sign in to the example service"), "{shown}");
        assert!(shown.contains("it asks you to open: https://auth.example.org/connect?client=cairn-test"), "{shown}");
        assert!(shown.contains("on the site: auth.example.org"), "{shown}");
        assert!(!opened.exists(), "opened before the person said yes");
        answer(&mut p, reply);
        p.exp_string(done).unwrap();
    }
    p.exp_string(&raw("› ")).unwrap();
    p.send_control('d').unwrap();
    let (rest, code) = finish(&mut p);
    assert_eq!(code, 0, "{rest}");
    let said = summaries(&env, "mcp__ask__connect");
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with("url: decline") && said[0].contains("declined to open"), "{}", said[0]);
    assert!(said[1].starts_with("url: accept") && said[1].contains("agreed to open"), "{}", said[1]);
    // The browser is started, not waited for: its note may land after the
    // chat ends (a deadline to fail with a reason, not a timing check).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&opened).is_ok_and(|t| t.ends_with('\n')) {
        assert!(Instant::now() < deadline, "the browser was never started with the URL");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&opened).unwrap(), "https://auth.example.org/connect?client=cairn-test\n");
}
