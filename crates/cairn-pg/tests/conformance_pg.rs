//! The storage conformance suite (cairn-core's `tests/conformance/mod.rs`,
//! the same functions MemStore, JSONL and SQLite pass) on PostgreSQL, against
//! a real server started for this test; then the schema's version rules,
//! export/import byte identity with the JSONL backend, and fencing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use cairn_core::storage::{Header, Storage, new_session_id};
use cairn_pg::test_cluster::TestCluster;
use cairn_pg::{PgStore, connect};

#[macro_use]
#[path = "../../cairn-core/tests/conformance/mod.rs"]
mod conformance;
use conformance::Backend;

/// A server shared by the tests running at the same time (a missing
/// PostgreSQL fails every test with the reason).
fn cluster() -> Arc<TestCluster> {
    match TestCluster::shared() {
        Ok(c) => c,
        Err(e) => panic!("cannot start a PostgreSQL test server: {e:#}"),
    }
}

struct Pg(Arc<TestCluster>);
impl Pg {
    fn new() -> Self {
        Pg(cluster())
    }
}
impl Backend for Pg {
    type S = PgStore;
    fn fresh(&mut self) -> PgStore {
        PgStore::create(connect(self.0.url()).unwrap(), Header::new(new_session_id(), "/")).unwrap()
    }
    fn reopen(&mut self, store: PgStore) -> PgStore {
        let id = store.header().id.clone();
        drop(store);
        PgStore::open(connect(self.0.url()).unwrap(), &id).unwrap()
    }
}

conformance!(pg, Pg::new());

// ---------------------------------------------------------------------------
// Beyond the shared suite: byte identity with JSONL, schema versions,
// hostile rows, fencing.

use cairn_core::storage::{
    JsonlStore, StorageError, StoreOptions, Transaction, check_file, decode_line, encode_line, to_raw,
};
use cairn_pg::lease;
use serde_json::json;

fn raw(v: serde_json::Value) -> cairn_core::storage::RawJson {
    to_raw(&v).unwrap()
}

/// A session with every record kind and awkward text.
fn fill(s: &mut impl Storage) {
    let text = "quote \" backslash \\ newline \n unicode é 🦀 nul \u{0} bidi \u{202e}";
    s.commit(Transaction::new().entry("a", None, "message", raw(json!({"text": text}))).state(0, raw(json!("idle"))))
        .unwrap();
    s.commit(Transaction::new().set("fact", "k", raw(json!(text))).usage("u1", Some("a"), raw(json!({"in": 3}))))
        .unwrap();
    s.commit(Transaction::new().delete("fact", "k").entry("b", Some("a"), "m", raw(json!([1.5e300, null])))).unwrap();
}

#[test]
fn a_jsonl_file_imports_and_exports_byte_for_byte() {
    let c = cluster();
    let dir = tempfile::tempdir().unwrap();
    let mut file =
        JsonlStore::create(dir.path(), Header::new(new_session_id(), "/w"), StoreOptions::default()).unwrap();
    fill(&mut file);
    let path = file.path().to_owned();
    drop(file);
    let bytes = std::fs::read(&path).unwrap();
    let mut client = connect(c.url()).unwrap();
    let id = cairn_pg::import(&mut client, &bytes).unwrap();
    assert_eq!(cairn_pg::export(&mut client, &id).unwrap(), bytes);
    // The imported session reads like the file.
    let pg = PgStore::open(connect(c.url()).unwrap(), &id).unwrap();
    let js = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!(conformance::snapshot(&pg), conformance::snapshot(&js));
    // A second import of the same id is refused and changes nothing.
    assert!(matches!(cairn_pg::import(&mut client, &bytes), Err(StorageError::Exists { .. })));
}

