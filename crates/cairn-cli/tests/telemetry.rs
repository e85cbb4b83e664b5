//! OpenTelemetry export (issue 51) through the real `cairn` binary: a
//! scripted turn with a tool call and a subagent exported to a real
//! receiver — Arize Phoenix from PyPI (`scripts/venv phoenix`), started
//! by the test — whose REST API gives back the spans' names, attributes
//! and parent links; the metric names through an OTLP metrics sink decoding
//! with the official `opentelemetry-proto` package (Phoenix takes no
//! metrics); content only when asked and never a provider key; a collector
//! that accepts the connection and never answers costs neither the turn
//! nor the exit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{self, Env};
use util::stderr_text as stderr;
use util::stdout_text as stdout;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The interpreter of the pinned venv `name` (`scripts/venv`).
fn venv_python(name: &str) -> PathBuf {
    let out = Command::new(repo().join("scripts/venv")).arg(name).output().expect("cannot run scripts/venv");
    assert!(
        out.status.success(),
        "scripts/venv {name} failed (python3 with venv and PyPI are needed for this test): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A GET over plain HTTP/1.0: (status, body); `None` when nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Arize Phoenix serving OTLP/HTTP and its REST API on one port.
struct Phoenix {
    port: u16,
    _dir: tempfile::TempDir,
    _process: Killed,
}

impl Phoenix {
    fn start(python: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("phoenix.log")).unwrap();
        let process = Command::new(python.parent().unwrap().join("phoenix"))
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("cannot start phoenix");
        let phoenix = Phoenix { port, _process: Killed(process), _dir: dir };
        // Its database migrations take a minute on a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(600);
        while get(port, "/v1/projects").is_none_or(|(status, _)| status != 200) {
            assert!(
                Instant::now() < deadline,
                "phoenix did not come up: {}",
                std::fs::read_to_string(phoenix._dir.path().join("phoenix.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        phoenix
    }

    /// One Phoenix for the tests of this binary that run at the same time
    /// (each exports to projects of its own, and reads only those): its
    /// start-up (Python, its database migrations) is most of each test's
    /// time. The last holder to drop its handle stops it, as
    /// `TestCluster::shared` does (a static would never be dropped and
    /// would leave the server running).
    fn shared(python: &Path) -> std::sync::Arc<Self> {
        use std::sync::{Arc, Mutex, PoisonError, Weak};
        static CELL: Mutex<Weak<Phoenix>> = Mutex::new(Weak::new());
        let mut slot = CELL.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(phoenix) = slot.upgrade() {
            return phoenix;
        }
        let phoenix = Arc::new(Self::start(python));
        *slot = Arc::downgrade(&phoenix);
        phoenix
    }

    /// The spans of `project` once at least `want` of them arrived
    /// (Phoenix ingests in the background).
    fn spans(&self, project: &str, want: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let spans = get(self.port, &format!("/v1/projects/{project}/spans?limit=1000"))
                .filter(|(status, _)| *status == 200)
                .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
                .and_then(|v| v["data"].as_array().cloned())
                .unwrap_or_default();
            if spans.len() >= want || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

fn write(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn span_id(span: &Value) -> &str {
    span["context"]["span_id"].as_str().unwrap()
}

fn trace_id(span: &Value) -> &str {
    span["context"]["trace_id"].as_str().unwrap()
}

/// A parent that runs `shell` (writing its environment to env.txt), spawns a child that runs `shell` too, waits
/// for it and answers; the child's script beside it.
fn family_scripts(env: &Env) -> PathBuf {
    // Prices on the script's table, so its calls have a cost to export.
    std::fs::write(
        env.home.join("config.toml"),
        "[tools]\nstaged = false\n[providers.scripted]\ninput_per_mtok = 3\noutput_per_mtok = 15\n",
    )
    .unwrap();
    write(
        &env.home,
        "child.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "k1", "name": "shell", "arguments": {"command": "echo child"}}]}),
            json!({"text": "child done"}),
        ],
    );
    write(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [
                {"id": "c1", "name": "shell", "arguments": {"command": "env > env.txt"}},
                {"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "help", "wait": false, "script": "child.jsonl"}}
            ]}),
            json!({"text": "", "toolCalls": [{"id": "w1", "name": "wait_agents", "arguments": {}}]}),
            json!({"text": "all done"}),
        ],
    )
}

/// One turn with a tool call and a subagent, exported to Phoenix: the
/// GenAI spans with their attributes, one trace for the family, the
/// child's turn under the parent's `spawn_agent` call, no content unless
/// asked, the conventions' metric names; then the same with content asked
/// for, and a provider key in the prompt never leaves.
#[test]
fn a_turn_with_a_tool_and_a_subagent_is_one_trace_in_phoenix() {
    let python = venv_python("phoenix");
    let phoenix = Phoenix::shared(&python);
    let (_sink, metrics_port, sink_out) = metrics_sink(&python);

    let env = Env::new();
    let script = family_scripts(&env);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "go"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", phoenix.port))
        .env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", format!("http://127.0.0.1:{metrics_port}/v1/metrics"))
        .env("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=family")
        .env("OTEL_SERVICE_NAME", "cairn-test")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("all done"), "{}", stdout(&out));
    assert!(!stderr(&out).contains("telemetry"), "nothing was lost: {}", stderr(&out));
    let files = env.session_files();
    let parent_file = files.iter().find(|p| !p.to_str().unwrap().contains('+')).unwrap();
    let parent_id = parent_file.file_stem().unwrap().to_str().unwrap().to_owned();

    // 2 turns, 3 + 2 chats, 3 + 1 tool calls, 1 spawn.
    let spans = phoenix.spans("family", 12);
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let turns = named(&spans, "invoke_agent cairn");
    assert_eq!(turns.len(), 2, "{names:?}");
    let chats: Vec<&Value> = spans.iter().filter(|s| s["name"].as_str().unwrap().starts_with("chat ")).collect();
    assert_eq!(chats.len(), 5, "{names:?}");
    let trace = trace_id(turns[0]);
    assert!(spans.iter().all(|s| trace_id(s) == trace), "one trace for the family: {spans:#?}");

    let parent_turn = turns.iter().find(|t| attr(t, "gen_ai.conversation.id") == parent_id.as_str()).unwrap();
    let child_turn = turns.iter().find(|t| attr(t, "gen_ai.conversation.id") != parent_id.as_str()).unwrap();
    let child_id = attr(child_turn, "gen_ai.conversation.id").as_str().unwrap();
    assert!(child_id.starts_with(&format!("{parent_id}+")), "{child_id}");
    assert_eq!(attr(parent_turn, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(attr(parent_turn, "cairn.stop"), "answered");
    assert!(parent_turn["parent_id"].is_null(), "the parent's turn is the root");

    for chat in &chats {
        assert_eq!(attr(chat, "gen_ai.operation.name"), "chat");
        assert!(attr(chat, "gen_ai.provider.name").is_string(), "{chat:#}");
        assert!(attr(chat, "gen_ai.request.model").is_string(), "{chat:#}");
        assert!(attr(chat, "gen_ai.usage.input_tokens").is_number(), "{chat:#}");
        assert!(attr(chat, "gen_ai.usage.output_tokens").is_number(), "{chat:#}");
        assert!(attr(chat, "gen_ai.response.finish_reasons").is_array(), "{chat:#}");
        let turn = if attr(chat, "gen_ai.conversation.id") == parent_id.as_str() { parent_turn } else { child_turn };
        assert_eq!(chat["parent_id"], span_id(turn), "a chat is a child of its turn");
    }

    let shells = named(&spans, "execute_tool shell");
    assert_eq!(shells.len(), 2, "{names:?}");
    let parent_shell = shells.iter().find(|s| attr(s, "gen_ai.tool.call.id") == "c1").unwrap();
    assert_eq!(attr(parent_shell, "gen_ai.tool.name"), "shell");
    assert_eq!(attr(parent_shell, "gen_ai.conversation.id"), parent_id.as_str());
    assert_eq!(attr(parent_shell, "cairn.settlement"), "done");
    assert!(attr(parent_shell, "cairn.risk").is_string(), "{parent_shell:#}");
    assert!(attr(parent_shell, "cairn.approval.by").is_string(), "{parent_shell:#}");
    assert_eq!(parent_shell["parent_id"], span_id(parent_turn));
    // The tool's process got its call's span as TRACEPARENT.
    let tool_env = std::fs::read_to_string(env.cwd.join("env.txt")).unwrap();
    let tp = tool_env.lines().find_map(|l| l.strip_prefix("TRACEPARENT="));
    assert_eq!(tp, Some(format!("00-{trace}-{}-01", span_id(parent_shell)).as_str()), "in the tool's environment");
    let child_shell = shells.iter().find(|s| attr(s, "gen_ai.tool.call.id") == "k1").unwrap();
    assert_eq!(child_shell["parent_id"], span_id(child_turn));

    let spawn = named(&spans, "execute_tool spawn_agent");
    assert_eq!(spawn.len(), 1, "{names:?}");
    assert_eq!(spawn[0]["parent_id"], span_id(parent_turn));
    // The spawn is a span of its own under the call, the child's turn under it.
    let create = named(&spans, "create_agent cairn");
    assert_eq!(create.len(), 1, "{names:?}");
    assert_eq!(create[0]["parent_id"], span_id(spawn[0]), "the spawn is under the spawning call");
    assert_eq!(attr(create[0], "gen_ai.operation.name"), "create_agent");
    assert_eq!(attr(create[0], "gen_ai.agent.id"), child_id);
    assert_eq!(child_turn["parent_id"], span_id(create[0]), "the child's turn is under the spawn");
    // Every call says how a resume may replay it.
    assert_eq!(attr(parent_shell, "cairn.replay"), "never", "{parent_shell:#}");
    assert!(attr(spawn[0], "cairn.replay").is_string(), "{:#}", spawn[0]);

    for span in &spans {
        for key in ["gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments"] {
            assert!(attr(span, key).is_null(), "no content unless asked: {span:#}");
        }
    }

    // The metric names, as the flush at exit delivered them.
    let metrics = sunk(sink_out.path());
    for name in [
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "cairn.tool.calls",
        "cairn.turns",
        "cairn.cost",
    ] {
        assert!(metrics.iter().any(|l| l["metric"] == name), "metric {name} missing: {metrics:#?}");
    }
    // What the family cost at the scripted provider's prices ($3 and $15
    // per million tokens, `family_scripts`), from the usage rows of both
    // sessions' logs: what `/status` would show.
    let usage = files.iter().flat_map(|f| usage_rows(f)).collect::<Vec<_>>();
    assert_eq!(usage.len(), 5, "one row per model call: {usage:#?}");
    let want: f64 = usage
        .iter()
        .map(|u| {
            let (input, output) = (u["inputTokens"].as_u64().unwrap(), u["outputTokens"].as_u64().unwrap());
            (input as f64 * 3.0 + output as f64 * 15.0) / 1e6
        })
        .sum();
    assert!(want > 0.0, "the script's calls have tokens: {usage:#?}");
    let cost = cumulative(&metrics, "cairn.cost");
    assert!((cost - want).abs() < 1e-9, "cairn.cost {cost} USD, the usage rows say {want}: {metrics:#?}");
    for point in metrics.iter().filter(|l| l["metric"] == "cairn.cost") {
        assert_eq!(point["attributes"]["gen_ai.provider.name"], "scripted", "{point}");
        assert!(point["attributes"]["gen_ai.request.model"].is_string(), "{point}");
    }

    // Content when asked, scrubbed of the provider key cairn holds.
    let key = "sk-test-0123456789abcdef";
    let env = Env::new();
    let script = env.script(&[json!({"text": "noted"})]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "run", &format!("remember {key} for later")])
        .env("OPENAI_API_KEY", key)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", phoenix.port))
        .env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", format!("http://127.0.0.1:{metrics_port}/v1/metrics"))
        .env("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=content")
        .env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    let spans = phoenix.spans("content", 2);
    let turn = named(&spans, "invoke_agent cairn");
    assert_eq!(turn.len(), 1, "{spans:#?}");
    let input = attr(turn[0], "gen_ai.input.messages").as_str().unwrap_or_default();
    assert!(input.contains("remember") && input.contains("***"), "{input}");
    assert!(!serde_json::to_string(&spans).unwrap().contains(key), "the key never leaves: {spans:#?}");
    assert!(attr(turn[0], "gen_ai.output.messages").as_str().unwrap_or_default().contains("noted"));

    unpriced_calls_cost_nothing_said(metrics_port, sink_out.path());
    staged_undo_and_a_kept_parent(&phoenix);
}

/// A model with no price (an OpenAI-compatible server, no `input_per_mtok`
/// in its table) exports its tokens but no cost: a 0 would read as free.
fn unpriced_calls_cost_nothing_said(metrics_port: u16, sink: &Path) {
    use cairn_test_server::{Reply, TestServer, streams};
    let server = TestServer::start(vec![Reply::sse(streams::chat_text_with_usage("unpriced answer"))]).unwrap();
    let env = Env::new();
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"t\"\n[providers.t]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"unpriced-model\"\n\
             max_attempts = 1\n",
            server.url()
        ),
    )
    .unwrap();
    let out = env
        .cairn(&["run", "go"])
        .env("OPENAI_API_KEY", "sk-unpriced-test")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{metrics_port}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("unpriced answer"), "{}", stdout(&out));
    let metrics = sunk(sink);
    let of_model = |name: &str| -> Vec<&Value> {
        metrics
            .iter()
            .filter(|l| l["metric"] == name && l["attributes"]["gen_ai.request.model"] == "unpriced-model")
            .collect()
    };
    assert!(!of_model("gen_ai.client.token.usage").is_empty(), "its tokens are exported: {metrics:#?}");
    assert!(of_model("cairn.cost").is_empty(), "no price, no cost point: {:#?}", of_model("cairn.cost"));
}

/// The sink's lines (`tests/python/otlp_metrics_sink.py`): metric data
/// points and spans, as JSON.
fn sunk(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The value of cumulative metric `name` summed over its attribute sets,
/// each at its latest (largest) export.
fn cumulative(lines: &[Value], name: &str) -> f64 {
    let mut by_attrs = std::collections::BTreeMap::<String, f64>::new();
    for l in lines.iter().filter(|l| l["metric"] == name) {
        let v = l["value"].as_f64().unwrap();
        let slot = by_attrs.entry(l["attributes"].to_string()).or_insert(0.0);
        *slot = slot.max(v);
    }
    by_attrs.values().sum()
}

/// The usage rows (one per provider attempt) in a session file, found by
/// their fields wherever the line holds them.
fn usage_rows(path: &Path) -> Vec<Value> {
    fn walk(v: &Value, out: &mut Vec<Value>) {
        match v {
            Value::Object(m) if m.contains_key("inputTokens") && m.contains_key("attempt") => out.push(v.clone()),
            Value::Object(m) => m.values().for_each(|v| walk(v, out)),
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        walk(&serde_json::from_str(line).unwrap(), &mut out);
    }
    out
}

/// A staged write says its staged verdict and replay class; `cairn undo`
/// is a span of its own in the session's trace; a `TRACEPARENT` handed to
/// the first run is kept in the session, so a resume without it (another
/// process) continues under the same parent.
fn staged_undo_and_a_kept_parent(phoenix: &Phoenix) {
    let env = Env::new();
    util::require_staging(&env);
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    // A loaded machine's Phoenix may take longer than the default bound.
    std::fs::write(env.home.join("config.toml"), "[telemetry]\nflush_timeout_ms = 120000\n").unwrap();
    // The scripted model's lines for both runs (it counts the session's answers).
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "w1", "name": "write_file", "arguments": {"path": "new.txt", "content": "hi\n"}}]}),
        json!({"text": "written"}),
        json!({"text": "again"}),
    ]);
    let otel = |cmd: &mut Command| {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", phoenix.port))
            .env("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=staged")
            .stdin(Stdio::null());
    };
    let mut run = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "go"]);
    otel(&mut run);
    let out = run.env("TRACEPARENT", parent).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(env.cwd.join("new.txt").exists(), "the write was applied");
    let id = env.session_files()[0].file_stem().unwrap().to_str().unwrap().to_owned();

    // The same session again, in a process without TRACEPARENT.
    let mut resumed = env.cairn(&["--script", script.to_str().unwrap(), "resume", &id, "--prompt", "more"]);
    otel(&mut resumed);
    let out = resumed.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));

    let mut undo = env.cairn(&["undo", &id, "--turn", "1"]);
    otel(&mut undo);
    let out = undo.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(!env.cwd.join("new.txt").exists(), "the undo removed the file");

    // 2 turns, 3 chats, 1 call, 1 undo.
    let spans = phoenix.spans("staged", 7);
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let write = named(&spans, "execute_tool write_file");
    assert_eq!(write.len(), 1, "{names:?}");
    assert_eq!(attr(write[0], "cairn.staged.verdict"), "apply", "{:#}", write[0]);
    assert!(attr(write[0], "cairn.staged.by").as_str().is_some_and(|b| !b.is_empty()), "{:#}", write[0]);
    assert_eq!(attr(write[0], "cairn.staged.changes"), 1, "{:#}", write[0]);
    assert!(attr(write[0], "cairn.replay").is_string(), "{:#}", write[0]);

    let turns = named(&spans, "invoke_agent cairn");
    assert_eq!(turns.len(), 2, "{names:?}");
    for turn in &turns {
        assert_eq!(trace_id(turn), "0af7651916cd43dd8448eb211c80319c", "under the handed-in trace: {turn:#}");
        assert_eq!(turn["parent_id"], "b7ad6b7169203331", "under the handed-in parent, resumed too: {turn:#}");
    }
    let undo = named(&spans, "undo");
    assert_eq!(undo.len(), 1, "{names:?}");
    assert_eq!(attr(undo[0], "gen_ai.conversation.id"), id.as_str());
    assert_eq!(attr(undo[0], "cairn.outcome"), "done", "{:#}", undo[0]);
    assert_eq!(trace_id(undo[0]), "0af7651916cd43dd8448eb211c80319c", "the undo is in the session's trace");
}

