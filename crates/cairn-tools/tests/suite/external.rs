//! External tools: discovery, broken metadata, the stdin/stdout protocol,
//! exit codes.

use cairn_core::tool::{Capability, ReplayPolicy, Risk, Tool};
use cairn_tools::{ToolRegistry, ToolsConfig, discover};
use serde_json::json;

use super::util::{install_tool, metadata, run};

#[test]
fn broken_metadata_is_reported_per_file_without_failing_the_others() {
    let root = tempfile::tempdir().unwrap();
    let user = root.path().join("user");
    let project = root.path().join("project/.cairn/tools");
    let echo = "#!/bin/bash\ncat\n";
    install_tool(&user, "good", echo, &metadata("readOnly", &["fileRead"], "timeout = 5"));
    install_tool(&user, "syntax", echo, "description = \"x\"\nrisk = \n");
    install_tool(&user, "badrisk", echo, &metadata("catastrophic", &[], ""));
    install_tool(&user, "typo", echo, &metadata("readOnly", &[], "timout = 5"));
    install_tool(&user, "guarded", echo, &metadata("write", &[], "").replace("\"never\"", "\"guarded\""));
    install_tool(&user, "shell", echo, &metadata("write", &[], ""));
    install_tool(
        &user,
        "noparams",
        echo,
        "description = \"x\"\nrisk = \"readOnly\"\nreplay = \"never\"\nparameters = { type = \"string\" }\n",
    );
    std::fs::write(user.join("missing.toml"), metadata("readOnly", &[], "")).unwrap();
    let noexec = install_tool(&user, "noexec", echo, &metadata("readOnly", &[], ""));
    std::fs::set_permissions(noexec.with_extension(""), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    install_tool(&project, "good", echo, &metadata("write", &[], ""));
    install_tool(&project, "local", echo, &metadata("write", &["fileRead", "fileWrite"], ""));

    let dirs = vec![root.path().join("nonexistent"), user.clone(), project.clone()];
    let registry = ToolRegistry::scan(&dirs, &ToolsConfig::default());
    assert_eq!(registry.names().len(), 10, "{:?}", registry.names());
    let (tools, errors) = discover(&dirs, &ToolsConfig::default());
    let mut names: Vec<_> = tools.iter().map(|t| t.tool.spec().name.clone()).collect();
    names.sort();
    assert_eq!(names, ["good", "local"]);
    let good = tools.iter().find(|t| t.tool.spec().name == "good").unwrap();
    assert_eq!(good.tool.spec().risk, Risk::ReadOnly, "the first directory wins");
    assert!(good.origin.to_string().ends_with("user/good.toml"));
    assert_eq!(good.tool.spec().capabilities.iter().copied().collect::<Vec<_>>(), [Capability::FileRead]);
    assert_eq!(good.tool.spec().replay, ReplayPolicy::Never);

    let reason = |file: &str| {
        errors
            .iter()
            .find(|e| e.file.ends_with(file))
            .unwrap_or_else(|| panic!("no error for {file}: {errors:?}"))
            .to_string()
    };
    assert!(reason("user/syntax.toml").contains("invalid metadata"));
    assert!(reason("badrisk.toml").contains("catastrophic"));
    assert!(reason("typo.toml").contains("timout"));
    assert!(reason("guarded.toml").contains("guarded"));
    assert!(reason("user/shell.toml").contains("built-in"));
    assert!(reason("noparams.toml").contains("type = \"object\""));
    assert!(reason("missing.toml").contains("missing"));
    assert!(reason("noexec.toml").contains("chmod +x"));
    assert!(reason("project/.cairn/tools/good.toml").contains("already found"));
    assert_eq!(errors.len(), 9, "{errors:#?}");
}

#[test]
fn registry_loads_metadata_lazily() {
    let dir = tempfile::tempdir().unwrap();
    let meta = install_tool(dir.path(), "later", "#!/bin/bash\ncat\n", "broken = ");
    let registry = ToolRegistry::scan(&[dir.path().to_path_buf()], &ToolsConfig::default());
    assert_eq!(registry.names(), ["later"]);
    // Fixed before first use: the scan did not parse it.
    std::fs::write(&meta, metadata("readOnly", &[], "")).unwrap();
    assert!(registry.get("later").unwrap().is_ok());
    assert!(registry.get("nothing").is_none());
}

#[test]
fn arguments_arrive_on_stdin_and_json_stdout_becomes_structured_output() {
    let root = tempfile::tempdir().unwrap();
    let script = "#!/bin/bash\nIFS= read -r args\necho \"{\\\"got\\\": $args, \\\"tool\\\": \\\"$CAIRN_TOOL_NAME\\\"}\"\necho warning >&2\n";
    let t = cairn_tools::ExternalTool::load(
        &install_tool(root.path(), "echoer", script, &metadata("readOnly", &[], "")),
        &ToolsConfig::default(),
    )
    .unwrap();
    let r = run(&t, json!({"q": "hello"}), root.path()).unwrap();
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.structured_output.unwrap(), json!({"got": {"q": "hello"}, "tool": "echoer"}));
    assert!(r.output_summary.contains("[stderr]\nwarning"), "{}", r.output_summary);

    let text = cairn_tools::ExternalTool::load(
        &install_tool(
            &root.path().join("t"),
            "fails",
            "#!/bin/bash\necho not json\nexit 3\n",
            &metadata("readOnly", &[], ""),
        ),
        &ToolsConfig::default(),
    )
    .unwrap();
    let r = run(&text, json!({}), root.path()).unwrap();
    assert_eq!(r.exit_code, 3);
    assert!(r.output_summary.starts_with("not json\n"));
    assert!(r.output_summary.contains("[exit code 3]"));
    assert!(text.validate(&super::util::request("fails", json!([1]))) != cairn_core::tool::Validation::Valid);
}

#[test]
fn load_tools_gives_builtins_then_external_tools_from_the_standard_dirs() {
    let root = tempfile::tempdir().unwrap();
    let (data, config, cwd) = (root.path().join("data"), root.path().join("config"), root.path().join("work"));
    let dirs = cairn_tools::tool_dirs(&data, &config, &cwd);
    install_tool(&cwd.join(".cairn/tools"), "projtool", "#!/bin/bash\ncat\n", &metadata("readOnly", &[], ""));
    install_tool(&config.join("tools"), "projtool", "#!/bin/bash\ncat\n", &metadata("write", &[], ""));
    let (tools, errors) = cairn_tools::load_tools(&ToolsConfig::default(), &dirs).unwrap();
    assert_eq!(tools.len(), 7);
    let last = tools.last().unwrap();
    assert_eq!(last.tool.spec().name, "projtool");
    assert_eq!(last.tool.spec().risk, Risk::Write, "the user's tool wins over the project's");
    assert!(
        matches!(&last.origin, cairn_tools::ToolOrigin::External { executable, .. } if executable.starts_with(&config))
    );
    assert_eq!(errors.len(), 1);
}
