//! The native compiler participant `cc`: builds C into an actor `.wasm`
//! with clang (`--target=wasm32-wasi --sysroot=/usr -O2`, Debian's
//! wasi-libc; `scripts/ensure-wasi-clang` installs them), so an actor or the
//! agent can write a tool in C and then `spawn`/`upgrade` it. It owns the
//! build request format, the build directories and the clang run; it never
//! routes messages (the broker does) and never installs a version (the
//! sender asks the broker with the paths `cc` answers).
//!
//! Request (to `cc`): `{"type":"build", "name"?: "<a-z0-9-_>" (default
//! "main"), and exactly one of "files": {"main.c": "…", "tests/t.jsonl":
//! "…"} or "source": "<path>"}`. `source` follows the broker's path rules
//! for the sender (`/actor/...`, its own `/public/...` and `/data/...`;
//! natives may name host paths): a `.c` file, or a directory copied whole
//! (its `tests/*.jsonl` then gate upgrades). Every `*.c` at the top of the
//! source is compiled and linked into one command module.
//!
//! Replies (`reply_to` = the request): `{"type":"built","name","wasm",
//! "source","warnings"}` — `wasm` and `source` are paths the sender can put
//! in a `spawn`/`upgrade` request: `/public/cc/<name>/actor.wasm` and
//! `/public/cc/<name>/source` in the sending actor's own public files; for
//! the native `agent` and `console`, host paths under
//! `DIR/broker/builds/<sender>/<name>/` — or `{"type":"build_failed",
//! "name","reason","stderr"}`. A new build of a name replaces the last one.
//!
//! The run: one worker thread (builds are serial; the broker thread never
//! waits for one), taking requests from a queue per sender: the console's
//! first, then the agent's, then the actors' round-robin (the one served
//! least recently first), at most [`QUEUED_PER_SENDER`] waiting per actor
//! (more are answered `build_failed` at once: issue 48.8, twelve queued
//! builds of one actor no longer hold up the console's); clang as a subprocess under cairn-tools' sandbox
//! (Landlock + seccomp: no network, writes only in the build directory),
//! in a mount and PID namespace of its own where every top-level directory
//! of `/` but `/dev` and the private `/tmp` is covered, `/usr` and `/proc`
//! included, and only the build directory and what clang needs stay
//! visible beneath the covers: its installation, resource directory,
//! wasm-ld, the sysroot's `include/wasm32-wasi` and `lib/wasm32-wasi`, and
//! the directories of the shared libraries it loads ([`ClangView`], found
//! by asking clang and the dynamic loader once per process; see
//! [`confined`]). No `/proc` at all: LLVM then finds its own executable by
//! argv[0], which is clang's real path. A cleared environment (`PATH`
//! only), its own process group, killed after [`BUILD_TIMEOUT`]. Where the
//! sandbox or the mount namespace cannot be set up the build fails and
//! says why: clang never runs unconfined.

