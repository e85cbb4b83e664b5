#!/usr/bin/env python3
"""A PreToolUse hook written to Claude Code's documented hook interface that
stops the agent (`"continue": false` with a `stopReason`) at the first
shell command. Configure it with matcher "Bash".
"""
import json
import sys

json.load(sys.stdin)
print(json.dumps({"continue": False, "stopReason": "the build is frozen: no commands until Monday"}))
