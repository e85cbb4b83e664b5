//! Staged `shell` runs read back from their overlay: the exact change set
//! of deletions, renames, new directories, edits, mode changes and
//! symlinks; a concurrent change to the tree makes the apply refuse
//! (nothing applied); applying a change set twice equals applying it once.
//! Oracles are spelled out by hand per case.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cairn_core::CancelToken;
use cairn_core::staged::{ChangeKind, ChangeSet, EntryKind, StagedDecision, StagedReview};
use cairn_core::tool::{Tool, ToolContext, ToolError, ToolReceipt};
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::shell::Shell;
use serde_json::json;

use super::util::{install_tool, limits, metadata, request};

fn require_staging() {
    if let Err(why) = cairn_tools::staging::overlay_status() {
        panic!("overlay staging is not available here, so this test cannot run: {why}");
    }
}

/// Run `command` staged in `cwd`; `decide` sees the change set and answers.
fn staged_run(
    cwd: &Path,
    command: &str,
    decide: impl FnMut(&ChangeSet) -> StagedDecision,
) -> (Result<ToolReceipt, ToolError>, Option<ChangeSet>) {
    let staging = tempfile::tempdir().unwrap();
    let shell =
        Shell::new(&ToolsConfig { staging_dir: Some(staging.path().to_path_buf()), ..ToolsConfig::default() }).unwrap();
    let r = run_tool(&shell, cwd, json!({ "command": command }), decide);
    // Every staging directory is gone afterwards, applied or not.
    assert_eq!(std::fs::read_dir(staging.path()).unwrap().count(), 0, "staging left behind");
    r
}

/// Run `tool` in `cwd`; `decide` sees the change set and answers.
fn run_tool(
    tool: &dyn Tool,
    cwd: &Path,
    arguments: serde_json::Value,
    mut decide: impl FnMut(&ChangeSet) -> StagedDecision,
) -> (Result<ToolReceipt, ToolError>, Option<ChangeSet>) {
    let mut seen = None;
    let result = {
        let mut output = |_: &[u8]| {};
        let mut bypass = |_: &str| false;
        let mut review = |r: &StagedReview<'_>| {
            seen = Some(r.changes.clone());
            decide(r.changes)
        };
        let cancel = CancelToken::new();
        let mut ctx = ToolContext {
            cwd,
            cancel: &cancel,
            limits: limits(),
            output: &mut output,
            approve_bypass: &mut bypass,
            review_staged: &mut review,
            elicit: &mut |_, _| cairn_core::elicit::nobody(),
        };
        tool.execute(&request(&tool.spec().name, arguments), &mut ctx)
    };
    (result, seen)
}

