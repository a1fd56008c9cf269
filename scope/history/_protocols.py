"""The store protocols. Every backend honours the store rules of ``scope.history``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from scope.chat import Message
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._view import HistoryView

__all__ = [
    "BatchReader",
    "Clearer",
    "FoldedTurnLeaser",
    "Lister",
    "ReadWriter",
    "Reader",
    "Store",
    "TurnLeaser",
    "ViewReader",
    "Writer",
]


@runtime_checkable
class Reader(Protocol):
    """Reads a conversation."""

    async def read(self, conversation_id: str) -> list[Message]:
        """A new list of the stored messages in order; ``[]`` for an unknown or closed
        conversation."""
        ...


@runtime_checkable
class Writer(Protocol):
    """Appends batches."""

    async def append(self, batch: Batch) -> Receipt:
        """Append ``batch`` atomically (all or nothing) and return its receipt.

        In one atomic boundary, in this order: a closed conversation raises
        ``ConversationClosedError``; a retry of an accepted batch (same id, same digest)
        returns an equal receipt and appends nothing, and the same id with another digest
        raises ``AppendConflictError``; a batch whose ``expected_length`` is set and is
        not the number of messages the conversation holds raises ``HistoryChangedError``;
        otherwise the batch is appended. Nothing is appended when it raises.
        """
        ...


@runtime_checkable
class Clearer(Protocol):
    """Closes conversations."""

    async def clear(self, conversation_id: str) -> None:
        """Close the conversation for ever (idempotent; an id never written too)."""
        ...


@runtime_checkable
class Lister(Protocol):
    """Lists conversations."""

    async def conversations(
        self, *, after: str | None = None, limit: int | None = None
    ) -> list[ConversationID]:
        """Unique open conversation ids in lexical order; ``[]`` when none. ``after``:
        only ids after this one (keyset pagination: the last id of the previous page);
        ``limit``: at most this many (an int >= 1; None: all)."""
        ...


@runtime_checkable
class ViewReader(Protocol):
    """Reads a conversation, its length and its closure in one atomic read.

    Optional: not part of ``Store``. Every bundled store and ``WindowReader`` implement
    it; the history ``Middleware`` uses it, when the reader has it, to refuse a closed
    conversation before calling the model and to fence the turn it commits.
    """

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The conversation's ``HistoryView``: ``messages`` are what ``read`` returns,
        ``length`` the number of messages held, ``closed`` whether it was cleared, all
        from one atomic read. An unknown conversation is ``HistoryView((), 0, False)``;
        an invalid id raises ``InvalidConversationIDError`` before any I/O."""
        ...


@runtime_checkable
class BatchReader(Protocol):
    """Reads a conversation batch by batch, with what each batch's receipt needs.

    Optional: not part of ``Store``. Every bundled store (``scope.history.inmemory.InMemoryStore``
    and the ``scope.historystores`` backends) implements it; check with
    ``isinstance(store, BatchReader)``.
    """

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        """A new list of the stored batches in stored order, each equal to the batch that
        was appended (conversation id, append id, messages and digest), so
        ``batch.receipt()`` equals the receipt its append returned; ``[]`` for an unknown
        or closed conversation. The messages of the batches, concatenated, are what
        ``read`` returns. An invalid id raises ``InvalidConversationIDError`` before any
        I/O."""
        ...


@runtime_checkable
class TurnLeaser(Protocol):
    """Leases a conversation to one running turn at a time (DESIGN §6e).

    Optional: not part of ``Store``. Every bundled store implements it; the history
    ``Middleware`` needs it for ``on_overlap="reject"``, ``"wait"`` and ``"interrupt"``.
    Each call is one atomic step in the store. A lease is ``(holder, expiry)``: it
    expires by itself ``ttl`` seconds after it was last acquired (a holder that crashed
    blocks the conversation no longer than that), and only its holder's token renews
    or releases it.
    """

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        """Take or renew the conversation's lease for ``ttl`` seconds: True when it is
        now ``holder``'s (it was free, expired, or already ``holder``'s, which renews
        it), False when another holder's live lease has it. An invalid id, an empty
        ``holder`` or a ``ttl`` that is not a finite number > 0 raises (``ValueError``)
        before any I/O."""
        ...

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        """Release ``holder``'s lease: True when ``holder`` held it (live), False
        otherwise (another holder's lease, or none, stays as it is)."""
        ...


