"""A Pydantic model (nested models, an enum, optionals, constrained fields, a validator)
round-trips through every adapter (tests.helpers.PROVIDERS), by call, against its
loopback server: the model's schema goes out as the tool's parameters and as the output
format, every request body is checked against the provider SDK's types, the recorded tool
call (its arguments rewritten) decodes into the model, and the recorded answer (its text
rewritten to a JSON document) decodes into the model as ``output=``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from scope.conversation import Conversation
from scope.history.inmemory import InMemoryStore
from tests.conversation.test_tools_pydantic import FORECAST, VALID, Forecast, forecast
from tests.helpers import ANTHROPIC, GEMINI, INTERACTIONS, OPENAI, RESPONSES, Provider

pytestmark = pytest.mark.anyio

#: The recorded turns: a call of get_weather, then an answer of ANSWERS.
TRANSCRIPTS = [
    (OPENAI, ["tool_turn"]),
    (ANTHROPIC, ["thinking_tool_turn"]),
    (GEMINI, ["tool_turn"]),
    (RESPONSES, ["reasoning_tool_turn", "reasoning_final_answer"]),
    (INTERACTIONS, ["tool_call", "text"]),
]
#: The recorded answers' texts (each rewritten to REQUEST's JSON).
ANSWERS = ("It is 18°C and sunny in Paris.", INTERACTIONS.text_answer)
REQUEST: dict[str, Any] = orjson.loads(VALID)["request"]


def _rewrite(value: Any) -> Any:
    """A recorded exchange with its get_weather call calling forecast with REQUEST (as
    each wire spells arguments: a JSON text or an object) and its answer REQUEST's JSON."""
    if isinstance(value, dict):
        out = {key: _rewrite(item) for key, item in value.items()}
        if out.get("name") == "get_weather":
            out["name"] = "forecast"
            for key in ("arguments", "input", "args"):
                if key in out:
                    arguments = {"request": REQUEST}
                    # As the wire spells them: a JSON text where it had one, else an object.
                    text = isinstance(value[key], str)
                    out[key] = orjson.dumps(arguments).decode() if text else arguments
        return out
    if isinstance(value, list):
        return [_rewrite(item) for item in value]
    if value in ANSWERS:
        return orjson.dumps(REQUEST).decode()
    return value


@pytest.mark.parametrize(("provider", "transcripts"), TRANSCRIPTS, ids=str)
async def test_a_pydantic_model_round_trips_as_a_tool_argument_and_as_output(
    provider: Provider, transcripts: list[str]
) -> None:
    exchanges = [
        _rewrite(exchange) for name in transcripts for exchange in provider.load_transcript(name)
    ]
    with provider.serve() as server:  # every body checked against the SDK's types on exit
        server.script(*exchanges)
        async with provider.make(server.base_url) as model:
            conversation = Conversation(model, InMemoryStore(), "c", tools=[forecast])
            result = await conversation.ask("Plan the forecast.", output=Forecast)
        bodies = server.bodies()
    expected = forecast.decode(VALID)["request"]
    assert result.output == expected
    assert len(bodies) == 2
    # The model's schema went out verbatim: as the tool's parameters, and as the output
    # format (Anthropic's Messages API has none: there the format is an instruction).
    schemas = [v for v in _values(bodies[0]) if v == FORECAST]
    assert len(schemas) == (1 if provider is ANTHROPIC else 2)
    # The tool ran on the decoded model: its output (the model dumped) went back.
    dumped = expected.model_dump(mode="json", by_alias=True)
    assert dumped in list(_values(bodies[1]))


def _values(value: Any) -> Iterator[Any]:
    """Every value in a JSON document, and the document of each string that is one."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _values(item)
    elif isinstance(value, str) and value.startswith("{"):
        try:
            inner = orjson.loads(value)
        except orjson.JSONDecodeError:
            return
        yield from _values(inner)