#[test]
fn a_postgres_session_exports_as_a_valid_jsonl_file() {
    let c = cluster();
    let mut pg = PgStore::create(connect(c.url()).unwrap(), Header::new(new_session_id(), "/w")).unwrap();
    fill(&mut pg);
    let id = pg.header().id.clone();
    let bytes = cairn_pg::export(&mut connect(c.url()).unwrap(), &id).unwrap();
    // Every line is exactly what the JSONL encoder writes for its records.
    let text = std::str::from_utf8(&bytes).unwrap();
    for line in text.lines().skip(1) {
        let records = decode_line(line.as_bytes()).unwrap();
        assert_eq!(encode_line(&records).unwrap(), format!("{line}\n").into_bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{id}.jsonl"));
    std::fs::write(&path, &bytes).unwrap();
    let report = check_file(&path);
    assert!(report.ok && !report.torn_tail, "{report:?}");
    assert_eq!(conformance::snapshot(&JsonlStore::open_read_only(&path).unwrap()), conformance::snapshot(&pg));
}

#[test]
fn hostile_imports_are_refused_with_their_line() {
    let c = cluster();
    let mut client = connect(c.url()).unwrap();
    let header =
        String::from_utf8(cairn_core::storage::encode_header(&Header::new(new_session_id(), "/")).unwrap()).unwrap();
    for (bytes, want) in [
        (b"not json\n".to_vec(), "header"),
        (format!("{header}{{\"kind\":\"entry\"\n").into_bytes(), "line 2"),
        (format!("{header}{{\"kind\":\"entry\",\"seq\":5,\"timestamp\":1,\"id\":\"a\",\"parentId\":\"zz\",\"type\":\"m\",\"payload\":1}}\n").into_bytes(), "line 2"),
        (vec![0xff, 0xfe, b'\n'], "UTF-8"),
    ] {
        let err = cairn_pg::import(&mut client, &bytes).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
    let n: i64 = client
        .query_one("SELECT count(*) FROM cairn_sessions WHERE header = $1", &[&header.trim_end()])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "a refused import left a session behind");
}

#[test]
fn a_corrupt_row_is_an_error_naming_it_never_skipped() {
    let c = cluster();
    let mut pg = PgStore::create(connect(c.url()).unwrap(), Header::new(new_session_id(), "/")).unwrap();
    fill(&mut pg);
    let id = pg.header().id.clone();
    drop(pg);
    let mut client = connect(c.url()).unwrap();
    client
        .execute("UPDATE cairn_lines SET line = '{\"kind\":' WHERE session_id = $1 AND first_seq = 3", &[&id])
        .unwrap();
    let err = PgStore::open(connect(c.url()).unwrap(), &id).unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { line: 3, .. }), "{err}");
}

/// A peer's wait follows a family member's log with `entries_after`: it
/// hands out only entries committed past what it read, reads only those
/// lines (a corrupt line before them is never read again), and a read that
/// fails hands out nothing.
#[test]
fn a_follower_reads_only_the_lines_committed_since_its_last_read() {
    let c = cluster();
    let mut pg = PgStore::create(connect(c.url()).unwrap(), Header::new(new_session_id(), "/")).unwrap();
    fill(&mut pg);
    let id = pg.header().id.clone();
    let mut client = connect(c.url()).unwrap();
    let mut read = |after: u64| {
        let mut ids = Vec::new();
        let last = cairn_pg::store::entries_after(&mut client, &id, after, &mut |e| ids.push(e.id.clone()));
        (last, ids)
    };
    let (last, ids) = read(0);
    let last = last.unwrap();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(last, pg.last_seq());
    let (again, none) = read(last);
    assert_eq!((again.unwrap(), none.len()), (last, 0), "nothing new: nothing handed out");
    pg.commit(Transaction::new().entry("c", Some("b"), "m", raw(json!(1)))).unwrap();
    let (newer, ids) = read(last);
    assert_eq!(ids, ["c"]);
    assert_eq!(newer.unwrap(), pg.last_seq());
    // The first line is broken: a read from the start fails and hands
    // nothing out; a read past it never touches it.
    let mut other = connect(c.url()).unwrap();
    other
        .execute("UPDATE cairn_lines SET line = '{\"kind\":' WHERE session_id = $1 AND first_seq = 1", &[&id])
        .unwrap();
    let mut handed = 0;
    let err = cairn_pg::store::entries_after(&mut other, &id, 0, &mut |_| handed += 1).unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err}");
    assert_eq!(handed, 0);
    let mut ids = Vec::new();
    cairn_pg::store::entries_after(&mut other, &id, last, &mut |e| ids.push(e.id.clone())).unwrap();
    assert_eq!(ids, ["c"]);
}

