//! Structured input a running tool asks of the person (an MCP server's
//! `elicitation/create`): the question and the answer.
//!
//! A tool asks through its `ToolContext::elicit`; the turn hands the
//! question to the session's approver (`Approver::elicit`), the one place
//! a person is asked, so every face answers it where it answers approvals
//! (an editor's form, or a clear decline where nobody can answer). This
//! module owns the shapes only: it must not ask anyone, and it does not
//! record answers (they go to the tool, whose result the log keeps).
//! [`form`] reads a question's schema as fields and checks typed answers,
//! for faces that ask field by field.

pub mod form;

use serde_json::{Map, Value};

/// What a tool asks of the person.
#[derive(Debug, Clone, Copy)]
pub enum Ask<'a> {
    /// To fill in a form: the JSON Schema of the object asked for (an
    /// object of primitive properties, as MCP allows; [`form`]).
    Form(&'a Value),
    /// To visit a URL, outside cairn (MCP's URL mode: a sign-in, a payment,
    /// anything the client must not see). Accepting is consent to open it;
    /// nothing comes back through cairn.
    Url {
        /// Where the person is sent.
        url: &'a str,
        /// The server's id for this question.
        id: &'a str,
    },
}

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
    /// What is asked: a form, or to visit a URL.
    pub ask: Ask<'a>,
}

/// The person's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitAnswer {
    /// Given: the object asked for (empty for a URL: consent to open it).
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
