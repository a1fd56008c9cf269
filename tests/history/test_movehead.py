"""``scope.history.MoveHead`` and ``Middleware(layers=...)``: a turn whose first step moves
the head (inside the lease, outside keep_interrupted), once; moved back when the turn
fails before its commit; the checks at construction. Under asyncio and trio, over the
in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from scope.chat import Request, user_message, wrap
from scope.errors import (
    CommitError,
    HistoryChangedError,
    InvalidAppendIDError,
    ProviderServerError,
    StoreError,
    UnknownHeadError,
)
from scope.history import Batch, KeepInterrupted, Middleware, MoveHead, keyword_layers
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from tests.helpers import texts, turn

pytestmark = pytest.mark.anyio


async def two_turns() -> tuple[InMemoryStore, str, str]:
    store = InMemoryStore()
    await store.append(Batch("c", "a1", turn("q1")))
    await store.append(Batch("c", "a2", turn("q2")))
    return store, "a1", "a2"


async def test_the_first_turn_moves_the_head_and_is_stored_there() -> None:
    store, first, head = await two_turns()
    answers: list[int] = []

    def answer(request: Request) -> str:
        answers.append(len(request.messages))
        return "new answer"

    mw = Middleware(store, store, "c", layers=(MoveHead(store, first, expected_head=head),))
    model = wrap(FunctionModel(answer), mw.call)
    await model.call(Request((user_message("q2 again"),)))
    assert answers == [3]  # replayed from a1: q1, its answer, the new question
    tree = await store.read_tree("c")
    assert tree.parents == (-1, 0, 0)
    await model.call(Request((user_message("q3"),)))  # moves once: the next turn follows the head
    assert (await store.read_tree("c")).parents == (-1, 0, 0, 2)


@pytest.mark.parametrize("on_overlap", ["fence", "wait"])
async def test_a_failed_turn_moves_the_head_back(on_overlap: str) -> None:
    store, first, head = await two_turns()

    def fail(request: Request) -> str:
        raise ProviderServerError("upstream 503")

    move = MoveHead(store, first, expected_head=head)
    mw = Middleware(store, store, "c", layers=[*keyword_layers(on_overlap), move])
    with pytest.raises(ProviderServerError):
        await wrap(FunctionModel(fail), mw.call).call(Request((user_message("q"),)))
    assert (await store.read_view("c")).head == head
    assert not move.moved
    await move.undo()  # once: nothing more to do
    assert (await store.read_view("c")).head == head


async def test_a_move_the_store_refuses_calls_no_model() -> None:
    store, first, _ = await two_turns()
    called: list[Request] = []
    mw = Middleware(store, store, "c", layers=(MoveHead(store, first, expected_head="a1"),))
    with pytest.raises(HistoryChangedError):
        await wrap(FunctionModel(lambda r: called.append(r) or "x"), mw.call).call(
            Request((user_message("q"),))
        )
    unknown = Middleware(store, store, "c", layers=(MoveHead(store, "zz", expected_head="a2"),))
    with pytest.raises(UnknownHeadError):
        await wrap(FunctionModel(lambda r: called.append(r) or "x"), unknown.call).call(
            Request((user_message("q"),))
        )
    assert called == []
    assert texts(await store.read("c")) == ["q1 q", "q1 a", "q2 q", "q2 a"]


async def test_a_turn_kept_as_interrupted_stays_the_head() -> None:
    store, first, head = await two_turns()

    def fail(request: Request) -> str:
        raise ProviderServerError("upstream 503")

    mw = Middleware(
        store,
        store,
        "c",
        layers=(MoveHead(store, first, expected_head=head), KeepInterrupted()),
    )
    with pytest.raises(ProviderServerError):
        await wrap(FunctionModel(fail), mw.call).call(Request((user_message("q"),)))
    tree = await store.read_tree("c")
    assert tree.parents == (-1, 0, 0)  # the kept turn, on the new branch, is the head
    assert tree.head == 2


async def test_a_failed_commit_leaves_the_head_for_its_retry() -> None:
    store, first, head = await two_turns()

    mw = Middleware(
        store, _NoAppend(store), "c", layers=(MoveHead(store, first, expected_head=head),)
    )
    with pytest.raises(CommitError) as caught:
        await wrap(FunctionModel(lambda r: "answer"), mw.call).call(Request((user_message("q"),)))
    assert caught.value.retryable
    await store.append(caught.value.batch)  # the retry lands on the new head
    assert (await store.read_tree("c")).parents == (-1, 0, 0)


class _NoAppend:
    """A writer whose append fails (a store error: retryable)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store

    async def append(self, batch: Batch) -> Any:
        raise StoreError("connection reset")


def test_construction_checks() -> None:
    store = InMemoryStore()
    with pytest.raises(TypeError, match="MoveHead needs a store with an async move_head"):
        MoveHead(object(), "", expected_head="a1")
    with pytest.raises(InvalidAppendIDError, match="MoveHead head"):
        MoveHead(store, "a\x00b", expected_head="a1")
    with pytest.raises(InvalidAppendIDError, match="MoveHead expected_head"):
        MoveHead(store, "", expected_head=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"layers must be a list or tuple of layers, got MoveHead"):
        Middleware(store, store, "c", layers=MoveHead(store, "", expected_head=""))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"layers\[0\] must be a layer \(scope.history.Fence"):
        Middleware(store, store, "c", layers=("wait",))  # type: ignore[arg-type]


async def test_a_move_whose_answer_was_lost_is_moved_back() -> None:
    """A store error after the store moved the head (the answer lost on the way): the
    move may have landed, so the failed turn moves it back (fenced: a move that did not
    land moves nothing)."""

    class LostAnswer(InMemoryStore):
        failures = 1

        async def move_head(self, *args: Any, **kwargs: Any) -> int:
            moved = await super().move_head(*args, **kwargs)
            if self.failures:
                self.failures -= 1
                raise StoreError("connection reset after the move")
            return moved

    store = LostAnswer()
    await store.append(Batch("c", "a1", turn("q1")))
    await store.append(Batch("c", "a2", turn("q2")))
    move = MoveHead(store, "a1", expected_head="a2")
    mw = Middleware(store, store, "c", layers=(move,))
    with pytest.raises(StoreError, match="connection reset"):
        await wrap(FunctionModel(lambda r: "x"), mw.call).call(Request((user_message("q"),)))
    assert (await store.read_view("c")).head == "a2"
    assert not move.moved
