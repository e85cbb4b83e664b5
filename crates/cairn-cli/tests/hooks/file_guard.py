#!/usr/bin/env python3
"""A PreToolUse hook written to Claude Code's documented hook interface:
it guards files by `tool_input.file_path` for the tools `Write`, `Edit` and
`MultiEdit`, and refuses with a JSON answer
(`hookSpecificOutput.permissionDecision: "deny"`). Configure it with
matcher "Edit|Write|MultiEdit".
"""
import json
import os
import sys

PROTECTED = (".env", "package-lock.json", ".git/")

data = json.load(sys.stdin)
if data.get("hook_event_name") != "PreToolUse" or data.get("tool_name") not in ("Write", "Edit", "MultiEdit"):
    sys.exit(0)
file_path = data.get("tool_input", {}).get("file_path", "")
if not os.path.isabs(file_path):
    print(f"file_path is not absolute: {file_path!r}", file=sys.stderr)
    sys.exit(2)
name = os.path.basename(file_path)
if any(p in file_path if p.endswith("/") else name == p for p in PROTECTED):
    print(json.dumps({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": f"{name} is protected: edit it by hand",
        }
    }))
sys.exit(0)
