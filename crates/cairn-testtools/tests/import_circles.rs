//! No import circle between the modules of any crate of the workspace.
//!
//! A circle (module a uses b, b uses c, c uses a) means none of them can be
//! read, tested or moved alone; issue 26 found five of them. This check
//! reads every `crate::…`, `super::…` and `self::…` path in each crate's
//! `src/` (use lines and paths written inline alike, comments and strings
//! left out), resolves each to the deepest module it names, and fails
//! naming every strongly connected group of modules.
//!
//! A module's use of its own ancestors (`use super::*` in a child, a test
//! module reading its file) is containment, not an import, and is not an
//! edge. The crate root (`lib.rs`, `main.rs`) is not a node: it declares
//! and re-exports modules and every module may name its re-exports.
//!
//! This is deliberately its own small reader, not `syn`: it must not share
//! code with what it checks, and it needs only paths.
//!
//! The same reader holds two more rules of the module layout, so what a
//! turn is given is decided in one place for every face: only cairn-host's
//! `running.rs` puts a turn's environment (core's `TurnEnv`) together, and
//! only cairn-runtime's `equip.rs` chooses a turn's tools.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`a::b`, root is "") → file.
type Modules = BTreeMap<String, PathBuf>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/").to_path_buf()
}

/// Every module file of the library or binary of `crate_dir` (not `src/bin`,
/// whose files are crate roots of their own).
fn modules(crate_dir: &Path) -> Modules {
    let src = crate_dir.join("src");
    let mut out = Modules::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else { continue };
        for entry in read.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path != src.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).expect("under src").with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|l| l == "mod") {
                parts.pop();
            }
            if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
                parts.clear();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// `text` with comments and the contents of string and char literals blanked
/// (newlines kept, so braces can be counted per line).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if b[i] == b'\n' {
                            out.push('\n');
                        }
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && (i == 0 || !is_ident(b[i - 1])) => {
                // Raw string r"…" / r#"…"#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == b'"' && b[j + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                        j += 1 + hashes;
                        break;
                    }
                    if b[j] == b'\n' {
                        out.push('\n');
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    } else if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A char literal ('x', '\n', '{') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    let end = b[i + 2..].iter().position(|&c| c == b'\'').map_or(b.len(), |p| i + 3 + p);
                    out.push_str("' '");
                    i = end;
                } else if b.get(i + 2) == Some(&b'\'') {
                    out.push_str("' '");
                    i += 3;
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The paths written in `code` as (inline module stack, segments), where the
/// first segment is `crate`, `super` or `self`. `use` groups are expanded one
/// level at a time (`crate::{a::X, b}` → `crate::a::X`, `crate::b`).
fn paths(code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    // Inline `mod name {` blocks: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'{' {
            depth += 1;
            if let Some(name) = pending_mod.take() {
                inline.push((name, depth));
            }
            i += 1;
            continue;
        }
        if c == b'}' {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        if c == b';' {
            pending_mod = None;
        }
        if !is_ident(c) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        let word = &code[start..i];
        if word == "mod" {
            let rest = code[i..].trim_start();
            let name: String = rest.chars().take_while(|&c| c.is_alphanumeric() || c == '_').collect();
            if !name.is_empty() {
                pending_mod = Some(name);
            }
            continue;
        }
        if !matches!(word, "crate" | "super" | "self") || !code[i..].starts_with("::") {
            continue;
        }
        let stack: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
        for p in expand(&code[start..], 0) {
            out.push((stack.clone(), p));
        }
        // Skip the rest of this path so its segments are not read again.
        while i < b.len() && (is_ident(b[i]) || b[i] == b':') {
            i += 1;
        }
    }
    out
}