fn fixture(dir: &Path) {
    std::fs::write(dir.join("keep.txt"), "keep\n").unwrap();
    std::fs::create_dir(dir.join("dir1")).unwrap();
    std::fs::write(dir.join("dir1/a"), "a\n").unwrap();
    std::fs::write(dir.join("f.txt"), "1\n2\n3\n4\n").unwrap();
    std::fs::write(dir.join("g.txt"), "g\n").unwrap();
    std::fs::set_permissions(dir.join("g.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(dir.join("same.txt"), "same\n").unwrap();
}

#[test]
fn the_change_set_is_exactly_what_the_command_did() {
    require_staging();
    let cwd = tempfile::tempdir().unwrap();
    fixture(cwd.path());
    let command = "rm keep.txt; mv dir1 dir2; mkdir -p newdir && echo n > newdir/x; echo 5 >> f.txt; \
                   chmod 600 g.txt; ln -s f.txt link; touch same.txt; cat same.txt > /dev/null";
    let (result, seen) = staged_run(cwd.path(), command, |_| StagedDecision::Discard { reason: "look only".into() });
    assert!(matches!(result, Err(ToolError::Rejected(ref r)) if r == "look only"), "{result:?}");
    let set = seen.expect("reviewed");
    let got: Vec<(String, ChangeKind)> = set.changes.iter().map(|c| (c.path.clone(), c.kind)).collect();
    let want: Vec<(String, ChangeKind)> = [
        ("dir1", ChangeKind::Deleted),
        ("dir1/a", ChangeKind::Deleted),
        ("dir2", ChangeKind::Created),
        ("dir2/a", ChangeKind::Created),
        ("f.txt", ChangeKind::Modified),
        ("g.txt", ChangeKind::Modified),
        ("keep.txt", ChangeKind::Deleted),
        ("link", ChangeKind::Created),
        ("newdir", ChangeKind::Created),
        ("newdir/x", ChangeKind::Created),
    ]
    .iter()
    .map(|(p, k)| (p.to_string(), *k))
    .collect();
    assert_eq!(got, want, "same.txt (touched, unchanged) is not a change");
    let f = set.changes.iter().find(|c| c.path == "f.txt").unwrap();
    assert_eq!(f.lines, Some((4, 4)), "an append keeps every old line");
    assert_eq!(f.after.as_ref().unwrap().size, 10);
    let g = set.changes.iter().find(|c| c.path == "g.txt").unwrap();
    assert_eq!((g.before.as_ref().unwrap().mode, g.after.as_ref().unwrap().mode), (0o644, 0o600));
    assert_eq!(set.changes.iter().find(|c| c.path == "link").unwrap().after.as_ref().unwrap().kind, EntryKind::Symlink);
    // Discarded: the real tree is untouched.
    assert!(cwd.path().join("keep.txt").exists() && cwd.path().join("dir1/a").exists());
    assert!(!cwd.path().join("newdir").exists());
}

#[test]
fn an_approved_change_set_applies_exactly() {
    require_staging();
    let cwd = tempfile::tempdir().unwrap();
    fixture(cwd.path());
    let command = "rm keep.txt; mv dir1 dir2; echo 5 >> f.txt; ln -s f.txt link";
    let (result, _) = staged_run(cwd.path(), command, |_| StagedDecision::Apply { by: "test".into() });
    let receipt = result.unwrap();
    assert!(receipt.affected_entities.contains(&"keep.txt".to_owned()), "{:?}", receipt.affected_entities);
    let p = cwd.path();
    assert!(!p.join("keep.txt").exists() && !p.join("dir1").exists());
    assert_eq!(std::fs::read_to_string(p.join("dir2/a")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(p.join("f.txt")).unwrap(), "1\n2\n3\n4\n5\n");
    assert_eq!(std::fs::read_link(p.join("link")).unwrap(), Path::new("f.txt"));
    // No temporary file of the apply is left.
    let names: Vec<String> =
        std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.contains("cairn-apply")), "{names:?}");
}

#[test]
fn a_concurrent_change_to_the_tree_stops_the_apply_before_anything() {
    require_staging();
    let cwd = tempfile::tempdir().unwrap();
    fixture(cwd.path());
    let p = cwd.path().to_path_buf();
    let (result, _) = staged_run(cwd.path(), "rm keep.txt; echo 5 >> f.txt", |_| {
        // Someone edits f.txt while the command's effect waits for review.
        std::fs::write(p.join("f.txt"), "edited by someone else\n").unwrap();
        StagedDecision::Apply { by: "test".into() }
    });
    let err = result.unwrap_err().to_string();
    assert!(err.contains("f.txt") && err.contains("nothing was applied"), "{err}");
    assert!(p.join("keep.txt").exists(), "the deletion was not applied either");
    assert_eq!(std::fs::read_to_string(p.join("f.txt")).unwrap(), "edited by someone else\n");
}

#[test]
fn applying_twice_equals_applying_once() {
    let base = tempfile::tempdir().unwrap();
    let (lower, upper) = (base.path().join("lower"), base.path().join("upper"));
    std::fs::create_dir_all(lower.join("d")).unwrap();
    std::fs::create_dir_all(upper.join("d")).unwrap();
    std::fs::write(lower.join("d/old"), "old\n").unwrap();
    std::fs::write(upper.join("d/old"), "old\nnew\n").unwrap();
    std::fs::write(upper.join("d/new"), "new\n").unwrap();
    let set = cairn_tools::staging::read_layer(&upper, &lower).unwrap();
    assert_eq!(set.changes.len(), 2, "{set:?}");
    cairn_tools::staging::apply(&set, &upper, &lower, cairn_tools::staging::Writers::Gone).unwrap();
    let once = (std::fs::read(lower.join("d/old")).unwrap(), std::fs::read(lower.join("d/new")).unwrap());
    cairn_tools::staging::apply(&set, &upper, &lower, cairn_tools::staging::Writers::Gone).unwrap();
    std::fs::remove_dir_all(&upper).unwrap();
    // Even without the staging layer, a finished apply applies again (no-op).
    cairn_tools::staging::apply(&set, &upper, &lower, cairn_tools::staging::Writers::Gone).unwrap();
    let twice = (std::fs::read(lower.join("d/old")).unwrap(), std::fs::read(lower.join("d/new")).unwrap());
    assert_eq!(once, twice);
    assert_eq!(twice, (b"old\nnew\n".to_vec(), b"new\n".to_vec()));
}

#[test]
fn an_external_tool_that_declares_file_write_runs_staged_too() {
    require_staging();
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    std::fs::create_dir(&cwd).unwrap();
    fixture(&cwd);
    let meta = install_tool(
        &root.path().join("tools"),
        "cleaner",
        "#!/bin/bash\nrm -f keep.txt\necho made > made.txt\necho '{\"ok\": true}'\n",
        &metadata("write", &["fileRead", "fileWrite", "processSpawn"], ""),
    );
    let staging = tempfile::tempdir().unwrap();
    let config = ToolsConfig { staging_dir: Some(staging.path().to_path_buf()), ..ToolsConfig::default() };
    let tool = cairn_tools::ExternalTool::load(&meta, &config).unwrap();
    // Discarded: the deletion never reaches the tree.
    let (result, seen) = run_tool(&tool, &cwd, json!({}), |_| StagedDecision::Discard { reason: "no".into() });
    assert!(matches!(result, Err(ToolError::Rejected(_))), "{result:?}");
    let set = seen.expect("reviewed");
    let paths: Vec<&str> = set.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["keep.txt", "made.txt"]);
    assert!(cwd.join("keep.txt").exists() && !cwd.join("made.txt").exists());
    // Approved: applied, and the settlement says how it ran.
    let (result, _) = run_tool(&tool, &cwd, json!({}), |_| StagedDecision::Apply { by: "test".into() });
    let receipt = result.unwrap();
    assert!(!cwd.join("keep.txt").exists() && cwd.join("made.txt").exists());
    let out = receipt.structured_output.unwrap();
    assert_eq!(out["ok"], true, "the tool's own output is kept: {out}");
    assert_eq!(out["staging"]["mode"], "overlay", "{out}");
    assert_eq!(receipt.affected_entities, ["keep.txt", "made.txt"]);
    assert_eq!(std::fs::read_dir(staging.path()).unwrap().count(), 0, "staging left behind");
}