#[test]
fn a_newer_schema_is_refused_and_an_older_one_migrated() {
    let c = cluster();
    let url = c.create_database(&format!("schema_{}", std::process::id())).unwrap();
    let mut client = connect(&url).unwrap();
    let v: String = client.query_one("SELECT value FROM cairn_meta WHERE key = 'schema_version'", &[]).unwrap().get(0);
    assert_eq!(v, cairn_pg::schema::SCHEMA_VERSION.to_string());
    // Connecting again is a no-op.
    drop(connect(&url).unwrap());
    client.execute("UPDATE cairn_meta SET value = '99' WHERE key = 'schema_version'", &[]).unwrap();
    let err = connect(&url).err().unwrap().to_string();
    assert!(err.contains("version 99") && err.contains("upgrade cairn"), "{err}");
    client.execute("UPDATE cairn_meta SET value = 'x' WHERE key = 'schema_version'", &[]).unwrap();
    assert!(connect(&url).err().unwrap().to_string().contains("not a number"));
}

#[test]
fn a_fenced_commit_needs_the_live_lease_of_its_epoch() {
    let c = cluster();
    let id = new_session_id();
    drop(PgStore::create(connect(c.url()).unwrap(), Header::new(id.clone(), "/")).unwrap());
    let mut control = connect(c.url()).unwrap();
    lease::submit(&mut control, &id, "go").unwrap();
    let lease_len = std::time::Duration::from_secs(60);
    let a = loop {
        let claim = lease::claim(&mut control, "a", lease_len).unwrap().unwrap();
        if claim.session == id {
            break claim;
        }
    };
    let mut store_a = PgStore::open_fenced(connect(c.url()).unwrap(), &id, a.fence.clone()).unwrap();
    store_a.commit(Transaction::new().entry("x", None, "m", raw(json!(1)))).unwrap();
    // While a holds a live lease, nobody else claims it or commits unfenced.
    assert!(lease::claim(&mut control, "b", lease_len).unwrap().is_none_or(|cl| cl.session != id));
    let mut unfenced = PgStore::open(connect(c.url()).unwrap(), &id).unwrap();
    assert!(matches!(
        unfenced.commit(Transaction::new().entry("u", None, "m", raw(json!(1)))),
        Err(StorageError::Busy { .. })
    ));
    // The lease expires (set by the server's clock, not by sleeping).
    control
        .execute("UPDATE cairn_sessions SET lease_expires = now() - interval '1 second' WHERE id = $1", &[&id])
        .unwrap();
    // Expired but not yet taken over: a's commit is refused, renewal too.
    assert!(!lease::renew(&mut control, &id, &a.fence).unwrap());
    let err = store_a.commit(Transaction::new().entry("y", None, "m", raw(json!(2)))).unwrap_err();
    assert!(err.to_string().contains("lease lost"), "{err}");
    assert!(store_a.lease_lost().load(std::sync::atomic::Ordering::SeqCst));
    // b takes over with a larger epoch and commits; a still cannot.
    let b = lease::claim(&mut control, "b", lease_len).unwrap().unwrap();
    assert_eq!((b.session.as_str(), b.fence.epoch), (id.as_str(), a.fence.epoch + 1));
    let mut store_b = PgStore::open_fenced(connect(c.url()).unwrap(), &id, b.fence.clone()).unwrap();
    store_b.commit(Transaction::new().entry("z", None, "m", raw(json!(3)))).unwrap();
    assert!(store_a.commit(Transaction::new().entry("y", None, "m", raw(json!(2)))).is_err());
    // a cannot release b's lease either.
    assert!(!lease::release(&mut control, &id, &a.fence, lease::Release::Done, None).unwrap());
    let reopened = PgStore::open(connect(c.url()).unwrap(), &id).unwrap();
    let ids: Vec<String> = reopened.entries().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["x", "z"]);
    assert!(lease::release(&mut control, &id, &b.fence, lease::Release::Done, None).unwrap());
}

