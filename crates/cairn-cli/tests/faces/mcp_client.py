"""Drive `cairn mcp` with the official MCP Python SDK (PyPI `mcp`).

Usage: mcp_client.py SCENARIO CAIRN HOME CWD [EXTRA CAIRN ARGS...]
Each scenario asserts what a client sees and exits non-zero on failure.
"""
import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

scenario, cairn, home, cwd, *extra = sys.argv[1:]


def params():
    env = {"CAIRN_HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.path.join(home, "fakehome"), "NO_COLOR": "1"}
    return StdioServerParameters(command=cairn, args=["mcp", *extra], env=env, cwd=cwd)


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def all_tools(session):
    tools, cursor, pages = [], None, 0
    while True:
        from mcp.types import PaginatedRequestParams
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        pages += 1
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools, pages
        assert pages < 100, "pagination does not end"


async def main():
    async with stdio_client(params()) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "cairn", init
            if scenario == "list":
                tools, pages = await all_tools(session)
                by = {t.name: t for t in tools}
                assert len(by) == len(tools), f"duplicate names across pages: {[t.name for t in tools]}"
                assert pages >= 2, f"page size 2 should give several pages, got {pages}"
                for name in ["read_file", "list_dir", "search", "hello"]:
                    assert name in by, f"{name} missing from {sorted(by)}"
                    a = by[name].annotations
                    assert a.read_only_hint is True and a.destructive_hint is False, (name, a)
                    assert by[name].input_schema.get("type") == "object", by[name].input_schema
                for name in ["write_file", "edit_file", "shell", "nuke"]:
                    assert name not in by, f"{name} must not be exposed without --allow: {sorted(by)}"
                assert "path" in by["read_file"].input_schema["properties"]
                print("listed", sorted(by))
            elif scenario == "list_allowed":
                tools, _ = await all_tools(session)
                by = {t.name: t for t in tools}
                assert "write_file" in by, sorted(by)
                a = by["write_file"].annotations
                assert a.read_only_hint is False and a.destructive_hint is False, a
                # Named by --allow, but Destructive: never exposed.
                assert "nuke" not in by, sorted(by)
                assert "shell" not in by and "edit_file" not in by, sorted(by)
                print("listed", sorted(by))
            elif scenario == "read":
                r = await session.call_tool("read_file", {"path": "a.txt"})
                assert r.is_error is False, r
                assert "hello from the root" in text(r), text(r)
                r = await session.call_tool("hello", {"name": "mcp"})
                assert r.is_error is False and "hi mcp" in text(r), r
                print("read ok")
            elif scenario == "write_unexposed":
                try:
                    r = await session.call_tool("write_file", {"path": "new.txt", "content": "x"})
                except MCPError as e:
                    assert "not exposed" in str(e) and "--allow" in str(e), str(e)
                else:
                    raise AssertionError(f"an unexposed Write tool ran: {r}")
                try:
                    await session.call_tool("nuke", {})
                except MCPError as e:
                    assert "Destructive" in str(e), str(e)
                else:
                    raise AssertionError("a Destructive tool ran")
                assert not os.path.exists(os.path.join(cwd, "new.txt"))
                # The server is still there.
                r = await session.call_tool("read_file", {"path": "a.txt"})
                assert r.is_error is False, r
                print("refused")
            elif scenario == "write_exposed":
                r = await session.call_tool("write_file", {"path": "new.txt", "content": "written by mcp\n"})
                assert r.is_error is False, r
                with open(os.path.join(cwd, "new.txt")) as f:
                    assert f.read() == "written by mcp\n"
                print("written")
            elif scenario == "invalid":
                for args in [{"path": 5}, {}, {"path": "a.txt", "bogus": True}, {"path": "a.txt", "limit": "ten"}]:
                    r = await session.call_tool("read_file", args)
                    assert r.is_error is True, (args, r)
                    assert text(r), r
                try:
                    await session.call_tool("no_such_tool", {})
                except MCPError as e:
                    assert "unknown tool" in str(e), str(e)
                else:
                    raise AssertionError("an unknown tool did not fail")
                r = await session.call_tool("read_file", {"path": "a.txt"})
                assert r.is_error is False and "hello" in text(r), r
                print("invalid refused")
            elif scenario == "outside":
                for path in ["../secret.txt", "/etc/passwd", os.path.join(os.path.dirname(cwd), "secret.txt"), "link-out", "sub/../../secret.txt"]:
                    r = await session.call_tool("read_file", {"path": path})
                    assert r.is_error is True, (path, r)
                    assert "TOP SECRET" not in text(r), (path, text(r))
                r = await session.call_tool("list_dir", {"path": ".."})
                assert r.is_error is True, r
                print("outside refused")
            elif scenario == "shell_pattern":
                tools, _ = await all_tools(session)
                by = {t.name: t for t in tools}
                assert "shell" in by and by["shell"].annotations.read_only_hint is False, sorted(by)
                r = await session.call_tool("shell", {"command": "ls"})
                assert r.is_error is False and "a.txt" in text(r), r
                # Named by the pattern's tool, but not covered by it: denied.
                r = await session.call_tool("shell", {"command": "rm a.txt"})
                assert r.is_error is True and "refused" in text(r), r
                # A call that turns Destructive: refused, nobody can approve it here.
                r = await session.call_tool("shell", {"command": "rm -rf sub"})
                assert r.is_error is True, r
                assert os.path.exists(os.path.join(cwd, "a.txt")) and os.path.exists(os.path.join(cwd, "sub", "keep"))
                print("pattern enforced")
            elif scenario == "ping_running":
                # A call that runs until cancelled; ping is answered meanwhile.
                call = asyncio.ensure_future(session.call_tool("shell", {"command": "sleep 300"}))
                await asyncio.sleep(0.5)  # let the call reach the server (not a timing assertion)
                assert not call.done(), call
                try:
                    await asyncio.wait_for(session.send_ping(), 60)
                except asyncio.TimeoutError:
                    raise AssertionError("ping waited for the running call")
                call.cancel()  # the SDK sends notifications/cancelled
                try:
                    await call
                except asyncio.CancelledError:
                    pass
                r = await session.call_tool("read_file", {"path": "a.txt"})
                assert r.is_error is False and "hello" in text(r), r
                print("ping answered")
            elif scenario == "long_read":
                path = os.path.join(cwd, "long.txt")
                size = os.path.getsize(path)
                seen, offset, answers = [], None, 0
                while True:
                    args = {"path": "long.txt"} if offset is None else {"path": "long.txt", "offset": offset}
                    r = await session.call_tool("read_file", args)
                    assert r.is_error is False, r
                    answers += 1
                    body = text(r)
                    for line in body.splitlines():
                        if "\t" in line and not line.startswith("["):
                            seen.append(int(line.split("\t")[0]))
                    note = [l for l in body.splitlines() if l.startswith("[the answer is full")]
                    if not note:
                        assert "fullOutput" not in body and "truncated" not in body, body[-300:]
                        break
                    assert f"the file is {size} bytes" in note[0], note
                    offset = int(note[0].rsplit("offset=", 1)[1].rstrip("]"))
                    assert answers < 100
                total = sum(1 for _ in open(path))
                assert seen == list(range(1, total + 1)), (seen[:5], seen[-5:], total)
                assert answers > 1, answers
                print("read whole in", answers, "answers")
            else:
                raise SystemExit(f"unknown scenario {scenario}")


asyncio.run(main())
