"""The history Middleware: request shape, replay, commit, CommitError, streams, reporting."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
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
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    collect,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
    wrap,
    wrap_stream,
)
from scope.errors import (
    CommitError,
    InvalidRequestError,
    InvalidResponseError,
    StoreError,
)
from scope.history import (
    Batch,
    HistoryView,
    IncompleteReason,
    IncompleteTurn,
    Middleware,
    Receipt,
    Unfenced,
)
from scope.history.inmemory import InMemoryStore

pytestmark = pytest.mark.anyio

CID = "conv-1"


def answer(text: str, *, usage: Usage | None = None) -> Response:
    return Response(
        Output(assistant_message(text), FinishReason.STOP),
        ResponseMetadata(id="r1", model="m", usage=usage or Usage(10, 5)),
    )


def tool_calls(*ids: str) -> Response:
    parts = [tool_call_part(i, "lookup", '{"q": 1}') for i in ids]
    return Response(Output(assistant_message(*parts), FinishReason.TOOL_CALLS))


def chunks_of(text: str, size: int = 3) -> list[Response]:
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    out = [Response(Output(assistant_message(p))) for p in pieces]
    out.append(
        Response(Output(finish_reason=FinishReason.STOP), ResponseMetadata(usage=Usage(3, 4)))
    )
    return out


class FakeModel:
    """A Model and Streamer answering from a script, recording every request."""

    def __init__(self, *script: Response | list[Response] | BaseException) -> None:
        self.script = list(script)
        self.requests: list[Request] = []
        self.closed = 0
        self.started = 0

    def _next(self, request: Request) -> Any:
        self.requests.append(request)
        return self.script.pop(0)

    async def call(self, request: Request) -> Response:
        item = self._next(request)
        await anyio.lowlevel.checkpoint()
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, Response)
        return item

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream(request)

    async def _stream(self, request: Request) -> AsyncIterator[Response]:
        self.started += 1
        item = self._next(request)
        try:
            if isinstance(item, BaseException):
                raise item
            for chunk in item if isinstance(item, list) else [item]:
                if isinstance(chunk, BaseException):
                    raise chunk
                await anyio.lowlevel.checkpoint()
                yield chunk
        finally:
            self.closed += 1


class CountingStore(InMemoryStore):
    """The in-memory store, counting reads and appends."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.appends = 0

    async def read(self, conversation_id: str) -> list[Message]:
        self.reads += 1
        return await super().read(conversation_id)

    async def read_view(self, conversation_id: str) -> HistoryView:
        self.reads += 1
        return await super().read_view(conversation_id)

    async def append(self, batch: Batch) -> Receipt:
        self.appends += 1
        return await super().append(batch)


class Reports(list[IncompleteTurn]):
    def __call__(self, turn: IncompleteTurn) -> None:
        self.append(turn)


def make(
    store: InMemoryStore | None = None, **kwargs: Any
) -> tuple[Middleware, CountingStore, Reports]:
    store = store or CountingStore()
    reports = Reports()
    mw = Middleware(store, store, CID, on_incomplete=reports, **kwargs)
    return mw, store, reports  # type: ignore[return-value]


# ---------------------------------------------------------------- request shape

BAD_SHAPES = {
    "complete transcript": [user_message("a"), assistant_message("b"), user_message("c")],
    "two user messages": [user_message("a"), user_message("b")],
    "leading assistant": [assistant_message("a"), user_message("b")],
    "no user message": [system_message("s")],
    "assistant answer after user": [user_message("a"), assistant_message("b")],
    "unanswered tool call": [
        user_message("a"),
        assistant_message(tool_call_part("c1", "f"), tool_call_part("c2", "f")),
        tool_message(ToolResult("c1", "f")),
    ],
}


@pytest.mark.parametrize("name", sorted(BAD_SHAPES))
async def test_bad_request_shape_raises_before_any_io(name: str) -> None:
    mw, store, reports = make()
    model = FakeModel(answer("x"))
    request = Request(BAD_SHAPES[name])
    with pytest.raises(InvalidRequestError):
        await mw.call(model).call(request)
    # A Streamer checks its request on first iteration (DESIGN §6b), still before any I/O.
    stream = mw.stream(model).stream(request)
    with pytest.raises(InvalidRequestError):
        await stream.__anext__()
    assert store.reads == 0 and store.appends == 0
    assert model.requests == []
    assert reports == []