/// The path (or `use` tree) at the start of `s` as lists of segments.
fn expand(s: &str, level: usize) -> Vec<Vec<String>> {
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        let r = rest.trim_start();
        let seg: String = r.chars().take_while(|&c| c.is_alphanumeric() || c == '_').collect();
        if seg.is_empty() {
            if r.starts_with('{') && level < 4 {
                // A group: split its top level on commas.
                let inner = &r[1..];
                let mut d = 0;
                let mut item_start = 0;
                let mut out = Vec::new();
                for (k, ch) in inner.char_indices() {
                    match ch {
                        '{' => d += 1,
                        '}' if d == 0 => {
                            for tail in expand(&inner[item_start..k], level + 1) {
                                out.push(segs.iter().cloned().chain(tail).collect());
                            }
                            return out;
                        }
                        '}' => d -= 1,
                        ',' if d == 0 => {
                            for tail in expand(&inner[item_start..k], level + 1) {
                                out.push(segs.iter().cloned().chain(tail).collect());
                            }
                            item_start = k + 1;
                        }
                        _ => {}
                    }
                }
                return out;
            }
            break;
        }
        rest = &r[seg.len()..];
        segs.push(seg);
        let r2 = rest.trim_start();
        if let Some(after) = r2.strip_prefix("::") {
            rest = after;
        } else {
            break;
        }
    }
    if segs.is_empty() { Vec::new() } else { vec![segs] }
}

/// The module a path from `from` (with inline modules `inline`) names: the
/// deepest existing module along it; `None` for the root or outside.
fn resolve(mods: &Modules, from: &str, inline: &[String], segs: &[String]) -> Option<String> {
    let mut base: Vec<String> = if from.is_empty() { Vec::new() } else { from.split("::").map(String::from).collect() };
    base.extend(inline.iter().cloned());
    let mut rest = segs;
    match segs.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &segs[1..];
        }
        Some("self") => rest = &segs[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut best = None;
    let mut cur = base.clone();
    if mods.contains_key(&cur.join("::")) && !cur.is_empty() {
        best = Some(cur.join("::"));
    }
    for s in rest {
        cur.push(s.clone());
        let key = cur.join("::");
        if mods.contains_key(&key) {
            best = Some(key);
        }
    }
    best
}

fn is_ancestor_or_self(anc: &str, m: &str) -> bool {
    anc == m || m.starts_with(&format!("{anc}::"))
}

