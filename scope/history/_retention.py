"""``retain``, ``erase`` and ``erase_owner``: retention and erasure over any ``Store``
(DESIGN §6i)."""

from __future__ import annotations

import datetime as _dt

import attrs

from scope.history._adapter import as_store
from scope.history._erasure import ErasureReceipt, check_erase_limit, check_owner, check_until
from scope.history._ids import ConversationID

__all__ = ["erase", "erase_owner", "retain"]


async def retain(store: object, conversation_id: str, until: _dt.datetime | None) -> None:
    """Set how long the conversation is kept: it expires at ``until`` (an aware
    ``datetime``) or never (None), whatever the store-wide retention says.

    From its expiry on, the conversation reads as ``[]``, leaves every listing and
    refuses appends (``ConversationClosedError``); ``store.expire()`` removes what it
    held. A closed conversation raises ``ConversationClosedError``; a naive ``until``
    raises ``ValueError`` (a non-datetime ``TypeError``) before any I/O. ``store``: a
    ``scope.history.Store`` (a simple store without ``retain`` raises ``TypeError``).
    """
    cid = ConversationID(conversation_id)
    await as_store(store).retain(cid, check_until(until))


async def erase(store: object, conversation_id: str) -> ErasureReceipt:
    """Erase the conversation and return its ``ErasureReceipt``.

    One atomic store step: every batch of every branch, its dedupe, lease and move
    records, its expiry and owner are deleted; a tombstone (a keyed hash of the id)
    keeps it closed for ever; the store handle's cache forgets it. Erasing an unknown
    or already erased id gives a receipt with ``batches=0``. Keep the receipt (its JSON
    is ``receipt.to_json()``): ``store.check_erased(receipt)`` or ``scope history
    verify --erased RECEIPT`` later proves nothing of the conversation is left. A
    ``scope.web`` turn log is the web layer's: erase it with
    ``ResumableTurns.erased([receipt])`` (or ``ResumableTurns.erase(conversation_id)``).
    The receipt's ``conversation_id`` is the id, in memory only (never in its JSON).
    """
    cid = ConversationID(conversation_id)
    receipt = await as_store(store).erase(cid)
    if receipt.conversation_id is None:  # a store of an older scope: the id is known here
        receipt = attrs.evolve(receipt, conversation_id=cid)
    return receipt


async def erase_owner(store: object, owner: str, *, page: int = 100) -> list[ErasureReceipt]:
    """Erase every conversation ``owner``'s first appends recorded (open, cleared or
    expired) and return their receipts.

    It calls ``store.erase_owned(owner, limit=page)`` until it returns nothing, so the
    conversations are erased ``page`` at a time, each in its own atomic step. A run cut
    short (a crash, a cancellation, a store error) leaves every conversation erased or
    not; running it again erases what is left and finishes the job. A conversation is
    erased once, so no receipt is ever issued twice (receipts of a run that raised are
    lost with it: ``erase`` of a known id gives its tombstone again). An invalid owner
    or ``page`` raises ``ValueError`` before any I/O.

    Each receipt's ``conversation_id`` (in memory only, never in its JSON) names the
    conversation it erased, so the service can erase its own copies once
    (``ResumableTurns.erased(receipts)``): the store keeps no id to find them by later.
    """
    check_owner(owner)
    check_erase_limit(page, "page")
    target = as_store(store)
    receipts: list[ErasureReceipt] = []
    while True:
        erased = await target.erase_owned(owner, limit=page)
        if not erased:
            return receipts
        receipts.extend(erased)