/// 47.4: the claim and the commit taking a submitted prompt do not wait
/// for their WAL flush, and the setting never leaks to the connection's
/// later commits (each later line is flushed before its commit returns);
/// an effect never rests on such a commit: `may_act` first commits
/// synchronously under the fence, so a claim replaced by another holder
/// before its flush refuses the effect.
#[test]
fn no_effect_rests_on_an_unflushed_claim_and_the_setting_never_leaks() {
    let c = cluster();
    let setting =
        |db: &mut postgres::Client| -> String { db.query_one("SHOW synchronous_commit", &[]).unwrap().get(0) };
    let claim_alone = |owner: &str| {
        let id = new_session_id();
        drop(PgStore::create(connect(c.url()).unwrap(), Header::new(id.clone(), "/")).unwrap());
        let mut control = connect(c.url()).unwrap();
        let inbox = lease::submit(&mut control, &id, "go").unwrap();
        let claim = loop {
            let claim = lease::claim(&mut control, owner, std::time::Duration::from_secs(60)).unwrap().unwrap();
            if claim.session == id {
                break claim;
            }
        };
        assert_eq!(setting(&mut control), "on", "the claim's setting leaked to its connection");
        let mut store = PgStore::open_fenced(control, &id, claim.fence.clone()).unwrap();
        store.set_claim_unsynced();
        (id, inbox, claim, store)
    };
    // Taken over before anything flushed the claim: no effect starts.
    let (id, _, _, store) = claim_alone("a");
    connect(c.url())
        .unwrap()
        .execute("UPDATE cairn_sessions SET epoch = epoch + 1, lease_owner = 'b' WHERE id = $1", &[&id])
        .unwrap();
    let refused = store.may_act().unwrap_err();
    assert!(refused.0.contains("not ours"), "{}", refused.0);
    assert!(store.lease_lost().load(std::sync::atomic::Ordering::SeqCst));
    // Held: the effect may start; the prompt's commit and the next one
    // leave the connection flushing as before.
    let (id, inbox, claim, mut store) = claim_alone("a2");
    store.may_act().unwrap();
    *store.inbox_slot().lock().unwrap() = Some(inbox);
    store.commit(Transaction::new().entry("p", None, "m", raw(json!("the prompt")))).unwrap();
    assert_eq!(setting(store.client()), "on", "the prompt's commit setting leaked");
    store.may_act().unwrap();
    store.commit(Transaction::new().entry("q", Some("p"), "m", raw(json!("the answer")))).unwrap();
    assert_eq!(setting(store.client()), "on");
    let mut control = store.into_client();
    assert!(lease::release(&mut control, &id, &claim.fence, lease::Release::Done, None).unwrap());
    assert_eq!(setting(&mut control), "on", "the release's setting leaked");
    let queued: i64 =
        control.query_one("SELECT count(*) FROM cairn_inbox WHERE session_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(queued, 0, "the prompt's commit took its inbox row");
}

/// A subagent's session (`<parent>+<invocation>`) is created and committed
/// within its parent's lease: only while that lease is live and held at
/// its epoch, each commit extending it; never claimed or submitted to by
/// itself; a takeover of the parent fences the old holder's child store.
#[test]
fn a_session_within_a_lease_commits_only_while_the_lease_is_held() {
    let c = cluster();
    let id = new_session_id();
    drop(PgStore::create(connect(c.url()).unwrap(), Header::new(id.clone(), "/")).unwrap());
    let mut control = connect(c.url()).unwrap();
    lease::submit(&mut control, &id, "go").unwrap();
    let lease_len = std::time::Duration::from_secs(60);
    let a = loop {
        let claim = lease::claim(&mut control, "a", lease_len).unwrap().unwrap();
        if claim.session == id {
            break claim;
        }
    };
    let parent_a = PgStore::open_fenced(connect(c.url()).unwrap(), &id, a.fence.clone()).unwrap();
    let hold_a = parent_a.hold().unwrap();
    assert_eq!(hold_a.session(), id);
    let child = format!("{id}+i1");
    let mut child_a =
        PgStore::create_within(connect(c.url()).unwrap(), Header::new(child.clone(), "/"), &hold_a).unwrap();
    // Created once.
    assert!(matches!(
        PgStore::create_within(connect(c.url()).unwrap(), Header::new(child.clone(), "/"), &hold_a),
        Err(StorageError::Exists { .. })
    ));
    // Its own store hands on the same lease (a grandchild is fenced by it too).
    assert_eq!(child_a.hold().unwrap().session(), id);
    // A commit extends the parent's lease.
    control
        .execute("UPDATE cairn_sessions SET lease_expires = now() + interval '5 seconds' WHERE id = $1", &[&id])
        .unwrap();
    child_a.commit(Transaction::new().entry("x", None, "m", raw(json!(1)))).unwrap();
    let left: f64 = control
        .query_one("SELECT extract(epoch FROM lease_expires - now())::float8 FROM cairn_sessions WHERE id = $1", &[&id])
        .unwrap()
        .get(0);
    assert!(left > 30.0, "the parent's lease was extended by the child's commit: {left} s left");
    // Never submitted to or claimed by itself.
    assert!(matches!(lease::submit(&mut control, &child, "go"), Err(cairn_pg::PgError::Refused(_))));
    // The parent's lease expires: the child's commit is refused, and the
    // holder's lost flag is set (the worker backs off).
    control
        .execute("UPDATE cairn_sessions SET lease_expires = now() - interval '1 second' WHERE id = $1", &[&id])
        .unwrap();
    let err = child_a.commit(Transaction::new().entry("y", None, "m", raw(json!(2)))).unwrap_err();
    assert!(err.to_string().contains("lease lost"), "{err}");
    assert!(parent_a.lease_lost().load(std::sync::atomic::Ordering::SeqCst));
    // b takes the parent over; within its lease the child goes on, and the
    // old holder's child store stays fenced out.
    let b = lease::claim(&mut control, "b", lease_len).unwrap().unwrap();
    assert_eq!(b.session, id);
    let parent_b = PgStore::open_fenced(connect(c.url()).unwrap(), &id, b.fence.clone()).unwrap();
    let mut child_b = PgStore::open_within(connect(c.url()).unwrap(), &child, &parent_b.hold().unwrap()).unwrap();
    child_b.commit(Transaction::new().entry("z", None, "m", raw(json!(3)))).unwrap();
    assert!(child_a.commit(Transaction::new().entry("y", None, "m", raw(json!(2)))).is_err());
    // Running from its commits until its driver says its turn ended, and
    // only the holder may say so.
    let status = |control: &mut postgres::Client| -> String {
        control.query_one("SELECT status FROM cairn_sessions WHERE id = $1", &[&child]).unwrap().get(0)
    };
    assert_eq!(status(&mut control), "running");
    assert!(child_a.idle_within().is_err());
    child_b.idle_within().unwrap();
    assert_eq!(status(&mut control), "idle");
    // A driver that finds it finished with its row left `running` (its
    // last driver cut off before saying so) says it, under the lease.
    child_b.commit(Transaction::new().entry("w", None, "m", raw(json!(4)))).unwrap();
    assert_eq!(status(&mut control), "running");
    assert!(cairn_pg::store::idle_within(&mut connect(c.url()).unwrap(), &child, &hold_a).is_err());
    cairn_pg::store::idle_within(&mut connect(c.url()).unwrap(), &child, &parent_b.hold().unwrap()).unwrap();
    assert_eq!(status(&mut control), "idle");
    let reopened = PgStore::open(connect(c.url()).unwrap(), &child).unwrap();
    let ids: Vec<String> = reopened.entries().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["x", "z", "w"]);
    // Each line records the lease it was written under.
    let epochs: Vec<(i64, Option<String>)> = control
        .query("SELECT epoch, owner FROM cairn_lines WHERE session_id = $1 ORDER BY first_seq", &[&child])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (ea, eb) = ((a.fence.epoch, Some("a".to_owned())), (b.fence.epoch, Some("b".to_owned())));
    assert_eq!(epochs, [ea, eb.clone(), eb]);
    assert!(lease::release(&mut control, &id, &b.fence, lease::Release::Done, None).unwrap());
}

