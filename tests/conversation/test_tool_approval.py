"""Durable tool approval (issue 46, DESIGN §6f/§6h/§6n): ``@tool(requires_approval=...)``;
a turn that reaches such a call is stored with the call pending and returns
``TurnResult.pending``; ``approve``/``deny`` from any process (a new ``Conversation``, a
new process on SQLite and PostgreSQL) resume it; of two racing decisions exactly one
wins, the other raises ``NotPendingError``; ``pending()`` reads the store; erasure removes
them. asyncio and trio (the in-memory store and SQLite), PostgreSQL under asyncio.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Response,
    Role,
    ToolCall,
    assistant_message,
    tool_call_part,
)
from scope.conversation import Conversation, TurnEventKind
from scope.errors import (
    ApprovalPendingError,
    ConversationClosedError,
    HistoryError,
    NoOutputError,
    NotPendingError,
)
from scope.history import Batch, branches, erase, erase_owner
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.tools import ToolContext, tool
from tests.servers import fresh_backend, over_backends

pytestmark = pytest.mark.anyio

APPROVAL_KEY = "scope/approval"
ROOT = Path(__file__).resolve().parents[2]


def answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


def calls(*parts: tuple[str, str, str]) -> Response:
    message = assistant_message(*(tool_call_part(i, n, a) for i, n, a in parts))
    return Response(Output(message, FinishReason.TOOL_CALLS))


RAN: list[str] = []


@tool(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file.

    :param path: the file
    """
    RAN.append(f"delete {path}")
    return f"deleted {path}"


@tool
def look(path: str) -> str:
    """Look at a file.

    :param path: the file
    """
    RAN.append(f"look {path}")
    return f"saw {path}"


SEEN: list[ToolContext[Any]] = []


def outside_tmp(arguments: dict[str, Any], context: ToolContext[Any]) -> bool:
    SEEN.append(context)
    return not str(arguments["path"]).startswith("/tmp/")


@tool(requires_approval=outside_tmp)
def remove(path: str) -> str:
    """Remove a file; outside /tmp only once approved.

    :param path: the file
    """
    RAN.append(f"remove {path}")
    return f"removed {path}"


@pytest.fixture(autouse=True)
def _clean() -> None:
    RAN.clear()
    SEEN.clear()


DELETE_A = ("c1", "delete", '{"path": "a"}')
LOOK_B = ("c2", "look", '{"path": "b"}')


def marks(messages: Any) -> list[Any]:
    return [m.metadata[APPROVAL_KEY].value() for m in messages if APPROVAL_KEY in m.metadata]


def result_texts(message: Message) -> list[tuple[str, str, bool]]:
    out = []
    for part in message.parts:
        result = part.tool_result
        assert result is not None
        out.append((result.id, result.output.text(), result.is_error))
    return out


# ------------------------------------------------------------------ the pending turn


async def test_a_call_that_needs_approval_is_stored_pending_and_the_other_runs_at_once() -> None:
    store = InMemoryStore()
    model = ScriptedModel(calls(DELETE_A, LOOK_B))
    result = await Conversation(model, store, "c", tools=[delete, look]).ask("Clean up")
    assert result.pending == (ToolCall("c1", "delete", '{"path": "a"}'),)
    with pytest.raises(NoOutputError) as caught:
        result.output  # noqa: B018 (typed str: a waiting turn has none, so it raises)
    assert str(caught.value) == (
        "the turn waits for a decision on tool call(s) 'c1' and has no output yet: check "
        "TurnResult.pending, and read the output of the turn Conversation.approve/deny "
        "finish"
    )
    assert result.steps == 1
    assert RAN == ["look b"]  # the tool without requires_approval ran in the same response
    stored = await store.read("c")
    assert stored == list(result.messages)
    assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert marks(stored) == [["c1"]]
    assert result_texts(stored[2]) == [("c2", "saw b", False)]
    # pending() reads the store: a new Conversation object sees it.
    fresh = Conversation(ScriptedModel(), store, "c", tools=[delete, look])
    assert await fresh.pending() == (ToolCall("c1", "delete", '{"path": "a"}'),)