/// A collector that accepts the connection and never answers: the turn
/// runs and answers, and cairn exits after its bounded flush, saying what
/// was dropped. (Unbounded, the exit would wait for the export's own
/// timeout, set here to ten minutes; the test gives up long before.)
#[test]
fn a_collector_that_never_answers_costs_neither_the_turn_nor_the_exit() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let held = std::sync::Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            // Held open, never read from nor answered.
            held.lock().unwrap().push(stream);
        }
    });
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo hi"}}]}),
        json!({"text": "finished"}),
    ]);
    let mut child = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "go"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "600000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cairn did not exit: the flush at exit waited for a collector that never answers");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("finished"), "{}", stdout(&out));
    assert!(!accepted.lock().unwrap().is_empty(), "cairn tried to export");
    assert!(stderr(&out).contains("telemetry:") && stderr(&out).contains("dropped"), "{}", stderr(&out));
}

/// Opt-in: with `[telemetry] enabled = false` the variables are ignored,
/// and a refused protocol is said, not silently dropped; nothing connects.
#[test]
fn telemetry_off_or_refused_sends_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let env = Env::new();
    let script = env.script(&[json!({"text": "ok"})]);
    std::fs::write(env.home.join("config.toml"), "[telemetry]\nenabled = false\n").unwrap();
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "run", "go"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("telemetry"), "{}", stderr(&out));
    std::fs::remove_file(env.home.join("config.toml")).unwrap();
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "run", "go"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("telemetry is off") && stderr(&out).contains("http/protobuf"), "{}", stderr(&out));
    assert!(listener.accept().is_err(), "nothing connected to the endpoint");
}