async def test_an_assistant_answer_in_the_open_turn_is_named_with_its_article() -> None:
    mw, _, _ = make()
    request = Request([user_message("a"), assistant_message("b")])
    with pytest.raises(InvalidRequestError, match="got an assistant message without tool calls"):
        await mw.call(FakeModel(answer("x"))).call(request)


def test_the_middleware_itself_passed_to_wrap_says_to_pass_call_or_stream() -> None:
    mw, _, _ = make()
    model = FakeModel(answer("x"))
    for compose in (wrap, wrap_stream):
        with pytest.raises(TypeError, match=r"history\.call\) or chat\.wrap_stream"):
            compose(model, mw)  # type: ignore[arg-type]
    assert wrap(model, mw.call) is not model


class StreamOnly:
    """Only a Streamer: no ``call``."""

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return FakeModel(answer("x")).stream(request)


class CallOnly:
    """Only a Model: no ``stream``."""

    async def call(self, request: Request) -> Response:
        return answer("x")


def test_wrapping_a_streamer_with_call_fails_at_construction() -> None:
    mw, _, _ = make()
    with pytest.raises(
        TypeError,
        match=r"Middleware\.call wraps a scope\.chat\.Model .* got StreamOnly, which is only a "
        r"Streamer: use chat\.wrap_stream\(streamer, mw\.stream\)",
    ):
        wrap(StreamOnly(), mw.call)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"Middleware\.stream wraps a scope\.chat\.Streamer .* got CallOnly, which is only "
        r"a Model: use chat\.wrap\(model, mw\.call\)",
    ):
        wrap_stream(CallOnly(), mw.stream)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got object$"):
        wrap(object(), mw.call)  # type: ignore[arg-type]


class SyncRead:
    def read(self, conversation_id: str) -> list[Message]:
        return []


class SyncAppend:
    def append(self, batch: Batch) -> Receipt:
        return batch.receipt()


def test_a_reader_or_writer_that_is_not_async_is_refused_at_construction() -> None:
    store = InMemoryStore()
    with pytest.raises(
        TypeError,
        match=r"Middleware reader SyncRead\.read must be a coroutine function "
        r"\(async def read\(conversation_id\)\), got method",
    ):
        Middleware(SyncRead(), store, "c")
    with pytest.raises(
        TypeError,
        match=r"Middleware writer SyncAppend\.append must be a coroutine function "
        r"\(async def append\(batch\)\), got method",
    ):
        Middleware(store, SyncAppend(), "c")


# ---------------------------------------------------------------- replay and commit


async def test_replays_stored_history_in_order_under_a_new_system_prefix() -> None:
    mw, _store, _ = make()
    model = FakeModel(answer("one"), answer("two"))
    bound = mw.call(model)
    await bound.call(Request([system_message("old prefix"), user_message("first")]))
    await bound.call(Request([system_message("new prefix"), user_message("second")]))
    sent = model.requests[1].messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0].text == "new prefix"
    assert [m.text for m in sent[1:]] == ["first", "one", "second"]


async def test_system_messages_are_never_stored() -> None:
    mw, store, _ = make()
    await mw.call(FakeModel(answer("hi"))).call(
        Request([system_message("s1"), system_message("s2"), user_message("q")])
    )
    stored = await store.read(CID)
    assert [m.role for m in stored] == ["user", "assistant"]


async def test_final_answer_appends_one_batch_of_turn_and_answer() -> None:
    appended: list[Batch] = []
    store = CountingStore()
    original = store.append

    async def spy(batch: Batch) -> Receipt:
        appended.append(batch)
        return await original(batch)

    store.append = spy  # type: ignore[method-assign]
    ids = iter(["append-1"])
    mw = Middleware(store, store, CID, new_append_id=lambda: next(ids))
    response = await mw.call(FakeModel(answer("hello"))).call(Request([user_message("hi")]))
    assert response.text == "hello"
    assert len(appended) == 1
    (batch,) = appended
    assert batch.id == "append-1" and batch.conversation_id == CID
    assert [m.text for m in batch.messages] == ["hi", "hello"]