async def test_a_turn_without_approval_tools_is_unchanged() -> None:
    store = InMemoryStore()
    model = ScriptedModel(calls(LOOK_B), answer("done"))
    conversation = Conversation(model, store, "c", tools=[look])
    result = await conversation.ask("Look")
    assert (result.output, result.pending, RAN) == ("done", (), ["look b"])
    assert await conversation.pending() == ()


async def test_the_stream_gives_every_call_the_immediate_results_and_the_pending_result() -> None:
    store = InMemoryStore()
    model = ScriptedModel(calls(DELETE_A, LOOK_B))
    conversation = Conversation(model, store, "c", tools=[delete, look])
    kinds, results, done = [], [], None
    async for event in conversation.stream("Clean up"):
        kinds.append(event.kind)
        if event.tool_result is not None:
            results.append(event.tool_result.id)
        if event.result is not None:
            done = event.result
    assert kinds.count(TurnEventKind.TOOL_CALL) == 2
    assert results == ["c2"]
    assert kinds[-1] is TurnEventKind.DONE
    assert done is not None and [c.id for c in done.pending] == ["c1"]


async def test_a_new_turn_while_a_call_waits_is_refused_before_the_model_is_called() -> None:
    store = InMemoryStore()
    model = ScriptedModel(calls(DELETE_A), answer("never"))
    conversation = Conversation(model, store, "c", tools=[delete])
    await conversation.ask("Delete a")
    with pytest.raises(ApprovalPendingError, match="'c1'") as caught:
        await conversation.ask("Something else")
    assert isinstance(caught.value, HistoryError)
    assert caught.value.call_ids == ("c1",)
    assert caught.value.conversation_id == "c"
    assert len(model.requests) == 1
    assert len(await store.read("c")) == 2


# ------------------------------------------------------------------ decisions


async def test_approve_from_a_new_conversation_runs_the_tool_and_finishes_the_turn() -> None:
    store = InMemoryStore()
    await Conversation(
        ScriptedModel(calls(DELETE_A, LOOK_B)), store, "c", tools=[delete, look]
    ).ask("Clean up")
    model = ScriptedModel(answer("Deleted a, saw b."), answer("You're welcome."))
    later = Conversation(model, store, "c", tools=[delete, look])
    result = await later.approve("c1")
    assert (result.output, result.pending, result.steps) == ("Deleted a, saw b.", (), 1)
    assert RAN == ["look b", "delete a"]
    # The model saw both results, in call order.
    sent = model.requests[0].messages
    assert sent[-1].role is Role.TOOL
    assert result_texts(sent[-1]) == [("c1", "deleted a", False), ("c2", "saw b", False)]
    # Stored as one turn, as a turn that never waited, with no mark left.
    stored = await store.read("c")
    assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert stored == list(result.messages)
    assert marks(stored) == []
    assert await later.pending() == ()
    # It replays to any model (ScriptedModel checks every request as a provider would).
    assert (await later.ask("Thanks")).output == "You're welcome."
    # Nothing deleted: the waiting turn stays in the tree, on a branch of its own.
    assert len(await branches(store, "c")) >= 2


async def test_deny_answers_the_call_with_an_error_carrying_the_reason() -> None:
    store = InMemoryStore()
    await Conversation(ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete]).ask("Delete a")
    model = ScriptedModel(answer("I won't delete it."))
    result = await Conversation(model, store, "c", tools=[delete]).deny("c1", "not today")
    assert result.output == "I won't delete it."
    assert RAN == []
    [(call_id, text, is_error)] = result_texts(model.requests[0].messages[-1])
    assert (call_id, is_error) == ("c1", True)
    assert "denied" in text and "not today" in text


async def test_several_waiting_calls_are_decided_one_by_one() -> None:
    store = InMemoryStore()
    first = calls(DELETE_A, ("c3", "delete", '{"path": "z"}'))
    conversation = Conversation(ScriptedModel(first), store, "c", tools=[delete])
    assert [c.id for c in (await conversation.ask("Delete a and z")).pending] == ["c1", "c3"]
    model = ScriptedModel(answer("Deleted a; z stays."))
    later = Conversation(model, store, "c", tools=[delete])
    partial = await later.approve("c3")
    assert [c.id for c in partial.pending] == ["c1"]
    assert model.requests == []
    with pytest.raises(NoOutputError, match=r"tool call\(s\) 'c1' and has no output"):
        partial.output  # noqa: B018
    assert [c.id for c in await later.pending()] == ["c1"]
    assert RAN == ["delete z"]
    with pytest.raises(NotPendingError):
        await later.approve("c3")  # decided already
    result = await later.deny("c1", "keep a")
    assert (result.output, result.pending) == ("Deleted a; z stays.", ())
    texts = result_texts(model.requests[0].messages[-1])
    assert [t[0] for t in texts] == ["c1", "c3"]  # call order
    assert texts[1] == ("c3", "deleted z", False) and texts[0][2] is True
    assert RAN == ["delete z"]


