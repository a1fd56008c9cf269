"""Adapter overhead per streamed chunk: OpenAIChatModel vs the official openai SDK.

A loopback HTTP server (tests/openai_server.py: real sockets, chunked encoding, one
HTTP chunk per server-sent event), in a child process so it does not compete for the
GIL, serves the same canned 2,000-chunk Chat Completions stream to every contender; each
run reads the whole stream. By default the server writes the whole body at once
(``--paced`` writes one event per send, as a live model would; the client then mostly
waits for the server). Rows, measured side by side in one run:

- ``httpx bytes (floor)``: httpx reads the raw body, nothing parsed;
- ``httpx + SSE + orjson``: the floor plus scope's SSE parser and ``orjson.loads`` per
  event (what any client must at least do);
- ``scope stream``: ``OpenAIChatModel.stream`` (SSE parse + mapping to ``Response``
  deltas) with nothing done to the deltas;
- ``scope stream + accumulate``: the same, each delta added to a ``ResponseAccumulator``
  and the final response built;
- ``openai SDK stream``: ``AsyncOpenAI().chat.completions.create(stream=True)``, each
  chunk parsed into a pydantic ``ChatCompletionChunk``;
- ``openai SDK + join text``: the same, text fragments collected and joined.

Best of N runs (time.perf_counter). Per-chunk overhead is (row - floor) / chunks.
Run: ``python benchmarks/bench_openai.py [--chunks 2000] [--runs 15]``. The openai row is
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
from scope.models.openai import OpenAIChatModel
from tests.openai_server import OpenAIServer

MODEL = "gpt-4o-mini-2024-07-18"


def canned_stream(chunks: int) -> list[Any]:
    """``chunks`` content chunks in the exact shape OpenAI sends, plus finish, usage, DONE."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1727389745,
            "model": MODEL,
            "service_tier": "default",
            "system_fingerprint": "fp_f85bea6784",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }

    events: list[Any] = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": f" tok{i}"}) for i in range(chunks)]
    events.append(chunk({}, "stop"))
    usage = {
        "prompt_tokens": 20,
        "completion_tokens": chunks,
        "total_tokens": 20 + chunks,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    events.append({**chunk({}), "choices": [], "usage": usage})
    events.append("[DONE]")
    return events


#: The end of an OpenAI stream: an SSE data line that is not JSON.
DONE = b"[DONE]"

REQUEST = Request([user_message("Count to two thousand.")])
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Count to two thousand."}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def measure(base_url: str, chunks: int, runs: int) -> list[tuple[str, float | None]]:
    url = base_url + "/chat/completions"
    expected = "".join(f" tok{i}" for i in range(chunks))
    sdk_class: Any = None
    try:
        from openai import AsyncOpenAI

        sdk_class = AsyncOpenAI
    except ImportError:
        pass  # reported as skipped
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient())
        model = OpenAIChatModel(MODEL, api_key="sk-bench", base_url=base_url, http_client=client)
        shared = scope_contenders(
            client, url, BODY, model, REQUEST, chunks=chunks, expected=expected, end_marker=DONE
        )

        sdk_stream: Callable[[], Awaitable[object]] | None = None
        sdk_join: Callable[[], Awaitable[object]] | None = None
        if sdk_class is not None:
            sdk = await stack.enter_async_context(
                sdk_class(api_key="sk-bench", base_url=base_url, max_retries=0)
            )

            async def sdk_stream() -> int:
                count = 0
                stream = await sdk.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Count to two thousand."}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async for _ in stream:
                    count += 1
                return count

            async def sdk_join() -> str:
                parts: list[str] = []
                stream = await sdk.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Count to two thousand."}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                text = "".join(parts)
                assert text == expected, "wrong text"
                return text

        return await interleaved(
            runs,
            [
                *shared,
                ("openai SDK stream", sdk_stream),
                ("openai SDK + join text", sdk_join),
            ],
        )


def serve(conn: Connection, chunks: int, paced: bool) -> None:
    """The child process: serve the canned stream until told to stop."""
    with OpenAIServer() as server:
        server.serve_repeatedly({"status": 200, "sse": canned_stream(chunks), "burst": not paced})
        conn.send(server.base_url)
        conn.recv()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--paced", action="store_true", help="one event per send")
    args = parser.parse_args()
    with server_process(serve, args.chunks, args.paced) as base_url:
        rows = anyio.run(measure, base_url, args.chunks, args.runs)
    events = args.chunks + 3
    mode = "paced: one event per send" if args.paced else "burst: whole body in one send"
    print(f"{args.chunks} content chunks ({events} events), best of {args.runs}, asyncio, {mode}\n")
    print_table(rows, events, "openai")


if __name__ == "__main__":
    main()