/// Strongly connected groups of more than one module (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        on: BTreeSet<&'a str>,
        stack: Vec<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.edges.get(v) {
            for w in ws {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let l = t.low[w].min(t.low[v]);
                    t.low.insert(v, l);
                } else if t.on.contains(w) {
                    let l = t.index[w].min(t.low[v]);
                    t.low.insert(v, l);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut group = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                group.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                t.out.push(group);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The import graph of one crate.
fn graph(crate_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(crate_dir);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, file) in &mods {
        if m.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        let entry = edges.entry(m.clone()).or_default();
        for (inline, segs) in paths(&code_only(&text)) {
            let Some(to) = resolve(&mods, m, &inline, &segs) else { continue };
            if to.is_empty() || is_ancestor_or_self(&to, m) {
                continue;
            }
            entry.insert(to);
        }
    }
    edges
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(workspace())
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").exists() && p.join("src").is_dir())
        .collect();
    crates.sort();
    assert!(crates.len() >= 10, "expected the workspace's crates under {}", workspace().display());
    for dir in &crates {
        let edges = graph(dir);
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        for group in circles(&edges) {
            let inner: Vec<String> = group
                .iter()
                .map(|m| {
                    let uses: Vec<&str> = edges[m].iter().filter(|t| group.contains(t)).map(String::as_str).collect();
                    format!("    {m} -> {}", uses.join(", "))
                })
                .collect();
            found.push(format!("{name}: {} modules in a circle:\n{}", group.len(), inner.join("\n")));
        }
    }
    assert!(
        found.is_empty(),
        "import circles (break each by moving the shared piece to the module both need, or the user's piece beside its only user):\n{}",
        found.join("\n")
    );
}

/// Every face runs its turns through `cairn_host::Equipment`: no crate's
/// library or binary modules but cairn-core's (which defines it) and
/// cairn-host's `running.rs` build a `TurnEnv` (benchmarks, test drivers
/// and tests drive core directly and are not faces).
#[test]
fn only_the_host_crate_puts_a_turn_environment_together() {
    let found = uses_outside(
        |line| line.find("TurnEnv").is_some_and(|i| line[i + "TurnEnv".len()..].trim_start().starts_with('{')),
        &[("cairn-core", None), ("cairn-host", Some("running"))],
    );
    assert!(
        found.is_empty(),
        "a face builds core's TurnEnv itself; run the turn through cairn_host::Equipment instead:\n{}",
        found.join("\n")
    );
}

/// Every face equips a turn through cairn-runtime's `equip.rs` (the tools
/// read once, discovery's choice recorded, the family): no other module
/// calls discovery's `choose_for_turn`.
#[test]
fn only_equip_chooses_a_turns_tools() {
    let found = uses_outside(
        |line| line.contains("choose_for_turn("),
        &[("cairn-runtime", Some("equip")), ("cairn-runtime", Some("discover"))],
    );
    assert!(
        found.is_empty(),
        "a face chooses its turn's tools itself; call equip::turn instead:\n{}",
        found.join("\n")
    );
}

/// Issue 50.4: a session's usage is summed in one place, cairn-core's
/// `report` (`UsageTotals`), which every face reads: no other module adds
/// up an attempt's token fields, so a new usage field reaches them all.
#[test]
fn only_core_report_sums_usage() {
    let sums = |line: &str| {
        line.contains("+=")
            && ["input_tokens", "output_tokens", "cached_input_tokens"].iter().any(|f| line.contains(&format!(".{f}")))
    };
    let found = uses_outside(sums, &[("cairn-core", Some("report"))]);
    assert!(
        found.is_empty(),
        "a face sums usage itself; read cairn_core::report::UsageTotals instead:\n{}",
        found.join("\n")
    );
    // The check itself: it sees the sums the faces used to write.
    assert!(sums("                input += u.input_tokens;"));
    assert!(sums("self.totals.output_tokens += usage.output_tokens;"));
    assert!(!sums("let t = u.input_tokens + u.output_tokens;"));
}

/// Issue 50.3: a turn's tools are put in a face's registry by one loop,
/// cairn-host's `HostTools::registry_where` ("register each tool, note a
/// refusal"); a face that serves fewer tools (MCP hides Write tools) passes
/// it a filter. No other module keeps a registry's refusal of a tool
/// (`.register(…)` whose error is looked at): a stand-in registered
/// blindly (`let _ =`) or a test driver's `?` is not such a loop.
#[test]
fn the_register_loop_is_written_once() {
    let keeps_refusal = |line: &str| {
        line.contains(".register(")
            && (line.contains(".err()") || line.contains("Err(") || line.contains("map_err") || line.contains("match "))
    };
    let found = uses_outside(keeps_refusal, &[("cairn-core", None), ("cairn-host", Some(""))]);
    assert!(
        found.is_empty(),
        "a face registers a turn's tools itself; use cairn_host::HostTools::registry (or registry_where, with a \
         filter) instead:\n{}",
        found.join("\n")
    );
    // The check itself: it sees the loops the faces used to write, not a
    // register whose refusal is dropped or a session's fact being read.
    assert!(keeps_refusal("            if let Err(e) = registry.register(Arc::clone(tool)) {"));
    assert!(keeps_refusal("registry.register(tool).err().map(|e| format!(\"{} is not offered\", spec.name))"));
    assert!(!keeps_refusal("        let _ = registry.register(std::sync::Arc::new(NotRunHere::new(name)));"));
    assert!(!keeps_refusal("    let spec = store.register(FACT, SPEC_FACT).and_then(|r| r.parse().ok());"));
}

/// The lines (file:line) of every crate's library and binary modules,
/// code only, where `hit` holds, leaving out the `allowed` (crate, module;
/// `None`: the whole crate).
fn uses_outside(hit: impl Fn(&str) -> bool, allowed: &[(&str, Option<&str>)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(workspace()).expect("crates/").flatten() {
        let dir = entry.path();
        let name = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if !dir.join("src").is_dir() {
            continue;
        }
        crates += 1;
        for (module, path) in modules(&dir) {
            if allowed.iter().any(|(c, m)| *c == name && m.is_none_or(|m| m == module)) {
                continue;
            }
            let code = code_only(&std::fs::read_to_string(&path).expect("read a module"));
            for (n, line) in code.lines().enumerate() {
                if hit(line) {
                    found.push(format!("{}:{}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(crates >= 10, "expected the workspace's crates under {}", workspace().display());
    found
}

/// The reader itself, on a made-up crate: a circle through a use group, an
/// inline path and `super::` is found; ancestors, tests and strings are not
/// edges.
#[test]
fn the_reader_finds_a_planted_circle_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c; pub use a::X;").expect("write");
    std::fs::write(src.join("a/mod.rs"), "pub mod inner; pub struct X;\n").expect("write");
    std::fs::write(
        src.join("a/inner.rs"),
        "use super::X; // crate::c::Y in a comment\nfn f() -> &'static str { \"crate::c::Y\" }\nfn g() { crate::b::go(); }\n",
    )
    .expect("write");
    std::fs::write(src.join("b.rs"), "use crate::{c::{self, Y}, X};\npub fn go() {}\n").expect("write");
    std::fs::write(
        src.join("c.rs"),
        "pub struct Y;\n#[cfg(test)]\nmod tests { use super::*; use super::super::a::inner; }\n",
    )
    .expect("write");
    let edges = graph(dir.path());
    assert_eq!(edges["a::inner"], BTreeSet::from(["b".to_owned()]));
    assert_eq!(edges["b"], BTreeSet::from(["c".to_owned()]));
    assert_eq!(edges["c"], BTreeSet::from(["a::inner".to_owned()]));
    assert!(edges["a"].is_empty());
    assert_eq!(circles(&edges), vec![vec!["a::inner".to_owned(), "b".to_owned(), "c".to_owned()]]);
}

/// A crate that gathers its integration tests into one binary
/// (`autotests = false`, `tests/main.rs` declaring each file as a module)
/// compiles only the files `main.rs` names: a test file added beside it and
/// not declared there would never run, silently. Each `tests/*.rs` of such a
/// crate is either `main.rs`, a `[[test]]` target's own path, or a `mod`
/// line of `main.rs`.
#[test]
fn every_integration_test_file_is_compiled() {
    let mut unlisted = Vec::new();
    let mut gathered = 0;
    for entry in std::fs::read_dir(workspace()).expect("crates/") {
        let dir = entry.expect("crates/ entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        if !manifest.lines().any(|l| l.replace(' ', "") == "autotests=false") {
            continue;
        }
        gathered += 1;
        let main =
            std::fs::read_to_string(dir.join("tests/main.rs")).expect("an autotests = false crate has tests/main.rs");
        let declared: BTreeSet<String> =
            main.lines().filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';').map(str::to_owned)).collect();
        for file in std::fs::read_dir(dir.join("tests")).expect("tests/") {
            let path = file.expect("tests/ entry").path();
            let (Some(stem), Some("rs")) =
                (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|e| e.to_str()))
            else {
                continue;
            };
            let own_target = manifest.contains(&format!("path = \"tests/{stem}.rs\""));
            if stem != "main" && !own_target && !declared.contains(stem) {
                unlisted.push(path.display().to_string());
            }
        }
    }
    assert!(gathered > 0, "no crate gathers its tests into one binary: the check reads nothing");
    assert!(unlisted.is_empty(), "test files no binary compiles (add `mod NAME;` to tests/main.rs): {unlisted:?}");
}

/// The contents of the string literals of `text` (plain and raw), each with
/// the line it starts on; comments are skipped. Its own small reader, like
/// `code_only`, not shared with what it checks.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        match b[i] {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    line += usize::from(b[i] == b'\n');
                    i += 1;
                }
                i += 2;
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && (i == 0 || !is_ident(b[i - 1])) => {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let (start, at) = (j + 1, line);
                j += 1;
                while j < b.len()
                    && !(b[j] == b'"' && b[j + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes)
                {
                    line += usize::from(b[j] == b'\n');
                    j += 1;
                }
                out.push((at, String::from_utf8_lossy(&b[start..j.min(b.len())]).into_owned()));
                i = j + 1 + hashes;
            }
            b'"' => {
                let (start, at) = (i + 1, line);
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    line += usize::from(b.get(i) == Some(&b'\n'));
                    i += 1;
                }
                out.push((at, String::from_utf8_lossy(&b[start..i.min(b.len())]).into_owned()));
                i += 1;
            }
            b'\'' => {
                // A char literal ('"', '\'', '→') or a lifetime ('a): skipped.
                let next = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1) == Some(&b'\\') {
                    // Past the escaped character (it may be a quote).
                    i += 3;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else if b.get(i + 1 + next) == Some(&b'\'') {
                    i += 2 + next;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// The tables cairn keeps in PostgreSQL, read from cairn-pg's schema (its
/// `CREATE TABLE` lines).
fn pg_tables() -> Vec<String> {
    let schema = std::fs::read_to_string(workspace().join("cairn-pg/src/schema.rs")).expect("cairn-pg's schema.rs");
    let mut tables: Vec<String> = schema
        .split("CREATE TABLE ")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start().strip_prefix("IF NOT EXISTS ").unwrap_or(rest).trim_start();
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            name.starts_with("cairn_").then_some(name)
        })
        .collect();
    tables.sort();
    tables.dedup();
    tables
}

/// Whether a string literal is SQL on cairn's PostgreSQL tables, or a
/// statement sent through the PostgreSQL client.
fn is_pg_sql(literal: &str, tables: &[String], pg_file: bool) -> bool {
    let words: Vec<&str> = literal.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
    let names_a_table = words.iter().any(|w| tables.iter().any(|t| t == w));
    let statement = ["SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "LISTEN", "NOTIFY", "TRUNCATE", "DROP"];
    // An upper-case statement word first, then SQL's own structure (a
    // sentence may start with "SELECT" too).
    let first = literal.split_whitespace().next().unwrap_or("");
    let structure = [" FROM ", " INTO ", " SET ", " WHERE ", " TABLE ", " INDEX ", "$1", "pg_"];
    let starts_a_statement = statement.contains(&first)
        && (matches!(first, "LISTEN" | "NOTIFY") || structure.iter().any(|s| literal.contains(s)));
    names_a_table || (pg_file && starts_a_statement)
}

/// Issue 50.2: PostgreSQL's schema does not leak out of cairn-pg. Outside
/// it, no library or binary source (benchmarks' binaries too) holds SQL on
/// cairn's tables, and no file that uses the PostgreSQL client writes a
/// statement of its own: every statement is a function of cairn-pg.
/// (Tests may poke the database to plant faults; they are not read.)
#[test]
fn no_sql_outside_cairn_pg() {
    let tables = pg_tables();
    assert!(
        ["cairn_sessions", "cairn_lines", "cairn_inbox"].iter().all(|t| tables.iter().any(|x| x == t)),
        "the schema's tables were not found in cairn-pg/src/schema.rs: {tables:?}"
    );
    let mut found = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(workspace()).expect("crates/").flatten() {
        let dir = entry.path();
        if dir.file_name().is_some_and(|n| n == "cairn-pg") || !dir.join("src").is_dir() {
            continue;
        }
        let mut stack = vec![dir.join("src")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("a source dir").flatten() {
                let path = e.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|x| x != "rs") {
                    continue;
                }
                files += 1;
                let text = std::fs::read_to_string(&path).expect("read a source file");
                let pg_file = text.contains("postgres::") || text.contains("cairn_pg");
                for (line, literal) in string_literals(&text) {
                    if is_pg_sql(&literal, &tables, pg_file) {
                        found.push(format!(
                            "{}:{line}: {}",
                            path.display(),
                            literal.trim().lines().next().unwrap_or("")
                        ));
                    }
                }
            }
        }
    }
    assert!(files > 100, "expected the workspace's sources, read {files} files");
    assert!(
        found.is_empty(),
        "SQL outside cairn-pg (put the statement behind a function of cairn-pg: catalog.rs, fleet.rs, lease.rs, store.rs):\n{}",
        found.join("\n")
    );
}

/// The SQL reader itself: it finds statements in plain and raw strings,
/// not in comments, and not a word that merely looks like SQL.
#[test]
fn the_sql_reader_finds_planted_statements_only() {
    let tables = vec!["cairn_sessions".to_owned(), "cairn_inbox".to_owned()];
    let text = "use postgres::Client;\n// SELECT id FROM cairn_sessions\nfn f(c: &mut Client) {\n  c.query(\"SELECT 1 FROM cairn_sessions WHERE id = $1\", &[]);\n  c.execute(r#\"DELETE FROM cairn_inbox\"#, &[]);\n  c.batch_execute(\"LISTEN x\");\n  let _ = ('\"', \"Update the file\", \"SELECT a model\");\n}\n";
    let hits: Vec<usize> =
        string_literals(text).into_iter().filter(|(_, l)| is_pg_sql(l, &tables, true)).map(|(line, _)| line).collect();
    assert_eq!(hits, vec![4, 5, 6]);
}

/// The dependency names of the `[dependencies]` tables of a manifest (the
/// plain one and any `[target.….dependencies]`), with the path of each that
/// is a path dependency. Its own small reader of the manifest's lines.
fn dependencies(manifest: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            let table = line.trim_matches(|c| c == '[' || c == ']');
            in_deps = table == "dependencies" || (table.starts_with("target.") && table.ends_with(".dependencies"));
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, rest)) = line.split_once('=') else { continue };
        let name = name.trim().trim_end_matches(".workspace").to_owned();
        let path = rest.split_once("path = \"").and_then(|(_, p)| p.split_once('"')).map(|(p, _)| p.to_owned());
        out.push((name, path));
    }
    out
}