DENIED_KEY = "scope/denied"


def denial_marks(message: Message) -> list[Any]:
    """Per tool-result part of a tool message: its denial mark's value, or None."""
    return [
        part.metadata[DENIED_KEY].value() if DENIED_KEY in part.metadata else None
        for part in message.parts
    ]


async def test_a_denied_result_is_marked_with_its_reason_where_it_is_stored() -> None:
    # Deny one call, approve the other, of one response: the denial's mark survives the
    # second decision and the resumed turn; the approved result has none. The model is
    # sent both results, the mark with its part (scope metadata: adapters read their own).
    store = InMemoryStore()
    first = calls(DELETE_A, ("c3", "delete", '{"path": "z"}'))
    await Conversation(ScriptedModel(first), store, "c", tools=[delete]).ask("Delete a and z")
    model = ScriptedModel(answer("z is gone, a stays."))
    conversation = Conversation(model, store, "c", tools=[delete])
    partial = await conversation.deny("c1", "keep a")
    assert denial_marks(partial.messages[-1]) == ["keep a"]
    result = await conversation.approve("c3")
    assert result.output == "z is gone, a stays."
    sent = model.requests[0].messages[-1]
    assert [t[0] for t in result_texts(sent)] == ["c1", "c3"]
    assert denial_marks(sent) == ["keep a", None]
    history = await store.read("c")
    assert [m.role for m in history] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert denial_marks(history[2]) == ["keep a", None]
    assert marks(history) == []


async def test_the_denied_result_event_carries_the_reason_and_an_approved_one_none() -> None:
    store = InMemoryStore()
    first = calls(DELETE_A, ("c3", "delete", '{"path": "z"}'))
    await Conversation(ScriptedModel(first), store, "c", tools=[delete]).ask("Delete a and z")
    conversation = Conversation(ScriptedModel(answer("Done.")), store, "c", tools=[delete])
    denied, _ = [event async for event in conversation.stream_deny("c3", "keep z")]
    assert (denied.kind, denied.denied) == (TurnEventKind.TOOL_RESULT, "keep z")
    approved, *_ = [event async for event in conversation.stream_approve("c1")]
    assert (approved.kind, approved.denied) == (TurnEventKind.TOOL_RESULT, None)


async def test_a_result_stored_before_the_denial_mark_still_resumes() -> None:
    # A waiting turn stored by an older scope: a decided call's error result without the
    # mark. Deciding the other call keeps that result as it was stored.
    store = InMemoryStore()
    first = calls(DELETE_A, ("c3", "delete", '{"path": "z"}'))
    await Conversation(ScriptedModel(first), store, "c", tools=[delete]).ask("Delete a and z")
    conversation = Conversation(ScriptedModel(answer("Done.")), store, "c", tools=[delete])
    await conversation.deny("c1", "keep a")
    tree = await store.read_tree("c")
    *head, tool = tree.batches[tree.head].messages
    assert denial_marks(tool) == ["keep a"]
    unmarked = Message(Role.TOOL, [attrs.evolve(part, metadata={}) for part in tool.parts])
    legacy = InMemoryStore()
    await legacy.append(Batch("c", "legacy", (*head, unmarked), 0))
    later = Conversation(ScriptedModel(answer("Done.")), legacy, "c", tools=[delete])
    result = await later.approve("c3")
    assert result.output == "Done."
    assert denial_marks((await legacy.read("c"))[2]) == [None, None]


