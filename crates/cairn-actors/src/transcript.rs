//! Upgrade gates: transcript tests (`source/tests/*.jsonl`) run against a
//! fresh candidate instance on a copy of the actor's `/data` and `/public`,
//! or a 2 s smoke test when there are none. Owns candidate runs only; the
//! broker decides what to do with the verdict.
//!
//! Lines: `{"send": body, "from"?}` writes a message to the candidate,
//! shaped as live traffic is (`m-<n>` ids from the world's counter, `from`
//! the console unless the step names a sender), so a candidate cannot pass
//! its gate by recognising the test;
//! `{"expect": subset, "to"?}` waits up to 10 s for a stdout message whose
//! body contains `subset` (objects: every key recursively; other values:
//! equal) and, if given, whose `to` equals it.
//!
//! After the swap the same expectations judge the new version's first
//! live answers (`judge`, issue 48.7): the broker compares each with the
//! old version's answers to the same messages (run in shadow) and accepts
//! a different one only where an `expect` of the transcripts describes it.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::component::Component;

use crate::layout::copy_tree;
use crate::message::{Inbound, Outbound};
use crate::runtime::{self, Dirs, Exit, Limits, Runtime};

/// How long an `expect` waits.
pub const EXPECT_WAIT: Duration = Duration::from_secs(10);
/// How long a candidate without tests must stay up.
pub const SMOKE_WAIT: Duration = Duration::from_secs(2);

/// Whether `have` contains `want` (objects by key, recursively).
pub fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        _ => have == want,
    }
}

/// One `expect` step of a transcript: the subset an answer's body must
/// contain, and the `to` it must have if the step names one.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    /// Subset of the body (see [`contains`]).
    pub body: Value,
    /// Required `to`, if the step gives one.
    pub to: Option<String>,
}

/// The transcripts (`*.jsonl`) in `tests_dir`, sorted by name; none when
/// there is no directory or it cannot be read.
fn transcript_files(tests_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = tests_dir
        .and_then(|d| std::fs::read_dir(d).ok())
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Every `expect` step of the transcripts (`*.jsonl`) in `tests_dir`, in
/// file and line order; lines that are not steps are skipped (the gate
/// refused those already).
pub fn expectations(tests_dir: &Path) -> Vec<Expectation> {
    let mut out = Vec::new();
    for f in transcript_files(Some(tests_dir)) {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        for line in text.lines() {
            let Ok(step) = serde_json::from_str::<Value>(line) else { continue };
            if let Some(want) = step.get("expect") {
                let to = step.get("to").and_then(Value::as_str).map(str::to_owned);
                out.push(Expectation { body: want.clone(), to });
            }
        }
    }
    out
}

/// What [`judge`] found for one live answer of a new version.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The old version gave the same answer (same `to`, `reply_to` and
    /// body): the one at this index of its answers.
    Same(usize),
    /// An expectation of the new version's transcripts describes it (the
    /// tests say the behaviour changed there).
    Described,
    /// Neither: what was answered, and what the old version answered.
    Unexplained(String),
}

/// Judges one live answer of a new version (issue 48.7) against the old
/// version's answers to the same messages not yet matched (`olds`, in
/// order) and the new version's transcripts' expectations.
pub fn judge(new: &Outbound, olds: &[Outbound], expects: &[Expectation]) -> Verdict {
    if let Some(i) = olds.iter().position(|o| o.to == new.to && o.reply_to == new.reply_to && o.body == new.body) {
        return Verdict::Same(i);
    }
    if expects
        .iter()
        .any(|e| contains(&new.body, &e.body) && e.to.as_deref().is_none_or(|t| new.to.as_deref() == Some(t)))
    {
        return Verdict::Described;
    }
    let was = if olds.is_empty() {
        "the old version gave no other answer to the same messages".to_owned()
    } else {
        let shown: Vec<String> = olds.iter().take(4).map(|o| o.body.to_string()).collect();
        format!("the old version answered {} to the same messages", shown.join(", "))
    };
    Verdict::Unexplained(format!(
        "answered {} (to {}) where {was}, and no expect step of its transcripts describes that answer",
        new.body,
        new.to.as_deref().unwrap_or("its subscribers")
    ))
}

enum Ev {
    Line(String),
    Exit(Exit),
}

/// What a candidate run needs.
pub struct Candidate<'a> {
    /// Engine.
    pub rt: &'a Runtime,
    /// The compiled candidate.
    pub component: &'a Component,
    /// The live actor's `/data` and `/public` (copied, never touched).
    pub data: &'a Path,
    /// See `data`.
    pub public: &'a Path,
    /// `/actor` (read-only).
    pub actor_root: &'a Path,
    /// Scratch directory for the copies (removed afterwards).
    pub scratch: PathBuf,
    /// Limits as for the live actor.
    pub limits: Limits,
    /// The number of the first message id the transcript's messages get
    /// (`m-<n>`, as live messages are numbered: issue 48.7, a candidate
    /// must not tell test traffic from live traffic).
    pub first_id: u64,
}

impl std::fmt::Debug for Candidate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate").field("scratch", &self.scratch).finish_non_exhaustive()
    }
}

/// Runs every transcript in `tests_dir` (or the smoke test if there are
/// none). `Err` says which file and line failed and why.
pub fn run_gate(c: &Candidate<'_>, tests_dir: Option<&Path>) -> Result<usize, String> {
    let files = transcript_files(tests_dir);
    if files.is_empty() {
        return smoke(c).map(|()| 0);
    }
    for f in &files {
        transcript(c, f)?;
    }
    Ok(files.len())
}