/// Start the OTLP metrics sink (`tests/python/otlp_metrics_sink.py`): its
/// process, and the file it writes each metric's name to.
fn metrics_sink(python: &Path) -> (Killed, u16, tempfile::NamedTempFile) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut sink = Command::new(python)
        .arg(repo().join("tests/python/otlp_metrics_sink.py"))
        .arg(out.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    {
        use std::io::BufRead as _;
        std::io::BufReader::new(sink.stdout.take().unwrap()).read_line(&mut port).unwrap();
    }
    (Killed(sink), port.trim().parse().unwrap(), out)
}

/// A PostgreSQL worker SIGKILLed mid-turn (its shell call running), and
/// another taking the session over once the lease expires: one trace in
/// Phoenix with both workers' spans, each saying its worker and lease
/// epoch, the successor's resumed turn settling the killed call as
/// uncertain; the claims and the takeover counted.
#[test]
fn a_worker_killed_mid_turn_and_its_successor_make_one_trace() {
    let python = venv_python("phoenix");
    let phoenix = Phoenix::shared(&python);
    let (_sink, metrics_port, sink_out) = metrics_sink(&python);
    let cluster = cairn_pg::test_cluster::TestCluster::shared()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let url = cluster.create_database(&format!("otel_fleet_{}", std::process::id())).unwrap();
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell",
            "arguments": {"command": "mkdir -p runs && mktemp -p runs && sleep 30"}}]}),
        json!({"text": "fleet done"}),
    ]);
    let s = script.to_str().unwrap();
    let submitted = env.cairn(&["--database", &url, "submit", "go"]).output().unwrap();
    let id = util::stdout_ok(&submitted).trim().to_owned();
    let log = env.home.join("workers.log");
    let worker = || {
        let err = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        Killed(
            env.cairn(&["--database", &url, "--script", s, "--yes", "worker", "--lease", "2"])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", phoenix.port))
                .env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", format!("http://127.0.0.1:{metrics_port}/v1/metrics"))
                .env("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=fleet")
                .stdout(Stdio::null())
                .stderr(err)
                .spawn()
                .unwrap(),
        )
    };
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let runs = || std::fs::read_dir(env.cwd.join("runs")).map(|d| d.count()).unwrap_or(0);

    let first = worker();
    let start = Instant::now();
    while runs() == 0 {
        assert!(start.elapsed() < Duration::from_secs(120), "the tool never started:\n{}", said());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The first worker's model call ended before its tool started: its span
    // leaves on the exporter's timer; the kill comes once it is in Phoenix.
    let before = phoenix.spans("fleet", 1);
    assert!(!before.is_empty(), "the first worker exported nothing before its kill:\n{}", said());
    drop(first); // SIGKILL

    let _second = worker();
    let start = Instant::now();
    let spans = loop {
        let spans = phoenix.spans("fleet", 1);
        let workers: std::collections::BTreeSet<&str> =
            spans.iter().filter_map(|s| attr(s, "cairn.worker.id").as_str()).collect();
        let settled =
            spans.iter().any(|s| s["name"] == "execute_tool shell" && attr(s, "cairn.settlement") == "uncertain");
        if workers.len() >= 2 && settled {
            break spans;
        }
        assert!(start.elapsed() < Duration::from_secs(180), "no second worker's spans: {spans:#?}\n{}", said());
        std::thread::sleep(Duration::from_millis(500));
    };
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let trace = trace_id(&spans[0]);
    assert!(spans.iter().all(|s| trace_id(s) == trace), "one trace: {names:?}");
    assert!(spans.iter().all(|s| attr(s, "gen_ai.conversation.id") == id.as_str()), "{spans:#?}");
    let by_worker = |w: &str| -> Vec<&Value> { spans.iter().filter(|s| attr(s, "cairn.worker.id") == w).collect() };
    let workers: Vec<&str> = {
        let set: std::collections::BTreeSet<&str> =
            spans.iter().filter_map(|s| attr(s, "cairn.worker.id").as_str()).collect();
        set.into_iter().collect()
    };
    assert_eq!(workers.len(), 2, "{spans:#?}");
    let epochs: Vec<i64> = workers
        .iter()
        .map(|w| {
            let e: std::collections::BTreeSet<i64> =
                by_worker(w).iter().filter_map(|s| attr(s, "cairn.lease.epoch").as_i64()).collect();
            assert_eq!(e.len(), 1, "one epoch per worker: {e:?}");
            *e.first().unwrap()
        })
        .collect();
    assert_ne!(epochs[0], epochs[1], "the takeover is a new lease epoch");
    // The successor's resumed turn settles the killed call as uncertain.
    let resumed = named(&spans, "invoke_agent cairn");
    assert!(resumed.iter().any(|t| attr(t, "cairn.resumed") == true), "{resumed:#?}");
    let uncertain =
        spans.iter().any(|s| s["name"] == "execute_tool shell" && attr(s, "cairn.settlement") == "uncertain");
    assert!(uncertain, "the killed call, settled by the successor: {names:?}");

    // Claims and the takeover, on the successor's 10-second metric timer.
    let start = Instant::now();
    loop {
        let metrics = sunk(sink_out.path());
        if ["cairn.worker.claims", "cairn.worker.takeovers"].iter().all(|m| metrics.iter().any(|l| l["metric"] == *m)) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "worker metrics missing: {metrics:#?}\n{}", said());
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A PostgreSQL worker's gauges and a forced lease loss, through an OTLP
/// sink decoding both signals with `opentelemetry-proto`: while the worker
/// (one thread) holds one session whose tool waits, the two others wait in
/// the queue (`cairn.worker.sessions_held` 1, `cairn.worker.queue.depth`
/// 2); then the session is claimed by another owner behind its back (its
/// lease expired and taken, as a partitioned worker's would be), and the
/// worker's renewal finds it lost: `cairn.worker.lease_losses` counts it as
/// `lost`, and a `lease_lost` span in the session's trace says which
/// worker lost which epoch.
#[test]
fn a_worker_reports_its_queue_and_a_lost_lease() {
    let python = venv_python("phoenix");
    let (_sink, port, sink_out) = metrics_sink(&python);
    let cluster = cairn_pg::test_cluster::TestCluster::shared()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let url = cluster.create_database(&format!("otel_gauges_{}", std::process::id())).unwrap();
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    // Each session's tool waits until the test lets it go: it reads a
    // FIFO, which ends when a writer opens and closes it.
    let fifo = env.cwd.join("waiter");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo");
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell",
            "arguments": {"command": "mkdir -p runs && mktemp -p runs && cat waiter"}}]}),
        json!({"text": "let go"}),
    ]);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let submitted = env.cairn(&["--database", &url, "submit", "go"]).output().unwrap();
        ids.push(util::stdout_ok(&submitted).trim().to_owned());
    }
    let log = env.home.join("worker.log");
    let err = std::fs::File::create(&log).unwrap();
    let worker = Killed(
        env.cairn(&["--database", &url, "--script", script.to_str().unwrap(), "--yes", "worker", "--lease", "3"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}"))
            .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap(),
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let runs = || std::fs::read_dir(env.cwd.join("runs")).map(|d| d.count()).unwrap_or(0);
    // Let the waiting tool go however the test ends (also one the killed
    // worker left behind): opened without blocking, which fails when no
    // one reads.
    struct Release(PathBuf);
    impl Drop for Release {
        fn drop(&mut self) {
            use std::os::unix::fs::OpenOptionsExt as _;
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&self.0);
        }
    }
    let _release = Release(fifo);

    let start = Instant::now();
    while runs() == 0 {
        if start.elapsed() > Duration::from_secs(120) {
            let shown = env.cairn(&["--database", &url, "show", &ids[0]]).output().unwrap();
            panic!("the tool never started:\n{}\n{}{}", said(), stdout(&shown), stderr(&shown));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // One session held, two waiting, for as long as the tool waits.
    let gauge = |lines: &[Value], name: &str, want: f64| {
        lines.iter().any(|l| {
            l["metric"] == name && l["value"].as_f64() == Some(want) && l["attributes"]["cairn.worker.id"].is_string()
        })
    };
    let start = Instant::now();
    loop {
        let lines = sunk(sink_out.path());
        if gauge(&lines, "cairn.worker.sessions_held", 1.0) && gauge(&lines, "cairn.worker.queue.depth", 2.0) {
            break;
        }
        let seen: Vec<&Value> =
            lines.iter().filter(|l| l["metric"].as_str().is_some_and(|m| m.starts_with("cairn.worker"))).collect();
        assert!(start.elapsed() < Duration::from_secs(120), "no gauges of 1 held and 2 waiting: {seen:#?}\n{}", said());
        std::thread::sleep(Duration::from_millis(100));
    }

    // Another owner takes the held session's lease, as a worker claiming
    // it after the lease expired would.
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let row = db
        .query_one(
            "UPDATE cairn_sessions SET epoch = epoch + 1, lease_owner = 'elsewhere/0',
                 lease_expires = now() + interval '1 hour'
             WHERE lease_owner IS NOT NULL AND lease_expires > now() RETURNING id, epoch - 1",
            &[],
        )
        .unwrap();
    let (stolen, epoch): (String, i64) = (row.get(0), row.get(1));
    assert!(ids.contains(&stolen), "{stolen} is one of {ids:?}");

    let start = Instant::now();
    let (loss, span) = loop {
        let lines = sunk(sink_out.path());
        let loss = lines
            .iter()
            .find(|l| l["metric"] == "cairn.worker.lease_losses" && l["attributes"]["cairn.lease.loss"] == "lost")
            .cloned();
        let span = lines.iter().find(|l| l["span"] == "lease_lost").cloned();
        if let (Some(loss), Some(span)) = (loss, span) {
            break (loss, span);
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no lease loss exported: {lines:#?}\n{}", said());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(loss["value"].as_f64().is_some_and(|v| v >= 1.0), "{loss}");
    let owner = loss["attributes"]["cairn.worker.id"].as_str().unwrap().to_owned();
    assert_eq!(span["attributes"]["gen_ai.conversation.id"], stolen.as_str(), "{span:#}");
    assert_eq!(span["attributes"]["cairn.lease.epoch"], epoch, "{span:#}");
    assert_eq!(span["attributes"]["cairn.lease.loss"], "lost", "{span:#}");
    assert_eq!(span["attributes"]["cairn.worker.id"], owner.as_str(), "{span:#}");
    assert_eq!(span["status"], 2, "an error status: {span:#}");
    assert!(span["events"].as_array().unwrap().iter().any(|e| e["name"] == "lease_lost"), "{span:#}");
    // In the session's trace, beside the turn the worker was running.
    let lines = sunk(sink_out.path());
    let turn = lines
        .iter()
        .find(|l| l["span"] == "invoke_agent cairn" && l["attributes"]["gen_ai.conversation.id"] == stolen.as_str())
        .unwrap_or_else(|| panic!("the stolen session's turn span: {lines:#?}"));
    assert_eq!(turn["trace_id"], span["trace_id"], "one trace: {turn:#}\n{span:#}");
    assert_eq!(turn["attributes"]["cairn.lease.epoch"], epoch, "{turn:#}");
    drop(worker);
}
