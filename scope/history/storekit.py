"""What a store implementation needs beyond the values (DESIGN §6h, §6i, §6j): the
argument checks of the branch and erasure steps, and the erasure primitives (the store
secret, the tombstone, the receipt digest), so that every store, bundled or not, checks
and hashes exactly as the bundled ones do.

A store's own tests run ``scope.history.storetest.StoreConformance``; these helpers are
what its implementation calls.
"""

from __future__ import annotations

from scope.history._erasure import (
    MAX_OWNER_CHARS,
    SECRET_BYTES,
    STORE_KINDS,
    check_erase_limit,
    check_now,
    check_owner,
    check_retention,
    check_secret,
    check_tombstone,
    check_until,
    erasure_digest,
    new_secret,
    tombstone,
)
from scope.history._meta import CLOSURES, Closure
from scope.history._tree import check_created, check_head, check_move_id

__all__ = [
    "CLOSURES",
    "Closure",
    "MAX_OWNER_CHARS",
    "SECRET_BYTES",
    "STORE_KINDS",
    "check_created",
    "check_erase_limit",
    "check_head",
    "check_move_id",
    "check_now",
    "check_owner",
    "check_retention",
    "check_secret",
    "check_tombstone",
    "check_until",
    "erasure_digest",
    "new_secret",
    "tombstone",
]
