"""Drive `cairn acp` with the ACP Python SDK (PyPI `agent-client-protocol`).

Usage: acp_client.py SCENARIO CAIRN HOME CWD SCRIPT [SESSION_ID]
Each scenario asserts what an editor sees and exits non-zero on failure.
"""
import asyncio
import os
import sys

from acp import text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    FileSystemCapabilities,
    KillTerminalResponse,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)
from acp.stdio import spawn_agent_process

scenario, cairn, home, cwd, script, *rest = sys.argv[1:]


class Editor:
    """Records every update and permission question, in arrival order."""

    def __init__(self, answer):
        self.answer = answer  # "allow_once" | "allow_always" | "reject_once" | "cancel"
        self.events = []
        self.commands = set()
        self.conn = None
        self.held_session = None
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    def on_connect(self, conn):
        self.conn = conn

    async def session_update(self, session_id, update, **kwargs):
        self.events.append(("update", session_id, update))
        if update.session_update == "tool_call_update":
            self.terminal_shown(session_id, update)
        if update.session_update == "available_commands_update":
            self.commands.update(c.name for c in update.available_commands)
        if (self.answer == "cancel_running" and update.session_update == "tool_call_update"
                and update.status == "in_progress"):
            # The tool is running: cancel the turn from the editor.
            await self.conn.cancel(session_id=session_id)

    async def request_permission(self, options, session_id, tool_call, **kwargs):
        self.events.append(("permission", session_id, (tool_call, options)))
        if self.answer == "hold_first":
            # The first session's question is held until the test releases
            # it: its turn keeps running meanwhile.
            if self.held_session in (None, session_id):
                self.held_session = session_id
                self.asked.set()
                await self.release.wait()
            chosen = [o for o in options if o.kind == "allow_once"]
            return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=chosen[0].option_id))
        if self.answer == "forged":
            # A client answering with an option that was not offered.
            return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow-always"))
        if self.answer == "cancel_running":
            return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=options[0].option_id))
        if self.answer == "cancel":
            await self.conn.cancel(session_id=session_id)
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        chosen = [o for o in options if o.kind == self.answer]
        assert chosen, f"option {self.answer} not offered: {options}"
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=chosen[0].option_id))

    async def read_text_file(self, path, session_id, limit=None, line=None, **kwargs):
        self.events.append(("fs_read", session_id, path))
        return ReadTextFileResponse(content="unsaved buffer line\nsecond\n")

    async def write_text_file(self, content, path, session_id, **kwargs):
        self.events.append(("fs_write", session_id, (path, content)))
        return WriteTextFileResponse()

    # The editor's terminal: the command runs here, in the client, with a
    # pipe for its input. A command that reads a line is answered once its
    # tool call shows the terminal (a `terminal` content item): the
    # command finishes only if the terminal was shown while it ran.
    async def create_terminal(self, session_id, command, args=None, env=None, cwd=None, output_byte_limit=None, **kwargs):
        import subprocess
        self.events.append(("terminal", session_id, (command, tuple(args or []), cwd)))
        proc = subprocess.Popen([command, *(args or [])], cwd=cwd, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.terminals = getattr(self, "terminals", {})
        self.shown = getattr(self, "shown", {})
        tid = f"term-{len(self.terminals)}"
        self.terminals[tid] = [proc, None]
        self.shown[tid] = asyncio.Event()
        return CreateTerminalResponse(terminal_id=tid)

    def terminal_shown(self, session_id, update):
        """Note a tool call update that embeds a terminal, and let the
        command waiting on its input go on."""
        for item in update.content or []:
            tid = getattr(item, "terminal_id", None)
            if tid is None:
                continue
            proc = self.terminals[tid][0]
            self.events.append(("terminal_shown", session_id, (tid, proc.poll() is None)))
            if proc.poll() is None:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            self.shown[tid].set()

    async def wait_for_terminal_exit(self, session_id, terminal_id, **kwargs):
        proc = self.terminals[terminal_id][0]
        try:
            # Only a guard against hanging when the terminal is never
            # shown (the assertions then say so): never hit otherwise.
            await asyncio.wait_for(self.shown[terminal_id].wait(), 60)
        except asyncio.TimeoutError:
            proc.kill()
        output, _ = await asyncio.to_thread(proc.communicate)
        self.terminals[terminal_id][1] = output
        return WaitForTerminalExitResponse(exit_code=proc.returncode)

    async def terminal_output(self, session_id, terminal_id, **kwargs):
        proc, output = self.terminals[terminal_id]
        return TerminalOutputResponse(output=output or "", truncated=False,
                                      exit_status=TerminalExitStatus(exit_code=proc.returncode))

    async def release_terminal(self, session_id, terminal_id, **kwargs):
        self.events.append(("terminal_release", session_id, terminal_id))
        return ReleaseTerminalResponse()

    async def kill_terminal(self, session_id, terminal_id, **kwargs):
        return KillTerminalResponse()

    def summary(self, plans=False):
        """Consecutive text chunks joined; tool calls and updates with their
        status; with `plans`, plan updates too ("plan", [(content, priority,
        status)]), all in arrival order."""
        out, ids = [], {}
        for kind, _, payload in self.events:
            if kind in ("fs_read", "fs_write", "terminal", "terminal_release", "terminal_shown"):
                out.append((kind, payload))
                continue
            if kind == "permission":
                tool_call, options = payload
                assert tool_call.tool_call_id in ids, f"permission for an unannounced tool call {tool_call.tool_call_id}"
                out.append(("permission", ids[tool_call.tool_call_id], tuple(o.kind for o in options)))
                continue
            u = payload
            t = u.session_update
            if t in ("agent_message_chunk", "user_message_chunk"):
                if out and out[-1][0] == t:
                    out[-1] = (t, out[-1][1] + u.content.text)
                else:
                    out.append((t, u.content.text))
            elif t == "tool_call":
                assert u.tool_call_id not in ids, f"tool call id reused: {u.tool_call_id}"
                ids[u.tool_call_id] = u.kind
                out.append(("tool_call", u.kind, u.status))
            elif t == "tool_call_update":
                assert u.tool_call_id in ids, f"update of an unannounced tool call {u.tool_call_id}"
                out.append(("update", ids[u.tool_call_id], u.status))
            elif t == "plan" and plans:
                out.append(("plan", [(e.content, e.priority, e.status) for e in u.entries]))
        return out

    def texts(self):
        return [
            "".join(c.content.text for c in (p.content or []) if getattr(c.content, "text", None))
            for k, _, p in self.events
            if k == "update" and p.session_update == "tool_call_update" and p.status in ("completed", "failed")
        ]


def env():
    e = {"CAIRN_HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.path.join(home, "fakehome"), "NO_COLOR": "1"}
    if "LOOP_KEY" in os.environ:
        e["LOOP_KEY"] = os.environ["LOOP_KEY"]
    return e


async def connect(editor):
    # The editor's terminal is the person's choice (`--editor-terminal`);
    # "terminal_not_chosen" offers it to a server started without it.
    chosen = ["--editor-terminal"] if scenario in ("terminal", "terminal_rejected") else []
    return spawn_agent_process(editor, cairn, "--provider", "scripted", "--script", script, "acp", *chosen, env=env(), cwd=cwd)


def expect(got, want):
    assert got == want, f"\n got: {got}\nwant: {want}"


async def start(conn, fs=False, terminal=False):
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs), terminal=terminal)
    init = await conn.initialize(protocol_version=1, client_capabilities=caps)
    assert init.protocol_version == 1, init
    assert init.agent_capabilities.load_session is True, init
    return init


