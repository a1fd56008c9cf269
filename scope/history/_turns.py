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

Projections are remembered per conversation (LRU): when the next read returns the same
message objects (stores hand out the same immutable ``Message`` objects for batches they
decoded or appended before) plus new ones, only the new ones are grouped; the turn costs
a ``TokenCounter`` measured for unchanged turns, the stable windows' replay steps over
unchanged turns (``_window.py``) and the windows computed on an unchanged history are
kept with the projection. Anything else is projected afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final, final

from scope.chat import Message, Part, PartKind, Role, text_part
from scope.errors import StoreError
from scope.history._ids import ConversationID
from scope.metadata import Metadata

__all__ = ["COMPACTION_KEY", "Projection", "compaction_covers", "project", "projections"]

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
        "leading",
        "replays",
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


@final
class Projections:
    """Projections of recently read conversations (LRU, ``max_conversations``).

    Thread-safe; a projection is replaced whole, never changed in place (its caches
    aside)."""

    def __init__(self, max_conversations: int = 1024) -> None:
        self.max_conversations = max_conversations
        self._lock = threading.Lock()
        self._entries: OrderedDict[ConversationID, Projection] = OrderedDict()

    def project(self, cid: ConversationID, stored: Sequence[Message]) -> Projection:
        """The projection of ``stored`` (see the module docstring)."""
        stored = tuple(stored)
        with self._lock:
            entry = self._entries.get(cid)
            if entry is not None:
                self._entries.move_to_end(cid)
        old = 0 if entry is None else len(entry.stored)
        projection: Projection | None = None
        # The same messages first (identical objects: a C loop of identity checks; an
        # equal message would do as well, the projection being a function of content).
        if entry is not None and len(stored) >= old and stored[:old] == entry.stored:
            if len(stored) == old:
                return entry
            _check_messages(cid, stored, old)
            projection = entry.extended(cid, stored)
        if projection is None:
            _check_messages(cid, stored, 0)
            projection = _fresh(cid, stored)
        with self._lock:
            self._entries[cid] = projection
            self._entries.move_to_end(cid)
            while len(self._entries) > self.max_conversations:
                self._entries.popitem(last=False)
        return projection

    def clear(self) -> None:
        """Forget every projection (tests; memory)."""
        with self._lock:
            self._entries.clear()


#: The process-wide cache every WindowReader shares (a service usually builds one per
#: request, so a per-instance cache would never be warm).
projections: Final = Projections()


def project(cid: ConversationID, stored: Sequence[Message]) -> Projection:
    """``projections.project``."""
    return projections.project(cid, stored)


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