use std::collections::{HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use cairn_core::CancelToken;
use cairn_tools::process::{End, RunSpec};
use cairn_tools::sandbox::SandboxPolicy;
use serde_json::{Value, json};

use crate::layout::{self, Layout};
use crate::message::{AGENT, CONSOLE, Inbound};

/// Longest a clang run may take before it is killed.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes of clang's stderr kept in a reply.
const STDERR_CAP: usize = 32 * 1024;
/// Most files a `files` request may hold, and their total size.
const MAX_FILES: usize = 256;
const MAX_BYTES: usize = 8 << 20;
/// The clang arguments (besides the inputs, `-o` and `-fuse-ld`).
pub const CLANG_ARGS: [&str; 3] = ["--target=wasm32-wasi", "--sysroot=/usr", "-O2"];
/// The sysroot of [`CLANG_ARGS`] (Debian's wasi-libc) and its target:
/// clang reads `<sysroot>/include/<target>` and `<sysroot>/lib/<target>`
/// of it, nothing else.
const SYSROOT: &str = "/usr";
const TARGET: &str = "wasm32-wasi";
/// Compiled into every build: an exported `cabi_realloc` on the module's
/// own malloc. The adapter that turns a WASI p1 module into a component
/// keeps its state (a 64 KiB page) in the module's memory, from the
/// module's `cabi_realloc`, or by `memory.grow` when there is none. Debian's
/// wasi-libc (2022) has none, and at its first `malloc` it takes every
/// page from `__heap_base` to the memory's end as its heap, the adapter's
/// page included: an actor that allocated a few hundred KiB overwrote the
/// adapter's state and trapped at its next WASI call ("assertion failed
/// at adapter line 2857"). Weak, so a source's own `cabi_realloc` wins.
const CABI_REALLOC_C: &str = "#include <stdlib.h>
__attribute__((weak, export_name(\"cabi_realloc\")))
void *cabi_realloc(void *old, size_t old_len, size_t align, size_t new_len) {
    (void)old_len;
    (void)align;
    return realloc(old, new_len);
}
";
/// [`CABI_REALLOC_C`]'s name in the build directory.
const CABI_REALLOC_FILE: &str = "cairn-cabi-realloc.c";

/// Longest a question to clang about its own layout may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// What to run when clang or wasi-libc is missing.
const INSTALL_HINT: &str =
    "run scripts/ensure-wasi-clang (installs Debian's clang, lld, wasi-libc and libclang-rt-*-dev-wasm32)";

/// A reply to send: (to, reply_to, body).
pub(crate) type Reply = (String, String, Value);

/// Builds an actor may have waiting at once (the console's and the
/// agent's are not capped).
pub const QUEUED_PER_SENDER: usize = 4;

/// The requests waiting, one queue per sender, and when each sender was
/// last served.
#[derive(Default)]
struct Waiting {
    queues: HashMap<String, VecDeque<Inbound>>,
    served: HashMap<String, u64>,
    clock: u64,
}

impl Waiting {
    /// Queues `m`, or gives it back with why not (its sender's queue is full).
    fn add(&mut self, m: Inbound) -> Result<(), Box<(Inbound, String)>> {
        let q = self.queues.entry(m.from.clone()).or_default();
        if !native(&m.from) && q.len() >= QUEUED_PER_SENDER {
            let why = format!(
                "{} builds of {} are waiting already (at most {QUEUED_PER_SENDER} per sender); send it again after one is answered",
                q.len(),
                m.from
            );
            return Err(Box::new((m, why)));
        }
        q.push_back(m);
        Ok(())
    }

    /// The next request: the console's, the agent's, then the actor
    /// served least recently.
    fn take_next(&mut self) -> Option<Inbound> {
        let who =
            [CONSOLE, AGENT].into_iter().find(|w| self.queues.contains_key(*w)).map(str::to_owned).or_else(|| {
                self.queues.keys().min_by_key(|k| (self.served.get(*k).copied().unwrap_or(0), (*k).clone())).cloned()
            })?;
        let q = self.queues.get_mut(&who)?;
        let m = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&who);
        }
        self.clock += 1;
        if self.served.len() > 4096 {
            let live = &self.queues;
            self.served.retain(|k, _| live.contains_key(k));
        }
        self.served.insert(who, self.clock);
        m
    }
}

/// Runs the `cc` worker until `rx` closes; `send` hands each reply to the
/// broker.
pub(crate) fn run(layout: Layout, rx: crate::queue::InboxRx, send: impl Fn(Reply)) {
    let counter = AtomicU64::new(0);
    let mut waiting = Waiting::default();
    loop {
        // Everything that arrived meanwhile is queued before one is
        // chosen (waiting for the inbox only when nothing is queued).
        let first = if waiting.queues.is_empty() {
            match rx.recv() {
                Some(m) => Some(m),
                None => return,
            }
        } else {
            None
        };
        for m in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv())) {
            // Replies (and undeliverable notes) are never answered: no loops.
            if m.reply_to.is_some() {
                continue;
            }
            if let Err(refused) = waiting.add(m) {
                let (m, why) = *refused;
                let name = m.body.get("name").and_then(Value::as_str).unwrap_or("main").to_owned();
                send((m.from, m.id, json!({"type": "build_failed", "name": name, "reason": why, "stderr": ""})));
            }
        }
        let Some(m) = waiting.take_next() else { continue };
        let name = m.body.get("name").and_then(Value::as_str).unwrap_or("main").to_owned();
        let body = if m.body.get("type").and_then(Value::as_str) != Some("build") {
            json!({"type": "build_failed", "name": name,
                "reason": "cc understands {\"type\":\"build\", \"name\"?, \"files\": {…} | \"source\": path}"})
        } else {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            match build(&layout, &m.from, &m.body, n) {
                Ok(b) => b,
                Err(e) => json!({"type": "build_failed", "name": name, "reason": format!("{e:#}"), "stderr": ""}),
            }
        };
        send((m.from, m.id, body));
    }
}

