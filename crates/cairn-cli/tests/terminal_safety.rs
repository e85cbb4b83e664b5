//! What a user's terminal is protected from, through the real `cairn`
//! binary: control sequences in model text, tool output and stored entries
//! are shown escaped by `run`, `show` and `log` (and stay exact JSON values
//! with `--json`), as is the approval prompt in a real pty; `show --tools`
//! lists every invocation from the log; and `--allow 'shell(ls *)'` never
//! runs a hostile spelling of another command.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::process::{Output, Stdio};

use cairn_test_server::{Reply, TestServer, streams};
use serde_json::{Value, json};
use util::Env;

/// Characters that must never reach a terminal raw.
const RAW: &[char] = &['\u{1b}', '\u{7}', '\u{9b}', '\u{8}', '\u{7f}', '\u{202e}', '\u{2066}', '\r', '\u{0}'];

/// The hostile text models and tools produce in these tests: an OSC title
/// change, clear-screen, a one-character C1 CSI, backspace, DEL, bidi.
const HOSTILE: &str = "A\u{1b}]0;pwned\u{7}B\u{1b}[2JC\u{9b}31mD\u{8}E\u{7f}F\u{202e}G\u{2066}H\r";

fn assert_no_raw(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for c in RAW {
        assert!(!text.contains(*c), "{what} carries a raw {c:?}:\n{text:?}");
    }
}

