"""``HistoryTree``: every batch of a conversation on every branch, and its head, from one
atomic read (DESIGN §6h)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import final

import attrs

from scope.errors import InvalidAppendIDError, InvalidViewError
from scope.history._batch import Batch
from scope.history._ids import AppendID

__all__ = ["HistoryTree", "check_created", "check_head", "check_move_id"]


def _batches(value: Iterable[Batch]) -> tuple[Batch, ...]:
    return tuple(value)


def _ints(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _times(value: Iterable[float | None]) -> tuple[float | None, ...]:
    return tuple(value)


@final
@attrs.frozen
class HistoryTree:
    """What ``Store.read_tree`` returns: a conversation as the tree of batches it is.

    - ``batches``: every accepted batch of every branch, in the order they were stored
      (each equal to the batch appended, as ``read_batches`` returns them).
    - ``parents[i]``: the index in ``batches`` of the batch ``batches[i]`` follows, or -1
      for a batch that starts the conversation. A parent is always stored before its
      children (``parents[i] < i``).
    - ``created[i]``: when ``batches[i]`` was stored, in Unix seconds (a ``float``) by
      the store's clock; None where the store did not record it (data written before
      branches).
    - ``head``: the index of the head batch, -1 when the head path is empty (a new
      conversation, or one rewound to its start).
    - ``closed``: whether the conversation was cleared (then everything else is empty).

    ``read``, ``read_batches`` and ``read_view`` see the head path only: the batches from
    the root to ``head`` (``path(head)``). Invalid fields raise ``InvalidViewError``.
    """

    batches: tuple[Batch, ...] = attrs.field(converter=_batches)
    parents: tuple[int, ...] = attrs.field(converter=_ints)
    created: tuple[float | None, ...] = attrs.field(converter=_times)
    head: int = -1
    closed: bool = False

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the tree (construction already did)."""
        n = len(self.batches)
        if len(self.parents) != n or len(self.created) != n:
            raise InvalidViewError(
                f"a tree needs one parent and one created time per batch: {n} batches, "
                f"{len(self.parents)} parents, {len(self.created)} created times"
            )
        for index, batch in enumerate(self.batches):
            if type(batch) is not Batch:
                raise InvalidViewError(
                    f"batches[{index}] must be a Batch, got {type(batch).__name__}"
                )
        for index, parent in enumerate(self.parents):
            if type(parent) is not int or not -1 <= parent < index:
                raise InvalidViewError(
                    f"parents[{index}] must be -1 or the index of an earlier batch, got {parent!r}"
                )
        for index, stamp in enumerate(self.created):
            if stamp is not None and (type(stamp) is not float or stamp != stamp):
                raise InvalidViewError(
                    f"created[{index}] must be a float (Unix seconds) or None, got {stamp!r}"
                )
        if type(self.head) is not int or not -1 <= self.head < n:
            raise InvalidViewError(f"head must be -1 or a batch index below {n}, got {self.head!r}")
        if type(self.closed) is not bool:
            raise InvalidViewError(f"closed must be a bool, got {type(self.closed).__name__}")
        if self.closed and (n or self.head != -1):
            raise InvalidViewError("a closed conversation's tree holds no batches")

    def path(self, index: int) -> tuple[int, ...]:
        """The indexes of the batches from the root to ``batches[index]`` (``()`` for
        -1), in order."""
        path: list[int] = []
        while index != -1:
            path.append(index)
            index = self.parents[index]
        path.reverse()
        return tuple(path)

    def chain(self, index: int) -> str:
        """The chain digest of the path from the root to ``batches[index]`` (DESIGN §6h):
        ``chain(-1) == ""``; ``chain(i) == "sha256:" + hex(sha256((chain(parents[i]) +
        "\\n" + batches[i].digest).encode()))``, so it covers every batch of the path, in
        order. An index outside ``-1 .. len(batches) - 1`` raises ``IndexError``."""
        if type(index) is not int or not -1 <= index < len(self.batches):
            raise IndexError(
                f"chain needs -1 or a batch index below {len(self.batches)}, got {index!r}"
            )
        digest = ""
        for at in self.path(index):
            text = digest + "\n" + self.batches[at].digest
            digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        return digest

    def head_path(self) -> tuple[Batch, ...]:
        """The batches of the head path, in order: what ``read_batches`` returns."""
        return tuple(self.batches[i] for i in self.path(self.head))


def check_head(value: object, what: str) -> str:
    """``value`` as a head (an append id, or ``""``: before the first batch), or
    ``InvalidAppendIDError`` naming ``what`` (before any I/O)."""
    if isinstance(value, str) and value == "":
        return ""
    if not isinstance(value, str):
        raise InvalidAppendIDError(
            f"{what} must be a str (an append id or ''), got {type(value).__name__}"
        )
    try:
        return str(AppendID(value))
    except InvalidAppendIDError as exc:
        raise InvalidAppendIDError(f"{what}: {exc}") from exc


def check_move_id(value: object) -> AppendID | None:
    """``value`` as a move id (an append id's rules; None: none), or
    ``InvalidAppendIDError`` (before any I/O)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidAppendIDError(f"move_id must be a str or None, got {type(value).__name__}")
    try:
        return AppendID(value)
    except InvalidAppendIDError as exc:
        raise InvalidAppendIDError(f"move_id: {exc}") from exc


#: The first stored time ``check_created`` refuses: 10000-01-01T00:00:00Z, the end of
#: what a ``datetime`` (and so every bundled store's time column) holds.
CREATED_LIMIT = 253402300800.0


def check_created(value: object) -> float | None:
    """``value`` as a stored time to restore (``Store.append``'s ``created``: Unix
    seconds, an int or float from 0 up to, not including, the year 10000; None: none),
    as a ``float``. ``TypeError`` for anything but None, an int or a float (a bool
    too), ``ValueError`` for a number outside that range (NaN and infinities too),
    before any I/O."""
    if value is None:
        return None
    if type(value) is bool or not isinstance(value, int | float):
        raise TypeError(
            f"created must be Unix seconds (an int or float) or None, got {type(value).__name__}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        seconds = math.inf
    if not (math.isfinite(seconds) and 0.0 <= seconds < CREATED_LIMIT):
        raise ValueError(
            f"created must be Unix seconds from 0 to before the year 10000, got {value!r}"
        )
    return seconds
