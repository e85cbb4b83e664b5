//! Running children: the children this process knows ([`Family`], one per
//! process, each a [`Slot`] on a thread of its own), attaching a child
//! (created once, read when finished, resumed when not), driving it to its
//! answer through `cairn_host::Equipment`, and waiting for the running ones
//! before the process or a worker's turn ends.
//!
//! Must not: decide what a child may be given (`tools.rs`'s plan does) or
//! show anything (`show.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_core::approval::Allowlist;
use cairn_core::storage::registers::FACT;
use cairn_core::storage::{Header, Storage, Transaction, to_raw};
use cairn_core::{CancelToken, Session, TurnStop};
use cairn_host::{Equipment, Step};

use super::{
    ChildResult, ChildStatus, FamilyPlace, Files, Inheritance, Limits, Place, SPAWN, Scope, build, is_scripted,
    last_answer, own_child, status,
};
use crate::family::{ChildFact, FACT_KEY, SEP, child_fact, parent_of};
use crate::setup::Setup;

/// One child known to this process: running on a thread, or finished.
#[derive(Debug, Default)]
pub(super) struct Slot {
    done: Mutex<Option<ChildResult>>,
    changed: Condvar,
}

impl Slot {
    fn finish(&self, result: ChildResult) {
        if let Ok(mut done) = self.done.lock() {
            *done = Some(result);
        }
        self.changed.notify_all();
    }

    pub(super) fn result(&self) -> Option<ChildResult> {
        self.done.lock().ok().and_then(|d| d.clone())
    }

    /// Wait for the result until `deadline` (None: no deadline) or a cancel.
    pub(super) fn wait(&self, deadline: Option<Instant>, cancel: &CancelToken) -> Option<ChildResult> {
        let Ok(mut done) = self.done.lock() else { return None };
        loop {
            if let Some(result) = done.clone() {
                return Some(result);
            }
            if cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            // Wake regularly to see a cancel.
            let step = Duration::from_millis(100);
            let step = deadline.map_or(step, |d| step.min(d.saturating_duration_since(Instant::now())));
            done = match self.changed.wait_timeout(done, step) {
                Ok((guard, _)) => guard,
                Err(_) => return None,
            };
        }
    }
}

/// A child known to this process: the drive of its family it belongs to
/// ([`Place::generation`]) and its id.
type SlotKey = (String, String);

/// The children of this process (one family per `cairn` process).
pub(super) struct Family {
    pub(super) ctx: Setup,
    pub(super) limits: Limits,
    slots: Mutex<BTreeMap<SlotKey, Arc<Slot>>>,
}

static FAMILY: OnceLock<Family> = OnceLock::new();

pub(super) fn family(ctx: &Setup, limits: Limits) -> &'static Family {
    FAMILY.get_or_init(|| Family { ctx: ctx.clone(), limits, slots: Mutex::new(BTreeMap::new()) })
}

/// Before the process exits: wait for the children still running on its
/// threads (started with `wait: false` and never gathered), so they finish
/// instead of stopping mid-turn. Ctrl-C leaves at once (a child stopped
/// there is resumed when its parent re-attaches it).
pub fn finish_running() {
    let Some(family) = FAMILY.get() else { return };
    let slots: Vec<Arc<Slot>> = family.slots.lock().map(|s| s.values().cloned().collect()).unwrap_or_default();
    if slots.iter().any(|s| s.result().is_none()) {
        family
            .ctx
            .notes
            .info("waiting for running child sessions to finish (Ctrl-C leaves; they resume with their parent)");
    }
    let never = CancelToken::new();
    for slot in slots {
        slot.wait(None, &never);
    }
}

/// `cairn resume` of a parent (or a worker's turn of one): resume its
/// children a crash left unfinished, also those no pending call of the
/// parent will re-attach (started with `wait: false`; `finish_running`, or
/// for a worker `finish_children`, waits for them).
pub fn reattach_children(parent: &str, inheritance: &Inheritance) {
    match &inheritance.place {
        FamilyPlace::Files => reattach(&Arc::new(Files), parent, inheritance),
        #[cfg(feature = "postgres")]
        FamilyPlace::Database(db) => reattach(db, parent, inheritance),
    }
}

fn reattach<P: Place>(place: &Arc<P>, parent: &str, inheritance: &Inheritance) {
    let Some(family) = FAMILY.get() else { return };
    for id in family.children_of(&**place, parent).unwrap_or_default() {
        // Without its fact the child was cut off while being created: only
        // its `spawn_agent` call (pending, so re-run) can finish that.
        let Ok(Some(store)) = place.read(&family.ctx, &id) else { continue };
        if child_fact(&store).is_none() || own_child(&**place, &family.ctx, &id, &store, None).is_err() {
            continue;
        }
        if matches!(status(&family.ctx, store), Ok(ChildStatus::Finished(_))) {
            // Its driver may have been cut off between its answer and
            // saying so (a database row left `running`).
            let _ = place.found_finished(&family.ctx, &id);
        } else {
            // A child that cannot be re-attached is reported by the call
            // that gathers it.
            let _ = family.attach(place, &id, None, inheritance);
        }
    }
}