/// cairn's migration lock key ("cairn" in ASCII), as the schema documents it.
const MIGRATION_LOCK: i64 = 0x0063_6169_726e;

/// Run `f` on a thread; its result, or a failure when it does not return
/// within a generous bound (a hang is a failure, never a pass).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} did not return in 60 s"))
}

/// A process cut off while holding cairn's migration lock (issue 27): a
/// database whose schema is current needs no lock, so connecting goes on;
/// one whose schema is behind waits a bounded time and says why.
#[test]
fn a_held_migration_lock_stalls_no_connect() {
    let c = cluster();
    let url = c.create_database(&format!("lock_{}", std::process::id())).unwrap();
    drop(connect(&url).unwrap());
    let mut holder = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    holder.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).unwrap();
    let u = url.clone();
    within("connect with the schema current", move || connect(&u).map(drop)).unwrap();
    // Behind (as if a newer build had not migrated yet): bounded, explained.
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin.execute("UPDATE cairn_meta SET value = '0' WHERE key = 'schema_version'", &[]).unwrap();
    let u = url.clone();
    let err = within("connect with the schema behind", move || connect(&u).map(drop)).unwrap_err().to_string();
    assert!(err.contains("migrating"), "{err}");
    holder.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).unwrap();
}

/// A call whose effect completed before its connection was terminated
/// (issue 27: "uncertain" although it had taken effect): the settlement's
/// commit is retried on a new connection, so the call is recorded
/// completed, not left for the next holder to settle uncertain.
#[test]
fn a_settlement_whose_connection_was_terminated_is_retried() {
    use cairn_core::approval::{Allowlist, PolicyApprover};
    use cairn_core::projection::ToolInvocationStatus;
    use cairn_core::{CancelToken, Session, SessionConfig, TurnEnv};
    let c = cluster();
    let dir = tempfile::tempdir().unwrap();
    let id = new_session_id();
    drop(
        PgStore::create(connect(c.url()).unwrap(), Header::new(id.clone(), dir.path().display().to_string())).unwrap(),
    );
    let mut control = connect(c.url()).unwrap();
    lease::submit(&mut control, &id, "go").unwrap();
    let lease_len = std::time::Duration::from_secs(60);
    let sent = std::time::Instant::now();
    let claim = loop {
        let claim = lease::claim(&mut control, "w", lease_len).unwrap().unwrap();
        if claim.session == id {
            break claim;
        }
    };
    let mut store = PgStore::open_fenced(cairn_pg::connect_for(c.url(), lease_len).unwrap(), &id, claim.fence).unwrap();
    store.set_lease_clock(lease::LeaseClock::start(sent, lease_len));
    store.set_reconnect(c.url(), lease_len);
    let pid: i32 = store.client().query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    // The effect runs, then the server ends the store's connection (as a
    // restart or an administrator would) before the settlement commits.
    let url = c.url().to_owned();
    let hook: cairn_testtools::tools::Hook = Arc::new(move |_: &str| {
        let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    });
    let script = cairn_testtools::ScriptProvider::from_jsonl(&format!(
        "{}\n{}\n",
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "append_never", "arguments": {"path": "out.txt", "text": "x"}}]}),
        json!({"text": "done", "toolCalls": []})
    ))
    .unwrap();
    let tools = cairn_testtools::registry(false, Some(hook));
    let mut approver = PolicyApprover::new(Allowlist::parse(["append_never"]).unwrap(), None);
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let mut env =
        TurnEnv { provider: &script, tools: &tools, approver: &mut approver, observer: &mut observer, cancel: &cancel };
    let mut session = Session::open(store, SessionConfig::default()).unwrap();
    session.run_turn("go", &mut env).unwrap();
    let state = cairn_core::projection::ToolState::replay(session.store().entries());
    let call = &state.invocations[0];
    assert_eq!((call.status, call.uncertain), (ToolInvocationStatus::Completed, false), "{call:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).unwrap().lines().count(), 1);
}

