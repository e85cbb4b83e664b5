//! The [`ToolRegistry`]: the tools a session may call, by name, in the
//! order they were registered.
//!
//! It enforces two structural rules of the approval policy: a tool whose
//! declared risk is below the tier floor of its capabilities
//! ([`crate::tool::Capability::min_risk`]) is never registered, and a tool
//! whose declared risk needs a person (Destructive) cannot be registered
//! when no interactive approver is wired — the approval gate
//! ([`crate::approval::gate::gate`]) says so, as for every call. It must not
//! run tools or decide approvals, and sits below the turn (it has its own
//! error).

use std::collections::HashMap;
use std::sync::Arc;

use crate::approval::{Answer, Approver, Asker, Gated, SessionMode, gate};
use crate::tool::{Capability, Risk, Tool, ToolSpec};

/// Why the registry refused a tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The tool declares less risk than its capabilities imply.
    #[error(
        "tool {tool:?} declares risk {declared:?} but its capabilities need at least {floor:?} (see Capability::min_risk)"
    )]
    BelowFloor {
        /// The tool.
        tool: String,
        /// The risk it declares.
        declared: Risk,
        /// The least risk its capabilities allow.
        floor: Risk,
    },
    /// A tool of that name is already registered.
    #[error("a tool named {0:?} is already registered")]
    Duplicate(String),
    /// The tool needs a person's approval and no interactive approver is
    /// wired, so it is not offered.
    #[error("{reason}")]
    NeedsPerson {
        /// The tool.
        tool: String,
        /// The approval gate's refusal.
        reason: String,
    },
}

/// Tools by name.
pub struct ToolRegistry {
    interactive: bool,
    hooks: Option<Arc<dyn crate::hooks::Hooks>>,
    tools: Vec<Arc<dyn Tool>>,
    specs: Vec<ToolSpec>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("interactive", &self.interactive)
            .field("tools", &self.specs.iter().map(|s| &s.name).collect::<Vec<_>>())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry for a session whose calls `approver` answers: a
    /// Destructive tool is offered only when a person can answer (the
    /// gate's rule, asked of the same approver the turn will ask, so the
    /// tools offered and the verdicts given can never disagree).
    pub fn new(approver: &dyn Approver) -> Self {
        Self {
            interactive: approver.is_interactive(),
            hooks: None,
            tools: Vec::new(),
            specs: Vec::new(),
            by_name: HashMap::new(),
        }
    }

    /// The hooks every call of a turn over this registry goes through
    /// (`crate::hooks`); the host sets them with the tools.
    pub fn set_hooks(&mut self, hooks: Option<Arc<dyn crate::hooks::Hooks>>) {
        self.hooks = hooks;
    }

    /// The hooks, if any.
    pub fn hooks(&self) -> Option<&Arc<dyn crate::hooks::Hooks>> {
        self.hooks.as_ref()
    }

    /// Add a tool. Refuses a duplicate name, a tool declaring less risk than
    /// its capabilities imply, and a Destructive tool when no interactive
    /// approver is wired.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let spec = tool.spec().clone();
        if self.by_name.contains_key(&spec.name) {
            return Err(RegistryError::Duplicate(spec.name));
        }
        let floor = Capability::floor(&spec.capabilities);
        if spec.risk < floor {
            return Err(RegistryError::BelowFloor { tool: spec.name, declared: spec.risk, floor });
        }
        // What is offered does not depend on the mode, which may change
        // between calls: the gate refuses by mode at each call.
        let asker = Asker { interactive: self.interactive, mode: SessionMode::Ask };
        if let Err(refusal) = gate(Gated::call(&spec.name, spec.risk), asker) {
            let reason = match refusal.decision {
                Answer::Deny { reason } => reason,
                Answer::Approve | Answer::ApproveForSession => String::new(),
            };
            return Err(RegistryError::NeedsPerson { tool: spec.name, reason });
        }
        self.by_name.insert(spec.name.clone(), self.tools.len());
        self.tools.push(tool);
        self.specs.push(spec);
        Ok(())
    }

    /// The specs offered to the model, in registration order.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// A tool by name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    /// Whether an interactive approver is wired.
    pub fn is_interactive(&self) -> bool {
        self.interactive
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;
    use crate::tool::{Capability, ReplayPolicy, ToolContext, ToolError, ToolReceipt, ToolRequest};

    #[derive(Debug)]
    struct Declared(ToolSpec);

    impl Tool for Declared {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn execute(&self, _: &ToolRequest, _: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
            Err(ToolError::Other("never run in these tests".into()))
        }
    }

    fn tool(risk: Risk, caps: &[Capability]) -> Arc<dyn Tool> {
        Arc::new(Declared(ToolSpec {
            name: format!("t{risk:?}{caps:?}"),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
            risk,
            capabilities: caps.iter().copied().collect::<BTreeSet<_>>(),
            replay: ReplayPolicy::Never,
        }))
    }

    /// An approver that only says whether a person is at hand.
    struct Asks(bool);

    impl Approver for Asks {
        fn is_interactive(&self) -> bool {
            self.0
        }
        fn decide(
            &mut self,
            _: &crate::approval::ApprovalRequest<'_>,
        ) -> Result<crate::approval::Verdict, crate::approval::ApprovalError> {
            Err(crate::approval::ApprovalError::Failed("never asked in these tests".into()))
        }
    }

    #[test]
    fn a_destructive_tool_is_offered_only_where_a_person_answers() {
        let mut registry = ToolRegistry::new(&Asks(false));
        let err = registry.register(tool(Risk::Destructive, &[])).unwrap_err();
        assert!(matches!(err, RegistryError::NeedsPerson { .. }), "{err}");
        assert!(registry.is_empty());
        let mut registry = ToolRegistry::new(&Asks(true));
        registry.register(tool(Risk::Destructive, &[])).unwrap();
        assert_eq!(registry.len(), 1);
    }

    #[test]
    fn a_tool_declaring_less_than_its_capabilities_is_refused() {
        use Capability::*;
        for cap in [FileWrite, Network, ShellExec, ProcessSpawn] {
            let mut registry = ToolRegistry::new(&Asks(true));
            let err = registry.register(tool(Risk::ReadOnly, &[FileRead, cap])).unwrap_err().to_string();
            assert!(err.contains("at least Write"), "{cap:?}: {err}");
            assert!(registry.is_empty());
            registry.register(tool(Risk::Write, &[FileRead, cap])).unwrap();
            registry.register(tool(Risk::Destructive, &[FileRead, cap])).unwrap();
        }
        let mut registry = ToolRegistry::new(&Asks(false));
        registry.register(tool(Risk::ReadOnly, &[FileRead])).unwrap();
        registry.register(tool(Risk::ReadOnly, &[])).unwrap();
        assert_eq!(registry.len(), 2);
    }
}
