#!/usr/bin/env python3
"""A PreToolUse hook written to Claude Code's documented hook interface, the
way its published example `bash_command_validator_example.py` is written:
it reads `tool_name` and `tool_input.command`, and blocks with exit code 2
and the reasons on stderr. Configure it with matcher "Bash".
"""
import json
import re
import sys

VALIDATION_RULES = [
    (r"\bgrep\b(?!.*\|)", "Use 'rg' (ripgrep) instead of 'grep' for better performance and features"),
    (r"\bfind\s+\S+\s+-name\b", "Use 'rg --files | rg pattern' or 'rg --files -g pattern' instead of 'find -name'"),
]


def validate_command(command):
    return [message for pattern, message in VALIDATION_RULES if re.search(pattern, command)]


def main():
    try:
        input_data = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"Error: Invalid JSON input: {e}", file=sys.stderr)
        sys.exit(1)
    tool_name = input_data.get("tool_name", "")
    if tool_name != "Bash":
        sys.exit(0)
    command = input_data.get("tool_input", {}).get("command", "")
    if not command:
        sys.exit(0)
    issues = validate_command(command)
    if issues:
        for message in issues:
            print(f"• {message}", file=sys.stderr)
        # Exit code 2 blocks the tool call and shows stderr to the model.
        sys.exit(2)


if __name__ == "__main__":
    main()
