//! An agent's sessions in PostgreSQL ([`crate::AgentBuilder::database`]).
//! A session an application creates is marked as the application's
//! (`cairn_pg::app`): no `cairn worker` takes it, because the
//! application's tools exist only in its processes. Each run or resume
//! claims the session by id under a lease with a fencing epoch, as a
//! worker's claim does, keeps the lease while it drives the turn
//! (`cairn_pg::app::Keeper`), and releases it after. The turn is equipped
//! as a worker's turn is (`equip::turn`, the subagent family in the same
//! database within the lease), with the application's tools and approver.
//!
//! Must not: decide what a turn does or settle a call itself (cairn-core's
//! `Session::resume` settles a call cut short, as for a file), nor claim a
//! session the workers drive (`cairn_pg::app::claim` refuses it).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cairn_core::storage::{Header, Storage as _, Transaction, new_session_id};
use cairn_core::{CancelToken, Session, SessionConfig};
use cairn_host::{Equipment, Step};
use cairn_pg::PgStore;
use cairn_pg::app::{Claimed, Keeper, Kept};
use cairn_pg::lease::{Claim, LeaseClock, Release};
use cairn_runtime::equip::Answerer;
use cairn_runtime::subagents::{FamilyPlace, Inheritance};

use crate::{Agent, Event, Outcome};

/// Where an agent keeps its sessions: the database and the lease its
/// process holds them under, and the application's label on them.
#[derive(Debug)]
pub(crate) struct Database {
    url: String,
    lease: Duration,
    /// The application's label on its sessions (its program's name), shown
    /// to whoever tries to drive one elsewhere.
    app: String,
}

impl Database {
    pub(crate) fn new(url: String, lease: Option<Duration>) -> Result<Self> {
        if url.trim().is_empty() {
            bail!("the database URL is empty (an unset variable?); give postgres://USER@HOST/DB");
        }
        let lease = lease.unwrap_or(cairn_pg::DEFAULT_LEASE);
        let max = Duration::from_secs(cairn_pg::lease::MAX_LEASE_SECS);
        if lease < Duration::from_secs(1) || lease > max {
            bail!("a lease of {lease:?} is out of range: give 1 s to {} s (a day)", max.as_secs());
        }
        let app = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "an application".to_owned());
        Ok(Self { url, lease, app })
    }

    /// The lease owner: this process (a dead one's lease is told apart by
    /// the epoch, which every claim raises).
    fn owner(&self) -> String {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}:{}/{}", host.trim(), std::process::id(), self.app)
    }

    fn connect(&self) -> Result<cairn_pg::Connection> {
        let client = cairn_pg::connect_for(&self.url, self.lease)
            .with_context(|| format!("cannot use the database {}", cairn_runtime::redact::redact(&self.url)))?;
        Ok(cairn_pg::Connection::from(client))
    }
}

/// A claimed session: its store, opened under the claim's fence, and the
/// keeper renewing the lease.
struct Held {
    store: PgStore,
    claim: Claim,
    keeper: Keeper,
}

fn hold(db: &Database, conn: cairn_pg::Connection, claim: Claim, sent: Instant, cancel: &CancelToken) -> Result<Held> {
    let clock = LeaseClock::start(sent, db.lease);
    let mut store = PgStore::open_fenced_on(conn, &claim.session, claim.fence.clone())
        .with_context(|| format!("cannot open session {}", claim.session))?;
    store.set_lease_clock(clock.clone());
    store.set_cancel(cancel.clone());
    store.set_reconnect(db.url.clone(), db.lease);
    let keeper = Keeper::start(Kept {
        url: db.url.clone(),
        claim: claim.clone(),
        clock,
        lost: store.lease_lost(),
        cancel: cancel.clone(),
    });
    Ok(Held { store, claim, keeper })
}

