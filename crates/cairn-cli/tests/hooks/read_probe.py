#!/usr/bin/env python3
"""A PreToolUse hook written to Claude Code's documented hook interface that
refuses every `Read` and says, in its reason, the common input fields it was
given (`session_id`, `transcript_path`, `cwd`, `permission_mode`,
`hook_event_name`, `tool_name`, `tool_input.file_path`). Configure it with a
regular-expression matcher such as "^Rea.*".
"""
import json
import sys

data = json.load(sys.stdin)
fields = {k: data.get(k) for k in ("session_id", "transcript_path", "cwd", "permission_mode", "hook_event_name", "tool_name")}
fields["file_path"] = data.get("tool_input", {}).get("file_path")
print(json.dumps({
    "hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "probe " + json.dumps(fields, sort_keys=True),
    }
}))
