"""History stores side by side: append throughput and read latency.

Stores: scope's in-memory reference store, SQLiteStore (synchronous NORMAL and FULL),
PostgresStore and RedisStore (servers from SCOPE_TEST_POSTGRES_DSN / SCOPE_TEST_REDIS_URL,
e.g. after ``eval "$(bash .ci/services.sh start)"``), and the OpenAI Agents SDK's
``SQLiteSession`` (package ``openai-agents``; ``add_items`` / ``get_items``) on the same
data. A store whose server or package is missing is reported as skipped.

Measured (best of N, time.perf_counter, asyncio):
- append, 1 task: 200 sequential appends of one 2-message batch (user + assistant).
- append, 16 tasks: 16 tasks x 25 appends, each task on its own conversation.
- read of a conversation of 10, 100 and 1,000 messages.
- the ``expected_length`` fence (DESIGN §6b): 200 sequential fenced appends (each batch
  names the conversation's length) against 200 unfenced ones, per scope store, rounds
  interleaved, best of 5; the ratio is fenced / unfenced.
- a turn through the history Middleware under ``on_overlap="fence"`` against
  ``"reject"`` (DESIGN §6e: the lease is taken before and released after the model
  call, two more store steps per turn): 100 sequential turns each (one user message, a
  model that answers at once), rounds interleaved, best of 5; the ratio is reject /
  fence. Every bundled store has the folded lease steps of ``scope.history.Store``, so
  its ``reject`` turn makes two store steps too (lease + read, append + release).

- branches (DESIGN §6h): 200 sequential appends fenced by length and head on a linear
  conversation against 200 on a branch (a conversation rewound by one turn before
  them, so every append extends a branch), rounds interleaved, best of 5; the ratio is
  branch / linear (an append keeps each batch's path length: it never walks the
  tree). And a read of a 1,000-message head path, linear against branched (the same
  path after a rewind and a switch back: the store walks parents), best of 8.

The persistent scope stores run with their cache off (``cache_bytes=0``), so every read
decodes and validates every message; one extra row shows SQLiteStore with its default cache
(repeated reads of a conversation skip decoding). Each column's ratio is to the fastest
store in it (the floor).
Run: ``python benchmarks/bench_stores.py``; ``python benchmarks/bench_stores.py --overlap
[RUNS]`` measures only the overlap rows, RUNS times per store (default 5), and reports
each store's ratio as min / median / max over the runs (the spread on a shared box);
``--branches`` measures only the branch rows.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scope.chat import FinishReason, Output, Request, Response, assistant_message, user_message
from scope.history import Batch, Middleware
from scope.history.inmemory import InMemoryStore as InMemoryStore
from tests.servers import drop_keys, drop_tables

USER = "What is the capital of France, and why is it famous? " * 2
ASSISTANT = "Paris. It is known for art, food, history and the Eiffel Tower. " * 3
REPEATS = 3
SEQUENTIAL = 200
TASKS, PER_TASK = 16, 25
READ_SIZES = (10, 100, 1000)


def batch(cid: str, aid: str) -> Batch:
    return Batch(cid, aid, [user_message(USER), assistant_message(ASSISTANT)])


def items() -> list[dict[str, Any]]:
    return [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]


class Adapter:
    """One store under test: append a 2-message turn, read a conversation."""

    def __init__(
        self,
        append: Callable[[str, str], Awaitable[Any]],
        read: Callable[[str], Awaitable[Any]],
        store: Any = None,
    ) -> None:
        self.append = append
        self.read = read
        self.store = store  # the scope store, for the fence comparison


def scope_adapter(store: Any) -> Adapter:
    async def append(cid: str, aid: str) -> None:
        await store.append(batch(cid, aid))

    return Adapter(append, store.read, store)


async def measure_fence(store: Any) -> tuple[float, float]:
    """Best-of microseconds per append: (unfenced, fenced), rounds interleaved."""
    run = uuid.uuid4().hex[:6]
    best = {False: float("inf"), True: float("inf")}
    template = batch("x", "x")
    for round_ in range(5):
        for fenced in (False, True):
            cid = f"fence-{run}-{round_}-{int(fenced)}"
            batches = [
                Batch(cid, f"a{i}", template.messages, 2 * i if fenced else None)
                for i in range(SEQUENTIAL)
            ]
            start = time.perf_counter()
            for b in batches:
                await store.append(b)
            best[fenced] = min(best[fenced], time.perf_counter() - start)
    return best[False] / SEQUENTIAL * 1e6, best[True] / SEQUENTIAL * 1e6


async def measure_branches(store: Any) -> tuple[float, float, float, float]:
    """Best-of microseconds per fenced append (linear, on a branch) and milliseconds per
    read of a 1,000-message head path (linear, branched)."""
    run = uuid.uuid4().hex[:6]
    best = {"linear": float("inf"), "branch": float("inf")}
    template = batch("x", "x")
    for round_ in range(5):
        for shape in ("linear", "branch"):
            cid = f"branch-{run}-{round_}-{shape}"
            await store.append(Batch(cid, "p1", template.messages))
            await store.append(Batch(cid, "p2", template.messages))
            if shape == "branch":
                await store.move_head(cid, "p1", expected_head="p2")
            view = await store.read_view(cid)
            length, head = view.length, view.head
            batches = []
            for i in range(SEQUENTIAL):
                batches.append(Batch(cid, f"a{i}", template.messages, length, head))
                length, head = length + 2, f"a{i}"
            start = time.perf_counter()
            for b in batches:
                await store.append(b)
            best[shape] = min(best[shape], time.perf_counter() - start)
    reads = {}
    for shape in ("linear", "branched"):
        cid = f"branch-read-{run}-{shape}"
        for i in range(500):
            await store.append(Batch(cid, f"a{i}", template.messages))
        if shape == "branched":
            await store.move_head(cid, "a0", expected_head="a499")
            await store.move_head(cid, "a499", expected_head="a0")

        async def read(_: int, cid: str = cid) -> None:
            got = await store.read(cid)
            assert len(got) == 1000, len(got)

        reads[shape] = await best_of(8, read) * 1e3
    return (
        best["linear"] / SEQUENTIAL * 1e6,
        best["branch"] / SEQUENTIAL * 1e6,
        reads["linear"],
        reads["branched"],
    )


def print_branches(width: int, rows: dict[str, tuple[float, float, float, float]]) -> None:
    print("\nbranches: a fenced append (us/batch), a read of a 1,000-message head path (ms)")
    for name, (linear, branch, read_linear, read_branched) in rows.items():
        print(
            f"{name.ljust(width)}append linear {linear:>8.1f}   on a branch {branch:>8.1f}   "
            f"branch/linear {branch / linear:>5.2f}x   read linear {read_linear:>7.2f}   "
            f"branched {read_branched:>7.2f}"
        )


async def branches_only() -> None:
    """The branch rows alone, per scope store."""
    with tempfile.TemporaryDirectory() as tmp:
        async with stores(Path(tmp)) as candidates:
            width = max(len(name) for name, _ in candidates) + 2
            rows = {}
            for name, adapter in candidates:
                if isinstance(adapter, str) or adapter.store is None:
                    continue
                try:
                    rows[name] = await measure_branches(adapter.store)
                except NotImplementedError:
                    print(f"{name.ljust(width)}skipped: no branches yet")
            print_branches(width, rows)


def agents_adapter(db_path: str) -> Adapter:
    from agents import SQLiteSession

    sessions: dict[str, Any] = {}

    def session(cid: str) -> Any:
        if cid not in sessions:
            sessions[cid] = SQLiteSession(cid, db_path)
        return sessions[cid]

    async def append(cid: str, aid: str) -> None:
        await session(cid).add_items(items())

    async def read(cid: str) -> Any:
        return await session(cid).get_items()

    return Adapter(append, read)


@contextlib.asynccontextmanager
async def stores(tmp: Path) -> AsyncIterator[list[tuple[str, Adapter | str]]]:
    out: list[tuple[str, Adapter | str]] = [("in-memory", scope_adapter(InMemoryStore()))]
    async with contextlib.AsyncExitStack() as stack:
        from scope.historystores.sqlite import SQLiteStore

        # Every scope store runs with its cache off (cache_bytes=0: each read decodes),
        # except one row that shows what the cache does for repeated reads.
        cached = await SQLiteStore.open(tmp / "cached.db")
        stack.push_async_callback(cached.aclose)
        out.append(("SQLiteStore, default cache", scope_adapter(cached)))
        normal = await SQLiteStore.open(tmp / "normal.db", cache_bytes=0)
        stack.push_async_callback(normal.aclose)
        out.append(("SQLiteStore NORMAL", scope_adapter(normal)))
        full = await SQLiteStore.open(tmp / "full.db", synchronous="FULL", cache_bytes=0)
        stack.push_async_callback(full.aclose)
        out.append(("SQLiteStore FULL", scope_adapter(full)))

        dsn = os.environ.get("SCOPE_TEST_POSTGRES_DSN")
        if not dsn:
            out.append(("PostgresStore", "skipped: SCOPE_TEST_POSTGRES_DSN not set"))
        else:
            try:
                from scope.historystores.postgres import PostgresStore

                prefix = f"scope_bench_{uuid.uuid4().hex[:8]}"
                pg = await PostgresStore.open(dsn, table_prefix=prefix, max_size=16, cache_bytes=0)
                stack.push_async_callback(drop_tables, dsn, prefix)
                stack.push_async_callback(pg.aclose)
                out.append(("PostgresStore", scope_adapter(pg)))
            except Exception as exc:  # report and go on: a benchmark, not a test
                out.append(("PostgresStore", f"skipped: {type(exc).__name__}: {exc}"))

        url = os.environ.get("SCOPE_TEST_REDIS_URL")
        if not url:
            out.append(("RedisStore", "skipped: SCOPE_TEST_REDIS_URL not set"))
        else:
            try:
                from scope.historystores.redis import RedisStore

                key_prefix = f"scope-bench:{uuid.uuid4().hex[:8]}"
                rs = await RedisStore.open(url, prefix=key_prefix, cache_bytes=0)
                stack.push_async_callback(drop_keys, url, key_prefix)
                stack.push_async_callback(rs.aclose)
                out.append(("RedisStore", scope_adapter(rs)))
            except Exception as exc:
                out.append(("RedisStore", f"skipped: {type(exc).__name__}: {exc}"))

        try:
            import agents  # noqa: F401

            out.append(("agents SQLiteSession", agents_adapter(str(tmp / "agents.db"))))
        except ImportError:
            out.append(("agents SQLiteSession", "skipped: openai-agents not installed"))
        yield out


async def best_of(repeats: int, fn: Callable[[int], Awaitable[None]]) -> float:
    best = float("inf")
    for round_ in range(repeats):
        start = time.perf_counter()
        await fn(round_)
        best = min(best, time.perf_counter() - start)
    return best


TURNS = 100


class Answer:
    """A model that answers at once: the turn's cost is the Middleware's and the store's."""

    async def call(self, request: Request) -> Response:
        return Response(Output(assistant_message(ASSISTANT), FinishReason.STOP))


