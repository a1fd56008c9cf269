"""The history Middleware's layers as public values (DESIGN §6m): ``Fence``, ``Unfenced``,
``Reject``, ``Wait``, ``Interrupt``, ``MoveHead`` and ``KeepInterrupted``; their order
checked when the Middleware is made; the v0.4 keywords translated with a
``DeprecationWarning``; ``Conversation``'s keywords or ``layers=``, never both. Every
order of every kind of layer is tried, and every valid one runs a turn (and a failed
one) on every store kind."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from scope.chat import Request, user_message, wrap
from scope.conversation import Conversation
from scope.errors import ProviderServerError
from scope.history import (
    Fence,
    Interrupt,
    KeepInterrupted,
    Middleware,
    MoveHead,
    Reject,
    Unfenced,
    Wait,
    keyword_layers,
)
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from tests.servers import fresh_store, over_backends

OVERLAP = (Fence(), Unfenced(), Reject(), Wait(timeout=5), Interrupt(timeout=5))


def test_the_default_is_the_fence() -> None:
    store = InMemoryStore()
    assert Middleware(store, store, "c").layers == (Fence(),)
    keep = Middleware(store, store, "c", layers=[KeepInterrupted()])
    assert keep.layers == (Fence(), KeepInterrupted())
    assert keep.keep_interrupted and keep.fenced and keep.on_overlap == "fence"
    waits = Middleware(store, store, "c", layers=(Wait(timeout=1, lease_ttl=2),))
    assert waits.on_overlap == "wait" and not waits.keep_interrupted
    assert not Middleware(store, store, "c", layers=(Unfenced(),)).fenced


def test_the_layers_check_their_arguments() -> None:
    assert Wait() == Wait(timeout=30, lease_ttl=15)
    assert Interrupt(timeout=0).timeout == 0.0
    for make in (Reject, Wait, Interrupt):
        with pytest.raises(ValueError, match="lease_ttl must be a finite number of seconds > 0"):
            make(lease_ttl=0)
        with pytest.raises(TypeError, match="lease_ttl must be a number of seconds"):
            make(lease_ttl="15")
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds >= 0"):
        Wait(timeout=-1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'timeout'"):
        Reject(timeout=3)  # type: ignore[call-arg]


def _valid(order: tuple[Any, ...]) -> bool:
    overlap = [i for i, layer in enumerate(order) if isinstance(layer, tuple(map(type, OVERLAP)))]
    moves = [i for i, layer in enumerate(order) if isinstance(layer, MoveHead)]
    keeps = [i for i, layer in enumerate(order) if isinstance(layer, KeepInterrupted)]
    return (
        len(overlap) <= 1
        and len(moves) <= 1
        and len(keeps) <= 1
        and overlap in ([], [0])
        and keeps in ([], [len(order) - 1])
    )


def _orders() -> list[tuple[Any, ...]]:
    store = InMemoryStore()
    kinds = [*OVERLAP, MoveHead(store, "", expected_head=""), KeepInterrupted()]
    orders: list[tuple[Any, ...]] = []
    for size in range(4):
        orders.extend(itertools.permutations(kinds, size))
    orders.extend([(Fence(), Wait()), (KeepInterrupted(), KeepInterrupted())])
    return orders


def test_every_order_of_every_layer() -> None:
    store = InMemoryStore()
    accepted = 0
    for order in _orders():
        if _valid(order):
            made = Middleware(store, store, "c", layers=order)
            expected = (
                order
                if order and isinstance(order[0], tuple(map(type, OVERLAP)))
                else (
                    Fence(),
                    *order,
                )
            )
            assert made.layers == expected
            accepted += 1
        else:
            with pytest.raises(ValueError, match="layers: "):
                Middleware(store, store, "c", layers=order)
    assert accepted > 20


def test_order_errors_say_what_is_wrong() -> None:
    store = InMemoryStore()
    with pytest.raises(ValueError, match=r"one overlap layer at most, got Fence\(\), Wait\(\)"):
        Middleware(store, store, "c", layers=(Fence(), Wait()))
    with pytest.raises(ValueError, match=r"Wait\(\) must come first \(the outermost\)"):
        Middleware(store, store, "c", layers=(KeepInterrupted(), Wait()))
    with pytest.raises(ValueError, match=r"KeepInterrupted\(\) must come last \(the innermost\)"):
        move = MoveHead(store, "", expected_head="")
        Middleware(store, store, "c", layers=(KeepInterrupted(), move))
    with pytest.raises(TypeError, match=r"layers\[1\] must be a layer"):
        Middleware(store, store, "c", layers=(Wait(), "keep"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="layers must be a list or tuple of layers, got Wait"):
        Middleware(store, store, "c", layers=Wait())  # type: ignore[arg-type]


def test_the_v04_keywords_still_work_with_a_deprecation_warning() -> None:
    store = InMemoryStore()
    with pytest.warns(DeprecationWarning, match=r"Middleware\(on_overlap=, lease_ttl=\.\.\.\)"):
        old = Middleware(store, store, "c", on_overlap="reject", lease_ttl=3)
    assert old.layers == (Reject(lease_ttl=3),)
    with pytest.warns(DeprecationWarning):
        keep = Middleware(store, store, "c", keep_interrupted=True, overlap_timeout=1)
    assert keep.layers == (Fence(), KeepInterrupted())
    with pytest.warns(DeprecationWarning):
        assert Middleware(store, store, "c", exclusive_turns=False).layers == (Unfenced(),)
    with pytest.raises(TypeError, match=r"takes layers= or the v0.4 keywords \(on_overlap\)"):
        Middleware(store, store, "c", on_overlap="wait", layers=(Wait(),))


def test_keyword_layers() -> None:
    assert keyword_layers() == (Fence(),)
    assert keyword_layers(exclusive_turns=False) == (Unfenced(),)
    assert keyword_layers("reject", lease_ttl=4) == (Reject(lease_ttl=4),)
    assert keyword_layers("wait", overlap_timeout=2) == (Wait(timeout=2),)
    assert keyword_layers("interrupt", keep_interrupted=True) == (Interrupt(), KeepInterrupted())
    with pytest.raises(ValueError, match="on_overlap must be one of"):
        keyword_layers("queue")
    with pytest.raises(ValueError, match="needs exclusive_turns=True"):
        keyword_layers("wait", exclusive_turns=False)
    with pytest.raises(TypeError, match="keep_interrupted must be a bool, got int"):
        keyword_layers(keep_interrupted=1)


def test_conversation_takes_its_keywords_or_layers_never_both() -> None:
    store, model = InMemoryStore(), FunctionModel(lambda request: "a")
    assert Conversation(model, store, "c", on_overlap="wait").middleware.layers == (Wait(),)
    layered = Conversation(model, store, "c", layers=(Interrupt(), KeepInterrupted()))
    assert layered.middleware.layers == (Interrupt(), KeepInterrupted())
    with pytest.raises(TypeError, match="takes layers= or keep_interrupted=, not both"):
        Conversation(model, store, "c", keep_interrupted=True, layers=(Wait(),))


def _runs(order: tuple[Any, ...]) -> bool:
    return _valid(order) and not any(isinstance(layer, MoveHead) for layer in order)


LAYERINGS = sorted({tuple(type(x).__name__ for x in o) for o in _orders() if _runs(o)})


@pytest.mark.anyio
@over_backends()
async def test_every_valid_layering_runs_a_turn_on_every_store(kind: str, tmp_path: Path) -> None:
    """Each layering: a turn is stored once; a failed turn is stored only when
    ``KeepInterrupted`` is there (marked); the lease, when one was taken, is free."""
    make = {
        "Fence": Fence,
        "Unfenced": Unfenced,
        "Reject": Reject,
        "Wait": Wait,
        "Interrupt": Interrupt,
        "KeepInterrupted": KeepInterrupted,
    }

    def answer(request: Request) -> str:
        if request.messages[-1].text.startswith("fail"):
            raise ProviderServerError("upstream 503")
        return "ok"

    async with fresh_store(kind, tmp_path) as store:
        for index, names in enumerate(LAYERINGS):
            cid = f"c{index}"
            layers = tuple(make[name]() for name in names)
            mw = Middleware(store, store, cid, layers=layers)
            model = wrap(FunctionModel(answer), mw.call)
            await model.call(Request((user_message("q"),)))
            with pytest.raises(ProviderServerError):
                await model.call(Request((user_message("fail"),)))
            texts = [m.text for m in await store.read(cid)]
            kept = "KeepInterrupted" in names
            assert texts == (["q", "ok", "fail"] if kept else ["q", "ok"]), names
            assert await store.acquire_turn(cid, "someone", 5), names  # given back
