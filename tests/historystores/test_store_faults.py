"""Faults and races across handles, pools and processes, on every persistent store.

- Two store instances (two pools, two "hosts") append to and clear the same
  conversations at once: no batch is lost or duplicated, and none lands after a clear.
- SQLite: a child process appending in a loop is killed with SIGKILL; every acknowledged
  batch survives, none is partial, and the in-flight batch lands at most once on retry.
- SQLite: two processes append to one file at once.

The PostgreSQL and Redis connection-kill tests live with their backends.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.errors import ConversationClosedError
from scope.history import Batch
from scope.historystores import PersistentStore
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import numbered_turn, texts
from tests.servers import fresh_backend, over_backends

ROOT = Path(__file__).resolve().parents[2]


def assert_batches_once_and_contiguous(stored: list[str], cid: str, aids: list[str]) -> None:
    """``stored`` holds exactly the batches ``aids`` (3 messages each), each once and
    contiguous, in any order between batches."""
    assert len(stored) == 3 * len(aids), f"{cid}: {len(stored)} messages for {len(aids)} batches"
    chunks = [stored[i : i + 3] for i in range(0, len(stored), 3)]
    seen = []
    for chunk in chunks:
        aid = chunk[0].split("|")[1]
        assert chunk == [f"{cid}|{aid}|{i}" for i in range(3)], f"torn batch: {chunk}"
        seen.append(aid)
    assert sorted(seen) == sorted(aids), f"{cid}: stored {sorted(seen)}, acked {sorted(aids)}"


# -- two hosts ---------------------------------------------------------------------------


async def race_two_hosts(one: PersistentStore, two: PersistentStore) -> None:
    """Both handles append to every conversation; half of them are cleared mid-way."""
    cids = [f"race {i} {{'%;*}}" for i in range(6)]
    to_clear = set(cids[::2])
    per_worker = 12
    acked: dict[str, list[str]] = {cid: [] for cid in cids}
    cleared: dict[str, bool] = dict.fromkeys(cids, False)
    enough = {cid: anyio.Event() for cid in cids}

    async def appender(store: PersistentStore, cid: str, tag: str) -> None:
        for i in range(per_worker):
            aid = f"{tag}-{i}"
            batch = Batch(cid, aid, numbered_turn(cid, aid, 3))
            clear_done_before = cleared[cid]
            try:
                receipt = await store.append(batch)
            except ConversationClosedError:
                assert cid in to_clear
                # Closed for ever: the retry of the same batch is refused too.
                with pytest.raises(ConversationClosedError):
                    await store.append(batch)
                return
            assert not clear_done_before, f"{cid}: {aid} was accepted after the clear returned"
            assert receipt == batch.receipt()
            acked[cid].append(aid)
            if len(acked[cid]) >= 4:
                enough[cid].set()
            # The other host sees the batch, and its retry there appends nothing.
            other = two if store is one else one
            try:
                assert await other.append(batch) == receipt
            except ConversationClosedError:
                assert cid in to_clear  # cleared in between: fine, and final
                return

    async def clearer(store: PersistentStore, cid: str) -> None:
        await enough[cid].wait()
        await store.clear(cid)
        cleared[cid] = True

    async with anyio.create_task_group() as tg:
        for index, cid in enumerate(cids):
            tg.start_soon(appender, one, cid, "one")
            tg.start_soon(appender, two, cid, "two")
            if cid in to_clear:
                tg.start_soon(clearer, one if index % 4 == 0 else two, cid)

    for cid in cids:
        for store in (one, two):
            stored = texts(await store.read(cid))
            if cid in to_clear:
                assert stored == [], f"{cid}: an append landed after the clear"
                with pytest.raises(ConversationClosedError):
                    await store.append(Batch(cid, "late", numbered_turn(cid, "late", 3)))
            else:
                assert len(acked[cid]) == 2 * per_worker
                assert_batches_once_and_contiguous(stored, cid, acked[cid])
    open_ids = sorted(set(cids) - to_clear)
    assert await one.conversations() == open_ids
    assert await two.conversations() == open_ids


#: Store options of the races: PostgreSQL's pools are kept small.
OPTIONS: dict[str, dict[str, Any]] = {"sqlite": {}, "postgres": {"max_size": 4}, "redis": {}}


@pytest.mark.anyio
@over_backends()
async def test_two_handles_race_without_loss_duplication_or_resurrection(
    kind: str, tmp_path: Path
) -> None:
    async with (
        fresh_backend(kind, tmp_path) as backend,
        await backend.open(**OPTIONS[kind]) as one,
        await backend.open(**OPTIONS[kind]) as two,
    ):
        await race_two_hosts(one, two)


# -- processes (SQLite) --------------------------------------------------------------------

CHILD = """
import sys
import anyio
from scope.chat import assistant_message, user_message
from scope.history import Batch
from scope.historystores.sqlite import SQLiteStore

