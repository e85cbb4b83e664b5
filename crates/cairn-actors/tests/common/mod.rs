//! Test actors written in WAT (WASI p1 modules, adapted by the broker) and a
//! world helper. The oracles here parse raw JSON lines themselves.
#![allow(dead_code, unreachable_pub, missing_debug_implementations, clippy::unwrap_used, clippy::expect_used)]

pub mod clang;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_actors::{Limits, World, WorldConfig};
use serde_json::{Value, json};

/// Escapes bytes for a WAT string literal.
fn esc(s: &str) -> String {
    s.bytes().map(|b| format!("\\{b:02x}")).collect()
}

/// A p1 actor. `prefix` is written before the first echoed input;
/// `start` runs first; `on_input` runs after every read (with `$n` bytes at
/// 65536). Input is echoed back verbatim (so each stdin line becomes a
/// stdout message to the subscribers with the same body).
pub fn actor(prefix: &str, start: &str, on_input: &str) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 4096) "{p}")
  (data (i32.const 8100) "{{\"body\":{{\"pages\":")
  (data (i32.const 8200) "}}}}\n")
  (func $write (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func $report_pages (local $p i32) (local $v i32)
    (local.set $v (memory.size))
    (local.set $p (i32.const 8200))
    (loop $d
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
      (local.set $v (i32.div_u (local.get $v) (i32.const 10)))
      (br_if $d (local.get $v)))
    (call $write (i32.const 8100) (i32.const 17))
    (call $write (local.get $p) (i32.sub (i32.const 8200) (local.get $p)))
    (call $write (i32.const 8200) (i32.const 3)))
  (func $has_boom (param $n i32) (result i32) (local $i i32)
    (block $no
      (loop $l
        (br_if $no (i32.gt_s (i32.add (local.get $i) (i32.const 4)) (local.get $n)))
        (if (i32.eq (i32.load (i32.add (i32.const 65536) (local.get $i))) (i32.const 0x6d6f6f62))
          (then (return (i32.const 1))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (i32.const 0))
  (func (export "_start") (local $n i32) (local $first i32)
    (local.set $first (i32.const 1))
    {start}
    (block $done
      (loop $next
        (i32.store (i32.const 16) (i32.const 65536))
        (i32.store (i32.const 20) (i32.const 65536))
        (drop (call $fd_read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
        (local.set $n (i32.load (i32.const 24)))
        (br_if $done (i32.eqz (local.get $n)))
        {on_input}
        (if (local.get $first) (then
          (local.set $first (i32.const 0))
          (call $write (i32.const 4096) (i32.const {plen}))))
        (call $write (i32.const 65536) (local.get $n))
        (br $next))))
)"#,
        p = esc(prefix),
        plen = prefix.len(),
    )
}

/// Plain echo.
pub fn echo() -> String {
    actor("", "", "")
}
/// Echo that traps on any input containing `boom`.
pub fn boom() -> String {
    actor("", "", "(if (call $has_boom (local.get $n)) (then unreachable))")
}
/// Traps on every input.
pub fn trap_on_input() -> String {
    actor("", "", "unreachable")
}
/// Never reads stdin, never yields: only the epoch can stop it.
pub fn spinner() -> String {
    actor("", "(loop $spin (br $spin))", "")
}
/// Grows memory until refused, reports its page count, then echoes.
pub fn memory_bomb() -> String {
    actor(
        "",
        "",
        "(if (local.get $first) (then (block $full (loop $g (br_if $full (i32.eq (memory.grow (i32.const 16)) (i32.const -1))) (br $g))) (call $report_pages)))",
    )
}

/// A world in a temp dir, with a scratch dir for actor files.
pub struct TestWorld {
    /// Declared before `dir`: dropped (quit) before the directory goes.
    pub world: Option<World>,
    pub dir: tempfile::TempDir,
    /// Console messages seen by `wait_for` but not matched yet: a later
    /// wait sees them first (messages may arrive in any order).
    pending: std::cell::RefCell<Vec<Value>>,
}

impl TestWorld {
    pub fn new() -> TestWorld {
        Self::with(Limits::default())
    }
    pub fn with(limits: Limits) -> TestWorld {
        Self::with_config(WorldConfig { limits, ..Default::default() })
    }
    pub fn with_config(cfg: WorldConfig) -> TestWorld {
        let dir = tempfile::tempdir().unwrap();
        cairn_actors::init(&dir.path().join("w")).unwrap();
        let world = World::open(&dir.path().join("w"), cfg).unwrap();
        TestWorld { dir, world: Some(world), pending: Default::default() }
    }
    pub fn w(&self) -> &World {
        self.world.as_ref().unwrap()
    }
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("w")
    }
    pub fn reopen(&mut self) {
        self.reopen_with(WorldConfig::default());
    }
    pub fn reopen_with(&mut self, cfg: WorldConfig) {
        self.world.take().unwrap().quit();
        self.world = Some(World::open(&self.root(), cfg).unwrap());
    }
    /// Writes an actor file and returns its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }
    pub fn req(&self, body: Value) -> Value {
        self.w().request(body, Duration::from_secs(120)).unwrap()
    }
    pub fn spawn(&self, id: &str, wat: &str) -> Value {
        let p = self.file(&format!("{id}.wat"), wat);
        self.req(json!({"type":"spawn","id":id,"wasm":p}))
    }
    pub fn subscribe_console(&self, id: &str) {
        let r = self.req(json!({"type":"subscribe","actor":id}));
        assert_eq!(r["type"], "ok", "{r}");
    }
    /// Waits for a console message matching `pred`; other messages are
    /// returned in the second element. Fails the test after 60 s.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> (Value, Vec<Value>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        {
            let mut pending = self.pending.borrow_mut();
            if let Some(i) = pending.iter().position(&pred) {
                return (pending.remove(i), seen);
            }
        }
        while Instant::now() < deadline {
            if let Some(m) = self.w().recv(Duration::from_millis(200)) {
                let v = serde_json::to_value(&m).unwrap();
                if pred(&v) {
                    return (v, seen);
                }
                self.pending.borrow_mut().push(v.clone());
                seen.push(v);
            }
        }
        panic!("no console message {what} within 60 s; saw {seen:#?}");
    }
    pub fn actor_state(&self, id: &str) -> Value {
        let l = self.req(json!({"type":"list"}));
        l["actors"].as_array().unwrap().iter().find(|a| a["id"] == id).cloned().unwrap_or(Value::Null)
    }
    /// Polls `list` until `pred` holds for the actor (60 s at most).
    pub fn wait_state(&self, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.actor_state(id);
            if pred(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{id} never reached {what}: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root().join(rel)).unwrap_or_default()
    }
}

pub fn write_tests(dir: &Path, name: &str, lines: &[Value]) {
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("tests").join(name), text).unwrap();
}

/// A loopback HTTP/1.1 server answering every request with `hello` and
/// recording each request's first line.
pub fn loopback_server() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            reader.read_line(&mut first).unwrap();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            log.lock().unwrap().push(first.trim_end().to_owned());
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Test: yes\r\nConnection: close\r\n\r\nhello");
        }
    });
    (base, seen)
}
