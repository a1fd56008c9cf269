"""Appends, this tree against another in one run: 1 and 16 tasks, one
conversation and many, the rows of ``bench_peers.py`` without the peers (their packages
are not needed), so the pair runs often enough to see through a loaded box.

One append is one turn of ``bench_peers.py`` (a ~110-character user message and a
~200-character assistant message, one ``Batch`` built inside the timed call). Rows:
1 task appending ``--appends`` times to one conversation, or each time to a new one;
16 tasks appending ``--per-task`` times each, all to one conversation, or each task to
its own. Each round runs one process per tree, in turn (A B A B ...), on its own table
prefix (SQLite: its own file); each process opens a handle (PostgreSQL:
``max_size=16``), runs one untimed round of each
row (the pool's connections, each session's first statements), then times each row:
per append (the row's wall time over its appends: the inverse of throughput) and the
p50 of one append's latency. The table shows the median over rounds of each tree's
times and of the ratio A/B of each round's pair (the box's speed drifts between
rounds, not within a pair).

Run: ``python benchmarks/bench_append.py [--vs OTHER_TREE] [--rounds N] [--appends N]
[--per-task N] [sqlite] [postgres]`` (both by default; PostgreSQL from
``SCOPE_TEST_POSTGRES_DSN``, skipped without it; SQLite in a temporary directory).
Without ``--vs`` it prints this tree's times only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

#: This tree. A child process imports scope (and ``tests.servers``) from the tree its
#: ``PYTHONPATH`` names, never from here: nothing puts this tree on ``sys.path``.
HERE = Path(__file__).resolve().parent.parent
USER = "What is the capital of France, and why is it famous? " * 2
ASSISTANT = "Paris. It is known for art, food, history and the Eiffel Tower. " * 3
TASKS = 16
ROWS = ("1 task, one conv", "1 task, many conv", "16 tasks, one conv", "16 tasks, many conv")


async def _row(store: Any, row: str, appends: int, per_task: int) -> tuple[float, float]:
    """Seconds per append and the p50 latency of one append, for ``row``."""
    from scope.chat import assistant_message, user_message
    from scope.history import Batch

    messages = (user_message(USER), assistant_message(ASSISTANT))
    base = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    many, tasks = row.endswith("many conv"), row.startswith("16")

    async def task(t: int, count: int) -> None:
        for i in range(count):
            # many: each task on its own conversation, or each 1-task append on a new one
            cid = (f"{base}-{t}" if tasks else f"{base}-{i}") if many else base
            start = time.perf_counter()
            await store.append(Batch(cid, uuid.uuid4().hex, messages))
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    if tasks:
        await asyncio.gather(*(task(t, per_task) for t in range(TASKS)))
    else:
        await task(0, appends)
    return (time.perf_counter() - start) / len(latencies), statistics.median(latencies)


async def _rows(store: Any, appends: int, per_task: int) -> dict[str, list[float]]:
    async with store:
        for row in ROWS:  # untimed
            await _row(store, row, 2, 2)
        return {row: list(await _row(store, row, appends, per_task)) for row in ROWS}


async def _time(kind: str, where: str, appends: int, per_task: int) -> dict[str, list[float]]:
    prefix = f"bench_append_{uuid.uuid4().hex[:8]}"
    if kind == "sqlite":
        from scope.historystores.sqlite import SQLiteStore

        store = await SQLiteStore.open(str(Path(where) / f"{prefix}.db"))
        return await _rows(store, appends, per_task)
    from scope.historystores.postgres import PostgresStore
    from tests.servers import drop_tables

    try:
        store = await PostgresStore.open(where, table_prefix=prefix, max_size=16)
        return await _rows(store, appends, per_task)
    finally:
        await drop_tables(where, prefix)


def _child(
    tree: Path, kind: str, where: str, appends: int, per_task: int
) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, __file__, "--child", kind, where, str(appends), str(per_task)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, where, appends, per_task = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6])
        import scope

        source = Path(scope.__file__ or "").resolve()
        if not source.is_relative_to(Path.cwd().resolve()):  # the tree under test
            raise RuntimeError(f"scope was imported from {source}, not from {Path.cwd()}")
        print(json.dumps(asyncio.run(_time(kind, where, appends, per_task))))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--vs", type=Path, help="another checkout of scope (tree B)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--appends", type=int, default=60)
    parser.add_argument("--per-task", type=int, default=12)
    parser.add_argument("stores", nargs="*", help="sqlite and/or postgres (default: both)")
    args = parser.parse_args()
    unknown = set(args.stores) - {"sqlite", "postgres"}
    if unknown:
        parser.error(f"unknown stores: {', '.join(sorted(unknown))} (sqlite, postgres)")
    for kind in args.stores or ("sqlite", "postgres"):
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as where:
                _compare(args, "sqlite", where)
        elif os.environ.get("SCOPE_TEST_POSTGRES_DSN"):
            _compare(args, "postgres", os.environ["SCOPE_TEST_POSTGRES_DSN"])
        else:
            print("postgres: skipped (no SCOPE_TEST_POSTGRES_DSN)")


def _compare(args: argparse.Namespace, kind: str, where: str) -> None:
    trees = [HERE, *([args.vs.resolve()] if args.vs else [])]
    print(f"{kind}: A = {trees[0]}" + (f", B = {trees[1]}" if args.vs else ""))
    runs: list[list[dict[str, list[float]]]] = [[] for _ in trees]
    for _ in range(args.rounds):
        for index, tree in enumerate(trees):
            runs[index].append(_child(tree, kind, where, args.appends, args.per_task))
    for row in ROWS:
        for column, name in ((0, "per append"), (1, "p50")):
            cells = [
                f"{statistics.median(r[row][column] for r in run) * 1e6:8.1f} us" for run in runs
            ]
            line = f"{row + ': ' + name:32s} A {cells[0]}"
            if args.vs:
                ratio = statistics.median(
                    a[row][column] / b[row][column] for a, b in zip(*runs, strict=True)
                )
                line += f"   B {cells[1]}   A/B {ratio:.2f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