async def plan():
    # The model's `plan` calls reach the editor as its plan (whole, each
    # time), not as tool calls; a plan the tool refuses is not shown; a new
    # process loading the session shows it again.
    editor = Editor("allow_once")
    async with await connect(editor) as (conn, _):
        await start(conn)
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
        r = await conn.prompt(session_id=sid, prompt=[text_block("read a.txt, step by step")])
        expect(r.stop_reason, "end_turn")
        seen = editor.summary(plans=True)
        expect(seen, [
            ("plan", [("read a.txt", "high", "in_progress"), ("tell what it says", "medium", "pending")]),
            ("tool_call", "read", "pending"), ("update", "read", "in_progress"), ("update", "read", "completed"),
            ("plan", [("read a.txt", "high", "completed"), ("tell what it says", "medium", "in_progress")]),
            ("agent_message_chunk", "It says hello."),
        ])
    print("ok", scenario)
    loaded = Editor("allow_once")
    async with await connect(loaded) as (conn, _):
        await start(conn)
        await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
        # (a replayed call shows where it ended, not its running)
        expect(loaded.summary(plans=True), [("user_message_chunk", "read a.txt, step by step")]
               + [e for e in seen if e != ("update", "read", "in_progress")])
    print("ok replayed")


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


async def refused(conn, sid, prompt, said):
    from acp import RequestError
    try:
        await conn.prompt(session_id=sid, prompt=prompt)
    except RequestError as e:
        text = str(e.data) + str(e)
        assert said in text, f"{said!r} not in {text!r}"
    else:
        raise AssertionError(f"a prompt was accepted that should be refused ({said})")


