"""A turn whose structured answer was sent back (``output_retries``) is one turn to a
client: the user message that sent it back is none of the client's, so the next AG-UI
run is not a divergence, a resend gets the whole turn again (every answer replayed, the
retry counted), and regenerating or editing it replaces all of it. The encoders
restart the step of a retried answer (the UI stream's ``reset-step`` when asked for,
else a new step). Over the in-memory store, asyncio and trio.
"""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import orjson
import pytest

from scope.chat import FinishReason, Output, Request, Response, assistant_message
from scope.conversation import Conversation, TurnEvent, TurnEventKind
from scope.errors import InvalidResponseError
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from scope.web import (
    agui_events,
    agui_turn,
    chat_request_from_ui,
    run_input_from_agui,
    ui_message_stream,
    ui_turn,
)

pytestmark = pytest.mark.anyio


@attrs.frozen
class Forecast:
    city: str
    celsius: int


class Answers:
    """The first answer to each question misses a field; the answer sent back decodes."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, request: Request) -> str:
        question = request.messages[-1].text or ""
        self.asked.append(question)
        if question.startswith("Your answer cannot be used"):
            return f'{{"city": "{request.messages[-3].text}", "celsius": {len(self.asked)}}}'
        return f'{{"city": "{question}"}}'


async def finish(events: Any) -> list[TurnEvent[Any]]:
    seen: list[TurnEvent[Any]] = []
    async with contextlib.aclosing(events):
        async for event in events:
            seen.append(event)
    return seen


def ui(text: str, message_id: str, **body: Any) -> Any:
    last = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
    return chat_request_from_ui({"id": "chat", "messages": [last], **body})


def user(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": text}


def agui(*messages: dict[str, Any]) -> Any:
    return run_input_from_agui({"threadId": "chat", "runId": "r", "messages": list(messages)})


async def test_a_resent_submit_replays_every_answer_of_the_retried_turn() -> None:
    store = InMemoryStore()
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), store, "chat")
    first = await finish(await ui_turn(conversation, ui("Lisbon", "u1"), output=Forecast))
    assert first[-1].result is not None and first[-1].result.output_retries == 1
    again = await finish(await ui_turn(conversation, ui("Lisbon", "u1"), output=Forecast))
    assert len(answers.asked) == 2  # replayed: no model call
    result = again[-1].result
    assert result is not None
    assert result.output == first[-1].result.output == Forecast("Lisbon", 2)
    assert result.output_retries == 1 and result.steps == 2
    assert result.messages == first[-1].result.messages
    chunks = [e.chunk.text for e in again if e.kind is TurnEventKind.CHUNK and e.chunk]
    assert chunks == ['{"city": "Lisbon"}', '{"city": "Lisbon", "celsius": 2}']


async def test_the_next_agui_run_after_a_retried_turn_is_no_divergence() -> None:
    store = InMemoryStore()
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), store, "chat")
    await finish(await agui_turn(conversation, agui(user("Lisbon", "u1")), output=Forecast))
    second = agui(user("Lisbon", "u1"), {"id": "a1", "role": "assistant"}, user("Porto", "u2"))
    events = await finish(await agui_turn(conversation, second, output=Forecast))
    assert events[-1].result is not None
    assert events[-1].result.output == Forecast("Porto", 4)
    # A resend of the first run's turn is diverged only because a turn follows it.
    texts = [m.text for m in await store.read("chat")]
    assert texts[0] == "Lisbon" and texts[4] == "Porto" and len(texts) == 8


async def test_regenerating_a_retried_turn_replaces_it_whole() -> None:
    store = InMemoryStore()
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), store, "chat")
    await finish(await ui_turn(conversation, ui("Lisbon", "u1"), output=Forecast))
    request = chat_request_from_ui(
        {
            "id": "chat",
            "trigger": "regenerate-message",
            "messages": [
                {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Lisbon"}]}
            ],
        }
    )
    events = await finish(await ui_turn(conversation, request, output=Forecast))
    assert events[-1].result is not None and events[-1].result.output == Forecast("Lisbon", 4)
    texts = [m.text for m in await store.read("chat")]
    assert len(texts) == 4 and texts[0] == "Lisbon"  # the head path: the new turn alone


async def test_a_resent_agui_run_of_a_retried_turn_gets_it_again() -> None:
    store = InMemoryStore()
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), store, "chat")
    await finish(await agui_turn(conversation, agui(user("Lisbon", "u1")), output=Forecast))
    for on_divergence in ("refuse", "edit"):
        events = await finish(
            await agui_turn(
                conversation,
                agui(user("Lisbon", "u1")),
                on_divergence=on_divergence,  # type: ignore[arg-type]
                output=Forecast,
            )
        )
        assert events[-1].result is not None
        assert events[-1].result.output == Forecast("Lisbon", 2)
        assert events[-1].result.output_retries == 1
    assert len(answers.asked) == 2


# ------------------------------------------------ the encoders: a restarted step


def _parts(data: bytes) -> list[dict[str, Any]]:
    lines = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(line) for line in lines if line != b"[DONE]"]


async def _encoded(encoded: Any) -> bytes:
    async with contextlib.aclosing(encoded):
        return b"".join([data async for data in encoded])


def _texts_by_step(parts: list[dict[str, Any]]) -> list[str]:
    """What an AI SDK client shows per step: ``reset-step`` drops the step's text."""
    steps: list[str] = []
    for part in parts:
        kind = part["type"]
        if kind == "start-step":
            steps.append("")
        elif kind == "reset-step":
            steps[-1] = ""
        elif kind == "text-delta":
            steps[-1] += part["delta"]
    return steps


