//! `plan`: the model's plan for the turn — a list of steps, each with a
//! priority and a status — sent whole each time it changes.
//!
//! The call has no effect outside the session: the plan lives in the
//! call's arguments (committed with `toolRequested`) and its receipt's
//! structured output, so it is durable and replayed with the session. The
//! faces show it from there: ACP as a `plan` session update (`Plan` below
//! is its shape), the command line as a checklist. This module owns the
//! plan's shape and its check; it must not render for a face.

use std::time::Instant;

use cairn_core::tool::{
    ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{caps, receipt};

/// The tool's name.
pub const NAME: &str = "plan";

/// The most steps a plan may have.
pub const MAX_ENTRIES: usize = 50;

/// The longest step, in characters.
pub const MAX_CONTENT: usize = 500;

/// How important a step is (ACP's `PlanEntryPriority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Most critical to the goal.
    High,
    /// The default.
    #[default]
    Medium,
    /// Nice to have.
    Low,
}

/// Where a step stands (ACP's `PlanEntryStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not started.
    Pending,
    /// Being worked on now.
    InProgress,
    /// Done.
    Completed,
}

/// One step of a plan (ACP's `PlanEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// What the step does, for a person.
    pub content: String,
    /// How important it is (medium when the model does not say).
    #[serde(default)]
    pub priority: Priority,
    /// Where it stands.
    pub status: Status,
}

/// A whole plan: every step, in order (ACP's `Plan`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The steps.
    pub entries: Vec<Entry>,
}

impl Plan {
    /// The plan a call's `arguments` set, checked; the message says what
    /// was wrong.
    pub fn from_arguments(arguments: &Value) -> Result<Self, String> {
        let plan: Plan = serde_json::from_value(arguments.clone()).map_err(|e| {
            format!(
                "invalid arguments for plan: {e}; send {{\"entries\": [{{\"content\": \"...\", \"status\": \"pending|in_progress|completed\", \"priority\": \"high|medium|low\"}}]}}"
            )
        })?;
        if plan.entries.len() > MAX_ENTRIES {
            return Err(format!("a plan has at most {MAX_ENTRIES} steps, not {}: merge steps", plan.entries.len()));
        }
        for (i, entry) in plan.entries.iter().enumerate() {
            if entry.content.trim().is_empty() {
                return Err(format!("step {} of the plan is empty: say what it does", i + 1));
            }
            if entry.content.chars().count() > MAX_CONTENT {
                return Err(format!("step {} of the plan is longer than {MAX_CONTENT} characters: shorten it", i + 1));
            }
        }
        Ok(plan)
    }

    /// The plan as a checklist, one step a line (`[x]` done, `[>]` in
    /// progress, `[ ]` pending; `!` marks high priority).
    pub fn checklist(&self) -> String {
        if self.entries.is_empty() {
            return "(the plan is empty)\n".to_owned();
        }
        let mut out = String::new();
        for entry in &self.entries {
            let mark = match entry.status {
                Status::Completed => "[x]",
                Status::InProgress => "[>]",
                Status::Pending => "[ ]",
            };
            let high = if entry.priority == Priority::High { "! " } else { "" };
            out.push_str(&format!("{mark} {high}{}\n", entry.content.trim()));
        }
        out
    }
}

/// `plan {entries: [{content, status, priority?}]}`.
#[derive(Debug)]
pub struct PlanTool {
    spec: ToolSpec,
}

impl Default for PlanTool {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanTool {
    /// The tool.
    pub fn new() -> Self {
        let spec = ToolSpec {
            name: NAME.into(),
            description: "Record your plan for a task of several steps, and update it as you go: send the whole \
                          list each time (every step with its status). Shown to the person; changes nothing else."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "entries": {
                        "type": "array",
                        "maxItems": MAX_ENTRIES,
                        "description": "Every step of the plan, in order",
                        "items": {
                            "type": "object",
                            "properties": {
                                "content": {"type": "string", "minLength": 1, "description": "What the step does"},
                                "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                                "priority": {"type": "string", "enum": ["high", "medium", "low"]}
                            },
                            "required": ["content", "status"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["entries"],
                "additionalProperties": false
            }),
            risk: Risk::ReadOnly,
            capabilities: caps(&[]),
            replay: ReplayPolicy::Idempotent,
        };
        Self { spec }
    }
}

impl Tool for PlanTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match Plan::from_arguments(&request.arguments) {
            Ok(_) => Validation::Valid,
            Err(e) => Validation::Invalid(e),
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        // Checked again: a resumed call is held to the same rule.
        let plan = Plan::from_arguments(&request.arguments).map_err(ToolError::InvalidArguments)?;
        let done = plan.entries.iter().filter(|e| e.status == Status::Completed).count();
        let summary = format!("plan recorded: {done} of {} steps done\n{}", plan.entries.len(), plan.checklist());
        let structured = serde_json::to_value(&plan).ok();
        Ok(receipt(start, Risk::ReadOnly, summary, ctx.limits.output_cap, structured, Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_plan_parses_with_default_priority_and_refuses_bad_steps() {
        let plan = Plan::from_arguments(&json!({"entries": [
            {"content": "read", "status": "completed"},
            {"content": "fix", "status": "in_progress", "priority": "high"},
            {"content": "test", "status": "pending", "priority": "low"},
        ]}))
        .unwrap();
        assert_eq!(plan.entries[0].priority, Priority::Medium);
        assert_eq!(plan.checklist(), "[x] read\n[>] ! fix\n[ ] test\n");
        assert_eq!(
            serde_json::to_value(&plan.entries[1]).unwrap(),
            json!({"content": "fix", "priority": "high", "status": "in_progress"})
        );
        for bad in [
            json!({}),
            json!({"entries": [{"content": "x", "status": "done"}]}),
            json!({"entries": [{"content": " ", "status": "pending"}]}),
            json!({"entries": [{"content": "x", "status": "pending", "extra": 1}]}),
            json!({"entries": [{"content": "x".repeat(MAX_CONTENT + 1), "status": "pending"}]}),
            json!({"entries": vec![json!({"content": "x", "status": "pending"}); MAX_ENTRIES + 1]}),
        ] {
            assert!(Plan::from_arguments(&bad).is_err(), "{bad}");
        }
    }
}