fn run(env: &Env, args: &[&str]) -> Output {
    env.cairn(args).stdin(Stdio::null()).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Entry types of a session file, in order.
fn entry_types(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut types = Vec::new();
    for line in text.lines().skip(1) {
        let records = match serde_json::from_str::<Value>(line).unwrap() {
            Value::Array(items) => items,
            one => vec![one],
        };
        for r in records {
            if r["kind"] == "entry" {
                types.push(r["type"].as_str().unwrap().to_owned());
            }
        }
    }
    types
}

#[test]
fn control_sequences_from_model_tools_and_the_log_are_shown_escaped() {
    let env = Env::new();
    std::fs::write(env.cwd.join("evil.txt"), format!("file says {HOSTILE}\n")).unwrap();
    // printf turns the octal escapes into the raw bytes only when it runs.
    let printf = r"printf 'out \033]0;pwned\007 \033[2J \302\233 \342\200\256 end\n'";
    let script = env.script(&[
        json!({"text": format!("first {HOSTILE} "), "toolCalls": [
            {"id": "c1", "name": "read_file", "arguments": {"path": "evil.txt"}},
            {"id": "c2", "name": "shell", "arguments": {"command": printf}},
        ]}),
        json!({"text": format!("final {HOSTILE} done")}),
    ]);
    let script = script.to_str().unwrap();
    let allow = ["--allow", "shell(printf *)", "--allow-unsandboxed"];

    let out = run(&env, &[&["--script", script, "run", "go"][..], &allow].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_raw("run's stdout", &out.stdout);
    assert_no_raw("run's stderr", &out.stderr);
    let shown = text(&out);
    assert!(shown.contains("final A\\u{1b}]0;pwned\\u{7}B\\u{1b}[2JC\\u{9b}31m"), "escaped, visible: {shown}");
    assert!(shown.contains("out \\u{1b}]0;pwned\\u{7} \\u{1b}[2J \\u{9b} \\u{202e} end"), "tool output: {shown}");
    let session = env.session_files().pop().unwrap();
    assert_eq!(
        entry_types(&session),
        [
            "message",
            "message",
            "toolRequested",
            "toolStarted",
            "toolCompleted",
            "toolRequested",
            "toolStarted",
            "toolCompleted",
            "message"
        ],
        "both tools ran"
    );
    let stored = std::fs::read_to_string(&session).unwrap();
    assert!(stored.contains("pwned"), "the log keeps what happened");

    // --json: every line is JSON whose values are the exact text.
    let out =
        run(&env, &["--json", "--script", script, "--allow", "shell(printf *)", "--allow-unsandboxed", "run", "go"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_raw("run --json", &out.stdout);
    let events: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "delta" || e["event"]["type"] == "textDelta")
        .filter_map(|e| e["event"]["text"].as_str().or(e["text"].as_str()))
        .collect();
    assert!(streamed.contains(&format!("final {HOSTILE} done")), "the JSON values are exact: {streamed:?}");

    // `chat` renders the same way (a line from stdin, no terminal).
    let mut child = env
        .cairn(&["--script", script, "--allow", "shell(printf *)", "--allow-unsandboxed", "chat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_raw("chat's stdout", &out.stdout);
    assert_no_raw("chat's stderr", &out.stderr);
    assert!(text(&out).contains("final A\\u{1b}]0;pwned"), "{}", text(&out));

    // Reading the session back: show, show --tools, log, in both forms.
    let path = session.to_str().unwrap();
    for args in [
        &["show", path][..],
        &["show", "--tools", path],
        &["--json", "show", "--tools", path],
        &["log", path],
        &["--json", "log", path],
        &["sessions"],
    ] {
        let out = run(&env, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert_no_raw(&format!("{args:?}"), &out.stdout);
        assert_no_raw(&format!("{args:?}"), &out.stderr);
        if args.contains(&"--json") || args[0] == "log" {
            for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#')) {
                let _: Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{args:?}: not JSON {line:?}: {e}"));
            }
        }
    }
    let show = run(&env, &["show", path]);
    assert!(text(&show).contains("pwned"), "{}", text(&show));
    let log = run(&env, &["--json", "log", path]);
    let log_text = String::from_utf8_lossy(&log.stdout);
    assert!(log_text.contains("\\u001b]0;pwned"), "{log_text}");
    assert!(log_text.contains("\\u009b") && log_text.contains("\\u202e"), "C1 and bidi are \\u escapes: {log_text}");
}

#[test]
fn an_escape_sequence_split_across_streamed_deltas_stays_escaped() {
    let pieces = ["Title: ", "\u{1b}", "]0;pw", "ned\u{7}", " clear: \u{1b}[", "2J", " csi: \u{9b}", "31m", " end"];
    let mut body = String::new();
    for piece in pieces {
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]});
        body.push_str(&streams::event("", &chunk.to_string()));
    }
    let stop = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    body.push_str(&streams::event("", &stop.to_string()));
    body.push_str("data: [DONE]\n\n");
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let env = Env::new();
    let out = env
        .cairn(&["--provider", "openai", "--model", "m", "run", "hi"])
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_raw("stdout", &out.stdout);
    assert_no_raw("stderr", &out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Title: \\u{1b}]0;pwned\\u{7} clear: \\u{1b}[2J csi: \\u{9b}31m end"),
        "every piece shown, escaped: {stdout:?}"
    );
}

#[test]
fn show_tools_lists_every_invocation_from_the_log() {
    let env = Env::new();
    std::fs::write(env.cwd.join("a.txt"), "alpha\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}},
            {"id": "c2", "name": "write_file", "arguments": {"path": "b.txt", "content": "x"}},
            {"id": "c3", "name": "read_file", "arguments": {"path": "missing.txt"}},
        ]}),
        json!({"text": "done"}),
    ]);
    let out = run(&env, &["--script", script.to_str().unwrap(), "run", "go"]);
    assert_eq!(out.status.code(), Some(4), "write_file is denied without a terminal: {}", text(&out));
    let session = env.session_files().pop().unwrap();
    let path = session.to_str().unwrap();

    let out = run(&env, &["--json", "show", "--tools", path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    let tools: Vec<&str> = rows.iter().map(|r| r["tool"].as_str().unwrap()).collect();
    assert_eq!(tools, ["read_file", "write_file", "read_file"]);
    let statuses: Vec<&str> = rows.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["completed", "rejected", "failed"]);
    assert_eq!(rows[0]["verdict"]["by"], "policy:readOnly");
    assert_eq!(rows[0]["receipt"]["exitCode"], 0);
    assert!(rows[0]["receipt"]["outputSummary"].as_str().unwrap().contains("alpha"));
    assert!(rows[0]["completedAt"].as_i64().unwrap() >= rows[0]["requestedAt"].as_i64().unwrap());
    assert_eq!(rows[1]["verdict"]["decision"], "deny");
    assert!(rows[1]["reason"].as_str().unwrap().contains("no person can answer here"), "{}", rows[1]);
    assert!(rows[2]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{}", rows[2]);
    for row in &rows {
        assert_eq!(row["settlements"], 1);
    }

    let out = run(&env, &["show", "--tools", path]);
    let shown = String::from_utf8_lossy(&out.stdout);
    for expected in ["read_file (ReadOnly): completed", "write_file (Write): rejected", "read_file (ReadOnly): failed"]
    {
        assert!(shown.contains(expected), "{expected:?} in:\n{shown}");
    }
    assert!(shown.contains("verdict   approved by policy:readOnly"), "{shown}");
    assert!(shown.contains("verdict   denied by policy:headless"), "{shown}");
    assert!(shown.contains("reason    write_file needs approval: no allow rule covers this call"), "{shown}");
    assert!(shown.contains("receipt   exit 0"), "{shown}");

    // A session without tool calls says so.
    let env = Env::new();
    let script = env.script(&[json!({"text": "hello"})]);
    assert_eq!(run(&env, &["--script", script.to_str().unwrap(), "run", "hi"]).status.code(), Some(0));
    let session = env.session_files().pop().unwrap();
    let out = run(&env, &["show", "--tools", session.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no tool calls"), "{}", text(&out));
}

/// Runs `command` as the model's shell call under `--allow 'shell(ls *)'`
/// (and `extra` flags), headless, in a directory holding `victim` and `x`.
/// Returns the env, the session's entry types and the output.
fn shell_call(command: &str, allow: &str) -> (Env, Vec<String>, Output) {
    let env = Env::new();
    std::fs::write(env.cwd.join("victim"), "keep me\n").unwrap();
    std::fs::write(env.cwd.join("x"), "keep me too\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]}),
        json!({"text": "done"}),
    ]);
    let out =
        run(&env, &["--script", script.to_str().unwrap(), "--allow", allow, "--allow-unsandboxed", "run", "clean up"]);
    let types = entry_types(&env.session_files().pop().unwrap());
    (env, types, out)
}

#[test]
fn an_ls_allow_rule_never_runs_a_hostile_spelling() {
    // The harness can see a run and a deletion: allowed calls do run.
    let (env, types, out) = shell_call("ls -la", "shell(ls *)");
    assert!(types.contains(&"toolCompleted".to_owned()), "ls runs: {types:?} {}", text(&out));
    assert!(env.cwd.join("victim").exists());
    // An allowed call's file effect does reach the tree, so the checks
    // below can fail. (Deleting an existing file is itself Destructive when
    // shell runs staged, so the harness shows an allowed write instead.)
    let (env, types, out) = shell_call("touch made", "shell(touch made)");
    assert!(types.contains(&"toolCompleted".to_owned()), "{types:?} {}", text(&out));
    assert!(env.cwd.join("made").exists(), "an allowed call does write");

    // `rm -rf` is Destructive anyway; the plain `rm` forms are Write calls
    // only the allowlist stands in front of.
    let spellings = [
        "'rm' -rf victim",
        "'rm' victim",
        "\"rm\" -rf x",
        "\"rm\" x",
        "r\\m -rf x",
        "r\\m x",
        "r''m -rf x",
        "r''m x",
        "{rm,-rf,x}",
        "{rm,x}",
        "rm${IFS}-rf${IFS}x",
        "rm${IFS}x",
        "x=-rf; rm $x",
        "x=-f; rm $x x",
        "$(echo rm) -rf x",
        "$(echo rm) x",
        "R=rm; $R -rf x",
        "R=rm; $R x",
        "ls; rm -rf x",
        "ls; rm x",
        "ls $(rm -rf x)",
        "ls $(rm x)",
        "ls `rm x`",
        "ls && rm x",
        "ls || rm x",
        "ls | xargs rm",
        "ls -la\nrm -rf x",
        "ls -la\nrm x",
        "ls -la \\\n; rm x",
        "ls # \nrm x",
        "ls x=~; rm x",
        "ls {x,victim} && rm x",
        "alias ls=rm; ls x",
        "command rm x",
        "exec rm x",
        "eval rm x",
        "ls > x",
        "ls & rm x",
        "l\\s; rm x",
        "find . -delete",
        "find . -exec rm {} +",
    ];
    for spelling in spellings {
        let (env, types, out) = shell_call(spelling, "shell(ls *)");
        for file in ["victim", "x"] {
            let content = std::fs::read_to_string(env.cwd.join(file));
            assert!(
                content.as_deref().is_ok_and(|c| c.starts_with("keep me")),
                "{spelling:?} touched {file}: {types:?}\n{}",
                text(&out)
            );
        }
        assert!(
            types.contains(&"toolRejected".to_owned()) && !types.contains(&"toolStarted".to_owned()),
            "{spelling:?} must be recorded as rejected, never started: {types:?}\n{}",
            text(&out)
        );
        assert_eq!(out.status.code(), Some(4), "{spelling:?}: exit 4 (a call was refused)\n{}", text(&out));
    }
}

#[test]
fn the_approval_prompt_shows_hostile_arguments_escaped() {
    let env = Env::new();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "write_file", "arguments": {"path": format!("f{HOSTILE}.txt"), "content": format!("{HOSTILE}\n")}},
            {"id": "c2", "name": "shell", "arguments": {"command": format!("echo {HOSTILE}")}},
        ]}),
        json!({"text": "ok"}),
    ]);
    let mut p = rexpect::session::spawn_command(
        env.cairn(&["--script", script.to_str().unwrap(), "--allow-unsandboxed", "run", "go"]),
        Some(20_000),
    )
    .unwrap();
    // rexpect hands over the pty's bytes one `char` per byte; the pty
    // itself turns each newline into CR LF.
    let bytes = |shown: &str| -> Vec<u8> { shown.replace("\r\n", "\n").chars().map(|c| c as u8).collect() };
    for _ in 0..2 {
        let shown = p.exp_string("Run it? [y/N/a=always this session] ").unwrap();
        assert_no_raw("the approval prompt", &bytes(&shown));
        assert!(shown.contains("\\u{1b}]0;pwned\\u{7}"), "shown escaped: {shown}");
        p.send_line("n").unwrap();
        p.flush().unwrap();
    }
    let rest = p.exp_eof().unwrap();
    assert_no_raw("the rest of the run", &bytes(&rest));
    assert!(!env.cwd.read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with('f')));
}

/// `cairn check` names the file it checked and quotes what is wrong with
/// it: a hostile file name (and a corrupt line) must not reach the
/// terminal raw, in text or JSON.
#[test]
fn check_shows_a_hostile_file_name_escaped() {
    let env = Env::new();
    let path = env.home.join(format!("s{}.jsonl", HOSTILE.replace(['\0', '/'], "")));
    std::fs::write(&path, format!("not a header {HOSTILE}\n{{}}\n")).unwrap();
    let p = path.to_str().unwrap();
    for args in [vec!["check", p], vec!["--json", "check", p]] {
        let out = run(&env, &args);
        assert!(!out.status.success(), "a corrupt file must fail the check: {}", text(&out));
        assert_no_raw(&format!("{args:?} stdout"), &out.stdout);
        assert_no_raw(&format!("{args:?} stderr"), &out.stderr);
    }
}
