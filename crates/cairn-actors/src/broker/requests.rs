//! The broker's requests (`{"to":"broker"}`): parsing each request type,
//! the authority checks (who may manage, who may grant HTTP), path
//! resolution for the sender, and starting the work each one asks for.
//! Owns no state of its own: it runs on the broker thread as methods of
//! `Broker` and must never block it (compiling and copying large trees
//! here stalls every actor's routing) nor reply for work that finishes
//! later (upgrade, rollback, stop and remove answer from `do_after`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::thread;

use anyhow::{anyhow, bail};
use serde_json::{Value, json};
use wasmtime::component::Component;

use super::{
    AfterStop, Broker, COMPILES_AT_ONCE, Event, ModuleBytes, Purpose, SOURCE_LIMIT, Spawning, Tested, Upgrade,
    read_wasm,
};
use crate::layout::{self, ActorEntry, ActorLimits, Desired};
use crate::message::{self, AGENT, CONSOLE};
use crate::transcript::{self, Candidate};

/// The limits a spawn request may set (`"limits"`), as in
/// [`ActorLimits`].
const LIMIT_NAMES: [&str; 8] =
    ["memory_bytes", "table_elements", "instances", "memories", "tables", "disk_bytes", "disk_entries", "fuel"];

/// One request as received: who sent it, its full id, its body and type.
struct Req<'a> {
    from: &'a str,
    req_id: &'a str,
    body: &'a Value,
    ty: &'a str,
}

impl Req<'_> {
    fn field(&self, k: &str) -> Option<&str> {
        self.body.get(k).and_then(Value::as_str)
    }

    fn need(&self, k: &str) -> anyhow::Result<String> {
        self.field(k).map(str::to_owned).ok_or_else(|| anyhow!("request {:?} needs a string field {k:?}", self.ty))
    }
}

impl Broker {
    pub(super) fn request(&mut self, from: &str, req_id: &str, body: Value) {
        let r = self.request_inner(from, req_id, &body);
        match r {
            Ok(Some(v)) => self.reply(from, req_id, v),
            Ok(None) => {} // answered later (upgrade, stop, remove)
            Err(e) => self.reply(from, req_id, json!({"type": "error", "reason": format!("{e:#}")})),
        }
    }

    /// Whether `from` may send to `http`: the console, the agent, and
    /// actors whose spawn request declared `"http": true`.
    pub(super) fn may_use_http(&self, from: &str) -> bool {
        Self::native(from) || self.reg.actors.get(from).is_some_and(|e| e.http)
    }

    fn native(from: &str) -> bool {
        from == CONSOLE || from == AGENT
    }

    fn may_manage(&self, from: &str, id: &str) -> bool {
        from == id || from == AGENT || Self::native(from) || self.reg.actors.get(id).is_some_and(|e| e.spawner == from)
    }

    fn request_inner(&mut self, from: &str, req_id: &str, body: &Value) -> anyhow::Result<Option<Value>> {
        let r = Req { from, req_id, body, ty: body.get("type").and_then(Value::as_str).unwrap_or("") };
        match r.ty {
            "list" => Ok(Some(self.list())),
            "subscribe" | "unsubscribe" => self.subscribe(&r).map(Some),
            "spawn" => self.spawn(&r).map(|()| None),
            "upgrade" => self.upgrade(&r).map(|()| None),
            "rollback" => self.rollback_request(&r).map(|()| None),
            "stop" | "remove" => self.stop_or_remove(&r).map(|()| None),
            "start" => self.start(&r).map(Some),
            other => bail!(
                "unknown request type {other:?}; one of spawn, upgrade, rollback, stop, start, remove, subscribe, unsubscribe, list"
            ),
        }
    }

    fn existing(&self, id: &str) -> anyhow::Result<()> {
        if self.reg.actors.contains_key(id) { Ok(()) } else { Err(anyhow!("no actor {id:?}")) }
    }

    fn list(&self) -> Value {
        let actors: Vec<Value> = self
            .reg
            .actors
            .iter()
            .map(|(id, e)| {
                json!({"id": id, "version": e.version, "latest": e.latest,
                    "state": self.state(id), "desired": e.desired,
                    "subscribers": e.subscribers, "spawner": e.spawner})
            })
            .collect();
        json!({"type": "list", "actors": actors})
    }