async def test_tool_turn_is_stored_as_one_batch_of_four_only_after_the_final_answer() -> None:
    mw, store, reports = make()
    model = FakeModel(tool_calls("c1"), answer("it is 42"))
    bound = mw.call(model)
    call_turn = [user_message("what?")]
    first = await bound.call(Request(call_turn))
    assert first.output is not None and first.output.finish_reason is FinishReason.TOOL_CALLS
    assert await store.read(CID) == [] and store.appends == 0
    assert first.output.message is not None
    follow_up = [
        *call_turn,
        first.output.message,
        tool_message(ToolResult("c1", "lookup", ToolOutput.of_text("42"))),
    ]
    await bound.call(Request(follow_up))
    stored = await store.read(CID)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert store.appends == 1
    assert reports == []


async def test_invalid_response_writes_nothing_and_reports() -> None:
    mw, store, reports = make()
    incomplete = Response(Output(assistant_message("partial")))  # no finish reason
    with pytest.raises(InvalidResponseError):
        await mw.call(FakeModel(incomplete)).call(Request([user_message("q")]))
    assert store.appends == 0
    assert [r.reason for r in reports] == [IncompleteReason.INVALID_RESPONSE]
    assert reports[0].partial == incomplete


async def test_final_response_without_message_is_invalid() -> None:
    mw, store, reports = make()
    empty = Response(Output(finish_reason=FinishReason.CONTENT_FILTER))
    with pytest.raises(InvalidResponseError):
        await mw.call(FakeModel(empty)).call(Request([user_message("q")]))
    assert store.appends == 0
    assert [r.reason for r in reports] == [IncompleteReason.INVALID_RESPONSE]


async def test_invalid_stored_message_is_a_clear_error_never_sent() -> None:
    class BadReader:
        async def read(self, conversation_id: str) -> list[Any]:
            return [user_message("ok"), "not a message"]

    store = CountingStore()
    model = FakeModel(answer("x"))
    mw = Middleware(BadReader(), store, CID, layers=(Unfenced(),))  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="conv-1"):
        await mw.call(model).call(Request([user_message("q")]))
    assert model.requests == []


async def test_unreplayable_stored_history_is_a_store_error() -> None:
    class DanglingToolReader:
        async def read(self, conversation_id: str) -> list[Message]:
            return [tool_message(ToolResult("c9", "f"))]

    model = FakeModel(answer("x"))
    mw = Middleware(DanglingToolReader(), CountingStore(), CID, layers=(Unfenced(),))
    with pytest.raises(StoreError, match="cannot be replayed"):
        await mw.call(model).call(Request([user_message("q")]))
    assert model.requests == []


async def test_window_reader_as_reader() -> None:
    from scope.history import WindowReader

    store = CountingStore()
    model = FakeModel(answer("a1"), answer("a2"), answer("a3"))
    mw = Middleware(WindowReader(store, 2), store, CID)
    bound = mw.call(model)
    for text in ("q1", "q2", "q3"):
        await bound.call(Request([user_message(text)]))
    assert [m.text for m in model.requests[2].messages] == ["q2", "a2", "q3"]
    assert len(await store.read(CID)) == 6


async def test_concurrent_turns_on_different_conversations_do_not_mix() -> None:
    store = CountingStore()

    class Echo:
        async def call(self, request: Request) -> Response:
            await anyio.sleep(0.001)
            return answer("echo " + request.messages[-1].text)

    echo = Echo()

    async def converse(cid: str) -> None:
        bound = wrap(echo, Middleware(store, store, cid).call)
        for turn in range(3):
            await bound.call(Request([user_message(f"{cid}/{turn}")]))

    async with anyio.create_task_group() as tg:
        for n in range(8):
            tg.start_soon(converse, f"c{n}")
    for n in range(8):
        texts = [m.text for m in await store.read(f"c{n}")]
        assert texts == [x for t in range(3) for x in (f"c{n}/{t}", f"echo c{n}/{t}")]


