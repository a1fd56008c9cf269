"""``scope history erase``, ``expire`` and ``verify --erased`` (DESIGN §6i): the command
functions on the in-memory store, the argument checks, and the whole command line on
SQLite (once its store erases)."""

from __future__ import annotations

import datetime as dt
import io
import pathlib
from typing import Any

import anyio
import pytest

from scope.chat import assistant_message, user_message
from scope.cli import main
from scope.cli._erasure import check_receipts, erase_in, expire_all, parse_receipts
from scope.cli._errors import CLIError
from scope.cli._stores import sqlite_url
from scope.history import Batch, ErasureReceipt
from scope.history.inmemory import InMemoryStore

pytestmark = pytest.mark.anyio


def _batch(cid: str, aid: str = "a1") -> Batch:
    return Batch(cid, aid, [user_message("hi"), assistant_message("hello")])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def _store(*owned: tuple[str, str | None]) -> InMemoryStore:
    store = InMemoryStore()
    for cid, owner in owned:
        await store.append(_batch(cid), owner=owner)
    return store


async def test_erase_prints_the_receipt_json() -> None:
    store = await _store(("c", None), ("d", None))
    out, err = io.StringIO(), io.StringIO()
    status = await erase_in(store, "c", None, yes=True, stdin=io.StringIO(), stdout=out, stderr=err)
    assert status == 0
    receipt = ErasureReceipt.from_json(out.getvalue().strip())
    assert out.getvalue() == receipt.to_json().decode() + "\n"
    assert receipt.batches == 1
    assert await store.read("c") == []
    assert await store.conversations() == ["d"]


async def test_erase_asks_on_a_terminal_and_no_erases_nothing() -> None:
    store = await _store(("c", None))
    err = io.StringIO()
    with pytest.raises(CLIError, match="not confirmed"):
        await erase_in(
            store, "c", None, yes=False, stdin=_Tty("n\n"), stdout=io.StringIO(), stderr=err
        )
    assert "Erase conversation 'c' (2 messages" in err.getvalue()
    assert len(await store.read("c")) == 2
    with pytest.raises(CLIError, match="not confirmed"):  # no terminal: the answer is no
        await erase_in(
            store, "c", None, yes=False, stdin=io.StringIO("y\n"), stdout=io.StringIO(), stderr=err
        )
    out = io.StringIO()
    await erase_in(store, "c", None, yes=False, stdin=_Tty("yes\n"), stdout=out, stderr=err)
    assert await store.read("c") == []


async def test_erase_owner_prints_one_receipt_per_conversation() -> None:
    store = await _store(("a1", "alice"), ("a2", "alice"), ("b1", "bob"))
    out, err = io.StringIO(), io.StringIO()
    await erase_in(store, None, "alice", yes=True, stdin=io.StringIO(), stdout=out, stderr=err)
    receipts = parse_receipts(out.getvalue().encode(), "out")
    assert len(receipts) == 2 and err.getvalue() == "erased 2 conversations\n"
    assert await store.conversations() == ["b1"]
    assert await check_receipts(store, receipts, stdout=io.StringIO(), stderr=io.StringIO()) == 0


async def test_erase_needs_exactly_one_target() -> None:
    store = await _store()
    for cid, owner in ((None, None), ("c", "alice")):
        with pytest.raises(CLIError, match="one CONVERSATION or --owner"):
            await erase_in(
                store,
                cid,
                owner,
                yes=True,
                stdin=io.StringIO(),
                stdout=io.StringIO(),
                stderr=io.StringIO(),
            )


