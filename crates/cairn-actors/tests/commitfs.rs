//! Commit-on-close files with real wasmtime and a real C actor
//! (`tests/actors/fstool.c`, built by clang for wasm32-wasi): every rule of
//! the seed's list, checked from the writing actor, from a second actor
//! reading `/actor/<id>/public`, and from the host.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::clang;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use cairn_actors::Limits;
use cairn_actors::runtime::{self, Dirs, Exit, Instance, Runtime};
use wasmtime::component::Component;

const TMP_PREFIX: &str = cairn_actors::commitfs::TMP_PREFIX;

/// The runtime and the compiled tool actor, shared by the tests.
fn tool_component() -> &'static (Runtime, Component) {
    static C: OnceLock<(Runtime, Component)> = OnceLock::new();
    C.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/actors/fstool.c");
        let out = tempfile::tempdir().unwrap();
        let wasm = out.path().join("fstool.wasm");
        clang::build_c_actor(&src, &wasm);
        let rt = Runtime::new(false).unwrap();
        let c = rt.compile(&std::fs::read(&wasm).unwrap()).unwrap();
        (rt, c)
    })
}

/// A world-like directory: `actor/<id>/public` (readable by all as
/// `/actor`), `data/<id>`.
struct Place {
    dir: tempfile::TempDir,
}

impl Place {
    fn new() -> Place {
        let p = Place { dir: tempfile::tempdir().unwrap() };
        for id in ["w", "r"] {
            std::fs::create_dir_all(p.data(id)).unwrap();
            std::fs::create_dir_all(p.public(id)).unwrap();
        }
        p
    }
    fn data(&self, id: &str) -> PathBuf {
        self.dir.path().join("data").join(id)
    }
    fn public(&self, id: &str) -> PathBuf {
        self.dir.path().join("actor").join(id).join("public")
    }
    fn dirs(&self, id: &str) -> Dirs {
        Dirs { data: self.data(id), public: self.public(id), actor_root: self.dir.path().join("actor") }
    }
    fn start(&self, id: &str) -> Tool {
        let (rt, c) = tool_component();
        let (ltx, lines) = channel();
        let (etx, exit) = channel();
        let inst = runtime::start(
            rt,
            c,
            &self.dirs(id),
            &self.dir.path().join(format!("{id}.stderr.log")),
            Limits::default(),
            move |l| {
                let _ = ltx.send(l);
            },
            move |e| {
                let _ = etx.send(e);
            },
        )
        .unwrap();
        Tool { inst, lines, exit }
    }
    /// Host view of a file under `data/w` or `actor/w/public`.
    fn host(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join(rel)).ok()
    }
    /// Temp files anywhere under the place, as seen by the host.
    fn temps(&self) -> Vec<PathBuf> {
        fn walk(d: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), out);
                } else if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                    out.push(e.path());
                }
            }
        }
        let mut v = Vec::new();
        walk(self.dir.path(), &mut v);
        v
    }
}

struct Tool {
    inst: Instance,
    lines: Receiver<String>,
    exit: Receiver<Exit>,
}

impl Tool {
    /// Sends one command, returns its reply line.
    fn cmd(&self, c: &str) -> String {
        self.inst.write_line(c, Duration::from_secs(30)).unwrap_or_else(|e| panic!("sending {c:?}: {e}"));
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no reply to {c:?} within 60 s (the actor died?)"))
    }
    /// A command that must succeed; returns what follows `ok`.
    fn ok(&self, c: &str) -> String {
        let r = self.cmd(c);
        assert!(r == "ok" || r.starts_with("ok "), "{c:?} → {r:?}");
        r.trim_start_matches("ok").trim_start().to_owned()
    }
    /// A command that must fail with `errno`.
    fn err(&self, c: &str, errno: &str) {
        assert_eq!(self.cmd(c), format!("err {errno}"), "{c:?}");
    }
    /// Waits for the instance to end.
    fn end(self) -> Exit {
        self.inst.close_stdin();
        self.exit.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("instance did not end within 60 s"))
    }
}

