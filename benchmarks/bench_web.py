"""Encoding a stream for the browser: scope.web's UI message stream against
pydantic-ai's Vercel AI adapter, on the same stream, side by side in one run.

Workload per size N: N four-character text deltas, then two tool calls of 50 argument
fragments each (one after the other: pydantic-ai's adapter streams one open part at a
time). Each contender gets its input events prebuilt (construction is not timed) and
must produce the whole encoded UI message stream (SSE text, ``[DONE]`` included); the
outputs are checked to carry the same text and arguments. Reported: the best of several
alternating rounds, per input chunk, and scope's ratio to pydantic-ai's (target: at
most 0.5x).

pydantic-ai (``pip install pydantic-ai-slim``) is a benchmark-only competitor, never a
dependency; without it the comparison is reported as skipped.

Run: ``python benchmarks/bench_web.py [--quick]``.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import orjson

from scope.chat import (
    FinishReason,
    Output,
    Response,
    assistant_message,
    text_part,
    tool_call_delta_part,
)
from scope.web import ui_message_stream

SIZES = (500, 2_000, 8_000)
FRAGMENTS = 50
DELTA = "abcd"
ARG = '{"x"'


def scope_chunks(n: int) -> list[Response]:
    out = [Response(Output(assistant_message(text_part(DELTA)))) for _ in range(n)]
    for call in ("a", "b"):
        for _ in range(FRAGMENTS):
            out.append(Response(Output(assistant_message(tool_call_delta_part(call, "f", ARG)))))
    out.append(Response(Output(None, FinishReason.TOOL_CALLS)))
    return out


async def _iterate(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def run_scope(n: int) -> Callable[[], Coroutine[Any, Any, str]]:
    chunks = scope_chunks(n)

    async def run() -> str:
        return b"".join([d async for d in ui_message_stream(_iterate(chunks))]).decode()

    return run


def run_pydantic_ai(n: int) -> Callable[[], Coroutine[Any, Any, str]] | None:
    try:
        from pydantic_ai.messages import (
            PartDeltaEvent,
            PartEndEvent,
            PartStartEvent,
            TextPart,
            TextPartDelta,
            ToolCallPart,
            ToolCallPartDelta,
        )
        from pydantic_ai.ui.vercel_ai import VercelAIEventStream
    except ImportError:
        return None
    events: list[Any] = [PartStartEvent(index=0, part=TextPart(DELTA))]
    events += [PartDeltaEvent(index=0, delta=TextPartDelta(DELTA)) for _ in range(n - 1)]
    events.append(PartEndEvent(index=0, part=TextPart(DELTA * n)))
    for index, call in ((1, "a"), (2, "b")):
        events.append(PartStartEvent(index=index, part=ToolCallPart("f", ARG, tool_call_id=call)))
        events += [
            PartDeltaEvent(index=index, delta=ToolCallPartDelta(args_delta=ARG, tool_call_id=call))
            for _ in range(FRAGMENTS - 1)
        ]
        events.append(
            PartEndEvent(index=index, part=ToolCallPart("f", ARG * FRAGMENTS, tool_call_id=call))
        )

    async def run() -> str:
        stream = VercelAIEventStream(None)
        return "".join(
            [s async for s in stream.encode_stream(stream.transform_stream(_iterate(events)))]
        )

    return run


def _check(name: str, text: str, n: int) -> None:
    deltas = []
    args: dict[str, list[str]] = {}
    for event in text.split("\n\n"):
        if not event.startswith("data: {"):
            continue
        part = orjson.loads(event[6:])
        if part["type"] == "text-delta":
            deltas.append(part["delta"])
        elif part["type"] == "tool-input-delta":
            args.setdefault(part["toolCallId"], []).append(part["inputTextDelta"])
    assert "".join(deltas) == DELTA * n, name
    assert {k: "".join(v) for k, v in args.items()} == {
        "a": ARG * FRAGMENTS,
        "b": ARG * FRAGMENTS,
    }, name
    assert "data: [DONE]" in text, name


def best(run: Callable[[], Coroutine[Any, Any, str]], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        asyncio.run(run())
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    quick = "--quick" in sys.argv
    rounds = 3 if quick else 9
    print("UI message stream encoding, per input chunk (best of alternating rounds)")
    print(f"{'chunks':>8} {'scope µs':>10} {'pydantic-ai µs':>15} {'ratio':>7}")
    for n in SIZES[:2] if quick else SIZES:
        chunks = n + 2 * FRAGMENTS
        ours = run_scope(n)
        _check("scope", asyncio.run(ours()), n)
        theirs = run_pydantic_ai(n)
        if theirs is None:
            t = best(ours, rounds)
            print(f"{chunks:>8} {t / chunks * 1e6:>10.2f} {'skipped':>15} {'-':>7}")
            continue
        _check("pydantic-ai", asyncio.run(theirs()), n)
        a_times, b_times = [], []
        for _ in range(rounds):  # alternate, so busy spells weigh on both
            a_times.append(best(ours, 1))
            b_times.append(best(theirs, 1))
        a, b = min(a_times), min(b_times)
        print(f"{chunks:>8} {a / chunks * 1e6:>10.2f} {b / chunks * 1e6:>15.2f} {a / b:>6.2f}x")
    print("target: scope at most 0.5x pydantic-ai's Vercel AI adapter per chunk")


if __name__ == "__main__":
    main()
