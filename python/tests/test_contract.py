"""The package's contract: tools from type hints, run, approvals by risk
tier, a Python exception as a failed call, streaming order, asyncio."""

import asyncio
from typing import Literal, Optional

import pytest

import cairn
from conftest import answer, call


def test_a_tools_schema_comes_from_its_type_hints_and_docstring():
    @cairn.tool(risk="read_only", replay="idempotent")
    def forecast(city: str, days: int = 1, unit: Literal["c", "f"] = "c", note: Optional[str] = None) -> str:
        """The weather forecast for a city.

        Args:
            city: Where.
            days: How many days ahead.
        """
        return ""

    assert forecast.name == "forecast"
    assert forecast.description == "The weather forecast for a city."
    assert forecast.risk == "read_only" and forecast.replay == "idempotent"
    assert forecast.schema == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "Where."},
            "days": {"type": "integer", "description": "How many days ahead.", "default": 1},
            "unit": {"enum": ["c", "f"], "default": "c"},
            "note": {"type": "string", "default": None},
        },
        "required": ["city"],
    }


def test_a_bad_risk_or_replay_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="read_only"):
        cairn.tool(risk="safe")(lambda: "")
    with pytest.raises(ValueError, match="idempotent"):
        cairn.tool(replay="sometimes")(lambda: "")


def test_run_calls_a_tool_and_returns_the_answer(home, work, script):
    seen = []

    @cairn.tool(risk="read_only")
    def weather(city: str) -> str:
        """Today's weather."""
        seen.append(city)
        return f"sunny in {city}"

    path = script(call("weather", {"city": "Oslo"}), answer("It is sunny in Oslo."))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[weather])
    result = agent.run("Weather in Oslo?")
    assert result.answer == "It is sunny in Oslo."
    assert result.stop == "answered"
    assert seen == ["Oslo"]
    assert len(result.tool_calls) == 1
    made = result.tool_calls[0]
    assert (made.tool, made.status, made.output, made.arguments) == (
        "weather",
        "completed",
        "sunny in Oslo",
        {"city": "Oslo"},
    )
    assert result.usage.calls == 2
    assert (home / "sessions" / f"{result.session_id}.jsonl").is_file()


def test_the_approver_sees_tool_arguments_and_risk_of_a_write_call(home, work, script):
    asked = []

    @cairn.tool(risk="write")
    def save(text: str) -> str:
        return "saved"

    path = script(call("save", {"text": "hello"}), answer("done"))
    agent = cairn.Agent(
        home=home, cwd=work, provider="scripted", script=path, tools=[save], approve=lambda r: asked.append(r) or True
    )
    result = agent.run("save hello")
    assert [(r.tool, r.arguments, r.risk) for r in asked] == [("save", {"text": "hello"}, "write")]
    assert result.tool_calls[0].status == "completed"


def test_a_denied_call_does_not_run_and_the_model_is_told(home, work, script):
    runs = []

    @cairn.tool(risk="write")
    def send_email(to: str) -> str:
        runs.append(to)
        return "sent"

    path = script(call("send_email", {"to": "boss@example.com"}), answer("I did not send it."))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[send_email], approve=lambda r: False)
    result = agent.run("email the boss")
    assert runs == []
    assert result.tool_calls[0].status == "rejected"
    assert "denied" in result.tool_calls[0].output
    assert result.answer == "I did not send it."


def test_a_destructive_call_reaches_the_approver_even_when_an_allow_rule_names_it(home, work, script):
    asked = []

    @cairn.tool(risk="destructive")
    def drop_table(name: str) -> str:
        return "dropped"

    path = script(call("drop_table", {"name": "users"}), answer("ok"))
    agent = cairn.Agent(
        home=home,
        cwd=work,
        provider="scripted",
        script=path,
        tools=[drop_table],
        allow=["drop_table"],
        approve=lambda r: asked.append(r.risk) or False,
    )
    result = agent.run("drop users")
    assert asked == ["destructive"]
    assert result.tool_calls[0].status == "rejected"