/// Whether `sender` is a native participant (its paths are host paths).
fn native(sender: &str) -> bool {
    sender == AGENT || sender == CONSOLE
}

/// Checks a relative file name of a `files` request.
fn check_rel(name: &str) -> anyhow::Result<PathBuf> {
    let p = Path::new(name);
    let ok = !name.is_empty()
        && p.components().count() <= 8
        && p.components().all(|c| match c {
            Component::Normal(s) => s.to_str().is_some_and(|s| {
                !s.starts_with('.') && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
            }),
            _ => false,
        });
    if !ok {
        bail!("file name {name:?} refused: relative, at most 8 parts of A-Z a-z 0-9 . _ - +, none starting with '.'");
    }
    Ok(p.to_path_buf())
}

/// The directory a build of `name` by `sender` ends up in, and the paths
/// the sender names it by.
fn destination(layout: &Layout, sender: &str, name: &str) -> (PathBuf, String, String) {
    if native(sender) {
        let d = layout.root().join("broker").join("builds").join(sender).join(name);
        let abs = std::path::absolute(&d).unwrap_or(d);
        let (w, s) = (abs.join("actor.wasm"), abs.join("source"));
        (abs, w.to_string_lossy().into_owned(), s.to_string_lossy().into_owned())
    } else {
        let d = layout.public(sender).join("cc").join(name);
        (d, format!("/public/cc/{name}/actor.wasm"), format!("/public/cc/{name}/source"))
    }
}