/// [`Agent::run`] on a new session of the database.
pub(crate) fn run(
    agent: &Agent,
    db: &Database,
    prompt: &str,
    on_event: &mut dyn FnMut(&Event),
    cancel: &CancelToken,
) -> Result<Outcome> {
    let ctx = &agent.host.ctx;
    let cwd = cairn_runtime::parts::new_session_cwd(ctx)?;
    let header = Header::new(new_session_id(), cwd.display().to_string());
    let mut conn = db.connect()?;
    let sent = Instant::now();
    let claim = cairn_pg::app::create(&mut conn, &header, &db.app, &db.owner(), db.lease)
        .context("cannot create the session in the database")?;
    let mut held = hold(db, conn, claim, sent, cancel)?;
    if let Some(name) = &ctx.common.name {
        held.store.commit(Transaction::new().set_session_name(name)?)?;
    }
    drive(agent, db, held, Some(prompt), on_event, cancel)
}

/// [`Agent::resume`] of a session of the database.
pub(crate) fn resume(
    agent: &Agent,
    db: &Database,
    target: &str,
    on_event: &mut dyn FnMut(&Event),
    cancel: &CancelToken,
) -> Result<Outcome> {
    let mut conn = db.connect()?;
    let id = cairn_pg::catalog::resolve(&mut conn, target)?;
    let (claim, sent) = claim_when_free(&mut conn, db, &id, cancel)?;
    let held = hold(db, conn, claim, sent, cancel)?;
    drive(agent, db, held, None, on_event, cancel)
}

/// Claim session `id`, waiting for a holder's lease to end when it is not
/// renewed (its process died); a lease renewed meanwhile is a live
/// process's, and refused.
fn claim_when_free(
    conn: &mut cairn_pg::Connection,
    db: &Database,
    id: &str,
    cancel: &CancelToken,
) -> Result<(Claim, Instant)> {
    let owner = db.owner();
    let mut seen: Option<(String, i64)> = None;
    loop {
        let sent = Instant::now();
        match cairn_pg::app::claim(conn, id, &owner, db.lease)? {
            Claimed::Ours(claim) => return Ok((claim, sent)),
            Claimed::Held { owner: holder, epoch, left } => {
                // Waited for it once already and it has more than a clock's
                // slop left: it was renewed, so its holder is alive.
                if seen.as_ref() == Some(&(holder.clone(), epoch)) && left > Duration::from_millis(500) {
                    bail!(
                        "session {id} is being driven by {holder} (epoch {epoch}), which keeps renewing its lease: \
                         another live process holds it; resume it after that process's turn ends"
                    );
                }
                seen = Some((holder, epoch));
                // By the server's clock the lease ends in `left`; a little
                // past it, so it has ended there too.
                let until = Instant::now() + left + Duration::from_millis(50);
                while Instant::now() < until {
                    if cancel.is_cancelled() {
                        bail!("cancelled while waiting for the lease on session {id} to expire");
                    }
                    std::thread::sleep(Duration::from_millis(20).min(until.saturating_duration_since(Instant::now())));
                }
            }
        }
    }
}

/// Run `prompt` (or resume the interrupted turn: `None`) on the held
/// session, equipped as a worker's turn is, then release the lease: as
/// done when the turn ended, for another try (still resumable) when it
/// failed, not at all when it was lost (no longer ours).
fn drive(
    agent: &Agent,
    db: &Database,
    held: Held,
    prompt: Option<&str>,
    on_event: &mut dyn FnMut(&Event),
    cancel: &CancelToken,
) -> Result<Outcome> {
    let Held { store, claim, keeper } = held;
    let lost = store.lease_lost();
    let (result, conn) = turn(agent, db, store, &claim.session, prompt, on_event, cancel);
    drop(keeper);
    if lost.load(std::sync::atomic::Ordering::SeqCst) {
        return result;
    }
    let (how, note) = match &result {
        Ok(_) => (Release::Done, None),
        Err(e) => (Release::Retry, Some(format!("{e:#}"))),
    };
    // On the session's connection when it is still open, else a new one.
    let conn = match conn.filter(|c| !c.is_closed()) {
        Some(conn) => Ok(conn),
        None => db.connect(),
    };
    let released = conn.and_then(|mut conn| {
        Ok(cairn_pg::lease::release(&mut conn, &claim.session, &claim.fence, how, note.as_deref())?)
    });
    // Unreleased, the lease simply expires; only a finished turn's failure
    // to let go is worth telling.
    if let (Err(e), Ok(_)) = (released, &result) {
        return Err(e.context(format!(
            "session {}: the turn finished, but its lease could not be released (it expires within {} s)",
            claim.session,
            db.lease.as_secs()
        )));
    }
    result
}

