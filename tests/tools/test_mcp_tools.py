"""scope.tools.mcp: the tools of an MCP client session as scope tools, against real MCP
servers over stdio (tests/mcp_server.py, written with the ``mcp`` package, and the
published ``mcp-server-time``), directly and through ``Conversation`` turns; asyncio and
trio (the ``mcp`` client is anyio-based)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp
import mcp.types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from scope.chat import (
    FinishReason,
    Output,
    PartKind,
    Request,
    Response,
    ToolCall,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    text_part,
    tool_call_part,
)
from scope.conversation import Conversation
from scope.errors import InvalidToolDefinitionError
from scope.history.inmemory import InMemoryStore
from scope.jsonvalue import RawJSON
from scope.media import Media
from scope.testing import FunctionModel, ScriptedModel
from scope.tools import Tool, tool
from scope.tools.mcp import load_tools, mcp_tool, result_output
from tests.mcp_server import PDF, PNG, WAV

pytestmark = pytest.mark.anyio

SERVER = StdioServerParameters(
    command=sys.executable, args=[str(Path(__file__).resolve().parent.parent / "mcp_server.py")]
)
TIME_SERVER = StdioServerParameters(
    command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]
)


@asynccontextmanager
async def session_of(server: StdioServerParameters, **options: Any) -> AsyncIterator[ClientSession]:
    """An initialized session with ``server`` run as a subprocess (its log discarded)."""
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 (/dev/null never blocks)
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write, **options) as session,
        ):
            await session.initialize()
            yield session


async def tools_of(session: ClientSession, prefix: str = "") -> dict[str, Tool[..., Any]]:
    return {item.name: item for item in await load_tools(session, prefix=prefix)}


def text(value: str) -> ToolOutput:
    return ToolOutput.of_text(value)


def media(mime: str, data: bytes) -> Any:
    return media_part(Media.from_bytes(mime, data))


# ------------------------------------------------------------------ definitions


async def test_definitions_are_the_servers_in_its_order() -> None:
    async with session_of(SERVER) as session:
        listed = (await session.list_tools()).tools
        tools = await load_tools(session)
    assert [t.name for t in tools] == [t.name for t in listed]
    assert [t.name for t in tools] == [
        "forecast",
        "stats",
        "snapshot",
        "chime",
        "documents",
        "refuse",
        "refuse_with_details",
        "garbled",
        "wait",
    ]
    for made, original in zip(tools, listed, strict=True):
        assert isinstance(made, Tool)
        assert made.definition.input_schema == RawJSON.from_value(original.input_schema)
        assert made.definition.description == original.description
        assert made.context_parameter is None
    assert tools[0].definition.input_schema.value() == {
        "type": "object",
        "title": "forecastArguments",
        "properties": {
            "city": {"title": "City", "type": "string"},
            "unit": {"default": "C", "enum": ["C", "F"], "title": "Unit", "type": "string"},
        },
        "required": ["city"],
    }


async def test_a_prefix_and_a_new_name_change_what_the_model_calls_not_what_the_server_runs() -> (
    None
):
    async with session_of(SERVER) as session:
        prefixed = await tools_of(session, prefix="sky_")
        (listed,) = [t for t in (await session.list_tools()).tools if t.name == "forecast"]
        renamed = mcp_tool(session, listed, name="weather")
        assert "sky_forecast" in prefixed and "forecast" not in prefixed
        result = await prefixed["sky_forecast"].run(
            ToolCall("c1", "sky_forecast", '{"city": "Lisbon"}')
        )
        assert result.output.text() == "Lisbon: 21 °C, sunny"
        result = await renamed.run(ToolCall("c2", "weather", '{"city": "Porto", "unit": "F"}'))
        assert result == ToolResult(
            "c2",
            "weather",
            ToolOutput((text_part("Porto: 21 °F, sunny"),), {"result": "Porto: 21 °F, sunny"}),
        )


async def test_the_arguments_of_load_tools_and_mcp_tool_are_checked() -> None:
    async with session_of(SERVER) as session:
        (listed, *_) = (await session.list_tools()).tools
        with pytest.raises(TypeError) as wrong:
            await load_tools(object())  # type: ignore[arg-type]
        assert str(wrong.value) == "session must be an mcp.ClientSession, got object"
        with pytest.raises(TypeError) as wrong:
            await load_tools(session, prefix=1)  # type: ignore[arg-type]
        assert str(wrong.value) == "prefix must be a str, got int"
        with pytest.raises(TypeError) as wrong:
            mcp_tool("session", listed)  # type: ignore[arg-type]
        assert str(wrong.value) == "session must be an mcp.ClientSession, got str"
        with pytest.raises(TypeError) as wrong:
            mcp_tool(session, {"name": "forecast"})  # type: ignore[arg-type]
        assert str(wrong.value) == "tool must be an mcp.types.Tool, got dict"
        with pytest.raises(TypeError) as wrong:
            mcp_tool(session, listed, name=b"x")  # type: ignore[arg-type]
        assert str(wrong.value) == "name must be a str or None, got bytes"
        # MCP allows names scope's tool names do not ('.', '/', over 64 characters).
        dotted = mcp.types.Tool(name="files.read", input_schema={"type": "object"})
        with pytest.raises(InvalidToolDefinitionError) as invalid:
            mcp_tool(session, dotted)
        assert str(invalid.value) == (
            "tool name must be 1-64 ASCII letters, digits, '_' or '-', got 'files.read'"
        )
        assert mcp_tool(session, dotted, name="files_read").name == "files_read"
        with pytest.raises(InvalidToolDefinitionError) as invalid:
            await load_tools(session, prefix="sky.")
        assert str(invalid.value) == (
            "tool name must be 1-64 ASCII letters, digits, '_' or '-', got 'sky.forecast'"
        )
        not_an_object = mcp.types.Tool(name="scalar", input_schema={"type": "string"})
        with pytest.raises(InvalidToolDefinitionError) as invalid:
            mcp_tool(session, not_an_object)
        assert str(invalid.value) == 'tool \'scalar\' input_schema must have "type": "object"'


# ------------------------------------------------------------------ results


async def test_each_kind_of_content_becomes_tool_output() -> None:
    async with session_of(SERVER) as session:
        tools = await tools_of(session)
        forecast = await tools["forecast"].run(ToolCall("c1", "forecast", '{"city": "Lisbon"}'))
        stats = await tools["stats"].run(ToolCall("c2", "stats", '{"numbers": [1, 2, 3.5]}'))
        snapshot = await tools["snapshot"].run(ToolCall("c3", "snapshot"))  # "" is {}
        chime = await tools["chime"].run(ToolCall("c4", "chime", "{}"))
        documents = await tools["documents"].run(ToolCall("c5", "documents", " "))
    # Text content -> text; structuredContent -> the JSON details (beside the text the
    # server also sends for older clients).
    assert forecast == ToolResult(
        "c1",
        "forecast",
        ToolOutput((text_part("Lisbon: 21 °C, sunny"),), {"result": "Lisbon: 21 °C, sunny"}),
    )
    assert stats.output.details == RawJSON.from_value({"count": 3.0, "sum": 6.5, "mean": 6.5 / 3})
    assert not stats.is_error
    # Image and audio content -> media parts (decoded bytes, the MIME type).
    assert snapshot == ToolResult("c3", "snapshot", ToolOutput((media("image/png", PNG),)))
    assert chime == ToolResult("c4", "chime", ToolOutput((media("audio/wav", WAV),)))
    # Embedded resources -> text or media parts; a resource link -> its JSON as text.
    assert documents.output.content[:4] == (
        text_part("Three documents:"),
        text_part("Buy milk."),
        media("application/pdf", PDF),
        media("application/octet-stream", b"\x00\x01"),
    )
    link = documents.output.content[4]
    assert link.kind is PartKind.TEXT
    assert RawJSON.parse(link.text).value() == {
        "type": "resource_link",
        "uri": "file:///report.md",
        "name": "report",
        "mimeType": "text/markdown",
    }
    assert documents.output.details is None and not documents.is_error


async def test_an_mcp_error_result_is_an_error_tool_result() -> None:
    async with session_of(SERVER) as session:
        tools = await tools_of(session)
        refused = await tools["refuse"].run(ToolCall("c1", "refuse", '{"reason": "closed"}'))
        detailed = await tools["refuse_with_details"].run(ToolCall("c2", "refuse_with_details"))
        # The server validates the arguments against its own schema: its error result.
        invalid = await tools["forecast"].run(ToolCall("c3", "forecast", '{"unit": "K"}'))
    assert refused == ToolResult(
        "c1", "refuse", text("Error executing tool refuse: refused: closed"), is_error=True
    )
    assert detailed == ToolResult(
        "c2",
        "refuse_with_details",
        ToolOutput((text_part("quota exceeded"),), {"retry_after": 30}),
        is_error=True,
    )
    assert invalid.is_error
    assert (invalid.output.text() or "").startswith("Error executing tool forecast: ")


async def test_calling_the_tool_directly_returns_the_output_or_raises_the_error() -> None:
    async with session_of(SERVER) as session:
        tools = await tools_of(session)
        output = await tools["forecast"]({"city": "Braga"})
        with pytest.raises(Exception) as failed:
            await tools["refuse"]({"reason": "shut"})
    assert output.text() == "Braga: 21 °C, sunny"
    assert str(failed.value) == "Error executing tool refuse: refused: shut"


async def test_arguments_that_are_not_a_json_object_are_scopes_error_results() -> None:
    # scope's words, not the server's ("Error executing tool ..."): it was not called.
    async with session_of(SERVER) as session:
        tools = await tools_of(session)
        forecast = tools["forecast"]
        not_json = await forecast.run(ToolCall("c1", "forecast", '{"city": '))
        an_array = await forecast.run(ToolCall("c2", "forecast", '["Lisbon"]'))
        a_string = await forecast.run(ToolCall("c3", "forecast", '"Lisbon"'))
    assert not_json == ToolResult(
        "c1",
        "forecast",
        text(
            "the arguments of forecast are not valid JSON (unexpected end of data: line 1 "
            "column 10 (char 9)); send one JSON object matching the tool's schema. Call "
            "forecast again with corrected arguments."
        ),
        is_error=True,
    )
    assert an_array == ToolResult(
        "c2",
        "forecast",
        text(
            "the arguments of forecast must be a JSON object, got an array. Call forecast "
            "again with corrected arguments."
        ),
        is_error=True,
    )
    assert a_string.is_error
    assert a_string.output.text() == (
        "the arguments of forecast must be a JSON object, got the string 'Lisbon'. Call "
        "forecast again with corrected arguments."
    )
    with pytest.raises(ValueError) as other:
        await forecast.run(ToolCall("c4", "stats", "{}"))
    assert str(other.value) == "tool 'forecast' cannot answer a call to 'stats'"


async def test_failures_of_the_call_itself_are_error_results() -> None:
    async with session_of(SERVER) as session:
        tools = await tools_of(session)
        # Content that cannot be decoded.
        garbled = await tools["garbled"].run(ToolCall("c1", "garbled"))
        # A tool the server does not have (it answers with an error).
        ghost = mcp_tool(session, mcp.types.Tool(name="ghost", input_schema={"type": "object"}))
        unknown = await ghost.run(ToolCall("c2", "ghost", "{}"))
    assert garbled == ToolResult(
        "c1",
        "garbled",
        text(
            "garbled failed: ValueError: the image content is not valid base64 (Only base64 "
            "data is allowed)"
        ),
        is_error=True,
    )
    assert unknown.is_error
    assert "ghost" in (unknown.output.text() or "")
    # The session is closed: the call fails, as an error result.
    closed = await tools["forecast"].run(ToolCall("c3", "forecast", '{"city": "Lisbon"}'))
    assert closed.is_error
    assert (closed.output.text() or "").startswith("forecast failed: ")


async def test_cancellation_propagates_and_the_session_stays_usable() -> None:
    started = anyio.Event()

    async def on_log(params: mcp.types.LoggingMessageNotificationParams) -> None:
        if params.data == "waiting":
            started.set()

    answered: list[ToolResult] = []
    async with session_of(SERVER, logging_callback=on_log) as session:
        tools = await tools_of(session)

        async def call() -> None:
            answered.append(await tools["wait"].run(ToolCall("c1", "wait")))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await started.wait()  # the server is running the tool
            group.cancel_scope.cancel()
        assert answered == []  # cancelled, not turned into a result
        after = await tools["forecast"].run(ToolCall("c2", "forecast", '{"city": "Faro"}'))
    assert after.output.text() == "Faro: 21 °C, sunny"


# ------------------------------------------------------------------ through Conversation


def calls(*parts: tuple[str, str, str]) -> Response:
    message = assistant_message(*(tool_call_part(i, n, a) for i, n, a in parts))
    return Response(Output(message, FinishReason.TOOL_CALLS))


def answer(value: str) -> Response:
    return Response(Output(assistant_message(value), FinishReason.STOP))


@tool
def local_note(topic: str) -> str:
    """A note from the service itself.

    :param topic: what about
    """
    return f"note on {topic}"


async def test_a_turn_calls_mcp_tools_beside_local_ones() -> None:
    model = ScriptedModel(
        calls(
            ("c1", "forecast", '{"city": "Lisbon"}'),
            ("c2", "snapshot", ""),
            ("c3", "refuse", '{"reason": "busy"}'),
            ("c4", "local_note", '{"topic": "sky"}'),
        ),
        answer("Sunny in Lisbon."),
    )
    store = InMemoryStore()
    async with session_of(SERVER) as session:
        tools = await load_tools(session)
        conversation = Conversation(model, store, "c-mcp", tools=[*tools, local_note])
        result = await conversation.ask("Weather?")
    assert result.output == "Sunny in Lisbon."
    sent = model.requests[0]
    assert [d.name for d in sent.tools] == [*(t.name for t in tools), "local_note"]
    assert sent.tools[0] == tools[0].definition
    results = model.requests[1].messages[-1].tool_results
    assert [(r.id, r.is_error) for r in results] == [
        ("c1", False),
        ("c2", False),
        ("c3", True),
        ("c4", False),
    ]
    assert results[0].output.text() == "Lisbon: 21 °C, sunny"
    assert results[1].output.content == (media("image/png", PNG),)
    assert results[2].output.text() == "Error executing tool refuse: refused: busy"
    assert results[3].output.text() == "note on sky"
    # The turn is stored with the results, media included.
    stored = await store.read("c-mcp")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[2].tool_results == results


async def test_a_function_model_reads_the_servers_schema_and_its_answer() -> None:
    seen: list[Request] = []

    def respond(request: Request) -> Response | str:
        seen.append(request)
        last = request.messages[-1]
        if not last.tool_results:
            (definition,) = [d for d in request.tools if d.name == "stats"]
            assert definition.input_schema.value()["required"] == ["numbers"]
            return calls(("s1", "stats", '{"numbers": [2, 4]}'))
        details = last.tool_results[0].output.details
        assert details is not None
        return f"The mean is {details.value()['mean']}."

    async with session_of(SERVER) as session:
        conversation = Conversation(
            FunctionModel(respond), InMemoryStore(), "c-fn", tools=await load_tools(session)
        )
        result = await conversation.ask("Mean of 2 and 4?")
    assert result.output == "The mean is 3.0."
    assert len(seen) == 2


# ------------------------------------------------------------------ a published server


async def test_the_published_time_server_through_a_turn() -> None:
    model = ScriptedModel(
        calls(
            (
                "t1",
                "time_convert_time",
                '{"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}',
            ),
            ("t2", "time_get_current_time", '{"timezone": "Mars/Olympus"}'),
        ),
        answer("21:00 in Tokyo."),
    )
    async with session_of(TIME_SERVER) as session:
        tools = await load_tools(session, prefix="time_")
        assert {t.name for t in tools} >= {"time_convert_time", "time_get_current_time"}
        conversation = Conversation(model, InMemoryStore(), "c-time", tools=tools)
        result = await conversation.ask("Noon UTC in Tokyo?")
    assert result.output == "21:00 in Tokyo."
    converted, invalid = model.requests[1].messages[-1].tool_results
    assert not converted.is_error
    assert converted.output.details is not None
    target = converted.output.details.value()["target"]
    assert target["timezone"] == "Asia/Tokyo"
    assert target["datetime"].endswith("T21:00:00+09:00")  # Tokyo keeps no daylight saving
    assert invalid.is_error
    assert "Mars/Olympus" in (invalid.output.text() or "")


# ------------------------------------------------------------------ result_output


def test_result_output_maps_a_result_and_checks_its_argument() -> None:
    result = mcp.types.CallToolResult(
        content=[
            mcp.types.TextContent(text="a"),
            mcp.types.ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png"),
        ],
        structured_content=[1, 2],
    )
    assert result_output(result) == ToolOutput((text_part("a"), media("image/png", PNG)), [1, 2])
    assert result_output(mcp.types.CallToolResult(content=[])) == ToolOutput()
    with pytest.raises(TypeError) as wrong:
        result_output({"content": []})  # type: ignore[arg-type]
    assert str(wrong.value) == "result must be an mcp.types.CallToolResult, got dict"
    empty = mcp.types.CallToolResult(
        content=[mcp.types.AudioContent(data="", mime_type="audio/wav")]
    )
    with pytest.raises(ValueError, match="a bytes source needs non-empty data"):
        result_output(empty)
    bad_base64 = mcp.types.CallToolResult(
        content=[mcp.types.ImageContent(data="@@@", mime_type="image/png")]
    )
    with pytest.raises(ValueError, match=r"^the image content is not valid base64 \("):
        result_output(bad_base64)


# ------------------------------------------------------------------ the extra


def test_without_the_extra_the_import_names_it_and_nothing_else_imports_mcp() -> None:
    code = "import sys; sys.modules['mcp'] = None; import scope.tools.mcp"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: scope.tools.mcp needs mcp: install the extra, pip install 'scope-chat[mcp]'"
    )
    code = (
        "import sys, scope.tools, scope.conversation, scope.testing\n"
        "assert not {'mcp', 'mcp_types'} & set(sys.modules), 'mcp was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
