//! The native compiler `cc`: C sources in a message become an actor the
//! sender can spawn — from the console (host paths) and from an actor
//! (its own `/public`), with clang's errors coming back as `build_failed`.
//! Needs clang + wasi-libc (`scripts/ensure-wasi-clang`); without them the
//! builds fail and so do these tests, saying so.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// Echoes every stdin line to stdout (a message to the subscribers).
const ECHO_C: &str = "#include <stdio.h>\nint main(void){char b[4096];while(fgets(b,sizeof b,stdin)){fputs(b,stdout);fflush(stdout);}return 0;}\n";

fn build(t: &TestWorld, body: Value) -> Value {
    let (r, _) = t.w().ask_as("console", "cc", body, Duration::from_secs(300)).unwrap();
    assert_eq!(r.from, "cc");
    r.body
}

fn built(t: &TestWorld, body: Value) -> Value {
    let r = build(t, body);
    assert_eq!(r["type"], "built", "cc refused (clang + wasi-libc: scripts/ensure-wasi-clang): {r:#}");
    r
}

/// A C string literal holding `s`.
fn c_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[test]
fn the_console_builds_c_through_cc_and_spawns_it() {
    let t = TestWorld::new();
    let r = built(
        &t,
        json!({"type": "build", "name": "echo", "files": {
            "main.c": ECHO_C,
            "tests/echo.jsonl": "{\"send\": {\"q\": 1}}\n{\"expect\": {\"q\": 1}}\n"}}),
    );
    // Host paths for a native sender, under broker/builds/console/<name>.
    let wasm = r["wasm"].as_str().unwrap().to_owned();
    let source = r["source"].as_str().unwrap().to_owned();
    assert!(wasm.ends_with("broker/builds/console/echo/actor.wasm"), "{r}");
    assert!(std::path::Path::new(&source).join("tests/echo.jsonl").is_file(), "{r}");
    let s = t.req(json!({"type": "spawn", "id": "e", "wasm": wasm, "source": source, "built_by": "cc"}));
    assert_eq!(s["type"], "ok", "{s}");
    t.subscribe_console("e");
    t.w().send(Some("e"), None, None, json!({"from_cc": 1}));
    t.wait_for("echo from the cc-built actor", |m| m["from"] == "e" && m["body"] == json!({"from_cc": 1}));
    let meta: Value = serde_json::from_str(&t.read("broker/versions/e/1/meta.json")).unwrap();
    assert_eq!(meta["built_by"], "cc");
    assert!(t.root().join("actor/e/source/main.c").is_file());
    // A rebuild of the same name replaces the last build; its transcript
    // (tests/echo.jsonl) gates the upgrade.
    let r2 = built(&t, json!({"type": "build", "name": "echo", "source": source}));
    let u = t.req(json!({"type": "upgrade", "id": "e", "wasm": r2["wasm"], "source": r2["source"]}));
    assert_eq!((u["type"].as_str(), u["tests"].as_u64()), (Some("ok"), Some(1)), "{u}");
}

/// An actor built by `cc` that allocates 256 KiB and then prints: the
/// first large block of Debian's wasi-libc overwrote the WASI adapter's
/// state (its heap took the adapter's page), and the print trapped
/// ("assertion failed at adapter line 2857"); `cc` now exports a
/// `cabi_realloc` so the adapter's state is a block of the actor's own.
#[test]
fn a_cc_built_actor_may_malloc_without_breaking_its_wasi_adapter() {
    let t = TestWorld::new();
    let src = "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\nint main(void){char b[4096];while(fgets(b,sizeof b,stdin)){char*p=malloc(262145);if(!p)return 2;memset(p,'x',262144);p[262144]=0;printf(\"{\\\"body\\\":{\\\"len\\\":%zu}}\\n\",strlen(p));fflush(stdout);free(p);}return 0;}\n";
    let r = built(&t, json!({"type": "build", "name": "alloc", "files": {"main.c": src}}));
    let s = t.req(json!({"type": "spawn", "id": "alloc", "wasm": r["wasm"]}));
    assert_eq!(s["type"], "ok", "{s}");
    t.subscribe_console("alloc");
    for _ in 0..3 {
        t.w().send(Some("alloc"), None, None, json!("go"));
        t.wait_for("the allocation's answer", |m| m["from"] == "alloc" && m["body"]["len"] == 262144);
    }
    let log = t.read("actor/alloc/stderr.log");
    assert!(!log.contains("assertion failed"), "{log}");
}