async def test_a_resumed_turn_that_asks_for_another_approval_waits_again() -> None:
    store = InMemoryStore()
    await Conversation(ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete]).ask("Delete")
    model = ScriptedModel(calls(("c9", "delete", '{"path": "b"}')), answer("Both gone."))
    later = Conversation(model, store, "c", tools=[delete])
    again = await later.approve("c1")
    assert [c.id for c in again.pending] == ["c9"]
    assert [m.role for m in await store.read("c")] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert (await later.approve("c9")).output == "Both gone."
    assert RAN == ["delete a", "delete b"]
    assert marks(await store.read("c")) == []


async def test_a_resumed_turn_that_fails_leaves_the_decided_turn_as_the_head() -> None:
    store = InMemoryStore()
    await Conversation(ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete]).ask("Delete")
    failing = ScriptedModel(RuntimeError("provider down"))
    later = Conversation(failing, store, "c", tools=[delete])
    with pytest.raises(RuntimeError, match="provider down"):
        await later.approve("c1")
    assert RAN == ["delete a"]
    assert await later.pending() == ()  # decided: never taken again
    with pytest.raises(NotPendingError):
        await later.approve("c1")
    stored = await store.read("c")
    assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert marks(stored) == [[]]
    # Its calls all have results: a new turn replays it to any model.
    model = ScriptedModel(answer("ok"))
    assert (await Conversation(model, store, "c", tools=[delete]).ask("And?")).output == "ok"
    assert RAN == ["delete a"]


async def test_regenerate_moves_on_from_a_waiting_turn() -> None:
    store = InMemoryStore()
    model = ScriptedModel(calls(DELETE_A), answer("I'd rather not delete anything."))
    conversation = Conversation(model, store, "c", tools=[delete])
    await conversation.ask("Delete a")
    result = await conversation.regenerate()
    assert (result.output, result.pending) == ("I'd rather not delete anything.", ())
    assert await conversation.pending() == ()
    with pytest.raises(NotPendingError, match="no turn of it waits"):
        await conversation.approve("c1")
    assert RAN == []
    assert [m.text for m in await store.read("c")] == [
        "Delete a",
        "I'd rather not delete anything.",
    ]


async def test_a_predicate_decides_per_call_with_the_tool_context() -> None:
    store = InMemoryStore()
    first = calls(("c1", "remove", '{"path": "/tmp/x"}'), ("c2", "remove", '{"path": "/etc/y"}'))
    conversation = Conversation(
        ScriptedModel(first), store, "c", tools=[remove], owner="ana", deps="pool"
    )
    result = await conversation.ask("Remove them")
    assert [c.id for c in result.pending] == ["c2"]
    assert RAN == ["remove /tmp/x"]
    assert [(c.conversation_id, c.owner, c.deps) for c in SEEN] == [("c", "ana", "pool")] * 2


async def test_a_call_with_bad_arguments_needs_no_approval_and_never_runs() -> None:
    store = InMemoryStore()
    model = ScriptedModel(calls(("c1", "remove", '{"nope": 1}')), answer("sorry"))
    result = await Conversation(model, store, "c", tools=[remove]).ask("Remove")
    assert (result.output, result.pending, RAN, SEEN) == ("sorry", (), [], [])


@attrs.frozen
class Verdict:
    deleted: bool


async def test_the_resumed_turn_decodes_output_and_sends_a_bad_answer_back() -> None:
    store = InMemoryStore()
    first = Conversation(ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete])
    waiting = await first.ask("Delete a", output=Verdict)
    assert [c.id for c in waiting.pending] == ["c1"]
    with pytest.raises(NoOutputError):
        waiting.output  # noqa: B018
    model = ScriptedModel(answer("yes"), answer('{"deleted": true}'))
    result = await Conversation(model, store, "c", tools=[delete]).approve("c1", output=Verdict)
    assert (result.output, result.output_retries) == (Verdict(True), 1)
    assert model.requests[0].options.output_format is not None
    assert marks(await store.read("c")) == []