/// Issue 50.1: cairn-runtime's API is data, not the command line. Neither
/// it nor any crate it depends on through a path depends on clap (the
/// command line is the binary's: cairn-cli parses it and hands the runtime
/// plain settings).
#[test]
fn the_runtime_does_not_depend_on_clap() {
    let mut seen = BTreeSet::new();
    let mut stack = vec![workspace().join("cairn-runtime")];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        let Ok(dir) = dir.canonicalize() else { continue };
        if !seen.insert(dir.clone()) {
            continue;
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("a crate's Cargo.toml");
        for (name, path) in dependencies(&manifest) {
            if name == "clap" || name.starts_with("clap_") || name.starts_with("clap-") {
                found.push(format!("{}: {name}", dir.join("Cargo.toml").display()));
            }
            if let Some(path) = path {
                stack.push(dir.join(path));
            }
        }
    }
    assert!(seen.len() >= 5, "expected cairn-runtime and its path dependencies, read {}", seen.len());
    assert!(
        found.is_empty(),
        "cairn-runtime depends on clap (the flags are the CLI's: take plain settings, config::Overrides or a struct):\n{}",
        found.join("\n")
    );
    // The reader itself.
    let planted = "[package]\nname = \"x\"\n[dependencies]\nclap = { version = \"4\" }\ncairn-core.workspace = true\n\
                   y = { path = \"../y\" }\n[dev-dependencies]\nclap_complete = \"4\"\n";
    assert_eq!(
        dependencies(planted),
        vec![("clap".to_owned(), None), ("cairn-core".to_owned(), None), ("y".to_owned(), Some("../y".to_owned()))]
    );
}

