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
//! waits for one), clang as a subprocess under cairn-tools' sandbox
//! (Landlock + seccomp: no network, writes only in the build directory;
//! reads only the build directory and the system's `/usr`, `/lib*`,
//! `/bin`, `/sbin`, `/dev` and `/proc`: every other top-level directory is
//! covered in its mount namespace, see [`hidden_from_clang`]),
//! a cleared environment (`PATH` only), its own process group, killed
//! after [`BUILD_TIMEOUT`]. Where the sandbox cannot be set up the build
//! fails and says why: clang never runs unconfined.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
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
/// The clang arguments (besides the inputs and `-o`).
pub const CLANG_ARGS: [&str; 3] = ["--target=wasm32-wasi", "--sysroot=/usr", "-O2"];
/// What to run when clang or wasi-libc is missing.
const INSTALL_HINT: &str =
    "run scripts/ensure-wasi-clang (installs Debian's clang, lld, wasi-libc and libclang-rt-*-dev-wasm32)";

/// A reply to send: (to, reply_to, body).
pub(crate) type Reply = (String, String, Value);

/// Runs the `cc` worker until `rx` closes; `send` hands each reply to the
/// broker.
pub(crate) fn run(layout: Layout, rx: Receiver<Inbound>, send: impl Fn(Reply)) {
    let counter = AtomicU64::new(0);
    for m in rx {
        // Replies (and undeliverable notes) are never answered: no loops.
        if m.reply_to.is_some() {
            continue;
        }
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
    let mut argv: Vec<std::ffi::OsString> = vec![clang.into_os_string()];
    argv.extend(CLANG_ARGS.iter().map(Into::into));
    argv.extend(["-o".into(), "actor.wasm".into()]);
    argv.extend(inputs.iter().map(|i| Path::new("source").join(i).into_os_string()));
    let scratch_abs = std::path::absolute(scratch)?;
    let spec = RunSpec {
        argv,
        cwd: scratch_abs.clone(),
        stdin: Vec::new(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        sandbox: Some(SandboxPolicy {
            cwd: scratch_abs,
            read_cwd: true,
            write_cwd: true,
            network: false,
            process_spawn: true,
            ..SandboxPolicy::default()
        }),
        timeout: BUILD_TIMEOUT,
        output_cap: STDERR_CAP,
        max_processes: 32,
        pid_namespace: true,
        // Everything but the system's programs, libraries and sysroot is
        // covered (the world, its sockets and other actors' files
        // included); the build directory stays visible beneath.
        hidden: hidden_from_clang(layout.root()),
    };
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

/// Top-level directories clang may read: its programs, the libraries it
/// loads, Debian's wasi-libc sysroot (`/usr`), devices, and `/proc` (LLVM
/// finds its own resource directory through `/proc/self/exe`). `/tmp` is
/// the sandbox's private one.
const CLANG_READS: &[&str] = &["usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "dev", "proc", "tmp"];

/// What the sandbox covers for clang: every top-level directory of `/`
/// but [`CLANG_READS`], and the world. Landlock confines clang's writes
/// only; without these covers an `#include "/etc/passwd"` (or any file
/// the host user can read) came back in clang's error output.
fn hidden_from_clang(world: &Path) -> Vec<PathBuf> {
    let mut hidden = vec![world.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir("/") {
        for e in rd.flatten() {
            let name = e.file_name();
            if !CLANG_READS.iter().any(|k| name.as_os_str() == *k) {
                hidden.push(e.path());
            }
        }
    }
    hidden
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