#[test]
fn cc_reports_what_is_wrong() {
    let t = TestWorld::new();
    let r = build(&t, json!({"type": "build", "name": "bad", "files": {"main.c": "int main( {"}}));
    assert_eq!(r["type"], "build_failed", "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("error"), "{r}");
    assert!(r["reason"].as_str().unwrap().contains("clang exited"), "{r}");
    assert!(!t.root().join("broker/builds/console/bad").exists());
    for (body, says) in [
        (json!({"type": "build", "name": "x"}), "exactly one"),
        (json!({"type": "build", "name": "x", "files": {"a.c": ""}, "source": "/tmp"}), "exactly one"),
        (json!({"type": "build", "name": "../x", "files": {"a.c": ""}}), "build name"),
        (json!({"type": "build", "name": "x", "files": {"../a.c": ""}}), "refused"),
        (json!({"type": "build", "name": "x", "files": {"a.h": ""}}), "no .c file"),
        (json!({"type": "compile"}), "cc understands"),
    ] {
        let r = build(&t, body.clone());
        assert_eq!(r["type"], "build_failed", "{body} → {r}");
        assert!(r["reason"].as_str().unwrap().contains(says), "{body} → {r}");
    }
    // A reply to cc is never answered (no loops): the next request's
    // answer is the first one the console gets.
    t.w().send(Some("cc"), None, Some("console/nothing"), json!({"type": "build"}));
    let r = build(&t, json!({"type": "build", "name": "ok", "files": {"main.c": ECHO_C}}));
    assert_eq!(r["type"], "built", "{r}");
    assert!(t.w().recv(Duration::ZERO).is_none());
}

#[test]
fn an_actor_builds_through_cc_into_its_public_files_and_spawns_the_result() {
    let t = TestWorld::new();
    let build_req = json!({"to": "cc", "body": {"type": "build", "name": "child", "files": {"main.c": ECHO_C}}});
    let spawn_req = json!({"to": "broker", "body": {"type": "spawn", "id": "child", "wasm": "/public/cc/child/actor.wasm",
        "source": "/public/cc/child/source", "built_by": "cc"}});
    // The builder: a message from the console → a build request to cc;
    // cc's "built" → a spawn request to the broker; anything else is
    // echoed to its subscribers.
    let builder = format!(
        r#"#include <stdio.h>
#include <string.h>
int main(void) {{
    static char line[65536];
    while (fgets(line, sizeof line, stdin)) {{
        if (strstr(line, "\"from\":\"console\"")) puts({build});
        else if (strstr(line, "\"from\":\"cc\"") && strstr(line, "\"type\":\"built\"")) puts({spawn});
        else fputs(line, stdout);
        fflush(stdout);
    }}
    return 0;
}}
"#,
        build = c_str(&build_req.to_string()),
        spawn = c_str(&spawn_req.to_string()),
    );
    let r = built(&t, json!({"type": "build", "name": "builder", "files": {"main.c": builder}}));
    assert_eq!(t.req(json!({"type": "spawn", "id": "builder", "wasm": r["wasm"]}))["type"], "ok");
    t.subscribe_console("builder");
    t.w().send(Some("builder"), None, None, json!("go"));
    let (m, _) = t.wait_for("the broker's answer to the builder's spawn", |m| {
        m["from"] == "builder" && m["body"]["request"] == "spawn"
    });
    assert_eq!(m["body"]["type"], "ok", "{m}");
    // cc wrote into the builder's own public files, which every actor sees
    // as /actor/builder/public/cc/child/.
    assert!(t.root().join("actor/builder/public/cc/child/actor.wasm").is_file());
    let meta: Value = serde_json::from_str(&t.read("broker/versions/child/1/meta.json")).unwrap();
    assert_eq!((meta["built_by"].as_str(), meta["requested_by"].as_str()), (Some("cc"), Some("builder")));
    t.subscribe_console("child");
    t.w().send(Some("child"), None, None, json!({"hi": "child"}));
    t.wait_for("echo from the child", |m| m["from"] == "child" && m["body"] == json!({"hi": "child"}));
}

/// A file under `dir` (recursively, in name order) whose first line is
/// at least 12 bytes of text, and that line.
fn some_text_file(dir: &Path) -> Option<(std::path::PathBuf, String)> {
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let meta = std::fs::symlink_metadata(&p).ok()?;
        if meta.is_dir() {
            if let Some(found) = some_text_file(&p) {
                return Some(found);
            }
        } else if meta.is_file() && meta.len() < 1 << 20 {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let first = text.lines().next().unwrap_or("").trim().to_owned();
            if first.len() >= 12
                && first.is_ascii()
                && !first.contains('\t')
                && !first.contains('"')
                && !first.contains('\\')
            {
                return Some((p, first));
            }
        }
    }
    None
}

