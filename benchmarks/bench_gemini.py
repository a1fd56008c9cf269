"""Adapter overhead per streamed chunk: GeminiModel over loopback HTTP, beside a
hand-written client and the official google-genai SDK.

A server in a child process (tests/gemini_server.py: real sockets, chunked encoding,
``data:`` lines, the whole body in one send) serves a canned
``streamGenerateContent?alt=sse`` answer of N chunks, each a whole
``GenerateContentResponse`` with its usage, model version and response id, as Gemini
sends them. Rows as in bench_openai.py / bench_anthropic.py (benchmarks/_loopback.py):
``httpx bytes (floor)``, ``httpx + SSE + orjson``, ``scope stream``, ``scope stream +
accumulate``, then ``google-genai SDK stream`` (``client.aio.models
.generate_content_stream``, pointed at the loopback server with ``http_options
base_url``; each chunk a pydantic model) and ``google-genai SDK + join text``.

Best of N runs (time.perf_counter); per-chunk figures divide by the number of chunks.
Run: ``python benchmarks/bench_gemini.py [--chunks 2000] [--runs 10]``. The SDK rows are
reported as skipped when the package is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _loopback import interleaved, print_table, scope_contenders, server_process

from scope.chat import Request, user_message
from scope.models.gemini import GeminiModel
from tests.gemini_server import GeminiServer

MODEL = "gemini-2.5-flash"
PROMPT = "Count to two thousand."


def canned_stream(chunks: int) -> list[dict[str, Any]]:
    """``chunks`` text chunks in the exact shape the Gemini API streams, the last with
    ``finishReason`` (there is no end marker)."""
    events: list[dict[str, Any]] = []
    for i in range(chunks):
        candidate: dict[str, Any] = {
            "content": {"parts": [{"text": f" tok{i}"}], "role": "model"},
            "index": 0,
        }
        if i == chunks - 1:
            candidate["finishReason"] = "STOP"
        events.append(
            {
                "candidates": [candidate],
                "usageMetadata": {
                    "promptTokenCount": 20,
                    "candidatesTokenCount": i + 1,
                    "totalTokenCount": 21 + i,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 20}],
                },
                "modelVersion": MODEL,
                "responseId": "YmVuY2g",
            }
        )
    return events


REQUEST = Request([user_message(PROMPT)])
BODY = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}


async def measure(base_url: str, chunks: int, runs: int) -> list[tuple[str, float | None]]:
    url = f"{base_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    expected = "".join(f" tok{i}" for i in range(chunks))
    genai: Any = None
    with contextlib.suppress(ImportError):  # the SDK rows are then reported as skipped
        from google import genai
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient())
        model = GeminiModel(MODEL, api_key="bench", base_url=base_url, http_client=client)
        shared = scope_contenders(
            client, url, BODY, model, REQUEST, chunks=chunks, expected=expected
        )
        sdk_stream: Callable[[], Awaitable[object]] | None = None
        sdk_join: Callable[[], Awaitable[object]] | None = None
        if genai is not None:
            sdk = genai.Client(
                api_key="bench", http_options={"base_url": base_url, "api_version": "v1beta"}
            )

            async def sdk_stream() -> int:
                count = 0
                stream = await sdk.aio.models.generate_content_stream(model=MODEL, contents=PROMPT)
                async for _ in stream:
                    count += 1
                return count

            async def sdk_join() -> str:
                parts: list[str] = []
                stream = await sdk.aio.models.generate_content_stream(model=MODEL, contents=PROMPT)
                async for chunk in stream:
                    parts.append(chunk.text or "")
                text = "".join(parts)
                assert text == expected, "wrong text"
                return text

        rows = await interleaved(
            runs,
            [
                *shared,
                ("google-genai SDK stream", sdk_stream),
                ("google-genai SDK + join text", sdk_join),
            ],
        )
        if genai is not None:
            await sdk.aio.aclose()
        return rows


def serve(conn: Connection, chunks: int) -> None:
    """The child process: serve the canned stream until told to stop."""
    with GeminiServer() as server:
        server.serve_repeatedly({"status": 200, "sse": canned_stream(chunks), "burst": True})
        conn.send(server.base_url)
        conn.recv()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with server_process(serve, args.chunks) as base_url:
        rows = anyio.run(measure, base_url, args.chunks, args.runs)
    print(
        f"Over loopback HTTP: {args.chunks} chunks, best of {args.runs}, asyncio, burst: "
        "whole body in one send\n"
    )
    print_table(rows, args.chunks, "google-genai")


if __name__ == "__main__":
    main()
