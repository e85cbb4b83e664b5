//! `cairn mcp` and `cairn acp` through the real binary, driven by the
//! official Python client libraries (PyPI `mcp`, `agent-client-protocol`,
//! pinned in `tests/python/faces.txt`, venv made by `scripts/venv faces`),
//! and hostile input written byte by byte. A missing python or PyPI makes
//! these tests fail with the reason; they never pass silently.
//!
//! The Python scripts in `tests/faces/` hold the protocol oracles (what a
//! client sees); this file sets up the home, the working directory, the
//! scripts and the tools, and checks what landed on disk.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};
use util::Env;

/// The venv's python, made once per test process.
fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Command::new(root.join("scripts/venv")).arg("faces").output().unwrap_or_else(|e| {
            panic!("cannot run scripts/venv faces ({e}): python3 with venv and PyPI access are needed for these tests")
        });
        assert!(
            out.status.success(),
            "scripts/venv faces failed (python3, venv or PyPI unavailable?):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn client(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/faces").join(file)
}

/// The binary under test (`CAIRN_TEST_BIN` overrides, as in `util`).
fn cairn_bin() -> PathBuf {
    std::env::var_os("CAIRN_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| assert_cmd::cargo::cargo_bin("cairn"))
}

/// A home with one read-only and one Destructive external tool, and a root
/// with a file, a subdirectory and a link out; a secret beside the root.
fn setup() -> Env {
    let env = Env::new();
    let tools = env.home.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let exe = |name: &str, body: &str| {
        let path = tools.join(name);
        std::fs::write(&path, body).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
    };
    // Shell builtins only: the sandbox gives a tool without processSpawn no fork.
    exe("hello", "#!/bin/sh\nread -r args\nn=${args#*\\\"name\\\":\\\"}\necho \"hi ${n%%\\\"*}\"\n");
    std::fs::write(
        tools.join("hello.toml"),
        "description = \"Say hi\"\nrisk = \"readOnly\"\ncapabilities = []\nreplay = \"idempotent\"\n[parameters]\ntype = \"object\"\nproperties = { name = { type = \"string\" } }\nrequired = [\"name\"]\n",
    )
    .unwrap();
    exe("nuke", "#!/bin/sh\ntouch \"$PWD/nuked\"\n");
    std::fs::write(
        tools.join("nuke.toml"),
        "description = \"Delete everything\"\nrisk = \"destructive\"\ncapabilities = [\"fileWrite\"]\nreplay = \"never\"\n[parameters]\ntype = \"object\"\n",
    )
    .unwrap();
    std::fs::write(env.cwd.join("a.txt"), "hello from the root\n").unwrap();
    std::fs::create_dir_all(env.cwd.join("sub")).unwrap();
    std::fs::write(env.cwd.join("sub/keep"), "keep me").unwrap();
    let secret = env.cwd.parent().unwrap().join("secret.txt");
    std::fs::write(&secret, "TOP SECRET\n").unwrap();
    std::os::unix::fs::symlink(&secret, env.cwd.join("link-out")).unwrap();
    env
}

/// Run a client script; panic with its output unless it succeeds.
fn run_client(file: &str, args: &[&str]) -> String {
    let out = Command::new(python()).arg(client(file)).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{file} {args:?} failed:\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn mcp(env: &Env, scenario: &str, extra: &[&str]) -> String {
    let bin = cairn_bin();
    let mut args = vec![scenario, bin.to_str().unwrap(), env.home.to_str().unwrap(), env.cwd.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_client("mcp_client.py", &args)
}

/// Records of a session file (all lines after the header).
fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Entry types of a session file in order, read from the raw lines.
fn entry_types(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut types = Vec::new();
    for line in text.lines() {
        let mut rest = line;
        while let Some(i) = rest.find("\"type\":\"") {
            rest = &rest[i + 8..];
            let end = rest.find('"').unwrap();
            types.push(rest[..end].to_owned());
        }
    }
    types
}

#[test]
fn mcp_lists_read_only_tools_with_annotations_over_pages_and_hides_write_and_destructive() {
    let env = setup();
    let out = mcp(&env, "list", &["--page-size", "2"]);
    assert!(out.contains("listed"), "{out}");
    // Listing alone records nothing.
    assert!(env.session_files().is_empty(), "{:?}", env.session_files());
}

#[test]
fn mcp_exposes_a_write_tool_named_by_allow_but_never_a_destructive_one() {
    let env = setup();
    mcp(&env, "list_allowed", &["--allow", "write_file", "--allow", "nuke"]);
}

#[test]
fn mcp_calls_read_file_and_an_external_tool_and_records_them_in_a_session_of_their_own() {
    let env = setup();
    mcp(&env, "read", &[]);
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let types = entry_types(&files[0]);
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    assert_eq!(count("toolRequested"), 2, "{types:?}");
    assert_eq!(count("toolCompleted"), 2, "{types:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.contains("called tools/call read_file"), "{text}");
    // The session is a valid cairn session.
    let check = env.cairn(&["check", files[0].to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

#[test]
fn mcp_refuses_a_write_tool_that_is_not_exposed() {
    let env = setup();
    mcp(&env, "write_unexposed", &[]);
    assert!(!env.cwd.join("new.txt").exists());
    assert!(!env.cwd.join("nuked").exists());
}

/// `--yes` is honoured over MCP as everywhere (the standing approval of
/// Write calls, in core's policy): a Write tool is exposed and its call is
/// approved by the flag, never silently refused or ignored.
#[test]
fn mcp_yes_exposes_write_tools_and_approves_their_calls_by_the_flag() {
    let env = setup();
    mcp(&env, "write_exposed", &["--yes"]);
    assert_eq!(std::fs::read_to_string(env.cwd.join("new.txt")).unwrap(), "written by mcp\n");
    let files = env.session_files();
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.contains("flag:--yes"), "the verdict names the flag: {text}");
}

#[test]
fn mcp_runs_an_exposed_write_tool_and_records_the_verdict() {
    let env = setup();
    mcp(&env, "write_exposed", &["--allow", "write_file"]);
    assert_eq!(std::fs::read_to_string(env.cwd.join("new.txt")).unwrap(), "written by mcp\n");
    let files = env.session_files();
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.contains("allowlist:write_file"), "the verdict names the rule: {text}");
}

#[test]
fn mcp_a_shell_pattern_exposes_shell_but_runs_only_the_calls_it_covers() {
    let env = setup();
    mcp(&env, "shell_pattern", &["--allow", "shell(ls *)", "--allow", "shell(ls)"]);
    assert!(env.cwd.join("a.txt").exists());
    assert!(env.cwd.join("sub/keep").exists());
}

#[test]
fn mcp_invalid_arguments_are_tool_errors_and_the_server_lives_on() {
    let env = setup();
    mcp(&env, "invalid", &[]);
    let files = env.session_files();
    let types = entry_types(&files[0]);
    assert_eq!(types.iter().filter(|t| *t == "toolRejected").count(), 4, "{types:?}");
}

#[test]
fn mcp_refuses_paths_outside_the_root() {
    let env = setup();
    mcp(&env, "outside", &[]);
}

fn write_script(env: &Env, lines: &[Value]) -> PathBuf {
    env.script(lines)
}

fn acp(env: &Env, scenario: &str, script: &Path, extra: &[&str]) -> String {
    let bin = cairn_bin();
    let mut args = vec![
        scenario,
        bin.to_str().unwrap(),
        env.home.to_str().unwrap(),
        env.cwd.to_str().unwrap(),
        script.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run_client("acp_client.py", &args)
}

fn read_then_write() -> Vec<Value> {
    vec![
        json!({"text": "Let me look.", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
        json!({"toolCalls": [{"id": "c2", "name": "write_file", "arguments": {"path": "b.txt", "content": "new\n"}}]}),
        json!({"text": "Done."}),
    ]
}

#[test]
fn acp_prompt_streams_updates_in_order_and_writes_only_when_allowed() {
    let env = setup();
    let script = write_script(&env, &read_then_write());
    acp(&env, "prompt_allow", &script, &[]);
    assert_eq!(std::fs::read_to_string(env.cwd.join("b.txt")).unwrap(), "new\n");
}

/// An ACP session offers the subagent family: the child's Write call is
/// asked of the editor in the parent's session, and the child's answer
/// reaches the parent.
#[test]
fn acp_a_child_asks_the_editor_and_its_answer_reaches_the_parent() {
    let env = setup();
    let child = env.home.join("child.jsonl");
    let lines = [
        json!({"text": "", "toolCalls": [{"id": "k1", "name": "write_file", "arguments": {"path": "note.txt", "content": "from the child\n"}}]}),
        json!({"text": "child done"}),
    ];
    std::fs::write(&child, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let script = write_script(
        &env,
        &[
            json!({"text": "", "toolCalls": [{"id": "p1", "name": "spawn_agent", "arguments": {"prompt": "write the note", "script": child.to_str().unwrap()}}]}),
            json!({"text": "parent done"}),
        ],
    );
    acp(&env, "subagent", &script, &[]);
    assert_eq!(std::fs::read_to_string(env.cwd.join("note.txt")).unwrap(), "from the child\n");
    let children: Vec<_> = std::fs::read_dir(env.home.join("sessions"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains('+') && name.ends_with(".jsonl"))
        .collect();
    assert_eq!(children.len(), 1, "one child session file: {children:?}");
}

#[test]
fn acp_rejected_permission_leaves_the_file_unwritten() {
    let env = setup();
    let script = write_script(&env, &read_then_write());
    acp(&env, "prompt_reject", &script, &[]);
    assert!(!env.cwd.join("b.txt").exists());
    let text = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(text.contains("user:acp"), "the verdict is recorded with who gave it");
}

// A tool that declares itself Destructive, not `shell rm -rf`: where shell
// runs staged, `rm -rf` is first asked as a Write call and its effect asks
// again as Destructive, so the question sequence depends on the kernel.
#[test]
fn acp_destructive_call_offers_no_always_and_is_not_run_when_rejected() {
    let env = setup();
    let script = write_script(
        &env,
        &[json!({"toolCalls": [{"id": "c1", "name": "nuke", "arguments": {}}]}), json!({"text": "Kept."})],
    );
    acp(&env, "destructive", &script, &[]);
    assert!(!env.cwd.join("nuked").exists());
}

#[test]
fn acp_an_answer_with_an_option_not_offered_is_a_rejection() {
    let env = setup();
    let script = write_script(
        &env,
        &[json!({"toolCalls": [{"id": "c1", "name": "nuke", "arguments": {}}]}), json!({"text": "Kept."})],
    );
    acp(&env, "forged", &script, &[]);
    assert!(!env.cwd.join("nuked").exists());
}

#[test]
fn acp_allow_always_covers_later_write_calls_of_the_session() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "b.txt", "content": "1\n"}}]}),
            json!({"toolCalls": [{"id": "c2", "name": "write_file", "arguments": {"path": "c.txt", "content": "2\n"}}]}),
            json!({"text": "Both."}),
        ],
    );
    acp(&env, "always", &script, &[]);
}

#[test]
fn acp_cancel_mid_turn_is_durable_and_a_new_process_loads_and_continues_it() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "b.txt", "content": "new\n"}}]}),
            json!({"text": "Resumed."}),
            json!({"text": "Second."}),
        ],
    );
    let out = acp(&env, "cancel", &script, &[]);
    let sid = out.lines().find_map(|l| l.strip_prefix("SESSION ")).unwrap().trim().to_owned();
    let files = env.session_files();
    assert_eq!(files.len(), 1);
    assert!(entry_types(&files[0]).iter().any(|t| t == "turnCancelled"), "the cancel is in the log");
    assert!(!env.cwd.join("b.txt").exists());
    // A second agent process loads the session by id and continues it.
    acp(&env, "load", &script, &[&sid]);
    let recs = records(&files[0]);
    assert!(recs.len() > 3);
    let check = env.cairn(&["check", &sid]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

/// Write `input` to `cairn ARGS` then close stdin; the answers by id (and
/// the id-less ones in order) and the exit status.
fn raw(env: &Env, args: &[&str], input: Vec<u8>) -> (Vec<Value>, std::process::ExitStatus) {
    let mut child = env.cairn(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    writer.join().unwrap();
    let status = child.wait().unwrap();
    (out.lines().map(|l| serde_json::from_str(l).unwrap()).collect(), status)
}

fn hostile_input(init: &Value, after: &[Value]) -> Vec<u8> {
    let mut input = Vec::new();
    let mut line = |bytes: &[u8]| {
        input.extend_from_slice(bytes);
        input.push(b'\n');
    };
    line(b"{not json");
    line(b"\xff\xfe\x00binary");
    line(b"[1,2,3]");
    line(br#"{"jsonrpc":"2.0","id":{"x":1},"method":"initialize"}"#);
    line(br#"{"jsonrpc":"2.0","id":100,"method":"tools/list"}"#); // before initialize
    line(init.to_string().as_bytes());
    // 17 MiB of one string: over the 16 MiB message limit.
    let mut huge = br#"{"jsonrpc":"2.0","id":101,"method":"ping","params":{"x":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 17 * 1024 * 1024));
    huge.extend_from_slice(br#""}}"#);
    line(&huge);
    line(br#"{"jsonrpc":"2.0","id":102,"method":"no/such/method","params":{}}"#);
    line(br#"{"jsonrpc":"2.0","method":"no/such/notification"}"#);
    line(br#"{"jsonrpc":"2.0","id":103,"result":{}}"#); // a response nobody asked for
    line(b"");
    for v in after {
        line(v.to_string().as_bytes());
    }
    // The last request has no newline: the input ends right after it.
    input.pop();
    input
}

fn by_id(answers: &[Value], id: i64) -> &Value {
    answers.iter().find(|a| a["id"] == json!(id)).unwrap_or_else(|| panic!("no answer to {id}: {answers:#?}"))
}

fn null_id_codes(answers: &[Value]) -> Vec<i64> {
    answers
        .iter()
        .filter(|a| a.get("id").is_some_and(Value::is_null))
        .map(|a| a["error"]["code"].as_i64().unwrap())
        .collect()
}

#[test]
fn mcp_survives_hostile_input_and_answers_the_request_before_eof() {
    let env = setup();
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}});
    let after = [
        json!({"jsonrpc":"2.0","id":104,"method":"tools/list","params":{"cursor":"bogus"}}),
        json!({"jsonrpc":"2.0","id":105,"method":"tools/call","params":{"name":"read_file","arguments":"not an object"}}),
        json!({"jsonrpc":"2.0","id":106,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt"}}}),
    ];
    let (answers, status) = raw(&env, &["mcp"], hostile_input(&init, &after));
    assert!(status.success(), "{status:?}");
    // parse error ×2, batch, bad id, huge: all answered with id null.
    assert_eq!(null_id_codes(&answers), vec![-32700, -32700, -32600, -32600, -32600], "{answers:#?}");
    assert_eq!(by_id(&answers, 100)["error"]["code"], -32600);
    // An unknown version is answered with the newest this server speaks.
    assert_eq!(by_id(&answers, 1)["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(by_id(&answers, 102)["error"]["code"], -32601);
    assert_eq!(by_id(&answers, 104)["error"]["code"], -32602);
    assert_eq!(by_id(&answers, 105)["result"]["isError"], true);
    assert_eq!(by_id(&answers, 106)["result"]["isError"], false);
    assert!(by_id(&answers, 106)["result"]["content"][0]["text"].as_str().unwrap().contains("hello from the root"));
    assert!(answers.iter().all(|a| a["id"] != json!(101) && a["id"] != json!(103)), "{answers:#?}");
}

#[test]
fn acp_survives_hostile_input_and_answers_the_request_before_eof() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"text": "Writing.", "toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "b.txt", "content": "x"}}]}),
        ],
    );
    let init =
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":7,"clientCapabilities":{}}});
    let cwd = env.cwd.to_str().unwrap();
    let after = [
        json!({"jsonrpc":"2.0","id":104,"method":"session/new","params":{"cwd":"relative/dir","mcpServers":[]}}),
        json!({"jsonrpc":"2.0","id":105,"method":"session/prompt","params":{"sessionId":"nope","prompt":[{"type":"text","text":"x"}]}}),
        json!({"jsonrpc":"2.0","id":106,"method":"session/load","params":{"sessionId":"nope","cwd":cwd,"mcpServers":[]}}),
        json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"nope"}}),
        json!({"jsonrpc":"2.0","id":107,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}),
    ];
    let mut input = hostile_input(&init, &after);
    input.push(b'\n');
    let (answers, status) =
        raw(&env, &["--provider", "scripted", "--script", script.to_str().unwrap(), "acp"], input.clone());
    assert!(status.success(), "{status:?}");
    assert_eq!(null_id_codes(&answers), vec![-32700, -32700, -32600, -32600, -32600], "{answers:#?}");
    assert_eq!(by_id(&answers, 100)["error"]["code"], -32600, "before initialize");
    assert_eq!(by_id(&answers, 1)["result"]["protocolVersion"], 1);
    assert_eq!(by_id(&answers, 102)["error"]["code"], -32601);
    assert_eq!(by_id(&answers, 104)["error"]["code"], -32602);
    assert_eq!(by_id(&answers, 105)["error"]["code"], -32602);
    assert_eq!(by_id(&answers, 106)["error"]["code"], -32602);
    let sid = by_id(&answers, 107)["result"]["sessionId"].as_str().unwrap().to_owned();
    // Then a prompt with content cairn does not take, and one it does, the
    // last line without its newline before EOF: it is answered, and as the
    // client is gone nobody can approve its write: the turn is cancelled,
    // durably, and nothing is written.
    let more = [
        json!({"jsonrpc":"2.0","id":108,"method":"session/prompt","params":{"sessionId":sid,"prompt":[{"type":"image","data":"","mimeType":"image/png"}]}}),
        json!({"jsonrpc":"2.0","id":109,"method":"session/prompt","params":{"sessionId":sid,"prompt":[{"type":"text","text":"hi"}]}}),
    ];
    let mut input = Vec::new();
    input.extend_from_slice(init.to_string().as_bytes());
    input.push(b'\n');
    input.extend_from_slice(
        json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":sid,"cwd":cwd,"mcpServers":[]}})
            .to_string()
            .as_bytes(),
    );
    for m in &more {
        input.push(b'\n');
        input.extend_from_slice(m.to_string().as_bytes());
    }
    let (answers, status) = raw(&env, &["--provider", "scripted", "--script", script.to_str().unwrap(), "acp"], input);
    assert!(status.success(), "{status:?}");
    assert_eq!(by_id(&answers, 108)["error"]["code"], -32602);
    assert!(by_id(&answers, 108)["error"]["message"].as_str().unwrap().contains("image"));
    assert_eq!(by_id(&answers, 109)["result"]["stopReason"], "cancelled", "{answers:#?}");
    assert!(!env.cwd.join("b.txt").exists());
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let types = entry_types(&files[0]);
    assert!(types.iter().any(|t| t == "turnCancelled"), "{types:?}");
    let check = env.cairn(&["check", &sid]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

#[test]
fn acp_reads_and_writes_through_the_editor_when_it_offers_fs() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
            json!({"toolCalls": [{"id": "c2", "name": "read_file", "arguments": {"path": "link-out"}}]}),
            json!({"toolCalls": [{"id": "c3", "name": "write_file", "arguments": {"path": "b.txt", "content": "via the editor\n"}}]}),
            json!({"toolCalls": [{"id": "c4", "name": "edit_file", "arguments": {"path": "a.txt", "old": "unsaved buffer line", "new": "edited in the buffer"}}]}),
            json!({"text": "Edited."}),
        ],
    );
    acp(&env, "client_fs", &script, &[]);
    assert!(!env.cwd.join("b.txt").exists());
    assert_eq!(std::fs::read_to_string(env.cwd.join("a.txt")).unwrap(), "hello from the root\n");
}

/// Issue 46.2 through an editor: with the session working in cairn's own
/// home, `write_file` of its configuration through the editor's
/// `fs/write_text_file` is refused before the editor is asked (even
/// though the editor approved the call), and `read_file` of it too.
#[test]
fn acp_editor_writes_to_cairns_own_configuration_are_refused() {
    let env = setup();
    std::fs::write(env.home.join("config.toml"), "# mine\n").unwrap();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "config.toml", "content": "[mcp_servers.evil]\ncommand = \"touch\"\n"}}]}),
            json!({"toolCalls": [{"id": "c2", "name": "read_file", "arguments": {"path": "config.toml"}}]}),
            json!({"text": "Done."}),
        ],
    );
    let bin = cairn_bin();
    run_client(
        "acp_client.py",
        &[
            "authority_fs",
            bin.to_str().unwrap(),
            env.home.to_str().unwrap(),
            env.home.to_str().unwrap(),
            script.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read_to_string(env.home.join("config.toml")).unwrap(), "# mine\n");
}

