"""Prefix digests (DESIGN §6g): what a request sent before each of its messages.

A provider that binds state to the prefix (Anthropic's preserved thinking: a thinking
block is valid only under the ``system``, ``tools`` and earlier messages it was produced
under) refuses, or silently drops, state replayed under another prefix. The adapter of
such a provider stamps each answer with ``scope/prefix``: the digest of what it sent
before the answer. Replaying, it computes the same digest over what it is about to send
and sends a message's state back only when the two agree.

The digest is a hash chain, so a request costs one pass over its bytes: the head hashes
the wire ``system`` and ``tools`` (their JSON bytes, ``null`` when absent), and each wire
message, in order, extends the chain by its own JSON bytes (one running SHA-256). The
digest before message ``k`` is the chain after messages ``0..k-1``; the digest an
answer is stamped with is the chain after every message sent. The bytes are the
adapter's own encoding of the wire values (deterministic for a given history), without
the ``cache_control`` markers of prompt caching, which the provider leaves out of its
comparison too.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from typing import Final, final

__all__ = ["PREFIX_KEY", "PrefixChain"]

#: Message metadata: the digest of what the request that produced the message sent
#: before it (``"sha256:<64 hex digits>"``).
PREFIX_KEY: Final = "scope/prefix"

# Versions the chain: a change of what it covers makes every older stamp a mismatch
# (the state is then left out, never refused).
_SEED: Final = b"scope/prefix v1\x00"


@final
class PrefixChain:
    """The running digest of one request's prefix.

    ``PrefixChain(system, tools)`` starts the chain from the JSON bytes of the wire
    ``system`` and ``tools`` (``b"null"`` for one that is absent); ``add(message)``
    extends it by one wire message's JSON bytes; ``digest()`` is the digest of
    everything added so far (the chain goes on). The digest after messages ``m0 ..
    mk`` is SHA-256 of ``seed, len(system), system, tools, m0, ..., mk``: each piece is
    self-delimiting JSON (an object, an array or ``null``), so no other sequence of
    pieces has the same bytes. ``copy()`` saves the chain (to take back a later
    ``add``).
    """

    __slots__ = ("_hash",)

    def __init__(self, system: bytes, tools: bytes) -> None:
        head = hashlib.sha256(_SEED)
        # Length-prefixed too, so no split of the same bytes between the two fields
        # collides even for bytes that are not JSON.
        head.update(len(system).to_bytes(8, "big"))
        head.update(system)
        head.update(tools)
        self._hash = head

    def add(self, message: bytes) -> None:
        """Extend the chain by one message's bytes."""
        self._hash.update(message)

    def digest(self) -> str:
        """``"sha256:"`` and the chain's hex digits."""
        return "sha256:" + self._hash.hexdigest()

    def copy(self) -> PrefixChain:
        """An independent chain at the same point."""
        other = PrefixChain.__new__(PrefixChain)
        other._hash = self._hash.copy()
        return other
