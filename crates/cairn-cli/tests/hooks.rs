//! Hooks (`[[hooks.pre_tool]]`, `[[hooks.post_tool]]`) through the real
//! `cairn` binary: real hook programs (sh scripts) run sandboxed; their
//! decisions are read from the session file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::util;
use util::stderr_text as stderr;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;

use serde_json::{Value, json};
use util::Env;

/// An executable `#!/bin/sh` script named `name`, outside cairn's home.
fn script(env: &Env, name: &str, body: &str) -> PathBuf {
    let dir = env.home.parent().unwrap().join("hooks");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn py_hook(env: &Env, name: &str) -> PathBuf {
    env.python_hook(name)
}

fn entries(env: &Env) -> Vec<Value> {
    util::entries(&env.session_files()[0])
}

fn of_type(entries: &[Value], kind: &str) -> Vec<Value> {
    entries.iter().filter(|e| e["type"] == kind).map(|e| e["payload"].clone()).collect()
}

#[test]
fn a_pre_tool_hook_refuses_curl_and_its_decision_is_logged_before_anything_runs() {
    let env = Env::new();
    let hook = script(
        &env,
        "no-curl",
        r#"input=$(cat)
case "$input" in
  *curl*) printf '%s' '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"no downloads from the shell"}}' ;;
esac"#,
    );
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"shell\"\n", hook.display()),
    )
    .unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "shell", "arguments": {"command": "curl -o x.sh http://example.invalid/x.sh"}},
            {"id": "c2", "name": "shell", "arguments": {"command": "echo fine > ok.txt"}},
        ]}),
        json!({"text": "done"}),
    ]);
    let out =
        env.cairn(&["--script", turn.to_str().unwrap(), "--yes", "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "a refused call makes the run exit 4: {}", stderr(&out));
    assert!(stderr(&out).contains("no downloads from the shell"), "the reason is shown: {}", stderr(&out));
    let all = entries(&env);
    let requested = of_type(&all, "toolRequested");
    let curl = requested.iter().find(|p| p["request"]["callId"] == "c1").unwrap();
    assert_eq!(curl["hook"]["decision"], "deny", "{curl:#}");
    assert_eq!(curl["hook"]["reason"], "no downloads from the shell");
    assert!(curl["hook"]["by"].as_str().unwrap().starts_with("hook:pre_tool:"));
    let rejected = of_type(&all, "toolRejected");
    assert_eq!(rejected.len(), 1, "{rejected:#?}");
    assert!(rejected[0].to_string().contains("no downloads from the shell"));
    let started = of_type(&all, "toolStarted");
    assert_eq!(started.len(), 1, "only the echo ran: {started:#?}");
    assert_eq!(started[0]["callId"], "c2");
    assert!(env.cwd.join("ok.txt").exists() && !env.cwd.join("x.sh").exists());
}

#[test]
fn a_pre_tool_hook_rewrites_an_argument_and_the_model_s_is_kept() {
    let env = Env::new();
    let hook = script(
        &env,
        "redirect",
        r#"cat >/dev/null
printf '%s' '{"hookSpecificOutput":{"updatedInput":{"path":"drafts/out.txt","content":"rewritten\n"}}}'"#,
    );
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"write_file\"\n", hook.display()),
    )
    .unwrap();
    std::fs::create_dir(env.cwd.join("drafts")).unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "out.txt", "content": "original\n"}}]}),
        json!({"text": "done"}),
    ]);
    let out = env
        .cairn(&["--script", turn.to_str().unwrap(), "--allow", "write_file", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(env.cwd.join("drafts/out.txt")).unwrap(), "rewritten\n");
    assert!(!env.cwd.join("out.txt").exists(), "the model's arguments were not used");
    let requested = of_type(&entries(&env), "toolRequested");
    assert_eq!(requested[0]["request"]["arguments"]["path"], "drafts/out.txt");
    assert_eq!(requested[0]["hook"]["decision"], "rewrite");
    assert_eq!(requested[0]["hook"]["originalArguments"]["path"], "out.txt");
}