#[test]
fn acp_cancel_stops_a_running_tool_and_the_session_goes_on() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "sleep 300"}}]}),
            json!({"text": "After."}),
        ],
    );
    acp(&env, "cancel_running", &script, &[]);
    let types = entry_types(&env.session_files()[0]);
    assert!(types.iter().any(|t| t == "turnCancelled"), "{types:?}");
    assert!(types.iter().any(|t| t == "toolFailed"), "{types:?}");
}

#[test]
fn acp_a_failed_provider_call_is_an_error_and_the_next_prompt_finishes_that_turn_first() {
    let env = setup();
    let short = write_script(
        &env,
        &[json!({"toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]})],
    );
    let out = acp(&env, "fail", &short, &[]);
    let sid = out.lines().find_map(|l| l.strip_prefix("SESSION ")).unwrap().trim().to_owned();
    // The script of the next process goes on where the first one ran out.
    let full = env.home.join("full.jsonl");
    let lines = [
        json!({"toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
        json!({"text": "Recovered."}),
        json!({"text": "Third."}),
    ];
    std::fs::write(&full, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    acp(&env, "recover", &full, &[&sid]);
}

#[test]
fn mcp_a_cancelled_call_is_stopped_recorded_and_not_answered() {
    let env = setup();
    let lines = [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"shell","arguments":{"command":"sleep 300"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"the user gave up"}}),
        json!({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt"}}}),
    ];
    let input: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
    let (answers, status) = raw(&env, &["mcp", "--allow", "shell(sleep *)"], input);
    assert!(status.success(), "{status:?}");
    assert!(answers.iter().all(|a| a["id"] != json!(7)), "a cancelled call is not answered: {answers:#?}");
    assert_eq!(by_id(&answers, 8)["result"]["isError"], false, "{answers:#?}");
    let types = entry_types(&env.session_files()[0]);
    assert!(types.iter().any(|t| t == "turnCancelled"), "{types:?}");
    let check = env.cairn(&["check", env.session_files()[0].to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

/// `/undo` and `/redo` typed in an editor (issue 30), with the ACP Python
/// SDK: offered as commands; the write is reverted and reapplied; after a
/// change by hand, the undo refuses naming the file and touches nothing.
#[test]
fn acp_undo_and_redo_commands_revert_and_reapply_a_write() {
    let env = setup();
    let script = write_script(&env, &read_then_write());
    acp(&env, "undo", &script, &[]);
    assert_eq!(std::fs::read_to_string(env.cwd.join("b.txt")).unwrap(), "mine\n");
}

/// An undo killed after its plan was committed, then a prompt from an
/// editor: the undo is finished first (and said), then the turn runs.
/// The killed state is made exactly: a complete undo whose last line (its
/// completion) is cut off and whose file effect is put back by hand —
/// the bytes a SIGKILL right after the plan's commit leaves.
#[test]
fn acp_finishes_an_interrupted_undo_before_the_next_turn() {
    let env = setup();
    let script = write_script(&env, &read_then_write());
    let out = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "hi"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file = env.session_files()[0].clone();
    let id = file.file_stem().unwrap().to_string_lossy().into_owned();
    let out = env.cairn(&["undo", &id]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!env.cwd.join("b.txt").exists());
    let text = std::fs::read_to_string(&file).unwrap();
    let cut = text.trim_end_matches('\n').rfind('\n').unwrap() + 1;
    assert!(text[cut..].contains("undoApplied"), "the last line is the completion");
    std::fs::write(&file, &text[..cut]).unwrap();
    std::fs::write(env.cwd.join("b.txt"), "new\n").unwrap();
    let script = write_script(&env, &[json!({"text": "After."})]);
    acp(&env, "finish_undo", &script, &[&id]);
    assert!(!env.cwd.join("b.txt").exists());
}

#[test]
fn acp_sessions_run_at_once_in_one_process() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "b.txt", "content": "new\n"}}]}),
            json!({"text": "Done."}),
        ],
    );
    acp(&env, "concurrent", &script, &[]);
    assert_eq!(env.session_files().len(), 2);
}

#[test]
fn acp_load_refuses_id_prefixes_and_paths_and_creates_nothing_beside_them() {
    let env = setup();
    let script = write_script(&env, &[json!({"text": "Hi."})]);
    let made =
        env.cairn(&["--provider", "scripted", "--script", script.to_str().unwrap(), "run", "hi"]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let file = env.session_files()[0].clone();
    let id = file.file_stem().unwrap().to_string_lossy().into_owned();
    let outside = env.cwd.join("not-a-session");
    std::fs::write(&outside, "just a file\n").unwrap();
    let copy = env.cwd.join("copy.jsonl");
    std::fs::copy(&file, &copy).unwrap();
    let out = acp(&env, "load_refused", &script, &[&id[..8], outside.to_str().unwrap(), copy.to_str().unwrap()]);
    assert!(out.contains(&format!("REFUSED {}", &id[..8])) && out.contains(&id), "{out}");
    for beside in [&outside, &copy] {
        let lock = format!("{}.lock", beside.display());
        assert!(!std::path::Path::new(&lock).exists(), "session/load created {lock}");
    }
}

#[test]
fn mcp_ping_is_answered_while_a_call_runs() {
    let env = setup();
    mcp(&env, "ping_running", &["--allow", "shell(sleep *)"]);
}

#[test]
fn mcp_a_long_read_says_the_true_size_and_reads_on_with_offset() {
    let env = setup();
    let text: String = (1..=1500).map(|n| format!("line {n:>5} of the long file, padded to forty\n")).collect();
    std::fs::write(env.cwd.join("long.txt"), text).unwrap();
    mcp(&env, "long_read", &[]);
}

#[test]
fn mcp_request_ids_beyond_2_53_are_echoed_exactly() {
    let env = setup();
    let big = "123456789012345678901234567890";
    let edge = "9007199254740993"; // 2^53 + 1
    let input = format!(
        "{}\n{{\"jsonrpc\":\"2.0\",\"id\":{big},\"method\":\"ping\"}}\n{{\"jsonrpc\":\"2.0\",\"id\":{edge},\"method\":\"tools/list\"}}\n{{\"jsonrpc\":\"2.0\",\"id\":-{big},\"method\":\"nope\"}}\n",
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}})
    );
    let mut child =
        env.cairn(&["mcp"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(child.wait().unwrap().success());
    for id in [big.to_owned(), edge.to_owned(), format!("-{big}")] {
        assert!(out.contains(&format!("\"id\":{id},")), "id {id} not echoed exactly:\n{out}");
    }
}

#[test]
fn acp_modes_map_to_the_approval_policy() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "b.txt", "content": "planned\n"}}]}),
            json!({"text": "Planned."}),
            json!({"toolCalls": [{"id": "c2", "name": "write_file", "arguments": {"path": "c.txt", "content": "auto\n"}}]}),
            json!({"text": "Edited."}),
        ],
    );
    acp(&env, "modes", &script, &[]);
    let text = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(text.contains("plan mode"), "the refusal names the mode");
    assert!(text.contains("auto-edit mode"), "the approval names the mode");
}