/// Wait until the children of `parent` (and theirs) that this drive of the
/// family started are no longer running (a worker, before it leaves a
/// turn: its children run within its lease, which it must not release
/// under them), then forget them: their results are in the place, read
/// again should a later call gather them (a long-running worker keeps no
/// table of every child it ever ran). A child stopped by the drive's token
/// ends at once.
#[cfg(feature = "postgres")]
pub fn finish_children(parent: &str, inheritance: &Inheritance) {
    let generation = match &inheritance.place {
        FamilyPlace::Files => Files.generation(),
        #[cfg(feature = "postgres")]
        FamilyPlace::Database(db) => db.generation(),
    };
    let Some(family) = FAMILY.get() else { return };
    let prefix = format!("{parent}{SEP}");
    let never = CancelToken::new();
    loop {
        let running: Vec<Arc<Slot>> = family
            .slots
            .lock()
            .map(|slots| {
                slots
                    .iter()
                    .filter(|((g, id), slot)| *g == generation && id.starts_with(&prefix) && slot.result().is_none())
                    .map(|(_, slot)| Arc::clone(slot))
                    .collect()
            })
            .unwrap_or_default();
        if running.is_empty() {
            if let Ok(mut slots) = family.slots.lock() {
                slots.retain(|(g, id), slot| !(*g == generation && id.starts_with(&prefix) && slot.result().is_some()));
            }
            return;
        }
        // A child may start a grandchild while we wait: look again.
        for slot in running {
            slot.wait(None, &never);
        }
    }
}

impl Family {
    /// The slot of child `id` of `place`: already known to this drive of
    /// the family, or read from the place (finished), or started on a
    /// thread (unfinished: resumed). With `create` the child is created
    /// when it does not exist — the only place a child is created, so never
    /// twice.
    pub(super) fn attach<P: Place>(
        &'static self,
        place: &Arc<P>,
        id: &str,
        create: Option<(&ChildFact, &Path)>,
        inheritance: &Inheritance,
    ) -> Result<Arc<Slot>> {
        let ctx = &self.ctx;
        let key = (place.generation(), id.to_owned());
        let mut slots = self.slots.lock().map_err(|_| anyhow!("the subagent table is poisoned"))?;
        if let Some(slot) = slots.get(&key) {
            return Ok(Arc::clone(slot));
        }
        // A store opened for writing here is handed to the child's thread,
        // never closed and reopened: a process forked meanwhile (a tool's
        // namespace waiter) would hold a closed file's lock a while.
        let mut writer = None;
        let found = place.read(ctx, id)?;
        if let Some(existing) = &found {
            own_child(&**place, ctx, id, existing, create.map(|(fact, _)| fact))?;
        }
        match (found, create) {
            (None, None) => bail!("no child session {id}"),
            (None, Some((fact, cwd))) => {
                self.check_limits(&**place, &fact.parent, &slots)?;
                let mut store = place.create(ctx, Header::new(id, cwd.display().to_string()))?;
                store.commit(Transaction::new().set(FACT, FACT_KEY, to_raw(fact)?))?;
                writer = Some(store);
            }
            (Some(existing), Some((fact, _))) => {
                // Killed between the header and the fact: add the fact.
                if existing.register(FACT, FACT_KEY).is_none() {
                    drop(existing);
                    let mut store = place.open(ctx, id)?.ok_or_else(|| anyhow!("child session {id} is gone"))?;
                    store.commit(Transaction::new().set(FACT, FACT_KEY, to_raw(fact)?))?;
                    writer = Some(store);
                }
            }
            (Some(_), None) => {}
        }
        let slot = Arc::new(Slot::default());
        let stored = place.read(ctx, id)?.ok_or_else(|| anyhow!("child session {id} is gone"))?;
        if let ChildStatus::Finished(result) = status(ctx, stored)? {
            // Said by its stored state; a row left `running` says it too
            // (a failure to say so leaves the answer as it is).
            let _ = place.found_finished(ctx, id);
            slot.finish(result);
        } else {
            let (runner, child, inheritance, place) =
                (Arc::clone(&slot), id.to_owned(), inheritance.clone(), Arc::clone(place));
            std::thread::Builder::new()
                .name(format!("child {id}"))
                .spawn(move || {
                    let result = match self.run_child(&place, &child, writer, inheritance) {
                        Ok(result) => result,
                        Err(e) => ChildResult::Failed(format!("{e:#}")),
                    };
                    self.stopped(&*place, &child, &result);
                    runner.finish(result);
                })
                .context("cannot start a thread for the child")?;
        }
        slots.insert(key, Arc::clone(&slot));
        Ok(slot)
    }

