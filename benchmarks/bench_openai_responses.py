"""Adapter overhead per streamed chunk: OpenAIResponsesModel vs the official openai SDK's
``client.responses.create(stream=True)``.

A loopback HTTP server (tests/responses_server.py: real sockets, chunked encoding,
``event:`` + ``data:`` lines), in a child process so it does not compete for the GIL,
serves the same canned Responses stream to every contender: ``response.created``,
``response.in_progress``, the message item's ``.added`` events, 2,000
``response.output_text.delta`` events, the ``.done`` events and ``response.completed``,
in the shapes the API sends them. Each run reads the whole stream. By default the server
writes the whole body at once (``--paced``: one event per send). Rows, measured side by
side in one run (benchmarks/_loopback.py):

- ``httpx bytes (floor)``: httpx reads the raw body, nothing parsed;
- ``httpx + SSE + orjson``: the floor plus scope's SSE parser and ``orjson.loads`` per
  event (what any client must at least do);
- ``scope stream``: ``OpenAIResponsesModel.stream`` with nothing done to the deltas;
- ``scope stream + accumulate``: each delta added to a ``ResponseAccumulator``;
- ``openai SDK stream``: ``AsyncOpenAI().responses.create(stream=True)``, each event
  parsed into its pydantic model;
- ``openai SDK + join text``: the same, the text deltas collected and joined.

The acceptance bar (issue 21): ``scope stream`` at most 1.5x ``httpx + SSE + orjson``;
the last line prints the ratio. Best of N runs (time.perf_counter).
Run: ``python benchmarks/bench_openai_responses.py [--chunks 2000] [--runs 10]``. The SDK
rows are reported as skipped when the package is not installed.
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
from scope.models.openai import OpenAIResponsesModel
from tests.responses_server import ResponsesServer

MODEL = "gpt-5-mini-2025-08-07"
ITEM = "msg_0c2e5b1a9f3d4e7a00692dcd1e9c4c8190b1a2b3c4d5e6f7"
QUESTION = "Count to two thousand."


def _response(status: str, output: list[Any], usage: Any) -> dict[str, Any]:
    return {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1764600000,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": MODEL,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": "minimal", "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def canned_stream(chunks: int) -> list[Any]:
    """``chunks`` text deltas framed by the events the API sends around them."""
    text = "".join(f" tok{i}" for i in range(chunks))
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    done_part = {**part, "text": text}
    item = {
        "id": ITEM,
        "type": "message",
        "status": "in_progress",
        "content": [],
        "role": "assistant",
    }
    done_item = {**item, "status": "completed", "content": [done_part]}
    usage = {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": chunks,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 20 + chunks,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response("in_progress", [], None)},
        {"type": "response.in_progress", "response": _response("in_progress", [], None)},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {
            "type": "response.content_part.added",
            "item_id": ITEM,
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
    ]
    events += [
        {
            "type": "response.output_text.delta",
            "item_id": ITEM,
            "output_index": 0,
            "content_index": 0,
            "delta": f" tok{i}",
            "logprobs": [],
            "obfuscation": "k3Jd9",
        }
        for i in range(chunks)
    ]
    events += [
        {
            "type": "response.output_text.done",
            "item_id": ITEM,
            "output_index": 0,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "item_id": ITEM,
            "output_index": 0,
            "content_index": 0,
            "part": done_part,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": _response("completed", [done_item], usage)},
    ]
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


REQUEST = Request([user_message(QUESTION)])
BODY = {
    "model": MODEL,
    "input": [{"type": "message", "role": "user", "content": QUESTION}],
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "stream": True,
}


async def measure(base_url: str, chunks: int, runs: int) -> list[tuple[str, float | None]]:
    url = base_url + "/responses"
    expected = "".join(f" tok{i}" for i in range(chunks))
    sdk_class: Any = None
    try:
        from openai import AsyncOpenAI

        sdk_class = AsyncOpenAI
    except ImportError:
        pass  # reported as skipped
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient())
        model = OpenAIResponsesModel(
            MODEL, api_key="sk-bench", base_url=base_url, http_client=client
        )
        shared = scope_contenders(
            client, url, BODY, model, REQUEST, chunks=chunks, expected=expected
        )

        sdk_stream: Callable[[], Awaitable[object]] | None = None
        sdk_join: Callable[[], Awaitable[object]] | None = None
        if sdk_class is not None:
            sdk = await stack.enter_async_context(
                sdk_class(api_key="sk-bench", base_url=base_url, max_retries=0)
            )

            async def sdk_stream() -> int:
                count = 0
                stream = await sdk.responses.create(
                    model=MODEL, input=QUESTION, store=False, stream=True
                )
                async for _ in stream:
                    count += 1
                return count

            async def sdk_join() -> str:
                parts: list[str] = []
                stream = await sdk.responses.create(
                    model=MODEL, input=QUESTION, store=False, stream=True
                )
                async for event in stream:
                    if event.type == "response.output_text.delta":
                        parts.append(event.delta)
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
    with ResponsesServer() as server:
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
    events = args.chunks + 8
    mode = "paced: one event per send" if args.paced else "burst: whole body in one send"
    print(f"{args.chunks} text deltas ({events} events), best of {args.runs}, asyncio, {mode}\n")
    print_table(rows, events, "openai")


if __name__ == "__main__":
    main()