/// Issue 53.1: after "allow always" for a write, plan mode still refuses
/// the next write (the remembered rule does not outrank the mode), and a
/// subagent spawned in plan mode (spawn_agent is ReadOnly) is held by it
/// too; no question is put to the editor, nothing is written.
#[test]
fn acp_plan_mode_holds_after_allow_always_and_for_subagents() {
    let env = setup();
    let child = env.home.join("child.jsonl");
    let lines = [
        json!({"text": "", "toolCalls": [{"id": "k1", "name": "write_file", "arguments": {"path": "note.txt", "content": "from the child\n"}}]}),
        json!({"text": "child done"}),
    ];
    std::fs::write(&child, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "b.txt", "content": "1\n"}}]}),
            json!({"text": "One."}),
            json!({"toolCalls": [{"id": "c2", "name": "write_file", "arguments": {"path": "c.txt", "content": "2\n"}}]}),
            json!({"text": "Two."}),
            json!({"toolCalls": [{"id": "p1", "name": "spawn_agent", "arguments": {"prompt": "write the note", "script": child.to_str().unwrap()}}]}),
            json!({"text": "Three."}),
        ],
    );
    acp(&env, "plan_after_always", &script, &[]);
    assert!(env.cwd.join("b.txt").exists());
    assert!(!env.cwd.join("c.txt").exists() && !env.cwd.join("note.txt").exists());
    let files = env.session_files();
    let parent = files.iter().find(|f| !f.to_string_lossy().contains('+')).unwrap();
    let rejected: Vec<Value> = util::entries(parent)
        .into_iter()
        .filter(|r| r["type"] == "toolRejected")
        .map(|r| r["payload"]["verdict"]["by"].clone())
        .collect();
    assert_eq!(rejected, [json!("mode:plan")], "the refusal is recorded as the mode's");
    let child_file = files.iter().find(|f| f.to_string_lossy().contains('+')).unwrap();
    assert!(
        std::fs::read_to_string(child_file).unwrap().contains("mode:plan"),
        "the child's write was refused by the mode"
    );
}