/// A link in the real tree where the command made a directory: reading
/// the change set must not follow it (issue 25). Without that, the file
/// beyond the link was read as the "before" state, and its content shown in
/// the diff a person (and the log) sees.
#[test]
fn reading_the_change_set_never_follows_a_link_of_the_tree() {
    let base = tempfile::tempdir().unwrap();
    let outside = base.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "TOP SECRET LINE\n").unwrap();
    let (lower, upper) = (base.path().join("lower"), base.path().join("upper"));
    std::fs::create_dir(&lower).unwrap();
    std::os::unix::fs::symlink(&outside, lower.join("link")).unwrap();
    std::fs::create_dir_all(upper.join("link")).unwrap();
    std::fs::write(upper.join("link/secret.txt"), "hi\n").unwrap();
    let set = cairn_tools::staging::read_layer(&upper, &lower).unwrap();
    let secret = set.changes.iter().find(|c| c.path == "link/secret.txt").unwrap();
    assert_eq!(secret.kind, ChangeKind::Created, "the file beyond the link was read: {secret:?}");
    assert!(secret.before.is_none());
    let diff = cairn_tools::staging::render_diff(&set, &upper, &lower, 1 << 16);
    assert!(!diff.contains("TOP SECRET"), "{diff}");
    // Applying it replaces the link, and never writes through it.
    cairn_tools::staging::apply(&set, &upper, &lower, cairn_tools::staging::Writers::Gone).unwrap();
    assert_eq!(std::fs::read_to_string(outside.join("secret.txt")).unwrap(), "TOP SECRET LINE\n");
    assert!(std::fs::symlink_metadata(lower.join("link")).unwrap().is_dir());
    assert_eq!(std::fs::read_to_string(lower.join("link/secret.txt")).unwrap(), "hi\n");
}

