"""``HistoryCache``: one store handle's memory of decoded history, bounded in bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final, final

from scope._validate import check_type
from scope.chat import Message
from scope.history._batch import Batch
from scope.history._tokens import DefaultTokenCounter

__all__ = ["DEFAULT_CACHE_BYTES", "HistoryCache", "cache_bytes"]

#: The default bound of a store handle's cache: 32 MiB.
DEFAULT_CACHE_BYTES: Final = 32 * 1024 * 1024


def cache_bytes(value: object) -> int:
    """A ``cache_bytes`` option: an int (else ``TypeError``) >= 0 (else ``ValueError``)."""
    check_type(value, int, "cache_bytes", "an integer")
    assert isinstance(value, int)
    if value < 0:
        raise ValueError(f"cache_bytes must be an integer >= 0, got {value!r}")
    return value


@final
class HistoryCache:
    """What one store handle keeps of the history it read and wrote, so a conversation
    read again on every turn is neither decoded nor checked again: one LRU, bounded by
    ``max_bytes``, of three kinds of entries per conversation.

    - **Decoded batches**, by conversation and batch digest: the messages a store
      decoded from a stored record, or the messages of a batch it appended. A store
      still fetches every record and checks it against its digest on every read; equal
      digests mean equal bytes, so the cached messages (immutable values) are exactly
      what decoding would give. Nothing is served without that fetch, so a handle
      never returns messages of a conversation another handle cleared.
    - **Checked replays**, by conversation: the stored history the history Middleware
      last proved to form a valid request sequence (``scope.history._replay``), so the
      next turn checks only what is new.
    - **Window projections**, by conversation: what ``WindowReader`` remembers of a
      conversation (``scope.history._turns.project``), so the next turn groups, counts
      and replays only what is new.

    No entry is served on a conversation's length alone, so a head moved to another
    branch (DESIGN §6h: a rewind, then turns reaching the same length) never gets the
    old branch's: decoded batches are keyed by digest, a replay is reused only for the
    very message objects it checked, a projection only for equal stored messages.

    Sizes: an entry counts twice the canonical encoded size of its messages (media
    included): the encoding each message keeps for re-encoding, and the decoded values
    themselves; a projection adds a little per message and per turn for its structure.
    A message held by several kinds counts in each, so ``max_bytes`` bounds
    what the cache holds from above. An entry larger than ``max_bytes`` alone is not
    kept; ``max_bytes=0`` keeps nothing (every read decodes, every turn checks its
    whole replay). The least recently used entries leave first; ``forget`` drops a
    conversation's entries (its store does on ``clear`` and when ``read_view`` finds it
    closed). Thread-safe: one lock guards the entries, whichever thread reads or writes.

    ``turns`` is the rest of the handle's state in this process: the lease layer's
    per-conversation queues (``scope.history._overlap``: the turn holding the
    conversation's lease through this handle, the turns waiting for it, the leases left
    behind). Not an entry: neither bounded by ``max_bytes`` nor touched by ``forget`` and
    ``clear``; that layer drops a conversation's queue once it is empty.
    """

    __slots__ = (
        "_by_conversation",
        "_bytes",
        "_counter",
        "_entries",
        "_lock",
        "max_bytes",
        "turns",
    )

    #: The default bound of a store handle's cache (the stores' ``cache_bytes``): 32 MiB.
    DEFAULT_MAX_BYTES: Final = DEFAULT_CACHE_BYTES

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes: Final = cache_bytes(max_bytes)
        self._lock = threading.Lock()
        # (conversation id, digest) for a batch, (conversation id,) for a replay.
        self._entries: OrderedDict[tuple[str, ...], tuple[Any, int]] = OrderedDict()
        self._by_conversation: dict[str, set[tuple[str, ...]]] = {}
        self._bytes = 0
        self._counter: DefaultTokenCounter | None = None
        #: conversation id -> the lease layer's queue of it (see the class docstring).
        self.turns: dict[str, Any] = {}

    def __repr__(self) -> str:
        entries, size = self.size
        return f"HistoryCache(max_bytes={self.max_bytes}, entries={entries}, bytes={size})"

    @property
    def size(self) -> tuple[int, int]:
        """What the cache holds now: ``(entries, bytes)``."""
        with self._lock:
            return len(self._entries), self._bytes

    @property
    def token_counter(self) -> DefaultTokenCounter:
        """The ``DefaultTokenCounter`` a ``WindowReader`` without a counter of its own
        measures with over this cache's handle: one per cache, so the estimates it
        remembers, and the stable windows' steps measured with it, serve every
        WindowReader built over the handle, and two handles never share them. Its
        per-message estimates (of the 65,536 message objects counted last) hold the
        messages by weak reference: a few small tuples each, not charged against
        ``max_bytes``."""
        counter = self._counter
        if counter is None:
            with self._lock:
                if self._counter is None:
                    self._counter = DefaultTokenCounter()
                counter = self._counter
        return counter

    def messages(self, conversation_id: str, digest: str) -> tuple[Message, ...] | None:
        """The cached messages of the conversation's batch ``digest``, or None."""
        return self._get((conversation_id, digest))  # type: ignore[no-any-return]

    def keep_messages(
        self, conversation_id: str, digest: str, messages: tuple[Message, ...], encoded: int
    ) -> None:
        """Keep a batch's decoded ``messages`` (``encoded``: their canonical size)."""
        self._put((conversation_id, digest), messages, 2 * encoded)

    def remember(self, batch: Batch) -> None:
        """Keep what a store has just appended (or found already appended): the batch's
        own messages under its digest. They are exactly what decoding its
        ``encoded_messages`` gives, so the next read decodes nothing this handle wrote."""
        self._put(
            (batch.conversation_id, batch.digest), batch.messages, 2 * len(batch.encoded_messages)
        )

    def replay(self, conversation_id: str, stored: Sequence[object]) -> tuple[Message, ...]:
        """The non-system messages of ``stored`` (the conversation's history as its
        store returned it), proven to form a valid request sequence; ``StoreError``
        naming the conversation otherwise. Checks only what is new since the replay
        kept for the conversation, if any (see ``scope.history._replay``)."""
        from scope.history._replay import checked_replay  # _replay uses this module

        return checked_replay(self, conversation_id, stored)

    def forget(self, conversation_id: str) -> None:
        """Drop every entry of the conversation (it was cleared, or read as closed)."""
        with self._lock:
            for key in tuple(self._by_conversation.get(conversation_id, ())):
                self._remove(key)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._by_conversation.clear()
            self._bytes = 0

    def _get(self, key: tuple[str, ...]) -> Any:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def _put(self, key: tuple[str, ...], value: Any, size: int, replace: bool = False) -> None:
        """Keep ``value`` under ``key`` at ``size`` bytes (an existing entry stays, unless
        ``replace``), then evict down to the bound."""
        with self._lock:
            if key in self._entries:
                if not replace:
                    return
                self._remove(key)
            if size > self.max_bytes:
                return
            self._entries[key] = (value, size)
            self._by_conversation.setdefault(key[0], set()).add(key)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._remove(next(iter(self._entries)))

    def _remove(self, key: tuple[str, ...]) -> None:
        """Remove one entry and its bookkeeping; under the lock."""
        _, size = self._entries.pop(key)
        self._bytes -= size
        keys = self._by_conversation[key[0]]
        keys.discard(key)
        if not keys:
            del self._by_conversation[key[0]]
