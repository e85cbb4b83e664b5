#!/usr/bin/env python3
"""A PreToolUse hook written to Claude Code's documented hook interface that
asks the person to confirm every write (`permissionDecision: "ask"`).
Configure it with matcher "Write".
"""
import json
import sys

data = json.load(sys.stdin)
print(json.dumps({
    "hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "ask",
        "permissionDecisionReason": "writes to " + data["tool_input"]["file_path"] + " need a person's look",
    }
}))