#[test]
fn writes_appear_at_close_and_until_then_everyone_sees_the_old_content() {
    let p = Place::new();
    std::fs::write(p.data("w").join("f"), "old").unwrap();
    std::fs::write(p.public("w").join("p"), "old-public").unwrap();
    let w = p.start("w");
    let r = p.start("r");
    w.ok("open 1 w /data/f");
    w.ok("open 2 r /data/f");
    assert_eq!(w.ok("write 1 newer"), "5");
    // The host, another descriptor opened before, one opened now: old.
    assert_eq!(p.host("data/w/f").as_deref(), Some("old"));
    assert_eq!(w.ok("cat /data/f"), "old");
    assert_eq!(w.ok("stat /data/f"), "3");
    // Another actor reading /actor/w/public sees the old content too.
    w.ok("open 3 w /public/p");
    w.ok("write 3 fresh");
    assert_eq!(r.ok("cat /actor/w/public/p"), "old-public");
    // Close commits: the new content is there for everyone.
    w.ok("close 1");
    assert_eq!(p.host("data/w/f").as_deref(), Some("newer"));
    assert_eq!(w.ok("cat /data/f"), "newer");
    assert_eq!(w.ok("stat /data/f"), "5");
    // A descriptor opened before the commit keeps the old file.
    assert_eq!(w.ok("read 2"), "old");
    w.ok("close 2");
    assert_eq!(r.ok("cat /actor/w/public/p"), "old-public");
    w.ok("close 3");
    assert_eq!(r.ok("cat /actor/w/public/p"), "fresh");
    assert_eq!(p.host("actor/w/public/p").as_deref(), Some("fresh"));
    // A file created for writing does not exist before its close.
    w.ok("open 4 w /data/brand-new");
    w.ok("write 4 hi");
    w.err("cat /data/brand-new", "ENOENT");
    assert!(!p.data("w").join("brand-new").exists());
    w.ok("close 4");
    assert_eq!(p.host("data/w/brand-new").as_deref(), Some("hi"));
    assert_eq!(w.end(), Exit::Normal);
    assert_eq!(r.end(), Exit::Normal);
    assert!(p.temps().is_empty(), "{:?}", p.temps());
}

#[test]
fn a_normal_exit_commits_every_open_descriptor_whatever_its_status() {
    let p = Place::new();
    std::fs::write(p.data("w").join("b"), "x").unwrap();
    let w = p.start("w");
    w.ok("open 1 w /data/a");
    w.ok("write 1 first");
    w.ok("open 2 a /data/b");
    w.ok("write 2 y");
    assert_eq!(w.cmd("exit 0"), "bye");
    assert_eq!(w.end(), Exit::Normal);
    assert_eq!(p.host("data/w/a").as_deref(), Some("first"));
    assert_eq!(p.host("data/w/b").as_deref(), Some("xy"));
    // A failing exit is a process exit too: it closes (commits) its files.
    // (WASI 0.2's `exit` carries ok/err only, so the status becomes 1.)
    let w = p.start("w");
    w.ok("open 1 w /public/c");
    w.ok("write 1 three");
    assert_eq!(w.cmd("exit 3"), "bye");
    let exit = w.end();
    assert!(matches!(exit, Exit::Code(_)), "{exit:?}");
    assert_eq!(p.host("actor/w/public/c").as_deref(), Some("three"));
    assert!(p.temps().is_empty(), "{:?}", p.temps());
}

#[test]
fn a_trap_or_a_kill_discards_uncommitted_writes() {
    let p = Place::new();
    std::fs::write(p.data("w").join("f"), "old").unwrap();
    let w = p.start("w");
    w.ok("open 1 w /data/f");
    w.ok("write 1 new");
    w.ok("open 2 w /data/g");
    w.ok("write 2 never");
    // A committed write before the trap stays.
    w.ok("open 3 w /data/kept");
    w.ok("write 3 kept");
    w.ok("close 3");
    assert!(!p.temps().is_empty());
    w.inst.write_line("trap", Duration::from_secs(30)).unwrap();
    let exit = w.end();
    assert!(matches!(exit, Exit::Trap(_)), "{exit:?}");
    assert_eq!(p.host("data/w/f").as_deref(), Some("old"));
    assert!(!p.data("w").join("g").exists());
    assert_eq!(p.host("data/w/kept").as_deref(), Some("kept"));
    assert!(p.temps().is_empty(), "{:?}", p.temps());
    // Killed by the host (the epoch sees the kill flag) while spinning.
    let w = p.start("w");
    w.ok("open 1 a /data/f");
    w.ok("write 1 -appended");
    assert_eq!(w.cmd("spin"), "spinning");
    w.inst.kill.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(w.end(), Exit::Killed);
    assert_eq!(p.host("data/w/f").as_deref(), Some("old"));
    assert!(p.temps().is_empty(), "{:?}", p.temps());
}

#[test]
fn append_and_edits_without_truncate_start_from_the_old_content() {
    use std::os::unix::fs::PermissionsExt;
    let p = Place::new();
    let f = p.data("w").join("f");
    std::fs::write(&f, "hello").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let w = p.start("w");
    w.ok("open 1 a /data/f");
    w.ok("write 1 _world");
    assert_eq!(p.host("data/w/f").as_deref(), Some("hello"));
    w.ok("close 1");
    assert_eq!(p.host("data/w/f").as_deref(), Some("hello_world"));
    // Read-write without truncate: overwrite the first byte only.
    w.ok("open 2 r+ /data/f");
    w.ok("write 2 J");
    assert_eq!(w.ok("read 2"), "ello_world");
    w.ok("close 2");
    assert_eq!(p.host("data/w/f").as_deref(), Some("Jello_world"));
    // Create without truncate on an existing file keeps it too.
    w.ok("open 3 c /data/f");
    w.ok("write 3 Y");
    w.ok("close 3");
    assert_eq!(p.host("data/w/f").as_deref(), Some("Yello_world"));
    // Truncate starts empty.
    w.ok("open 4 w /data/f");
    w.ok("write 4 z");
    w.ok("close 4");
    assert_eq!(p.host("data/w/f").as_deref(), Some("z"));
    // The file's permissions survive the replacements.
    assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
    // Exclusive create: refused on an existing file, allowed on a new one.
    w.err("open 5 wx /data/f", "EEXIST");
    w.ok("open 5 wx /data/only");
    w.ok("close 5");
    assert_eq!(p.host("data/w/only").as_deref(), Some(""));
    assert_eq!(w.end(), Exit::Normal);
    assert!(p.temps().is_empty(), "{:?}", p.temps());
}