@pytest.mark.parametrize(
    "options",
    [{"on_overlap": "reject"}, {"on_overlap": "wait"}, {"limit": 4}, {"keep_interrupted": True}],
    ids=["reject", "wait", "window", "keep_interrupted"],
)
async def test_approval_works_with_leases_windows_and_kept_turns(options: dict[str, Any]) -> None:
    store = InMemoryStore()
    await Conversation(ScriptedModel(answer("hi")), store, "c", **options).ask("Hello")
    first = ScriptedModel(calls(DELETE_A), answer("never"))
    conversation = Conversation(first, store, "c", tools=[delete], **options)
    assert [c.id for c in (await conversation.ask("Delete a")).pending] == ["c1"]
    with pytest.raises(ApprovalPendingError):
        await conversation.ask("Other")
    model = ScriptedModel(answer("Deleted."), answer("Bye."))
    later = Conversation(model, store, "c", tools=[delete], **options)
    assert (await later.approve("c1")).output == "Deleted."
    assert (await later.ask("Thanks")).output == "Bye."
    assert [m.text for m in await store.read("c")][-3:] == ["Deleted.", "Thanks", "Bye."]


# ------------------------------------------------------------------ races


class _Barrier:
    """A store handle whose ``read_tree`` returns only once ``n`` callers have read: the
    decisions racing have all seen the call pending."""

    def __init__(self, store: Any, event: anyio.Event, counter: list[int], n: int) -> None:
        self._store, self._event, self._counter, self._n = store, event, counter, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def read(self, conversation_id: str) -> list[Message]:
        return list(await self._store.read(conversation_id))

    async def append(self, batch: Any, **kwargs: Any) -> Any:
        return await self._store.append(batch, **kwargs)

    async def read_tree(self, conversation_id: str) -> Any:
        tree = await self._store.read_tree(conversation_id)
        self._counter[0] += 1
        if self._counter[0] >= self._n:
            self._event.set()
        await self._event.wait()
        return tree


