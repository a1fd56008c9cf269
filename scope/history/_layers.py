"""The layers a history ``Middleware`` composes around its replay and commit (DESIGN
§6m), as public values: one overlap layer (``Fence``, the default; ``Unfenced``;
``Reject``; ``Wait``; ``Interrupt``), then any ``MoveHead``, then ``KeepInterrupted``.

Each is a frozen value that checks its arguments when made; the Middleware binds it to
its store when it is made (``TypeError`` there for a store that lacks what the layer
needs). The rules of each layer are in its docstring; ``Middleware`` documents the
replay and the commit only.
"""

from __future__ import annotations

from typing import Final, final

import attrs

from scope._validate import check_seconds
from scope.history._movehead import MoveHead

__all__ = [
    "OVERLAP_LAYERS",
    "Fence",
    "Interrupt",
    "KeepInterrupted",
    "Layers",
    "OverlapLayer",
    "Reject",
    "Unfenced",
    "Wait",
    "check_order",
    "keyword_layers",
]


def _timeout(value: object) -> float:
    return check_seconds(value, "timeout")


def _ttl(value: object) -> float:
    return check_seconds(value, "lease_ttl", positive=True)


@final
@attrs.frozen
class Fence:
    """The default overlap layer (DESIGN §6b): no lease; overlapping turns both run and
    the fence commits one. The history is read as one ``HistoryView`` and the commit
    carries ``expected_length=view.length`` and ``expected_head=view.fence_head``, so it
    lands only if no other turn was stored, and the head was not moved to another
    branch, since the history was read. The other turn raises ``CommitError`` with
    ``retryable=False`` and a ``HistoryChangedError`` cause: run it again on the current
    history. The leasing layers keep the fence on as their safety net.

    Needs a reader with atomic views (a ``ViewReader``: every bundled store and
    ``WindowReader``; not a plain ``Reader``, nor a ``StoreAdapter`` without
    ``atomic_views``): ``TypeError`` when the Middleware is made (use ``Unfenced()`` for
    such a reader, knowing what it gives up)."""


@final
@attrs.frozen
class Unfenced:
    """No fence and no lease: overlapping turns both commit, each answer generated
    without the other turn, stored one after the other. For a reader without atomic
    views (a plain ``Reader``, a ``StoreAdapter`` without ``atomic_views``), which
    cannot fence."""


@final
@attrs.frozen
class Reject:
    """A turn takes the conversation's turn lease (``TurnLeaser``) before the history is
    read and raises ``TurnInProgressError`` (nothing stored, the model not called) when
    another turn holds it or waits for it. The lease (``lease_ttl`` seconds, a number >
    0; renewed every third of it while the model runs) is released on every path
    (commit, error, cancellation, early stop, a cancellation while it was being taken),
    shielded from cancellation and bounded. The fence stays on where the reader has
    atomic views; over one without (a ``StoreAdapter`` of a simple store), the lease
    alone keeps the turns apart. Needs a writer or reader that is a ``TurnLeaser``
    (``TypeError`` when the Middleware is made); with one
    ``Store`` as reader and writer the lease steps fold into the read and the commit
    (as many store steps as a fenced turn). See docs/history.md."""

    lease_ttl: float = attrs.field(default=15.0, converter=_ttl)


@final
@attrs.frozen
class Wait:
    """As ``Reject``, but a turn that finds the lease held waits for it, at most
    ``timeout`` seconds (a number >= 0; then ``TurnInProgressError``), and runs on the
    history as it is then; the turns of one process are served in arrival order."""

    timeout: float = attrs.field(default=30.0, converter=_timeout)
    lease_ttl: float = attrs.field(default=15.0, converter=_ttl)


@final
@attrs.frozen
class Interrupt:
    """As ``Wait``, but a newer turn stops the running one (it raises
    ``TurnInterruptedError``; ``on_incomplete`` reason ``interrupted``) and runs once
    the lease is free, waiting at most ``timeout`` seconds: at once within one process,
    at the running turn's next lease renewal across processes."""

    timeout: float = attrs.field(default=30.0, converter=_timeout)
    lease_ttl: float = attrs.field(default=15.0, converter=_ttl)


@final
@attrs.frozen
class KeepInterrupted:
    """Store a turn that ends after the model was asked (its stream cancelled, stopped
    early by the consumer, failed with an error from the model, or interrupted:
    ``reason`` ``cancelled``, ``stopped``, ``error``, ``interrupted``) as the open turn
    (the user message and its complete tool-call/result pairs) plus the partial
    assistant message: the text, reasoning and media received so far, under the
    partial's message metadata; tool calls are dropped, as their results never came.
    The last stored message carries message metadata ``scope/interrupted`` = the reason:
    the partial assistant message, or the open turn's last message when nothing of the
    answer remains. A ``call`` has no partial answer: it keeps the open turn, marked.

    Not kept: failures before the model is asked (request checks, reading the history,
    a closed conversation), an invalid response, a ``CommitError`` and a cancellation
    during the commit's append. The write is fenced like a commit, appended under a
    fresh ``new_append_id()``, shielded from the cancellation and bounded to 5 seconds,
    while the lease is still held; whatever becomes of it (stored, refused by the fence,
    failed, timed out: the latter three logged as warnings on ``scope.history``), the
    original cancellation or error then propagates unchanged, and ``on_incomplete``
    reports the stored batch as ``kept``. A host that retries such a turn sends the
    question again: it is stored twice, the first copy marked. The innermost layer."""


