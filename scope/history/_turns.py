"""A stored history as turns, through its newest compaction (DESIGN §6b, §6d).

``project(cid, stored)`` is what ``WindowReader`` windows and ``compact`` summarises:

- the merged system message: every stored system message that is not a compaction, in
  stored order, then the newest compaction's summary (its parts last), joined by
  ``"\\n\\n"`` text parts, metadata merged (later wins);
- the retained messages: the non-system messages stored at or after the newest
  compaction's ``covers`` (all of them without a compaction), with their reasoning
  parts dropped when a compaction applies (the prefix they were bound to is gone), each
  with its index in the stored list;
- grouped into turns: a turn starts at a user message and keeps every assistant and
  tool message after it; messages before the first user message belong to the first
  turn.

Projections are remembered per conversation in a ``HistoryCache`` (``project``): the
cache of the reader's store handle, so a WindowReader built per request finds the
projection its store handle kept, and two stores holding the same conversation id never
share one (a reader with no cache of its own: one its WindowReader owns). When the next
read returns the same message objects (stores hand out the same immutable ``Message``
objects for batches they decoded or appended before) plus new ones, only the new ones
are grouped; the turn costs a ``TokenCounter`` measured for unchanged turns, the stable
windows' replay steps over unchanged turns (``_window.py``) and the windows computed on
an unchanged history are kept with the projection. Anything else is projected afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, final

from scope.chat import Message, Part, PartKind, Role, text_part
from scope.codec import encode_messages
from scope.errors import StoreError
from scope.history._ids import ConversationID
from scope.metadata import Metadata

if TYPE_CHECKING:
    from scope.history._cache import HistoryCache

__all__ = ["COMPACTION_KEY", "Projection", "compaction_covers", "project"]

#: Message metadata of a compaction's system message: ``{"covers": <messages before the
#: boundary>}`` (DESIGN §6d).
COMPACTION_KEY: Final = "scope/compaction"

_SEPARATOR: Final = text_part("\n\n")


def compaction_covers(cid: ConversationID, index: int, message: Message) -> int | None:
    """The ``covers`` of a stored compaction message, None when ``message`` is not one
    (not a system message with ``scope/compaction`` metadata). A compaction whose
    metadata is not ``{"covers": <int between 0 and its own index>}`` raises
    ``StoreError``: it was not written by ``compact`` and cannot be trusted."""
    if message.role is not Role.SYSTEM:
        return None
    raw = message.metadata.get(COMPACTION_KEY)
    if raw is None:
        return None
    value = raw.value()
    covers = value.get("covers") if type(value) is dict else None
    if type(covers) is not int or not 0 <= covers <= index:
        raise StoreError(
            f"stored history of conversation {str(cid)!r}: message {index} has "
            f"{COMPACTION_KEY} metadata {raw.bytes.decode()!s}; expected "
            f'{{"covers": <an integer between 0 and {index}>}}'
        )
    return covers


@final
class Projection:
    """One conversation's stored messages as the merged system message and turns.

    Immutable once built (``extended`` returns a new one); ``costs``, ``replays`` and
    ``windows`` are caches filled by ``WindowReader`` (dict operations, atomic under the
    GIL)."""

    __slots__ = (
        "compaction",
        "costs",
        "covers",
        "held",
        "leading",
        "replays",
        "size",
        "starts",
        "stored",
        "system",
        "systems",
        "turns",
        "windows",
    )

    def __init__(
        self,
        stored: tuple[Message, ...],
        systems: tuple[Message, ...],
        compaction: Message | None,
        covers: int,
        turns: list[tuple[Message, ...]],
        starts: list[int],
        leading: bool,
    ) -> None:
        self.stored = stored
        self.systems = systems  # stored non-compaction system messages
        self.compaction = compaction  # the newest compaction message, or None
        self.covers = covers  # 0 without a compaction
        self.turns = turns
        self.starts = starts  # stored index of each turn's first message
        self.leading = leading  # the last turn holds only pre-user messages so far
        parts = [*systems, compaction] if compaction is not None else list(systems)
        self.system = merge_systems(parts) if parts else None
        # Its size in a HistoryCache (``project``); ``held``: the part its messages take.
        self.held = 0
        self.size = 0
        # id(counter) -> (counter, costs of turns[:len(costs)])
        self.costs: dict[int, tuple[Any, list[int]]] = {}
        # window key -> (counter, (k, n, start, sizes, folded)): the stable window's
        # replay (``_window.py``) at its newest step, the first n messages of turn k,
        # with the last measures of its window
        self.replays: dict[tuple[Any, ...], tuple[Any, tuple[int, int, int, Any, Any]]] = {}
        # window key -> (counter, window)
        self.windows: dict[tuple[Any, ...], tuple[Any, tuple[Message, ...]]] = {}

    def messages(self, start: int = 0, stop: int | None = None) -> list[Message]:
        """The merged system message (if any), then turns[start:stop]."""
        out: list[Message] = [] if self.system is None else [self.system]
        for turn in self.turns[start:stop]:
            out.extend(turn)
        return out

    def extended(self, cid: ConversationID, stored: tuple[Message, ...]) -> Projection | None:
        """This projection over ``stored``, its own stored messages then fresh ones, or
        None when those hold a system message (the merged message changes: project
        afresh)."""
        old = len(self.stored)
        fresh = stored[old:]
        turns = list(self.turns)
        starts = list(self.starts)
        stable = len(turns)  # turns before this index are unchanged
        leading = self.leading
        strip = self.compaction is not None
        for offset, message in enumerate(fresh):
            if message.role is Role.SYSTEM:
                return None
            index = old + offset
            if strip:
                message = _without_reasoning(message)  # type: ignore[assignment]
                if message is None:
                    continue
            leading = _group(turns, starts, message, index, leading)
            stable = min(stable, len(turns) - 1)
        out = Projection(
            stored,
            self.systems,
            self.compaction,
            self.covers,
            turns,
            starts,
            leading,
        )
        for key, (counter, costs) in self.costs.items():
            out.costs[key] = (counter, costs[:stable])
        # A replay step saw a prefix of the messages, and those only grew.
        out.replays.update(self.replays)
        return out


def _group(
    turns: list[tuple[Message, ...]],
    starts: list[int],
    message: Message,
    index: int,
    leading: bool,
) -> bool:
    """Add one non-system message to ``turns``; the new ``leading``."""
    if message.role is Role.USER and not leading:
        turns.append((message,))
        starts.append(index)
        return False
    if turns:
        turns[-1] = (*turns[-1], message)
        return leading and message.role is not Role.USER
    # Non-system messages before the first user message start the first turn, and the
    # first user message joins them instead of starting a turn of its own.
    turns.append((message,))
    starts.append(index)
    return True


def _without_reasoning(message: Message) -> Message | None:
    """``message`` without its reasoning parts (None when nothing else remains)."""
    if message.role is not Role.ASSISTANT or not any(
        part.kind is PartKind.REASONING for part in message.parts
    ):
        return message
    parts = [part for part in message.parts if part.kind is not PartKind.REASONING]
    if not parts:
        return None
    return Message(Role.ASSISTANT, parts, message.metadata)


def _fresh(cid: ConversationID, stored: tuple[Message, ...]) -> Projection:
    compaction: Message | None = None
    covers = 0
    for index in range(len(stored) - 1, -1, -1):
        found = compaction_covers(cid, index, stored[index])
        if found is not None:
            compaction, covers = stored[index], found
            break
    systems: list[Message] = []
    turns: list[tuple[Message, ...]] = []
    starts: list[int] = []
    leading = False
    for index, message in enumerate(stored):
        if message.role is Role.SYSTEM:
            if compaction_covers(cid, index, message) is None:
                systems.append(message)
            continue
        if index < covers:
            continue
        if compaction is not None:
            kept = _without_reasoning(message)
            if kept is None:
                continue
            message = kept
        leading = _group(turns, starts, message, index, leading)
    return Projection(stored, tuple(systems), compaction, covers, turns, starts, leading)


def _check_messages(cid: ConversationID, stored: tuple[object, ...], start: int) -> None:
    for index in range(start, len(stored)):
        if type(stored[index]) is not Message:
            raise StoreError(
                f"stored history of conversation {str(cid)!r}: message {index} is a "
                f"{type(stored[index]).__name__}, not a Message"
            )


#: What a projection is charged in its cache beyond its messages (see ``project``): per
#: stored message, its pointers in ``stored``, in its turn and in a window or two.
PER_MESSAGE_BYTES: Final = 32
#: Per turn: its tuple, its start index and a token cost or two.
PER_TURN_BYTES: Final = 160


def project(
    cache: HistoryCache | None, cid: ConversationID, stored: Sequence[Message]
) -> Projection:
    """The projection of ``stored`` (see the module docstring), remembered in ``cache``
    under the conversation (None: nothing remembered, nothing reused).

    A projection is replaced whole in its cache, never changed in place (its caches
    aside). Its size there (``Projection.size``): twice the canonical encoded size of
    its stored messages, as ``HistoryCache`` charges every entry holding messages (the
    projection holds them whether or not the cache's decoded batches still do), plus
    ``PER_MESSAGE_BYTES`` per stored message and ``PER_TURN_BYTES`` per turn for what
    the projection adds (its turn tuples, starts, token costs and remembered windows).
    Grown incrementally: a turn sizes only its new messages."""
    stored = tuple(stored)
    sized = cache is not None and cache.max_bytes > 0
    entry: Projection | None = None if not sized else cache._get(_key(cid))  # type: ignore[union-attr]
    old = 0 if entry is None else len(entry.stored)
    projection: Projection | None = None
    held = 0
    # The same messages first (identical objects: a C loop of identity checks; an
    # equal message would do as well, the projection being a function of content).
    if entry is not None and len(stored) >= old and stored[:old] == entry.stored:
        if len(stored) == old:
            return entry
        _check_messages(cid, stored, old)
        projection = entry.extended(cid, stored)
        held = entry.held + _encoded_size(stored[old:])
    if projection is None:
        _check_messages(cid, stored, 0)
        projection = _fresh(cid, stored)
        held = _encoded_size(stored) if sized else 0
    if sized and stored:
        assert cache is not None
        projection.held = held
        projection.size = (
            held + PER_MESSAGE_BYTES * len(stored) + PER_TURN_BYTES * len(projection.turns)
        )
        cache._put(_key(cid), projection, projection.size, replace=True)
    return projection


def _key(cid: str) -> tuple[str, ...]:
    """A projection's key in a ``HistoryCache``: the conversation first (``forget``
    drops it), three long so it is neither a batch's ``(cid, digest)`` nor a replay's
    ``(cid,)``."""
    return (cid, "", "projection")


def _encoded_size(messages: tuple[Message, ...]) -> int:
    """Twice the canonical encoded size of ``messages`` (``HistoryCache``'s measure),
    each message with its separator in the JSON array, so sizes of consecutive pieces
    add up to the size of the whole; 0 for none. Checked Messages have their encoding
    cached, so this costs a join."""
    return 2 * (len(encode_messages(messages)) - 1) if messages else 0


def merge_systems(systems: Sequence[Message]) -> Message:
    """One system message of ``systems``: their parts in order with a ``"\\n\\n"`` text
    part between messages, metadata merged (later wins); a single message as it is."""
    if len(systems) == 1:
        return systems[0]
    parts: list[Part] = []
    metadata = Metadata()
    for index, message in enumerate(systems):
        if index:
            parts.append(_SEPARATOR)
        parts.extend(message.parts)
        metadata = metadata.merge(message.metadata)
    return Message(Role.SYSTEM, parts, metadata)