@runtime_checkable
class FoldedTurnLeaser(TurnLeaser, ViewReader, Writer, Protocol):
    """A ``TurnLeaser`` whose lease steps fold into a turn's read and commit.

    Optional: not part of ``Store`` or ``TurnLeaser``. A turn under
    ``on_overlap="reject"``, ``"wait"`` or ``"interrupt"`` makes four store steps with a
    plain ``TurnLeaser`` (acquire, read the view, append, release) where a ``"fence"``
    turn makes two; with a store that is also a ``FoldedTurnLeaser`` (every bundled
    store), used as the Middleware's reader and writer, it makes two as
    well: ``acquire_turn_view`` takes the lease and reads the history in one atomic step,
    ``append_release_turn`` appends the answer and gives the lease back in one atomic
    step. The Middleware falls back to the separate steps for any other store (and
    releases with ``release_turn`` whenever ``append_release_turn`` raises).

    Handing over a conversation is then exact: a turn that takes the lease from
    ``acquire_turn_view`` sees every batch its previous holder appended with
    ``append_release_turn``, because the previous append and release were one step and
    the new acquire and read are one step.
    """

    async def acquire_turn_view(
        self, conversation_id: str, holder: str, ttl: float
    ) -> HistoryView | None:
        """``acquire_turn`` and, when the lease is now ``holder``'s, ``read_view``, in one
        atomic step (no append, clear or lease step lands between them): the view, or
        None when another holder's live lease has the conversation (nothing read, that
        lease untouched). A closed conversation is no exception: the lease is taken and
        its closed view returned. Invalid arguments raise before any I/O, as
        ``acquire_turn`` and ``read_view`` say."""
        ...

    async def append_release_turn(self, batch: Batch, holder: str) -> Receipt:
        """``append(batch)`` and, when it returns a receipt (the batch landed, or it is a
        retry of an accepted batch), ``release_turn(batch.conversation_id, holder)``, in
        one atomic step. The append keeps every rule of ``Writer.append`` (the lease
        does not gate it: the ``expected_length`` fence does); the release is the same
        compare-and-delete (another holder's lease stays). When the append raises
        (``ConversationClosedError``, ``AppendConflictError``, ``HistoryChangedError``, a
        store error, a cancellation), the lease is left as it was, so the caller still
        releases it with ``release_turn``. Invalid arguments (``InvalidBatchError``, a
        bad holder: ``ValueError``) raise before any I/O."""
        ...


@runtime_checkable
class ReadWriter(Reader, Writer, Protocol):
    """Reader and Writer."""


@runtime_checkable
class Store(Reader, Writer, Clearer, Protocol):
    """Reader, Writer and Clearer: a full history store."""


_IMPLEMENTED: set[tuple[type, type]] = set()


def implements(obj: object, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for a runtime-checkable protocol, remembered per type.

    ``isinstance`` against a runtime-checkable protocol inspects the protocol's members on
    every call (microseconds each). A positive answer for an object whose *type* has every
    member is remembered for that type; anything else (members set on the instance, a
    negative answer) asks ``isinstance`` every time.
    """
    key = (type(obj), protocol)
    if key in _IMPLEMENTED:
        return True
    if not isinstance(obj, protocol):
        return False
    members = [name for name in dir(protocol) if not name.startswith("_")]
    if all(callable(getattr(type(obj), name, None)) for name in members):
        _IMPLEMENTED.add(key)
    return True