    /// Tell the `subagent_stop` hooks (of the child's directory) that
    /// child `id` ended with `result`, before its parent is given it.
    fn stopped<P: Place>(&self, place: &P, id: &str, result: &ChildResult) {
        let Ok(Some(store)) = place.read(&self.ctx, id) else { return };
        let cwd = PathBuf::from(&store.header().cwd);
        let parent = parent_of(id).unwrap_or_default();
        if let Some(hooks) = crate::tools::hooks(&self.ctx, &cwd) {
            let (answer, failed) = match result {
                ChildResult::Answered(text) => (text.as_str(), false),
                ChildResult::Failed(why) => (why.as_str(), true),
            };
            hooks.subagent_stop(parent, id, &cwd, answer, failed);
        }
    }

    fn check_limits<P: Place>(&self, place: &P, parent: &str, slots: &BTreeMap<SlotKey, Arc<Slot>>) -> Result<()> {
        let running = slots.values().filter(|s| s.result().is_none()).count();
        if running >= self.limits.max_running {
            bail!(
                "{running} children are running, the limit ([subagents] max_running); collect some with wait_agents first"
            );
        }
        let mine = self.children_of(place, parent)?.len();
        if mine >= self.limits.max_children {
            bail!("this session has started {mine} children, the limit ([subagents] max_children)");
        }
        Ok(())
    }

    /// The ids of `parent`'s children, in the order they were started
    /// (invocation ids grow with the log).
    pub(super) fn children_of<P: Place>(&self, place: &P, parent: &str) -> Result<Vec<String>> {
        let mut ids = place.children(&self.ctx, parent)?;
        ids.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        Ok(ids)
    }

    /// Drive child `id` to its answer: its first turn, or the resumption of
    /// an interrupted one. The place keeps a second driver out (a file's
    /// writer lock; a database's lease).
    fn run_child<P: Place>(
        &'static self,
        place: &Arc<P>,
        id: &str,
        writer: Option<P::Store>,
        inheritance: Inheritance,
    ) -> Result<ChildResult> {
        let ctx = &self.ctx;
        let store = match writer {
            Some(store) => store,
            None => place.open(ctx, id)?.ok_or_else(|| anyhow!("no child session {id}"))?,
        };
        let fact: ChildFact = store
            .register(FACT, FACT_KEY)
            .ok_or_else(|| anyhow!("child session {id} has no `subagent` fact"))?
            .parse()
            .with_context(|| format!("child session {id}: unreadable `subagent` fact"))?;
        let cwd = PathBuf::from(&store.header().cwd);
        let provider =
            crate::parts::provider_for(ctx, &fact.provider, fact.model.as_deref(), fact.script.as_deref(), &cwd)?;
        let allow = Allowlist::parse(fact.allow.iter().map(String::as_str)).context("child allow patterns")?;
        let approver = inheritance.policy(allow);
        // The tools as the parent's face was equipped with them (the tool
        // service's when one is configured), only those the child was
        // given; a tool the registry refuses here (Destructive, headless) is
        // simply not offered, as for the parent.
        let mut given = crate::tools::turn_tools(ctx, &cwd)?.chosen(None);
        given.tools.retain(|t| fact.tools.contains(&t.spec().name));
        {
            let scripted = is_scripted(ctx, &fact.provider);
            let scope = Scope {
                cwd: cwd.clone(),
                tools: fact.tools.clone(),
                allow: fact.allow.clone(),
                provider: fact.provider.clone(),
                model: fact.model.clone(),
                script: fact.script.clone(),
                scripted,
                inheritance: inheritance.clone(),
            };
            let may_spawn = fact.tools.iter().any(|t| t == SPAWN) && fact.depth < self.limits.max_depth;
            // Its own children live where it does.
            // Offered to the parent under the same rules: not refused.
            given.tools.extend(build(self, scope, Arc::clone(place), may_spawn));
        }
        let registry = given.registry(&approver, |_| {});
        let mut config = crate::parts::session_config(ctx);
        config.lane = cairn_core::turn::DEFAULT_LANE.to_owned();
        let mut session = Session::open(store, config)?;
        let mut equipment = Equipment { tools: registry, approver };
        let outcome =
            equipment.run(&mut session, &*provider, Step::Once(&fact.prompt), &mut |_| {}, &place.cancel())?;
        let result = if let Some(o) = outcome.as_ref().filter(|o| o.stop == TurnStop::Stopped) {
            ChildResult::Failed(format!("a pre_tool hook stopped the child's turn: {}", o.text))
        } else if outcome.is_some_and(|o| o.stop == TurnStop::StepLimit) {
            ChildResult::Failed("the child reached its step limit".to_owned())
        } else {
            ChildResult::Answered(last_answer(&session))
        };
        place.ended(&mut session.into_store())?;
        Ok(result)
    }
}
