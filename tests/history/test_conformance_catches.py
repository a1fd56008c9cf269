"""StoreConformance is not a rubber stamp: it fails deliberately broken stores.

Each case runs the suite (the tests relevant to one breakage, selected with ``-k``) in a
fresh pytest session against an in-memory store with one rule broken, and asserts the
tests named after that rule fail. A control run of the same configurable store with
nothing broken passes the whole suite, so the failures are the breakage's.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

_BROKEN_STORE = textwrap.dedent(
    '''
    import time

    import anyio.lowlevel
    import pytest

    from scope._validate import check_lease
    from scope.errors import (
        AppendConflictError,
        ConversationClosedError,
        HistoryChangedError,
        InvalidBatchError,
        UnknownHeadError,
    )
    from scope.history import AppendID, Batch, ConversationID, HistoryTree, HistoryView
    from scope.history.storekit import check_created
    from scope.history.storetest import StoreConformance

    class Store:
        """A configurable in-memory store; every name in ``broken`` disables one rule.

        Each conversation is a tree (``state["trees"]``: batches, parents, created
        times, the head, move records); ``messages`` and ``batches`` keep its head path
        flat, as the in-memory store does."""

        def __init__(self, broken, state=None):
            self.broken = broken
            self.state = state or {
                "messages": {}, "batches": {}, "accepted": {}, "closed": set(),
                "leases": {}, "trees": {},
            }

        def _tree(self, cid):
            return self.state["trees"].get(cid) or {
                "batches": [], "parents": [], "created": [], "head": -1, "moves": {},
            }

        def _head(self, tree):
            return "" if tree["head"] == -1 else str(tree["batches"][tree["head"]].id)

        def _path(self, tree, index):
            path = []
            while index != -1:
                path.append(tree["batches"][index])
                index = tree["parents"][index]
            return path[::-1]

        def _length(self, tree, index):
            return sum(len(b) for b in self._path(tree, index))

        async def read(self, conversation_id):
            if "validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            cid = ConversationID(conversation_id)
            if cid in self.state["closed"] and "closure" not in self.broken:
                return []
            out = list(self.state["messages"].get(cid, ()))
            if "read-order" in self.broken:
                out.reverse()
            return out

        async def read_view(self, conversation_id):
            if "validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            cid = ConversationID(conversation_id)
            if cid in self.state["closed"] and "closure" not in self.broken:
                return HistoryView((), 0, True)
            messages = tuple(self.state["messages"].get(cid, ()))
            if "view-atomic" in self.broken:
                # The length comes from a second read, after a scheduling point.
                await anyio.lowlevel.checkpoint()
            length = len(self.state["messages"].get(cid, ()))
            head = "" if "view-head" in self.broken else self._head(self._tree(cid))
            return HistoryView(messages, length, head=head)

        def _fence(self, cid, batch):
            length = len(self.state["messages"].get(cid, ()))
            head = self._head(self._tree(cid))
            refused = batch.expected_length is not None and batch.expected_length != length
            if "head-fence" not in self.broken:
                refused = refused or (
                    batch.expected_head is not None and batch.expected_head != head
                )
            if refused and "fence" not in self.broken:
                raise HistoryChangedError(
                    length if batch.expected_length is None else batch.expected_length,
                    length,
                    cid,
                    expected_head=batch.expected_head,
                    actual_head=None if batch.expected_head is None else head,
                )

        async def read_batches(self, conversation_id):
            if "validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            cid = ConversationID(conversation_id)
            if cid in self.state["closed"] and "closure" not in self.broken:
                return []
            out = list(self.state["batches"].get(cid, ()))
            if "batch-order" in self.broken:
                out.reverse()
            return out

        async def read_tree(self, conversation_id):
            if "validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            cid = ConversationID(conversation_id)
            if cid in self.state["closed"] and "clear-keeps-branches" not in self.broken:
                return HistoryTree((), (), (), -1, True)
            tree = self._tree(cid)
            parents = tree["parents"]
            if "tree-parents" in self.broken:
                parents = list(range(-1, len(parents) - 1))
            created = tree["created"]
            if "tree-created" in self.broken:
                created = [None] * len(created)
            head = tree["head"]
            if "tree-head" in self.broken:
                head = len(tree["batches"]) - 1
            return HistoryTree(tree["batches"], parents, created, head)

        def _moved(self, cid, tree, index):
            tree["head"] = index
            if "head-path" in self.broken:
                return  # the head moves, the flat head path stays as it was
            path = self._path(tree, index)
            self.state["batches"][cid] = path
            self.state["messages"][cid] = [m for b in path for m in b.messages]

        async def move_head(self, conversation_id, head, *, expected_head, move_id=None):
            if "validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            cid = ConversationID(conversation_id)
            head = "" if head == "" else str(AppendID(head))
            expected_head = "" if expected_head == "" else str(AppendID(expected_head))
            move_id = None if move_id is None else AppendID(move_id)
            if cid in self.state["closed"] and "move-closed" not in self.broken:
                raise ConversationClosedError(cid)
            tree = self._tree(cid)
            ids = {str(b.id): i for i, b in enumerate(tree["batches"])}
            moves = tree["moves"]
            if move_id is not None and move_id in moves and "move-id" not in self.broken:
                recorded = moves[move_id]
                if recorded != head and "move-id-conflict" not in self.broken:
                    raise AppendConflictError(move_id)
                return self._length(tree, ids[recorded] if recorded else -1)
            if "move-ids-shared" in self.broken and move_id is not None and move_id in ids:
                raise AppendConflictError(move_id)  # move ids taken for append ids
            if "move-order" in self.broken and head and head not in ids:
                raise UnknownHeadError(head)
            actual = self._head(tree)
            if actual != expected_head and "move-fence" not in self.broken:
                if "move-partial" in self.broken and move_id is not None:
                    moves[move_id] = head
                length = self._length(tree, tree["head"])
                raise HistoryChangedError(
                    length, length, cid, expected_head=expected_head, actual_head=actual
                )
            if "move-race" in self.broken:
                # Checks the fence, then yields before moving: not atomic.
                await anyio.lowlevel.checkpoint()
            if head and head not in ids:
                if "move-unknown" not in self.broken:
                    raise UnknownHeadError(head)
                head = ""
            if not tree["batches"]:
                return 0
            index = ids[head] if head else -1
            if "move-atomic" in self.broken:
                # The head first, then the flat head path after a scheduling point.
                tree["head"] = index
                await anyio.lowlevel.checkpoint()
            self._moved(cid, tree, index)
            if move_id is not None:
                moves[move_id] = head
            return self._length(tree, index)

        async def append(self, batch, *, created=None):
            if not isinstance(batch, Batch):
                raise InvalidBatchError("not a batch")
            if "created-validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            created = check_created(created)
            if "created-ignored" in self.broken:
                created = None
            cid = batch.conversation_id
            if "fence-first" in self.broken:
                self._fence(cid, batch)
            if cid in self.state["closed"] and "closure" not in self.broken:
                raise ConversationClosedError(cid)
            key = (cid, batch.id) if "global-ids" not in self.broken else batch.id
            seen = self.state["accepted"].get(key)
            if seen is not None and "dedupe-branch" in self.broken:
                on_path = any(b.id == batch.id for b in self.state["batches"].get(cid, ()))
                seen = seen if on_path else None
            if seen is not None and "dedupe" not in self.broken:
                if seen == batch.digest or "conflict" in self.broken:
                    if "dedupe-moves-head" in self.broken:
                        tree = self._tree(cid)
                        at = [str(b.id) for b in tree["batches"]].index(batch.id)
                        self._moved(cid, tree, at)
                    return batch.receipt()
                raise AppendConflictError(batch.id)
            if seen is not None and "conflict" not in self.broken and seen != batch.digest:
                raise AppendConflictError(batch.id)
            if "fence-race" in self.broken:
                # Checks the fence, then yields before appending: not atomic.
                self._fence(cid, batch)
                await anyio.lowlevel.checkpoint()
            else:
                self._fence(cid, batch)
            tree = self.state["trees"].setdefault(cid, self._tree(cid))
            if "atomic" in self.broken:
                # One message at a time, with a scheduling point between them, and the
                # dedupe record written last.
                for message in batch.messages:
                    self.state["messages"].setdefault(cid, []).append(message)
                    await anyio.lowlevel.checkpoint()
            else:
                self.state["messages"].setdefault(cid, []).extend(batch.messages)
            self.state["batches"].setdefault(cid, []).append(batch)
            parent = tree["head"]
            if "extend-from-last" in self.broken:
                parent = len(tree["batches"]) - 1
            tree["batches"].append(batch)
            tree["parents"].append(parent)
            tree["created"].append(time.time() if created is None else created)
            tree["head"] = len(tree["batches"]) - 1
            if "extend-from-last" in self.broken:
                self._moved(cid, tree, tree["head"])
            self.state["accepted"][key] = batch.digest
            return batch.receipt()

        async def clear(self, conversation_id):
            cid = ConversationID(conversation_id)
            if "closure" not in self.broken:
                self.state["closed"].add(cid)
                self.state["messages"].pop(cid, None)
                self.state["batches"].pop(cid, None)
                if "clear-keeps-branches" not in self.broken:
                    self.state["trees"].pop(cid, None)

        async def acquire_turn(self, conversation_id, holder, ttl):
            cid = ConversationID(conversation_id)
            holder, ttl = check_lease(holder, ttl)
            leases = self.state["leases"]
            now = time.monotonic()
            current = leases.get(cid)
            live = current is not None and (
                "lease-forever" in self.broken or current[1] > now
            )
            if live and current[0] != holder and "lease-token" not in self.broken:
                return False
            if "lease-race" in self.broken:
                # Checks, then yields before taking it: not one atomic step.
                await anyio.lowlevel.checkpoint()
            leases[cid] = (holder, now + ttl)
            return True

        async def release_turn(self, conversation_id, holder):
            cid = ConversationID(conversation_id)
            holder, _ = check_lease(holder, 1.0)
            current = self.state["leases"].get(cid)
            if current is None:
                return False
            if current[0] != holder and "lease-token" not in self.broken:
                return False
            del self.state["leases"][cid]
            return "lease-forever" in self.broken or current[1] > time.monotonic()

        async def acquire_turn_view(self, conversation_id, holder, ttl):
            cid = ConversationID(conversation_id)
            holder, ttl = check_lease(holder, ttl)
            if "fold-stale-read" in self.broken:
                # Reads first, then takes the lease after a scheduling point.
                view = await self.read_view(cid)
                await anyio.lowlevel.checkpoint()
                return view if await self.acquire_turn(cid, holder, ttl) else None
            if "fold-ignore-lease" in self.broken:
                await self.acquire_turn(cid, holder, ttl)
                return await self.read_view(cid)
            if not await self.acquire_turn(cid, holder, ttl):
                return None
            return await self.read_view(cid)

        async def append_release_turn(self, batch, holder):
            if not isinstance(batch, Batch):
                raise InvalidBatchError("not a batch")
            holder, _ = check_lease(holder, 1.0)
            cid = batch.conversation_id
            leases = self.state["leases"]
            if "fold-release-first" in self.broken:
                # Releases, then appends after a scheduling point.
                await self.release_turn(cid, holder)
                await anyio.lowlevel.checkpoint()
                return await self.append(batch)
            if "fold-release-on-refusal" in self.broken:
                await self.release_turn(cid, holder)
                return await self.append(batch)
            receipt = await self.append(batch)
            if "fold-release-any" in self.broken:
                leases.pop(cid, None)
            elif "fold-keep-lease" not in self.broken:
                await self.release_turn(cid, holder)
            return receipt

        async def conversations(self, *, after=None, limit=None):
            if limit is not None and (type(limit) is not int or limit < 1):
                raise ValueError(f"limit must be an integer >= 1 or None, got {limit!r}")
            names = [
                n for n in self.state["trees"]
                if n not in self.state["closed"] or "closure" in self.broken
            ]
            if "listing" in self.broken:
                return names
            names = sorted(names)
            if after is not None:
                after = ConversationID(after)
                # "paging": the page starts at ``after`` instead of after it.
                names = [n for n in names if n >= after if "paging" in self.broken or n > after]
            return names if limit is None else names[:limit]

        def forget(self, what):
            """A reopen that loses part of the data."""
            state = dict(self.state)
            state[what] = type(state[what])()
            return Store(self.broken, state)


    class Base(StoreConformance):
        BREAK = ""

        @pytest.fixture
        async def store(self):
            yield Store({self.BREAK})

        async def reopen(self, store):
            if self.BREAK == "durable-messages":
                return Store(store.broken)
            if self.BREAK == "durable-dedupe":
                return store.forget("accepted")
            if self.BREAK == "durable-closure":
                return store.forget("closed")
            return Store(store.broken, store.state)
    '''
)


# Retention and erasure (DESIGN §6i): a layer over the configurable store above (it
# rebinds the name ``Store``, so the Base below builds the layered one), with its own
# breakages, and a Base giving the suite its open_store(retention=...) hook.
_ERASURE_LAYER = textwrap.dedent(
    """
    import contextvars
    import datetime as _dt

    from scope._validate import check_limit
    from scope.history import ConversationMeta, ErasureReceipt, HistoryCache, HistoryTree
    from scope.history._erasure import (
        check_erase_limit, check_now, check_owner, check_until, new_secret, tombstone,
    )

    _OWNER = contextvars.ContextVar("owner", default=None)
    _Plain = Store

    class Store(Store):
        def __init__(self, broken, state=None, retention=None):
            super().__init__(broken, state)
            for key, empty in (
                ("owners", dict), ("expires", dict), ("retained", set), ("tombstones", set),
                ("expired", set),
            ):
                self.state.setdefault(key, empty())
            self.state.setdefault("secret", new_secret())
            self.retention = retention
            self.history_cache = HistoryCache()

        def _gone(self, cid):
            expires = self.state["expires"].get(cid)
            if expires is not None and expires <= time.time():
                if "expiry-reads" not in self.broken:
                    return True
            if "erase-reopens" in self.broken:
                return False
            return tombstone(self.state["secret"], cid) in self.state["tombstones"]

        async def read(self, conversation_id):
            out = await super().read(conversation_id)
            return [] if self._gone(ConversationID(conversation_id)) else out

        async def read_batches(self, conversation_id):
            out = await super().read_batches(conversation_id)
            return [] if self._gone(ConversationID(conversation_id)) else out

        async def read_view(self, conversation_id):
            view = await super().read_view(conversation_id)
            if self._gone(ConversationID(conversation_id)):
                return HistoryView((), 0, True)
            return view

        async def append(self, batch, *, owner=None, created=None):
            if not isinstance(batch, Batch):
                raise InvalidBatchError("not a batch")
            if owner is None:
                owner = _OWNER.get()
            elif "owner-validate-after-io" in self.broken:
                await anyio.lowlevel.checkpoint()
            if owner is not None:
                check_owner(owner)
            cid = batch.conversation_id
            if self._gone(cid):
                raise ConversationClosedError(cid)
            before = len(self.state["batches"].get(cid, ()))
            receipt = await super().append(batch, created=created)
            if len(self.state["batches"].get(cid, ())) > before:
                if owner is not None and (before == 0 or "owner-overwrite" in self.broken):
                    self.state["owners"][cid] = owner
                first_only = "retention-first-append" in self.broken and before > 0
                if self.retention and cid not in self.state["retained"] and not first_only:
                    self.state["expires"][cid] = time.time() + self.retention.total_seconds()
            return receipt

        async def append_release_turn(self, batch, holder, *, owner=None):
            if owner is not None:
                check_owner(owner)
            token = _OWNER.set(owner)
            try:
                return await super().append_release_turn(batch, holder)
            finally:
                _OWNER.reset(token)

        async def conversations(self, *, after=None, limit=None, owner=None):
            count = check_limit(limit)
            if owner is not None:
                check_owner(owner)
            names = await super().conversations(after=after)
            owners = self.state["owners"]
            names = [
                n for n in names
                if not self._gone(n)
                and (owner is None or "owner-listing" in self.broken or owners.get(n) == owner)
            ]
            return names if count is None else names[:count]

        if hasattr(_Plain, "move_head"):  # the branch steps, where the store has them

            async def move_head(self, conversation_id, head, *, expected_head, move_id=None):
                if self._gone(ConversationID(conversation_id)):
                    raise ConversationClosedError(conversation_id)
                return await super().move_head(
                    conversation_id, head, expected_head=expected_head, move_id=move_id
                )

        if hasattr(_Plain, "read_tree"):

            async def read_tree(self, conversation_id):
                tree = await super().read_tree(conversation_id)
                if self._gone(ConversationID(conversation_id)):
                    return HistoryTree((), (), (), -1, True)
                return tree

        async def read_meta(self, conversation_id):
            cid = ConversationID(conversation_id)
            state = self.state
            if tombstone(state["secret"], cid) in state["tombstones"]:
                if "meta-closure" not in self.broken:
                    return ConversationMeta(closure="erased")
            tree = state["trees"].get(cid)
            moves = () if tree is None else tuple(tree["moves"].items())
            expires = state["expires"].get(cid)
            closure = None
            if cid in state["expired"]:
                closure = "expired"
            elif cid in state["closed"]:
                closure = "cleared"
            elif expires is not None and expires <= time.time():
                closure = "expired"
            return ConversationMeta(
                state["owners"].get(cid),
                expires,
                cid in state["retained"] and "meta-retained" not in self.broken,
                () if "meta-moves" in self.broken else moves,
                None if "meta-closure" in self.broken else closure,
            )

        async def clear(self, conversation_id):
            await super().clear(conversation_id)
            if "clear-keeps-expired" not in self.broken:
                self.state["expired"].discard(ConversationID(conversation_id))

        async def retain(self, conversation_id, until):
            cid = ConversationID(conversation_id)
            when = check_until(until)
            if cid in self.state["closed"] or self._gone(cid):
                raise ConversationClosedError(cid)
            self.state["retained"].add(cid)
            if when is None:
                self.state["expires"].pop(cid, None)
            else:
                self.state["expires"][cid] = when.timestamp()

        def _drop(self, cid):
            state = self.state
            for table in ("messages", "batches"):
                for name in list(state[table]):
                    if name == cid or ("erase-prefix" in self.broken and name.startswith(cid)):
                        del state[table][name]
            for key in [k for k in state["accepted"] if type(k) is tuple and k[0] == cid]:
                del state["accepted"][key]
            for name in list(state.get("trees", ())):  # every branch (DESIGN §6h)
                if name == cid or ("erase-prefix" in self.broken and name.startswith(cid)):
                    del state["trees"][name]
            if "erase-keeps-leases" not in self.broken:
                state["leases"].pop(cid, None)

        async def expire(self, now=None, *, limit=1000):
            when = check_now(now)
            count = check_erase_limit(limit)
            at = time.time() if when is None else when.timestamp()
            state = self.state
            removed = 0
            for _, cid in sorted((t, c) for c, t in state["expires"].items() if t <= at):
                del state["expires"][cid]
                state["retained"].discard(cid)
                if cid in state["closed"]:
                    continue
                self._drop(cid)
                state["expired"].add(cid)
                if "expire-reopens" not in self.broken:
                    state["closed"].add(cid)
                if "expire-drops-owner" in self.broken:
                    state["owners"].pop(cid, None)
                removed += 1
                if removed == count and "expire-limit" not in self.broken:
                    break
            return removed

        async def erase(self, conversation_id):
            cid = ConversationID(conversation_id)
            state = self.state
            tree = state.get("trees", {}).get(cid)  # every branch's batches, stored order
            batches = list(tree["batches"] if tree else state["batches"].get(cid, ()))
            if "erase-nonatomic" in self.broken:
                await anyio.lowlevel.checkpoint()  # appends landing now are not counted
            if "erase-rewrite" in self.broken:
                # Rewrites the shared tables from a copy taken before a scheduling point.
                copies = {
                    t: {k: list(v) for k, v in state[t].items() if k != cid}
                    for t in ("messages", "batches")
                }
                await anyio.lowlevel.checkpoint()
                state.update(copies)
            self._drop(cid)
            for table in ("owners", "expires"):
                state[table].pop(cid, None)
            state["retained"].discard(cid)
            state["expired"].discard(cid)
            if "erase-keeps-id" in self.broken:
                state["closed"].add(cid)
            else:
                state["closed"].discard(cid)
            mark = tombstone(state["secret"], cid)
            state["tombstones"].add(mark)
            if "erase-cache" not in self.broken:
                self.history_cache.forget(cid)
            size = sum(len(b.encoded_messages) for b in batches)
            return ErasureReceipt.of(
                tombstone=mark,
                digests=[b.digest for b in batches],
                bytes=0 if "erase-counts" in self.broken else size,
                erased_at=_dt.datetime.now(_dt.UTC),
                store="memory",
                conversation_id=None if "erase-no-id" in self.broken else cid,
            )

        async def erase_owned(self, owner, *, limit=100):
            check_owner(owner)
            count = check_erase_limit(limit)
            owners = self.state["owners"]
            owned = sorted(c for c, o in owners.items() if o == owner)
            if "erase-owned-limit" not in self.broken:
                owned = owned[:count]
            receipts = []
            for cid in owned:
                if "erase-owned-halfway" in self.broken:
                    # Deletes the batches, then the rest after a scheduling point.
                    self._drop(cid)
                    await anyio.lowlevel.checkpoint()
                receipts.append(await self.erase(cid))
                if "erase-owned-reissue" in self.broken:
                    owners[cid] = owner
            return receipts

        async def check_erased(self, receipt):
            if not isinstance(receipt, ErasureReceipt):
                raise TypeError("check_erased needs an ErasureReceipt")
            if "check-lies" in self.broken:
                return []
            state = self.state
            problems = []
            if receipt.tombstone not in state["tombstones"]:
                problems.append("no tombstone")
            ids = set(state["messages"]) | set(state["batches"]) | set(state["leases"])
            ids |= state["closed"] | set(state["owners"]) | set(state["expires"])
            ids |= state["retained"] | {k[0] for k in state["accepted"] if type(k) is tuple}
            ids |= set(state.get("trees", ()))
            if any(tombstone(state["secret"], c) == receipt.tombstone for c in ids):
                problems.append("a stored id hashes to the tombstone")
            return problems
    """
)


# Restore (DESIGN §6n): a layer over the erasure layer (it rebinds ``Store`` again) that
# makes the configurable store a ``scope.history.Restorer``, with its own breakages.
_RESTORE_LAYER = textwrap.dedent(
    """
    from scope.errors import RestoreConflictError
    from scope.history import ClosedConversation
    from scope.history.storekit import check_secret, check_tombstone

    class Store(Store):
        def __init__(self, broken, state=None, retention=None):
            super().__init__(broken, state, retention)
            self.state.setdefault("lengths", {})

        async def read_view(self, conversation_id):
            view = await super().read_view(conversation_id)
            if view.closed:
                cid = ConversationID(conversation_id)
                return HistoryView((), self.state["lengths"].get(cid, 0), True)
            return view

        async def _closure(self, cid):
            meta = await self.read_meta(cid)
            if meta.closure in (None, "erased"):
                return None
            length = (await self.read_view(cid)).length
            return ClosedConversation(cid, meta.closure, meta.owner, length)

        async def closed_conversations(self, *, after=None, limit=1000):
            count = check_erase_limit(limit)
            start = None if after is None else ConversationID(after)
            state = self.state
            ids = state["closed"] | {c for c, t in state["expires"].items() if t <= time.time()}
            # Broken: the ids in reverse order (a set's own order could happen to be sorted).
            ordered = sorted(ids, reverse="closed-unordered" in self.broken)
            listed = []
            for cid in ordered:
                entry = await self._closure(cid)
                if entry is not None and (start is None or cid > start):
                    listed.append(entry)
            return listed[:count]

        async def restore_closed(self, closed):
            cid = closed.conversation_id
            state = self.state
            held = await self._closure(cid)
            if "restore-overwrites" not in self.broken:
                if tombstone(state["secret"], cid) in state["tombstones"]:
                    raise RestoreConflictError(cid)
                if state["batches"].get(cid) or cid in state["trees"]:
                    raise RestoreConflictError(cid)
                if held is not None and held != closed:
                    raise RestoreConflictError(cid)
            if held == closed:
                return False
            state["expires"].pop(cid, None)
            state["retained"].discard(cid)
            state["closed"].add(cid)
            if closed.closure == "expired":
                state["expired"].add(cid)
            state["lengths"][cid] = closed.length
            if closed.owner is not None and "restore-drops-owner" not in self.broken:
                state["owners"][cid] = closed.owner
            return True

        async def tombstones(self, *, after=None, limit=1000):
            count = check_erase_limit(limit)
            return [m for m in sorted(self.state["tombstones"]) if after is None or m > after][
                :count
            ]

        async def store_secret(self):
            return self.state["secret"]

        async def restore_erasures(self, secret, tombstones):
            state = self.state
            secret = check_secret(secret)
            for mark in tombstones:
                if "restore-validates-late" in self.broken:
                    state["tombstones"].add(check_tombstone(mark))
                else:
                    check_tombstone(mark)
            if secret != state["secret"]:
                used = state["batches"] or state["closed"] or state["tombstones"]
                if used and "restore-adopts-anyway" not in self.broken:
                    raise RestoreConflictError("used")
                state["secret"] = secret
            new = set(tombstones) - state["tombstones"]
            held = set(state["batches"]) | state["closed"] | set(state["owners"])
            if any(tombstone(state["secret"], cid) in new for cid in held):
                raise RestoreConflictError("held")
            state["tombstones"] |= new
            return len(new)
    """
)

_ERASURE_BASE = textwrap.dedent(
    """

    class Base(Base):
        async def open_store(self, *, retention=None):
            return Store({self.BREAK}, retention=retention)
    """
)

_BROKEN_STORE = (
    _BROKEN_STORE.replace(
        "\n\nclass Base(StoreConformance):",
        _ERASURE_LAYER + _RESTORE_LAYER + "\n\nclass Base(StoreConformance):",
        1,
    )
    + _ERASURE_BASE
)

_ERASURE_CASES = [
    (
        "owner-overwrite",
        "owner",
        {
            "test_owner_is_recorded_by_the_first_append_only",
            "test_owner_of_a_first_append_without_one_is_never_set",
        },
    ),
    (
        "owner-listing",
        "owner",
        {
            "test_owner_is_recorded_by_the_first_append_only",
            "test_conversations_by_owner_page_in_lexical_order",
            "test_owners_keep_hostile_strings_apart",
        },
    ),
    ("owner-validate-after-io", "invalid_owners", {"test_invalid_owners_rejected_before_io"}),
    (
        "expiry-reads",
        "retain or retention or closed_ones",
        {
            "test_retain_in_the_past_expires_at_once",
            "test_store_retention_expires_a_conversation_after_its_last_append",
            "test_conversations_by_owner_leave_out_closed_ones",
        },
    ),
    ("expire-limit", "expire", {"test_expire_pages_and_counts"}),
    (
        "expire-reopens",
        "expire or retain",
        {"test_expire_pages_and_counts", "test_retain_in_the_future_keeps_it_until_then"},
    ),
    (
        "expire-drops-owner",
        "owner",
        {"test_expired_conversation_keeps_its_owner_for_erase_owned"},
    ),
    (
        "retention-first-append",
        "retention",
        {"test_store_retention_expires_a_conversation_after_its_last_append"},
    ),
    ("meta-moves", "read_meta", {"test_read_meta_reads_owner_retention_and_recorded_moves"}),
    (
        "meta-closure",
        "read_meta",
        {
            "test_read_meta_closure_says_cleared_or_erased",
            "test_read_meta_closure_says_expired_before_and_after_expire",
            "test_read_meta_after_clear_keeps_the_owner_and_after_erase_nothing",
        },
    ),
    (
        "clear-keeps-expired",
        "read_meta",
        {"test_read_meta_closure_says_expired_before_and_after_expire"},
    ),
    ("meta-retained", "read_meta", {"test_read_meta_reads_owner_retention_and_recorded_moves"}),
    ("erase-counts", "erase_receipt", {"test_erase_receipt_counts_batches_bytes_and_digest"}),
    (
        "erase-reopens",
        "erase or erased",
        {
            "test_erased_conversation_is_closed_for_ever",
            "test_erase_of_an_unknown_id_closes_it",
            "test_durable_erasure_survives_reopen",
        },
    ),
    (
        "erase-keeps-id",
        "erase or erased",
        {
            "test_erase_of_a_cleared_conversation_removes_its_closure",
            "test_check_erased_is_empty_after_erase",
            "test_erase_again_gives_an_empty_receipt",
        },
    ),
    (
        "erase-no-id",
        "in_memory_only",
        {"test_erase_receipts_name_the_conversation_in_memory_only"},
    ),
    ("erase-cache", "cache", {"test_erase_makes_the_cache_forget"}),
    ("erase-prefix", "hostile", {"test_erase_keeps_hostile_ids_apart"}),
    ("erase-keeps-leases", "leases", {"test_erase_drops_the_leases"}),
    ("check-lies", "check_erased", {"test_check_erased_reports_a_forged_receipt"}),
    ("erase-nonatomic", "racing", {"test_erase_racing_appends_is_all_or_nothing"}),
    (
        "erase-rewrite",
        "under_load",
        {"test_erase_under_load_loses_nothing_of_other_conversations"},
    ),
    (
        "erase-owned-limit",
        "erase_owned_pages",
        {"test_erase_owned_pages_through_open_cleared_and_expired"},
    ),
    (
        # Not the erase_owner test: it would erase the same conversations for ever.
        "erase-owned-reissue",
        "erase_owned_pages",
        {"test_erase_owned_pages_through_open_cleared_and_expired"},
    ),
    (
        "erase-owned-halfway",
        "cancelled_midway",
        {"test_erase_owner_cancelled_midway_finishes_when_run_again"},
    ),
]


_RESTORE_CASES = [
    (
        "closed-unordered",
        "closed_conversations or hostile",
        {
            "test_closed_conversations_lists_cleared_and_expired_in_order",
            "test_restore_closed_keeps_hostile_ids_apart",
        },
    ),
    (
        "restore-drops-owner",
        "restore",
        {
            "test_restore_closed_writes_what_was_listed",
            "test_restored_owner_is_found_by_erase_owned",
        },
    ),
    (
        "restore-overwrites",
        "restore_closed",
        {
            "test_restore_closed_refuses_an_id_holding_batches",
            "test_restore_closed_refuses_another_closure",
            "test_restore_closed_refuses_an_erased_id",
        },
    ),
    (
        "restore-adopts-anyway",
        "restore_erasures",
        {"test_restore_erasures_refuses_another_secret_in_a_used_store"},
    ),
    (
        "restore-validates-late",
        "restore_erasures",
        {"test_restore_erasures_rejects_a_bad_tombstone"},
    ),
]


CASES = [
    (
        "dedupe",
        "retry or retries",
        {
            "test_retry_of_accepted_batch_returns_equal_receipt_and_appends_nothing",
            "test_retry_of_batch_rebuilt_from_same_messages_appends_nothing",
            "test_retry_after_later_appends_still_appends_nothing",
            "test_concurrent_retries_of_one_batch_land_once",
        },
    ),
    (
        "closure",
        "clear or closure or closed",
        {
            "test_cleared_conversation_reads_empty",
            "test_cleared_conversation_rejects_new_appends",
            "test_cleared_conversation_rejects_retries_of_accepted_batches",
            "test_clear_of_never_written_id_closes_it",
            "test_clear_is_idempotent",
            "test_cleared_conversation_leaves_the_listing",
        },
    ),
    (
        "conflict",
        "conflict",
        {
            "test_same_id_other_digest_conflicts_and_appends_nothing",
            "test_conflict_detection_is_exact_about_number_spelling",
        },
    ),
    (
        "read-order",
        "order or contiguous or round_trip",
        {
            "test_batches_read_back_in_append_order_and_contiguous",
            "test_messages_of_a_batch_keep_their_order",
            "test_round_trip_is_exact_for_every_part_kind",
        },
    ),
    (
        "listing",
        "conversations or listing or ids_round_trip",
        {
            "test_conversations_are_unique_in_lexical_order",
            "test_unicode_ids_round_trip",
            "test_hostile_ids_round_trip_and_stay_apart",
        },
    ),
    (
        "atomic",
        "concurrent or cancelled",
        {
            "test_concurrent_appends_all_land_each_batch_contiguous",
            "test_concurrent_retries_of_one_batch_land_once",
            "test_cancelled_append_leaves_all_or_nothing_and_retry_resolves",
        },
    ),
    ("paging", "pages", {"test_conversations_pages_with_after_and_limit"}),
    ("global-ids", "scoped", {"test_append_ids_are_scoped_per_conversation"}),
    (
        "validate-after-io",
        "invalid",
        {
            "test_invalid_conversation_ids_rejected_before_io",
            "test_move_head_invalid_arguments_rejected_before_io",
            "test_tree_invalid_conversation_ids_rejected_before_io",
        },
    ),
    (
        "batch-order",
        "read_batches or batches",
        {
            "test_read_batches_round_trip_in_order_with_receipts",
            "test_read_batches_keeps_hostile_ids_apart",
            "test_read_equals_the_concatenated_read_batches",
        },
    ),
    (
        "fence",
        "fence or fenced or expected_length",
        {
            "test_stale_expected_length_is_refused_and_appends_nothing",
            "test_future_expected_length_is_refused_and_appends_nothing",
            "test_concurrent_fenced_appends_at_one_length_exactly_one_lands",
        },
    ),
    (
        "fence-first",
        "fence or fenced or expected_length",
        {
            "test_retry_of_accepted_batch_with_stale_expected_length_returns_equal_receipt",
            "test_closed_and_conflict_win_over_the_fence",
        },
    ),
    (
        "head-path",
        "head",
        {
            "test_head_path_reads_after_a_rewind",
            "test_head_append_after_rewind_extends_from_the_new_head",
            "test_head_moves_return_the_new_head_path_length",
        },
    ),
    (
        "view-head",
        "head or views",
        {"test_head_path_reads_after_a_rewind", "test_views_agree_with_read"},
    ),
    ("extend-from-last", "head", {"test_head_append_after_rewind_extends_from_the_new_head"}),
    ("dedupe-branch", "head", {"test_head_retry_of_a_batch_on_another_branch_returns_its_receipt"}),
    (
        "dedupe-moves-head",
        "head",
        {"test_head_retry_of_a_batch_on_another_branch_returns_its_receipt"},
    ),
    (
        "head-fence",
        "head_fence",
        {
            "test_head_fence_refuses_another_branch_at_equal_length",
            "test_head_fence_of_a_new_conversation_is_the_empty_head",
        },
    ),
    ("move-closed", "move_head", {"test_move_head_of_a_closed_conversation_raises_closed"}),
    (
        "move-id",
        "move_head or durable_tree",
        {
            "test_move_head_retry_of_a_move_id_moves_nothing",
            "test_move_head_checks_closed_then_move_id_then_fence_then_head",
            "test_durable_tree_and_move_ids_survive_reopen",
        },
    ),
    ("move-id-conflict", "move_head", {"test_move_head_move_id_for_another_head_conflicts"}),
    ("move-ids-shared", "move_head", {"test_move_head_move_ids_are_their_own_namespace"}),
    (
        "move-fence",
        "move_head or racing",
        {
            "test_move_head_fenced_by_head_raises_history_changed_with_heads",
            "test_rewind_racing_fenced_turns_exactly_one_wins",
            "test_rewind_racing_fenced_turns_across_two_handles",
        },
    ),
    ("move-unknown", "move_head", {"test_move_head_to_an_unknown_head_raises_unknown_head"}),
    (
        "move-partial",
        "move_head",
        {"test_move_head_fenced_by_head_raises_history_changed_with_heads"},
    ),
    ("move-order", "move_head", {"test_move_head_checks_closed_then_move_id_then_fence_then_head"}),
    (
        "move-race",
        "racing",
        {
            "test_rewind_racing_fenced_turns_exactly_one_wins",
            "test_rewind_racing_fenced_turns_across_two_handles",
        },
    ),
    (
        "move-atomic",
        "move_head_cancelled",
        {"test_move_head_cancelled_moves_all_or_nothing_and_retry_resolves"},
    ),
    ("tree-created", "tree", {"test_tree_shape_parents_head_and_created_times"}),
    (
        "tree-parents",
        "tree or head",
        {
            "test_tree_shape_parents_head_and_created_times",
            "test_head_append_after_rewind_extends_from_the_new_head",
        },
    ),
    ("tree-head", "tree", {"test_tree_shape_parents_head_and_created_times"}),
    (
        "created-ignored",
        "created",
        {"test_tree_created_restores_a_given_stored_time"},
    ),
    ("created-validate-after-io", "created", {"test_tree_created_invalid_rejected_before_io"}),
    ("clear-keeps-branches", "clear", {"test_clear_closes_every_branch"}),
    ("fence-race", "fenced", {"test_concurrent_fenced_appends_at_one_length_exactly_one_lands"}),
    ("view-atomic", "view", {"test_views_are_atomic_under_concurrent_appends"}),
    ("durable-messages", "durable", {"test_durable_messages_survive_reopen"}),
    ("durable-dedupe", "durable", {"test_durable_dedupe_evidence_survives_reopen"}),
    ("durable-closure", "durable", {"test_durable_closure_survives_reopen"}),
    (
        "lease-forever",
        "lease",
        {"test_lease_expires_by_itself", "test_lease_release_after_expiry_is_not_held"},
    ),
    (
        "lease-token",
        "lease",
        {
            "test_lease_holder_token_excludes_other_holders",
            "test_lease_renewal_by_its_holder_extends_it",
            "test_concurrent_lease_acquires_exactly_one_wins",
            "test_lease_is_exclusive_across_two_handles",
        },
    ),
    (
        "lease-race",
        "lease",
        {
            "test_concurrent_lease_acquires_exactly_one_wins",
            "test_lease_is_exclusive_across_two_handles",
        },
    ),
    (
        "fold-stale-read",
        "folded",
        {
            "test_folded_turns_hand_over_without_a_stale_view",
            "test_folded_turns_hand_over_across_two_handles",
        },
    ),
    (
        "fold-ignore-lease",
        "folded",
        {
            "test_folded_acquire_under_another_holders_lease_reads_nothing",
            "test_folded_acquire_takes_an_expired_lease",
            "test_concurrent_folded_acquires_exactly_one_reads",
        },
    ),
    (
        "fold-release-first",
        "folded",
        {
            "test_folded_turns_hand_over_without_a_stale_view",
            "test_folded_turns_hand_over_across_two_handles",
            "test_folded_append_refused_keeps_the_lease_and_appends_nothing",
        },
    ),
    (
        "fold-release-on-refusal",
        "folded",
        {"test_folded_append_refused_keeps_the_lease_and_appends_nothing"},
    ),
    (
        "fold-release-any",
        "folded",
        {"test_folded_append_leaves_another_holders_lease"},
    ),
    (
        # Not the hand-over tests: without releases they wait for their time limit.
        "fold-keep-lease",
        "folded_append",
        {
            "test_folded_append_lands_and_releases_the_lease",
            "test_folded_append_retry_returns_the_receipt_and_releases",
        },
    ),
    *_ERASURE_CASES,
    *_RESTORE_CASES,
]


def _class_name(broken: str) -> str:
    return "TestBroken_" + broken.replace("-", "_")


def _source() -> str:
    classes = ["\n\nclass TestIntact(Base):\n    pass\n"]
    for broken, _, _ in CASES:
        classes.append(f"\n\nclass {_class_name(broken)}(Base):\n    BREAK = {broken!r}\n")
    return _BROKEN_STORE + "".join(classes)


# One inner pytest session serves every case (each session costs seconds of start-up):
# the intact store runs the whole suite, each broken one only the tests of its rule.
_RUNS: dict[str, tuple[dict[str, set[str]], dict[str, int], str]] = {}


def _run(pytester: pytest.Pytester) -> tuple[dict[str, set[str]], dict[str, int], str]:
    if "run" in _RUNS:
        return _RUNS["run"]
    pytester.makeini(
        """
        [pytest]
        asyncio_mode = strict
        asyncio_default_fixture_loop_scope = function
        filterwarnings = error
        """
    )
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def anyio_backend():
            return "asyncio"
        """
    )
    pytester.makepyfile(test_broken=_source())
    select = " or ".join(["TestIntact"] + [f"({_class_name(b)} and ({k}))" for b, k, _ in CASES])
    result = pytester.runpytest_inprocess("-q", "--tb=line", "-p", "no:cacheprovider", "-k", select)
    failed: dict[str, set[str]] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        if report.failed:
            _, cls, test = report.nodeid.split("::")
            failed.setdefault(cls, set()).add(test.split("[")[0])
    _RUNS["run"] = (failed, result.parseoutcomes(), result.stdout.str())
    return _RUNS["run"]


def test_the_configurable_store_passes_when_nothing_is_broken(pytester: pytest.Pytester) -> None:
    failed, outcomes, output = _run(pytester)
    assert "TestIntact" not in failed, output
    assert outcomes.get("errors", 0) == 0, output
    assert outcomes["passed"] > 50
    assert "skipped" not in outcomes, output


@pytest.mark.parametrize(
    ("broken", "expected"), [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_conformance_catches_a_broken_store(
    pytester: pytest.Pytester, broken: str, expected: set[str]
) -> None:
    failed, _, output = _run(pytester)
    caught = failed.get(_class_name(broken), set())
    assert expected <= caught, f"not caught: {sorted(expected - caught)}\n{output}"
