"""A resent request (the browser posts the same body again after a dropped connection,
a proxy retries it) never stores its turn twice: ``ui_turn``/``agui_turn`` recognise
the new message by the client id stored with it. A resend of the stored head turn gets
it again, replayed from the store without a model call; one that overlaps the first
request waits for it (``on_overlap="wait"``) and gets its answer, or is refused
(``"reject"``); a turn kept unfinished is answered again in place; every other resend
(other content under the id, the id on a branch the chat left, turns after it) is a
``HistoryDivergedError``. Over the in-memory store and SQLite, asyncio and trio.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from scope.chat import (
    FinishReason,
    Output,
    Request,
    Response,
    Role,
    assistant_message,
    tool_call_part,
)
from scope.conversation import Conversation, TurnEvent, TurnEventKind
from scope.errors import (
    CommitError,
    HistoryChangedError,
    HistoryDivergedError,
    TurnInProgressError,
    TurnInterruptedError,
)
from scope.history.inmemory import InMemoryStore
from scope.historystores.sqlite import SQLiteStore
from scope.testing import FunctionModel
from scope.tools import tool
from scope.web import (
    CLIENT_MESSAGE_ID_KEY,
    ResumableTurns,
    agui_events,
    agui_turn,
    chat_request_from_ui,
    run_input_from_agui,
    ui_message_stream,
    ui_turn,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryStore()
        return
    async with await SQLiteStore.open(tmp_path / "chats.db") as sqlite:
        yield sqlite


class Answers:
    """Answers each question with its number; ``gate`` (when set) holds every answer
    until it is set; ``until(n)`` returns once the model was called ``n`` times."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.gate: anyio.Event | None = None
        self._called = anyio.Event()

    async def __call__(self, request: Request) -> str:
        question = request.messages[-1].text
        self.asked.append(question)
        number = len(self.asked)
        called, self._called = self._called, anyio.Event()
        called.set()
        if self.gate is not None:
            await self.gate.wait()
        return f"answer {number} to {question}"

    async def until(self, calls: int) -> None:
        while len(self.asked) < calls:
            await self._called.wait()


def chat(store: Any, answers: Answers, **options: Any) -> Conversation:
    return Conversation(FunctionModel(answers), store, "chat", **options)


async def finish(events: Any) -> tuple[str, list[TurnEvent[Any]]]:
    """The turn's answer text and all its events (run to the end)."""
    seen: list[TurnEvent[Any]] = []
    async with contextlib.aclosing(events):
        async for event in events:
            seen.append(event)
    assert seen[-1].result is not None
    return str(seen[-1].result.output), seen


def ui(text: str, message_id: str, **body: Any) -> Any:
    last = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
    return chat_request_from_ui({"id": "chat", "messages": [last], **body})