def test_without_an_approver_a_write_call_is_refused(home, work, script):
    runs = []

    @cairn.tool(risk="write")
    def save(text: str) -> str:
        runs.append(text)
        return "saved"

    path = script(call("save", {"text": "x"}), answer("could not"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[save])
    result = agent.run("save x")
    assert runs == []
    assert result.tool_calls[0].status == "rejected"


def test_an_exception_in_a_tool_is_a_failed_call_the_model_sees(home, work, script):
    @cairn.tool(risk="read_only")
    def weather(city: str) -> str:
        raise ValueError(f"no station in {city}")

    path = script(call("weather", {"city": "Atlantis"}), answer("I could not find it."))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[weather])
    result = agent.run("weather in Atlantis")
    failed = result.tool_calls[0]
    assert failed.status == "failed"
    assert "ValueError" in failed.output and "no station in Atlantis" in failed.output
    assert result.answer == "I could not find it."
    assert result.stop == "answered"


def test_stream_yields_typed_events_in_order(home, work, script):
    @cairn.tool(risk="write")
    def save(text: str) -> str:
        return "saved"

    path = script(call("save", {"text": "a"}), answer("all saved"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[save], approve=lambda r: True)
    stream = agent.stream("save a")
    events = list(stream)
    kinds = [type(e).__name__ for e in events]
    # Each tool event once, in the order the turn commits them.
    order = ["ToolRequested", "ApprovalAsked", "ToolStarted", "ToolCompleted", "Final"]
    assert [k for k in kinds if k in order] == order
    assert kinds.count("Usage") == 2
    # The answer's text streams before the final event.
    text = "".join(e.text for e in events if isinstance(e, cairn.TextDelta))
    assert text == "all saved"
    assert kinds.index("TextDelta") > kinds.index("ToolCompleted")
    assert kinds.index("TextDelta") < kinds.index("Final")
    assert events[-1] == cairn.Final(text="all saved")
    assert stream.result is not None and stream.result.answer == "all saved"
    requested = events[kinds.index("ToolRequested")]
    assert (requested.tool, requested.arguments, requested.risk) == ("save", {"text": "a"}, "write")


def test_arun_and_astream(home, work, script):
    @cairn.tool(risk="read_only")
    def echo(text: str) -> str:
        return text

    path = script(call("echo", {"text": "hi"}), answer("hi back"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[echo])

    async def both():
        result = await agent.arun("say hi")
        events = [e async for e in agent.astream("say hi")]
        return result, events

    result, events = asyncio.run(both())
    assert result.answer == "hi back"
    assert [e for e in events if isinstance(e, cairn.ToolCompleted)][0].output == "hi"
    assert isinstance(events[-1], cairn.Final)


def test_an_unknown_provider_is_a_clear_error(home, work):
    with pytest.raises(RuntimeError, match="nosuch"):
        cairn.Agent(home=home, cwd=work, provider="nosuch")


def test_a_staged_destructive_effect_reaches_the_approver_with_its_diff(home, work, script):
    # `shell` runs staged: the command is a Write call, and what it did
    # (emptying a file that existed) is judged Destructive and shown as a
    # diff before anything is applied.
    (work / "old.txt").write_text("precious\n")
    asked = []

    def approve(request):
        asked.append(request)
        return request.risk != "destructive"

    path = script(call("shell", {"command": "cp /dev/null old.txt"}), answer("left it"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, builtin_tools=["shell"], approve=approve)
    result = agent.run("empty old.txt")
    assert [(r.tool, r.risk, r.staged) for r in asked] == [("shell", "write", True), ("shell", "destructive", True)]
    assert "-precious" in asked[1].diff
    assert (work / "old.txt").read_text() == "precious\n"
    assert result.tool_calls[0].status == "rejected"


def test_builtin_tools_are_offered_only_when_asked(home, work, script):
    path = script(call("read_file", {"path": "x"}), answer("no such tool"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path)
    result = agent.run("read x")
    assert result.tool_calls[0].status == "rejected"
    assert "read_file" in result.tool_calls[0].output


def test_an_approver_that_raises_denies_the_call(home, work, script):
    runs = []

    @cairn.tool(risk="write")
    def save(text: str) -> dict:
        runs.append(text)
        return {"saved": text}

    def approve(request):
        raise RuntimeError("approver broke")

    path = script(call("save", {"text": "x"}), answer("not saved"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[save], approve=approve)
    result = agent.run("save x")
    assert runs == []
    assert result.tool_calls[0].status == "rejected"


def test_a_tool_result_that_is_not_text_is_sent_as_json(home, work, script):
    @cairn.tool(risk="read_only")
    def lookup(key: str) -> dict:
        return {"key": key, "value": 42}

    path = script(call("lookup", {"key": "k"}), answer("42"))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[lookup])
    result = agent.run("look up k")
    assert result.tool_calls[0].output == '{"key": "k", "value": 42}'
