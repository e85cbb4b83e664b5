//! Benchmark of undo (issue 30): what keeping pre-images costs per turn
//! (a `write_file` of one file; a staged shell command changing 1,000
//! existing files), each against the same tool without a pre-image store,
//! interleaved; the store's disk use against the prior bytes the effect
//! changed; and the time to undo (restore) a turn that changed 1,000
//! files, against the staged command that made the change.
//!
//! Run: `cargo run --release -p cairn-bench --bin undo` (`--smoke`: tiny
//! sizes). Needs overlay staging; where it is unavailable it says so and
//! exits with an error.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use cairn_bench::{Table, sample, size};
use cairn_core::CancelToken;
use cairn_core::staged::{ChangeSet, Preimages, StagedDecision, StagedReview};
use cairn_core::tool::{Tool, ToolContext, ToolLimits, ToolRequest};
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::edit::WriteFile;
use cairn_tools::builtin::shell::Shell;
use cairn_tools::undo::PreimageStore;
use serde_json::{Value, json};

/// Run `tool` with `arguments` in `cwd`, every effect applied; the change
/// set it recorded (if any) and its pre-image status.
fn run(tool: &dyn Tool, name: &str, cwd: &Path, arguments: Value) -> Option<(ChangeSet, Preimages)> {
    let request = ToolRequest {
        invocation_id: "bench".into(),
        call_id: "c1".into(),
        session_id: "s".into(),
        tool: name.into(),
        arguments,
    };
    let cancel = CancelToken::new();
    let mut output = |_: &[u8]| {};
    let mut bypass = |_: &str| false;
    let mut seen = None;
    let mut review = |r: &StagedReview<'_>| {
        seen = Some((r.changes.clone(), r.preimages.clone()));
        StagedDecision::Apply { by: "bench".into() }
    };
    let mut ctx = ToolContext {
        cwd,
        cancel: &cancel,
        limits: ToolLimits { timeout: std::time::Duration::from_secs(600), output_cap: 16 * 1024 },
        output: &mut output,
        approve_bypass: &mut bypass,
        review_staged: &mut review,
        elicit: &mut |_, _| cairn_core::elicit::nobody(),
    };
    match tool.execute(&request, &mut ctx) {
        Ok(r) if r.exit_code == 0 => {}
        other => panic!("{name} failed: {other:?}"),
    }
    seen
}

/// Bytes on disk (allocated blocks) under `dir`.
fn disk_use(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

fn main() -> Result<()> {
    if let Err(why) = cairn_tools::staging::overlay_status() {
        bail!("overlay staging is not available here: {why}");
    }
    let base = tempfile::tempdir()?;
    let store_dir = base.path().join("preimages");
    let config = |store: bool| ToolsConfig {
        staged: true,
        staging_dir: Some(base.path().join("staging")),
        staged_max_files: usize::MAX,
        preimage_dir: store.then(|| store_dir.clone()),
        ..ToolsConfig::default()
    };
    let samples = size(11, 3);
    let mut table = Table::new("undo");

    // 1. write_file of one file (a new content each time: every sample
    // keeps a new pre-image).
    let (a, b) = (base.path().join("w-a"), base.path().join("w-b"));
    for dir in [&a, &b] {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("f.txt"), "start\n".repeat(200))?;
    }
    let (kept, plain) = (WriteFile::with_preimages(PreimageStore::from_config(&config(true))), WriteFile::new());
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let content = format!("version {i}\n").repeat(200);
        let args = json!({"path": "f.txt", "content": content});
        let one = |tool: &WriteFile, dir: &Path| sample(1, || drop(run(tool, "write_file", dir, args.clone())));
        if i % 2 == 0 {
            with.extend(one(&kept, &a));
            without.extend(one(&plain, &b));
        } else {
            without.extend(one(&plain, &b));
            with.extend(one(&kept, &a));
        }
    }
    table.compare("write_file of one file (1.6 KB), pre-images kept", &with, "without a store", &without);

    // 2. A staged shell command changing N existing files (appends: each
    // sample's prior contents are new).
    let files = size(1000, 20);
    let (sa, sb) = (base.path().join("s-a"), base.path().join("s-b"));
    for dir in [&sa, &sb] {
        std::fs::create_dir_all(dir.join("out"))?;
        for k in 0..files {
            std::fs::write(dir.join(format!("out/f{k}.o")), format!("object {k}\n").repeat(20))?;
        }
    }
    let (shell_kept, shell_plain) = (Shell::new(&config(true))?, Shell::new(&config(false))?);
    let command = format!("for i in $(seq 0 {}); do echo \"more $i $$\" >> out/f$i.o; done", files - 1);
    let args = json!({ "command": command });
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let before_store = disk_use(&store_dir);
    let mut prior_bytes = 0;
    for i in 0..samples {
        let mut kept_run = || {
            let t = Instant::now();
            let seen = run(&shell_kept, "shell", &sa, args.clone());
            with.push(t.elapsed());
            if let Some((_, Preimages::Kept { bytes })) = seen {
                prior_bytes += bytes;
            } else {
                panic!("the staged run kept no pre-images: {seen:?}");
            }
        };
        let mut plain_run = || without.extend(sample(1, || drop(run(&shell_plain, "shell", &sb, args.clone()))));
        if i % 2 == 0 {
            kept_run();
            plain_run();
        } else {
            plain_run();
            kept_run();
        }
    }
    table.compare(&format!("staged shell changing {files} files, pre-images kept"), &with, "without a store", &without);
    let used = disk_use(&store_dir) - before_store;
    table.figure(
        &format!("store disk use for those {samples} runs"),
        &format!(
            "{used} bytes allocated for {prior_bytes} bytes of prior content ({:.2}x; 4 KiB blocks per small file)",
            used as f64 / prior_bytes.max(1) as f64
        ),
    );

    // 3. Undo of a turn that changed N files: the restore of its plan,
    // against the staged command that made the change.
    let store = PreimageStore::new(&store_dir, u64::MAX);
    let (mut undo, mut made) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let t = Instant::now();
        let (changes, pre) = run(&shell_kept, "shell", &sa, args.clone()).unwrap_or_default_pair();
        made.push(t.elapsed());
        assert!(pre.kept(), "pre-images not kept: {pre:?}");
        let effect = cairn_core::undo::Revertible {
            entry_id: "e".into(),
            staged: cairn_core::events::ToolStagedPayload {
                invocation_id: "i".into(),
                tool: "shell".into(),
                change_set: changes,
                staging: String::new(),
                verdict: cairn_core::events::VerdictRecord {
                    decision: cairn_core::approval::Answer::Approve,
                    by: "bench".into(),
                    at: 0,
                },
                preimages: Some(pre),
            },
        };
        let steps = cairn_core::undo::plan(&[effect]);
        assert_eq!(steps.len(), files);
        undo.extend(sample(1, || {
            cairn_tools::undo::restore(&store, &sa, &steps, false).unwrap_or_else(|e| panic!("restore: {e}"))
        }));
    }
    table.compare(
        &format!("undo (restore) of a turn that changed {files} files"),
        &undo,
        "the staged command that made it",
        &made,
    );
    table.print();
    Ok(())
}

trait OrDefault {
    fn unwrap_or_default_pair(self) -> (ChangeSet, Preimages);
}

impl OrDefault for Option<(ChangeSet, Preimages)> {
    fn unwrap_or_default_pair(self) -> (ChangeSet, Preimages) {
        self.unwrap_or_else(|| (ChangeSet::default(), Preimages::NotKept { reason: "no change set".into() }))
    }
}