# ---------------------------------------------------------------- CommitError


class FailingWriter:
    def __init__(self, error: BaseException | None = None, receipt: Any = None) -> None:
        self.error = error
        self.receipt = receipt
        self.calls = 0

    async def append(self, batch: Batch) -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.receipt


async def test_writer_error_raises_commit_error_and_retry_needs_no_model_call() -> None:
    store = CountingStore()
    writer = FailingWriter(OSError("disk full"))
    reports = Reports()
    model = FakeModel(answer("kept", usage=Usage(7, 3)))
    mw = Middleware(store, writer, CID, on_incomplete=reports)
    with pytest.raises(CommitError) as info:
        await mw.call(model).call(Request([user_message("q")]))
    err = info.value
    assert isinstance(err.__cause__, OSError)
    assert err.receipt is None
    assert err.response.usage == Usage(7, 3)
    assert [m.text for m in err.batch.messages] == ["q", "kept"]
    receipt = await store.append(err.batch)
    receipt.validate_for(err.batch)
    assert [m.text for m in await store.read(CID)] == ["q", "kept"]
    assert len(model.requests) == 1
    assert reports == []


async def test_wrong_receipt_raises_commit_error_without_that_receipt() -> None:
    wrong = Receipt(CID, "other", "sha256:" + "0" * 64)
    mw = Middleware(CountingStore(), FailingWriter(receipt=wrong), CID)
    with pytest.raises(CommitError) as info:
        await mw.call(FakeModel(answer("a"))).call(Request([user_message("q")]))
    assert info.value.receipt is None


async def test_non_receipt_from_writer_raises_commit_error() -> None:
    mw = Middleware(CountingStore(), FailingWriter(receipt="ok"), CID)
    with pytest.raises(CommitError):
        await mw.call(FakeModel(answer("a"))).call(Request([user_message("q")]))


async def test_cancellation_during_append_propagates_and_reports_the_batch() -> None:
    # DESIGN §6b: a cancellation is never converted into CommitError (this was v0.1's
    # behaviour); on_incomplete gets the batch, whose outcome is unknown.
    store = CountingStore()

    appending = anyio.Event()

    class SlowWriter:
        async def append(self, batch: Batch) -> Receipt:
            appending.set()
            await anyio.sleep(10)
            raise AssertionError("not reached")

    reports = Reports()
    mw = Middleware(store, SlowWriter(), CID, on_incomplete=reports)
    caught: list[BaseException] = []
    finished = False

    async def run() -> None:
        nonlocal finished
        try:
            await mw.call(FakeModel(answer("a"))).call(Request([user_message("q")]))
        except CommitError as exc:  # pragma: no cover - the bug this test guards against
            caught.append(exc)
        finished = True

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await appending.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert caught == [] and not finished
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    batch = reports[0].batch
    assert batch is not None and batch.messages[-1].text == "a"
    assert [m.text for m in batch.messages] == ["q", "a"]


# ---------------------------------------------------------------- on_incomplete (call)


async def test_model_error_reports_error_once() -> None:
    mw, store, reports = make()
    with pytest.raises(RuntimeError):
        await mw.call(FakeModel(RuntimeError("boom"))).call(Request([user_message("q")]))
    assert [r.reason for r in reports] == [IncompleteReason.ERROR]
    assert reports[0].partial is None
    assert [m.text for m in reports[0].open_turn] == ["q"]
    assert store.appends == 0


async def test_non_response_from_model_is_never_reported_as_partial() -> None:
    # IncompleteTurn.partial is a Response or None: what a model returned that is not a
    # Response must not leak into it.
    mw, store, reports = make()

    class Wrong:
        async def call(self, request: Request) -> Response:
            return "not a response"  # type: ignore[return-value]

    with pytest.raises(InvalidResponseError):
        await mw.call(Wrong()).call(Request([user_message("q")]))
    assert [r.reason for r in reports] == [IncompleteReason.INVALID_RESPONSE]
    assert reports[0].partial is None
    assert store.appends == 0