struct Running {
    inst: runtime::Instance,
    rx: mpsc::Receiver<Ev>,
    scratch: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.inst.close_stdin();
        self.inst.kill.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wait for the instance to end before removing its directories.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Ev::Exit(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                _ => {}
            }
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

fn launch(c: &Candidate<'_>, name: &str) -> Result<Running, String> {
    let scratch = c.scratch.join(name);
    let _ = std::fs::remove_dir_all(&scratch);
    let dirs = Dirs { data: scratch.join("data"), public: scratch.join("public"), actor_root: c.actor_root.to_owned() };
    copy_tree(c.data, &dirs.data).map_err(|e| e.to_string())?;
    copy_tree(c.public, &dirs.public).map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    let inst = runtime::start(
        c.rt,
        c.component,
        &dirs,
        &scratch.join("stderr.log"),
        c.limits,
        move |l| {
            let _ = tx.send(Ev::Line(l));
        },
        move |e| {
            let _ = tx2.send(Ev::Exit(e));
        },
    )
    .map_err(|e| format!("candidate did not start: {e:#}"))?;
    Ok(Running { inst, rx, scratch })
}

fn smoke(c: &Candidate<'_>) -> Result<(), String> {
    let r = launch(c, "smoke")?;
    let deadline = Instant::now() + SMOKE_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        match r.rx.recv_timeout(left) {
            Ok(Ev::Exit(e)) => {
                return Err(format!("smoke test (no source/tests/*.jsonl): candidate ended within 2 s: {e:?}"));
            }
            Ok(Ev::Line(_)) => {}
            Err(_) => return Ok(()),
        }
    }
}

fn transcript(c: &Candidate<'_>, file: &Path) -> Result<(), String> {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let r = launch(c, &format!("t-{name}"))?;
    let mut sent = 0u64;
    for (n, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        let step: Value = serde_json::from_str(line).map_err(|e| format!("{at}: not JSON: {e}"))?;
        if let Some(body) = step.get("send") {
            sent += 1;
            // As live traffic looks: an `m-<n>` id near the world's own
            // counter, from the console unless the step says who.
            let from = step.get("from").and_then(Value::as_str).unwrap_or(crate::message::CONSOLE);
            let msg = Inbound {
                id: format!("m-{}", c.first_id + sent),
                from: from.to_owned(),
                reply_to: None,
                body: body.clone(),
            };
            let line = serde_json::to_string(&msg).unwrap_or_default();
            r.inst.write_line(&line, EXPECT_WAIT).map_err(|e| format!("{at}: candidate stdin closed: {e}"))?;
        } else if let Some(want) = step.get("expect") {
            let want_to = step.get("to").and_then(Value::as_str);
            let deadline = Instant::now() + EXPECT_WAIT;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match r.rx.recv_timeout(left) {
                    Ok(Ev::Line(l)) => {
                        let Ok(m) = Outbound::parse(&l) else { continue };
                        if contains(&m.body, want) && want_to.is_none_or(|t| m.to.as_deref() == Some(t)) {
                            break;
                        }
                    }
                    Ok(Ev::Exit(e)) => {
                        return Err(format!("{at}: candidate ended before {want}: {e:?}"));
                    }
                    Err(_) => {
                        return Err(format!("{at}: expected {want} not seen within 10 s"));
                    }
                }
            }
        } else {
            return Err(format!("{at}: a step is {{\"send\":…}} or {{\"expect\":…}}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn out(to: Option<&str>, body: Value) -> Outbound {
        Outbound { to: to.map(str::to_owned), id: None, reply_to: None, body }
    }

    #[test]
    fn a_live_answer_is_one_of_the_old_ones_or_one_the_transcript_describes() {
        let expects = [Expectation { body: json!({"v": 2}), to: None }];
        let olds = [out(None, json!({"q": 0})), out(None, json!({"q": 1}))];
        assert_eq!(judge(&out(None, json!({"q": 1})), &olds, &[]), Verdict::Same(1));
        assert_eq!(judge(&out(None, json!({"q": 1, "v": 2})), &olds, &expects), Verdict::Described);
        assert_eq!(judge(&out(None, json!({"q": 1, "v": 2})), &[], &expects), Verdict::Described);
        let Verdict::Unexplained(evil) = judge(&out(None, json!("EVIL version 2 (live)")), &olds, &expects) else {
            panic!("an unexplained answer passed")
        };
        assert!(evil.contains("answered \"EVIL version 2 (live)\" (to its subscribers)"), "{evil}");
        assert!(evil.contains("the old version answered {\"q\":0}, {\"q\":1} to the same messages"), "{evil}");
        // Same body to another participant is another answer.
        assert!(matches!(judge(&out(Some("x"), json!({"q": 1})), &olds, &[]), Verdict::Unexplained(_)));
        let only_to = [Expectation { body: json!({"v": 2}), to: Some("y".into()) }];
        assert!(matches!(judge(&out(Some("x"), json!({"v": 2})), &[], &only_to), Verdict::Unexplained(_)));
        assert_eq!(judge(&out(Some("y"), json!({"v": 2})), &[], &only_to), Verdict::Described);
    }

    #[test]
    fn subset() {
        assert!(contains(&json!({"a":1,"b":{"c":2,"d":3}}), &json!({"b":{"c":2}})));
        assert!(!contains(&json!({"a":1}), &json!({"a":2})));
        assert!(!contains(&json!({"a":1}), &json!({"b":1})));
        assert!(contains(&json!([1, 2]), &json!([1, 2])));
        assert!(!contains(&json!([1, 2]), &json!([1])));
        assert!(contains(&json!("x"), &json!("x")));
    }
}