OverlapLayer = Fence | Unfenced | Reject | Wait | Interrupt

#: The overlap layers (at most one per Middleware, the outermost).
OVERLAP_LAYERS: Final = (Fence, Unfenced, Reject, Wait, Interrupt)

#: What ``Middleware(layers=...)`` takes.
Layers = Fence | Unfenced | Reject | Wait | Interrupt | MoveHead | KeepInterrupted

_KINDS: Final = (*OVERLAP_LAYERS, MoveHead, KeepInterrupted)


def check_order(layers: object) -> tuple[Layers, ...]:
    """``layers=``, checked and completed: a list or tuple of layers (``TypeError``
    otherwise), at most one overlap layer and first, at most one ``MoveHead``, at most
    one ``KeepInterrupted`` and last (``ValueError`` otherwise); ``Fence()`` goes first
    when no overlap layer was given."""
    if not isinstance(layers, (list, tuple)):
        raise TypeError(f"layers must be a list or tuple of layers, got {type(layers).__name__}")
    for index, layer in enumerate(layers):
        if not isinstance(layer, _KINDS):
            raise TypeError(
                f"layers[{index}] must be a layer (scope.history.Fence, Unfenced, Reject, "
                f"Wait, Interrupt, MoveHead or KeepInterrupted), got {type(layer).__name__}"
            )
    checked: tuple[Layers, ...] = tuple(layers)
    names = [type(layer).__name__ + "()" for layer in checked]
    for kinds, what, place in (
        (OVERLAP_LAYERS, "overlap layer", 0),
        ((MoveHead,), "MoveHead", None),
        ((KeepInterrupted,), "KeepInterrupted", len(checked) - 1),
    ):
        found = [i for i, layer in enumerate(checked) if isinstance(layer, kinds)]
        if len(found) > 1:
            raise ValueError(
                f"layers: one {what} at most, got {', '.join(names[i] for i in found)}"
            )
        if found and place is not None and found[0] != place:
            where = "first (the outermost)" if place == 0 else "last (the innermost)"
            raise ValueError(
                f"layers: {names[found[0]]} must come {where}, got ({', '.join(names)})"
            )
    if not checked or not isinstance(checked[0], OVERLAP_LAYERS):
        checked = (Fence(), *checked)
    return checked


def keyword_layers(
    on_overlap: object = "fence",
    *,
    overlap_timeout: object = 30.0,
    lease_ttl: object = 15.0,
    keep_interrupted: object = False,
    exclusive_turns: object = True,
) -> tuple[Layers, ...]:
    """The layers the keywords of ``Conversation`` (and the deprecated ones of v0.4's
    ``Middleware``) stand for: ``on_overlap`` ``"fence"`` (``Fence()``, or
    ``Unfenced()`` with ``exclusive_turns=False``), ``"reject"`` (``Reject(lease_ttl)``),
    ``"wait"`` / ``"interrupt"`` (``Wait``/``Interrupt(overlap_timeout, lease_ttl)``),
    then ``KeepInterrupted()`` with ``keep_interrupted=True``. Checked under the
    keywords' names: ``TypeError``/``ValueError`` as each says, and ``ValueError`` for a
    leasing strategy with ``exclusive_turns=False``."""
    for name, value in (
        ("exclusive_turns", exclusive_turns),
        ("keep_interrupted", keep_interrupted),
    ):
        if type(value) is not bool:
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if type(on_overlap) is not str or on_overlap not in _STRATEGIES:
        raise ValueError(
            f"on_overlap must be one of {', '.join(map(repr, _STRATEGIES))}, got {on_overlap!r}"
        )
    timeout = check_seconds(overlap_timeout, "overlap_timeout")
    ttl = check_seconds(lease_ttl, "lease_ttl", positive=True)
    if on_overlap != "fence" and not exclusive_turns:
        raise ValueError(
            f"on_overlap={on_overlap!r} needs exclusive_turns=True (the fence stays on "
            "as the safety net); exclusive_turns=False allows only on_overlap='fence'"
        )
    overlap: OverlapLayer = Fence() if exclusive_turns else Unfenced()
    if on_overlap == "reject":
        overlap = Reject(lease_ttl=ttl)
    elif on_overlap != "fence":
        overlap = (Wait if on_overlap == "wait" else Interrupt)(timeout=timeout, lease_ttl=ttl)
    return (overlap, KeepInterrupted()) if keep_interrupted else (overlap,)


_STRATEGIES: Final = ("fence", "reject", "wait", "interrupt")