async def test_cancelled_call_reports_cancelled_once() -> None:
    mw, store, reports = make()

    class Hang:
        async def call(self, request: Request) -> Response:
            await anyio.sleep(10)
            raise AssertionError("not reached")

    with anyio.move_on_after(0.05):
        await mw.call(Hang()).call(Request([user_message("q")]))
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    assert store.appends == 0


async def test_success_and_tool_pause_do_not_report() -> None:
    mw, _, reports = make()
    bound = mw.call(FakeModel(tool_calls("c1"), answer("done")))
    await bound.call(Request([user_message("q")]))
    await mw.call(FakeModel(answer("done"))).call(Request([user_message("q2")]))
    assert reports == []


async def test_raising_callback_is_logged_and_does_not_mask(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bad(turn: IncompleteTurn) -> None:
        raise ValueError("callback bug")

    mw = Middleware(CountingStore(), CountingStore(), CID, on_incomplete=bad)
    with caplog.at_level(logging.ERROR, logger="scope.history"), pytest.raises(RuntimeError):
        await mw.call(FakeModel(RuntimeError("original"))).call(Request([user_message("q")]))
    assert "on_incomplete callback failed" in caplog.text


# ---------------------------------------------------------------- streams


async def test_stream_is_lazy_no_read_before_iteration() -> None:
    mw, store, _ = make()
    model = FakeModel(chunks_of("hello"))
    stream = mw.stream(model).stream(Request([user_message("q")]))
    await anyio.lowlevel.checkpoint()
    assert store.reads == 0 and model.started == 0
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        first = await stream.__anext__()
    assert first.text == "hel"
    assert store.reads == 1


async def test_stream_forwards_chunks_and_commits_after_natural_end() -> None:
    mw, store, reports = make()
    model = FakeModel(chunks_of("hello world"))
    seen: list[str] = []
    stream = mw.stream(model).stream(Request([user_message("q")]))
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for chunk in stream:
            seen.append(chunk.text)
            if len(seen) == 1:
                assert store.appends == 0  # nothing written mid-stream
    assert "".join(seen) == "hello world"
    assert [m.text for m in await store.read(CID)] == ["q", "hello world"]
    assert model.closed == 1
    assert reports == []


async def test_stream_early_stop_closes_inner_and_writes_nothing() -> None:
    mw, store, reports = make()
    model = FakeModel(chunks_of("hello world"))
    stream = mw.stream(model).stream(Request([user_message("q")]))
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for _chunk in stream:
            break
    assert model.closed == 1
    assert store.appends == 0
    assert [r.reason for r in reports] == [IncompleteReason.STOPPED]
    assert reports[0].partial is not None and reports[0].partial.text == "hel"


async def test_stream_inner_error_writes_nothing_and_reports_error() -> None:
    mw, store, reports = make()
    model = FakeModel([*chunks_of("hey")[:1], RuntimeError("dropped")])
    with pytest.raises(RuntimeError):
        await collect(mw.stream(model).stream(Request([user_message("q")])))
    assert store.appends == 0 and model.closed == 1
    assert [r.reason for r in reports] == [IncompleteReason.ERROR]
    assert reports[0].partial is not None and reports[0].partial.text == "hey"


async def test_stream_invalid_chunk_reports_invalid_response() -> None:
    mw, store, reports = make()
    model = FakeModel(
        [
            Response(Output(assistant_message(tool_call_part("c1", "a")))),
            Response(Output(assistant_message(tool_call_part("c1", "b")))),  # repeats an id
        ]
    )
    with pytest.raises(InvalidResponseError):
        await collect(mw.stream(model).stream(Request([user_message("q")])))
    assert store.appends == 0 and model.closed == 1
    assert [r.reason for r in reports] == [IncompleteReason.INVALID_RESPONSE]


async def test_stream_cancellation_writes_nothing_and_reports_cancelled() -> None:
    mw, store, reports = make()

    class Hang:
        closed = False

        async def _gen(self) -> AsyncIterator[Response]:
            try:
                yield Response(Output(assistant_message("x")))
                await anyio.sleep(10)
            finally:
                self.closed = True

        def stream(self, request: Request) -> AsyncIterator[Response]:
            return self._gen()

    hang = Hang()
    with anyio.move_on_after(0.05):
        await collect(mw.stream(hang).stream(Request([user_message("q")])))
    assert hang.closed
    assert store.appends == 0
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]


