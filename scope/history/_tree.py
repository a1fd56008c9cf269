"""``HistoryTree``: every batch of a conversation on every branch, and its head, from one
atomic read (DESIGN §6h)."""

from __future__ import annotations

from typing import final

import attrs

from scope.errors import InvalidViewError
from scope.history._batch import Batch

__all__ = ["HistoryTree"]


@final
@attrs.frozen
class HistoryTree:
    """What ``Store.read_tree`` returns: a conversation as the tree of batches it is.

    - ``batches``: every accepted batch of every branch, in the order they were stored
      (each equal to the batch appended, as ``read_batches`` returns them).
    - ``parents[i]``: the index in ``batches`` of the batch ``batches[i]`` follows, or -1
      for a batch that starts the conversation. A parent is always stored before its
      children (``parents[i] < i``).
    - ``created[i]``: when ``batches[i]`` was stored, in Unix seconds by the store's
      clock; None where the store did not record it (data written before branches).
    - ``head``: the index of the head batch, -1 when the head path is empty (a new
      conversation, or one rewound to its start).
    - ``closed``: whether the conversation was cleared (then everything else is empty).

    ``read``, ``read_batches`` and ``read_view`` see the head path only: the batches from
    the root to ``head`` (``path(head)``). Invalid fields raise ``InvalidViewError``.
    """

    batches: tuple[Batch, ...] = attrs.field(converter=tuple)
    parents: tuple[int, ...] = attrs.field(converter=tuple)
    created: tuple[float | None, ...] = attrs.field(converter=tuple)
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

    def head_path(self) -> tuple[Batch, ...]:
        """The batches of the head path, in order: what ``read_batches`` returns."""
        return tuple(self.batches[i] for i in self.path(self.head))
