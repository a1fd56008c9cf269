"""``StoreConformance``: the pytest suite every history store must pass.

A backend's test module subclasses it and provides an async ``store`` fixture that yields
a fresh, empty ``scope.history.Store``. (A simple store wrapped in
``scope.history.StoreAdapter`` passes when it has its own ``read_view``,
``read_batches``, ``conversations``, ``read_tree`` and ``move_head``: the adapter's
derived view is not one atomic read and never closed, it cannot derive the listing or
the batches, and what it derives of branches is one linear path that cannot move.)

    import pytest
    from scope.history.storetest import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self):
            async with await MyStore.open(...) as store:
                yield store

        async def reopen(self, store):        # optional: enables the durability checks
            return await MyStore.open(...)    # a new handle on the same data

The tests run under every backend the ``anyio_backend`` fixture names. anyio's default is
every installed backend: asyncio, and trio when it is installed. A store that runs under
asyncio alone pins it in the subclass (or its module, or a conftest):

    @pytest.fixture
    def anyio_backend(self):
        return "asyncio"

and one that runs under both needs nothing. The suite runs its tests and the subclass's
async ``store`` fixture on anyio's test runner itself, so the fixture and the test share
one event loop whatever other async plugin is installed: pytest-asyncio, in auto mode too,
leaves them alone. Without ``reopen`` the durability tests skip and say why. A handle returned by
``reopen`` is closed with ``aclose()`` when it has one; ``reopen`` must leave ``store``
open (the fixture closes it).

The suite tests exactly the ``Store`` protocol: every rule of ``append`` (the
``expected_length`` fence of DESIGN §6b included), ``read``, ``read_view``,
``read_batches``, ``clear`` and ``conversations``, and the lease steps
(``acquire_turn``/``release_turn``: mutual exclusion under many tasks and across two
handles, expiry, holder tokens, renewal, release only by the holder; the expiry checks
sleep ``lease_ttl`` seconds, 0.25 by default; ``acquire_turn_view``: the lease and the
view in one step, nothing read under another holder's lease; ``append_release_turn``:
the append's rules, the release only by the holder and only when the append returns;
turns handed over between tasks and handles never read a stale history), and the branch
rules of DESIGN §6h (``BranchRules``: every read sees the head path; an append extends
the head; append ids dedupe across the whole tree, a retry never moving the head; the
``expected_head`` fence, at equal lengths too; ``move_head``'s order of checks, its move
ids and errors, nothing changed when it raises; ``read_tree``'s shape and stored times; a
clear closing every branch; a head move racing fenced turns, on one handle and two,
exactly one winning), and retention
and erasure (DESIGN §6i: owners recorded by the first append and listed by owner;
``retain``, store-wide retention and ``expire``; ``erase`` and its receipt, closure for
ever, leases and cache entries gone, under load and racing appends; ``erase_owned``
paging and ``erase_owner`` resumed after a cancellation; ``check_erased``). The
store-wide retention checks open their own store through the ``open_store(retention=...)``
hook (without it they skip and say why):

    async def open_store(self, *, retention=None):
        return await MyStore.open(..., retention=retention)   # fresh and empty

Nothing is optional: a store that lacks a method fails ``test_store_implements_the_protocol``.

Each rule of the store contract is its own test, named after the rule, so a failure says
which rule a backend breaks. The suite needs pytest and anyio; it imports nothing from a
project's ``tests/``.
"""

from __future__ import annotations

from typing import Any

from scope.history.storetest._branches import BranchRules
from scope.history.storetest._core import CoreRules
from scope.history.storetest._erasure import ErasureRules
from scope.history.storetest._leases import LeaseRules
from scope.history.storetest._restore import RestoreRules
from scope.history.storetest._runner import on_anyio_runner
from scope.history.storetest._support import HOSTILE_IDS, rich_messages
from scope.history.storetest._turns import TurnRules

__all__ = ["HOSTILE_IDS", "StoreConformance", "rich_messages"]


class StoreConformance(CoreRules, TurnRules, LeaseRules, BranchRules, ErasureRules, RestoreRules):
    """The store contract of ``scope.history`` as pytest tests. Subclass it (see the
    module docstring); never instantiate it directly."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "store" in cls.__dict__:
            cls.store = on_anyio_runner(cls.__dict__["store"])  # type: ignore[method-assign]
