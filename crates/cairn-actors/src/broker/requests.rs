//! The broker's requests (`{"to":"broker"}`): parsing each request type,
//! the authority checks (who may manage, who may grant HTTP), path
//! resolution for the sender, and starting the work each one asks for.
//! Owns no state of its own: it runs on the broker thread as methods of
//! `Broker`, so whatever it does stalls every actor's routing meanwhile
//! (spawn and upgrade still compile here: issue 28), and it must not
//! reply for work that finishes later (upgrade, rollback, stop and remove
//! answer from `do_after`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::thread;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};

use super::{AfterStop, Broker, Event, Tested, Upgrade};
use crate::layout::{self, ActorEntry, Desired};
use crate::message::{self, AGENT, CONSOLE};
use crate::transcript::{self, Candidate};

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
            "spawn" => self.spawn(&r).map(Some),
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

    fn spawn(&mut self, r: &Req<'_>) -> anyhow::Result<Value> {
        let from = r.from;
        let id = r.need("id")?;
        message::check_actor_id(&id)?;
        if self.reg.actors.contains_key(&id) {
            bail!("actor {id:?} exists; use upgrade");
        }
        let http = r.body.get("http").and_then(Value::as_bool).unwrap_or(false);
        if http && !self.may_use_http(from) {
            // Else an actor without HTTP could spawn one that has it.
            bail!("{from} may not grant \"http\": it did not declare it in its own spawn request");
        }
        let wasm = self.path(from, &r.need("wasm")?)?;
        let source = r.field("source").map(|s| self.path(from, s)).transpose()?;
        let bytes = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
        check_ext(&wasm)?;
        let component = self.rt.compile(&bytes)?;
        self.install_version(&id, 1, &wasm, source.as_deref(), r.field("built_by"), from)?;
        self.layout.init_actor(&id)?;
        if let Some(s) = &source {
            layout::replace_tree(s, &self.layout.source(&id))?;
        }
        self.reg.actors.insert(
            id.clone(),
            ActorEntry {
                version: 1,
                latest: 1,
                spawner: from.to_owned(),
                desired: Desired::Running,
                subscribers: BTreeSet::new(),
                http,
            },
        );
        self.save();
        self.ensure_rt(&id)?;
        if let Some(a) = self.actors.get_mut(&id) {
            a.components.insert(1, component);
        }
        self.start_actor(&id, None);
        Ok(json!({"type": "ok", "request": "spawn", "id": id, "version": 1}))
    }

    /// Starts the upgrade's gate on its own thread (routing goes on
    /// meanwhile); `tested` continues when it is done.
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
        let bytes = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
        let component = self.rt.compile(&bytes)?;
        let latest = self.reg.actors.get(&id).map(|e| e.latest).unwrap_or(0);
        let plan = Upgrade {
            id: id.clone(),
            requester: from.to_owned(),
            req_id: r.req_id.to_owned(),
            wasm,
            source,
            built_by: r.field("built_by").map(str::to_owned),
            new_version: latest + 1,
            tests: 0,
        };
        let (rt, tx, limits) = (self.rt.clone(), self.tx.clone(), self.cfg.limits);
        let (data, public, actor_root) = (self.layout.data(&id), self.layout.public(&id), self.layout.actor_root());
        let scratch = self.layout.root().join("broker").join("candidates").join(&id);
        thread::Builder::new()
            .name("actor-gate".into())
            .spawn(move || {
                let c = Candidate {
                    rt: &rt,
                    component: &component,
                    data: &data,
                    public: &public,
                    actor_root: &actor_root,
                    scratch,
                    limits,
                };
                let tests = plan.source.as_ref().map(|s| s.join("tests"));
                let verdict = transcript::run_gate(&c, tests.as_deref());
                let _ = tx.send(Event::Tested(Box::new(Tested { plan, component, verdict })));
            })
            .context("starting the test thread")?;
        Ok(())
    }

    fn rollback_request(&mut self, r: &Req<'_>) -> anyhow::Result<()> {
        let from = r.from;
        let id = r.need("id")?;
        self.existing(&id)?;
        if !self.may_manage(from, &id) {
            bail!("{from:?} may not roll back {id:?}");
        }
        let (cur, latest) = self.reg.actors.get(&id).map(|e| (e.version, e.latest)).unwrap_or((1, 1));
        let to = match r.body.get("version").and_then(Value::as_u64) {
            Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
            None if cur > 1 => cur - 1,
            None => bail!("{id:?} is at version 1; there is no older version"),
        };
        if to == 0 || to > latest || to == cur {
            bail!("version {to} is not another installed version of {id:?} (1..={latest}, current {cur})");
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
        let id = r.need("id")?;
        self.existing(&id)?;
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
