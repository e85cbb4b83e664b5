//! Issue 53.8 through the real `cairn` binary: an MCP server's resources
//! and prompts are offered to the model as tools of that server
//! (`mcp__NAME__list_resources`, `read_resource`, `list_prompts`,
//! `get_prompt`), here with the registry's server-everything, whose
//! `initialize` declares both. Tiered like the server's own tools: an
//! untrusted server's reads ask (Write), a trusted and contained one's do
//! not (ReadOnly).

use std::process::Stdio;

use serde_json::json;

use super::util::Env;
use super::{by_tool, config, node_prefix, payloads, stderr, stdout};

#[test]
fn a_servers_resources_and_prompts_are_offered_as_tools() {
    let env = Env::new();
    let node = node_prefix();
    config(
        &env,
        &format!("[mcp_servers.every]\ncommand = \"{}/node_modules/.bin/mcp-server-everything\"\n", node.display()),
    );
    let doc = "demo://resource/static/document/features.md";
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "mcp__every__list_resources", "arguments": {}},
            {"id": "c2", "name": "mcp__every__read_resource", "arguments": {"uri": doc}},
            {"id": "c3", "name": "mcp__every__list_prompts", "arguments": {}},
            {"id": "c4", "name": "mcp__every__get_prompt", "arguments": {"name": "args-prompt", "arguments": {"city": "Oslo"}}},
            {"id": "c5", "name": "mcp__every__read_resource", "arguments": {"uri": "demo://no/such/thing"}},
        ]}),
        json!({"text": "done"}),
    ]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__every__*", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let summary = |tool: &str, nth: usize| {
        let found: Vec<_> = done.iter().filter(|p| p["tool"] == tool).collect();
        assert!(found.len() > nth, "no completed call {nth} of {tool} in {done:#?}\n{}", stderr(&out));
        found[nth]["receipt"]["outputSummary"].as_str().unwrap().to_owned()
    };
    let listed = summary("mcp__every__list_resources", 0);
    assert!(listed.contains(doc), "{listed}");
    assert!(listed.contains("URI templates:"), "{listed}");
    assert!(summary("mcp__every__read_resource", 0).contains("Everything Server - Features"));
    let prompts = summary("mcp__every__list_prompts", 0);
    assert!(prompts.contains("args-prompt(city, state?)") && prompts.contains("simple-prompt"), "{prompts}");
    assert_eq!(summary("mcp__every__get_prompt", 0), "user: What's weather in Oslo?");
    // An unknown URI is the server's refusal, said to the model.
    let failed = payloads(&env, "toolFailed");
    let refused = by_tool(&failed, "mcp__every__read_resource");
    assert!(refused.to_string().contains("refused"), "{refused:#}");
    // Untrusted annotations: the reads are Write, asked (here allowed).
    let receipt = &by_tool(&done, "mcp__every__list_prompts")["receipt"];
    assert_eq!(receipt["tier"], "write", "{receipt:#}");
    let list = env.cairn(&["mcp", "list"]).output().unwrap();
    for name in ["mcp__every__list_resources", "mcp__every__read_resource", "mcp__every__get_prompt"] {
        assert!(stdout(&list).contains(name), "{}", stdout(&list));
    }
}

/// A server that has neither gets none of these tools (the time server,
/// on the Python SDK, declares both but lists none), and a user's
/// override names them.
#[test]
fn a_server_without_resources_gets_no_resource_tools_and_overrides_apply() {
    let env = Env::new();
    let node = node_prefix();
    config(
        &env,
        &format!(
            "[mcp_servers.every]\ncommand = \"{}/node_modules/.bin/mcp-server-everything\"\n\
             [mcp_servers.every.tools.get_prompt]\nenabled = false\n\
             [mcp_servers.every.tools.read_resource]\nrisk = \"destructive\"\n\
             [mcp_servers.time]\ncommand = \"{}\"\n",
            node.display(),
            super::python_bin().join("mcp-server-time").display()
        ),
    );
    let list = env.cairn(&["mcp", "list"]).output().unwrap();
    let text = stdout(&list);
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    assert!(text.contains("mcp__every__list_prompts"), "{text}");
    assert!(!text.contains("mcp__every__get_prompt"), "disabled by the user: {text}");
    assert!(!text.contains("mcp__time__list_resources") && !text.contains("mcp__time__list_prompts"), "{text}");
    assert!(!stderr(&list).contains("names no tool"), "the overrides name offered tools: {}", stderr(&list));
    let line = text.lines().find(|l| l.contains("mcp__every__read_resource")).unwrap_or_default();
    assert!(line.contains("Destructive"), "the user's tier holds: {line}");
}
