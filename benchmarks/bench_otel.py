"""Overhead of ``scope.otel`` tracing per call and per streamed chunk.

Side by side in one run, for ``call`` and for a 200-chunk stream (collected): the bare
model; behind ``tracing()`` with the OpenTelemetry API's no-op tracer and meter providers
(what an application pays when it installs the extra but no SDK); behind ``tracing()``
with the SDK (``TracerProvider`` + ``SimpleSpanProcessor`` into an ``InMemorySpanExporter``,
``MeterProvider`` + ``InMemoryMetricReader``: the span and metric work without any
network export); and the SDK with ``capture_content=True``. The latest conventions are
selected (``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``).

Run: ``python benchmarks/bench_otel.py`` (needs ``opentelemetry-sdk``)
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scope import otel
from scope.chat import (
    FinishReason,
    Model,
    Options,
    Output,
    Request,
    Response,
    ResponseMetadata,
    Streamer,
    Usage,
    assistant_message,
    collect,
    user_message,
    wrap,
    wrap_stream,
)

ANSWER = Response(
    Output(assistant_message("the answer " * 20), FinishReason.STOP),
    ResponseMetadata(id="r", model="m", usage=Usage(100, 40)),
)
CHUNKS = [
    Response(Output(assistant_message(f"tok{i} ")), ResponseMetadata("r", "m") if i == 0 else None)
    for i in range(199)
] + [Response(Output(finish_reason=FinishReason.STOP), ResponseMetadata(usage=Usage(100, 200)))]
N_CHUNKS = len(CHUNKS)
REQUEST = Request(
    [user_message("what now?")], options=Options(model="m", temperature=0.2, max_tokens=500)
)


class Bare:
    provider_name = "openai"

    async def call(self, request: Request) -> Response:
        return ANSWER

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Response]:
        for chunk in CHUNKS:
            yield chunk


class SDK:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])


async def best_of(
    fns: list[Callable[[], Awaitable[object]]], rounds: int, inner: int, reset: Callable[[], None]
) -> list[float]:
    """Best mean seconds per operation of each function; rounds interleave the functions,
    so a load spike on the shared machine hits every contender alike."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for index, fn in enumerate(fns):
            reset()
            start = time.perf_counter()
            for _ in range(inner):
                await fn()
            best[index] = min(best[index], (time.perf_counter() - start) / inner)
    return best


async def main() -> None:
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"  # read by tracing()
    bare = Bare()
    noop = otel.tracing(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
    sdk = SDK()
    traced = otel.tracing(sdk.tracer_provider, sdk.meter_provider)
    capture = otel.tracing(sdk.tracer_provider, sdk.meter_provider, capture_content=True)

    callers: list[tuple[str, Model]] = [
        ("call: bare model", bare),
        ("call: + tracing, no-op providers", wrap(bare, noop.call)),
        ("call: + tracing, SDK (in-memory)", wrap(bare, traced.call)),
        ("call: + tracing, SDK + capture_content", wrap(bare, capture.call)),
    ]
    streamers: list[tuple[str, Streamer]] = [
        (f"stream {N_CHUNKS} chunks: bare + collect", bare),
        (f"stream {N_CHUNKS} chunks: + tracing, no-op", wrap_stream(bare, noop.stream)),
        (f"stream {N_CHUNKS} chunks: + tracing, SDK", wrap_stream(bare, traced.stream)),
        (
            f"stream {N_CHUNKS} chunks: + SDK + capture_content",
            wrap_stream(bare, capture.stream),
        ),
    ]
    reset = sdk.exporter.clear

    def calling(model: Model) -> Callable[[], Awaitable[object]]:
        return lambda: model.call(REQUEST)

    def streaming(streamer: Streamer) -> Callable[[], Awaitable[object]]:
        return lambda: collect(streamer.stream(REQUEST))

    call_times = await best_of([calling(m) for _, m in callers], 15, 1000, reset)
    stream_times = await best_of([streaming(s) for _, s in streamers], 15, 50, reset)
    rows = [(name, t) for (name, _), t in zip(callers, call_times, strict=True)]
    rows += [(name, t) for (name, _), t in zip(streamers, stream_times, strict=True)]

    print(f"{'case':46} {'per op':>10} {'ratio':>7} {'overhead':>10}")
    for index, (name, seconds) in enumerate(rows):
        floor = rows[index - index % 4][1]
        extra = (seconds - floor) * 1e6
        print(f"{name:46} {seconds * 1e6:8.1f}us {seconds / floor:6.2f}x {extra:8.1f}us")
    print()
    for offset, label in ((1, "no-op"), (2, "SDK"), (3, "SDK + capture")):
        per_call = (rows[offset][1] - rows[0][1]) * 1e6
        per_stream = (rows[4 + offset][1] - rows[4][1]) * 1e6
        # A stream pays the span once (about the per-call overhead) plus a per-chunk cost.
        per_chunk = (per_stream - per_call) / N_CHUNKS
        print(
            f"{label:14} overhead: {per_call:6.1f}us per call; {per_stream:7.1f}us per "
            f"{N_CHUNKS}-chunk stream, i.e. ~{per_chunk:4.2f}us per chunk beyond the span"
        )


if __name__ == "__main__":
    anyio.run(main)