#[test]
fn acp_streams_a_running_commands_output() {
    let env = setup();
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo streamed line"}}]}),
            json!({"text": "Ran."}),
        ],
    );
    acp(&env, "stream", &script, &[]);
}

#[test]
fn acp_an_editor_s_stdio_mcp_server_in_session_new_is_offered_and_callable() {
    let env = setup();
    let out = std::process::Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/venv"))
        .arg("mcpservers")
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/venv mcpservers: {}", String::from_utf8_lossy(&out.stderr));
    let python = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let time = python.parent().unwrap().join("mcp-server-time");
    let script = write_script(
        &env,
        &[
            json!({"toolCalls": [{"id": "c1", "name": "mcp__time__get_current_time", "arguments": {"timezone": "UTC"}}]}),
            json!({"text": "It is now."}),
        ],
    );
    acp(&env, "mcp", &script, &[time.to_str().unwrap()]);
}

#[test]
fn acp_the_editor_chooses_the_model_of_a_session() {
    let env = setup();
    let script = write_script(&env, &[json!({"text": "From the default."}), json!({"text": "Not this one."})]);
    let alt = env.home.join("alt.jsonl");
    std::fs::write(&alt, format!("{}\n{}\n", json!({"text": "unused"}), json!({"text": "From alt."}))).unwrap();
    std::fs::write(
        env.home.join("config.toml"),
        format!("[providers.alt]\nkind = \"scripted\"\nscript = \"{}\"\nmodel = \"alt-model\"\n", alt.display()),
    )
    .unwrap();
    acp(&env, "model", &script, &[]);
}