    fn subscribe(&mut self, r: &Req<'_>) -> anyhow::Result<Value> {
        let (ty, from) = (r.ty, r.from);
        let target = r.need("actor")?;
        let set = match self.reg.actors.get_mut(&target) {
            Some(e) => &mut e.subscribers,
            None if target == CONSOLE || target == AGENT => {
                self.reg.native_subscribers.entry(target.clone()).or_default()
            }
            None => bail!("no actor {target:?} to {ty} to"),
        };
        if ty == "subscribe" {
            set.insert(from.to_owned());
        } else {
            set.remove(from);
        }
        self.save();
        Ok(json!({"type": "ok", "request": ty, "actor": target}))
    }

    /// Checks a spawn and starts its compilation on a thread of its own
    /// (`compiled` finishes it): a large or slow module must never stop
    /// the broker from routing.
    fn spawn(&mut self, r: &Req<'_>) -> anyhow::Result<()> {
        let from = r.from;
        let id = r.need("id")?;
        message::check_actor_id(&id)?;
        if self.reg.actors.contains_key(&id) {
            bail!("actor {id:?} exists; use upgrade");
        }
        if self.compiles.values().any(|c| matches!(&c.purpose, Purpose::Spawn(s) if s.id == id)) {
            bail!("actor {id:?} is being spawned already");
        }
        self.compile_slot_free()?;
        let http = r.body.get("http").and_then(Value::as_bool).unwrap_or(false);
        if http && !self.may_use_http(from) {
            // Else an actor without HTTP could spawn one that has it.
            bail!("{from} may not grant \"http\": it did not declare it in its own spawn request");
        }
        let limits = self.requested_limits(from, r.body.get("limits"))?;
        self.within_budget(from, &id, &limits)?;
        let wasm = self.path(from, &r.need("wasm")?)?;
        let source = r.field("source").map(|s| self.path(from, s)).transpose()?;
        let bytes = read_wasm(&wasm)?;
        check_ext(&wasm)?;
        if let Some(s) = &source {
            self.check_source(&id, s)?;
        }
        let sp = Spawning {
            id,
            from: from.to_owned(),
            req_id: r.req_id.to_owned(),
            wasm: wasm.clone(),
            source,
            built_by: r.field("built_by").map(str::to_owned),
            http,
            limits,
        };
        self.start_compile(ModuleBytes::Read(bytes), wasm, Purpose::Spawn(Box::new(sp)))
    }

    /// A spawn's compilation is done (within the budget: one past it was
    /// answered already): install version 1 and start it, or answer why
    /// not. Whatever fails leaves no trace of the actor.
    pub(super) fn compiled(&mut self, sp: Spawning, result: Result<Component, String>, bytes: &[u8]) {
        if self.reg.actors.contains_key(&sp.id) {
            // Never possible while its compile runs (`spawn` refuses), but never
            // clean up (below) another actor's directories either.
            let reason = format!("actor {:?} exists; use upgrade", sp.id);
            return self.reply(&sp.from, &sp.req_id, json!({"type": "error", "request": "spawn", "reason": reason}));
        }
        let r = result.map_err(|e| anyhow!(e)).and_then(|c| self.install_spawn(&sp, c, bytes));
        let body = match r {
            Ok(()) => json!({"type": "ok", "request": "spawn", "id": sp.id, "version": 1}),
            Err(e) => {
                for d in [self.layout.actor_dir(&sp.id), self.layout.data(&sp.id), self.layout.versions(&sp.id)] {
                    let _ = std::fs::remove_dir_all(d);
                }
                json!({"type": "error", "request": "spawn", "reason": format!("{e:#}")})
            }
        };
        self.reply(&sp.from, &sp.req_id, body);
    }

    fn install_spawn(&mut self, sp: &Spawning, component: Component, bytes: &[u8]) -> anyhow::Result<()> {
        let id = sp.id.clone();
        self.install_version(&id, 1, &sp.wasm, bytes, sp.source.as_deref(), sp.built_by.as_deref(), &sp.from)?;
        self.layout.init_actor(&id)?;
        if sp.source.is_some() {
            // From the version's copy: the source itself may have changed.
            layout::replace_tree(&self.layout.version(&id, 1).join("source"), &self.layout.source(&id))?;
        }
        self.reg.actors.insert(
            id.clone(),
            ActorEntry {
                version: 1,
                latest: 1,
                spawner: sp.from.clone(),
                desired: Desired::Running,
                subscribers: BTreeSet::new(),
                http: sp.http,
                watch: None,
                limits: sp.limits,
            },
        );
        self.save();
        self.ensure_rt(&id)?;
        if let Some(a) = self.actors.get_mut(&id) {
            a.components.insert(1, component);
        }
        self.start_actor(&id, None);
        Ok(())
    }