async def test_commands_refuse_a_store_that_cannot_erase() -> None:
    class Old:
        async def read(self, cid: str) -> list[Any]:
            return []

    with pytest.raises(CLIError, match=r"\(Old\) cannot erase"):
        await erase_in(
            Old(),
            "c",
            None,
            yes=True,
            stdin=io.StringIO(),
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    with pytest.raises(CLIError, match="cannot expire"):
        await expire_all(Old(), None)
    with pytest.raises(CLIError, match="cannot check erased"):
        await check_receipts(Old(), [], stdout=io.StringIO(), stderr=io.StringIO())


async def test_expire_removes_all_or_at_most_the_limit() -> None:
    store = await _store(*((f"c{i}", None) for i in range(5)), ("live", None))
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    for i in range(5):
        await store.retain(f"c{i}", past)
    assert await expire_all(store, 2) == 2
    assert await expire_all(store, None) == 3
    assert await expire_all(store, None) == 0
    assert await store.conversations() == ["live"]


async def test_verify_erased_reports_each_problem() -> None:
    store = await _store(("c", None))
    good = await store.erase("c")
    forged = ErasureReceipt(
        "hmac-sha256:" + "1" * 64, good.digest, good.batches, good.bytes, good.erased_at, "sqlite"
    )
    out, err = io.StringIO(), io.StringIO()
    assert await check_receipts(store, [good, forged], stdout=out, stderr=err) == 1
    assert out.getvalue() == "1 of 2 erasure receipts not proven\n"
    lines = err.getvalue().splitlines()
    assert lines == [
        f"scope: error: receipt {forged.tombstone}: the receipt was issued by a sqlite store, "
        "not a memory one",
        f"scope: error: receipt {forged.tombstone}: no tombstone {forged.tombstone} in this store",
    ]
    out = io.StringIO()
    assert await check_receipts(store, [good], stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue() == "1 erasure receipt verified: no residue\n"


def test_receipt_files_are_json_lines_checked_line_by_line() -> None:
    receipt = ErasureReceipt.of(
        tombstone="hmac-sha256:" + "2" * 64,
        digests=[],
        bytes=0,
        erased_at=dt.datetime.now(dt.UTC),
        store="memory",
    )
    line = receipt.to_json()
    assert parse_receipts(line + b"\n\n" + line, "f") == [receipt, receipt]
    with pytest.raises(CLIError, match=r"f, line 2: erasure receipt fields: missing"):
        parse_receipts(line + b'\n{"tombstone": "x"}\n', "f")
    with pytest.raises(CLIError, match="f, line 1: an erasure receipt must be JSON"):
        parse_receipts(b"not json\n", "f")
    with pytest.raises(CLIError, match="holds no erasure receipt"):
        parse_receipts(b"\n  \n", "f")


# -- the command line ------------------------------------------------------------------


def test_erase_and_verify_need_their_arguments(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path / "h.sqlite3")
    (tmp_path / "h.sqlite3").touch()
    assert main(["history", "erase", "--store", url]) == 2
    assert "erase needs one CONVERSATION or --owner OWNER" in capsys.readouterr().err
    assert main(["history", "erase", "--store", url, "c", "--owner", "a"]) == 2
    assert main(["history", "verify", "--store", url, "--erased", "r.json", "c"]) == 2
    assert "verify --erased takes no CONVERSATION" in capsys.readouterr().err
    assert main(["history", "expire", "--store", url, "--limit", "0"]) == 2
    missing = str(tmp_path / "missing.json")
    assert main(["history", "verify", "--store", url, "--erased", missing]) == 1
    assert "cannot read the receipt file" in capsys.readouterr().err


def _sqlite_erases() -> bool:
    from scope.historystores.sqlite import SQLiteStore

    return callable(getattr(SQLiteStore, "erase", None))


def test_erase_expire_and_verify_on_sqlite(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not _sqlite_erases():
        pytest.skip("this SQLiteStore has no erasure yet")
    from scope.historystores.sqlite import SQLiteStore

    path = tmp_path / "h.sqlite3"
    url = sqlite_url(path)

    async def seed() -> None:
        async with await SQLiteStore.open(path) as store:
            await store.append(_batch("c"), owner="alice")
            await store.append(_batch("d"), owner="alice")
            await store.append(_batch("old"))
            await store.retain("old", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))

    anyio.run(seed)
    assert main(["history", "erase", "--store", url, "--yes", "c"]) == 0
    receipts = tmp_path / "receipts.jsonl"
    receipts.write_text(capsys.readouterr().out)
    assert main(["history", "erase", "--store", url, "--yes", "--owner", "alice"]) == 0
    with receipts.open("a") as file:
        file.write(capsys.readouterr().out)
    assert len(parse_receipts(receipts.read_bytes(), "r")) == 2
    assert main(["history", "expire", "--store", url]) == 0
    assert capsys.readouterr().out == "expired 1 conversation\n"
    assert main(["history", "verify", "--store", url, "--erased", str(receipts)]) == 0
    assert capsys.readouterr().out == "2 erasure receipts verified: no residue\n"
    assert main(["history", "list", "--store", url]) == 0
    assert capsys.readouterr().out == ""

    # The reading and moving commands say exactly what closed a conversation.
    async def close_more() -> None:
        async with await SQLiteStore.open(path) as store:
            await store.append(_batch("shut"))
            await store.clear("shut")
            await store.append(_batch("late"))
            await store.retain("late", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))

    anyio.run(close_more)
    closures = {"c": "erased", "old": "expired", "late": "expired", "shut": "cleared"}
    for cid, state in closures.items():  # "late": expired, expire() not run since
        for command in ("show", "branches", "inspect"):
            assert main(["history", command, "--store", url, cid]) == 1
            assert capsys.readouterr().err == (
                f"scope: error: conversation {cid!r} is {state}"
                f": no {'messages' if command == 'show' else 'branches'}\n"
            )
        for command in ("rewind", "switch"):
            to = "0" if command == "rewind" else ""
            assert main(["history", command, "--store", url, cid, "--to", to]) == 1
            assert capsys.readouterr().err == (
                f"scope: error: conversation {cid!r} is {state}; nothing was moved\n"
            )
