"""``ConversationMeta``: what a store keeps about a conversation besides its tree (DESIGN
§6h moves, §6i owner and retention), as ``Store.read_meta`` returns it (§6n export)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, Literal, final

import attrs

from scope.errors import InvalidViewError
from scope.history._erasure import check_owner
from scope.history._tree import check_head, check_move_id

__all__ = ["CLOSURES", "Closure", "ConversationMeta"]

#: How a conversation was closed (``ConversationMeta.closure``).
Closure = Literal["cleared", "expired", "erased"]
#: Every ``Closure``, in that order.
CLOSURES: Final[tuple[Closure, ...]] = ("cleared", "expired", "erased")


def _moves(value: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The pairs as plain ``str`` pairs sorted by move id (``AppendID`` and other str
    subclasses become ``str``); anything else is left for ``validate`` to name."""
    pairs = tuple(tuple(pair) for pair in value)
    if all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        return tuple(sorted((str(move), str(head)) for move, head in pairs))
    return pairs  # type: ignore[return-value]  # validate() names what is wrong


@final
@attrs.frozen
class ConversationMeta:
    """What ``Store.read_meta`` returns: the conversation's records that are not batches.

    - ``owner``: the principal its first append recorded (None: none).
    - ``expires_at``: when it expires, Unix seconds by the store's clock (None: never).
    - ``retained``: whether ``retain`` set that expiry (so the store-wide retention no
      longer moves it); False when the store-wide retention did, or nothing did.
    - ``moves``: the head moves recorded under a move id (``move_head(...,
      move_id=...)``), ``(move id, the append id it moved the head to, "" for the
      start)``, sorted by move id; their retries return what they returned.
    - ``closure``: how it was closed: ``"cleared"`` (``clear``), ``"expired"`` (its
      expiry passed, whether or not ``expire`` removed it since), ``"erased"``
      (``erase``: only its tombstone is left, so nothing else is set), or None (open,
      or never written). See ``Store.read_meta``.

    Invalid fields raise ``InvalidViewError`` (an owner breaking ``check_owner``'s rules
    too, so a corrupt record is never mistaken for a valid one).
    """

    owner: str | None = None
    expires_at: float | None = None
    retained: bool = False
    moves: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_moves)
    closure: Closure | None = None

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the fields (construction already did)."""
        if self.owner is not None:
            try:
                check_owner(self.owner)
            except (TypeError, ValueError) as exc:
                raise InvalidViewError(f"owner: {exc}") from None
        if self.expires_at is not None and (
            type(self.expires_at) is not float or not math.isfinite(self.expires_at)
        ):
            raise InvalidViewError(
                f"expires_at must be a finite float (Unix seconds) or None, got {self.expires_at!r}"
            )
        if type(self.retained) is not bool:
            raise InvalidViewError(f"retained must be a bool, got {type(self.retained).__name__}")
        seen: set[str] = set()
        for pair in self.moves:
            if len(pair) != 2 or not all(type(x) is str for x in pair):
                raise InvalidViewError(f"moves: each must be (move id, head), got {pair!r}")
            move, head = pair
            try:
                check_move_id(move)
                check_head(head, f"the head of move {move!r}")
            except ValueError as exc:
                raise InvalidViewError(f"moves: {exc}") from None
            if move in seen:
                raise InvalidViewError(f"moves: move id {move!r} is given twice")
            seen.add(move)
        if self.closure is not None and (
            type(self.closure) is not str or self.closure not in CLOSURES
        ):
            raise InvalidViewError(
                f"closure must be one of {', '.join(CLOSURES)} or None, got {self.closure!r}"
            )
        if self.closure == "erased" and (
            self.owner is not None or self.expires_at is not None or self.retained or self.moves
        ):
            raise InvalidViewError("an erased conversation keeps nothing but its closure")
