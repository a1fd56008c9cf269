"""A real MCP server for scope.tools.mcp's tests, written with the official ``mcp``
package (``MCPServer``, FastMCP's 2.x name) and run over stdio:
``python tests/mcp_server.py``. Every kind of result the adapter maps has a tool:
text, structured JSON, an image and audio, embedded resources and a resource link, a
tool error (``isError``), content that cannot be decoded, and one that waits until it is
cancelled.
"""

from __future__ import annotations

import base64
from typing import Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Audio, Image
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

PNG = b"\x89PNG\r\n\x1a\n-a-tiny-test-image-"
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt -a-tiny-test-sound-"
PDF = b"%PDF-1.7 a tiny test document"

server = MCPServer("scope-tests")


@server.tool()
def forecast(city: str, unit: Literal["C", "F"] = "C") -> str:
    """The weather forecast for a city."""
    return f"{city}: 21 °{unit}, sunny"


@server.tool()
def stats(numbers: list[float]) -> dict[str, float]:
    """The count, sum and mean of some numbers."""
    total = sum(numbers)
    return {"count": len(numbers), "sum": total, "mean": total / len(numbers)}


@server.tool()
def snapshot() -> Image:
    """A picture of the sky."""
    return Image(data=PNG, format="png")


@server.tool()
def chime() -> Audio:
    """A short sound."""
    return Audio(data=WAV, format="wav")


@server.tool()
def documents() -> list[TextContent | EmbeddedResource | ResourceLink]:
    """Documents: an intro line, a text file, a PDF and a link to a report."""
    return [
        TextContent(text="Three documents:"),
        EmbeddedResource(resource=TextResourceContents(uri="file:///notes.txt", text="Buy milk.")),
        EmbeddedResource(
            resource=BlobResourceContents(
                uri="file:///paper.pdf",
                mime_type="application/pdf",
                blob=base64.b64encode(PDF).decode(),
            )
        ),
        EmbeddedResource(
            resource=BlobResourceContents(
                uri="file:///data.bin", blob=base64.b64encode(b"\x00\x01").decode()
            )
        ),
        ResourceLink(uri="file:///report.md", name="report", mime_type="text/markdown"),
    ]


@server.tool()
def refuse(reason: str) -> str:
    """Always fails, saying why."""
    raise ToolError(f"refused: {reason}")


@server.tool()
def refuse_with_details() -> CallToolResult:
    """An error result with structured content."""
    return CallToolResult(
        content=[TextContent(text="quota exceeded")],
        structured_content={"retry_after": 30},
        is_error=True,
    )


@server.tool()
def garbled() -> CallToolResult:
    """An image whose data is not base64."""
    return CallToolResult(content=[ImageContent(data="not base64!", mime_type="image/png")])


@server.tool()
async def wait(ctx: Context) -> str:
    """Waits until it is cancelled (after telling the client it started)."""
    await ctx.info("waiting")
    await anyio.sleep_forever()
    return "never"


if __name__ == "__main__":
    server.run()