#[test]
fn acp_slash_commands_compact_and_usage() {
    let env = setup();
    let script = write_script(&env, &[json!({"text": "Hello."}), json!({"text": "Again."})]);
    acp(&env, "commands", &script, &[]);
    let types = entry_types(&env.session_files()[0]);
    assert!(types.iter().any(|t| t == "compaction"), "{types:?}");
}

/// Issue 53.8: what Zed shows of a session besides its messages: the
/// session's title (its first prompt's first line) told once, how full the
/// model's context is after each turn (the provider's window configured),
/// and `session/list` with titles, filtered by cwd.
#[test]
fn acp_session_list_title_and_usage_updates() {
    let env = setup();
    std::fs::write(env.home.join("config.toml"), "[providers.scripted]\ncontext_window = 100000\n").unwrap();
    let script = write_script(&env, &[json!({"text": "Looking."}), json!({"text": "Tests too."})]);
    acp(&env, "session_info", &script, &[]);
}

/// Issue 53.8: with an editor that offers its terminal, `shell` runs there
/// (terminal/create, wait_for_exit, output, release), outside cairn's
/// sandbox, so each call is put to the person — allow once or reject, no
/// "always", even under `--allow shell` in the config — and a rejected
/// call never reaches the terminal.
#[test]
fn acp_shell_runs_in_the_editors_terminal_asked_every_time() {
    for (scenario, answer) in [("terminal", "completed"), ("terminal_rejected", "failed")] {
        let env = setup();
        std::fs::write(env.home.join("config.toml"), "[approvals]\nallow = [\"shell\"]\n").unwrap();
        let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell",
            "arguments": {"command": "echo from-the-editor > t.txt; read go; echo done-in-terminal"}}]});
        let script = write_script(&env, &[call, json!({"text": "Ran."})]);
        acp(&env, scenario, &script, &[]);
        let types = entry_types(&env.session_files()[0]);
        let settled = if answer == "completed" { "toolCompleted" } else { "toolRejected" };
        assert!(types.iter().any(|t| t == settled), "{scenario}: {types:?}");
    }
}

