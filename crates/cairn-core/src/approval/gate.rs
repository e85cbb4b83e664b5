//! The approval gate: the one function, [`gate`], that says what a call (or
//! a sandbox bypass) needs before it may run, and refuses outright what no
//! one present can approve. Every path that admits a tool or a call asks it
//! first: the [`crate::registry::ToolRegistry`] when a tool is registered,
//! the turn when it commits an intent and when it asks for a verdict, the
//! effect when a tool asks for a bypass, and the approvers of this module.
//! That way "Destructive is refused when headless" is one rule, not five
//! copies that could drift apart.
//!
//! It also owns what "approve for this session" may remember
//! ([`session_rule`]): Write calls only, never Destructive, never a bypass.
//!
//! It must not ask anyone and must not read or write the log.

use serde_json::Value;

use super::{Answer, Verdict};
use crate::tool::Risk;

/// Who decided a refusal by the gate.
pub const HEADLESS: &str = "policy:headless";
/// Who decided that a ReadOnly call runs.
pub const READ_ONLY: &str = "policy:readOnly";

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

/// The approval gate. `risk` is the call's risk, `bypass` what access
/// outside the sandbox is asked (for a bypass request), `interactive`
/// whether a person can answer in this host. Returns what the request needs,
/// or the denial to record when it needs a person and none can answer.
pub fn gate(tool: &str, risk: Risk, bypass: Option<&str>, interactive: bool) -> Result<Need, Verdict> {
    let need = match (bypass, risk) {
        (Some(_), _) | (None, Risk::Destructive) => Need::Person,
        (None, Risk::Write) => Need::RuleOrVerdict,
        (None, Risk::ReadOnly) => Need::Nothing,
    };
    if need == Need::Person && !interactive {
        let reason = match bypass {
            Some(what) => format!(
                "{tool} asked for a sandbox bypass ({what}), which needs a person's approval, but no interactive approver is available; it was not granted (run cairn in a terminal to approve it)"
            ),
            None => format!(
                "{tool} is Destructive here and needs a person's approval, but no interactive approver is available (run cairn in a terminal to approve such calls)"
            ),
        };
        return Err(Verdict { decision: Answer::Deny { reason }, by: HEADLESS.to_owned() });
    }
    Ok(need)
}

/// A headless refusal that says what made the call need a person (`why`:
/// the tool's `risk_reason`, e.g. the shape a shell line matched), so the
/// session log and the model see the reason, not only the tier.
pub fn explained(mut verdict: Verdict, why: Option<&str>) -> Verdict {
    if let (Answer::Deny { reason }, Some(why)) = (&mut verdict.decision, why) {
        reason.push_str("; why: ");
        reason.push_str(why);
    }
    verdict
}

/// Whether a person may be offered "approve for this session" for a request
/// (every host asks this, none decides it): only for what an allow rule
/// may answer, a Write call that is not a sandbox bypass.
pub fn may_remember(risk: Risk, bypass: Option<&str>) -> bool {
    matches!(gate("", risk, bypass, true), Ok(Need::RuleOrVerdict))
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
                for interactive in [false, true] {
                    let got = gate("t", risk, bypass, interactive);
                    let person = bypass.is_some() || risk == Risk::Destructive;
                    match got {
                        Err(v) => {
                            assert!(person && !interactive, "{risk:?} {bypass:?} {interactive}");
                            assert_eq!(v.by, HEADLESS);
                            assert!(matches!(v.decision, Answer::Deny { ref reason } if reason.contains("person")));
                        }
                        Ok(Need::Person) => assert!(person && interactive),
                        Ok(Need::RuleOrVerdict) => assert!(!person && risk == Risk::Write),
                        Ok(Need::Nothing) => assert!(!person && risk == Risk::ReadOnly),
                    }
                }
            }
        }
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