def user(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": text}


def agui(*messages: dict[str, Any]) -> Any:
    return run_input_from_agui({"threadId": "chat", "runId": "r", "messages": list(messages)})


async def texts(store: Any) -> list[str]:
    return [m.text for m in await store.read("chat")]


async def batches(store: Any) -> int:
    return len((await store.read_tree("chat")).batches)


# ------------------------------------------------------------------ after completion


async def test_a_resent_submit_gets_the_stored_turn_again(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers)
    first, _ = await finish(await ui_turn(conversation, ui("q1", "u1")))
    before = await store.read_tree("chat")
    again, events = await finish(await ui_turn(conversation, ui("q1", "u1")))
    assert again == first == "answer 1 to q1"
    assert answers.asked == ["q1"]  # no second model call
    assert await store.read_tree("chat") == before  # nothing stored, nothing moved
    result = events[-1].result
    assert result is not None and result.steps == 1
    assert result.messages == tuple(before.batches[0].messages)
    assert result.response.output is not None
    assert result.response.output.finish_reason is FinishReason.STOP
    # Encoded, the client assembles the stored answer.
    body = b"".join(
        [d async for d in ui_message_stream(await ui_turn(conversation, ui("q1", "u1")))]
    )
    assert b'"delta":"answer 1 to q1"' in body
    assert body.endswith(b'data: {"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n')
    assert answers.asked == ["q1"]


async def test_a_resent_agui_run_gets_the_stored_turn_again(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers)
    await finish(await agui_turn(conversation, agui(user("q1", "u1"))))
    second = agui(user("q1", "u1"), {"id": "a1", "role": "assistant"}, user("q2", "u2"))
    await finish(await agui_turn(conversation, second))
    before = await store.read_tree("chat")
    for on_divergence in ("refuse", "edit"):
        again, _ = await finish(await agui_turn(conversation, second, on_divergence=on_divergence))
        assert again == "answer 2 to q2"
    body = b"".join(
        [
            d
            async for d in agui_events(
                await agui_turn(conversation, second), thread_id="chat", run_id="r"
            )
        ]
    )
    assert b'"delta":"answer 2 to q2"' in body and b"RUN_FINISHED" in body
    assert answers.asked == ["q1", "q2"]
    assert await store.read_tree("chat") == before


async def test_a_replayed_turn_carries_its_tool_calls_and_results(store: Any) -> None:
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    def answer(request: Request) -> Response | str:
        if request.messages[-1].role is Role.USER:
            call = tool_call_part("c1", "weather", '{"city": "Oslo"}')
            message = assistant_message(call)
            return Response(Output(message, FinishReason.TOOL_CALLS))
        return "it is sunny"

    conversation = Conversation(FunctionModel(answer), store, "chat", tools=[weather])
    _, live = await finish(await ui_turn(conversation, ui("weather?", "u1")))
    text, replayed = await finish(await ui_turn(conversation, ui("weather?", "u1")))
    assert text == "it is sunny"
    kinds = [e.kind for e in replayed]
    assert kinds == [
        TurnEventKind.CHUNK,
        TurnEventKind.TOOL_CALL,
        TurnEventKind.TOOL_RESULT,
        TurnEventKind.CHUNK,
        TurnEventKind.DONE,
    ]
    assert replayed[1].tool_call == live[-1].result.messages[1].tool_calls[0]  # type: ignore[union-attr]
    assert replayed[2].tool_result is not None
    assert replayed[2].tool_result.output.text() == "sunny in Oslo"
    assert replayed[-1].result is not None and replayed[-1].result.steps == 2
    assert replayed[-1].result.messages == live[-1].result.messages  # type: ignore[union-attr]
    body = b"".join(
        [d async for d in ui_message_stream(await ui_turn(conversation, ui("weather?", "u1")))]
    )
    assert b'"type":"tool-input-available"' in body and b'"type":"tool-output-available"' in body
    assert await batches(store) == 1


async def test_a_resent_edit_gets_the_edited_turn_again(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers)
    await finish(await ui_turn(conversation, ui("q1", "u1")))
    edit = ui("q1, edited", "u1", messageId="u1")
    assert (await finish(await ui_turn(conversation, edit)))[0] == "answer 2 to q1, edited"
    before = await store.read_tree("chat")
    assert (await finish(await ui_turn(conversation, edit)))[0] == "answer 2 to q1, edited"
    assert answers.asked == ["q1", "q1, edited"]
    assert await store.read_tree("chat") == before
    # Another edit of the same message is a new turn, as before.
    other = ui("q1, edited twice", "u1", messageId="u1")
    assert (await finish(await ui_turn(conversation, other)))[0] == "answer 3 to q1, edited twice"
    assert await texts(store) == ["q1, edited twice", "answer 3 to q1, edited twice"]


async def test_a_resent_agui_edit_gets_the_edited_turn_again(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers)
    await finish(await agui_turn(conversation, agui(user("q1", "u1"))))
    # The client edited its message and kept the id: the divergence rules apply.
    edited = agui(user("q1, edited", "u1"))
    with pytest.raises(HistoryDivergedError, match="the client dropped turn 1") as caught:
        await agui_turn(conversation, edited)
    assert caught.value.turn == 1
    answer, _ = await finish(await agui_turn(conversation, edited, on_divergence="edit"))
    assert answer == "answer 2 to q1, edited"
    before = await store.read_tree("chat")
    # Its resend is the stored head turn now: it gets it again.
    answer, _ = await finish(await agui_turn(conversation, edited, on_divergence="edit"))
    assert answer == "answer 2 to q1, edited"
    assert answers.asked == ["q1", "q1, edited"]
    assert await store.read_tree("chat") == before


# ------------------------------------------------------------------ refused resends


async def two_turns(store: Any, answers: Answers) -> Conversation:
    conversation = chat(store, answers)
    await finish(await ui_turn(conversation, ui("q1", "u1")))
    await finish(await ui_turn(conversation, ui("q2", "u2")))
    return conversation


@pytest.mark.parametrize(
    ("text", "message_id", "problem", "turn"),
    [
        ("q2, changed", "u2", "'u2' is already stored as turn 2, with other content", 2),
        ("q1", "u1", "'u1' is already stored as turn 1, and 1 more turn follow", 1),
    ],
)
async def test_a_resend_that_is_not_the_stored_head_turn_is_diverged(
    store: Any, text: str, message_id: str, problem: str, turn: int
) -> None:
    answers = Answers()
    conversation = await two_turns(store, answers)
    before = await store.read_tree("chat")
    with pytest.raises(HistoryDivergedError, match=problem) as caught:
        await ui_turn(conversation, ui(text, message_id))
    assert (caught.value.turn, caught.value.message_id) == (turn, message_id)
    assert caught.value.conversation_id == "chat"
    assert len(answers.asked) == 2
    assert await store.read_tree("chat") == before


async def test_a_late_resend_of_a_turn_on_a_left_branch_is_diverged(store: Any) -> None:
    answers = Answers()
    conversation = await two_turns(store, answers)
    await finish(await ui_turn(conversation, ui("q1b", "u1", messageId="u1")))  # u2 left behind
    before = await store.read_tree("chat")
    with pytest.raises(HistoryDivergedError, match="on a branch the conversation has left"):
        await ui_turn(conversation, ui("q2", "u2"))
    # The original submit of u1, resent after the edit: u1 holds other content now.
    with pytest.raises(HistoryDivergedError, match="with other content"):
        await ui_turn(conversation, ui("q1", "u1"))
    assert len(answers.asked) == 3
    assert await store.read_tree("chat") == before
    # AG-UI: the same id rules.
    with pytest.raises(HistoryDivergedError, match="on a branch the conversation has left"):
        await agui_turn(conversation, agui(user("q1b", "u1"), user("q2", "u2")))
    with pytest.raises(HistoryDivergedError, match="already stored, but not as turn 1"):
        await agui_turn(conversation, agui(user("q2", "u2")))
    # With on_divergence="edit" a run of its new message alone is a new turn: the id on a
    # left branch is the same late resend.
    with pytest.raises(HistoryDivergedError, match="on a branch the conversation has left"):
        await agui_turn(conversation, agui(user("q2", "u2")), on_divergence="edit")
    assert len(answers.asked) == 3
    assert await store.read_tree("chat") == before


async def test_a_retried_agui_run_with_turns_after_it_is_diverged(store: Any) -> None:
    answers = Answers()
    conversation = await two_turns(store, answers)
    for on_divergence in ("refuse", "edit"):
        with pytest.raises(
            HistoryDivergedError, match="'u1' is already stored as turn 1"
        ) as caught:
            await agui_turn(conversation, agui(user("q1", "u1")), on_divergence=on_divergence)
        assert (caught.value.turn, caught.value.message_id) == (1, "u1")
    assert len(answers.asked) == 2 and await batches(store) == 2


async def test_a_message_without_an_id_is_a_new_turn_each_time(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers)
    body = {"id": "chat", "messages": [{"role": "user", "parts": [{"type": "text", "text": "q"}]}]}
    for _ in range(2):
        await finish(await ui_turn(conversation, chat_request_from_ui(body)))
    assert await texts(store) == ["q", "answer 1 to q", "q", "answer 2 to q"]


# ------------------------------------------------------------------ during the run


async def overlapping(answers: Answers, first: Any, resend: Any, *, calls: int = 1) -> Any:
    """Run ``first`` until its model was called, then ``resend`` (its request read
    before the first turn is stored) until every task is blocked and the model was
    called ``calls`` times, then let the model answer; the outcomes."""
    answers.gate = anyio.Event()
    outcomes: dict[str, Any] = {}

    async def drive(name: str, events: Any) -> None:
        try:
            outcomes[name] = (await finish(events))[0]
        except Exception as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(drive, "first", await first())
        await answers.until(1)
        group.start_soon(drive, "resend", await resend())
        await answers.until(calls)
        await anyio.wait_all_tasks_blocked()  # the resend waits (or was refused)
        answers.gate.set()
    return outcomes


async def test_a_resend_that_overlaps_the_first_waits_for_its_turn(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers, on_overlap="wait")
    outcomes = await overlapping(
        answers,
        lambda: ui_turn(conversation, ui("q1", "u1")),
        lambda: ui_turn(conversation, ui("q1", "u1")),
    )
    assert outcomes == {"first": "answer 1 to q1", "resend": "answer 1 to q1"}
    assert answers.asked == ["q1"]
    assert await texts(store) == ["q1", "answer 1 to q1"] and await batches(store) == 1


async def test_an_agui_resend_that_overlaps_the_first_waits_for_its_turn(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers, on_overlap="wait")
    outcomes = await overlapping(
        answers,
        lambda: agui_turn(conversation, agui(user("q1", "u1"))),
        lambda: agui_turn(conversation, agui(user("q1", "u1"))),
    )
    assert outcomes == {"first": "answer 1 to q1", "resend": "answer 1 to q1"}
    assert answers.asked == ["q1"] and await batches(store) == 1


async def test_another_message_that_overlaps_still_waits_and_runs(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers, on_overlap="wait")
    outcomes = await overlapping(
        answers,
        lambda: ui_turn(conversation, ui("q1", "u1")),
        lambda: ui_turn(conversation, ui("q2", "u2")),
    )
    assert outcomes == {"first": "answer 1 to q1", "resend": "answer 2 to q2"}
    assert await texts(store) == ["q1", "answer 1 to q1", "q2", "answer 2 to q2"]


@pytest.mark.parametrize("protocol", ["ui", "agui"])
async def test_a_resend_that_overlaps_the_first_is_rejected(store: Any, protocol: str) -> None:
    answers = Answers()
    conversation = chat(store, answers, on_overlap="reject")

    def turn() -> Any:
        if protocol == "ui":
            return ui_turn(conversation, ui("q1", "u1"))
        return agui_turn(conversation, agui(user("q1", "u1")))

    outcomes = await overlapping(answers, turn, turn)
    assert outcomes["first"] == "answer 1 to q1"
    assert isinstance(outcomes["resend"], TurnInProgressError)
    assert answers.asked == ["q1"] and await batches(store) == 1
    # Once stored, the resend gets the turn.
    assert (await finish(await turn()))[0] == "answer 1 to q1"
    assert answers.asked == ["q1"]


async def test_with_the_fence_alone_an_overlapping_resend_is_not_stored(store: Any) -> None:
    # on_overlap="fence" takes no lease: both requests call the model (the docs say to
    # prefer "reject", "wait" or "interrupt"), and the fence stores the turn once.
    answers = Answers()
    conversation = chat(store, answers)
    outcomes = await overlapping(
        answers,
        lambda: ui_turn(conversation, ui("q1", "u1")),
        lambda: ui_turn(conversation, ui("q1", "u1")),
        calls=2,
    )
    failed = [o for o in outcomes.values() if isinstance(o, CommitError)]
    assert len(failed) == 1 and not failed[0].retryable
    assert isinstance(failed[0].__cause__, HistoryChangedError)
    assert await batches(store) == 1
    assert (await texts(store))[0] == "q1"


@pytest.mark.parametrize("keep_interrupted", [False, True])
async def test_a_resend_that_interrupts_the_first_stores_the_turn_once(
    store: Any, keep_interrupted: bool
) -> None:
    answers = Answers()
    conversation = chat(store, answers, on_overlap="interrupt", keep_interrupted=keep_interrupted)
    outcomes = await overlapping(
        answers,
        lambda: ui_turn(conversation, ui("q1", "u1")),
        lambda: ui_turn(conversation, ui("q1", "u1")),
        calls=2,
    )
    assert isinstance(outcomes["first"], TurnInterruptedError)
    assert outcomes["resend"] == "answer 2 to q1"
    stored = await store.read("chat")
    assert [m.text for m in stored] == ["q1", "answer 2 to q1"]  # once, answered
    assert stored[0].metadata.decode(CLIENT_MESSAGE_ID_KEY) == "u1"
    # With keep_interrupted the unfinished first copy stays, on a side branch.
    assert await batches(store) == (2 if keep_interrupted else 1)


async def test_a_resend_of_a_turn_kept_unfinished_answers_it_in_place(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers, keep_interrupted=True)
    events = await ui_turn(conversation, ui("q1", "u1"))
    async with contextlib.aclosing(events):
        async for _ in events:
            break  # the browser went away: the turn is kept, marked interrupted
    assert (await store.read("chat"))[-1].metadata.decode("scope/interrupted") == "stopped"
    answer, _ = await finish(await ui_turn(conversation, ui("q1", "u1")))
    assert answer == "answer 2 to q1"
    assert await texts(store) == ["q1", "answer 2 to q1"]
    assert await batches(store) == 2  # the unfinished copy is kept on its branch
    # AG-UI alike.
    events = await agui_turn(conversation, agui(user("q1", "u1"), user("q2", "u2")))
    async with contextlib.aclosing(events):
        async for _ in events:
            break
    again = agui(user("q1", "u1"), user("q2", "u2"))
    assert (await finish(await agui_turn(conversation, again)))[0] == "answer 4 to q2"
    assert await texts(store) == ["q1", "answer 2 to q1", "q2", "answer 4 to q2"]


async def test_a_resend_through_resumable_turns_streams_the_stored_answer(store: Any) -> None:
    answers = Answers()
    conversation = chat(store, answers, on_overlap="wait")
    answers.gate = anyio.Event()
    async with ResumableTurns() as turns:
        first = ui_message_stream(await ui_turn(conversation, ui("q1", "u1")), message_id="m1")
        await turns.start("chat", first)
        await answers.until(1)
        resend = ui_message_stream(await ui_turn(conversation, ui("q1", "u1")), message_id="m2")
        async with anyio.create_task_group() as group:

            async def start_resend() -> None:
                await turns.start("chat", resend)

            group.start_soon(start_resend)
            await anyio.wait_all_tasks_blocked()
            answers.gate.set()
        body = b"".join([data async for data in turns.stream("chat")])
    assert b'"messageId":"m2"' in body and b'"delta":"answer 1 to q1"' in body
    assert b'"finishReason":"stop"' in body
    assert answers.asked == ["q1"]
    assert await texts(store) == ["q1", "answer 1 to q1"] and await batches(store) == 1
