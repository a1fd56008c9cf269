"""Conversation ``output_retries``: an answer that does not decode into ``output=``'s type
is sent back to the model with the error, at most N times; every attempt is stored as a
valid user/assistant sequence any adapter sends; the result counts the retries.
asyncio and trio.
"""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    Role,
    assistant_message,
    tool_call_part,
    user_message,
)
from scope.conversation import Conversation, TurnEventKind, TurnResult
from scope.errors import HistoryChangedError, InvalidResponseError, MaxStepsError
from scope.history import Batch, Receipt, Unfenced
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.tools import tool
from tests.helpers import PROVIDERS, Provider, body_of

pytestmark = pytest.mark.anyio

RETRY_KEY = "scope/output_retry"


@attrs.frozen
class Forecast:
    city: str
    celsius: int


GOOD = '{"city": "Lisbon", "celsius": 21}'
MISSING = '{"city": "Lisbon"}'
NOT_JSON = "Lisbon, 21"


def answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


def calls(*parts: tuple[str, str, str]) -> Response:
    message = assistant_message(*(tool_call_part(i, n, a) for i, n, a in parts))
    return Response(Output(message, FinishReason.TOOL_CALLS))


@tool
def station(city: str) -> str:
    """The weather station of a city.

    :param city: the city
    """
    return f"{city}-1"


# ------------------------------------------------------------------ one retry


async def test_a_bad_answer_is_sent_back_once_by_default_and_the_next_decodes() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer(MISSING), answer(GOOD))
    result = await Conversation(model, store, "c").ask("Weather?", output=Forecast)
    assert result.output == Forecast("Lisbon", 21)
    assert result.output_retries == 1
    assert result.steps == 2
    stored = await store.read("c")
    assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]
    assert [m.text for m in stored][:2] == ["Weather?", MISSING]
    feedback = stored[2]
    assert feedback.text == (
        "Your answer cannot be used: the answer does not decode into Forecast: $.celsius: "
        "required field missing. Answer again with only the JSON document the response "
        "format describes."
    )
    assert feedback.metadata.decode(RETRY_KEY) == 1
    assert list(result.messages) == stored
    # The retry replays the stored attempt and asks for the same format.
    retry = model.requests[1]
    assert [m.text for m in retry.messages] == ["Weather?", MISSING, feedback.text]
    assert retry.options.output_format == model.requests[0].options.output_format


async def test_an_answer_that_is_not_json_is_sent_back_naming_that() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer(NOT_JSON), answer(GOOD))
    result = await Conversation(model, store, "c").ask("Weather?", output=Forecast)
    assert result.output == Forecast("Lisbon", 21) and result.output_retries == 1
    sent_back = model.requests[1].messages[-1].text or ""
    assert sent_back.startswith("Your answer cannot be used: the answer is not JSON (")
    assert "expected Forecast" in sent_back


async def test_a_good_first_answer_takes_no_retry_and_text_turns_are_unchanged() -> None:
    model = ScriptedModel(answer(GOOD), answer("plain text {"))
    conversation = Conversation(model, InMemoryStore(), "c")
    result = await conversation.ask("Weather?", output=Forecast, output_retries=3)
    assert result.output_retries == 0 and result.steps == 1
    text = await conversation.ask("Say something", output_retries=3)  # no output=: text
    assert text.output == "plain text {" and text.output_retries == 0
    assert len(model.requests) == 2


def test_a_turn_result_made_without_the_count_has_zero() -> None:
    result = TurnResult(answer("x"), "x", 1, ())
    assert result.output_retries == 0


# ------------------------------------------------------------------ the bound


async def test_after_n_retries_the_last_error_is_raised_and_every_attempt_is_stored() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer(MISSING), answer(NOT_JSON), answer('{"city": 3}'))
    with pytest.raises(InvalidResponseError) as caught:
        await Conversation(model, store, "c").ask("Weather?", output=Forecast, output_retries=2)
    assert str(caught.value).startswith("the answer does not decode into Forecast: ")
    assert str(caught.value).endswith(
        ", after 2 output retries (output_retries); every answer is stored"
    )
    assert len(model.requests) == 3
    stored = await store.read("c")
    assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT] * 3
    assert [m.metadata.decode(RETRY_KEY) for m in stored[2::2]] == [1, 2]