/// The turn itself; the store's connection is given back when the
/// session could be opened (to release the lease on).
fn turn(
    agent: &Agent,
    db: &Database,
    mut store: PgStore,
    id: &str,
    prompt: Option<&str>,
    on_event: &mut dyn FnMut(&Event),
    cancel: &CancelToken,
) -> (Result<Outcome>, Option<cairn_pg::Connection>) {
    let ctx = &agent.host.ctx;
    let cwd = PathBuf::from(&store.header().cwd);
    let mut provider = match agent.provider.lock() {
        Ok(provider) => provider,
        Err(_) => return (Err(anyhow::anyhow!("an earlier run panicked")), Some(store.into_connection())),
    };
    if let Err(e) = agent.record_provider(&mut store, &**provider) {
        return (Err(e), Some(store.into_connection()));
    }
    let config = SessionConfig { cwd: Some(cwd.clone()), ..cairn_runtime::parts::session_config(ctx) };
    let mut session = match Session::open(store, config.clone()) {
        Ok(session) => session,
        Err(e) => return (Err(e.into()), None),
    };
    let mut notes = Vec::new();
    // An undo killed after its plan was committed is finished first: no
    // turn runs on a half-reverted tree.
    let kept = cairn_runtime::undo::store(ctx);
    match cairn_tools::rewind::finish_interrupted(&kept, &mut session, &cwd, false) {
        Ok(done) => notes.extend(done),
        Err(e) => return (Err(e.into()), Some(session.into_store().into_connection())),
    }
    let approver = agent.approver();
    // The family lives in this database, within this lease, as a worker's.
    let mut inheritance = Inheritance::of(&approver, agent.person.clone());
    if let Some(hold) = session.store().hold() {
        inheritance.place =
            FamilyPlace::Database(cairn_runtime::subagents::db::Database::new(db.url.clone(), hold, cancel.clone()));
    }
    let mut store = session.into_store();
    let answerer = Answerer { approver: &approver, family: Some(&inheritance) };
    let offer = cairn_runtime::equip::turn(ctx, &cwd, &mut store, prompt, answerer, config).and_then(|mut offer| {
        crate::host::narrow(&mut offer.tools, &agent.builtins, &agent.tools)?;
        Ok(offer)
    });
    let mut offer = match offer {
        Ok(offer) => offer,
        Err(e) => return (Err(e), Some(store.into_connection())),
    };
    let registry = offer.registry(&approver);
    notes.extend(offer.all_notes().cloned());
    cairn_runtime::subagents::reattach_children(id, &inheritance);
    let mut session = match Session::open(store, offer.config) {
        Ok(session) => session,
        Err(e) => return (Err(e.into()), None),
    };
    let mut equipment = Equipment { tools: registry, approver };
    let step = prompt.map_or(Step::Resume, Step::Prompt);
    let outcome = agent.drive(&mut session, &mut equipment, &mut **provider, step, notes, on_event, cancel);
    // Children still running run within this lease: it is not released
    // under them.
    cairn_runtime::subagents::finish_children(id, &inheritance);
    (outcome, Some(session.into_store().into_connection()))
}
