"""The standard 8-message turn: the built-in workload of ``scope bench``, shared by benchmarks/.

A realistic agent turn: a system prompt, a user message with text and a 4 KiB image, an
assistant message with reasoning (text and a signature) and two tool calls, a tool
message with two results (one with nested JSON details), and the final assistant answer.
Two messages carry metadata. Deterministic: every call builds equal values.
"""

from __future__ import annotations

import random

from scope.chat import (
    Message,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.jsonvalue import RawJSON
from scope.media import Media
from scope.metadata import Metadata

__all__ = ["standard_turn"]


def _image() -> bytes:
    rng = random.Random(4096)
    return bytes(rng.getrandbits(8) for _ in range(4096))


def standard_turn() -> list[Message]:
    """Eight messages: system, user (text + 4 KiB image), assistant (reasoning with a
    signature + two tool calls), tool (two results, one with nested JSON details), user,
    assistant (text), user, assistant (text); metadata on two messages."""
    image = Media.from_bytes("image/png", _image())
    details = RawJSON.parse(
        b'{"forecast": [{"day": "mon", "high": 21.50, "low": 12, "rain": 0.10},'
        b' {"day": "tue", "high": 19.0, "low": 1.1E1, "rain": 0.35}],'
        b' "source": {"name": "met", "retrieved_at": "2024-05-01T10:00:00Z", "ttl": 3600}}'
    )
    return [
        system_message(
            "You are a helpful travel assistant. Answer briefly, cite the tools you used, "
            "and never invent weather data."
        ),
        Message(
            user_message(
                "What's the weather in Lisbon this week, and is this photo from there?",
                media_part(image),
            ).role,
            user_message(
                "What's the weather in Lisbon this week, and is this photo from there?",
                media_part(image),
            ).parts,
            metadata=Metadata({"client": "web", "request_score": RawJSON.parse("0.750")}),
        ),
        assistant_message(
            reasoning_part(
                "The user wants a forecast and an image check. I will call the weather tool "
                "and the landmark tool in parallel.",
                signature=bytes(range(64)) * 2,
            ),
            tool_call_part("call_1", "get_weather", '{"city": "Lisbon", "days": 7}'),
            tool_call_part("call_2", "identify_landmark", '{"image": "img_0"}'),
        ),
        tool_message(
            ToolResult("call_1", "get_weather", ToolOutput.of_json(details)),
            ToolResult(
                "call_2",
                "identify_landmark",
                ToolOutput.of_text("Belém Tower, Lisbon (confidence 0.93)"),
            ),
        ),
        Message(
            assistant_message(
                "Lisbon will be mild: 21.5 °C on Monday, 19 °C on Tuesday with some rain. "
                "Your photo shows the Belém Tower, so yes, it is Lisbon."
            ).role,
            (
                text_part(
                    "Lisbon will be mild: 21.5 °C on Monday, 19 °C on Tuesday with some "
                    "rain. Your photo shows the Belém Tower, so yes, it is Lisbon."
                ),
            ),
            metadata=Metadata(
                {"model": "gpt-test", "latency_ms": 812, "cost": RawJSON.parse("1E-7")}
            ),
        ),
        user_message("Great. Should I pack an umbrella?"),
        assistant_message("Yes: Tuesday has a 35% chance of rain."),
        user_message("Thanks!"),
    ]