    /// A spawn's `"limits": {name: n, …}` (names: [`LIMIT_NAMES`]): each a
    /// whole number at most its spawner's own (the world's for the console
    /// and the agent; an actor's limits for an actor), so a spawner can
    /// lower what its actor gets, never raise it. An actor's child gets
    /// its spawner's limits for those the request does not give.
    fn requested_limits(&self, from: &str, v: Option<&Value>) -> anyhow::Result<ActorLimits> {
        let spawner = self.reg.actors.get(from).map(|e| e.limits);
        let mut out = spawner.unwrap_or_default();
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(out) };
        let Some(map) = v.as_object() else { bail!("\"limits\" must be an object, not {v}") };
        let (ceiling, whose) = match spawner {
            Some(_) => (self.limits_of(from), format!("{from:?}'s own")),
            None => (self.cfg.limits, "the world's".to_owned()),
        };
        for (k, x) in map {
            let as64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
            let (max, field) = match k.as_str() {
                "memory_bytes" => (Some(as64(ceiling.memory_bytes)), &mut out.memory_bytes),
                "table_elements" => (Some(as64(ceiling.table_elements)), &mut out.table_elements),
                "instances" => (Some(as64(ceiling.instances)), &mut out.instances),
                "memories" => (Some(as64(ceiling.memories)), &mut out.memories),
                "tables" => (Some(as64(ceiling.tables)), &mut out.tables),
                "disk_bytes" => (Some(ceiling.disk_bytes), &mut out.disk_bytes),
                "disk_entries" => (Some(as64(ceiling.disk_entries)), &mut out.disk_entries),
                "fuel" => (ceiling.fuel, &mut out.fuel),
                other => bail!("unknown limit {other:?}; one of {}", LIMIT_NAMES.join(", ")),
            };
            let Some(n) = x.as_u64() else { bail!("limit {k:?} must be a whole number, not {x}") };
            let Some(max) = max else {
                bail!(
                    "limit {k:?} cannot be set: this world does not meter fuel (`cairn world run --fuel N` turns it on)"
                )
            };
            if n > max {
                bail!("limit {k:?} of {n} is above {whose} {max}; a spawn may only lower a limit");
            }
            *field = Some(n);
        }
        Ok(out)
    }

    /// The actors `from` descends from, itself first (nothing for the
    /// console, the agent, or an id not in the registry), following each
    /// actor's spawner; a chain that loops (ids reused after a remove) is
    /// cut where it comes back.
    fn ancestors(&self, from: &str) -> Vec<String> {
        let mut chain: Vec<String> = Vec::new();
        let mut at = from;
        while let Some(e) = self.reg.actors.get(at) {
            if chain.iter().any(|c| c == at) {
                break;
            }
            chain.push(at.to_owned());
            at = &e.spawner;
        }
        chain
    }

    /// The lineage an actor's abandoned instances count against: the
    /// first of its ancestors spawned by the console or the agent (itself
    /// if they spawned it).
    pub(super) fn lineage(&self, id: &str) -> String {
        self.ancestors(id).pop().unwrap_or_else(|| id.to_owned())
    }

    /// Refuses a spawn of `id` by `from` with `limits` that would take the
    /// world past one of its budgets ([`super::WorldBudget`]), naming it.
    /// Spawns still compiling count as actors already.
    fn within_budget(&self, from: &str, id: &str, limits: &ActorLimits) -> anyhow::Result<()> {
        let b = self.cfg.budget;
        let spawning: Vec<&Spawning> = self
            .compiles
            .values()
            .filter_map(|c| match &c.purpose {
                Purpose::Spawn(s) => Some(&**s),
                _ => None,
            })
            .collect();
        let actors = self.reg.actors.len() + spawning.len();
        if actors >= b.actors {
            bail!(
                "spawn of {id:?} refused: the world holds {actors} actors (spawns compiling included); its budget is {} actors",
                b.actors
            );
        }
        // Every actor `from` descends from gains a descendant.
        let mut lines: Vec<Vec<String>> = self.reg.actors.values().map(|e| self.ancestors(&e.spawner)).collect();
        lines.extend(spawning.iter().map(|s| self.ancestors(&s.from)));
        for a in self.ancestors(from) {
            let n = lines.iter().filter(|l| l.contains(&a)).count();
            if n >= b.descendants {
                bail!(
                    "spawn of {id:?} refused: {a:?} has {n} descendants already; the world's budget is {} descendants per spawner",
                    b.descendants
                );
            }
        }
        let mine = self.effective(limits);
        let (memory, disk) = self.held(&spawning);
        if memory + mine.memory_bytes as u64 > b.memory_bytes {
            bail!(
                "spawn of {id:?} refused: the actors' memory limits (abandoned instances and upgrade candidates included) add up to {memory} bytes and this one's is {}; the world's memory budget is {} bytes (a spawn may ask for less with \"limits\": {{\"memory_bytes\": …}})",
                mine.memory_bytes,
                b.memory_bytes
            );
        }
        if disk + mine.disk_bytes > b.disk_bytes {
            bail!(
                "spawn of {id:?} refused: the actors' disk quotas add up to {disk} bytes and this one's is {}; the world's disk budget is {} bytes (a spawn may ask for less with \"limits\": {{\"disk_bytes\": …}})",
                mine.disk_bytes,
                b.disk_bytes
            );
        }
        let fds = (actors + 1).saturating_mul(self.cfg.limits.descriptors);
        if fds > b.descriptors {
            bail!(
                "spawn of {id:?} refused: {} actors of {} descriptors each would hold {fds}; the world's descriptor budget is {}",
                actors + 1,
                self.cfg.limits.descriptors,
                b.descriptors
            );
        }
        Ok(())
    }

    /// The memory and disk limits the world holds now: its actors', the
    /// spawns compiling (`spawning`), abandoned instances' memory and
    /// upgrade candidates' (each runs beside its live version, on copies
    /// of its files).
    fn held(&self, spawning: &[&Spawning]) -> (u64, u64) {
        let mut memory: u64 = self.reg.actors.keys().map(|a| self.limits_of(a).memory_bytes as u64).sum();
        memory += spawning.iter().map(|s| self.effective(&s.limits).memory_bytes as u64).sum::<u64>();
        memory += self.abandoned.values().map(|(_, m)| *m).sum::<u64>();
        memory += self.candidates.values().map(|(m, _)| *m).sum::<u64>();
        let mut disk: u64 = self.reg.actors.keys().map(|a| self.limits_of(a).disk_bytes).sum();
        disk += spawning.iter().map(|s| self.effective(&s.limits).disk_bytes).sum::<u64>();
        disk += self.candidates.values().map(|(_, d)| *d).sum::<u64>();
        (memory, disk)
    }

    /// Refuses an upgrade of `id` whose candidate (the actor's own memory
    /// and disk limits, beside the live version) would take the world
    /// past its memory or disk budget; the refusal names the budget.
    fn candidate_within_budget(&self, id: &str) -> anyhow::Result<(u64, u64)> {
        let b = self.cfg.budget;
        let spawning: Vec<&Spawning> = self
            .compiles
            .values()
            .filter_map(|c| match &c.purpose {
                Purpose::Spawn(s) => Some(&**s),
                _ => None,
            })
            .collect();
        let (memory, disk) = self.held(&spawning);
        let l = self.limits_of(id);
        let mine = (l.memory_bytes as u64, l.disk_bytes);
        if memory + mine.0 > b.memory_bytes {
            bail!(
                "upgrade of {id:?} refused: its candidate runs beside the live version with the actor's memory limit, {} bytes, and the actors' memory limits (abandoned instances and upgrade candidates included) add up to {memory} bytes; the world's memory budget is {} bytes (try again when other upgrades are done)",
                mine.0,
                b.memory_bytes
            );
        }
        if disk + mine.1 > b.disk_bytes {
            bail!(
                "upgrade of {id:?} refused: its candidate works on copies of the actor's files, up to its disk quota of {} bytes, and the actors' disk quotas (upgrade candidates included) add up to {disk} bytes; the world's disk budget is {} bytes",
                mine.1,
                b.disk_bytes
            );
        }
        Ok(mine)
    }

    /// Refuses a spawn or upgrade while [`COMPILES_AT_ONCE`] modules are
    /// compiling (for spawns, upgrades, or starts of versions not compiled
    /// in this run).
    fn compile_slot_free(&self) -> anyhow::Result<()> {
        if self.compiling.load(Ordering::SeqCst) >= COMPILES_AT_ONCE {
            bail!("{COMPILES_AT_ONCE} modules are compiling already; try again when one is done");
        }
        Ok(())
    }

    /// Refuses a `source` directory that contains where it would be
    /// copied to (`/actor` copied into `/actor/<id>/source` grows while it
    /// is copied), or that is larger than [`SOURCE_LIMIT`].
    fn check_source(&self, id: &str, source: &Path) -> anyhow::Result<()> {
        let shown = source.display();
        let Ok(src) = std::fs::canonicalize(source) else {
            // Absent: copied as an empty directory, as before.
            return Ok(());
        };
        let root = std::fs::canonicalize(self.layout.root()).unwrap_or_else(|_| self.layout.root().to_owned());
        let inside = |p: &Path| p.strip_prefix(self.layout.root()).map(|rel| root.join(rel)).ok();
        for dest in [inside(&self.layout.source(id)), inside(&self.layout.versions(id))].into_iter().flatten() {
            if dest.starts_with(&src) {
                bail!("source {shown} contains {}, where it would be copied: refused", dest.display());
            }
        }
        let (bytes, entries) = SOURCE_LIMIT;
        layout::tree_within(&src, bytes, entries).map_err(|why| {
            anyhow!("source {shown} is too large to copy: {why} (limit {bytes} bytes, {entries} entries)")
        })?;
        Ok(())
    }

    /// Checks an upgrade and starts compiling its module off the broker
    /// thread; `upgrade_compiled` runs its gate.
    fn upgrade(&mut self, r: &Req<'_>) -> anyhow::Result<()> {
        let from = r.from;
        let id = r.need("id")?;
        self.existing(&id)?;
        if !self.may_manage(from, &id) {
            bail!("{from:?} may not upgrade {id:?} (only itself, the agent, the console or its spawner)");
        }
        let wasm = self.path(from, &r.need("wasm")?)?;
        check_ext(&wasm)?;
        let source = r.field("source").map(|s| self.path(from, s)).transpose()?;
        let bytes = read_wasm(&wasm)?;
        if let Some(s) = &source {
            self.check_source(&id, s)?;
        }
        self.compile_slot_free()?;
        let held = self.candidate_within_budget(&id)?;
        self.next_token += 1;
        let candidate = self.next_token;
        let latest = self.reg.actors.get(&id).map(|e| e.latest).unwrap_or(0);
        let plan = Upgrade {
            id: id.clone(),
            requester: from.to_owned(),
            req_id: r.req_id.to_owned(),
            wasm: wasm.clone(),
            bytes: bytes.clone(),
            source,
            built_by: r.field("built_by").map(str::to_owned),
            new_version: latest + 1,
            tests: 0,
            candidate,
        };
        // Counted from now until its verdict (`tested`) or its refusal.
        self.candidates.insert(candidate, held);
        // Compiled off the broker thread, like a spawn, under the same
        // budget; `upgrade_compiled` goes on.
        let started = self.start_compile(ModuleBytes::Read(bytes), wasm, Purpose::Upgrade(Box::new(plan)));
        if started.is_err() {
            self.candidates.remove(&candidate);
        }
        started
    }

    /// An upgrade's module compiled (within the budget): its gate runs on
    /// a thread of its own (routing goes on meanwhile); `tested` continues
    /// when it is done.
    pub(super) fn upgrade_compiled(&mut self, plan: Upgrade, result: Result<Component, String>) {
        let (id, requester, req_id) = (plan.id.clone(), plan.requester.clone(), plan.req_id.clone());
        let candidate = plan.candidate;
        let refuse = |b: &mut Broker, reason: String| {
            b.candidates.remove(&candidate);
            b.reply(&requester, &req_id, json!({"type": "error", "request": "upgrade", "id": id, "reason": reason}));
        };
        let component = match result {
            Ok(c) => c,
            Err(e) => return refuse(self, e),
        };
        if !self.reg.actors.contains_key(&id) {
            return refuse(self, format!("no actor {id:?} (removed while its upgrade compiled)"));
        }
        let (rt, tx, limits) = (self.rt.clone(), self.tx.clone(), self.limits_of(&id));
        // The transcript's messages take ids as live ones do, from numbers
        // reserved now (never handed out to live messages again).
        let first_id = self.reg.next_msg + 1;
        self.reg.next_msg += 1000;
        if self.reg.next_msg >= self.reg.msg_reserved {
            self.reg.msg_reserved = self.reg.next_msg + super::MSG_ID_BLOCK;
            self.save();
        }
        let (data, public, actor_root) = (self.layout.data(&id), self.layout.public(&id), self.layout.actor_root());
        let scratch = self.layout.root().join("broker").join("candidates").join(&id);
        let started = thread::Builder::new().name("actor-gate".into()).spawn(move || {
            let c = Candidate {
                rt: &rt,
                component: &component,
                data: &data,
                public: &public,
                actor_root: &actor_root,
                scratch: scratch.clone(),
                limits,
                first_id,
            };
            let tests = plan.source.as_ref().map(|s| s.join("tests"));
            let verdict = transcript::run_gate(&c, tests.as_deref());
            // The candidates' copies of /data and /public are no use
            // once the verdict is in.
            let _ = std::fs::remove_dir_all(&scratch);
            let _ = tx.send(Event::Tested(Box::new(Tested { plan, component, verdict })));
        });
        if let Err(e) = started {
            refuse(self, format!("starting the test thread: {e}"));
        }
    }

    fn rollback_request(&mut self, r: &Req<'_>) -> anyhow::Result<()> {
        let from = r.from;
        let id = r.need("id")?;
        self.existing(&id)?;
        if !self.may_manage(from, &id) {
            bail!("{from:?} may not roll back {id:?}");
        }
        let (cur, latest) = self.reg.actors.get(&id).map(|e| (e.version, e.latest)).unwrap_or((1, 1));
        let installed = self.layout.installed_versions(&id);
        let to = match r.body.get("version") {
            // The highest older version still kept.
            None | Some(Value::Null) => match installed.iter().rev().find(|v| **v < cur) {
                Some(v) => *v,
                None if cur > 1 => bail!("{}", self.not_kept(&id, cur - 1)),
                None => bail!("{id:?} is at version 1; there is no older version"),
            },
            // Anything else but a whole number ≥ 1 is refused, never read
            // as "the previous version".
            Some(v) => match v.as_u64() {
                Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
                None => bail!("\"version\" must be a whole number ≥ 1 (or absent for the previous version), not {v}"),
            },
        };
        if to == 0 || to > latest || to == cur {
            bail!("version {to} is not another installed version of {id:?} (1..={latest}, current {cur})");
        }
        if !installed.contains(&to) {
            bail!("{}", self.not_kept(&id, to));
        }
        let after = AfterStop::Rollback {
            to,
            requester: from.to_owned(),
            req_id: Some(r.req_id.to_owned()),
            reason: "requested".into(),
        };
        self.after_stop(&id, after);
        Ok(())
    }

    fn stop_or_remove(&mut self, r: &Req<'_>) -> anyhow::Result<()> {
        let (ty, from) = (r.ty, r.from);
        let id = r.need("id")?;
        self.existing(&id)?;
        if !self.may_manage(from, &id) {
            bail!("{from:?} may not {ty} {id:?}");
        }
        if let Some(e) = self.reg.actors.get_mut(&id) {
            e.desired = Desired::Stopped;
        }
        self.save();
        let (requester, req_id) = (from.to_owned(), r.req_id.to_owned());
        let after =
            if ty == "stop" { AfterStop::Stop { requester, req_id } } else { AfterStop::Remove { requester, req_id } };
        self.after_stop(&id, after);
        Ok(())
    }

    fn start(&mut self, r: &Req<'_>) -> anyhow::Result<Value> {
        let from = r.from;
        let id = r.need("id")?;
        self.existing(&id)?;
        // The rule of stop, upgrade and remove: else any actor could undo
        // the console's stop.
        if !self.may_manage(from, &id) {
            bail!("{from:?} may not start {id:?} (only itself, the agent, the console or its spawner)");
        }
        if let Some(e) = self.reg.actors.get_mut(&id) {
            e.desired = Desired::Running;
        }
        self.save();
        if self.actors.get(&id).is_some_and(|a| a.live.is_none()) {
            if let Some(a) = self.actors.get_mut(&id) {
                a.backoff_n = 0;
                a.restart_at = None;
            }
            self.start_actor(&id, None);
        }
        Ok(json!({"type": "ok", "request": "start", "id": id}))
    }

    fn path(&self, from: &str, p: &str) -> anyhow::Result<PathBuf> {
        Ok(layout::resolve(&self.layout, from, Self::native(from), p)?)
    }
}

fn check_ext(p: &Path) -> anyhow::Result<()> {
    match p.extension().and_then(|e| e.to_str()) {
        Some("wasm" | "wat") => Ok(()),
        _ => bail!("{}: the broker accepts only .wasm (or .wat) files", p.display()),
    }
}
