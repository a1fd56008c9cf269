"""Reads of one 1,000-message conversation per store, this tree against another in one
run: cold (a handle with ``cache_bytes=0``: every read digests, parses, checks and
builds every record) and warm (a caching handle reads the conversation again).

The conversation (500 turns of a ~110-character user message and a ~200-character
assistant message, the data of ``bench_peers.py``) is written once per store by this
tree. Each round then runs one process per tree, in turn (A B A B ...); each process
opens its handles, reads once untimed, times ``--reads`` reads of each kind and prints
the medians. The table shows the median over rounds of each tree's time per message
and of the ratio A/B of each round's pair (the box's speed drifts between rounds, not
within a pair).

``--messages 10`` reads a 10-message conversation instead: there the store call's own
cost (a thread hop, a round trip) outweighs decoding.

Run: ``python benchmarks/bench_read.py [--vs OTHER_TREE] [--rounds N] [--reads N]
[--messages N] [sqlite] [postgres] [redis]`` (PostgreSQL from
``SCOPE_TEST_POSTGRES_DSN``, Redis from ``SCOPE_TEST_REDIS_URL``; a store without its
server is skipped). Without ``--vs`` it prints this tree's times only.
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
#: ``PYTHONPATH`` names: only the parent puts this tree on ``sys.path`` (it writes and
#: drops the data). Before, the child did too, so ``--vs`` timed this tree twice.
HERE = Path(__file__).resolve().parent.parent
if sys.argv[1:2] != ["--child"]:
    sys.path.insert(0, str(HERE))  # tests.servers
USER = "What is the capital of France, and why is it famous? " * 2
ASSISTANT = "Paris. It is known for art, food, history and the Eiffel Tower. " * 3
TURNS = 500
CID = "bench-read"


async def _open(kind: str, where: str, **options: Any) -> Any:
    if kind == "sqlite":
        from scope.historystores.sqlite import SQLiteStore

        return await SQLiteStore.open(where, table_prefix="bench_read", **options)
    if kind == "postgres":
        from scope.historystores.postgres import PostgresStore

        dsn, prefix = where.split(" ")
        return await PostgresStore.open(dsn, table_prefix=prefix, max_size=2, **options)
    from scope.historystores.redis import RedisStore

    url, prefix = where.split(" ")
    return await RedisStore.open(url, prefix=prefix, check_persistence=False, **options)


async def _write(kind: str, where: str, turns: int) -> None:
    from scope.chat import assistant_message, user_message
    from scope.history import Batch

    messages = (user_message(USER), assistant_message(ASSISTANT))
    async with await _open(kind, where) as store:
        for _ in range(turns):
            await store.append(Batch(CID, uuid.uuid4().hex, messages))


async def _drop(kind: str, where: str) -> None:
    """Remove what the stores created (``tests.servers.drop_tables`` for PostgreSQL:
    tables and functions; every key under the prefix for Redis)."""
    if kind == "postgres":
        from tests.servers import drop_tables

        await drop_tables(*where.split(" "))
    elif kind == "redis":
        import redis.asyncio

        url, prefix = where.split(" ")
        client = redis.asyncio.Redis.from_url(url)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


async def _time(kind: str, where: str, reads: int, messages: int) -> dict[str, float]:
    """Median seconds per message of cold and warm reads (this process's tree)."""
    out: dict[str, float] = {}
    async with await _open(kind, where, cache_bytes=0) as cold, await _open(kind, where) as warm:
        for name, store in (("cold", cold), ("warm", warm)):
            assert len(await store.read(CID)) == messages  # untimed: connections, cache
            times = []
            for _ in range(reads):
                start = time.perf_counter()
                await store.read(CID)
                times.append(time.perf_counter() - start)
            out[name] = statistics.median(times) / messages
    return out


def _child(tree: Path, kind: str, where: str, reads: int, messages: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, __file__, "--child", kind, where, str(reads), str(messages)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, where, reads, messages = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6])
        import scope

        tree = Path(os.environ["PYTHONPATH"]).resolve()
        source = Path(scope.__file__ or "").resolve()
        if tree not in source.parents:
            raise SystemExit(f"the child imported scope from {source}, not from {tree}")
        print(json.dumps(asyncio.run(_time(kind, where, reads, messages))))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("stores", nargs="*", default=["sqlite", "postgres", "redis"])
    parser.add_argument("--vs", type=Path, help="another checkout of scope (tree B)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=15)
    parser.add_argument("--messages", type=int, default=2 * TURNS, help="an even number")
    args = parser.parse_args()
    if args.messages < 2 or args.messages % 2:
        parser.error("--messages: an even number, at least 2")
    trees = [HERE, *([args.vs.resolve()] if args.vs else [])]
    print(f"A = {trees[0]}" + (f", B = {trees[1]}" if args.vs else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.stores:
            tag = f"bench_read_{uuid.uuid4().hex[:8]}"
            if kind == "sqlite":
                where = str(Path(tmp) / "read.db")
            elif kind == "postgres" and os.environ.get("SCOPE_TEST_POSTGRES_DSN"):
                where = f"{os.environ['SCOPE_TEST_POSTGRES_DSN']} {tag}"
            elif kind == "redis" and os.environ.get("SCOPE_TEST_REDIS_URL"):
                where = f"{os.environ['SCOPE_TEST_REDIS_URL']} {tag}"
            else:
                print(f"{kind}: skipped (no server)")
                continue
            asyncio.run(_write(kind, where, args.messages // 2))
            try:
                runs: list[list[dict[str, float]]] = [[] for _ in trees]
                for _ in range(args.rounds):
                    for index, tree in enumerate(trees):
                        runs[index].append(_child(tree, kind, where, args.reads, args.messages))
            finally:
                asyncio.run(_drop(kind, where))
            for name in ("cold", "warm"):
                cells = [
                    f"{statistics.median(r[name] for r in run) * 1e6:6.2f} us/msg" for run in runs
                ]
                line = f"{kind:8s} {name} read {args.messages:,} msgs: A {cells[0]}"
                if args.vs:
                    ratio = statistics.median(a[name] / b[name] for a, b in zip(*runs, strict=True))
                    line += f"   B {cells[1]}   A/B {ratio:.2f}x"
                print(line, flush=True)


if __name__ == "__main__":
    main()