async def image():
    # The configured provider (a loopback OpenAI-compatible server) takes
    # images: they are offered, accepted and sent; bad ones are refused
    # with the reason; a model that takes none refuses them; a new process
    # loading the session shows the image again.
    from acp import image_block
    editor = Editor("allow_once")
    async with spawn_agent_process(editor, cairn, "acp", env=env(), cwd=cwd) as (conn, _):
        init = await start(conn)
        assert init.agent_capabilities.prompt_capabilities.image is True, init.agent_capabilities
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
        r = await conn.prompt(session_id=sid, prompt=[text_block("what is in this picture?"), image_block(PNG, "image/png")])
        expect(r.stop_reason, "end_turn")
        await refused(conn, sid, [text_block("and this?"), image_block("AAAA", "image/tiff")], "PNG, JPEG, GIF or WebP")
        await refused(conn, sid, [text_block("and this?"), image_block("AA-A", "image/png")], "not valid base64")
        big = "A" * (8 * 1024 * 1024 + 4)
        await refused(conn, sid, [text_block("and this?"), image_block(big, "image/png")], "over the limit of 8388608")
        await conn.set_config_option(config_id="model", session_id=sid, value="textonly")
        await refused(conn, sid, [text_block("and this?"), image_block(PNG, "image/png")], "takes no images")
    print("ok", scenario)
    loaded = Editor("allow_once")
    async with spawn_agent_process(loaded, cairn, "acp", env=env(), cwd=cwd) as (conn, _):
        await start(conn)
        await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
        shown = [(u.content.type, getattr(u.content, "mime_type", None), getattr(u.content, "data", None))
                 for k, _, u in loaded.events if k == "update" and u.session_update == "user_message_chunk"]
        expect(shown, [("text", None, None), ("image", "image/png", PNG)])
    print("ok replayed")
    async with spawn_agent_process(Editor("allow_once"), cairn, "--provider", "textonly", "acp", env=env(), cwd=cwd) as (conn, _):
        init = await start(conn)
        assert init.agent_capabilities.prompt_capabilities.image is False, init.agent_capabilities
    print("ok text only")


async def elicit():
    # An editor's MCP server (the official Python SDK) asks the user's
    # name while its tool runs: the question reaches the editor as
    # `elicitation/create` (form) tied to the session and the call, and the
    # answer reaches the server; an editor that offers no elicitation gets
    # the question declined, saying so.
    from acp.schema import AcceptElicitationResponse, ClientCapabilities, ElicitationCapabilities, McpServerStdio
    python, server_script = rest
    server = McpServerStdio(name="ask", command=python, args=[server_script], env=[])
    asked = []

    class Answering(Editor):
        async def create_elicitation(self, message, mode, **kwargs):
            asked.append((message, mode))
            return AcceptElicitationResponse(action="accept", content={"name": "Ada"})

    editor = Answering("allow_once")
    # (elicitation is in ACP's unstable part: the SDK routes it only when asked to)
    async with spawn_agent_process(editor, cairn, "--provider", "scripted", "--script", script, "acp", env=env(),
                                   cwd=cwd, use_unstable_protocol=True) as (conn, _):
        caps = ClientCapabilities(elicitation=ElicitationCapabilities(form={}))
        await conn.initialize(protocol_version=1, client_capabilities=caps)
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[server])).session_id
        r = await conn.prompt(session_id=sid, prompt=[text_block("greet me")])
        expect(r.stop_reason, "end_turn")
        ((message, mode),) = asked
        expect(message, "mcp__ask__greet asks: What is your name?")
        root = mode.root if hasattr(mode, "root") else mode
        expect(root.session_id, sid)
        assert root.tool_call_id, root
        assert "name" in root.requested_schema.properties, root.requested_schema
        done = editor.texts()
        assert any("hello Ada" in t for t in done), f"the server got the answer: {done}"
    print("ok answered")
    plain = Editor("allow_once")
    async with await connect(plain) as (conn, _):
        await start(conn)
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[server])).session_id
        r = await conn.prompt(session_id=sid, prompt=[text_block("greet me")])
        expect(r.stop_reason, "end_turn")
        done = plain.texts()
        assert any("no name: decline" in t and "does not offer elicitation" in t for t in done), done
    print("ok declined")


