//! The approval gate: the one function, [`gate`], that says what a call (or
//! a sandbox bypass) needs before it may run, and refuses outright what no
//! one present can approve. Every path that admits a tool or a call asks it
//! first: the [`crate::registry::ToolRegistry`] when a tool is registered,
//! the turn when it commits an intent and when it asks for a verdict, the
//! effect when a tool asks for a bypass, and the approvers of this module.
//! That way "Destructive is refused when headless" is one rule, not five
//! copies that could drift apart.
//!
//! It owns the rule that a mode narrowing authority wins over every
//! allowance: in [`SessionMode::Plan`] (ACP's plan mode) every call that
//! could change something, and every sandbox bypass, is refused here,
//! before any allow rule, `--yes`, remembered "allow always" or mode that
//! approves is consulted. It also owns what makes a call need a person (a
//! Destructive risk, a bypass, a `pre_tool` hook that asks), and what
//! "approve for this session" may remember ([`session_rule`]): Write calls
//! only, never Destructive, never a bypass, never a call a hook put to a
//! person.
//!
//! It must not ask anyone and must not read or write the log.

use serde_json::Value;

use super::{Answer, Approver, SessionMode, Verdict};
use crate::tool::Risk;

/// Who decided a refusal by the gate.
pub const HEADLESS: &str = "policy:headless";
/// Who decided that a ReadOnly call runs.
pub const READ_ONLY: &str = "policy:readOnly";
/// Who refused a call that could change something in plan mode.
pub const PLAN_MODE: &str = "mode:plan";

/// What the gate judges: one call, or a sandbox bypass it asks for.
#[derive(Debug, Clone, Copy)]
pub struct Gated<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// The call's risk.
    pub risk: Risk,
    /// For a sandbox bypass request: what access outside the rules is asked.
    pub bypass: Option<&'a str>,
    /// A `pre_tool` hook asked that a person approve the call (its reason).
    pub hook_asks: Option<&'a str>,
}

impl<'a> Gated<'a> {
    /// A plain call of `tool` at `risk`.
    pub fn call(tool: &'a str, risk: Risk) -> Self {
        Self { tool, risk, bypass: None, hook_asks: None }
    }
}

/// Who answers, as the gate sees it: whether a person can, and the mode
/// the session is in now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker {
    /// A person can answer in this host.
    pub interactive: bool,
    /// The session's mode ([`Approver::mode`]).
    pub mode: SessionMode,
}

impl Asker {
    /// `approver` as the gate sees it.
    pub fn of(approver: &dyn Approver) -> Self {
        Self { interactive: approver.is_interactive(), mode: approver.mode() }
    }

    /// A person at hand, in the default mode: what the gate says a call
    /// needs at best (what a tool may be offered for, what may be
    /// remembered).
    pub const PERSON: Asker = Asker { interactive: true, mode: SessionMode::Ask };
}

/// What a request needs before it may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: ReadOnly calls run without asking.
    Nothing,
    /// An allow rule, or else a verdict from the approver (Write calls).
    RuleOrVerdict,
    /// A person's verdict (Destructive calls, sandbox bypasses): no rule,
    /// flag or config key answers, and the answer is never remembered.
    Person,
}

impl Need {
    /// A verdict as it may be honoured for this need: "approve for this
    /// session" becomes a plain approval for what needs a person.
    pub fn bound(self, mut verdict: Verdict) -> Verdict {
        if self == Need::Person && verdict.decision == Answer::ApproveForSession {
            verdict.decision = Answer::Approve;
        }
        verdict
    }
}

/// The approval gate: what `what` needs before it may run, or the denial
/// to record. First the mode: in plan mode anything but a ReadOnly call
/// without a bypass is refused, whatever allows it elsewhere. Then the
/// need: a bypass, a Destructive call or a call a hook put to a person
/// needs a person (refused when none can answer); a Write call needs a rule
/// or a verdict; a ReadOnly call nothing.
pub fn gate(what: Gated<'_>, asker: Asker) -> Result<Need, Verdict> {
    let Gated { tool, risk, bypass, hook_asks } = what;
    if asker.mode == SessionMode::Plan && (risk != Risk::ReadOnly || bypass.is_some()) {
        let what = match bypass {
            Some(access) => format!("{tool} asked for a sandbox bypass ({access})"),
            None => format!("{tool} could change something"),
        };
        let reason = format!(
            "{what} and the session is in plan mode (read only), which refuses every such call whatever an allow \
             rule, --yes or an earlier \"allow always\" says; it was not run (switch the session to another mode \
             to let it change things)"
        );
        return Err(Verdict { decision: Answer::Deny { reason }, by: PLAN_MODE.to_owned() });
    }
    let need = match (bypass, risk, hook_asks) {
        (Some(_), _, _) | (None, Risk::Destructive, _) | (None, _, Some(_)) => Need::Person,
        (None, Risk::Write, None) => Need::RuleOrVerdict,
        (None, Risk::ReadOnly, None) => Need::Nothing,
    };
    if need == Need::Person && !asker.interactive {
        let reason = match (bypass, hook_asks) {
            (Some(what), _) => format!(
                "{tool} asked for a sandbox bypass ({what}), which needs a person's approval, but no interactive approver is available; it was not granted (run cairn in a terminal to approve it)"
            ),
            (None, Some(why)) if risk != Risk::Destructive => format!(
                "a pre_tool hook asks a person to approve this {tool} call ({why}), but no interactive approver is available; it was not run (run cairn in a terminal to approve it)"
            ),
            (None, _) => format!(
                "{tool} is Destructive here and needs a person's approval, but no interactive approver is available (run cairn in a terminal to approve such calls)"
            ),
        };
        return Err(Verdict { decision: Answer::Deny { reason }, by: HEADLESS.to_owned() });
    }
    Ok(need)
}