/// Sequential scans of `cairn_sessions` so far, read by `client` itself
/// (its own pending counts flushed first).
fn seq_scans(client: &mut postgres::Client) -> i64 {
    client.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
    client.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    client
        .query_one("SELECT COALESCE(seq_scan, 0) FROM pg_stat_user_tables WHERE relname = 'cairn_sessions'", &[])
        .unwrap()
        .get(0)
}

/// Issue 47.3: with many finished sessions in the table, what a worker does
/// for every session (claim, the family's children, open, commit, release)
/// and what the commands do (an id prefix) read `cairn_sessions` through
/// its indexes, never a scan of the whole table; and a family's children
/// are exactly the direct ones (the range's edges: `p,x` sorts right after
/// `p+…`, `pa+i1` after that).
#[test]
fn a_workers_statements_never_scan_the_finished_sessions() {
    use cairn_pg::catalog;
    let c = cluster();
    let url = c.create_database(&format!("indexed_{}", std::process::id())).unwrap();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    drop(connect(&url).unwrap());
    admin
        .batch_execute(
            "INSERT INTO cairn_sessions (id, header, status, last_seq)
             SELECT md5(g::text)::uuid::text, '{}', 'idle', 3 FROM generate_series(1, 20000) g;
             ANALYZE cairn_sessions",
        )
        .unwrap();
    let family = ["p", "p+i1", "p+i2", "p+i1+i3", "p,x", "pa+i1"];
    for id in family {
        drop(PgStore::create(connect(&url).unwrap(), Header::new(id.to_owned(), "/")).unwrap());
    }
    let mut conn = cairn_pg::Connection::from(connect(&url).unwrap());
    let before = seq_scans(&mut admin);
    assert_eq!(catalog::children(&mut conn, "p").unwrap(), ["p+i1", "p+i2"]);
    assert_eq!(catalog::children(&mut conn, "p+i1").unwrap(), ["p+i1+i3"]);
    assert_eq!(catalog::children(&mut conn, "pa").unwrap(), ["pa+i1"]);
    assert!(catalog::children(&mut conn, "p+i2").unwrap().is_empty());
    assert!(catalog::exists(&mut conn, "p+i2").unwrap());
    // A prefix names the parent, not its children (core's rule).
    assert_eq!(catalog::resolve(&mut conn, "p+i1+").unwrap(), "p+i1+i3");
    assert_eq!(catalog::resolve(&mut conn, "p,").unwrap(), "p,x");
    assert!(catalog::resolve(&mut conn, "pa").is_err(), "a parent's prefix named its child");
    lease::submit(&mut conn, "p", "go").unwrap();
    let lease_len = std::time::Duration::from_secs(60);
    let claim = lease::claim(&mut conn, "w/0", lease_len).unwrap().unwrap();
    assert_eq!(claim.session, "p");
    let mut store = PgStore::open_fenced_on(conn, "p", claim.fence.clone()).unwrap();
    store.commit(tx_of(0)).unwrap();
    let mut conn = store.into_connection();
    let prepared = conn.prepared();
    assert!(lease::release(&mut conn, "p", &claim.fence, lease::Release::Cancelled, None).unwrap());
    // A second round prepares nothing new: the statements are reused.
    lease::submit(&mut conn, "p", "again").unwrap();
    let claim = lease::claim(&mut conn, "w/0", lease_len).unwrap().unwrap();
    let mut store = PgStore::open_fenced_on(conn, "p", claim.fence.clone()).unwrap();
    store.commit(tx_of(1)).unwrap();
    let mut conn = store.into_connection();
    assert!(lease::release(&mut conn, "p", &claim.fence, lease::Release::Done, None).unwrap());
    assert!(prepared > 5, "{prepared} statements prepared");
    let after_two = conn.prepared();
    assert_eq!(catalog::children(&mut conn, "p").unwrap().len(), 2);
    assert_eq!(conn.prepared(), after_two, "a statement was prepared again");
    // Its own counts flushed before it answers (not at its exit, later).
    conn.client().batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
    drop(conn);
    let after = seq_scans(&mut admin);
    assert_eq!(after - before, 0, "cairn_sessions was scanned whole {} time(s)", after - before);
}