async def elicit_url():
    # An MCP server asks the person to open a sign-in URL (MCP's URL mode):
    # an editor offering URL elicitation gets `elicitation/create` with
    # mode "url", the URL and the server's id, tied to the session and the
    # call, and its consent reaches the server; an editor offering forms
    # only gets the request declined, saying so.
    from acp.schema import AcceptElicitationResponse, ClientCapabilities, ElicitationCapabilities, McpServerStdio
    python, server_script = rest
    server = McpServerStdio(name="ask", command=python, args=[server_script], env=[])
    for offers_url in (True, False):
        asked = []

        class Answering(Editor):
            async def create_elicitation(self, message, mode, **kwargs):
                asked.append((message, mode))
                return AcceptElicitationResponse(action="accept")

        editor = Answering("allow_once")
        async with spawn_agent_process(editor, cairn, "--provider", "scripted", "--script", script, "acp", env=env(),
                                       cwd=cwd, use_unstable_protocol=True) as (conn, _):
            offered = ElicitationCapabilities(form={}, url={}) if offers_url else ElicitationCapabilities(form={})
            await conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities(elicitation=offered))
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[server])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("connect me")])
            expect(r.stop_reason, "end_turn")
            done = editor.texts()
            if offers_url:
                ((message, mode),) = asked
                expect(message, "mcp__ask__connect asks: Sign in to the example service")
                root = mode.root if hasattr(mode, "root") else mode
                assert type(root).__name__.startswith("ElicitationUrl"), root
                expect(str(root.url), "https://auth.example.org/connect?client=cairn-test")
                expect(root.elicitation_id, "sign-in-1")
                expect(root.session_id, sid)
                assert root.tool_call_id, root
                assert any("url: accept" in t for t in done), f"the server got the consent: {done}"
            else:
                expect(asked, [])
                assert any("url: decline" in t and "does not offer URL elicitation" in t for t in done), done
    print("ok url")