async def _race(stores: list[Any]) -> None:
    await Conversation(ScriptedModel(calls(DELETE_A)), stores[0], "c", tools=[delete]).ask("Del")
    event, counter = anyio.Event(), [0]
    outcomes: list[object] = []

    async def decide(store: Any, index: int) -> None:
        model = ScriptedModel(answer(f"done {index}"))
        conversation = Conversation(model, _Barrier(store, event, counter, 2), "c", tools=[delete])
        try:
            outcomes.append((await conversation.approve("c1")).output)
        except NotPendingError as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as group:
        for index, store in enumerate(stores):
            group.start_soon(decide, store, index)
    won = [o for o in outcomes if isinstance(o, str)]
    lost = [o for o in outcomes if isinstance(o, NotPendingError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert lost[0].call_id == "c1" and "decided by another caller" in str(lost[0])
    assert RAN == ["delete a"]  # the loser ran nothing
    stored = await stores[0].read("c")
    assert stored[-1].text == won[0]
    assert marks(stored) == []


async def test_two_approvals_racing_on_one_call_exactly_one_wins() -> None:
    store = InMemoryStore()
    await _race([store, store])


@over_backends("sqlite", "postgres", "redis")
async def test_two_approvals_racing_from_two_store_handles(kind: str, tmp_path: Path) -> None:
    async with (
        fresh_backend(kind, tmp_path) as backend,
        await backend.open() as one,
        await backend.open() as two,
    ):
        await _race([one, two])


async def test_decisions_on_two_calls_of_one_turn_racing_both_land_or_say_so() -> None:
    store = InMemoryStore()
    first = calls(DELETE_A, ("c3", "delete", '{"path": "z"}'))
    await Conversation(ScriptedModel(first), store, "c", tools=[delete]).ask("Delete a and z")
    event, counter = anyio.Event(), [0]
    outcomes: dict[str, object] = {}

    async def decide(call_id: str) -> None:
        model = ScriptedModel(answer("both decided"))
        conversation = Conversation(model, _Barrier(store, event, counter, 2), "c", tools=[delete])
        try:
            outcomes[call_id] = await conversation.approve(call_id)
        except NotPendingError as exc:
            outcomes[call_id] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(decide, "c1")
        group.start_soon(decide, "c3")
    # One decision moved the head first; the other read the turn again and was taken on
    # what the first stored, or (the first still in flight) said so: never lost silently.
    left = [c.id for c in await Conversation(ScriptedModel(), store, "c", tools=[delete]).pending()]
    errors = [k for k, v in outcomes.items() if isinstance(v, NotPendingError)]
    assert left == errors
    for call_id in left:
        model = ScriptedModel(answer("both decided"))
        await Conversation(model, store, "c", tools=[delete]).approve(call_id)
    assert sorted(RAN) == ["delete a", "delete z"]
    stored = await store.read("c")
    assert stored[-1].text == "both decided" and marks(stored) == []


async def test_stream_approve_gives_the_decided_result_then_the_resumed_turn() -> None:
    store = InMemoryStore()
    first = calls(DELETE_A, ("c3", "delete", '{"path": "z"}'))
    await Conversation(ScriptedModel(first), store, "c", tools=[delete]).ask("Delete a and z")
    conversation = Conversation(ScriptedModel(answer("Done.")), store, "c", tools=[delete])
    events = [event async for event in conversation.stream_deny("c3", "keep z")]
    assert [e.kind for e in events] == [TurnEventKind.TOOL_RESULT, TurnEventKind.DONE]
    assert events[0].tool_result is not None and events[0].tool_result.is_error
    assert events[1].result is not None and [c.id for c in events[1].result.pending] == ["c1"]
    events = [event async for event in conversation.stream_approve("c1")]
    kinds = [e.kind for e in events]
    assert kinds[0] is TurnEventKind.TOOL_RESULT and kinds[-1] is TurnEventKind.DONE
    assert TurnEventKind.CHUNK in kinds
    assert "".join(e.chunk.text for e in events if e.chunk is not None) == "Done."
    final = events[-1].result
    assert final is not None and (final.output, final.pending) == ("Done.", ())
    assert RAN == ["delete a"]


async def test_a_stream_approve_stopped_early_leaves_the_decided_turn_the_head() -> None:
    store = InMemoryStore()
    await Conversation(ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete]).ask("Del")
    conversation = Conversation(
        ScriptedModel(answer("Done, a is gone.")), store, "c", tools=[delete]
    )
    events = conversation.stream_approve("c1")
    async for event in events:
        if event.kind is TurnEventKind.CHUNK:
            break
    await events.aclose()
    assert RAN == ["delete a"]
    stored = await store.read("c")
    assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert marks(stored) == [[]] and await conversation.pending() == ()


# ------------------------------------------------------------------ another process

_CHILD = """
import json, sys
import anyio
from scope.chat import FinishReason, Output, Response, assistant_message
from scope.conversation import Conversation
from scope.testing import ScriptedModel
from tests.conversation.test_tool_approval import RAN, delete, look
from tests.servers import Backend
from pathlib import Path

async def main(kind, url, prefix, call_id):
    backend = Backend.__new__(Backend)
    backend.kind, backend.url, backend.prefix = kind, url, prefix
    async with await backend.open() as store:
        conversation = Conversation(
            ScriptedModel(Response(Output(assistant_message("Deleted a."), FinishReason.STOP))),
            store, "c", tools=[delete, look],
        )
        pending = [c.id for c in await conversation.pending()]
        result = await conversation.approve(call_id)
        print(json.dumps({"pending": pending, "output": result.output, "ran": RAN}))

anyio.run(main, *sys.argv[1:5])
"""


@over_backends("sqlite", "postgres")
async def test_an_approval_from_another_process_resumes_the_turn(kind: str, tmp_path: Path) -> None:
    async with fresh_backend(kind, tmp_path) as backend:
        async with await backend.open() as store:
            model = ScriptedModel(calls(DELETE_A, LOOK_B))
            result = await Conversation(model, store, "c", tools=[delete, look]).ask("Clean up")
            assert [c.id for c in result.pending] == ["c1"]
        # The process that ran the turn is gone from here on: a new one decides.
        child = await anyio.run_process(
            [sys.executable, "-c", _CHILD, kind, backend.url, backend.prefix, "c1"],
            cwd=ROOT,
            check=False,
        )
        assert child.returncode == 0, child.stderr.decode()
        report = json.loads(child.stdout.decode().strip().splitlines()[-1])
        assert report == {"pending": ["c1"], "output": "Deleted a.", "ran": ["delete a"]}
        assert RAN == ["look b"]  # here, only the tool that ran at once
        async with await backend.open() as store:
            stored = await store.read("c")
            assert [m.role for m in stored] == [
                Role.USER,
                Role.ASSISTANT,
                Role.TOOL,
                Role.ASSISTANT,
            ]
            assert stored[-1].text == "Deleted a." and marks(stored) == []
            conversation = Conversation(ScriptedModel(), store, "c", tools=[delete, look])
            assert await conversation.pending() == ()
            with pytest.raises(NotPendingError):
                await conversation.approve("c1")


_RACER = """
import json, sys
import anyio
from scope.chat import FinishReason, Output, Response, assistant_message
from scope.conversation import Conversation
from scope.errors import NotPendingError
from scope.testing import ScriptedModel
from tests.conversation.test_tool_approval import RAN, delete
from tests.servers import Backend

async def main(kind, url, prefix, name):
    backend = Backend.__new__(Backend)
    backend.kind, backend.url, backend.prefix = kind, url, prefix
    async with await backend.open() as store:
        done = Response(Output(assistant_message(name), FinishReason.STOP))
        conversation = Conversation(ScriptedModel(done), store, "c", tools=[delete])
        print("ready", flush=True)
        sys.stdin.readline()  # both processes start deciding together
        try:
            output = (await conversation.approve("c1")).output
            print(json.dumps({"won": output, "ran": RAN}))
        except NotPendingError as exc:
            print(json.dumps({"lost": str(exc), "ran": RAN}))

anyio.run(main, *sys.argv[1:5])
"""


def _run_racers(kind: str, url: str, prefix: str) -> list[dict[str, Any]]:
    """Two processes that each approve call c1 once both are ready; their reports."""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, kind, url, prefix, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for name in ("one", "two")
    ]
    reports = []
    try:
        for racer in racers:
            assert racer.stdout is not None
            assert racer.stdout.readline() == "ready\n"
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        for racer in racers:
            out, err = racer.communicate()
            assert racer.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    return reports


