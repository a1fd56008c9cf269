"""The tools of an MCP server as scope tools (the ``mcp`` extra: ``pip install
'scope-chat[mcp]'``, the official ``mcp`` package, 2.x):

    from mcp import ClientSession, StdioServerParameters, stdio_client
    from scope.tools.mcp import load_tools

    server = StdioServerParameters(command="mcp-server-time")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await load_tools(session)          # a list of scope.tools.Tool
        conversation = Conversation(model, store, "c-1", tools=[*tools, get_weather])
        ...                                        # the session stays open while they run

The session is yours: open it, initialize it and close it; the tools call it while it is
open (a call on a closed session is an error result, like any failure). Calling such a
tool directly, ``await tools[0]({"city": "Lisbon"})``, calls the server with that
arguments object and returns the ``ToolOutput`` (an ``isError`` result raises an
``Exception`` whose message is the error's text); ``Tool.run(call)`` is what the
conversation uses.

**Definitions.** Each tool's ``ToolDefinition`` is the server's: its name, its
description (empty when it has none) and its ``inputSchema`` as ``input_schema``,
unchanged. A tool's name must be a valid scope tool name (1-64 ASCII letters, digits,
``_`` and ``-``); ``load_tools(session, prefix="time_")`` prefixes every name (two
servers with tools of the same name), and ``mcp_tool(session, tool, name=...)`` renames
one. The server is always called by its own name.

**Calls.** The call's arguments are decoded and must be a JSON object (empty arguments
are ``{}``); the object goes to the server as is, and the server validates it against
its schema. Invalid JSON or another JSON value is an error result naming the problem,
like ``@tool``'s, and the server is not called.

**Results.** The server's content becomes the tool output, in order: text content a text
part, image and audio content a media part (the decoded bytes, with the MIME type), an
embedded resource a text part (text resources) or a media part (blob resources, their
MIME type or ``application/octet-stream``), a resource link a text part holding the link
as JSON (``{"type": "resource_link", "uri": ..., "name": ...}``: the model sees what it
points to, scope does not read it). ``structuredContent`` becomes the output's JSON
``details``. A result with ``isError`` is an error result (``is_error=True``) with that
output.

**Never raises for a bad call.** Besides ``isError`` results, any ``Exception`` the call
raises (an MCP error response such as an unknown tool, structured content that does not
match the tool's output schema, a closed session, content that cannot be decoded) becomes
an error result saying what went wrong, so the model can decide what to do.
Cancellation is never caught: a cancelled turn cancels the MCP request (the client sends
the server a cancellation notice).

Works under asyncio and trio (the ``mcp`` client is anyio-based).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any, Final

try:
    import mcp
    import mcp.types
except ModuleNotFoundError as exc:  # the extra is not installed
    if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types"):
        raise
    raise ImportError(
        "scope.tools.mcp needs mcp: install the extra, pip install 'scope-chat[mcp]'"
    ) from exc

from scope.chat import Part, ToolDefinition, ToolOutput, media_part, text_part
from scope.jsonvalue import RawJSON
from scope.media import Media
from scope.tools import Tool, _schema_tool, _ToolFailed

__all__ = ["load_tools", "mcp_tool", "result_output"]

_OCTET_STREAM: Final = "application/octet-stream"

#: What an MCP tool's ``Tool`` is: the function takes the arguments object.
_MCPTool = Tool[[dict[str, Any]], Awaitable[ToolOutput]]


async def load_tools(session: mcp.ClientSession, *, prefix: str = "") -> list[_MCPTool]:
    """The tools the server of ``session`` (an initialized ``mcp.ClientSession``) lists,
    every page, in its order, as ``Tool`` objects (see the module docstring).

    - ``prefix``: put before every tool's name (``"time_"``); default none.

    Raises ``TypeError`` when ``session`` is not an ``mcp.ClientSession`` or ``prefix``
    not a ``str``; ``InvalidToolDefinitionError`` when a tool's name (prefixed) is not a
    valid tool name or its ``inputSchema`` is not an object schema; what
    ``session.list_tools`` raises (an ``mcp.MCPError``).
    """
    _check_session(session)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    listed: list[mcp.types.Tool] = []
    cursor: str | None = None
    while True:
        params = None if cursor is None else mcp.types.PaginatedRequestParams(cursor=cursor)
        page = await session.list_tools(params=params)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return [mcp_tool(session, item, name=prefix + item.name) for item in listed]


def mcp_tool(
    session: mcp.ClientSession, tool: mcp.types.Tool, *, name: str | None = None
) -> _MCPTool:
    """One tool of ``session``'s server (``tool``, as ``session.list_tools()`` gave it) as
    a ``Tool`` (see the module docstring).

    - ``name``: the name the model calls it by; default the server's name. The server is
      called by its own name either way.

    Raises ``TypeError`` when ``session`` is not an ``mcp.ClientSession``, ``tool`` not
    an ``mcp.types.Tool`` or ``name`` neither a ``str`` nor None;
    ``InvalidToolDefinitionError`` when the name is not a valid tool name or the
    ``inputSchema`` is not an object schema.
    """
    _check_session(session)
    if not isinstance(tool, mcp.types.Tool):
        raise TypeError(f"tool must be an mcp.types.Tool, got {type(tool).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")
    definition = ToolDefinition(
        tool.name if name is None else name,
        RawJSON.from_value(tool.input_schema),
        tool.description or "",
    )
    return _schema_tool(_caller(session, tool.name), definition)


def result_output(result: mcp.types.CallToolResult) -> ToolOutput:
    """The ``ToolOutput`` of an MCP tool result, ``isError`` aside (see the module
    docstring).

    Raises ``TypeError`` when ``result`` is not an ``mcp.types.CallToolResult``;
    ``ValueError`` when its content cannot be decoded (invalid base64, empty media, an
    invalid MIME type, structured content that is not JSON).
    """
    if not isinstance(result, mcp.types.CallToolResult):
        raise TypeError(f"result must be an mcp.types.CallToolResult, got {type(result).__name__}")
    parts = tuple(_part(block) for block in result.content)
    details = None
    if result.structured_content is not None:
        details = RawJSON.from_value(result.structured_content)
    return ToolOutput(parts, details)


def _caller(
    session: mcp.ClientSession, server_name: str
) -> Callable[[dict[str, Any]], Awaitable[ToolOutput]]:
    async def call(arguments: dict[str, Any]) -> ToolOutput:
        result = await session.call_tool(server_name, arguments)
        output = result_output(result)
        if result.is_error:
            raise _ToolFailed(output)
        return output

    call.__name__ = call.__qualname__ = server_name
    return call


def _part(block: mcp.types.ContentBlock) -> Part:
    if isinstance(block, mcp.types.TextContent):
        return text_part(block.text)
    if isinstance(block, mcp.types.ImageContent | mcp.types.AudioContent):
        return media_part(Media.from_bytes(block.mime_type, _base64(block.data, block.type)))
    if isinstance(block, mcp.types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp.types.TextResourceContents):
            return text_part(resource.text)
        data = _base64(resource.blob, f"resource {resource.uri}")
        return media_part(Media.from_bytes(resource.mime_type or _OCTET_STREAM, data))
    if isinstance(block, mcp.types.ResourceLink):
        link = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        return text_part(str(RawJSON.from_value(link)))
    raise ValueError(f"MCP content of type {type(block).__name__} has no tool output form")


def _base64(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the {what} content is not valid base64 ({exc})") from None


def _check_session(session: object) -> None:
    if not isinstance(session, mcp.ClientSession):
        raise TypeError(f"session must be an mcp.ClientSession, got {type(session).__name__}")