@pytest.mark.parametrize("reset_step", [True, False])
async def test_a_retried_answer_restarts_its_step_in_the_ui_stream(reset_step: bool) -> None:
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), InMemoryStore(), "chat")
    turn = await ui_turn(conversation, ui("Lisbon", "u1"), output=Forecast)
    parts = _parts(await _encoded(ui_message_stream(turn, reset_step=reset_step)))
    kinds = [p["type"] for p in parts]
    assert kinds[0] == "start" and kinds[-1] == "finish" and "error" not in kinds
    assert parts[-1]["finishReason"] == "stop"
    if reset_step:
        # One step: the answer sent back is dropped, its block closed first.
        assert kinds.count("start-step") == kinds.count("finish-step") == 1
        assert kinds.count("reset-step") == 1
        reset = kinds.index("reset-step")
        assert kinds[reset - 1] == "text-end" and kinds[reset + 1] == "text-start"
        assert _texts_by_step(parts) == ['{"city": "Lisbon", "celsius": 2}']
    else:
        # An older client keeps both answers, each its own step, as stored.
        assert "reset-step" not in kinds
        assert kinds.count("start-step") == kinds.count("finish-step") == 2
        assert _texts_by_step(parts) == ['{"city": "Lisbon"}', '{"city": "Lisbon", "celsius": 2}']
    # Every block opened is closed, and block ids are not reused across the restart.
    starts = [p["id"] for p in parts if p["type"] == "text-start"]
    assert starts == [p["id"] for p in parts if p["type"] == "text-end"]
    assert len(set(starts)) == 2


async def test_a_resent_retried_turn_gets_the_same_reset() -> None:
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), InMemoryStore(), "chat")
    first = await ui_turn(conversation, ui("Lisbon", "u1"), output=Forecast)
    ran = _parts(await _encoded(ui_message_stream(first, reset_step=True)))
    again = await ui_turn(conversation, ui("Lisbon", "u1"), output=Forecast)
    replayed = _parts(await _encoded(ui_message_stream(again, reset_step=True)))
    assert len(answers.asked) == 2  # the resend called no model
    assert _texts_by_step(replayed) == _texts_by_step(ran)
    assert [p["type"] for p in replayed].count("reset-step") == 1


async def test_a_retried_answer_is_a_step_of_its_own_in_agui() -> None:
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), InMemoryStore(), "chat")
    turn = await agui_turn(conversation, agui(user("Lisbon", "u1")), output=Forecast)
    events = _parts(await _encoded(agui_events(turn, thread_id="chat", run_id="r")))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "RUN_FINISHED" and "RUN_ERROR" not in kinds
    assert [e["stepName"] for e in events if e["type"] == "STEP_STARTED"] == [
        "model-call-1",
        "model-call-2",
    ]
    assert kinds.count("STEP_FINISHED") == 2


async def test_a_model_stream_with_parts_after_its_finish_still_fails() -> None:
    # Only Conversation.stream restarts a step; a model's own stream may not.
    async def chunks() -> Any:
        yield Response(Output(assistant_message("a"), FinishReason.STOP))
        yield Response(Output(assistant_message("b")))

    encoded = ui_message_stream(chunks(), reset_step=True)
    parts = _parts(await _encoded(encoded))
    assert parts[-1]["type"] == "error" and "reset-step" not in [p["type"] for p in parts]
    assert isinstance(encoded.error, InvalidResponseError)


def test_reset_step_must_be_a_bool() -> None:
    async def nothing() -> Any:
        yield Response(Output(assistant_message("a"), FinishReason.STOP))

    with pytest.raises(TypeError, match="reset_step must be a bool"):
        ui_message_stream(nothing(), reset_step=1)  # type: ignore[arg-type]