/// An editor offering its terminal is not enough to leave the sandbox: Zed
/// offers it to every agent. Without `cairn acp --editor-terminal`, `shell`
/// runs in cairn's sandbox and an allow rule for it applies as in every
/// other face (the client checks nothing was asked or sent to its
/// terminal).
#[test]
fn acp_an_offered_terminal_is_used_only_when_the_person_chose_it() {
    let env = setup();
    std::fs::write(env.home.join("config.toml"), "[approvals]\nallow = [\"shell\"]\n").unwrap();
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell",
        "arguments": {"command": "echo from-the-sandbox > t.txt"}}]});
    let script = write_script(&env, &[call, json!({"text": "Ran."})]);
    acp(&env, "terminal_not_chosen", &script, &[]);
    let types = entry_types(&env.session_files()[0]);
    assert!(types.iter().any(|t| t == "toolCompleted"), "{types:?}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("t.txt")).unwrap(), "from-the-sandbox\n");
}

/// The script of a turn that plans, reads, updates its plan (and sends one
/// plan the tool refuses), then answers.
fn planning_turn() -> Vec<Value> {
    let plan = |first: &str, second: &str| {
        json!({"entries": [
            {"content": "read a.txt", "priority": "high", "status": first},
            {"content": "tell what it says", "status": second},
        ]})
    };
    vec![
        json!({"toolCalls": [{"id": "p1", "name": "plan", "arguments": plan("in_progress", "pending")}]}),
        json!({"toolCalls": [{"id": "r1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
        json!({"toolCalls": [
            {"id": "p2", "name": "plan", "arguments": plan("completed", "in_progress")},
            {"id": "p3", "name": "plan", "arguments": {"entries": [{"content": "x", "status": "done"}]}},
        ]}),
        json!({"text": "It says hello."}),
    ]
}

/// Issue 53.8: the model's `plan` calls reach the editor as ACP `plan`
/// updates (the whole plan each time, with priority and status), not as
/// tool calls; a plan the tool refuses is not shown; the plan is in the
/// session file, so a new process loading the session shows it again.
#[test]
fn acp_a_plan_is_the_editors_plan_and_is_replayed_on_load() {
    let env = setup();
    let script = write_script(&env, &planning_turn());
    acp(&env, "plan", &script, &[]);
    let types = entry_types(&env.session_files()[0]);
    assert_eq!(types.iter().filter(|t| *t == "toolCompleted").count(), 3, "{types:?}");
    assert_eq!(types.iter().filter(|t| *t == "toolRejected").count(), 1, "{types:?}");
}

/// The command line shows the plan as a checklist where other tools show
/// their arguments.
#[test]
fn run_prints_the_models_plan_as_a_checklist() {
    let env = setup();
    let script = write_script(&env, &planning_turn());
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "read a.txt, step by step"]).output().unwrap();
    // (the refused plan makes the run's exit status say a call was refused)
    let stderr = util::stderr_text(&out);
    assert!(stderr.contains("[>] ! read a.txt\n    [ ] tell what it says"), "{stderr}");
    assert!(stderr.contains("[x] ! read a.txt\n    [>] tell what it says"), "{stderr}");
    assert!(util::stdout_text(&out).contains("It says hello."));
}

/// Issue 53.8: image prompts over ACP. The configured provider (a loopback
/// OpenAI-compatible server) takes images, so `promptCapabilities.image` is
/// offered and an image block reaches the server in the request (as a
/// `data:` URL beside the text), kept in the session file (which stays
/// valid, and a new process loading it shows the image); a wrong type, bad
/// base64 or too much image is refused saying so, and so is an image for a
/// model configured `images = false` (offered nothing when it is the
/// configured one); refused prompts send and record nothing.
#[test]
fn acp_image_prompts_reach_a_provider_that_takes_them_and_are_refused_otherwise() {
    use cairn_test_server::{Reply, TestServer, fixtures};
    let env = setup();
    let server = TestServer::start(vec![Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let table = |name: &str, images: bool| {
        format!(
            "[providers.{name}]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\napi_key_env = \"LOOP_KEY\"\nimages = {images}\n",
            server.url()
        )
    };
    std::fs::write(
        env.home.join("config.toml"),
        format!("provider = \"loop\"\n{}{}", table("loop", true), table("textonly", false)),
    )
    .unwrap();
    let bin = cairn_bin();
    let args = ["image", bin.to_str().unwrap(), env.home.to_str().unwrap(), env.cwd.to_str().unwrap(), "-"];
    let out = Command::new(python()).arg(client("acp_client.py")).args(args).env("LOOP_KEY", "k").output().unwrap();
    assert!(
        out.status.success(),
        "acp_client.py image failed:\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "only the accepted prompt reached the provider");
    let body = requests[0].json();
    let user = body["messages"].as_array().unwrap().iter().rfind(|m| m["role"] == "user").unwrap().clone();
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
    assert_eq!(
        user["content"],
        json!([
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
        ]),
        "{body}"
    );
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let messages: Vec<Value> = util::entries(&files[0]).into_iter().filter(|r| r["type"] == "message").collect();
    let users: Vec<&Value> = messages.iter().filter(|m| m["payload"]["role"] == "user").collect();
    assert_eq!(users.len(), 1, "a refused prompt records nothing: {users:?}");
    assert_eq!(users[0]["payload"]["content"][1], json!({"type": "image", "mimeType": "image/png", "data": png}));
    let check = env.cairn(&["check", files[0].to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

/// Issue 53.8: MCP elicitation reaches the person where approvals do. An
/// editor's MCP server (the official Python SDK) asks the user's name while
/// its tool runs; an editor offering form elicitation is asked
/// (`elicitation/create`, tied to the session and the call) and its answer
/// reaches the server; one that offers none gets a decline that says so.
#[test]
fn acp_an_mcp_servers_question_is_put_to_the_editor_and_declined_when_it_offers_none() {
    acp_with_the_elicit_server("greet", "Greeted.", "elicit");
}

/// 53.8: an MCP server asking the person to open a URL (URL mode) reaches
/// an editor offering URL elicitation as `elicitation/create` mode "url"
/// (the URL, the server's id, the session and the call), and its consent
/// reaches the server; an editor offering forms only gets it declined.
#[test]
fn acp_an_mcp_servers_url_request_is_forwarded_to_an_editor_that_offers_url_elicitation() {
    acp_with_the_elicit_server("connect", "Connected.", "elicit_url");
}

/// The model calls the test MCP server's `tool` (tests/mcp/elicit_server.py,
/// which asks the person something) and then answers `answer`; the ACP
/// client plays the editor in `scenario` (acp_client.py).
fn acp_with_the_elicit_server(tool: &str, answer: &str, scenario: &str) {
    let env = setup();
    std::fs::write(env.home.join("config.toml"), "[approvals]\nallow = [\"mcp__ask__*\"]\n").unwrap();
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/venv"))
        .arg("mcpservers")
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/venv mcpservers: {}", String::from_utf8_lossy(&out.stderr));
    let server_python = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let server = env.cwd.join("elicit_server.py");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/elicit_server.py"), &server).unwrap();
    let name = format!("mcp__ask__{tool}");
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": name, "arguments": {}}]});
    // (each of the client's two sessions replays the script from its start)
    let script = write_script(&env, &[call, json!({ "text": answer })]);
    acp(&env, scenario, &script, &[&server_python, server.to_str().unwrap()]);
}