fn tx_of(n: usize) -> Transaction {
    Transaction::new().entry(format!("e{n}"), None, "message", raw(json!({"n": n})))
}

/// The statements one connection sent, as the server logged them
/// (`log_statement = all` for that connection alone, each line prefixed
/// with the backend's pid): one line per round trip — an extended-protocol
/// `execute`, or a simple-query message however many statements it holds.
fn logged_round_trips(log: &str, pid: i32) -> Vec<String> {
    let mark = format!("[{pid}] LOG:  ");
    log.lines()
        .filter_map(|l| l.split_once(&mark).map(|(_, rest)| rest))
        .filter(|rest| rest.starts_with("statement: ") || rest.starts_with("execute "))
        .map(str::to_owned)
        .collect()
}

/// 47.4: what a worker sends for a trivial session (claim, open, the
/// prompt read, the prompt's commit, the answer's commit, the inbox read
/// again, the release) is one round trip each — 7 in all, where it was
/// 21 (the open's two reads, `BEGIN`, lock, insert, advance, take and
/// `COMMIT` for each commit, `BEGIN`, lock, inbox check, leave and
/// `COMMIT` for the release) — and the fence, the CAS and the prompt's
/// take still refuse with nothing written.
#[test]
fn a_trivial_session_costs_one_round_trip_per_step() {
    let c = cluster();
    let url = c.create_database(&format!("round_trips_{}", std::process::id())).unwrap();
    let id = new_session_id();
    drop(PgStore::create(connect(&url).unwrap(), Header::new(id.clone(), "/")).unwrap());
    let mut conn = cairn_pg::Connection::from(connect(&url).unwrap());
    let lease_len = std::time::Duration::from_secs(60);
    // A first session through every step, so that the statements are
    // prepared before counting (a worker thread prepares them once).
    let warm = new_session_id();
    drop(PgStore::create(connect(&url).unwrap(), Header::new(warm.clone(), "/")).unwrap());
    let trivial = |mut conn: cairn_pg::Connection, id: &str| -> cairn_pg::Connection {
        let claim = lease::claim(&mut conn, "w/0", lease_len).unwrap().unwrap();
        assert_eq!(claim.session, id);
        let mut store = PgStore::open_fenced_on(conn, id, claim.fence.clone()).unwrap();
        let (inbox, _) = store.next_prompt().unwrap().unwrap();
        *store.inbox_slot().lock().unwrap() = Some(inbox);
        store.commit(Transaction::new().entry("p", None, "m", raw(json!("the prompt")))).unwrap();
        store.commit(Transaction::new().entry("a", Some("p"), "m", raw(json!("the answer")))).unwrap();
        assert!(store.next_prompt().unwrap().is_none());
        let mut conn = store.into_connection();
        assert!(lease::release(&mut conn, id, &claim.fence, lease::Release::Done, None).unwrap());
        conn
    };
    lease::submit(&mut conn, &warm, "go").unwrap();
    conn = trivial(conn, &warm);
    lease::submit(&mut conn, &id, "go").unwrap();
    let pid: i32 = conn.client().query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    conn.client().batch_execute("SET log_statement = 'all'").unwrap();
    let mut conn = trivial(conn, &id);
    conn.client().batch_execute("RESET log_statement").unwrap();
    let sent = logged_round_trips(&c.log(), pid);
    // The SET's and the RESET's own lines aside.
    let steps: Vec<&String> = sent.iter().filter(|s| !s.contains("log_statement")).collect();
    assert_eq!(steps.len(), 7, "round trips for one trivial session: {steps:#?}");
    let status: String =
        conn.client().query_one("SELECT status FROM cairn_sessions WHERE id = $1", &[&id]).unwrap().get(0);
    assert_eq!(status, "idle");
    let reopened = PgStore::open(connect(&url).unwrap(), &id).unwrap();
    let ids: Vec<String> = reopened.entries().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["p", "a"]);

    // The one-statement commit refuses as the transaction did, writing
    // nothing: a prompt already taken, another writer's line (CAS), a
    // lease taken over.
    let inbox = lease::submit(&mut conn, &id, "again").unwrap();
    let claim = lease::claim(&mut conn, "w/0", lease_len).unwrap().unwrap();
    let mut store = PgStore::open_fenced_on(conn, &id, claim.fence.clone()).unwrap();
    let mut other = connect(&url).unwrap();
    other.execute("DELETE FROM cairn_inbox WHERE id = $1", &[&inbox]).unwrap();
    *store.inbox_slot().lock().unwrap() = Some(inbox);
    let err = store.commit(Transaction::new().entry("q", None, "m", raw(json!("again")))).unwrap_err();
    assert!(err.to_string().contains("already taken"), "{err}");
    *store.inbox_slot().lock().unwrap() = None;
    let mut rival = PgStore::open_fenced(connect(&url).unwrap(), &id, claim.fence.clone()).unwrap();
    rival.commit(Transaction::new().entry("r", None, "m", raw(json!("rival")))).unwrap();
    let err = store.commit(Transaction::new().entry("s", None, "m", raw(json!("late")))).unwrap_err();
    assert!(err.to_string().contains("another writer committed"), "{err}");
    other.execute("UPDATE cairn_sessions SET epoch = epoch + 1, lease_owner = 'b' WHERE id = $1", &[&id]).unwrap();
    let err = rival.commit(Transaction::new().entry("t", None, "m", raw(json!("fenced")))).unwrap_err();
    assert!(err.to_string().contains("lease lost"), "{err}");
    assert!(rival.lease_lost().load(std::sync::atomic::Ordering::SeqCst));
    let lines: i64 = other.query_one("SELECT count(*) FROM cairn_lines WHERE session_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(lines, 3, "p, a and the rival's r; nothing of the refused commits");
    let last: i64 = other.query_one("SELECT last_seq FROM cairn_sessions WHERE id = $1", &[&id]).unwrap().get(0);
    assert_eq!(u64::try_from(last).unwrap(), PgStore::open(connect(&url).unwrap(), &id).unwrap().last_seq());
}
