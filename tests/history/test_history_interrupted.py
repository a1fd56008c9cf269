"""Middleware(keep_interrupted=True): cancelled, stopped and failed turns are stored, marked."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    ResponseMetadata,
    StreamerFunc,
    ToolOutput,
    ToolResult,
    assistant_message,
    collect,
    reasoning_part,
    text_part,
    tool_call_delta_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import (
    CommitError,
    ConversationClosedError,
    InvalidResponseError,
    ProviderServerError,
    StoreError,
)
from scope.history import (
    Batch,
    IncompleteReason,
    IncompleteTurn,
    KeepInterrupted,
    Middleware,
    Receipt,
    _interrupted,
    erase,
    keyword_layers,
)
from scope.history.inmemory import InMemoryStore
from scope.testing import Fail, Hang, ScriptedModel
from tests.servers import fresh_store, over_backends

pytestmark = pytest.mark.anyio

CID = "conv-1"
QUESTION = Request([user_message("q")])
MARK = "scope/interrupted"


def answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP), ResponseMetadata(model="m"))


class CheckpointingStore(InMemoryStore):
    """The in-memory store with a cancellation point in each append, as every real
    store has (so an unshielded write would be cancelled)."""

    async def append(self, batch: Batch) -> Receipt:
        await anyio.lowlevel.checkpoint()
        return await super().append(batch)


class Reports(list[IncompleteTurn]):
    def __call__(self, turn: IncompleteTurn) -> None:
        self.append(turn)


def keeping(store: Any, **kwargs: Any) -> tuple[Middleware, Reports]:
    reports = Reports()
    mw = Middleware(store, store, CID, on_incomplete=reports, **kwargs, layers=(KeepInterrupted(),))
    return mw, reports


def marks(messages: list[Message]) -> list[Any]:
    return [m.metadata.decode(MARK) if MARK in m.metadata else None for m in messages]


async def cancel_after(stream: AsyncIterator[Response], chunks: int) -> tuple[list[str], int]:
    """Read ``chunks`` chunks, then cancel while the consumer waits for the next one:
    the texts seen and how many cancellations reached the consumer."""
    seen: list[str] = []
    reached = 0
    with anyio.CancelScope() as scope:
        try:
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for chunk in stream:
                    seen.append(chunk.text)
                    if len(seen) == chunks:
                        scope.cancel()
        except anyio.get_cancelled_exc_class():
            reached += 1
            raise
    assert scope.cancelled_caught
    return seen, reached


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_keep_interrupted_must_be_a_bool(value: object) -> None:
    store = InMemoryStore()
    with pytest.raises(
        TypeError, match=f"keep_interrupted must be a bool, got {type(value).__name__}"
    ):
        Middleware(store, store, CID, layers=keyword_layers(keep_interrupted=value))  # type: ignore[arg-type]
    assert Middleware(store, store, CID).keep_interrupted is False
    assert Middleware(store, store, CID, layers=(KeepInterrupted(),)).keep_interrupted is True


def test_an_unknown_reason_is_refused_and_interrupted_is_known() -> None:
    turn = (user_message("q"),)
    with pytest.raises(
        ValueError, match=r"one of \['cancelled', 'error', 'interrupted', 'stopped'\], got 'late'"
    ):
        _interrupted.interrupted_batch(CID, "a1", turn, None, "late", None)  # type: ignore[arg-type]
    batch = _interrupted.interrupted_batch(CID, "a1", turn, None, "interrupted", 3)  # type: ignore[arg-type]
    assert marks(list(batch.messages)) == ["interrupted"]
    assert batch.expected_length == 3


# ---------------------------------------------------------------- streams


@over_backends("sqlite", "postgres", "redis")
async def test_cancelled_mid_stream_stores_the_question_and_the_partial_answer(
    kind: str, tmp_path: Path
) -> None:
    async with fresh_store(kind, tmp_path) as store:
        await _cancelled_mid_stream(store)


async def test_cancelled_mid_stream_in_memory() -> None:
    await _cancelled_mid_stream(CheckpointingStore())


async def _cancelled_mid_stream(store: Any) -> None:
    mw, reports = keeping(store)
    model = ScriptedModel(Hang(after=2, script=answer("hello world")))
    seen, reached = await cancel_after(mw.stream(model).stream(QUESTION), 2)
    assert seen == ["hell", "o wo"]
    assert reached == 1
    stored = await store.read(CID)
    assert [(m.role, m.text) for m in stored] == [("user", "q"), ("assistant", "hello wo")]
    assert marks(stored) == [None, "cancelled"]
    assert model.streams[0].closed and model.streams[0].outcome == "cancelled"
    (report,) = reports
    assert report.reason is IncompleteReason.CANCELLED
    assert report.kept is not None and list(report.kept.messages) == stored
    assert report.batch is None


async def test_early_stop_is_stored_as_stopped() -> None:
    store = InMemoryStore()
    mw, reports = keeping(store)
    model = ScriptedModel(answer("hello world"))
    stream = mw.stream(model).stream(QUESTION)
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for _chunk in stream:
            break
    stored = await store.read(CID)
    assert [m.text for m in stored] == ["q", "hell"]
    assert marks(stored) == [None, "stopped"]
    assert model.streams[0].outcome == "stopped"
    assert [r.reason for r in reports] == [IncompleteReason.STOPPED]
    assert reports[0].kept is not None


async def test_early_stop_under_a_cancelled_scope_is_still_stored() -> None:
    # The consumer's scope is cancelled; aclose() runs the shielded write regardless.
    store = CheckpointingStore()
    mw, _ = keeping(store)
    stream = mw.stream(ScriptedModel(answer("hello world"))).stream(QUESTION)
    with anyio.CancelScope() as scope:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            await stream.__anext__()
            scope.cancel()
            await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert marks(await store.read(CID)) == [None, "stopped"]


async def test_inner_error_is_stored_as_error_and_propagates_unchanged() -> None:
    store = InMemoryStore()
    mw, reports = keeping(store)
    error = ProviderServerError("dropped", status_code=502)
    model = ScriptedModel(Fail(error, after=3, script=answer("hello world")))
    with pytest.raises(ProviderServerError) as info:
        await collect(mw.stream(model).stream(QUESTION))
    assert info.value is error
    assert info.value.__cause__ is None and info.value.__context__ is None
    stored = await store.read(CID)
    assert [m.text for m in stored] == ["q", "hello world"[:12]]
    assert marks(stored) == [None, "error"]
    assert [r.reason for r in reports] == [IncompleteReason.ERROR]
    assert reports[0].error is error


async def test_nothing_received_yet_marks_the_user_message() -> None:
    store = InMemoryStore()
    mw, _ = keeping(store)
    with pytest.raises(ProviderServerError):
        await collect(mw.stream(ScriptedModel(ProviderServerError("503"))).stream(QUESTION))
    stored = await store.read(CID)
    assert [m.text for m in stored] == ["q"]
    assert marks(stored) == ["error"]


async def test_cancelled_before_the_first_chunk_marks_the_user_message() -> None:
    store = CheckpointingStore()
    mw, _ = keeping(store)
    with anyio.move_on_after(0.05) as scope:
        await collect(mw.stream(ScriptedModel(Hang())).stream(QUESTION))
    assert scope.cancelled_caught
    assert marks(await store.read(CID)) == ["cancelled"]


async def test_tool_calls_in_flight_are_dropped_text_and_reasoning_kept() -> None:
    store = InMemoryStore()
    mw, _ = keeping(store)
    chunks = [
        Response(
            Output(assistant_message(reasoning_part("think", b"sig"))),
            ResponseMetadata(model="m"),
        ),
        Response(Output(assistant_message(text_part("let me look")))),
        Response(Output(assistant_message(tool_call_part("c0", "done", "{}")))),
        Response(Output(assistant_message(tool_call_delta_part("c1", "lookup", '{"q"')))),
    ]
    provenance = Message(
        "assistant", (text_part(" it up"),), {"scope/provider": "p", "scope/model": "m"}
    )
    model = ScriptedModel(
        Fail(ProviderServerError("gone"), after=5, script=[*chunks, Response(Output(provenance))])
    )
    with pytest.raises(ProviderServerError):
        await collect(mw.stream(model).stream(QUESTION))
    stored = await store.read(CID)
    assert len(stored) == 2
    kept = stored[1]
    assert [p.kind for p in kept.parts] == ["reasoning", "text", "text"]
    assert kept.parts[0].signature == b"sig"
    assert kept.text == "let me look it up"
    assert kept.metadata.decode("scope/provider") == "p"
    assert kept.metadata.decode(MARK) == "error"


async def test_only_tool_call_deltas_received_marks_the_user_message() -> None:
    store = InMemoryStore()
    mw, _ = keeping(store)
    delta = Response(Output(assistant_message(tool_call_delta_part("c1", "lookup", "{"))))
    seen, _ = await cancel_after(
        mw.stream(ScriptedModel(Hang(after=1, script=[delta]))).stream(QUESTION), 1
    )
    assert len(seen) == 1
    stored = await store.read(CID)
    assert [m.role for m in stored] == ["user"] and marks(stored) == ["cancelled"]


async def test_a_tool_follow_up_keeps_its_complete_call_and_result_pairs() -> None:
    store = InMemoryStore()
    mw, _ = keeping(store)
    calls = assistant_message(tool_call_part("c1", "lookup", "{}"))
    follow_up = Request(
        [
            user_message("q"),
            calls,
            tool_message(ToolResult("c1", "lookup", ToolOutput.of_text("42"))),
        ]
    )
    _seen, _ = await cancel_after(
        mw.stream(ScriptedModel(Hang(after=1, script=answer("it is 42")))).stream(follow_up), 1
    )
    stored = await store.read(CID)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1] == calls
    assert marks(stored) == [None, None, None, "cancelled"]
    # The next turn replays the interrupted one without complaint.
    model = ScriptedModel(answer("again"))
    await collect(mw.stream(model).stream(Request([user_message("and now?")])))
    assert [m.text for m in model.requests[0].messages] == ["q", "", "", "it i", "and now?"]
    assert len(await store.read(CID)) == 6


async def test_a_turn_that_landed_meanwhile_fences_the_interrupted_one_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryStore()
    mw, reports = keeping(store)
    error = ProviderServerError("dropped")
    other = Middleware(store, store, CID)

    async def generate(request: Request) -> AsyncGenerator[Response, None]:
        yield Response(Output(assistant_message("partial")))
        await other.call(ScriptedModel(answer("other"))).call(Request([user_message("other q")]))
        raise error

    with (
        caplog.at_level(logging.WARNING, logger="scope.history"),
        pytest.raises(ProviderServerError) as info,
    ):
        await collect(mw.stream(StreamerFunc(generate)).stream(QUESTION))
    assert info.value is error
    assert [m.text for m in await store.read(CID)] == ["other q", "other"]
    assert reports[0].kept is None
    assert "was not stored" in caplog.text and "HistoryChangedError" in caplog.text


async def test_an_interrupted_turn_of_an_erased_conversation_logs_no_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryStore()
    mw, reports = keeping(store)
    error = ProviderServerError("dropped")

    async def generate(request: Request) -> AsyncGenerator[Response, None]:
        yield Response(Output(assistant_message("partial")))
        await erase(store, CID)  # erased while the turn runs
        raise error

    with caplog.at_level(logging.DEBUG), pytest.raises(ProviderServerError) as info:
        await collect(mw.stream(StreamerFunc(generate)).stream(QUESTION))
    assert info.value is error
    assert reports[0].kept is None
    assert await store.read(CID) == []
    assert "an interrupted turn was not stored: its conversation is closed" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(CID) not in caplog.text


async def test_a_hung_store_during_the_shielded_write_is_bounded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_interrupted, "KEEP_TIMEOUT", 0.05)
    store = InMemoryStore()
    hung = anyio.Event()

    class HangingWriter:
        async def append(self, batch: Batch) -> Receipt:
            hung.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    reports = Reports()
    mw = Middleware(store, HangingWriter(), CID, on_incomplete=reports, layers=(KeepInterrupted(),))
    model = ScriptedModel(Hang(after=1))
    with anyio.fail_after(10), caplog.at_level(logging.WARNING, logger="scope.history"):
        _seen, reached = await cancel_after(mw.stream(model).stream(QUESTION), 1)
    assert hung.is_set() and reached == 1
    assert reports[0].kept is None and reports[0].reason is IncompleteReason.CANCELLED
    assert "was abandoned" in caplog.text


async def test_a_failing_store_during_the_write_leaves_the_original_error() -> None:
    class BrokenWriter:
        async def append(self, batch: Batch) -> Receipt:
            raise StoreError("disk gone")

    store = InMemoryStore()
    error = ProviderServerError("503")
    mw = Middleware(store, BrokenWriter(), CID, layers=(KeepInterrupted(),))
    with pytest.raises(ProviderServerError) as info:
        await collect(mw.stream(ScriptedModel(Fail(error, after=1))).stream(QUESTION))
    assert info.value is error and info.value.__context__ is None


async def test_off_stores_nothing() -> None:
    store = InMemoryStore()
    reports = Reports()
    mw = Middleware(store, store, CID, on_incomplete=reports)
    await cancel_after(mw.stream(ScriptedModel(Hang(after=1))).stream(QUESTION), 1)
    with pytest.raises(ProviderServerError):
        await collect(
            mw.stream(ScriptedModel(Fail(ProviderServerError("x"), after=1))).stream(QUESTION)
        )
    assert await store.read(CID) == []
    assert [r.kept for r in reports] == [None, None]


async def test_not_kept_before_the_model_is_asked_or_for_an_invalid_response() -> None:
    store = InMemoryStore()
    mw, reports = keeping(store)
    incomplete = [Response(Output(assistant_message("no finish reason")))]
    with pytest.raises(InvalidResponseError):
        await collect(mw.stream(ScriptedModel(incomplete)).stream(QUESTION))
    assert await store.read(CID) == []
    await store.clear(CID)
    model = ScriptedModel(answer("never"))
    with pytest.raises(ConversationClosedError):
        await collect(mw.stream(model).stream(QUESTION))
    assert model.requests == []
    assert [r.kept for r in reports] == [None, None]


async def test_a_commit_error_is_not_an_interruption() -> None:
    class RefusingWriter(InMemoryStore):
        async def append(self, batch: Batch) -> Receipt:
            raise StoreError("read-only")

    store = RefusingWriter()
    mw, reports = keeping(store)
    with pytest.raises(CommitError):
        await collect(mw.stream(ScriptedModel(answer("whole"))).stream(QUESTION))
    assert reports == []


async def test_sqlite_stores_the_interrupted_turn_for_a_stopped_stream(tmp_path: Path) -> None:
    async with fresh_store("sqlite", tmp_path) as store:
        mw, _ = keeping(store)
        stream = mw.stream(ScriptedModel(answer("hello world"))).stream(QUESTION)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            await stream.__anext__()
            await stream.__anext__()
        stored = await store.read(CID)
        assert [m.text for m in stored] == ["q", "hello wo"]
        assert marks(stored) == [None, "stopped"]


# ---------------------------------------------------------------- call


async def test_a_cancelled_call_keeps_the_question_marked() -> None:
    store = CheckpointingStore()
    mw, reports = keeping(store)
    with anyio.move_on_after(0.05) as scope:
        await mw.call(ScriptedModel(Hang())).call(QUESTION)
    assert scope.cancelled_caught
    stored = await store.read(CID)
    assert [m.text for m in stored] == ["q"] and marks(stored) == ["cancelled"]
    assert reports[0].kept is not None


async def test_a_failed_call_keeps_the_question_marked_and_raises_its_error() -> None:
    store = InMemoryStore()
    mw, _ = keeping(store)
    error = ProviderServerError("503")
    with pytest.raises(ProviderServerError) as info:
        await mw.call(ScriptedModel(error)).call(QUESTION)
    assert info.value is error
    assert marks(await store.read(CID)) == ["error"]


async def test_a_call_whose_answer_is_invalid_keeps_nothing() -> None:
    store = InMemoryStore()
    mw, _ = keeping(store)
    with pytest.raises(InvalidResponseError):
        await mw.call(ScriptedModel(Response(Output(assistant_message("x"))))).call(QUESTION)
    assert await store.read(CID) == []


async def test_a_cancellation_during_the_commit_is_reported_with_its_batch_not_kept() -> None:
    appending = anyio.Event()

    class SlowWriter(InMemoryStore):
        async def append(self, batch: Batch) -> Receipt:
            appending.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    store = SlowWriter()
    mw, reports = keeping(store)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mw.call(ScriptedModel(answer("whole"))).call, QUESTION)
            await appending.wait()
            scope.cancel()
    (report,) = reports
    assert report.batch is not None and report.kept is None
    assert [m.text for m in report.batch.messages] == ["q", "whole"]