#[test]
fn directory_operations_take_effect_immediately() {
    let p = Place::new();
    std::fs::write(p.data("w").join("m"), "m").unwrap();
    let w = p.start("w");
    w.ok("mkdir /data/d");
    assert!(p.data("w").join("d").is_dir());
    w.ok("rename /data/m /data/n");
    assert!(!p.data("w").join("m").exists());
    assert_eq!(p.host("data/w/n").as_deref(), Some("m"));
    // A write pending in a directory that is then renamed lands in the
    // renamed directory.
    w.ok("open 1 w /data/d/x");
    w.ok("write 1 1");
    w.ok("rename /data/d /data/e");
    assert!(p.data("w").join("e").is_dir() && !p.data("w").join("d").exists());
    w.ok("close 1");
    assert_eq!(p.host("data/w/e/x").as_deref(), Some("1"));
    w.ok("unlink /data/e/x");
    assert!(!p.data("w").join("e/x").exists());
    w.ok("rmdir /data/e");
    assert!(!p.data("w").join("e").exists());
    w.ok("unlink /data/n");
    assert!(!p.data("w").join("n").exists());
    assert_eq!(w.end(), Exit::Normal);
}

#[test]
fn temp_names_are_hidden_from_every_operation_and_leftovers_are_swept() {
    let p = Place::new();
    // Leftovers of a host killed mid-write: removed when an instance starts.
    std::fs::create_dir_all(p.data("w").join("sub")).unwrap();
    std::fs::write(p.data("w").join(format!("{TMP_PREFIX}dead-1")), "half").unwrap();
    std::fs::write(p.data("w").join(format!("sub/{TMP_PREFIX}dead-2")), "half").unwrap();
    std::fs::write(p.data("w").join("sub/keep"), "k").unwrap();
    let w = p.start("w");
    assert!(p.temps().is_empty(), "{:?}", p.temps());
    assert_eq!(p.host("data/w/sub/keep").as_deref(), Some("k"));
    w.ok("open 1 w /data/f");
    w.ok("write 1 x");
    let temps = p.temps();
    assert_eq!(temps.len(), 1, "{temps:?}");
    let name = temps[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(TMP_PREFIX), "{name}");
    // Listings skip it; lookups do not find it; creating such a name is
    // refused.
    let ls = w.ok("ls /data");
    let mut names: Vec<&str> = ls.split_whitespace().collect();
    names.sort_unstable();
    assert_eq!(names, ["sub"], "{ls}");
    w.err(&format!("cat /data/{name}"), "ENOENT");
    w.err(&format!("stat /data/{name}"), "ENOENT");
    w.err(&format!("open 2 r+ /data/{name}"), "ENOENT");
    w.err(&format!("open 2 w /data/{name}"), "EPERM");
    w.err(&format!("unlink /data/{name}"), "ENOENT");
    w.err(&format!("rename /data/{name} /data/stolen"), "ENOENT");
    w.err(&format!("rename /data/sub/keep /data/{TMP_PREFIX}mine"), "EPERM");
    w.err(&format!("mkdir /data/{TMP_PREFIX}dir"), "EPERM");
    w.err(&format!("ls /data/{TMP_PREFIX}dir"), "ENOENT");
    assert!(temps[0].exists(), "the pending temp file is untouched");
    w.ok("close 1");
    assert_eq!(p.host("data/w/f").as_deref(), Some("x"));
    assert!(p.temps().is_empty(), "{:?}", p.temps());
    assert_eq!(w.end(), Exit::Normal);
}

#[test]
fn symlinks_are_refused() {
    let p = Place::new();
    std::fs::write(p.data("w").join("f"), "content").unwrap();
    std::os::unix::fs::symlink("f", p.data("w").join("hostlink")).unwrap();
    let w = p.start("w");
    w.err("symlink f /data/l", "EPERM");
    assert!(std::fs::symlink_metadata(p.data("w").join("l")).is_err());
    // A symlink put there by the host is never followed.
    w.err("cat /data/hostlink", "ELOOP");
    w.err("stat /data/hostlink", "ELOOP");
    w.err("open 1 w /data/hostlink", "ELOOP");
    w.err("open 1 a /data/hostlink", "ELOOP");
    assert_eq!(p.host("data/w/f").as_deref(), Some("content"));
    assert!(std::fs::symlink_metadata(p.data("w").join("hostlink")).unwrap().file_type().is_symlink());
    assert_eq!(w.end(), Exit::Normal);
    assert!(p.temps().is_empty(), "{:?}", p.temps());
}