@over_backends("sqlite", "postgres")
async def test_two_processes_approving_one_call_exactly_one_wins(kind: str, tmp_path: Path) -> None:
    async with fresh_backend(kind, tmp_path) as backend:
        async with await backend.open() as store:
            model = ScriptedModel(calls(DELETE_A))
            await Conversation(model, store, "c", tools=[delete]).ask("Delete a")
        reports = await anyio.to_thread.run_sync(_run_racers, kind, backend.url, backend.prefix)
        won = [r for r in reports if "won" in r]
        lost = [r for r in reports if "lost" in r]
        assert len(won) == 1 and len(lost) == 1, reports
        assert won[0]["ran"] == ["delete a"] and lost[0]["ran"] == []
        async with await backend.open() as store:
            stored = await store.read("c")
            assert stored[-1].text == won[0]["won"] and marks(stored) == []


# ------------------------------------------------------------------ erasure


async def test_erasing_the_conversation_erases_its_pending_approvals() -> None:
    store = InMemoryStore()
    conversation = Conversation(ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete])
    await conversation.ask("Delete a")
    assert [c.id for c in await conversation.pending()] == ["c1"]
    await erase(store, "c")
    assert await conversation.pending() == ()
    with pytest.raises(ConversationClosedError):
        await conversation.approve("c1")
    with pytest.raises(ConversationClosedError):
        await conversation.deny("c1", "gone")
    assert RAN == []


@over_backends("sqlite", "postgres", "redis")
async def test_erase_owner_erases_pending_approvals_on_every_store(
    kind: str, tmp_path: Path
) -> None:
    async with fresh_backend(kind, tmp_path) as backend, await backend.open() as store:
        conversation = Conversation(
            ScriptedModel(calls(DELETE_A)), store, "c", tools=[delete], owner="ana"
        )
        await conversation.ask("Delete a")
        assert [c.id for c in await conversation.pending()] == ["c1"]
        [receipt] = await erase_owner(store, "ana")
        assert await store.check_erased(receipt) == []
        assert await conversation.pending() == ()
        with pytest.raises(ConversationClosedError):
            await conversation.approve("c1")
        assert RAN == []


# ------------------------------------------------------------------ bad input


def test_requires_approval_must_be_a_bool_or_callable() -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="requires_approval must be a bool or a predicate"):
        tool(requires_approval="yes")(f)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="requires_approval must be a bool or a predicate"):
        tool(requires_approval=1)(f)  # type: ignore[call-overload]
    assert tool(requires_approval=True)(f).requires_approval is True
    assert tool(f).requires_approval is False


