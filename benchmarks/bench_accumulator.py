"""Accumulating a stream: scope's ResponseAccumulator against the floor and two peers.

Workload per size N: N four-character text deltas, then two parallel tool calls of 50
argument fragments each, interleaved (a, b, a, b, ...). Every contender gets its chunks
prebuilt (construction is not timed) and must end with the whole message: the text and
both calls' arguments. Reported: the best of several runs, per delta, and the ratio to
the floor (``list.append`` of every fragment and one ``''.join`` per part).

Competitors (optional, never runtime dependencies; missing ones are reported as
skipped): langchain-core's ``AIMessageChunk`` summation and pydantic-ai's
``ModelResponsePartsManager``. Install them with
``pip install langchain-core pydantic-ai-slim``.

Run: ``python benchmarks/bench_accumulator.py [--quick]``.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable

from scope.chat import (
    Message,
    Output,
    Response,
    ResponseAccumulator,
    Role,
    text_part,
    tool_call_delta_part,
)

SIZES = (500, 2_000, 8_000, 32_000)
FRAGMENTS = 50  # per tool call
DELTA = "abcd"
ARG = '{"x"'  # four characters per argument fragment


def fragments(n: int) -> list[tuple[str, str]]:
    """The stream as (kind, payload) pairs: kind "text", "a" or "b"."""
    out = [("text", DELTA)] * n
    for _ in range(FRAGMENTS):
        out.append(("a", ARG))
        out.append(("b", ARG))
    return out


def expected(n: int) -> tuple[str, str]:
    return DELTA * n, ARG * FRAGMENTS


Prepared = Callable[[], tuple[str, str, str]]  # runs once, returns (text, args a, args b)


def prepare_floor(stream: list[tuple[str, str]]) -> Prepared:
    def run() -> tuple[str, str, str]:
        lists: dict[str, list[str]] = {"text": [], "a": [], "b": []}
        for kind, payload in stream:
            lists[kind].append(payload)
        return "".join(lists["text"]), "".join(lists["a"]), "".join(lists["b"])

    return run


def prepare_scope(stream: list[tuple[str, str]]) -> Prepared:
    names = {"a": "get_weather", "b": "get_time"}
    chunks = []
    for kind, payload in stream:
        part = (
            text_part(payload)
            if kind == "text"
            else tool_call_delta_part(f"call_{kind}", names[kind], payload)
        )
        chunks.append(Response(Output(Message(Role.ASSISTANT, (part,)))))

    def run() -> tuple[str, str, str]:
        acc = ResponseAccumulator()
        for chunk in chunks:
            acc.add(chunk)
        response = acc.response()
        assert response is not None and response.output is not None
        assert response.output.message is not None
        text, call_a, call_b = response.output.message.parts
        assert call_a.tool_call is not None and call_b.tool_call is not None
        return text.text, call_a.tool_call.arguments, call_b.tool_call.arguments

    return run


def prepare_langchain(stream: list[tuple[str, str]]) -> Prepared:
    from langchain_core.messages import AIMessageChunk
    from langchain_core.messages.tool import tool_call_chunk

    chunks = []
    started: set[str] = set()
    for kind, payload in stream:
        if kind == "text":
            chunks.append(AIMessageChunk(content=payload))
            continue
        first = kind not in started
        started.add(kind)
        call = tool_call_chunk(
            name=("get_weather" if kind == "a" else "get_time") if first else None,
            args=payload,
            id=f"call_{kind}" if first else None,
            index=0 if kind == "a" else 1,
        )
        chunks.append(AIMessageChunk(content="", tool_call_chunks=[call]))

    def run() -> tuple[str, str, str]:
        total = chunks[0]
        for chunk in chunks[1:]:
            total = total + chunk
        calls = total.tool_call_chunks
        return str(total.content), str(calls[0]["args"]), str(calls[1]["args"])

    return run


def prepare_pydantic_ai(stream: list[tuple[str, str]]) -> Prepared:
    from pydantic_ai._parts_manager import ModelResponsePartsManager
    from pydantic_ai.messages import TextPart, ToolCallPart
    from pydantic_ai.models import ModelRequestParameters

    def run() -> tuple[str, str, str]:
        manager = ModelResponsePartsManager(ModelRequestParameters())
        started: set[str] = set()
        for kind, payload in stream:
            if kind == "text":
                for _ in manager.handle_text_delta(vendor_part_id="text", content=payload):
                    pass
            else:
                first = kind not in started
                started.add(kind)
                manager.handle_tool_call_delta(
                    vendor_part_id=kind,
                    tool_name=("get_weather" if kind == "a" else "get_time") if first else None,
                    args=payload,
                    tool_call_id=f"call_{kind}" if first else None,
                )
        text, call_a, call_b = manager.get_parts()
        assert isinstance(text, TextPart)
        assert isinstance(call_a, ToolCallPart) and isinstance(call_b, ToolCallPart)
        return text.content, str(call_a.args), str(call_b.args)

    return run


CONTENDERS: list[tuple[str, Callable[[list[tuple[str, str]]], Prepared]]] = [
    ("floor", prepare_floor),
    ("scope", prepare_scope),
    ("langchain-core", prepare_langchain),
    ("pydantic-ai", prepare_pydantic_ai),
]


def best_of(run: Prepared, repeats: int) -> float:
    """The fastest of ``repeats`` runs, with the cyclic GC off while timing (as ``timeit``
    does): the prebuilt chunks of the big sizes would otherwise make every collection
    slower and blur the contenders' own cost."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    sizes = SIZES[:2] if quick else SIZES
    results: dict[str, dict[int, float | None]] = {name: {} for name, _ in CONTENDERS}
    skipped: dict[str, str] = {}
    for n in sizes:
        stream = fragments(n)
        deltas = len(stream)
        for name, prepare in CONTENDERS:
            if name in skipped:
                results[name][n] = None
                continue
            try:
                run = prepare(stream)
            except ImportError as exc:
                skipped[name] = f"not installed ({exc.name})"
                results[name][n] = None
                continue
            start = time.perf_counter()
            text, args_a, args_b = run()  # warm-up and correctness check
            once = time.perf_counter() - start
            # at least 5 runs, more for fast ones (about half a second each contender)
            repeats = max(5, min(50, int(0.5 / max(once, 1e-9))))
            want_text, want_args = expected(n)
            if (text, args_a, args_b) != (want_text, want_args, want_args):
                raise SystemExit(f"{name} accumulated a wrong result at N={n}")
            results[name][n] = best_of(run, repeats) / deltas

    print(f"Python {sys.version.split()[0]}; per-delta cost, best of 5 to 50 runs, GC off")
    print("deltas = N text deltas + 100 interleaved tool-call fragments\n")
    header = f"{'N':>7} | " + " | ".join(f"{name:>24}" for name, _ in CONTENDERS)
    print(header)
    print("-" * len(header))
    for n in sizes:
        floor = results["floor"][n]
        cells = []
        for name, _ in CONTENDERS:
            value = results[name][n]
            if value is None:
                cells.append(f"{'skipped':>24}")
            elif name == "floor" or floor is None:
                cells.append(f"{value * 1e6:>11.3f} us          ")
            else:
                cells.append(f"{value * 1e6:>11.3f} us ({value / floor:>6.1f}x)")
        print(f"{n:>7} | " + " | ".join(cells))
    print()
    first, last = sizes[0], sizes[-1]
    for name, _ in CONTENDERS:
        if name in skipped:
            print(f"{name}: skipped, {skipped[name]}")
            continue
        a, b = results[name][first], results[name][last]
        assert a is not None and b is not None
        print(f"{name}: per-delta cost at N={last} / N={first} = {b / a:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