/// Whether a line of code (comments and strings blanked) prints: a print
/// macro, or a handle on the process's stdout or stderr.
fn prints(line: &str) -> bool {
    let macros = ["println!", "eprintln!", "print!", "eprint!", "dbg!"];
    let at_word = |m: &str| {
        line.match_indices(m)
            .any(|(i, _)| i == 0 || !line.as_bytes()[i - 1].is_ascii_alphanumeric() && line.as_bytes()[i - 1] != b'_')
    };
    macros.iter().any(|m| at_word(m))
        || ["stdout()", "stderr()", "io::stdout", "io::stderr"].iter().any(|h| line.contains(h))
}

/// Issue 50.1: cairn-runtime returns data and the CLI prints it. No module
/// of cairn-runtime prints or holds the process's stdout or stderr: a
/// command's result is a value the CLI renders (text or `--json`), and a
/// note on the way (a skipped file, a worker's failed session) goes to the
/// embedder's `Notes`.
#[test]
fn the_runtime_does_not_print() {
    let mods = modules(&workspace().join("cairn-runtime"));
    assert!(mods.len() >= 10, "expected cairn-runtime's modules, found {}", mods.len());
    let mut found = Vec::new();
    for path in mods.values() {
        let code = code_only(&std::fs::read_to_string(path).expect("read a module"));
        for (n, line) in code.lines().enumerate() {
            if prints(line) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "cairn-runtime prints (return the data and print it in cairn-cli; send a note through ctx.notes):\n{}",
        found.join("\n")
    );
    // The check itself.
    assert!(prints("    eprintln!(\"x\");"));
    assert!(prints("let mut out = std::io::stdout().lock();"));
    assert!(prints("print!(\"{x}\")"));
    assert!(!prints("let s = reprint!(x); sprint!(y);"));
    assert!(!prints("writeln!(out, \"x\")?;"));
}