/// A link planted in a directory of the tree between the review and the
/// apply (where the change set creates a file below it) is refused, and
/// nothing lands beyond it.
#[test]
fn a_link_planted_after_the_review_stops_the_apply() {
    let base = tempfile::tempdir().unwrap();
    let outside = base.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let (lower, upper) = (base.path().join("lower"), base.path().join("upper"));
    std::fs::create_dir_all(lower.join("d")).unwrap();
    std::fs::create_dir_all(upper.join("d")).unwrap();
    std::fs::write(upper.join("d/new.txt"), "new\n").unwrap();
    let set = cairn_tools::staging::read_layer(&upper, &lower).unwrap();
    std::fs::remove_dir(lower.join("d")).unwrap();
    std::os::unix::fs::symlink(&outside, lower.join("d")).unwrap();
    assert!(cairn_tools::staging::apply(&set, &upper, &lower, cairn_tools::staging::Writers::Gone).is_err());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "the apply wrote beyond the link");
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Putting back the version git stores over uncommitted lines is
/// Destructive, though it keeps most lines (`git checkout -- f`); the
/// store is read as files, loose objects and pack indexes alike (git
/// itself is the oracle: `git gc` packs, `git count-objects` says so).
#[test]
fn discarding_uncommitted_work_is_destructive_loose_or_packed() {
    require_staging();
    for packed in [false, true] {
        let cwd = tempfile::tempdir().unwrap();
        let notes: String = (1..=10).map(|i| format!("note {i}\n")).collect();
        std::fs::write(cwd.path().join("notes.txt"), &notes).unwrap();
        git(cwd.path(), &["init", "-q"]);
        git(cwd.path(), &["add", "-A"]);
        git(cwd.path(), &["commit", "-qm", "base"]);
        if packed {
            git(cwd.path(), &["gc", "-q"]);
            let counts = git(cwd.path(), &["count-objects", "-v"]);
            assert!(counts.contains("\ncount: 0\n") || counts.starts_with("count: 0\n"), "{counts}");
            assert!(!counts.contains("in-pack: 0"), "{counts}");
        }
        std::fs::write(cwd.path().join("notes.txt"), format!("{notes}uncommitted one\nuncommitted two\n")).unwrap();
        // An ordinary edit of the same file stays Write.
        let (result, seen) = staged_run(cwd.path(), "sed -i 's/note 3/NOTE 3/' notes.txt", |_| {
            StagedDecision::Discard { reason: "test".into() }
        });
        assert!(result.is_err());
        let set = seen.unwrap();
        assert_eq!(
            set.judge(&Default::default(), cwd.path()).risk,
            cairn_core::tool::Risk::Write,
            "packed={packed}: {set:?}"
        );
        let (result, seen) = staged_run(cwd.path(), "HOME=$PWD git checkout -- notes.txt", |_| {
            StagedDecision::Discard { reason: "test".into() }
        });
        assert!(result.is_err(), "packed={packed}: {result:?}");
        let set = seen.unwrap();
        let judged = set.judge(&Default::default(), cwd.path());
        assert_eq!(judged.risk, cairn_core::tool::Risk::Destructive, "packed={packed}: {set:?}");
        assert!(judged.reasons.iter().any(|r| r.contains("discards uncommitted")), "{judged:?}");
        // Once the work is committed, putting back a committed version
        // loses nothing: a readable edit, Write.
        git(cwd.path(), &["commit", "-qam", "ideas"]);
        let (result, seen) = staged_run(cwd.path(), "HOME=$PWD git show HEAD~1:notes.txt > notes.txt", |_| {
            StagedDecision::Discard { reason: "test".into() }
        });
        assert!(result.is_err());
        let set = seen.unwrap();
        assert_eq!(
            set.judge(&Default::default(), cwd.path()).risk,
            cairn_core::tool::Risk::Write,
            "packed={packed}: {set:?}"
        );
    }
}

