//! `Equipment`, the one place a face's turn is put together: each `Step`
//! starts what it names and nothing else, and re-equipping asks the host
//! for the turn's tools with the face's approver and keeps the session
//! when the host fails. Checked on real sessions with core's turn and the
//! scripted provider (cairn-testtools), not against `running.rs` itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Mutex;

use cairn_core::approval::{Allowlist, PolicyApprover, SharedApprover};
use cairn_core::message::Role;
use cairn_core::storage::registers::QueuedPrompt;
use cairn_core::storage::{Header, JsonlStore, MemStore, StoreOptions};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnStop};
use cairn_host::{Equipment, HostTools, SessionHost, Step};
use cairn_testtools::{ScriptLine, ScriptProvider};

fn answers(n: usize) -> ScriptProvider {
    ScriptProvider::new((0..n).map(|i| ScriptLine { text: format!("answer {i}"), tool_calls: vec![] }).collect())
}

fn headless() -> Equipment {
    let approver = PolicyApprover::new(Allowlist::new(), None);
    Equipment { tools: ToolRegistry::new(&approver), approver }
}

fn prompts<S: cairn_core::storage::Storage>(session: &Session<S>) -> Vec<String> {
    session.messages().iter().filter(|m| m.role == Role::User).map(|m| m.joined_text()).collect()
}

fn session() -> Session<MemStore> {
    Session::open(MemStore::new(Header::new("s1", "/tmp")), SessionConfig::default()).unwrap()
}

#[test]
fn once_runs_its_prompt_on_a_new_session_and_never_again() {
    let (mut s, mut e, provider, cancel) = (session(), headless(), answers(3), CancelToken::new());
    let first = e.run(&mut s, &provider, Step::Once("do it"), &mut |_| {}, &cancel).unwrap();
    assert_eq!(first.map(|o| (o.stop, o.text)), Some((TurnStop::Answered, "answer 0".to_owned())));
    // A unit run again (a runner restarted after its answer) starts nothing.
    let again = e.run(&mut s, &provider, Step::Once("do it"), &mut |_| {}, &cancel).unwrap();
    assert!(again.is_none());
    assert_eq!(prompts(&s), ["do it"]);
}

#[test]
fn once_resumes_the_turn_a_failed_run_left() {
    let (mut s, mut e, cancel) = (session(), headless(), CancelToken::new());
    // No script line: the provider fails and the turn is left unfinished.
    let failed = e.run(&mut s, &answers(0), Step::Once("do it"), &mut |_| {}, &cancel);
    assert!(failed.is_err(), "{failed:?}");
    assert!(s.needs_resume());
    let resumed = e.run(&mut s, &answers(1), Step::Once("do it"), &mut |_| {}, &cancel).unwrap();
    assert_eq!(resumed.map(|o| o.text), Some("answer 0".to_owned()));
    assert!(!s.needs_resume());
    assert_eq!(prompts(&s), ["do it"], "the prompt is not asked twice");
}

#[test]
fn resume_with_nothing_unfinished_writes_nothing() {
    let (mut s, mut e, cancel) = (session(), headless(), CancelToken::new());
    e.run(&mut s, &answers(1), Step::Prompt("one"), &mut |_| {}, &cancel).unwrap();
    let before = cairn_core::storage::Storage::entry_count(s.store());
    assert!(e.run(&mut s, &answers(1), Step::Resume, &mut |_| {}, &cancel).unwrap().is_none());
    assert_eq!(cairn_core::storage::Storage::entry_count(s.store()), before);
}

#[test]
fn queued_takes_the_oldest_prompt_once_and_nothing_when_empty() {
    let (mut s, mut e, provider, cancel) = (session(), headless(), answers(3), CancelToken::new());
    assert!(e.run(&mut s, &provider, Step::Queued(&[]), &mut |_| {}, &cancel).unwrap().is_none());
    assert_eq!(cairn_core::storage::Storage::entry_count(s.store()), 0, "an empty queue writes nothing");
    let arrived = [QueuedPrompt { n: 1, prompt: "first".into() }, QueuedPrompt { n: 2, prompt: "second".into() }];
    let mut events = 0;
    let one = e.run(&mut s, &provider, Step::Queued(&arrived), &mut |_| events += 1, &cancel).unwrap();
    assert_eq!(one.map(|o| o.text), Some("answer 0".to_owned()));
    assert!(events > 0, "the face's observer is told the turn's events");
    e.run(&mut s, &provider, Step::Queued(&arrived), &mut |_| {}, &cancel).unwrap();
    assert!(e.run(&mut s, &provider, Step::Queued(&arrived), &mut |_| {}, &cancel).unwrap().is_none());
    assert_eq!(prompts(&s), ["first", "second"]);
}

#[test]
fn a_cancelled_token_stops_the_turn_it_is_given() {
    let (mut s, mut e, cancel) = (session(), headless(), CancelToken::new());
    cancel.cancel();
    let out = e.run(&mut s, &answers(1), Step::Prompt("stop me"), &mut |_| {}, &cancel).unwrap();
    assert_eq!(out.map(|o| o.stop), Some(TurnStop::Cancelled));
}

/// A host that records what it was asked and can be told to fail.
struct Recorder {
    asked: Mutex<Vec<(Option<String>, bool)>>,
    fail: bool,
}

impl SessionHost for Recorder {
    fn session_config(&self) -> SessionConfig {
        SessionConfig { max_steps: 7, ..SessionConfig::default() }
    }

    fn turn(
        &self,
        _cwd: &Path,
        _store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> anyhow::Result<(HostTools, SessionConfig)> {
        self.asked.lock().unwrap().push((prompt.map(str::to_owned), person.is_some()));
        assert!(approver.writes_approved_by().is_some(), "the face's own approver is the one handed to the host");
        if self.fail {
            anyhow::bail!("no tools today");
        }
        Ok((HostTools { tools: vec![], notes: vec!["a note".into()], hooks: None }, self.session_config()))
    }
}

#[test]
fn equipping_asks_the_host_with_the_faces_approver_and_keeps_the_session_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::create(dir.path(), Header::new("e1", "/tmp"), StoreOptions::default()).unwrap();
    let host = Recorder { asked: Mutex::new(vec![]), fail: false };
    let approver = PolicyApprover::new(Allowlist::new(), None).approve_writes("test:yes");
    let mut notes = Vec::new();
    let (mut s, mut e) =
        Equipment::for_turn(&host, store, dir.path(), Some("first"), approver, None, |n| notes.push(n.to_owned()))
            .unwrap();
    assert_eq!(notes, ["a note"]);
    e.run(&mut s, &answers(1), Step::Prompt("first"), &mut |_| {}, &CancelToken::new()).unwrap();
    let s = e.reequip(&host, s, dir.path(), Some("second"), None, |_| {}).map_err(|e| e.error).unwrap();
    assert_eq!(*host.asked.lock().unwrap(), [(Some("first".to_owned()), false), (Some("second".to_owned()), false)]);
    let failing = Recorder { asked: Mutex::new(vec![]), fail: true };
    let failed = e.reequip(&failing, s, dir.path(), None, None, |_| {}).err().unwrap();
    assert!(format!("{:#}", failed.error).contains("no tools today"));
    let kept = failed.session.expect("the session stays open when the host fails");
    assert_eq!(prompts(&kept), ["first"]);
}