#[test]
fn a_hook_that_hangs_or_answers_nonsense_refuses_the_call() {
    let env = Env::new();
    let hang = script(&env, "hang", "sleep 60");
    let nonsense = script(&env, "nonsense", "cat >/dev/null; echo 'sure, go ahead'");
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"read_file\"\ntimeout_ms = 500\n\n\
             [[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"list_dir\"\n",
            hang.display(),
            nonsense.display()
        ),
    )
    .unwrap();
    std::fs::write(env.cwd.join("a.txt"), "secret\n").unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}},
            {"id": "c2", "name": "list_dir", "arguments": {"path": "."}},
        ]}),
        json!({"text": "done"}),
    ]);
    let out = env.cairn(&["--script", turn.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let all = entries(&env);
    assert!(of_type(&all, "toolStarted").is_empty(), "neither call ran");
    let rejected = of_type(&all, "toolRejected");
    assert_eq!(rejected.len(), 2);
    let text = |call: &str| rejected.iter().find(|r| r["callId"] == call).unwrap().to_string();
    assert!(
        text("c1").contains("did not answer within 500 ms") && text("c1").contains("fail closed"),
        "{}",
        text("c1")
    );
    assert!(text("c2").contains("not JSON"), "{}", text("c2"));
}

#[test]
fn a_post_tool_hook_sees_the_receipt() {
    let env = Env::new();
    let hook = script(&env, "log", r#"cat >> post.log; echo >> post.log"#);
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.post_tool]]\ncommand = \"{}\"\nfiles = \"write\"\n", hook.display()),
    )
    .unwrap();
    std::fs::write(env.cwd.join("a.txt"), "the launch code is 7-4-1\n").unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
        json!({"text": "done"}),
    ]);
    let out = env.cairn(&["--script", turn.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = std::fs::read_to_string(env.cwd.join("post.log")).unwrap();
    let seen: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(seen["hook_event_name"], "PostToolUse");
    assert_eq!(seen["tool_name"], "Read", "Claude Code's name");
    assert_eq!(seen["cairn_tool_name"], "read_file");
    assert_eq!(seen["settlement"], "toolCompleted");
    assert!(seen["tool_response"]["receipt"]["outputSummary"].as_str().unwrap().contains("7-4-1"), "{seen:#}");
}

#[test]
fn a_bad_hook_description_is_refused_with_the_reason() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[[hooks.pre_tool]]\ncommand = \"x\"\nmatcher = \"sh(ell\"\n")
        .unwrap();
    let out = env.cairn(&["tools"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("matcher"), "{}", stderr(&out));
}

#[test]
fn hooks_run_in_the_sandbox_their_entry_declares() {
    let env = Env::new();
    let hook = script(&env, "scribble", "cat >/dev/null; echo pwned > hooked.txt; exit 0");
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "list_dir", "arguments": {"path": "."}}]}),
        json!({"text": "done"}),
    ]);
    // The default: the working directory read-only, no network.
    std::fs::write(env.home.join("config.toml"), format!("[[hooks.pre_tool]]\ncommand = \"{}\"\n", hook.display()))
        .unwrap();
    let out = env.cairn(&["--script", turn.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!env.cwd.join("hooked.txt").exists(), "a read-only hook wrote the working tree");
    // Declared writable, the same hook can.
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_tool]]\ncommand = \"{}\"\nfiles = \"write\"\n", hook.display()),
    )
    .unwrap();
    let out = env.cairn(&["--script", turn.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.cwd.join("hooked.txt").exists());
}