path, cid, tag, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

async def main() -> None:
    async with await SQLiteStore.open(path) as store:
        i = 0
        while count < 0 or i < count:
            aid = f"{tag}-{i}"
            batch = Batch(cid, aid, [user_message(f"{cid}|{aid}|0")]
                          + [assistant_message(f"{cid}|{aid}|{k}") for k in (1, 2)])
            await store.append(batch)
            print(f"ack {i}", flush=True)
            i += 1

anyio.run(main)
"""


def spawn(path: Path, cid: str, tag: str, count: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), cid, tag, str(count)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.parametrize("kill_after", [5, 40])
def test_sqlite_survives_sigkill_of_an_appending_process(tmp_path: Path, kill_after: int) -> None:
    path = tmp_path / "killed.db"
    child = spawn(path, "k", "b", -1)
    assert child.stdout is not None
    acked = -1
    try:
        for line in child.stdout:
            acked = int(line.split()[1])
            if acked + 1 >= kill_after:
                break
        # The child is appending the next batch right now (or about to).
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        # Acks the child printed before it died but this loop had not read yet (a busy
        # machine reads slower than the child appends): each is an acknowledged batch.
        for line in child.stdout:
            acked = int(line.split()[1])
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    acked_ids = [f"b-{i}" for i in range(acked + 1)]
    in_flight = f"b-{acked + 1}"

    async def verify() -> None:
        async with await SQLiteStore.open(path) as store:
            stored = texts(await store.read("k"))
            landed = len(stored) // 3
            # Every acknowledged batch, plus at most the one in flight, nothing torn.
            assert landed in (len(acked_ids), len(acked_ids) + 1)
            ids = [f"b-{i}" for i in range(landed)]
            assert stored == [f"k|{aid}|{k}" for aid in ids for k in range(3)]
            retry = Batch("k", in_flight, numbered_turn("k", in_flight, 3))
            assert await store.append(retry) == retry.receipt()
            assert_batches_once_and_contiguous(
                texts(await store.read("k")), "k", [*acked_ids, in_flight]
            )

    anyio.run(verify)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # Switching a new file to WAL needs it alone; SQLite answers "database is locked"
    # at once while another process holds its schema transaction: open() waits it out.
    path = tmp_path / "new.db"
    tags = [f"p{i}" for i in range(6)]
    children = [spawn(path, "c", tag, 2) for tag in tags]
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        assert out.split("\n")[-2] == "ack 1"

    async def verify() -> None:
        async with await SQLiteStore.open(path) as store:
            expected = [f"{tag}-{i}" for tag in tags for i in range(2)]
            assert_batches_once_and_contiguous(texts(await store.read("c")), "c", expected)

    anyio.run(verify)


def test_two_processes_append_to_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    count = 30
    children = [spawn(path, "shared", tag, count) for tag in ("p1", "p2")]
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        assert out.split("\n")[-2] == f"ack {count - 1}"

    async def verify() -> None:
        async with await SQLiteStore.open(path) as store:
            expected = [f"{tag}-{i}" for tag in ("p1", "p2") for i in range(count)]
            assert_batches_once_and_contiguous(
                texts(await store.read("shared")), "shared", expected
            )

    anyio.run(verify)
