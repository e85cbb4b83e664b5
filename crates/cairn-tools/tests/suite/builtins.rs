//! The in-process built-ins: ranges, refusals, gitignore, search caps,
//! diffs, guards and path confinement.

use cairn_core::tool::{GuardVerdict, Preview, Tool, ToolError, Validation};
use cairn_tools::{ToolsConfig, builtin_tools};
use serde_json::json;

use super::util::{request, run};

fn tool(name: &str) -> std::sync::Arc<dyn Tool> {
    builtin_tools(&ToolsConfig::default()).unwrap().into_iter().find(|e| e.tool.spec().name == name).unwrap().tool
}

#[test]
fn builtins_have_the_contract_names_and_tiers() {
    let entries = builtin_tools(&ToolsConfig::default()).unwrap();
    let names: Vec<_> = entries.iter().map(|e| e.tool.spec().name.clone()).collect();
    assert_eq!(names, ["read_file", "list_dir", "search", "write_file", "edit_file", "shell", "plan"]);
    for e in &entries {
        assert_eq!(e.origin.to_string(), "builtin");
        assert_eq!(e.tool.spec().input_schema["type"], "object");
    }
    use cairn_core::tool::Risk::*;
    let risks: Vec<_> = entries.iter().map(|e| e.tool.spec().risk).collect();
    assert_eq!(risks, [ReadOnly, ReadOnly, ReadOnly, Write, Write, Write, ReadOnly]);
}

/// `plan` records the model's plan in its receipt and touches nothing: no
/// capability, nothing written.
#[test]
fn plan_records_the_plan_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let plan = tool("plan");
    assert!(plan.spec().capabilities.is_empty());
    let entries = json!({"entries": [{"content": "a", "status": "completed"}, {"content": "b", "status": "pending"}]});
    let r = run(&*plan, entries, dir.path()).unwrap();
    assert!(r.output_summary.contains("1 of 2 steps done\n[x] a\n[ ] b"), "{}", r.output_summary);
    assert_eq!(
        r.structured_output.unwrap()["entries"][1],
        json!({"content": "b", "priority": "medium", "status": "pending"})
    );
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "plan wrote something");
}

#[test]
fn read_file_reads_ranges_and_refuses_binary_and_huge_files() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dir.path().join("a.txt"), &text).unwrap();
    let read = tool("read_file");
    let r = run(&*read, json!({"path": "a.txt", "offset": 3, "limit": 2}), dir.path()).unwrap();
    assert!(r.output_summary.contains("     3\tline 3\n     4\tline 4\n"), "{}", r.output_summary);
    assert!(!r.output_summary.contains("line 5\n"));
    assert!(r.output_summary.contains("6 more lines; read on with offset=5"));
    assert_eq!(r.structured_output.unwrap()["totalLines"], 10);

    std::fs::write(dir.path().join("long.txt"), format!("{}\nshort\n", "é".repeat(3000))).unwrap();
    let r = run(&*read, json!({"path": "long.txt"}), dir.path()).unwrap();
    assert!(r.output_summary.contains("… [line cut at 2000 of 6000 bytes]\n     2\tshort"), "{}", r.output_summary);

    std::fs::write(dir.path().join("bin.dat"), b"\x7fELF\x00\x01\x02").unwrap();
    let err = run(&*read, json!({"path": "bin.dat"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("binary file"), "{err}");

    let small = cairn_tools::builtin::files::ReadFile::new(&ToolsConfig { read_max_bytes: 10, ..Default::default() });
    let err = run(&small, json!({"path": "a.txt"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("read a range with offset and limit"), "{err}");
    assert!(run(&small, json!({"path": "a.txt", "offset": 9}), dir.path()).unwrap().output_summary.contains("line 10"));

    assert_eq!(
        read.validate(&request("read_file", json!({"path": "a", "offset": 0}))),
        Validation::Invalid("offset is 1-based: the first line is 1".into())
    );
    assert!(matches!(read.validate(&request("read_file", json!({"file": "a"}))), Validation::Invalid(_)));
}

#[test]
fn list_dir_hides_gitignored_entries() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".gitignore"), "target/\n*.log\n").unwrap();
    std::fs::create_dir(dir.path().join("target")).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("debug.log"), "x").unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "x").unwrap();
    let r = run(&*tool("list_dir"), json!({}), dir.path()).unwrap();
    let lines: Vec<&str> = r.output_summary.lines().collect();
    assert_eq!(lines, [".gitignore", "Cargo.toml", "src/"]);
}

#[test]
fn search_finds_matches_respects_gitignore_and_caps() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".gitignore"), "ignored/\n").unwrap();
    std::fs::create_dir(dir.path().join("ignored")).unwrap();
    std::fs::write(dir.path().join("ignored/x.rs"), "fn needle() {}\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/a.rs"), "fn a() {}\nfn needle() {}\n").unwrap();
    let many: String = (0..500).map(|i| format!("needle {i}\n")).collect();
    std::fs::write(dir.path().join("many.txt"), many).unwrap();
    let r = run(&*tool("search"), json!({"pattern": "fn needle", "path": "."}), dir.path()).unwrap();
    assert_eq!(r.output_summary, "src/a.rs:2:fn needle() {}\n");
    let r = run(&*tool("search"), json!({"pattern": "needle \\d+"}), dir.path()).unwrap();
    assert!(r.truncated);
    assert!(r.output_summary.contains("stopped at 200 matches"));
    assert_eq!(r.output_summary.lines().filter(|l| l.starts_with("many.txt:")).count(), 200);
    assert!(matches!(tool("search").validate(&request("search", json!({"pattern": "("}))), Validation::Invalid(_)));
}