fn build(layout: &Layout, sender: &str, body: &Value, n: u64) -> anyhow::Result<Value> {
    let name = body.get("name").and_then(Value::as_str).unwrap_or("main");
    crate::message::check_actor_id(name).map_err(|e| anyhow!("build name: {e}"))?;
    let scratch = layout.root().join("broker").join("builds").join(".tmp").join(format!("{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let src = scratch.join("source");
    std::fs::create_dir_all(&src).with_context(|| format!("creating {}", src.display()))?;
    let r = build_in(layout, sender, name, body, &scratch, &src);
    let _ = std::fs::remove_dir_all(&scratch);
    r
}

fn build_in(
    layout: &Layout,
    sender: &str,
    name: &str,
    body: &Value,
    scratch: &Path,
    src: &Path,
) -> anyhow::Result<Value> {
    match (body.get("files"), body.get("source").and_then(Value::as_str)) {
        (Some(Value::Object(files)), None) => {
            if files.len() > MAX_FILES {
                bail!("at most {MAX_FILES} files");
            }
            let total: usize = files.values().map(|v| v.as_str().map_or(0, str::len)).sum();
            if total > MAX_BYTES {
                bail!("the files hold {total} bytes; at most {MAX_BYTES}");
            }
            for (rel, text) in files {
                let text = text.as_str().ok_or_else(|| anyhow!("files[{rel:?}] must be a string"))?;
                let p = src.join(check_rel(rel)?);
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            }
        }
        (None, Some(path)) => {
            let from = layout::resolve(layout, sender, native(sender), path)?;
            let meta = std::fs::symlink_metadata(&from).with_context(|| format!("source {path:?}"))?;
            if meta.is_dir() {
                layout::copy_tree(&from, src)?;
            } else if meta.is_file() && from.extension().is_some_and(|e| e == "c") {
                let file = from.file_name().ok_or_else(|| anyhow!("source {path:?} has no file name"))?;
                std::fs::copy(&from, src.join(file)).with_context(|| format!("copying {path:?}"))?;
            } else {
                bail!("source {path:?} must be a .c file or a directory");
            }
        }
        _ => bail!("a build request needs exactly one of \"files\" (an object of name → text) or \"source\" (a path)"),
    }
    let mut inputs: Vec<String> = std::fs::read_dir(src)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.ends_with(".c"))
        .collect();
    inputs.sort();
    if inputs.is_empty() {
        bail!("no .c file at the top of the source");
    }
    let clang = find_clang().ok_or_else(|| anyhow!("clang is not installed: {INSTALL_HINT}"))?;
    // The covers that keep host files from clang exist only in a mount
    // namespace of its own; without one Landlock alone would let it read
    // every system directory (`/etc` and `/proc` included).
    cairn_tools::sandbox::isolation_status().map_err(|why| {
        anyhow!("cannot confine clang to its build directory and the sysroot here (no mount namespace: {why})")
    })?;
    let scratch_abs = std::path::absolute(scratch)?;
    let view = clang_view(&clang, &scratch_abs, layout.root())?;
    // argv[0] is clang's real path: with `/proc` covered, LLVM finds its
    // own executable (and from it the resource directory) by argv[0].
    let mut argv: Vec<std::ffi::OsString> = vec![view.clang.clone().into_os_string()];
    argv.extend(CLANG_ARGS.iter().map(Into::into));
    // Debian's clang looks for `wasm-ld-<N>` in `/usr/bin`, which is
    // covered; its WebAssembly driver takes an absolute `-fuse-ld` (and
    // ignores `--ld-path`).
    let mut ld_path = std::ffi::OsString::from("-fuse-ld=");
    ld_path.push(&view.ld);
    argv.push(ld_path);
    argv.extend(["-o".into(), "actor.wasm".into()]);
    argv.extend(inputs.iter().map(|i| Path::new("source").join(i).into_os_string()));
    // Beside the sources, not among them (the stored source stays the
    // sender's): see [`CABI_REALLOC_C`].
    std::fs::write(scratch_abs.join(CABI_REALLOC_FILE), CABI_REALLOC_C)
        .with_context(|| format!("writing {CABI_REALLOC_FILE} into the build directory"))?;
    argv.push(CABI_REALLOC_FILE.into());
    let mut spec = confined(argv, &scratch_abs, layout.root(), view.reads.clone(), true);
    spec.timeout = BUILD_TIMEOUT;
    let out = cairn_tools::process::run(&spec, &CancelToken::new(), &mut |_: &[u8]| {})
        .map_err(|e| anyhow!("cannot run clang confined (no network, writes only in its build directory): {e}"))?;
    let stderr = cairn_tools::process::capped_text(&out.stderr);
    if out.end == End::TimedOut {
        return Ok(json!({"type": "build_failed", "name": name,
            "reason": format!("clang did not finish within {} s and was killed", BUILD_TIMEOUT.as_secs()),
            "stderr": stderr}));
    }
    if out.exit_code != 0 || !scratch.join("actor.wasm").is_file() {
        let mut reason = format!("clang exited with status {}", out.exit_code);
        if !Path::new("/usr/include/wasm32-wasi").is_dir() || stderr.contains("wasm-ld") {
            reason.push_str(&format!("; wasi-libc or wasm-ld may be missing: {INSTALL_HINT}"));
        }
        return Ok(json!({"type": "build_failed", "name": name, "reason": reason, "stderr": stderr}));
    }
    let (dest, wasm, source) = destination(layout, sender, name);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if dest.exists() {
        std::fs::remove_dir_all(&dest).with_context(|| format!("replacing {}", dest.display()))?;
    }
    std::fs::create_dir_all(&dest)?;
    std::fs::rename(src, dest.join("source")).with_context(|| format!("installing into {}", dest.display()))?;
    std::fs::rename(scratch.join("actor.wasm"), dest.join("actor.wasm"))?;
    Ok(json!({"type": "built", "name": name, "wasm": wasm, "source": source, "warnings": stderr}))
}

/// Top-level directories never covered: `/dev` (Landlock lets clang
/// read `/dev/null` and `/dev/urandom` there, nothing else) and `/tmp`
/// (the sandbox's private one).
const UNCOVERED: &[&str] = &["dev", "tmp"];

/// The run of `argv` (clang, or a question to it) in the build directory
/// `cwd`: no network, writes only in `cwd`, and in its own mount and PID
/// namespace every top-level directory of `/` but [`UNCOVERED`] covered by
/// an empty one, the world too, with only `cwd` and `reads` (and the
/// program's own directory) visible beneath the covers. Landlock alone
/// confines writes only: without the covers an `#include "/etc/passwd"`
/// or of a file under `/usr/share` came back in clang's error output (and
/// `/proc` was there whole: clang reads its files as empty, procfs says
/// they have size 0, but no program of the guest's should find them). With `narrow` false, `/usr` and `/lib*` stay
/// visible whole (for the questions that find what clang needs there).
fn confined(argv: Vec<std::ffi::OsString>, cwd: &Path, world: &Path, reads: Vec<PathBuf>, narrow: bool) -> RunSpec {
    let mut hidden = vec![world.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir("/") {
        for e in rd.flatten() {
            let name = e.file_name();
            // A top-level symlink (`/lib -> usr/lib`) is not covered: what
            // it points to is, where it lies.
            let plain_dir_or_file = e.file_type().is_ok_and(|t| !t.is_symlink());
            let system =
                ["usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin"].iter().any(|k| name.as_os_str() == *k);
            if plain_dir_or_file && !UNCOVERED.iter().any(|k| name.as_os_str() == *k) && (narrow || !system) {
                hidden.push(e.path());
            }
        }
    }
    RunSpec {
        argv,
        cwd: cwd.to_path_buf(),
        stdin: Vec::new(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        sandbox: Some(SandboxPolicy {
            cwd: cwd.to_path_buf(),
            read_cwd: true,
            write_cwd: true,
            network: false,
            process_spawn: true,
            extra_read: reads,
            ..SandboxPolicy::default()
        }),
        timeout: PROBE_TIMEOUT,
        output_cap: STDERR_CAP,
        max_processes: 32,
        pid_namespace: true,
        hidden,
    }
}

/// What clang needs to read besides its build directory, and how to run
/// it there.
#[derive(Debug, Clone)]
struct ClangView {
    /// clang's real path (symlinks resolved).
    clang: PathBuf,
    /// wasm-ld (a name of the multi-call `lld`, so only its directory is
    /// resolved); clang is told it with `-fuse-ld`.
    ld: PathBuf,
    /// Directories it reads, none inside another: its installation (the
    /// directory above its `bin`, e.g. `/usr/lib/llvm-14`, which holds
    /// the resource directory and wasm-ld), the resource directory and
    /// library search directories it prints, the sysroot's
    /// `include/wasm32-wasi` and `lib/wasm32-wasi`, and the directories of
    /// the shared libraries clang and wasm-ld load (the dynamic loader's
    /// own included).
    reads: Vec<PathBuf>,
}

/// Finds [`ClangView`] for `clang` once per process, by asking clang
/// itself (`-print-resource-dir`, `-print-prog-name=wasm-ld`,
/// `-print-search-dirs`) and the dynamic loader
/// (`LD_TRACE_LOADED_OBJECTS=1`: it lists the libraries a program loads
/// and exits before the program runs), each confined like a build with
/// only the system directories visible.
fn clang_view(clang: &Path, cwd: &Path, world: &Path) -> anyhow::Result<ClangView> {
    static VIEW: std::sync::Mutex<Option<(PathBuf, ClangView)>> = std::sync::Mutex::new(None);
    let mut cached = VIEW.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, v)) = cached.as_ref().filter(|(c, _)| c == clang) {
        return Ok(v.clone());
    }
    let real = std::fs::canonicalize(clang).with_context(|| format!("resolving {}", clang.display()))?;
    let ask = |program: &Path, args: &[&str], env: Option<(&str, &str)>| -> anyhow::Result<String> {
        let mut argv: Vec<std::ffi::OsString> = vec![program.into()];
        argv.extend(args.iter().map(Into::into));
        let mut spec = confined(argv, cwd, world, Vec::new(), false);
        spec.env.extend(env.map(|(k, v)| (k.to_owned(), v.to_owned())));
        let out = cairn_tools::process::run(&spec, &CancelToken::new(), &mut |_: &[u8]| {})
            .map_err(|e| anyhow!("asking {} {args:?}: {e}", program.display()))?;
        if out.exit_code != 0 {
            bail!(
                "asking {} {args:?}: status {}: {}",
                program.display(),
                out.exit_code,
                cairn_tools::process::capped_text(&out.stderr)
            );
        }
        Ok(cairn_tools::process::capped_text(&out.stdout))
    };
    let mut reads: Vec<PathBuf> = Vec::new();
    // Its installation, unless clang lies directly in a system `bin`
    // (then the rest of that prefix is not clang's own).
    let bin = real.parent().map(Path::to_path_buf).unwrap_or_default();
    match bin.parent() {
        Some(prefix) if ![Path::new("/"), Path::new("/usr"), Path::new("/usr/local")].contains(&prefix) => {
            reads.push(prefix.to_path_buf());
        }
        _ => reads.push(bin.clone()),
    }
    reads.push(PathBuf::from(ask(&real, &["-print-resource-dir"], None)?.trim()));
    // wasm-ld is a name of the multi-call `lld`, which acts by the name
    // it is run as: its directory is resolved, never its own link. The
    // one beside clang's real binary first (Debian's `/usr/lib/llvm-14/bin`).
    let beside = bin.join("wasm-ld");
    let ld = if beside.is_file() {
        beside
    } else {
        let printed = ask(&real, &[CLANG_ARGS[0], "-print-prog-name=wasm-ld"], None)?;
        let printed = Path::new(printed.trim());
        let dir = printed.parent().and_then(|d| std::fs::canonicalize(d).ok());
        match (dir, printed.file_name()) {
            (Some(dir), Some(name)) if dir.join(name).is_file() => dir.join(name),
            _ => bail!("clang finds no wasm-ld ({}): {INSTALL_HINT}", printed.display()),
        }
    };
    let dirs = ask(&real, &[CLANG_ARGS[0], CLANG_ARGS[1], "-print-search-dirs"], None)?;
    for line in dirs.lines() {
        if let Some(list) = line.strip_prefix("libraries: =") {
            reads.extend(list.split(':').filter(|d| !d.is_empty()).map(PathBuf::from));
        }
    }
    reads.push(Path::new(SYSROOT).join("include").join(TARGET));
    reads.push(Path::new(SYSROOT).join("lib").join(TARGET));
    reads.push(ld.parent().map(Path::to_path_buf).unwrap_or_default());
    for program in [&real, &ld] {
        let listed = ask(program, &[], Some(("LD_TRACE_LOADED_OBJECTS", "1")))?;
        reads.extend(loaded_library_dirs(&listed));
    }
    let view = ClangView { clang: real, ld, reads: outermost(reads) };
    *cached = Some((clang.to_path_buf(), view.clone()));
    Ok(view)
}

/// The directories of the libraries in the dynamic loader's list
/// (`LD_TRACE_LOADED_OBJECTS=1`: `libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1
/// (0x…)`, and the loader itself as `/lib64/ld-linux-x86-64.so.2 (0x…)`),
/// as listed (the loader finds them by these names, symlinks included).
fn loaded_library_dirs(listed: &str) -> Vec<PathBuf> {
    listed
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| Path::new(path).parent().map(Path::to_path_buf)).flatten()
        })
        .collect()
}