async def measure_overlap(store: Any) -> tuple[float, float]:
    """Best-of microseconds per turn: (fence, reject), rounds interleaved."""
    run = uuid.uuid4().hex[:6]
    best = {"fence": float("inf"), "reject": float("inf")}
    request = Request([user_message(USER)])
    for round_ in range(5):
        for strategy in ("fence", "reject"):
            cid = f"turn-{run}-{round_}-{strategy}"
            model = Middleware(store, store, cid, on_overlap=strategy).call(Answer())  # type: ignore[arg-type]
            start = time.perf_counter()
            for _ in range(TURNS):
                await model.call(request)
            best[strategy] = min(best[strategy], time.perf_counter() - start)
    return best["fence"] / TURNS * 1e6, best["reject"] / TURNS * 1e6


async def measure(adapter: Adapter) -> dict[str, float]:
    run = uuid.uuid4().hex[:6]
    results: dict[str, float] = {}

    async def sequential(round_: int) -> None:
        cid = f"seq-{run}-{round_}"
        for i in range(SEQUENTIAL):
            await adapter.append(cid, f"a{i}")

    results["append 1 task (us/batch)"] = await best_of(REPEATS, sequential) / SEQUENTIAL * 1e6

    async def concurrent(round_: int) -> None:
        async def worker(task: int) -> None:
            cid = f"par-{run}-{round_}-{task}"
            for i in range(PER_TASK):
                await adapter.append(cid, f"a{i}")

        async with anyio.create_task_group() as tg:
            for task in range(TASKS):
                tg.start_soon(worker, task)

    total = TASKS * PER_TASK
    results["append 16 tasks (us/batch)"] = await best_of(REPEATS, concurrent) / total * 1e6

    for size in READ_SIZES:
        cid = f"read-{run}-{size}"
        for i in range(size // 2):
            await adapter.append(cid, f"a{i}")
        repeats = 30 if size <= 100 else 8

        async def read(_: int, cid: str = cid, size: int = size) -> None:
            got = await adapter.read(cid)
            assert len(got) == size, (len(got), size)

        results[f"read {size} msgs (ms)"] = await best_of(repeats, read) * 1e3
    return results


async def main() -> None:
    fences: dict[str, tuple[float, float]] = {}
    overlaps: dict[str, tuple[float, float]] = {}
    branch_rows: dict[str, tuple[float, float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with stores(Path(tmp)) as candidates:
            table: dict[str, dict[str, float] | str] = {}
            for name, adapter in candidates:
                if isinstance(adapter, str):
                    table[name] = adapter
                else:
                    table[name] = await measure(adapter)
                    if adapter.store is not None:
                        fences[name] = await measure_fence(adapter.store)
                        overlaps[name] = await measure_overlap(adapter.store)
                        with contextlib.suppress(NotImplementedError):
                            branch_rows[name] = await measure_branches(adapter.store)
    measured = {k: v for k, v in table.items() if isinstance(v, dict)}
    columns = list(next(iter(measured.values())))
    floors = {c: min(v[c] for v in measured.values()) for c in columns}
    width = max(len(n) for n in table) + 2
    print("".ljust(width) + "".join(c.rjust(30) for c in columns))
    for name, row in table.items():
        if isinstance(row, str):
            print(name.ljust(width) + row)
            continue
        cells = "".join(f"{row[c]:>18.1f} ({row[c] / floors[c]:>6.1f}x)".rjust(30) for c in columns)
        print(name.ljust(width) + cells)
    print("\nratios: to the fastest store in each column (1.0x = the floor)")
    print("\nappend, 1 task, the expected_length fence (us/batch)")
    for name, (plain, fenced) in fences.items():
        print(
            f"{name.ljust(width)}unfenced {plain:>9.1f}   fenced {fenced:>9.1f}   "
            f"fenced/unfenced {fenced / plain:>5.2f}x"
        )
    print("\na Middleware turn, on_overlap fence vs reject (us/turn)")
    for name, (fence, reject) in overlaps.items():
        print(
            f"{name.ljust(width)}fence {fence:>9.1f}   reject {reject:>9.1f}   "
            f"reject/fence {reject / fence:>5.2f}x"
        )
    print_branches(width, branch_rows)


async def overlap_only(runs: int) -> None:
    """The overlap rows alone, ``runs`` times per store: best fence and reject turn over
    all runs, and the spread of the per-run ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        async with stores(Path(tmp)) as candidates:
            width = max(len(name) for name, _ in candidates) + 2
            print(f"a Middleware turn, on_overlap fence vs reject (us/turn), {runs} runs")
            for name, adapter in candidates:
                if isinstance(adapter, str) or adapter.store is None:
                    print(name.ljust(width) + ("skipped" if adapter is None else str(adapter)))
                    continue
                results = [await measure_overlap(adapter.store) for _ in range(runs)]
                ratios = sorted(reject / fence for fence, reject in results)
                fence = min(f for f, _ in results)
                reject = min(r for _, r in results)
                print(
                    f"{name.ljust(width)}fence {fence:>9.1f}   reject {reject:>9.1f}   "
                    f"reject/fence min {ratios[0]:.2f}x  median "
                    f"{ratios[len(ratios) // 2]:.2f}x  max {ratios[-1]:.2f}x"
                )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--overlap"]:
        anyio.run(overlap_only, int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    elif sys.argv[1:2] == ["--branches"]:
        anyio.run(branches_only)
    else:
        anyio.run(main)
