//! ACP session modes, mapped onto cairn's approval policy: `ask` (every
//! call the policy puts to a person is asked), `auto-edit` (`write_file` and
//! `edit_file` calls run without asking; shell and every Destructive call
//! are still asked) and `plan` (read only: every call that could change
//! something is refused, even one an allow rule, `--yes` or an earlier
//! "allow always" covers: the approval gate's rule, which reads the mode
//! through [`Approver::mode`]).
//!
//! [`ModeApprover`] wraps the session's [`PolicyApprover`]; the mode is
//! shared with the main thread, which answers `session/set_mode`, so a
//! change applies from the next call of a running turn. [`Settings`] also
//! holds the provider the editor chose (`session/set_config_option` of the
//! `model` option), used from the session's next prompt. This module must
//! not ask anyone itself, refuse by itself or weaken the gate: a
//! Destructive call and a sandbox bypass still go to the person in
//! `auto-edit`, and plan mode's refusal is the gate's alone.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, PolicyApprover, SessionMode, Verdict};
use cairn_core::tool::Risk;
use serde_json::{Value, json};

/// A session mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Ask,
    AutoEdit,
    Plan,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Ask, Mode::AutoEdit, Mode::Plan];

    pub(super) fn id(self) -> &'static str {
        match self {
            Mode::Ask => "ask",
            Mode::AutoEdit => "auto-edit",
            Mode::Plan => "plan",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Ask => "Ask",
            Mode::AutoEdit => "Auto-edit",
            Mode::Plan => "Plan (read only)",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Mode::Ask => "Ask before every call that changes something (unless an allow rule covers it)",
            Mode::AutoEdit => "Edit and write files without asking; still ask for shell commands and destructive calls",
            Mode::Plan => "Read only: calls that would change something are refused",
        }
    }

    /// The mode as the approval gate reads it.
    pub(super) fn session_mode(self) -> SessionMode {
        match self {
            Mode::Ask => SessionMode::Ask,
            Mode::AutoEdit => SessionMode::AutoEdit,
            Mode::Plan => SessionMode::Plan,
        }
    }

    /// The mode named `id`, or why not.
    pub(super) fn parse(id: &str) -> Result<Mode, String> {
        Mode::ALL.into_iter().find(|m| m.id() == id).ok_or_else(|| {
            format!(
                "unknown mode {id:?}: cairn's modes are {}",
                Mode::ALL.iter().map(|m| m.id()).collect::<Vec<_>>().join(", ")
            )
        })
    }
}

/// A session's mode, shared between its thread and the main thread.
#[derive(Debug, Clone, Default)]
pub(super) struct SharedMode(Arc<AtomicU8>);

impl SharedMode {
    pub(super) fn get(&self) -> Mode {
        match self.0.load(Ordering::SeqCst) {
            1 => Mode::AutoEdit,
            2 => Mode::Plan,
            _ => Mode::Ask,
        }
    }

    pub(super) fn set(&self, mode: Mode) {
        let n = match mode {
            Mode::Ask => 0,
            Mode::AutoEdit => 1,
            Mode::Plan => 2,
        };
        self.0.store(n, Ordering::SeqCst);
    }

    /// The `modes` of a session/new or session/load answer.
    pub(super) fn state(&self) -> Value {
        json!({
            "currentModeId": self.get().id(),
            "availableModes": Mode::ALL.iter().map(|m| json!({"id": m.id(), "name": m.name(), "description": m.description()})).collect::<Vec<_>>(),
        })
    }
}

/// The session's approver under its mode.
pub(super) struct ModeApprover {
    pub(super) inner: PolicyApprover,
    pub(super) mode: SharedMode,
}

/// Who decided, in the session file.
const BY_MODE: &str = "user:acp";

fn auto_edit(request: &ApprovalRequest<'_>) -> bool {
    // Never a call a hook put to a person: the person answers that one.
    matches!(request.tool, "write_file" | "edit_file")
        && request.risk == Risk::Write
        && request.bypass.is_none()
        && request.hook_asks.is_none()
}

impl Approver for ModeApprover {
    fn is_interactive(&self) -> bool {
        self.inner.is_interactive()
    }

    fn answers_writes(&self) -> bool {
        self.inner.answers_writes()
    }

    fn mode(&self) -> SessionMode {
        self.mode.get().session_mode()
    }

    fn pre_approve(&mut self, request: &ApprovalRequest<'_>) -> Option<Verdict> {
        match self.mode.get() {
            Mode::AutoEdit if auto_edit(request) => {
                Some(Verdict { decision: Answer::Approve, by: format!("{BY_MODE} (auto-edit mode)") })
            }
            _ => self.inner.pre_approve(request),
        }
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        match self.mode.get() {
            Mode::AutoEdit if auto_edit(request) => {
                Ok(Verdict { decision: Answer::Approve, by: format!("{BY_MODE} (auto-edit mode)") })
            }
            _ => self.inner.decide(request),
        }
    }

    fn elicit(&mut self, question: &cairn_core::elicit::Elicitation<'_>) -> cairn_core::elicit::ElicitAnswer {
        self.inner.elicit(question)
    }
}

/// The id of the model picker among a session's configuration options.
pub(super) const MODEL_OPTION: &str = "model";

/// A session's settings the editor changes: its mode and its provider.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) mode: SharedMode,
    choices: Arc<crate::ProviderChoices>,
    provider: Arc<Mutex<String>>,
}

impl Settings {
    pub(super) fn new(choices: crate::ProviderChoices) -> Self {
        let provider = Arc::new(Mutex::new(choices.current.clone()));
        Self { mode: SharedMode::default(), choices: Arc::new(choices), provider }
    }

    /// The provider chosen now.
    pub(super) fn provider(&self) -> String {
        self.provider.lock().map_or_else(|_| self.choices.current.clone(), |p| p.clone())
    }

    /// Choose provider `name`, or why not.
    pub(super) fn choose_provider(&self, name: &str) -> Result<(), String> {
        if !self.choices.choices.iter().any(|(n, _)| n == name) {
            return Err(format!(
                "unknown model {name:?}: choose one of {}",
                self.choices.choices.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        if let Ok(mut p) = self.provider.lock() {
            name.clone_into(&mut p);
        }
        Ok(())
    }

    /// The `configOptions` of a session: the model picker.
    pub(super) fn config_options(&self) -> Value {
        let options: Vec<Value> =
            self.choices.choices.iter().map(|(value, name)| json!({"value": value, "name": name})).collect();
        json!([{
            "id": MODEL_OPTION,
            "name": "Model",
            "description": "The provider (and its configured model) of this session's next turns",
            "category": "model",
            "type": "select",
            "currentValue": self.provider(),
            "options": options,
        }])
    }
}
