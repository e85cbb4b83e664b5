//! The PostgreSQL worker's host (`cairn_pg::worker::Driver`): a claimed
//! session's turn built as every face's is (`equip.rs`: discovery's choice
//! recorded before the turn, the subagent family, here in the same
//! database and within the session's lease), with this host's provider,
//! and a headless approver: the allow rules and `--yes`, then a durable
//! question any host can answer (`cairn approve`), so a Destructive call is
//! refused, never asked, and never offered. An undo killed after its plan
//! was committed is finished first, as before any face's turn.
//!
//! Must not: claim, renew or release leases (cairn-pg's worker loop does).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use cairn_core::approval::{Allowlist, SharedApprover};
use cairn_core::storage::Storage;
use cairn_core::{CancelToken, Session, SessionConfig, TurnError};
use cairn_host::{Equipment, Step};
use cairn_pg::PgStore;
use cairn_pg::approvals::DbApprover;
use cairn_pg::worker::{Driven, Driver};

use crate::hosting::RuntimeHost;
use crate::setup::{Note, Setup};
use crate::subagents::FamilyPlace;

impl Driver for RuntimeHost {
    fn drive(&self, mut session: Session<PgStore>, prompt: Option<&str>, cancel: &CancelToken) -> Driven {
        let header = session.store().header().clone();
        let id = header.id.clone();
        let cwd = PathBuf::from(&header.cwd);
        // Nothing is committed when wiring fails: the worker marks the
        // session failed with this reason.
        let failed = |e: anyhow::Error| {
            self.ctx.notes.tell(Note::Worker { session: id.clone(), text: format!("{e:#}") });
            TurnError::Storage(cairn_core::storage::StorageError::Invalid(format!("{e:#}")))
        };
        if let Err(e) = finish_undo(&self.ctx, &mut session, &cwd) {
            return Driven { session: Some(session), result: Err(e) };
        }
        let wiring = (|| -> Result<_> {
            let url = crate::parts::database_url(&self.ctx)?;
            let provider = crate::parts::build_provider(&self.ctx, &cwd)?;
            let allow = Allowlist::parse(self.ctx.settings.allow.value.iter().map(String::as_str))
                .context("invalid allow pattern (from --allow or [approvals] allow)")?;
            // Allow rules and --yes, then a durable question any host can
            // answer (`cairn approve`); Destructive calls are refused, never
            // asked, and so never offered. The same person answers the
            // session's children (their questions are rows of this
            // session, `i5+i3`).
            let answerer =
                DbApprover::new(url.clone(), id.clone(), session.store().lease_lost()).with_cancel(cancel.clone());
            let person = SharedApprover::new(Box::new(answerer));
            let approver = crate::parts::policy(self.ctx.common.yes, allow, Some(Box::new(person.clone())));
            // The subagent family lives in this database, within the
            // session's lease (`subagents/db.rs`): any worker that later
            // resumes the session finds its children there.
            let mut inheritance = crate::subagents::Inheritance::of(&approver, Some(person));
            if let Some(hold) = session.store().hold() {
                inheritance.place =
                    FamilyPlace::Database(crate::subagents::db::Database::new(url, hold, cancel.clone()));
            }
            Ok((provider, approver, inheritance))
        })();
        let (provider, approver, inheritance) = match wiring {
            Ok(w) => w,
            Err(e) => return Driven { session: Some(session), result: Err(failed(e)) },
        };
        let family = matches!(inheritance.place, FamilyPlace::Database(_)).then_some(&inheritance);
        // The turn's tools as every face equips them (`equip.rs`):
        // discovery's choice recorded in the session before the turn, and
        // the family.
        let mut store = session.into_store();
        let answerer = crate::equip::Answerer { approver: &approver, family };
        let config = SessionConfig { cwd: Some(cwd.clone()), ..crate::parts::session_config(&self.ctx) };
        let mut equipped = match crate::equip::turn(&self.ctx, &cwd, &mut store, prompt, answerer, config.clone()) {
            Ok(equipped) => equipped,
            Err(e) => return Driven { session: Session::open(store, config).ok(), result: Err(failed(e)) },
        };
        let registry = equipped.registry(&approver);
        for note in equipped.all_notes() {
            self.ctx.notes.tell(Note::Worker { session: id.clone(), text: note.clone() });
        }
        if family.is_some() {
            // Children a crash left unfinished that no pending call of this
            // turn would re-attach (started with `wait: false`).
            crate::subagents::reattach_children(&id, &inheritance);
        }
        let session = match Session::open(store, equipped.config) {
            Ok(session) => session,
            Err(e) => return Driven { session: None, result: Err(e) },
        };
        let mut equipment = Equipment { tools: registry, approver };
        // The worker's token: cancelled when the lease may be ending.
        let step = prompt.map_or(Step::Resume, Step::Prompt);
        let driven =
            Driven::by(session, |session| equipment.run(session, &*provider, step, &mut |_| {}, cancel).map(drop));
        // The children still running run within this lease: the worker
        // must not release it under them (a cancelled turn's stop at once).
        crate::subagents::finish_children(&id, &inheritance);
        driven
    }
}

/// An undo killed after its plan was committed (`cairn undo --database`
/// on this or another host) is finished before a worker's turn, like
/// before any other host's turn; what it did is told (a worker note).
fn finish_undo(ctx: &Setup, session: &mut Session<PgStore>, cwd: &Path) -> Result<(), TurnError> {
    let id = session.store().header().id.clone();
    match cairn_tools::rewind::finish_interrupted(&crate::undo::store(ctx), session, cwd, false) {
        Ok(Some(done)) => {
            ctx.notes.tell(Note::Worker { session: id, text: done });
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(TurnError::Storage(cairn_core::storage::StorageError::Invalid(e.to_string()))),
    }
}
