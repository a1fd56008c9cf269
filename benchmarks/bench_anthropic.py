"""Adapter overhead per streamed chunk: AnthropicModel beside OpenAIChatModel (and the
official anthropic SDK).

Two parts, measured in one run:

1. **Mapping in isolation** (no network): pre-encoded events of a canned 2,000-chunk
   answer fed to the adapters' event mappers, ``EventMapper.map`` (Anthropic) beside
   ``ChunkMapper.map`` (OpenAI), alone and with each delta added to a
   ``ResponseAccumulator``; the floor is ``orjson.loads`` of each event.
2. **Over loopback HTTP**: a server in a child process (tests/anthropic_server.py: real
   sockets, chunked encoding, ``event:`` + ``data:`` lines, the whole body in one send)
   serves the same canned Messages stream to every contender; rows as in
   bench_openai.py: ``httpx bytes (floor)``, ``httpx + SSE + orjson``, ``scope stream``,
   ``scope stream + accumulate``, ``anthropic SDK stream`` (``AsyncAnthropic().messages
   .create(stream=True)``, each event a pydantic model) and ``anthropic SDK + join text``.

With ``--history N`` the request replays N earlier turns (a question, then the
adapter's own answer: a signed thinking block and text, stamped as produced), so the
request mapping, prefix digests (DESIGN §6g) included, is part of every row; the
isolation part then also times ``build_body`` + ``orjson.dumps`` of that request (what
the adapter does before it sends).

Best of N runs (time.perf_counter); per-chunk figures divide by the number of events.
Run: ``python benchmarks/bench_anthropic.py [--chunks 2000] [--runs 10] [--history 0]``.
The SDK rows are reported as skipped when the package is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _loopback import interleaved, print_table, scope_contenders, server_process
from bench_openai import canned_stream as openai_stream

from scope.chat import (
    Message,
    Options,
    Request,
    ResponseAccumulator,
    assistant_message,
    reasoning_part,
    system_message,
    user_message,
)
from scope.metadata import Metadata
from scope.models._anthropic_wire import API, PROVIDER, EventMapper, build_body
from scope.models._openai_wire import ChunkMapper
from scope.models._provenance import Replay, stamp
from scope.models.anthropic import AnthropicModel
from tests.anthropic_server import AnthropicServer

MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "Count to two thousand."


def canned_stream(chunks: int) -> list[dict[str, Any]]:
    """``chunks`` text deltas in the exact shape the Messages API sends, framed by
    message_start, a ping, content_block_start/stop, message_delta and message_stop."""
    usage = {
        "input_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
        "service_tier": "standard",
    }
    message = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": f" tok{i}"},
        }
        for i in range(chunks)
    ]
    events.append({"type": "content_block_stop", "index": 0})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": chunks},
        }
    )
    events.append({"type": "message_stop"})
    return events


REQUEST = Request([user_message(PROMPT)])
BODY = {
    "model": MODEL,
    "max_tokens": 4096,
    "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    "stream": True,
}


def history_request(turns: int) -> tuple[Request, dict[str, Any]]:
    """A request replaying ``turns`` earlier turns, each answer the adapter's own (its
    provenance, and ``scope/prefix`` where the adapter stamps one), and the body it
    sends (for the hand-written client)."""
    messages: list[Message] = [system_message("You are a patient counter.")]
    for turn in range(turns):
        messages.append(user_message(f"Question {turn}: " + "count with me " * 20))
        replay = Replay(API, PROVIDER)
        build_body(
            Request(messages), default_options=Options(), model=MODEL, stream=True, replay=replay
        )
        answer = assistant_message(
            reasoning_part("Counting, carefully. " * 10, bytes(range(64)) * 3),
            f"Answer {turn}: " + "one two three " * 15,
        )
        answer = stamp(answer, API, PROVIDER, MODEL)
        prefix = getattr(replay, "prefix", "")  # before v0.4: no digest
        if prefix:
            metadata = answer.metadata.merge(Metadata({"scope/prefix": prefix}))
            answer = attrs.evolve(answer, metadata=metadata)
        messages.append(answer)
    messages.append(user_message(PROMPT))
    request = Request(messages)
    body = orjson.loads(
        orjson.dumps(build_body(request, default_options=Options(), model=MODEL, stream=True))
    )
    assert len(body["messages"]) == 2 * turns + 1
    sent = sum(1 for m in body["messages"] for b in m["content"] if b["type"] == "thinking")
    assert sent == turns, "every turn's thinking goes back"
    return request, body


def best_of(runs: int, fn: Callable[[], object]) -> float:
    fn()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def isolation(chunks: int, runs: int, history: int) -> list[tuple[str, float, int]]:
    """(row, best seconds, events) of the mappers over pre-encoded events; with a
    ``history``, then the encoding of that request (one "event": the request)."""
    anthropic_events = [(str(e["type"]), orjson.dumps(e)) for e in canned_stream(chunks)]
    openai_events = [
        ("message", b"[DONE]" if e == "[DONE]" else orjson.dumps(e)) for e in openai_stream(chunks)
    ]

    def loads(events: list[tuple[str, bytes]]) -> Callable[[], object]:
        def run() -> None:
            for _, data in events:
                if data != b"[DONE]":
                    orjson.loads(data)

        return run

    def mapped(
        events: list[tuple[str, bytes]], factory: Any, accumulate: bool
    ) -> Callable[[], object]:
        def run() -> None:
            mapper = factory()
            accumulator = ResponseAccumulator()
            for event, data in events:
                chunk = mapper.map(event, data)
                if accumulate and chunk is not None:
                    accumulator.add(chunk)
            if accumulate:
                response = accumulator.response()
                assert response is not None and response.usage.output_tokens == chunks

        return run

    rows: list[tuple[str, float, int]] = []
    for name, events, factory in (
        ("anthropic", anthropic_events, EventMapper),
        ("openai", openai_events, ChunkMapper),
    ):
        n = len(events)
        rows.append((f"{name}: orjson.loads (floor)", best_of(runs, loads(events)), n))
        rows.append((f"{name}: map", best_of(runs, mapped(events, factory, False)), n))
        rows.append((f"{name}: map + accumulate", best_of(runs, mapped(events, factory, True)), n))
    if history:
        request, _ = history_request(history)

        def encode() -> bytes:
            body = build_body(request, default_options=Options(), model=MODEL, stream=True)
            return orjson.dumps(body)

        rows.append((f"anthropic: encode {history}-turn request", best_of(runs, encode), 1))
    return rows


async def measure(
    base_url: str, chunks: int, runs: int, history: int
) -> list[tuple[str, float | None]]:
    url = base_url + "/v1/messages"
    request, body = history_request(history) if history else (REQUEST, BODY)
    expected = "".join(f" tok{i}" for i in range(chunks))
    sdk_class: Any = None
    try:
        from anthropic import AsyncAnthropic

        sdk_class = AsyncAnthropic
    except ImportError:
        pass  # reported as skipped
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient())
        model = AnthropicModel(MODEL, api_key="sk-bench", base_url=base_url, http_client=client)
        shared = scope_contenders(
            client, url, body, model, request, chunks=chunks, expected=expected
        )

        sdk_stream: Callable[[], Awaitable[object]] | None = None
        sdk_join: Callable[[], Awaitable[object]] | None = None
        if sdk_class is not None:
            sdk = await stack.enter_async_context(
                sdk_class(api_key="sk-bench", base_url=base_url, max_retries=0)
            )

            async def sdk_stream() -> int:
                count = 0
                stream = await sdk.messages.create(
                    model=MODEL,
                    max_tokens=4096,
                    messages=body["messages"],
                    stream=True,
                )
                async for _ in stream:
                    count += 1
                return count

            async def sdk_join() -> str:
                parts: list[str] = []
                stream = await sdk.messages.create(
                    model=MODEL,
                    max_tokens=4096,
                    messages=body["messages"],
                    stream=True,
                )
                async for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        parts.append(event.delta.text)
                text = "".join(parts)
                assert text == expected, "wrong text"
                return text

        return await interleaved(
            runs,
            [
                *shared,
                ("anthropic SDK stream", sdk_stream),
                ("anthropic SDK + join text", sdk_join),
            ],
        )


def serve(conn: Connection, chunks: int) -> None:
    """The child process: serve the canned stream until told to stop."""
    with AnthropicServer() as server:
        # Encoded once (event: + data: lines), sent as the whole body in one write.
        server.serve_repeatedly({"status": 200, "sse": canned_stream(chunks), "burst": True})
        conn.send(server.base_url)
        conn.recv()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--history", type=int, default=0, help="earlier turns replayed")
    args = parser.parse_args()

    print(f"Mapping in isolation: {args.chunks} content chunks, best of {args.runs}\n")
    print(f"{'row':<34}{'best ms':>10}{'us/event':>10}{'+us over floor':>16}")
    floor = 0.0
    for name, seconds, events in isolation(args.chunks, args.runs, args.history):
        if name.endswith("(floor)"):
            floor = seconds
        if "encode" in name:  # one request, not events: no floor applies
            print(f"{name:<34}{seconds * 1e6:>10.1f} us per request")
            continue
        extra = (seconds - floor) / events * 1e6
        print(f"{name:<34}{seconds * 1e3:>10.2f}{seconds / events * 1e6:>10.2f}{extra:>16.2f}")

    with server_process(serve, args.chunks) as base_url:
        rows = anyio.run(measure, base_url, args.chunks, args.runs, args.history)
    events = args.chunks + 6
    print(
        f"\nOver loopback HTTP: {args.chunks} content chunks ({events} events), best of "
        f"{args.runs}, asyncio, burst: whole body in one send, {args.history} earlier turns "
        "replayed\n"
    )
    print_table(rows, events, "anthropic")


if __name__ == "__main__":
    main()