#[test]
fn write_file_previews_a_diff_writes_and_guards() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), "one\ntwo\n").unwrap();
    let write = tool("write_file");
    let req = request("write_file", json!({"path": "f.txt", "content": "one\nthree\n"}));
    match write.preview(&req, dir.path()) {
        Some(Preview::Diff { path, diff }) => {
            assert_eq!(path, "f.txt");
            assert!(diff.contains("-two\n+three\n"), "{diff}");
        }
        other => panic!("expected a diff, got {other:?}"),
    }
    assert_eq!(write.guard(&req, dir.path()), GuardVerdict::NotDone);
    let r = run(&*write, req.arguments.clone(), dir.path()).unwrap();
    assert!(r.structured_output.unwrap()["diff"].as_str().unwrap().contains("+three"));
    assert_eq!(std::fs::read_to_string(dir.path().join("f.txt")).unwrap(), "one\nthree\n");
    assert!(matches!(write.guard(&req, dir.path()), GuardVerdict::AlreadyDone(_)));
    // New files in new directories.
    run(&*write, json!({"path": "new/dir/g.txt", "content": "g"}), dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("new/dir/g.txt")).unwrap(), "g");
}

#[test]
fn edit_file_replaces_exactly_once_and_applies_patches() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.rs");
    std::fs::write(&f, "let a = 1;\nlet b = 1;\nlet c = 2;\n").unwrap();
    let edit = tool("edit_file");
    let err = run(&*edit, json!({"path": "f.rs", "old": "= 1;", "new": "= 3;"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("occurs 2 times"), "{err}");
    let err = run(&*edit, json!({"path": "f.rs", "old": "let z", "new": "x"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    let args = json!({"path": "f.rs", "old": "let b = 1;", "new": "let b = 7;"});
    let r = run(&*edit, args.clone(), dir.path()).unwrap();
    assert!(r.output_summary.contains("-let b = 1;\n+let b = 7;"), "{}", r.output_summary);
    assert!(matches!(edit.guard(&request("edit_file", args), dir.path()), GuardVerdict::AlreadyDone(_)));

    let patch = "--- a/f.rs\n+++ b/f.rs\n@@ -1,3 +1,3 @@\n let a = 1;\n let b = 7;\n-let c = 2;\n+let c = 9;\n";
    let preq = request("edit_file", json!({"path": "f.rs", "patch": patch}));
    assert_eq!(edit.guard(&preq, dir.path()), GuardVerdict::NotDone);
    run(&*edit, preq.arguments.clone(), dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "let a = 1;\nlet b = 7;\nlet c = 9;\n");
    assert!(matches!(edit.guard(&preq, dir.path()), GuardVerdict::AlreadyDone(_)));
    let err = run(&*edit, preq.arguments.clone(), dir.path()).unwrap_err();
    assert!(err.to_string().contains("does not apply"), "{err}");
    assert!(matches!(
        edit.validate(&request("edit_file", json!({"path": "f.rs", "old": "a", "patch": "x"}))),
        Validation::Invalid(_)
    ));
}

#[test]
fn builtins_refuse_dotdot_absolute_symlink_and_proc_escapes() {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    let home = root.path().join("home");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("secret.txt"), "TOP SECRET").unwrap();
    std::os::unix::fs::symlink(&home, cwd.join("homelink")).unwrap();
    std::os::unix::fs::symlink(home.join("secret.txt"), cwd.join("secret-link")).unwrap();
    let via_proc = format!("/proc/self/root{}", home.join("secret.txt").display());
    let read = tool("read_file");
    for path in [
        "../home/secret.txt",
        "homelink/secret.txt",
        "secret-link",
        via_proc.as_str(),
        home.join("secret.txt").to_str().unwrap(),
    ] {
        let err = run(&*read, json!({"path": path}), &cwd).unwrap_err();
        assert!(matches!(err, ToolError::AccessDenied(_)), "{path}: {err}");
        assert!(!err.to_string().contains("TOP SECRET"));
    }
    let write = tool("write_file");
    for path in ["homelink/new.txt", "../home/new.txt", "secret-link"] {
        let err = run(&*write, json!({"path": path, "content": "x"}), &cwd).unwrap_err();
        assert!(matches!(err, ToolError::AccessDenied(_)), "{path}: {err}");
    }
    assert!(!home.join("new.txt").exists());
    assert_eq!(std::fs::read_to_string(home.join("secret.txt")).unwrap(), "TOP SECRET");
    let err = run(&*tool("search"), json!({"pattern": "SECRET", "path": "homelink"}), &cwd).unwrap_err();
    assert!(matches!(err, ToolError::AccessDenied(_)));
    let err = run(&*tool("list_dir"), json!({"path": "/"}), &cwd).unwrap_err();
    assert!(matches!(err, ToolError::AccessDenied(_)));
    // A search of the whole tree does not follow the link out either.
    let r = run(&*tool("search"), json!({"pattern": "SECRET"}), &cwd).unwrap();
    assert!(!r.output_summary.contains("TOP SECRET"), "{}", r.output_summary);
}

#[test]
fn tools_config_reads_from_a_partial_table() {
    let config: ToolsConfig = toml::from_str("allow_unsandboxed = true\nsearch_max_matches = 5\n").unwrap();
    assert!(config.allow_unsandboxed);
    assert_eq!(config.search_max_matches, 5);
    assert_eq!(config.destructive_patterns, ToolsConfig::default().destructive_patterns);
    assert!(toml::from_str::<ToolsConfig>("alow_unsandboxed = true").is_err());
}

#[test]
fn pipes_and_devices_are_refused_instead_of_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let err = run(&*tool("read_file"), json!({"path": "fifo"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let err = run(&*tool("write_file"), json!({"path": "fifo", "content": "x"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let err = run(&*tool("edit_file"), json!({"path": "fifo", "old": "a", "new": "b"}), dir.path()).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}
