//! Structured input a running tool asks of the person (an MCP server's
//! `elicitation/create`): the question and the answer.
//!
//! A tool asks through its `ToolContext::elicit`; the turn hands the
//! question to the session's approver (`Approver::elicit`), the one place
//! a person is asked, so every face answers it where it answers approvals
//! (an editor's form, or a clear decline where nobody can answer). This
//! module owns the shapes only: it must not ask anyone, and it does not
//! record answers (they go to the tool, whose result the log keeps).

use serde_json::{Map, Value};

/// A tool's question to the person.
#[derive(Debug, Clone, Copy)]
pub struct Elicitation<'a> {
    /// The session whose call asks.
    pub session_id: &'a str,
    /// The call that asks.
    pub invocation_id: &'a str,
    /// The tool that asks (`mcp__SERVER__TOOL`).
    pub tool: &'a str,
    /// What the server says it needs, for a person.
    pub message: &'a str,
    /// The JSON Schema of the object asked for (an object of primitive
    /// properties, as MCP allows).
    pub schema: &'a Value,
}

/// The person's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitAnswer {
    /// Given: the object asked for.
    Accept(Map<String, Value>),
    /// Refused, and why (said to the model beside the tool's result; MCP
    /// carries no reason to the server).
    Decline(String),
    /// Dismissed without a choice (the prompt was cancelled).
    Cancel,
}

/// The decline of an approver that has nobody to ask.
pub fn nobody() -> ElicitAnswer {
    ElicitAnswer::Decline(
        "nobody can answer a tool's question here (no person at hand): it was declined; run where a person can \
         answer (an editor over ACP that offers elicitation)"
            .to_owned(),
    )
}