/// A tree nested deeper than cairn reads is refused whole, without
/// recursing until the stack runs out.
#[test]
fn a_tree_nested_too_deep_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let (lower, upper) = (base.path().join("lower"), base.path().join("upper"));
    std::fs::create_dir(&lower).unwrap();
    let deep: std::path::PathBuf = std::iter::repeat_n("d", 300).collect();
    std::fs::create_dir_all(upper.join(&deep)).unwrap();
    let err = cairn_tools::staging::read_layer(&upper, &lower).unwrap_err().to_string();
    assert!(err.contains("levels deep") && err.contains("nothing was applied"), "{err}");
}

/// Modes that lock the owner out, as the command left them: read back
/// exactly (a non-root cairn opens its own staging layer up to read it,
/// see the non-root rerun of this suite), and applied last, so a new
/// read-only directory still gets its files.
#[test]
fn modes_that_lock_the_owner_out_are_read_and_applied_exactly() {
    require_staging();
    let cwd = tempfile::tempdir().unwrap();
    fixture(cwd.path());
    let (result, seen) = staged_run(cwd.path(), "chmod 000 dir1/a && chmod 000 dir1 && chmod 000 keep.txt", |_| {
        StagedDecision::Discard { reason: "test".into() }
    });
    assert!(result.is_err());
    let set = seen.unwrap();
    let mode_of = |p: &str| set.changes.iter().find(|c| c.path == p).and_then(|c| c.after.as_ref()).map(|a| a.mode);
    assert_eq!((mode_of("dir1"), mode_of("dir1/a"), mode_of("keep.txt")), (Some(0), Some(0), Some(0)), "{set:?}");
    assert_eq!(set.judge(&Default::default(), cwd.path()).risk, cairn_core::tool::Risk::Destructive);

    let (result, _) = staged_run(cwd.path(), "mkdir -p ro/in && echo x > ro/in/f && chmod 555 ro/in ro", |_| {
        StagedDecision::Apply { by: "test".into() }
    });
    result.unwrap();
    let mode = |p: &str| std::fs::metadata(cwd.path().join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode("ro"), mode("ro/in"), mode("ro/in/f")), (0o555, 0o555, 0o644));
    assert_eq!(std::fs::read_to_string(cwd.path().join("ro/in/f")).unwrap(), "x\n");
    for d in ["ro/in", "ro"] {
        std::fs::set_permissions(cwd.path().join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Issue 49.10: created files are moved from the staging layer into the
/// tree rather than copied, but only when nothing of the command can
/// still write them. A writer that still holds a staged file open (a
/// command's background child, had it outlived the command) must never
/// reach the tree: with `Writers::Unknown` the file is copied, and what
/// the writer adds afterwards stays in the layer. With `Writers::Gone` the
/// file is moved, and is the inode that was hashed.
#[test]
fn a_lingering_writer_of_the_layer_never_reaches_the_tree() {
    use cairn_tools::staging::{Writers, apply, read_layer};
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt as _;
    let base = tempfile::tempdir().unwrap();
    let (lower, upper) = (base.path().join("lower"), base.path().join("upper"));
    std::fs::create_dir_all(&lower).unwrap();
    std::fs::create_dir_all(upper.join("out")).unwrap();
    std::fs::write(upper.join("out/new.txt"), "reviewed\n").unwrap();
    std::fs::write(upper.join("moved.txt"), "moved\n").unwrap();
    let set = read_layer(&upper, &lower).unwrap();
    let mut writer = std::fs::OpenOptions::new().append(true).open(upper.join("out/new.txt")).unwrap();
    let moved_inode = std::fs::metadata(upper.join("moved.txt")).unwrap().ino();
    // Unknown writers: copied.
    let only_new = ChangeSet { changes: set.changes.iter().filter(|c| c.path != "moved.txt").cloned().collect() };
    apply(&only_new, &upper, &lower, Writers::Unknown).unwrap();
    writer.write_all(b"late, unreviewed\n").unwrap();
    writer.sync_all().unwrap();
    assert_eq!(
        std::fs::read_to_string(lower.join("out/new.txt")).unwrap(),
        "reviewed\n",
        "the late write reached the tree"
    );
    assert!(upper.join("out/new.txt").exists(), "copied, so the layer keeps its file");
    // No writers: moved, and it is the file that was hashed.
    apply(&set, &upper, &lower, Writers::Gone).unwrap();
    assert_eq!(std::fs::read_to_string(lower.join("moved.txt")).unwrap(), "moved\n");
    assert_eq!(std::fs::metadata(lower.join("moved.txt")).unwrap().ino(), moved_inode, "not moved");
    assert!(!upper.join("moved.txt").exists());
}

/// Issue 49.10, through the sandbox: a command whose background child
/// keeps writing the file it created after the command returns. The
/// child dies with the command's PID namespace before the change set is
/// read, so what is applied is what was reviewed, and the tree's file
/// does not change afterwards.
#[test]
fn a_background_writer_of_a_staged_command_never_reaches_the_tree() {
    require_staging();
    let cwd = tempfile::tempdir().unwrap();
    let command = "exec 3>>out.txt; echo reviewed >&3; \
                   (trap '' HUP TERM; while :; do echo late >&3; sleep 0.01; done) </dev/null >/dev/null 2>&1 & \
                   sleep 0.1";
    let (result, seen) = staged_run(cwd.path(), command, |_| StagedDecision::Apply { by: "test".into() });
    result.unwrap();
    let set = seen.expect("reviewed");
    let reviewed = set.changes.iter().find(|c| c.path == "out.txt").and_then(|c| c.after.clone()).unwrap();
    let sha = |bytes: &[u8]| {
        use sha2::Digest as _;
        sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let applied = std::fs::read(cwd.path().join("out.txt")).unwrap();
    assert_eq!(sha(&applied), reviewed.sha256, "the tree holds bytes nobody reviewed");
    // Long enough for a surviving writer (one line per 10 ms) to show.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(std::fs::read(cwd.path().join("out.txt")).unwrap(), applied, "a writer outlived the command");
}

/// Issue 49.10: a created file the apply could move but whose move would
/// not equal a copy is copied: two names of one inode (a hard link made by
/// the command) become two files, as before.
#[test]
fn hard_linked_staged_files_are_copied_not_moved() {
    use std::os::unix::fs::MetadataExt as _;
    let base = tempfile::tempdir().unwrap();
    let (lower, upper) = (base.path().join("lower"), base.path().join("upper"));
    std::fs::create_dir_all(&lower).unwrap();
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::write(upper.join("a"), "one inode\n").unwrap();
    std::fs::hard_link(upper.join("a"), upper.join("b")).unwrap();
    let set = cairn_tools::staging::read_layer(&upper, &lower).unwrap();
    cairn_tools::staging::apply(&set, &upper, &lower, cairn_tools::staging::Writers::Gone).unwrap();
    let (a, b) = (std::fs::metadata(lower.join("a")).unwrap(), std::fs::metadata(lower.join("b")).unwrap());
    assert_ne!(a.ino(), b.ino(), "the two names share an inode in the tree");
    assert_eq!((a.nlink(), b.nlink()), (1, 1));
    assert!(upper.join("a").exists() && upper.join("b").exists(), "moved out of the layer");
}

/// Issue 49.10: the diff of a staged run's created files is made from the
/// bytes the change-set reader hashed (read once), up to the diff's
/// budget, and from the layer past it; either way a person sees every
/// created text file's lines and a binary file's size and hash. The
/// expected text is spelled out by hand.
#[test]
fn the_diff_of_created_files_shows_what_they_hold() {
    require_staging();
    let cwd = tempfile::tempdir().unwrap();
    // `big.bin` (60 KiB with a NUL: binary) uses most of the 64 KiB the
    // reader keeps, so `z.txt` (8 KiB) is past it and read from the layer.
    let command = "mkdir out && printf 'x\\ny\\n' > out/a.txt && printf 'no newline' > out/b.txt && : > out/empty \
                   && head -c 61440 /dev/zero > out/big.bin \
                   && for i in $(seq 1 1000); do echo \"line $i\"; done > out/z.txt";
    let mut diff = String::new();
    let result = {
        let staging = tempfile::tempdir().unwrap();
        let shell =
            Shell::new(&ToolsConfig { staging_dir: Some(staging.path().to_path_buf()), ..ToolsConfig::default() })
                .unwrap();
        let mut output = |_: &[u8]| {};
        let mut bypass = |_: &str| false;
        let mut review = |r: &StagedReview<'_>| {
            diff = r.diff.to_owned();
            StagedDecision::Discard { reason: "look only".into() }
        };
        let cancel = CancelToken::new();
        let mut ctx = ToolContext {
            cwd: cwd.path(),
            cancel: &cancel,
            limits: limits(),
            output: &mut output,
            approve_bypass: &mut bypass,
            review_staged: &mut review,
            elicit: &mut |_, _| cairn_core::elicit::nobody(),
        };
        shell.execute(&request("shell", json!({ "command": command })), &mut ctx)
    };
    assert!(matches!(result, Err(ToolError::Rejected(_))), "{result:?}");
    assert!(diff.starts_with("--- a/out/a.txt\n+++ b/out/a.txt\n@@ -0,0 +1,2 @@\n+x\n+y\n"), "{diff}");
    assert!(
        diff.contains("--- a/out/b.txt\n+++ b/out/b.txt\n@@ -0,0 +1 @@\n+no newline\n\\ No newline at end of file\n"),
        "{diff}"
    );
    let zeros = {
        use sha2::Digest as _;
        sha2::Sha256::digest([0u8; 61440]).iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    assert!(diff.contains(&format!("binary out/big.bin: 61440 bytes, sha256 {zeros}\n")), "{diff}");
    assert!(diff.contains("--- a/out/empty\n+++ b/out/empty\n"), "{diff}");
    let z = diff.split_once("--- a/out/z.txt\n+++ b/out/z.txt\n@@ -0,0 +1,1000 @@\n").expect("z.txt's diff").1;
    let want: String = (1..=1000).map(|i| format!("+line {i}\n")).collect();
    assert_eq!(z, want, "z.txt's lines");
}

/// A build that creates more files than the open-file limit allows is
/// applied whole: a staged file moved into the tree is held open until it
/// is renamed, and past what the limit leaves the rest are copied. Before,
/// every moved file was held at once and such a build failed with "too
/// many open files" (the common soft limit is 1,024). The test runs
/// itself again with a limit of 256 and 600 files.
#[test]
fn a_build_of_more_files_than_the_open_file_limit_applies_whole() {
    use std::os::unix::process::CommandExt;
    const LIMIT: libc::rlim_t = 256;
    const FILES: usize = 600;
    require_staging();
    if std::env::var_os("CAIRN_TEST_UNDER_NOFILE").is_none() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args(["--exact", "suite::staged::a_build_of_more_files_than_the_open_file_limit_applies_whole"])
            .args(["--nocapture", "--test-threads=1"])
            .env("CAIRN_TEST_UNDER_NOFILE", "1");
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            child.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = child.output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("1 passed"), "the run under the lower limit failed:\n{said}");
        return;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit with a valid pointer to a local struct.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    assert_eq!(limit.rlim_cur, LIMIT, "the child runs under the lowered limit");
    let cwd = tempfile::tempdir().unwrap();
    let command = format!("mkdir out && for i in $(seq 1 {FILES}); do echo \"file $i\" > out/f$i; done");
    let (result, seen) = staged_run(cwd.path(), &command, |_| StagedDecision::Apply { by: "test".into() });
    result.unwrap();
    assert_eq!(seen.unwrap().changes.len(), FILES + 1, "the directory and every file");
    for i in 1..=FILES {
        let got = std::fs::read_to_string(cwd.path().join(format!("out/f{i}"))).unwrap();
        assert_eq!(got, format!("file {i}\n"));
    }
}