/// Issue 28: clang reads only its build directory, its own installation
/// and libraries, and the wasi sysroot. An `#include` of any other host
/// file finds nothing, so its content never comes back in clang's error
/// output: a file outside the system directories, `/etc/passwd`, a file
/// under `/usr/share/doc` (`/usr` is not visible whole), the environment
/// of this process (which runs the world, as `cairn world run` would:
/// provider keys live there), of the namespace's first process and of
/// clang itself: `/proc` is not visible at all. (clang reads a `/proc`
/// file as empty, procfs saying its size is 0, so before `/proc` was
/// covered those builds succeeded, showing nothing.)
#[test]
fn cc_cannot_read_host_files() {
    let t = TestWorld::new();
    // A host file outside every allowed directory (and outside /tmp,
    // which the sandbox replaces anyway), with a known line.
    let secret_dir = Path::new("/var/tmp").join(format!("cairn-cc-secret-{}", std::process::id()));
    std::fs::create_dir_all(&secret_dir).unwrap();
    let secret = secret_dir.join("key.txt");
    std::fs::write(&secret, "SECRET-LINE-4711 is not C\n").unwrap();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let first = passwd.lines().next().unwrap().to_owned();
    let (doc, doc_line) = some_text_file(Path::new("/usr/share/doc")).expect("a text file under /usr/share/doc");
    let me = format!("/proc/{}/environ", std::process::id());
    let my_env = std::fs::read(&me).unwrap();
    let my_first = String::from_utf8_lossy(my_env.split(|b| *b == 0).next().unwrap()).into_owned();
    for (path, needle) in [
        (secret.display().to_string(), "SECRET-LINE-4711".to_owned()),
        ("/etc/passwd".into(), first),
        (doc.display().to_string(), doc_line),
        (me, my_first),
        ("/proc/1/environ".into(), "PATH=".into()),
        ("/proc/self/environ".into(), "PATH=".into()),
    ] {
        let main = format!("#include \"{path}\"\nint main(void) {{ return 0; }}\n");
        let r = build(&t, json!({"type": "build", "name": "peek", "files": {"main.c": main}}));
        assert_eq!(r["type"], "build_failed", "{path}: {r}");
        let stderr = r["stderr"].as_str().unwrap();
        assert!(!stderr.contains(&needle), "{path} came back in clang's output: {stderr}");
        assert!(stderr.contains("file not found"), "{path}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&secret_dir);
    // Builds still work, with the sysroot's headers and libc.
    assert_eq!(built(&t, json!({"type": "build", "name": "ok", "files": {"main.c": ECHO_C}}))["type"], "built");
}