async def test_a_predicate_that_returns_no_bool_fails_the_turn_with_nothing_run() -> None:
    @tool(requires_approval=lambda arguments, context: "yes")  # type: ignore[arg-type,return-value]
    def wipe(path: str) -> str:
        """Wipe."""
        RAN.append(path)
        return path

    store = InMemoryStore()
    model = ScriptedModel(calls(("c1", "wipe", '{"path": "a"}')))
    with pytest.raises(TypeError, match="requires_approval must return a bool, got str"):
        await Conversation(model, store, "c", tools=[wipe]).ask("Wipe")
    assert RAN == [] and await store.read("c") == []


async def test_a_predicate_that_raises_fails_the_turn_with_nothing_run() -> None:
    def broken(arguments: dict[str, Any], context: ToolContext[Any]) -> bool:
        raise LookupError("no policy")

    @tool(requires_approval=broken)
    def wipe(path: str) -> str:
        """Wipe."""
        RAN.append(path)
        return path

    store = InMemoryStore()
    model = ScriptedModel(calls(("c1", "wipe", '{"path": "a"}')))
    with pytest.raises(LookupError, match="no policy"):
        await Conversation(model, store, "c", tools=[wipe]).ask("Wipe")
    assert RAN == [] and await store.read("c") == []


async def test_bad_decisions_raise_before_any_io() -> None:
    store = InMemoryStore()
    conversation = Conversation(ScriptedModel(), store, "c", tools=[delete])
    bad: list[tuple[Any, type[Exception], str]] = [
        (conversation.approve(1), TypeError, "call_id must be a str, got int"),
        (conversation.approve(""), ValueError, "call_id must be a non-empty str"),
        (conversation.deny(None, "r"), TypeError, "call_id must be a str, got NoneType"),
        (conversation.deny("c1", 3), TypeError, "reason must be a str, got int"),
        (conversation.deny("c1", "  "), ValueError, "reason must be a non-empty str"),
        (conversation.approve("c1", output_retries=-1), ValueError, "output_retries"),
        (conversation.approve("c1", output_retries=True), TypeError, "output_retries"),
        (conversation.approve("c1", output=object()), TypeError, "output"),
    ]
    for coroutine, error, message in bad:
        with pytest.raises(error, match=message):
            await coroutine
    # The stream forms check when called, before the first iteration.
    with pytest.raises(TypeError, match="call_id must be a str"):
        conversation.stream_approve(b"c1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason must be a non-empty str"):
        conversation.stream_deny("c1", "")
    with pytest.raises(ValueError, match="output_retries"):
        conversation.stream_approve("c1", output_retries=-2)
    assert await store.read("c") == []


async def test_deciding_a_call_that_does_not_wait_is_not_pending_error() -> None:
    store = InMemoryStore()
    conversation = Conversation(ScriptedModel(answer("hi")), store, "c", tools=[delete])
    with pytest.raises(NotPendingError, match="no turn of it waits") as caught:
        await conversation.approve("c1")
    assert (caught.value.conversation_id, caught.value.call_id) == ("c", "c1")
    await conversation.ask("Hello")
    with pytest.raises(NotPendingError):
        await conversation.deny("c1", "no")
    await Conversation(ScriptedModel(calls(DELETE_A)), store, "d", tools=[delete]).ask("Del")
    with pytest.raises(NotPendingError, match="the calls that wait are 'c1'"):
        await Conversation(ScriptedModel(), store, "d", tools=[delete]).approve("c7")


async def test_approval_needs_a_store_with_branches() -> None:
    class Plain:
        def __init__(self) -> None:
            self.inner = InMemoryStore()

        async def read(self, conversation_id: str) -> list[Message]:
            return await self.inner.read(conversation_id)

        async def append(self, batch: Any) -> Any:
            return await self.inner.append(batch)

    from scope.history import Unfenced

    conversation = Conversation(ScriptedModel(), Plain(), "c", tools=[look], layers=(Unfenced(),))
    with pytest.raises(TypeError, match="pending needs a store with branches"):
        await conversation.pending()
    with pytest.raises(TypeError, match="a tool with requires_approval needs a store"):
        Conversation(ScriptedModel(), Plain(), "c", tools=[delete], layers=(Unfenced(),))