async def main():
    if scenario == "elicit":
        return await elicit()
    if scenario == "elicit_url":
        return await elicit_url()
    if scenario == "plan":
        return await plan()
    if scenario == "image":
        return await image()
    answer = {"prompt_allow": "allow_once", "prompt_reject": "reject_once", "destructive": "reject_once",
              "always": "allow_always", "cancel": "cancel", "load": "allow_once", "client_fs": "allow_once", "cancel_running": "cancel_running", "fail": "allow_once", "forged": "forged",
              "recover": "allow_once", "concurrent": "hold_first", "load_refused": "allow_once", "modes": "reject_once", "stream": "allow_once", "model": "allow_once", "commands": "allow_once", "mcp": "allow_once", "undo": "allow_once", "finish_undo": "allow_once", "subagent": "allow_once", "authority_fs": "allow_once",
              "plan_after_always": "allow_always", "session_info": "allow_once", "terminal": "allow_once",
              "terminal_rejected": "reject_once", "terminal_not_chosen": "reject_once", "plan": "allow_once"}[scenario]
    editor = Editor(answer)
    async with await connect(editor) as (conn, proc):
        editor_init = [await start(conn, fs=scenario in ("client_fs", "authority_fs"),
                                   terminal=scenario in ("terminal", "terminal_rejected", "terminal_not_chosen"))]
        if scenario == "recover":
            sid = rest[0]
            await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
            editor.events.clear()
            # The failed turn is finished first, then the new prompt runs.
            r = await conn.prompt(session_id=sid, prompt=[text_block("next")])
            expect(r.stop_reason, "end_turn")
            # (consecutive chunks are joined by summary())
            expect(editor.summary(), [("agent_message_chunk", "Recovered.Third.")])
            print("recovered")
            return
        if scenario == "finish_undo":
            sid = rest[0]
            await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
            editor.events.clear()
            # The interrupted undo is finished first and said so, then the
            # prompt runs on the conversation the undo went back to.
            r = await conn.prompt(session_id=sid, prompt=[text_block("next")])
            expect(r.stop_reason, "end_turn")
            said = editor.summary()
            assert len(said) == 1 and said[0][0] == "agent_message_chunk", said
            assert said[0][1].startswith("[finished the interrupted undo") and said[0][1].endswith("After."), said
            assert not os.path.exists(os.path.join(cwd, "b.txt")), "the undo was not finished"
            print("ok", scenario)
            return
        if scenario == "undo":
            # A write, then /undo and /redo typed in the editor.
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("write it")])
            expect(r.stop_reason, "end_turn")
            b = os.path.join(cwd, "b.txt")
            with open(b) as f:
                expect(f.read(), "new\n")
            assert {"undo", "redo", "resume"} <= editor.commands, editor.commands
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("/undo")])
            expect(r.stop_reason, "end_turn")
            said = editor.summary()
            assert said and said[0][0] == "agent_message_chunk" and "1 effect(s)" in said[0][1], said
            assert not os.path.exists(b), "undo left b.txt"
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("/redo")])
            expect(r.stop_reason, "end_turn")
            with open(b) as f:
                expect(f.read(), "new\n")
            editor.events.clear()
            with open(b, "w") as f:
                f.write("mine\n")
            r = await conn.prompt(session_id=sid, prompt=[text_block("/undo")])
            said = editor.summary()
            assert "b.txt: it was changed after the turn" in said[0][1], said
            with open(b) as f:
                expect(f.read(), "mine\n")
            print("ok", scenario)
            return
        if scenario == "load_refused":
            # A prefix of an id, and paths, are refused (nothing is created
            # beside a path).
            from acp import RequestError
            for wanted in rest:
                try:
                    await conn.load_session(cwd=cwd, session_id=wanted, mcp_servers=[])
                except RequestError as e:
                    print("REFUSED", wanted, str(e.data) + str(e))
                else:
                    raise AssertionError(f"session/load {wanted!r} was accepted")
            return
        if scenario == "modes":
            new = await conn.new_session(cwd=cwd, mcp_servers=[])
            sid = new.session_id
            expect(new.modes.current_mode_id, "ask")
            expect([m.id for m in new.modes.available_modes], ["ask", "auto-edit", "plan"])
            # Plan: a write is refused without a question.
            await conn.set_session_mode(session_id=sid, mode_id="plan")
            r = await conn.prompt(session_id=sid, prompt=[text_block("plan it")])
            expect(r.stop_reason, "end_turn")
            modes = [u.current_mode_id for k, _, u in editor.events if k == "update" and u.session_update == "current_mode_update"]
            expect(modes, ["plan"])
            editor.events.clear()
            # (the plan turn's summary, without the mode update)
            assert not os.path.exists(os.path.join(cwd, "b.txt")), "plan mode wrote a file"
            # Auto-edit: a write runs without a question.
            await conn.set_session_mode(session_id=sid, mode_id="auto-edit")
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("do it")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [
                ("tool_call", "edit", "pending"), ("update", "edit", "in_progress"), ("update", "edit", "completed"),
                ("agent_message_chunk", "Edited."),
            ])
            with open(os.path.join(cwd, "c.txt")) as f:
                expect(f.read(), "auto\n")
            from acp import RequestError
            try:
                await conn.set_session_mode(session_id=sid, mode_id="yolo")
            except RequestError as e:
                assert "ask, auto-edit, plan" in str(e.data) + str(e), e
            else:
                raise AssertionError("an unknown mode was accepted")
            print("ok", scenario)
            return
        if scenario == "plan_after_always":
            # "Allow always" for a write, then plan mode: the remembered
            # rule does not let the next write through, nor a subagent's.
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("write b")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [
                ("tool_call", "edit", "pending"),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "in_progress"), ("update", "edit", "completed"),
                ("agent_message_chunk", "One."),
            ])
            assert os.path.exists(os.path.join(cwd, "b.txt")), "the allowed write did not run"
            await conn.set_session_mode(session_id=sid, mode_id="plan")
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("write c")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [
                ("tool_call", "edit", "pending"), ("update", "edit", "failed"),
                ("agent_message_chunk", "Two."),
            ])
            refused = editor.texts()
            assert len(refused) == 1 and "plan mode" in refused[0], refused
            assert not os.path.exists(os.path.join(cwd, "c.txt")), "plan mode let a remembered write through"
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("delegate")])
            expect(r.stop_reason, "end_turn")
            asked = [p for k, _, p in editor.events if k == "permission"]
            expect(asked, [])
            assert not os.path.exists(os.path.join(cwd, "note.txt")), "plan mode let a subagent's write through"
            print("ok", scenario)
            return
        if scenario in ("terminal", "terminal_rejected"):
            # Issue 53.8: shell runs in the editor's terminal, outside
            # cairn's sandbox, so every call is asked (no "always"), even
            # with an allow rule for shell (the test passes --allow shell).
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("run it")])
            expect(r.stop_reason, "end_turn")
            said = editor.summary()
            asked = [e for e in said if e[0] == "permission"]
            expect(asked, [("permission", "execute", ("allow_once", "reject_once"))])
            ran = [e for e in said if e[0] == "terminal"]
            if scenario == "terminal":
                expect(ran, [("terminal", ("bash", ("-c", "echo from-the-editor > t.txt; read go; echo done-in-terminal"), os.path.realpath(cwd)))])
                assert os.path.exists(os.path.join(cwd, "t.txt")), "the command did not run in the editor's terminal"
                assert [e for e in said if e[0] == "terminal_release"], said
                # The tool call showed the terminal while the command ran
                # (the editor streams it live), and its completion left it
                # shown (no content replacing it).
                shown = [e for e in said if e[0] == "terminal_shown"]
                expect(shown, [("terminal_shown", ("term-0", True))])
                done = [p for k, _, p in editor.events
                        if k == "update" and p.session_update == "tool_call_update" and p.status == "completed"]
                assert len(done) == 1 and done[0].content is None, done
                expect(editor.terminals["term-0"][1], "done-in-terminal\n")
            else:
                expect(ran, [])
                assert not os.path.exists(os.path.join(cwd, "t.txt")), "a rejected command ran"
            print("ok", scenario)
            return
        if scenario == "terminal_not_chosen":
            # The editor offers its terminal but the person did not choose
            # it: shell runs in cairn's sandbox, where the allow rule for
            # shell applies (nothing asked, nothing sent to the editor).
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("run it")])
            expect(r.stop_reason, "end_turn")
            said = editor.summary()
            expect([e for e in said if e[0] in ("permission", "terminal", "terminal_release")], [])
            with open(os.path.join(cwd, "t.txt")) as f:
                expect(f.read(), "from-the-sandbox\n")
            print("ok", scenario)
            return
        if scenario == "session_info":
            # Issue 53.8: session/list, the session's title and the
            # context's fill, as Zed shows them.
            init_caps = editor_init[0].agent_capabilities
            assert init_caps.session_capabilities and init_caps.session_capabilities.list is not None, init_caps
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("\n  Fix the parser bug\nin lexer.rs")])
            expect(r.stop_reason, "end_turn")
            titles = [u.title for k, s, u in editor.events if k == "update" and u.session_update == "session_info_update"]
            expect(titles, ["Fix the parser bug"])
            usage = [(u.used, u.size) for k, s, u in editor.events if k == "update" and u.session_update == "usage_update"]
            assert len(usage) == 1 and usage[0][1] == 100000 and usage[0][0] > 0, usage
            r = await conn.prompt(session_id=sid, prompt=[text_block("and the tests")])
            titles = [u.title for k, s, u in editor.events if k == "update" and u.session_update == "session_info_update"]
            expect(titles, ["Fix the parser bug"])  # told once, not again
            other = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            listed = await conn.list_sessions(cwd=cwd)
            by_id = {s.session_id: s for s in listed.sessions}
            assert sid in by_id and other in by_id, listed
            expect(by_id[sid].title, "Fix the parser bug")
            expect(by_id[sid].cwd, os.path.realpath(cwd))
            assert by_id[sid].updated_at and by_id[sid].updated_at.endswith("Z"), by_id[sid]
            assert by_id[other].title is None, by_id[other]
            elsewhere = await conn.list_sessions(cwd=os.path.dirname(cwd))
            expect(elsewhere.sessions, [])
            print("ok", scenario)
            return
        if scenario == "commands":
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            for text in ("hi", "again"):
                r = await conn.prompt(session_id=sid, prompt=[text_block(text)])
                expect(r.stop_reason, "end_turn")
            assert {"resume", "compact", "usage"} <= editor.commands, editor.commands
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("/usage")])
            expect(r.stop_reason, "end_turn")
            (said,) = editor.summary()
            assert said[0] == "agent_message_chunk" and "over 2 provider attempts" in said[1], said
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("/compact")])
            expect(r.stop_reason, "end_turn")
            (said,) = editor.summary()
            assert said[0] == "agent_message_chunk" and said[1].startswith("compacted the conversation"), said
            print("ok", scenario)
            return
        if scenario == "model":
            new = await conn.new_session(cwd=cwd, mcp_servers=[])
            sid = new.session_id
            (picker,) = new.config_options
            expect((picker.id, picker.category, picker.current_value), ("model", "model", "scripted"))
            names = {o.value: o.name for o in picker.options}
            expect(names.get("alt"), "alt: alt-model")
            r = await conn.prompt(session_id=sid, prompt=[text_block("one")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [("agent_message_chunk", "From the default.")])
            answer = await conn.set_config_option(config_id="model", session_id=sid, value="alt")
            expect(answer.config_options[0].current_value, "alt")
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("two")])
            expect(editor.summary(), [("agent_message_chunk", "From alt.")])
            from acp import RequestError
            try:
                await conn.set_config_option(config_id="model", session_id=sid, value="nope")
            except RequestError as e:
                assert "alt" in str(e.data) + str(e), e
            else:
                raise AssertionError("an unknown model was accepted")
            print("ok", scenario)
            return
        if scenario == "mcp":
            # The editor's own MCP server (a real one from PyPI) for this
            # session: its tool is offered, asks through the editor, runs.
            from acp.schema import McpServerStdio
            server = McpServerStdio(name="time", command=rest[0], args=["--local-timezone", "UTC"], env=[])
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[server])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("what time is it in UTC?")])
            expect(r.stop_reason, "end_turn")
            asked = [p for k, _, p in editor.events if k == "permission"]
            assert len(asked) == 1, f"the MCP tool (Write: its annotations are not trusted) asks once: {asked}"
            done = editor.texts()
            assert any("UTC" in t for t in done), f"the time server answered: {done}"
            print("ok", scenario)
            return
        if scenario == "stream":
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            r = await conn.prompt(session_id=sid, prompt=[text_block("run it")])
            expect(r.stop_reason, "end_turn")
            updates = [u for k, _, u in editor.events if k == "update" and u.session_update == "tool_call_update"]
            running = ["".join(c.content.text for c in (u.content or [])) for u in updates if u.status == "in_progress"]
            assert any("streamed line" in t for t in running), f"no output while the command ran: {running}"
            last = updates[-1]
            expect(last.status, "completed")
            print("ok", scenario)
            return
        if scenario == "concurrent":
            first = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=first, prompt=[text_block("one")]))
            await asyncio.wait_for(editor.asked.wait(), 60)
            # The first session's turn is running (waiting for its answer):
            # another session is created, prompted and finished meanwhile.
            try:
                second = (await asyncio.wait_for(conn.new_session(cwd=cwd, mcp_servers=[]), 60)).session_id
                r = await asyncio.wait_for(conn.prompt(session_id=second, prompt=[text_block("two")]), 60)
            except asyncio.TimeoutError:
                raise AssertionError("a second session waited for the first session's turn")
            expect(r.stop_reason, "end_turn")
            assert not running.done(), "the first turn ended before its question was answered"
            editor.release.set()
            r = await asyncio.wait_for(running, 60)
            expect(r.stop_reason, "end_turn")
            print("ok", scenario)
            return
        if scenario == "load":
            sid = rest[0]
            await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
            expect(editor.summary(), [
                ("user_message_chunk", "first"),
                ("tool_call", "edit", "pending"),
                ("update", "edit", "failed"),
            ])
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("/resume")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [("agent_message_chunk", "Resumed.")])
            assert "resume" in editor.commands, editor.commands
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("again")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [("agent_message_chunk", "Second.")])
            print("loaded and continued")
            return
        new = await conn.new_session(cwd=cwd, mcp_servers=[])
        sid = new.session_id
        if scenario == "cancel":
            r = await conn.prompt(session_id=sid, prompt=[text_block("first")])
            expect(r.stop_reason, "cancelled")
            expect(editor.summary(), [
                ("tool_call", "edit", "pending"),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "failed"),
            ])
            assert not os.path.exists(os.path.join(cwd, "b.txt"))
            print("SESSION", sid)
            return
        if scenario == "fail":
            from acp import RequestError
            try:
                await conn.prompt(session_id=sid, prompt=[text_block("go")])
            except RequestError as e:
                assert "/resume" in str(e.data) + str(e), e
            else:
                raise AssertionError("a prompt whose provider failed did not fail")
            expect(editor.summary(), [
                ("tool_call", "read", "pending"), ("update", "read", "in_progress"), ("update", "read", "completed"),
            ])
            print("SESSION", sid)
            return
        if scenario == "cancel_running":
            r = await conn.prompt(session_id=sid, prompt=[text_block("run it")])
            expect(r.stop_reason, "cancelled")
            expect(editor.summary(), [
                ("tool_call", "execute", "pending"),
                ("permission", "execute", ("allow_once", "allow_always", "reject_once")),
                ("update", "execute", "in_progress"),
                ("update", "execute", "failed"),
            ])
            texts = editor.texts()
            assert "cancel" in texts[0] and "timed out" not in texts[0], texts
            # The session goes on: a new prompt is a new turn.
            editor.events.clear()
            r = await conn.prompt(session_id=sid, prompt=[text_block("next")])
            expect(r.stop_reason, "end_turn")
            expect(editor.summary(), [("agent_message_chunk", "After.")])
            print("ok", scenario)
            return
        r = await conn.prompt(session_id=sid, prompt=[text_block("hi")])
        expect(r.stop_reason, "end_turn")
        got = editor.summary()
        if scenario == "prompt_allow":
            expect(got, [
                ("agent_message_chunk", "Let me look."),
                ("tool_call", "read", "pending"), ("update", "read", "in_progress"), ("update", "read", "completed"),
                ("tool_call", "edit", "pending"),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "in_progress"), ("update", "edit", "completed"),
                ("agent_message_chunk", "Done."),
            ])
            assert "hello" in editor.texts()[0], editor.texts()
            # The permission question shows the write as a diff view.
            (tool_call, _), = [p for k, _, p in editor.events if k == "permission"]
            diffs = [c for c in tool_call.content if c.type == "diff"]
            assert len(diffs) == 1, tool_call.content
            expect((diffs[0].path, diffs[0].old_text, diffs[0].new_text), (os.path.join(cwd, "b.txt"), None, "new\n"))
            with open(os.path.join(cwd, "b.txt")) as f:
                expect(f.read(), "new\n")
        elif scenario == "subagent":
            # The parent spawns a child (spawn_agent); the child's write is
            # asked of this editor, in the parent's session, and runs once
            # allowed; the parent then answers with the child's result.
            kinds = [e[0] for e in got]
            assert ("permission", "edit", ("allow_once", "allow_always", "reject_once")) in got, got
            assert kinds[-1] == "agent_message_chunk" and "parent done" in got[-1][1], got
            with open(os.path.join(cwd, "note.txt")) as f:
                expect(f.read(), "from the child\n")
        elif scenario == "prompt_reject":
            expect(got, [
                ("agent_message_chunk", "Let me look."),
                ("tool_call", "read", "pending"), ("update", "read", "in_progress"), ("update", "read", "completed"),
                ("tool_call", "edit", "pending"),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "failed"),
                ("agent_message_chunk", "Done."),
            ])
            assert "rejected" in editor.texts()[1], editor.texts()
            assert not os.path.exists(os.path.join(cwd, "b.txt")), "a rejected write happened"
        elif scenario == "forged":
            expect(got, [
                ("tool_call", "other", "pending"),
                ("permission", "other", ("allow_once", "reject_once")),
                ("update", "other", "failed"),
                ("agent_message_chunk", "Kept."),
            ])
            assert "not offered" in editor.texts()[0], editor.texts()
            assert not os.path.exists(os.path.join(cwd, "nuked")), "a forged answer ran a destructive call"
        elif scenario == "destructive":
            expect(got, [
                ("tool_call", "other", "pending"),
                ("permission", "other", ("allow_once", "reject_once")),
                ("update", "other", "failed"),
                ("agent_message_chunk", "Kept."),
            ])
            assert not os.path.exists(os.path.join(cwd, "nuked")), "a rejected destructive call ran"
        elif scenario == "always":
            # Two writes: the second is not asked again.
            expect(got, [
                ("tool_call", "edit", "pending"),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "in_progress"), ("update", "edit", "completed"),
                ("tool_call", "edit", "pending"),
                ("update", "edit", "in_progress"), ("update", "edit", "completed"),
                ("agent_message_chunk", "Both."),
            ])
            for name in ("b.txt", "c.txt"):
                assert os.path.exists(os.path.join(cwd, name)), name
        elif scenario == "authority_fs":
            # The session works in cairn's own home: writing its
            # configuration through the editor is refused before the editor
            # is asked to write, and reading it is refused too.
            writes = [e for e in got if e[0] == "fs_write"]
            expect(writes, [])
            finished = [e for e in got if e[0] == "update" and e[2] in ("completed", "failed")]
            expect(finished, [("update", "edit", "failed"), ("update", "read", "failed")])
            texts = editor.texts()
            assert all("cairn's own configuration" in t for t in texts), texts
        elif scenario == "client_fs":
            a = os.path.join(cwd, "a.txt")
            b = os.path.join(cwd, "b.txt")
            buffer = "unsaved buffer line\nsecond\n"
            expect(got, [
                ("tool_call", "read", "pending"), ("update", "read", "in_progress"),
                ("fs_read", a),
                ("update", "read", "completed"),
                # Outside the root: refused before the editor is asked.
                ("tool_call", "read", "pending"), ("update", "read", "in_progress"), ("update", "read", "failed"),
                # The write's preview and diff are made from the editor's text.
                ("tool_call", "edit", "pending"),
                ("fs_read", b), ("fs_read", b),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "in_progress"),
                ("fs_write", (b, "via the editor\n")),
                ("update", "edit", "completed"),
                # The edit applies to the editor's buffer (the disk's a.txt
                # does not hold the old text) and is written back to it.
                ("tool_call", "edit", "pending"),
                ("fs_read", a), ("fs_read", a),
                ("permission", "edit", ("allow_once", "allow_always", "reject_once")),
                ("update", "edit", "in_progress"),
                ("fs_read", a),
                ("fs_write", (a, "edited in the buffer\nsecond\n")),
                ("update", "edit", "completed"),
                ("agent_message_chunk", "Edited."),
            ])
            asked = [p for k, _, p in editor.events if k == "permission"]
            diffs = [[c for c in tc.content if c.type == "diff"][0] for tc, _ in asked]
            expect([(d.path, d.old_text, d.new_text) for d in diffs], [
                (b, buffer, "via the editor\n"),
                (a, buffer, "edited in the buffer\nsecond\n"),
            ])
            texts = editor.texts()
            assert "unsaved buffer line" in texts[0] and "hello from the root" not in texts[0], texts
            assert "outside" in texts[1] or ".." in texts[1], texts
            assert not os.path.exists(b), "the editor holds the write; cairn must not write the disk itself"
        print("ok", scenario)


asyncio.run(main())