/// Whether a person may be offered "approve for this session" for a request
/// (every host asks this, none decides it): only for what an allow rule
/// may answer, a Write call that is not a sandbox bypass and that no hook
/// put to a person.
pub fn may_remember(what: Gated<'_>) -> bool {
    matches!(gate(what, Asker::PERSON), Ok(Need::RuleOrVerdict))
}

/// The allow rule "approve for this session" remembers for a call, as rule
/// text: the tool name, or `tool(word *)` for a single simple command whose
/// first word is plain. `None` when nothing may be remembered: any risk but
/// Write, or a command line that is not one plain simple command.
pub fn session_rule(tool: &str, risk: Risk, arguments: &Value) -> Option<String> {
    if risk != Risk::Write {
        return None;
    }
    match arguments.get("command").and_then(Value::as_str) {
        None => Some(tool.to_owned()),
        Some(line) => match super::cmdline::parse(line) {
            Ok(commands) if commands.len() == 1 => {
                let word = commands[0].first()?;
                word.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
                    .then(|| format!("{tool}({word} *)"))
            }
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_gate_refuses_what_needs_a_person_when_none_can_answer() {
        // Every combination: the oracle is the rule as written in
        // ARCHITECTURE.md, spelled out case by case.
        for risk in [Risk::ReadOnly, Risk::Write, Risk::Destructive] {
            for bypass in [None, Some("write /etc")] {
                for hook_asks in [None, Some("check this")] {
                    for interactive in [false, true] {
                        for mode in [SessionMode::Ask, SessionMode::AutoEdit, SessionMode::Plan] {
                            let what = Gated { tool: "t", risk, bypass, hook_asks };
                            let got = gate(what, Asker { interactive, mode });
                            let changes = risk != Risk::ReadOnly || bypass.is_some();
                            let person = bypass.is_some() || risk == Risk::Destructive || hook_asks.is_some();
                            let case = format!("{risk:?} {bypass:?} {hook_asks:?} {interactive} {mode:?}");
                            match got {
                                Err(v) if mode == SessionMode::Plan && changes => {
                                    assert_eq!(v.by, PLAN_MODE, "{case}");
                                    assert!(
                                        matches!(v.decision, Answer::Deny { ref reason } if reason.contains("plan mode"))
                                    );
                                }
                                Err(v) => {
                                    assert!(person && !interactive, "{case}");
                                    assert_eq!(v.by, HEADLESS);
                                    assert!(
                                        matches!(v.decision, Answer::Deny { ref reason } if reason.contains("person"))
                                    );
                                }
                                Ok(_) if mode == SessionMode::Plan && changes => panic!("plan mode let {case} through"),
                                Ok(Need::Person) => assert!(person && interactive, "{case}"),
                                Ok(Need::RuleOrVerdict) => assert!(!person && risk == Risk::Write, "{case}"),
                                Ok(Need::Nothing) => assert!(!person && risk == Risk::ReadOnly, "{case}"),
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_a_hook_put_to_a_person_or_a_bypass_may_be_remembered() {
        assert!(may_remember(Gated::call("write_file", Risk::Write)));
        assert!(!may_remember(Gated { hook_asks: Some("why"), ..Gated::call("write_file", Risk::Write) }));
        assert!(!may_remember(Gated { bypass: Some("net"), ..Gated::call("write_file", Risk::Write) }));
        assert!(!may_remember(Gated::call("nuke", Risk::Destructive)));
    }

    #[test]
    fn approve_for_session_is_never_kept_for_what_needs_a_person() {
        let v = Verdict { decision: Answer::ApproveForSession, by: "user:tty".into() };
        assert_eq!(Need::Person.bound(v.clone()).decision, Answer::Approve);
        assert_eq!(Need::RuleOrVerdict.bound(v.clone()).decision, Answer::ApproveForSession);
        let deny = Verdict { decision: Answer::Deny { reason: "no".into() }, by: "user:tty".into() };
        assert_eq!(Need::Person.bound(deny.clone()), deny);
    }

    #[test]
    fn session_rules_only_for_write_and_plain_single_commands() {
        let cmd = |c: &str| json!({ "command": c });
        assert_eq!(session_rule("write_file", Risk::Write, &json!({"path": "a"})).as_deref(), Some("write_file"));
        assert_eq!(session_rule("shell", Risk::Write, &cmd("ls -la")).as_deref(), Some("shell(ls *)"));
        assert_eq!(session_rule("shell", Risk::Destructive, &cmd("rm x")), None);
        assert_eq!(session_rule("shell", Risk::ReadOnly, &cmd("ls")), None);
        for hostile in ["ls; rm -rf /", "ls && rm x", "$(rm x)", "`rm x`", "ls | sh", "", "x=1 ls", "sh -c ls", "./x*y"]
        {
            assert_eq!(session_rule("shell", Risk::Write, &cmd(hostile)), None, "{hostile:?}");
        }
        // Quoting and escapes are resolved: these are the command `ls`.
        for same in ["\"ls\" -l", "l\\s", "'ls'"] {
            assert_eq!(session_rule("shell", Risk::Write, &cmd(same)).as_deref(), Some("shell(ls *)"), "{same:?}");
        }
    }
}