async def test_one_retry_exhausted_says_retry() -> None:
    model = ScriptedModel(answer(MISSING), answer(MISSING))
    with pytest.raises(InvalidResponseError, match=r"after 1 output retry \(output_retries\)"):
        await Conversation(model, InMemoryStore(), "c").ask("Weather?", output=Forecast)


async def test_zero_retries_raise_the_first_error_unchanged() -> None:
    model = ScriptedModel(answer(MISSING))
    with pytest.raises(InvalidResponseError) as caught:
        await Conversation(model, InMemoryStore(), "c").ask(
            "Weather?", output=Forecast, output_retries=0
        )
    assert str(caught.value) == (
        "the answer does not decode into Forecast: $.celsius: required field missing; the "
        "turn is stored"
    )


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, "output_retries must be an int >= 0, got -1"),
        (True, TypeError, "output_retries must be an int >= 0, got bool"),
        ("2", TypeError, "output_retries must be an int >= 0, got str"),
        (1.0, TypeError, "output_retries must be an int >= 0, got float"),
    ],
)
async def test_output_retries_must_be_an_int_of_zero_or_more(
    value: Any, error: type[Exception], message: str
) -> None:
    model = ScriptedModel(answer(GOOD))
    conversation = Conversation(model, InMemoryStore(), "c")
    with pytest.raises(error) as caught:
        await conversation.ask("x", output=Forecast, output_retries=value)
    assert str(caught.value) == message
    with pytest.raises(error):  # refused when called, before the first iteration
        conversation.stream("x", output=Forecast, output_retries=value)
    with pytest.raises(error):
        conversation.stream_regenerate(output=Forecast, output_retries=value)
    with pytest.raises(error):
        conversation.stream_edit(1, "x", output=Forecast, output_retries=value)
    with pytest.raises(error):
        await conversation.regenerate(output=Forecast, output_retries=value)
    with pytest.raises(error):
        await conversation.edit(1, "x", output=Forecast, output_retries=value)
    assert model.requests == []


# ------------------------------------------------------------------ with tools, streams