/// `paths` resolved (symlinks: the real directory is what a cover keeps
/// visible), existing, sorted, and without any that lies inside another.
fn outermost(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut real: Vec<PathBuf> = paths.iter().filter_map(|p| std::fs::canonicalize(p).ok()).collect();
    real.sort();
    real.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in real {
        if !out.iter().any(|o| p.starts_with(o)) {
            out.push(p);
        }
    }
    out
}

/// `clang` on the host's `PATH`.
fn find_clang() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("clang")).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_checked() {
        assert!(check_rel("main.c").is_ok());
        assert!(check_rel("tests/echo.jsonl").is_ok());
        for bad in ["", "../x.c", "/etc/passwd", ".hidden.c", "a/../b.c", "a b.c", "x/.y"] {
            assert!(check_rel(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn destinations_are_paths_the_sender_may_name() {
        let l = Layout::new("/w");
        let (d, w, s) = destination(&l, "calc", "v2");
        assert_eq!(d, PathBuf::from("/w/actor/calc/public/cc/v2"));
        assert_eq!((w.as_str(), s.as_str()), ("/public/cc/v2/actor.wasm", "/public/cc/v2/source"));
        assert_eq!(layout::resolve(&l, "calc", false, &w).ok(), Some(d.join("actor.wasm")));
        let (d, w, _) = destination(&l, "agent", "hello");
        assert_eq!(d, PathBuf::from("/w/broker/builds/agent/hello"));
        assert_eq!(w, "/w/broker/builds/agent/hello/actor.wasm");
    }
}