async def test_stream_commit_error_is_raised_after_the_last_chunk() -> None:
    store = CountingStore()
    mw = Middleware(store, FailingWriter(OSError("down")), CID)
    model = FakeModel(chunks_of("abcdef"))
    seen: list[Response] = []
    stream = mw.stream(model).stream(Request([user_message("q")]))
    with pytest.raises(CommitError) as info:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for chunk in stream:
                seen.append(chunk)
    assert len(seen) == len(chunks_of("abcdef"))
    assert info.value.batch.messages[-1].text == "abcdef"
    assert model.closed == 1
    await store.append(info.value.batch)
    assert len(model.requests) == 1


async def test_stream_tool_call_pause_writes_nothing_and_does_not_report() -> None:
    mw, store, reports = make()
    model = FakeModel([tool_calls("c1", "c2")])
    response = await collect(wrap_stream(model, mw.stream).stream(Request([user_message("q")])))
    assert len(response.output.message.tool_calls) == 2  # type: ignore[union-attr]
    assert store.appends == 0 and reports == []


async def test_stream_replays_history_like_call() -> None:
    mw, store, _ = make()
    model = FakeModel(chunks_of("one"), chunks_of("two"))
    bound = mw.stream(model)
    await collect(bound.stream(Request([user_message("first")])))
    await collect(bound.stream(Request([system_message("p"), user_message("second")])))
    assert [m.text for m in model.requests[1].messages] == ["p", "first", "one", "second"]
    assert [m.text for m in await store.read(CID)] == ["first", "one", "second", "two"]


async def test_text_part_metadata_survives_commit() -> None:
    mw, store, _ = make()
    message = assistant_message(text_part("hi", metadata={"lang": "en"}))
    await mw.call(FakeModel(Response(Output(message, FinishReason.STOP)))).call(
        Request([user_message("q")])
    )
    assert (await store.read(CID))[1] == message


async def test_an_exception_group_is_a_cancellation_only_if_all_of_it_is() -> None:
    mw, store, reports = make()
    group = BaseExceptionGroup("stop", [KeyboardInterrupt()])
    with pytest.raises(BaseExceptionGroup):
        await mw.call(FakeModel(group)).call(Request([user_message("q")]))
    assert [r.reason for r in reports] == [IncompleteReason.ERROR]
    assert store.appends == 0


@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
async def test_the_committed_answer_carries_the_cache_counts_in_its_usage(
    streaming: bool,
) -> None:
    # DESIGN §6g: cache reads and writes land in Usage and in scope/usage; counts the
    # response did not report stay out.
    store = InMemoryStore()
    history = Middleware(store, store, "cached")
    usages = [
        Usage(120, 7, cache_read_input_tokens=100, cache_write_input_tokens=15),
        Usage(50, 3, cache_read_input_tokens=0),
        Usage(40, 2),
    ]
    for index, usage in enumerate(usages):
        answer = Response(
            Output(assistant_message("hi"), FinishReason.STOP), ResponseMetadata(usage=usage)
        )

        class Model:
            async def call(self, request: Request, answer: Response = answer) -> Response:
                return answer

            async def stream(
                self, request: Request, answer: Response = answer
            ) -> AsyncIterator[Response]:
                yield answer

        request = Request([user_message(f"q{index}")])
        if streaming:
            await collect(history.stream(Model()).stream(request))
        else:
            await history.call(Model()).call(request)
    stored = [m.metadata.decode("scope/usage") for m in (await store.read("cached"))[1::2]]
    assert stored == [
        {
            "input_tokens": 120,
            "output_tokens": 7,
            "cache_read_input_tokens": 100,
            "cache_write_input_tokens": 15,
        },
        {"input_tokens": 50, "output_tokens": 3, "cache_read_input_tokens": 0},
        {"input_tokens": 40, "output_tokens": 2},
    ]
