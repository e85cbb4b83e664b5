//! The [`ToolRegistry`]: the tools a session may call, by name, in the
//! order they were registered.
//!
//! It enforces two structural rules of the approval policy: a tool whose
//! declared risk is below the tier floor of its capabilities
//! ([`crate::tool::Capability::min_risk`]) is never registered, and a tool
//! whose declared risk is Destructive cannot be registered when no
//! interactive approver is wired. It must not run tools or decide approvals.

use std::collections::HashMap;
use std::sync::Arc;

use crate::tool::{Capability, Risk, Tool, ToolSpec};
use crate::turn::TurnError;

/// Tools by name.
pub struct ToolRegistry {
    interactive: bool,
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
    /// An empty registry. `approver_is_interactive` says whether a person
    /// can answer approvals in this host (required for Destructive tools).
    pub fn new(approver_is_interactive: bool) -> Self {
        Self { interactive: approver_is_interactive, tools: Vec::new(), specs: Vec::new(), by_name: HashMap::new() }
    }

    /// Add a tool. Refuses a duplicate name, a tool declaring less risk than
    /// its capabilities imply, and a Destructive tool when no interactive
    /// approver is wired.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), TurnError> {
        let spec = tool.spec().clone();
        if self.by_name.contains_key(&spec.name) {
            return Err(TurnError::Registry(format!("a tool named {:?} is already registered", spec.name)));
        }
        let floor = Capability::floor(&spec.capabilities);
        if spec.risk < floor {
            return Err(TurnError::Registry(format!(
                "tool {:?} declares risk {:?} but its capabilities need at least {floor:?} (see Capability::min_risk)",
                spec.name, spec.risk
            )));
        }
        if spec.risk == Risk::Destructive && !self.interactive {
            return Err(TurnError::Registry(format!(
                "tool {:?} is Destructive and needs an interactive approver; none is wired (headless), so it is not offered",
                spec.name
            )));
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

    #[test]
    fn a_tool_declaring_less_than_its_capabilities_is_refused() {
        use Capability::*;
        for cap in [FileWrite, Network, ShellExec, ProcessSpawn] {
            let mut registry = ToolRegistry::new(true);
            let err = registry.register(tool(Risk::ReadOnly, &[FileRead, cap])).unwrap_err().to_string();
            assert!(err.contains("at least Write"), "{cap:?}: {err}");
            assert!(registry.is_empty());
            registry.register(tool(Risk::Write, &[FileRead, cap])).unwrap();
            registry.register(tool(Risk::Destructive, &[FileRead, cap])).unwrap();
        }
        let mut registry = ToolRegistry::new(false);
        registry.register(tool(Risk::ReadOnly, &[FileRead])).unwrap();
        registry.register(tool(Risk::ReadOnly, &[])).unwrap();
        assert_eq!(registry.len(), 2);
    }
}
