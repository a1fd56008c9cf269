"""The GenAI client metrics: three histograms with the conventions' bucket advice."""

from __future__ import annotations

from typing import Any, final

from opentelemetry import metrics

from scope.chat import Usage
from scope.otel._conventions import DURATION_BUCKETS, TOKEN_BUCKETS

__all__ = ["Instruments"]


@final
class Instruments:
    """``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage`` and
    ``gen_ai.client.operation.time_to_first_chunk``, made on one meter."""

    __slots__ = ("_duration", "_token_usage", "_ttfc")

    def __init__(self, meter: metrics.Meter) -> None:
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        self._ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed response.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )

    def record(
        self,
        duration: float,
        first_chunk: float | None,
        usage: Usage | None,
        attributes: dict[str, Any],
    ) -> None:
        """Record one finished operation: its duration, time to first chunk (streams)
        and token usage (when reported, one record per token type)."""
        self._duration.record(duration, attributes)
        if first_chunk is not None:
            self._ttfc.record(first_chunk, attributes)
        if usage is not None:
            record = self._token_usage.record
            record(usage.input_tokens, {**attributes, "gen_ai.token.type": "input"})
            record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})
