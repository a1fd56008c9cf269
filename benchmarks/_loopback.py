"""What the adapter benchmarks share: a loopback server in a child process, the
contenders every adapter is measured with, interleaved timing and the result table.

``bench_openai.py`` and ``bench_anthropic.py`` add their own canned stream, their SDK's
rows and (Anthropic) the mapping-in-isolation part.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import orjson

from scope.chat import Request, ResponseAccumulator
from scope.models._sse import SSEDecoder

Contender = tuple[str, Callable[[], Awaitable[object]] | None]


async def interleaved(runs: int, contenders: list[Contender]) -> list[tuple[str, float | None]]:
    """Best time of each contender; rounds interleave them, so load spikes hit all alike.
    A contender whose function is None (its package is not installed) is reported as
    None."""
    best: dict[str, float] = {}
    for name, fn in contenders:
        if fn is not None:
            await fn()  # warm-up: connection, caches
            best[name] = float("inf")
    for _ in range(runs):
        for name, fn in contenders:
            if fn is None:
                continue
            start = time.perf_counter()
            await fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return [(name, best.get(name)) for name, _ in contenders]


def scope_contenders(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    model: Any,
    request: Request,
    *,
    chunks: int,
    expected: str,
    end_marker: bytes | None = None,
) -> list[Contender]:
    """The rows every adapter benchmark has, in order: ``httpx bytes (floor)``,
    ``httpx + SSE + orjson`` (each event's data parsed; ``end_marker``, OpenAI's
    ``[DONE]``, is not JSON), ``scope stream`` and ``scope stream + accumulate`` (which
    checks the text and the usage)."""

    async def floor() -> int:
        size = 0
        async with client.stream("POST", url, json=body) as response:
            async for raw in response.aiter_bytes():
                size += len(raw)
        return size

    async def sse_json() -> int:
        count = 0
        decoder = SSEDecoder()
        async with client.stream("POST", url, json=body) as response:
            async for raw in response.aiter_bytes():
                for _, data in decoder.feed(raw):
                    if data != end_marker:
                        orjson.loads(data)
                        count += 1
        return count

    async def scope_stream() -> int:
        count = 0
        async for _ in model.stream(request):
            count += 1
        return count

    async def scope_accumulate() -> str:
        accumulator = ResponseAccumulator()
        async for chunk in model.stream(request):
            accumulator.add(chunk)
        response = accumulator.response()
        assert response is not None and response.usage.output_tokens == chunks
        assert response.text == expected, "wrong text"
        return response.text

    return [
        ("httpx bytes (floor)", floor),
        ("httpx + SSE + orjson", sse_json),
        ("scope stream", scope_stream),
        ("scope stream + accumulate", scope_accumulate),
    ]


@contextlib.contextmanager
def server_process(serve: Callable[..., None], *args: Any) -> Iterator[str]:
    """Run ``serve(conn, *args)`` in a spawned child (so the server does not compete for
    the GIL) and yield the base URL it sends back; tell it to stop on exit."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=serve, args=(child, *args), daemon=True)
    process.start()
    try:
        yield parent.recv()
    finally:
        parent.send("stop")
        process.join(10)


#: The acceptance bar of issues 21 and 27: per streamed chunk, an adapter's ``stream``
#: costs at most this many times the hand-written httpx + SSE + orjson client.
BAR = 1.5


def print_table(rows: list[tuple[str, float | None]], events: int, missing: str) -> None:
    """The loopback table: best ms, µs per event, the ratio to the first row (the
    floor) and µs per event over it; a None row is ``skipped (<missing> not
    installed)``. Then the ratio the acceptance bar is about: ``scope stream`` over
    ``httpx + SSE + orjson`` (both measured in this run)."""
    floor = rows[0][1]
    assert floor is not None
    print(f"{'contender':<28}{'best ms':>10}{'us/chunk':>10}{'x floor':>9}{'+us/chunk':>11}")
    for name, seconds in rows:
        if seconds is None:
            print(f"{name:<28}{f'skipped ({missing} not installed)':>40}")
            continue
        per = seconds / events * 1e6
        extra = (seconds - floor) / events * 1e6
        print(f"{name:<28}{seconds * 1e3:>10.2f}{per:>10.2f}{seconds / floor:>9.2f}{extra:>11.2f}")
    times = dict(rows)
    sse, scope = times["httpx + SSE + orjson"], times["scope stream"]
    assert sse is not None and scope is not None
    print(f"\nscope stream / (httpx + SSE + orjson) = {scope / sse:.2f} (bar: {BAR})")