async def test_a_retry_may_call_tools_before_it_answers() -> None:
    store = InMemoryStore()
    model = ScriptedModel(
        answer(MISSING),
        calls(("c1", "station", '{"city": "Lisbon"}')),
        answer(GOOD),
    )
    conversation = Conversation(model, store, "c", tools=[station], max_steps=2)
    result = await conversation.ask("Weather?", output=Forecast)
    assert result.output == Forecast("Lisbon", 21)
    assert result.steps == 3 and result.output_retries == 1  # max_steps counts per attempt
    stored = await store.read("c")
    assert [m.role for m in stored] == [
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert list(result.messages) == stored


async def test_a_retry_that_runs_out_of_steps_keeps_the_stored_attempt() -> None:
    store = InMemoryStore()
    model = ScriptedModel(
        answer(MISSING),
        calls(("c1", "station", '{"city": "Lisbon"}')),
    )
    conversation = Conversation(model, store, "c", tools=[station], max_steps=1)
    with pytest.raises(MaxStepsError) as caught:
        await conversation.ask("Weather?", output=Forecast)
    assert str(caught.value).endswith(
        "nothing of the turn was stored; the 1 answer(s) sent back (output_retries) stay stored"
    )
    assert [m.text for m in await store.read("c")] == ["Weather?", MISSING]


async def test_streamed_events_show_both_answers_and_the_result_counts_the_retry() -> None:
    model = ScriptedModel(answer(MISSING), answer(GOOD))
    conversation = Conversation(model, InMemoryStore(), "c")
    chunks: list[str] = []
    results: list[TurnResult[Any]] = []
    async with contextlib.aclosing(conversation.stream("Weather?", output=Forecast)) as events:
        async for event in events:
            if event.kind is TurnEventKind.CHUNK:
                assert event.chunk is not None
                chunks.append(event.chunk.text)
            elif event.kind is TurnEventKind.DONE:
                assert event.result is not None
                results.append(event.result)
    assert "".join(chunks) == MISSING + GOOD
    assert [r.output for r in results] == [Forecast("Lisbon", 21)]
    assert results[0].output_retries == 1


# ------------------------------------------------------------------ where the retry runs


class InterposingStore(InMemoryStore):
    """Stores another turn right after the first append, as a second process would."""

    def __init__(self) -> None:
        super().__init__()
        self.interposed = False

    async def append(self, batch: Batch, **kwargs: Any) -> Receipt:
        receipt = await super().append(batch, **kwargs)
        if not self.interposed:
            self.interposed = True
            other = Conversation(ScriptedModel(answer("other")), self, batch.conversation_id)
            await other.ask("someone else")
        return receipt


async def test_a_retry_runs_only_on_the_head_the_bad_answer_made() -> None:
    store = InterposingStore()
    model = ScriptedModel(answer(MISSING), answer(GOOD))
    with pytest.raises(HistoryChangedError):
        await Conversation(model, store, "c").ask("Weather?", output=Forecast)
    assert len(model.requests) == 1  # refused before the model was called again
    assert [m.text for m in await store.read("c")] == [
        "Weather?",
        MISSING,
        "someone else",
        "other",
    ]


async def test_retries_of_a_pinned_turn_and_of_a_regenerated_one() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer(GOOD), answer(MISSING), answer(GOOD), answer("{}"), answer(GOOD))
    conversation = Conversation(model, store, "c")
    await conversation.ask("first", output=Forecast)
    head = (await store.read_view("c")).head
    pinned = await conversation.ask("second", output=Forecast, expected_head=head)
    assert pinned.output_retries == 1
    # regenerate() answers the last turn again with its own user message: the retry
    # (kept on the old branch) is part of it.
    regenerated = await conversation.regenerate(output=Forecast)
    assert regenerated.output_retries == 1 and regenerated.output == Forecast("Lisbon", 21)
    assert [m.text for m in model.requests[3].messages] == ["first", GOOD, "second"]
    texts = [m.text for m in await store.read("c")]
    assert texts[:3] == ["first", GOOD, "second"] and texts[-1] == GOOD
    assert len(texts) == 6
    # An explicit turn number counts the stored batches, the retry's too.
    assert len((await store.read_tree("c")).head_path()) == 3


# ------------------------------------------------------------------ replays to any model


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
async def test_the_stored_attempts_replay_validly_to_every_adapter(provider: Provider) -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer(MISSING), answer(GOOD), answer("Sunny."))
    conversation = Conversation(model, store, "c")
    await conversation.ask("Weather?", output=Forecast)
    await conversation.ask("Thanks")  # the next turn replays the attempts
    replayed = model.requests[2]
    assert [m.role for m in replayed.messages] == [Role.USER, Role.ASSISTANT] * 2 + [Role.USER]
    body = body_of(provider, Request((*await store.read("c"), user_message("More?"))))
    assert "Answer again with only the JSON document" in str(body)


class ReadAppendOnly:
    """A store with read and append only: no views, so no head to pin a retry to."""

    def __init__(self) -> None:
        self.inner = InMemoryStore()

    async def read(self, conversation_id: str) -> list[Message]:
        return await self.inner.read(conversation_id)

    async def append(self, batch: Batch) -> Receipt:
        return await self.inner.append(batch)


async def test_a_store_without_views_retries_unpinned() -> None:
    store = ReadAppendOnly()
    model = ScriptedModel(answer(MISSING), answer(GOOD))
    result = await Conversation(model, store, "c", layers=(Unfenced(),)).ask(
        "Weather?", output=Forecast
    )
    assert result.output_retries == 1
    assert [m.text for m in await store.read("c")][::2] == ["Weather?", result.messages[2].text]
    assert len(await store.read("c")) == 4


async def test_a_windowed_conversation_retries_through_its_window() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer(GOOD), answer(MISSING), answer(GOOD))
    conversation = Conversation(model, store, "c", limit=3)
    await conversation.ask("first", output=Forecast)
    result = await conversation.ask("second", output=Forecast)
    assert result.output_retries == 1
    # The retry replays at most 3 messages (the window, from a user message), not the
    # whole history.
    replayed = [m.text for m in model.requests[2].messages]
    assert replayed == ["second", MISSING, result.messages[2].text]
    assert len(await store.read("c")) == 6