/// A repository's own `.cairn/config.toml` (hooks, MCP servers) loads only
/// while a person trusts the directory with exactly that file.
#[test]
fn project_hooks_load_only_after_cairn_trust_and_again_after_a_change() {
    let env = Env::new();
    let hook = script(
        &env,
        "deny-all",
        r#"cat >/dev/null; printf '%s' '{"decision":"block","reason":"the project says no"}'"#,
    );
    std::fs::create_dir_all(env.cwd.join(".cairn")).unwrap();
    let project = env.cwd.join(".cairn/config.toml");
    std::fs::write(&project, format!("[[hooks.pre_tool]]\ncommand = \"{}\"\n", hook.display())).unwrap();
    std::fs::write(env.cwd.join("a.txt"), "hello\n").unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
        json!({"text": "done"}),
    ]);
    let run = || {
        let out = env.cairn(&["--script", turn.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
        let all = entries(&env);
        std::fs::remove_file(&env.session_files()[0]).unwrap();
        (out, of_type(&all, "toolRejected").len())
    };
    // Not trusted: the hook does not run, and the user is told how to trust.
    let (out, refused) = run();
    assert_eq!((out.status.code(), refused), (Some(0), 0), "{}", stderr(&out));
    assert!(stderr(&out).contains("cairn trust"), "{}", stderr(&out));
    // Trusted: it runs.
    let trusted = env.cairn(&["trust"]).output().unwrap();
    assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
    let (out, refused) = run();
    assert_eq!((out.status.code(), refused), (Some(4), 1), "{}", stderr(&out));
    assert!(stderr(&out).contains("the project says no"));
    // Changed after the trust: not loaded until trusted again.
    std::fs::write(&project, format!("[[hooks.pre_tool]]\ncommand = \"{}\"\ntimeout_ms = 9000\n", hook.display()))
        .unwrap();
    let (out, refused) = run();
    assert_eq!((out.status.code(), refused), (Some(0), 0), "{}", stderr(&out));
    assert!(stderr(&out).contains("again"), "{}", stderr(&out));
}

#[test]
fn a_user_prompt_hook_refuses_a_prompt_or_adds_context_and_both_are_recorded() {
    let env = Env::new();
    let guard = script(
        &env,
        "no-secrets",
        r#"case "$(cat)" in *password*) echo 'prompts must not carry passwords' >&2; exit 2 ;; esac"#,
    );
    let context = script(&env, "context", "cat >/dev/null; echo 'The build command is make -j4.'");
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[[hooks.user_prompt]]\ncommand = \"{}\"\n\n[[hooks.user_prompt]]\ncommand = \"{}\"\n",
            guard.display(),
            context.display()
        ),
    )
    .unwrap();
    let turn = env.script(&[json!({"text": "noted"})]);
    let out = env
        .cairn(&["--script", turn.to_str().unwrap(), "run", "my password is hunter2"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("prompts must not carry passwords"), "{}", stderr(&out));
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(!log.contains("hunter2"), "the refused prompt is not in the log: {log}");
    assert!(log.contains("promptRefused") && log.contains("prompts must not carry passwords"), "{log}");
    let check = env.cairn(&["--json", "check", "--", env.session_files()[0].to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&check.stdout).contains("\"ok\":true"), "{check:?}");
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    let out =
        env.cairn(&["--script", turn.to_str().unwrap(), "run", "build it"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let user = entries(&env).into_iter().find(|e| e["type"] == "message" && e["payload"]["role"] == "user").unwrap();
    let parts = user["payload"]["content"].as_array().unwrap();
    assert_eq!(parts[0]["text"], "build it");
    let added = parts[1]["text"].as_str().unwrap();
    assert!(added.contains("The build command is make -j4.") && added.contains("hook:user_prompt:"), "{added}");
}

#[test]
fn a_pre_compact_hook_is_told_before_a_compaction() {
    let env = Env::new();
    let hook = script(&env, "note-compaction", "cat >> compactions.log; echo >> compactions.log");
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_compact]]\ncommand = \"{}\"\nfiles = \"write\"\n", hook.display()),
    )
    .unwrap();
    let turn = env.script(&[json!({"text": "one"}), json!({"text": "two"}), json!({"text": "We said hello twice."})]);
    let s = turn.to_str().unwrap();
    let first = env.cairn(&["--script", s, "run", "hello"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let second = env
        .cairn(&["--script", s, "resume", "--last", "--prompt", "hello again"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let file = env.session_files()[0].clone();
    let compact = env.cairn(&["--script", s, "compact", "--context", file.to_str().unwrap()]).output().unwrap();
    assert_eq!(compact.status.code(), Some(0), "{}", stderr(&compact));
    let log = std::fs::read_to_string(env.cwd.join("compactions.log")).unwrap();
    let told: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(told["hook_event_name"], "PreCompact");
    assert_eq!(told["trigger"], "manual");
}

/// `session_start` (its context goes with the first prompt and is
/// recorded there), `subagent_stop` (told the child's answer) and
/// `session_end` (when the process leaves), each told in Claude Code's
/// shapes; a resumed session starts again with source "resume".
#[test]
fn session_start_subagent_stop_and_session_end_hooks_are_told_in_order() {
    let env = Env::new();
    let log = script(&env, "log-event", "cat >> events.log; echo >> events.log");
    let context =
        script(&env, "start-context", "cat >> events.log; echo >> events.log; echo 'The repo builds with make.'");
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[[hooks.session_start]]\ncommand = \"{c}\"\nfiles = \"write\"\n\n\
             [[hooks.subagent_stop]]\ncommand = \"{l}\"\nfiles = \"write\"\n\n\
             [[hooks.session_end]]\ncommand = \"{l}\"\nfiles = \"write\"\n",
            c = context.display(),
            l = log.display()
        ),
    )
    .unwrap();
    let child = env.home.join("child.jsonl");
    std::fs::write(&child, format!("{}\n", json!({"text": "child done"}))).unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "p1", "name": "spawn_agent", "arguments": {"prompt": "say done", "script": child.to_str().unwrap()}}]}),
        json!({"text": "parent done"}),
        json!({"text": "again"}),
    ]);
    let s = turn.to_str().unwrap();
    let out = env.cairn(&["--script", s, "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parent_file =
        env.session_files().into_iter().find(|p| !p.file_stem().unwrap().to_str().unwrap().contains('+')).unwrap();
    let parent_id = parent_file.file_stem().unwrap().to_str().unwrap().to_owned();
    let user = util::entries(&parent_file)
        .into_iter()
        .find(|e| e["type"] == "message" && e["payload"]["role"] == "user")
        .unwrap();
    let parts = user["payload"]["content"].as_array().unwrap();
    let added = parts[1]["text"].as_str().unwrap_or_default();
    assert!(added.contains("The repo builds with make.") && added.contains("hook:session_start:"), "{user:#}");

    let read = || -> Vec<Value> {
        std::fs::read_to_string(env.cwd.join("events.log"))
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let events = read();
    let of = |events: &[Value], name: &str, id: &str| -> Vec<Value> {
        events.iter().filter(|e| e["hook_event_name"] == name && e["session_id"] == id).cloned().collect()
    };
    let started = of(&events, "SessionStart", &parent_id);
    assert_eq!(started.len(), 1, "{events:#?}");
    assert_eq!(started[0]["source"], "startup");
    let stopped = of(&events, "SubagentStop", &parent_id);
    assert_eq!(stopped.len(), 1, "{events:#?}");
    assert_eq!(stopped[0]["answer"], "child done");
    assert_eq!(stopped[0]["status"], "answered");
    assert!(stopped[0]["subagent_session_id"].as_str().unwrap().starts_with(&format!("{parent_id}+")));
    let ended = of(&events, "SessionEnd", &parent_id);
    assert_eq!(ended.len(), 1, "{events:#?}");
    assert_eq!(ended[0]["reason"], "exit");
    let order: Vec<&str> = events
        .iter()
        .filter(|e| e["session_id"] == parent_id.as_str())
        .map(|e| e["hook_event_name"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["SessionStart", "SubagentStop", "SessionEnd"], "{events:#?}");

    let out =
        env.cairn(&["--script", s, "resume", &parent_id, "--prompt", "more"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = read();
    let started = of(&events, "SessionStart", &parent_id);
    assert_eq!(started.len(), 2, "{events:#?}");
    assert_eq!(started[1]["source"], "resume");
    assert_eq!(of(&events, "SessionEnd", &parent_id).len(), 2, "{events:#?}");
}

/// Issue 53.2: hooks written to Claude Code's documented interface block
/// under cairn as they do there: its tool names (`Bash`, `Write`, `Read`)
/// and fields (`tool_input.file_path`, absolute), its matchers (names
/// separated by `|`, regular expressions), exit code 2 with stderr, and the
/// JSON deny; the common input fields are given; a matcher naming no tool
/// is a warning at load.
#[test]
fn claude_code_s_hooks_block_under_cairn_as_written() {
    let env = Env::new();
    let validator = py_hook(&env, "bash_command_validator.py");
    let guard = py_hook(&env, "file_guard.py");
    let probe = py_hook(&env, "read_probe.py");
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"Bash\"\n\n\
             [[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"Edit|Write|MultiEdit\"\n\n\
             [[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"^Rea.*\"\n\n\
             [[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"Bsh|Wirte\"\n",
            validator.display(),
            guard.display(),
            probe.display(),
            validator.display(),
        ),
    )
    .unwrap();
    std::fs::write(env.cwd.join("a.txt"), "a\n").unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "shell", "arguments": {"command": "grep -r needle . > found.txt"}},
            {"id": "c2", "name": "shell", "arguments": {"command": "echo fine > ok.txt"}},
            {"id": "c3", "name": "write_file", "arguments": {"path": ".env", "content": "TOKEN=x\n"}},
            {"id": "c4", "name": "write_file", "arguments": {"path": "notes.txt", "content": "n\n"}},
            {"id": "c5", "name": "edit_file", "arguments": {"path": "package-lock.json", "old": "a", "new": "b"}},
            {"id": "c6", "name": "read_file", "arguments": {"path": "a.txt"}},
        ]}),
        json!({"text": "done"}),
    ]);
    let out =
        env.cairn(&["--script", turn.to_str().unwrap(), "--yes", "run", "go"]).stdin(Stdio::null()).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "refused calls make the run exit 4: {err}");
    assert!(
        err.contains("\"Bsh|Wirte\"") && err.contains("names no tool"),
        "the matcher naming no tool is a warning: {err}"
    );
    assert!(env.cwd.join("ok.txt").exists() && env.cwd.join("notes.txt").exists(), "the rest ran: {err}");
    assert!(!env.cwd.join("found.txt").exists(), "the validator's exit 2 did not block grep");
    assert!(!env.cwd.join(".env").exists(), "the file guard did not block .env");
    let all = entries(&env);
    let rejected = of_type(&all, "toolRejected");
    let reason = |call: &str| {
        rejected
            .iter()
            .find(|r| r["callId"] == call)
            .map(|r| r["reason"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    assert!(reason("c1").contains("Use 'rg' (ripgrep) instead of 'grep'"), "{rejected:#?}");
    assert!(reason("c3").contains(".env is protected"), "{rejected:#?}");
    assert!(reason("c5").contains("package-lock.json is protected"), "{rejected:#?}");
    assert_eq!(rejected.len(), 4, "{rejected:#?}");
    // The probe saw Claude Code's common fields.
    let said = reason("c6");
    let fields: Value = serde_json::from_str(said.split_once("probe ").unwrap().1).unwrap();
    let session = &env.session_files()[0];
    assert_eq!(fields["tool_name"], "Read");
    assert_eq!(fields["hook_event_name"], "PreToolUse");
    assert_eq!(fields["permission_mode"], "default");
    assert_eq!(fields["transcript_path"], session.to_str().unwrap());
    assert_eq!(fields["file_path"], env.cwd.join("a.txt").to_str().unwrap());
    assert_eq!(fields["cwd"], env.cwd.to_str().unwrap());
    assert_eq!(fields["session_id"], session.file_stem().unwrap().to_str().unwrap());
}

/// Issue 53.2: `permissionDecision: "ask"` puts the call to a person, which
/// no allow rule or `--yes` answers (headless: refused); `"continue":
/// false` refuses the call and ends the turn with its `stopReason`, without
/// another model call.
#[test]
fn claude_code_s_ask_needs_a_person_and_continue_false_stops_the_turn() {
    let env = Env::new();
    let ask = py_hook(&env, "ask_for_writes.py");
    let freeze = py_hook(&env, "freeze.py");
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"Write\"\n\n\
             [[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"Bash\"\n",
            ask.display(),
            freeze.display(),
        ),
    )
    .unwrap();
    let turn = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "w.txt", "content": "w\n"}}]}),
        json!({"text": "", "toolCalls": [
            {"id": "c2", "name": "shell", "arguments": {"command": "echo a > a.txt"}},
            {"id": "c3", "name": "read_file", "arguments": {"path": "w.txt"}},
        ]}),
        json!({"text": "never said"}),
    ]);
    let out = env
        .cairn(&["--script", turn.to_str().unwrap(), "--yes", "--allow", "write_file", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(!env.cwd.join("w.txt").exists(), "--yes or an allow rule answered a hook's ask");
    assert!(!env.cwd.join("a.txt").exists(), "continue:false did not stop the command");
    assert!(err.contains("the build is frozen"), "the stop reason is shown: {err}");
    let all = entries(&env);
    let requested = of_type(&all, "toolRequested");
    let c1 = requested.iter().find(|p| p["request"]["callId"] == "c1").unwrap();
    assert_eq!(c1["hook"]["decision"], "ask", "{c1:#}");
    let rejected = of_type(&all, "toolRejected");
    let c1 = rejected.iter().find(|r| r["callId"] == "c1").unwrap();
    assert_eq!(c1["verdict"]["by"], "policy:headless", "{c1:#}");
    assert!(c1["reason"].as_str().unwrap().contains("need a person's look"), "{c1:#}");
    let c2 = requested.iter().find(|p| p["request"]["callId"] == "c2").unwrap();
    assert_eq!(c2["hook"]["decision"], "stop", "{c2:#}");
    assert!(rejected.iter().any(|r| r["callId"] == "c3"), "the rest of the message is refused: {rejected:#?}");
    assert!(of_type(&all, "toolStarted").is_empty(), "nothing ran");
    let ended = of_type(&all, "turnEnded");
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert!(ended[0]["reason"].as_str().unwrap().contains("the build is frozen"));
    assert!(!all.iter().any(|e| e.to_string().contains("never said")), "the model was called again");
}
