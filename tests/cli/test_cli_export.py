"""``scope history export`` / ``import`` of a whole store (DESIGN §6n), format version 3:
every branch, head, recorded move, owner, retention, closed conversation and tombstone
survives a round trip into each store kind; a retry of an original batch on the imported
store returns its original receipt; a SIGKILL during an import and a re-run finish the
job; conflicts and bad lines are named, never skipped silently."""

from __future__ import annotations

import datetime as _dt
import io
import pathlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from scope.chat import assistant_message, user_message
from scope.cli import _stores, main
from scope.cli._compare import compare_stores, differences
from scope.cli._errors import CLIError
from scope.cli._export import (
    HEADER,
    ConversationRecord,
    closed_line,
    export_store,
    parse_export,
    parse_export_line,
    restore_conversation,
)
from scope.cli._history import export_conversations, import_conversations
from scope.cli._stores import sqlite_url
from scope.cli._verify import verify_store
from scope.errors import (
    ConversationClosedError,
    InvalidBatchError,
    InvalidConversationIDError,
    InvalidViewError,
)
from scope.history import Batch, ClosedConversation, ConversationID, ConversationMeta, HistoryTree
from scope.history.inmemory import InMemoryStore
from scope.history.storekit import tombstone
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import subprocess_env
from tests.servers import Backend, fresh_backend, over_backends

_DAY = _dt.timedelta(days=1)


def _batch(cid: str, aid: str, text: str) -> Batch:
    return Batch(cid, aid, [user_message(text), assistant_message(f"re: {text}")])


async def _seed(store: Any, until: _dt.datetime) -> None:
    """Four conversations: one with two branches and recorded moves (regenerated, then
    switched back), one rewound to its start, one retained until ``until``, one
    retained for ever; and one cleared (never listed, never exported)."""
    await store.append(_batch("branched", "a1", "one"), owner="alice")
    await store.append(_batch("branched", "a2", "two"))
    await store.move_head("branched", "a1", expected_head="a2", move_id="regen-1")
    await store.append(_batch("branched", "b2", "two, again"))
    await store.move_head("branched", "a2", expected_head="b2", move_id="switch-1")
    await store.append(_batch("rewound", "a1", "start"), owner="alice")
    await store.move_head("rewound", "", expected_head="a1", move_id="back-1")
    await store.append(_batch("kept", "a1", "keep me"), owner="bob")
    await store.retain("kept", until)
    await store.append(_batch("forever", "a1", "for ever"))
    await store.retain("forever", None)
    await store.append(_batch("gone", "a1", "bye"))
    await store.clear("gone")


def _shape(tree: HistoryTree) -> tuple[Any, ...]:
    """What a round trip keeps of a tree: each batch (append id, digest, messages,
    parent's append id), the head's append id, the chain digest of every path."""
    ids = [str(b.id) for b in tree.batches]
    return (
        [
            (ids[i], b.digest, b.encoded_messages, "" if p == -1 else ids[p])
            for i, (b, p) in enumerate(zip(tree.batches, tree.parents, strict=True))
        ],
        "" if tree.head == -1 else ids[tree.head],
        [tree.chain(i) for i in range(len(ids))],
    )


@pytest.fixture
async def backend(kind: str, tmp_path: pathlib.Path) -> AsyncIterator[Backend]:
    async with fresh_backend(kind, tmp_path) as backend:
        yield backend


@pytest.fixture
def source_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "source.db"


@pytest.fixture
def cli_opens(
    backend: Backend, source_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """``src://`` opens the SQLite source store, any other URL ``backend``'s place."""

    async def open_store(url: str, *, create: bool = True) -> Any:
        if url == "src://":
            return await SQLiteStore.open(source_path, create=create)
        return await backend.open(**({} if backend.kind == "redis" else {"create": create}))

    monkeypatch.setattr(_stores, "open_cli_store", open_store)
    yield


async def _export(url: str) -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), io.StringIO()
    status = await export_conversations(url, None, stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


async def _import(url: str, data: bytes) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = await import_conversations(url, data, "export.jsonl", stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


pytestmark = pytest.mark.anyio


async def _view_length(path: pathlib.Path, cid: str) -> int:
    async with await SQLiteStore.open(path) as store:
        return (await store.read_view(cid)).length


@over_backends()
async def test_round_trip_keeps_every_branch_head_owner_and_retention(
    backend: Backend, cli_opens: None, source_path: pathlib.Path
) -> None:
    until = _dt.datetime.now(_dt.UTC).replace(microsecond=250_000) + _DAY
    async with await SQLiteStore.open(source_path) as source:
        await _seed(source, until)
        receipt = (await source.read_tree("branched")).batches[0].receipt()
        # Closed ones: erased (its tombstone), expired and removed, expired and due.
        await source.append(_batch("erased", "a1", "forget me"), owner="alice")
        erased = await source.erase("erased")
        await source.append(_batch("lapsed", "a1", "old"), owner="bob")
        await source.retain("lapsed", _dt.datetime.now(_dt.UTC) - _DAY)
        assert await source.expire() == 1
        await source.append(_batch("due", "a1", "old too"), owner="bob")
        await source.retain("due", _dt.datetime.now(_dt.UTC) - _DAY)
        secret = await source.store_secret()

    status, data, err = await _export("src://")
    assert (status, err) == (0, "")
    header, secret_line, tombstone_line, *rest = data.splitlines()
    closed_lines, lines = rest[:3], rest[3:]
    assert header == HEADER
    assert secret_line == b'{"secret":"%s"}' % secret.hex().encode()
    assert tombstone_line == b'{"tombstone":"%s"}' % erased.tombstone.encode()
    assert [parse_export_line(line) for line in closed_lines] == [
        ClosedConversation("due", "expired", "bob", (await _view_length(source_path, "due"))),
        ClosedConversation("gone", "cleared", None, 2),
        ClosedConversation("lapsed", "expired", "bob", await _view_length(source_path, "lapsed")),
    ]
    assert [ConversationRecord.from_json(line).conversation_id for line in lines] == [
        "branched",
        "forever",
        "kept",
        "rewound",  # rewound to its start: exported all the same
    ]

    status, out, err = await _import("dst://", data)
    assert (status, err) == (0, "")
    assert out == (
        "imported 7, already present 0, failed 0 (of 7 conversations); tombstones added 1 (of 1)\n"
    )

    async with await SQLiteStore.open(source_path) as source, await backend.open() as target:
        for cid in ("branched", "forever", "kept", "rewound"):
            want, got = await source.read_tree(cid), await target.read_tree(cid)
            assert _shape(got) == _shape(want), cid
            # Each batch's stored time is the source's (to the microsecond: what
            # PostgreSQL and Redis keep), not the import's.
            assert all(isinstance(t, float) for t in want.created), want.created
            assert got.created == pytest.approx(want.created, abs=1e-6, rel=0), cid
            want_meta, got_meta = await source.read_meta(cid), await target.read_meta(cid)
            assert (got_meta.owner, got_meta.moves, got_meta.retained) == (
                want_meta.owner,
                want_meta.moves,
                want_meta.retained,
            ), cid
            if want_meta.expires_at is None:
                assert got_meta.expires_at is None
            else:
                assert got_meta.expires_at is not None
                assert abs(got_meta.expires_at - want_meta.expires_at) < 0.001
        assert (await target.read_meta("kept")).expires_at == pytest.approx(
            until.timestamp(), abs=0.001
        )
        assert await target.read("rewound") == []
        assert await target.conversations(owner="alice") == ["branched", "rewound"]
        assert await target.conversations(owner="bob") == ["kept"]
        assert "gone" not in await target.conversations()
        # Closed and erased ones are what they were, owners included.
        assert (await target.read_meta("gone")).closure == "cleared"
        assert (await target.read_meta("lapsed")).closure == "expired"
        assert await target.read_meta("erased") == ConversationMeta(closure="erased")
        assert await target.store_secret() == secret
        if backend.kind == "sqlite":  # a receipt names the kind of store that issued it
            assert await target.check_erased(erased) == []
        for cid in ("gone", "lapsed", "erased", "due"):
            with pytest.raises(ConversationClosedError):
                await target.append(_batch(cid, "again", "again"), owner="alice")
        # A retry of an original batch returns the original receipt and moves nothing.
        before = await target.read_tree("branched")
        again = await target.append(_batch("branched", "a1", "one"), owner="mallory")
        assert again == receipt
        assert await target.read_tree("branched") == before
        # A recorded move's retry returns what it returned, moving nothing.
        assert await target.move_head("branched", "a1", expected_head="a2", move_id="regen-1") == 2
        assert (await target.read_view("branched")).head == "a2"

    # Importing the file again changes nothing.
    status, out, _ = await _import("dst://", data)
    assert status == 0
    assert out == (
        "imported 0, already present 7, failed 0 (of 7 conversations); tombstones added 0 (of 1)\n"
    )

    # verify proves each path of the imported store untampered, and the chain digests
    # (compared above) are the source's.
    out_v, err_v = io.StringIO(), io.StringIO()
    assert await verify_store("dst://", [], stdout=out_v, stderr=err_v) == 0, err_v.getvalue()
    assert out_v.getvalue() == "verified 6 batches in 4 conversations: all sound\n"

    # verify --against: the two stores hold the same conversations.
    out_c, err_c = io.StringIO(), io.StringIO()
    assert await compare_stores("dst://", "src://", [], stdout=out_c, stderr=err_c) == 0, (
        err_c.getvalue()
    )
    assert (out_c.getvalue(), err_c.getvalue()) == (
        "compared 4 conversations with src://: all equal\n",
        "",
    )

    # Export of the imported store is the source's export (stored times to the
    # microsecond, expiry to the millisecond; byte for byte into SQLite).
    status, again_data, _ = await _export("dst://")
    assert status == 0

    def parts(line: bytes) -> Any:
        record = ConversationRecord.from_json(line)
        meta = record.meta
        return (
            record.conversation_id,
            _shape(record.tree),
            (meta.owner, meta.moves, meta.retained, meta.expires_at is None),
        )

    def times(line: bytes) -> tuple[float | None, ...]:
        return ConversationRecord.from_json(line).tree.created

    again_lines = again_data.splitlines()[1:]
    assert again_lines[: len(closed_lines) + 2] == [secret_line, tombstone_line, *closed_lines]
    again_lines = again_lines[len(closed_lines) + 2 :]
    assert [parts(x) for x in again_lines] == [parts(x) for x in lines]
    for got_line, want_line in zip(again_lines, lines, strict=True):
        assert times(got_line) == pytest.approx(times(want_line), abs=1e-6, rel=0)
    if backend.kind == "sqlite":
        assert again_data == data

    # erase_owner on the imported store finds what it finds on the source: open,
    # cleared, expired and due conversations alike.
    async with await backend.open() as target:
        erased_ids = [r.conversation_id for r in await target.erase_owned("bob")]
    assert erased_ids == ["due", "kept", "lapsed"]


@over_backends()
async def test_import_refuses_a_conflicting_store_and_goes_on(
    backend: Backend, cli_opens: None, source_path: pathlib.Path
) -> None:
    async with await SQLiteStore.open(source_path) as source:
        await _seed(source, _dt.datetime.now(_dt.UTC) + _DAY)
    _, data, _ = await _export("src://")
    async with await backend.open() as target:
        await target.append(_batch("branched", "a1", "other words"), owner="alice")
        await target.append(_batch("rewound", "a1", "start"), owner="carol")
        await target.clear("kept")
        await target.erase("forever")
        status, out, err = await _import("dst://", data)
        assert status == 1
        assert err.splitlines() == [
            "scope: error: export.jsonl:3: conversation 'branched' conflicts with this store "
            "(batch 'a1' has other messages here); nothing more imported for it",
            "scope: error: export.jsonl:4: conversation 'forever' is erased in this store; "
            "nothing imported",
            "scope: error: export.jsonl:5: conversation 'kept' is cleared in this store; "
            "nothing imported",
            "scope: error: export.jsonl:6: conversation 'rewound' conflicts with this store "
            "(its owner here is 'carol', the export's 'alice'); nothing more imported for it",
        ]
        # The cleared 'gone' (line 2) is restored closed.
        assert out == "imported 1, already present 0, failed 4 (of 5 conversations)\n"
        assert (await target.read_meta("gone")).closure == "cleared"
        assert [str(b.id) for b in (await target.read_tree("branched")).batches] == ["a1"]
        assert (await target.read_view("rewound")).head == "a1"
        assert await target.read("forever") == []


async def test_export_names_a_conversation_closed_after_the_listing() -> None:
    """Nothing is skipped silently: a listed conversation that reads closed is an error
    line (the caller exits 1), the others are written."""
    inner = InMemoryStore()
    await inner.append(_batch("open", "a1", "hi"))
    await inner.append(_batch("gone", "a1", "bye"))

    class ListsTooMuch:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        async def conversations(self, **kwargs: Any) -> list[ConversationID]:
            listed = await inner.conversations(**kwargs)
            await inner.clear("gone")
            return listed

    sink = io.BytesIO()
    count, marks, failed = await export_store(ListsTooMuch(), sink, io.StringIO())
    assert (count, marks) == (1, 0)  # closed lines come first: 'gone' was open then
    assert failed == [
        "scope: error: conversation 'gone' not exported: it was closed (cleared, expired "
        "or erased) after it was listed\n"
    ]
    assert [
        ConversationRecord.from_json(x).conversation_id for x in sink.getvalue().splitlines()[1:]
    ] == ["open"]


async def test_export_names_a_conversation_whose_records_contradict_each_other() -> None:
    inner = InMemoryStore()
    await inner.append(_batch("open", "a1", "hi"))
    await inner.append(_batch("other", "a1", "hi"))

    class GhostMove:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        async def read_meta(self, conversation_id: str) -> ConversationMeta:
            if conversation_id == "open":
                return ConversationMeta(moves=[("m1", "ghost")])
            return await inner.read_meta(conversation_id)

    sink = io.BytesIO()
    count, marks, failed = await export_store(GhostMove(), sink, io.StringIO())
    assert (count, marks) == (1, 0)
    assert failed == [
        "scope: error: conversation 'open' not exported: move 'm1' names no batch of this "
        "conversation\n"
    ]


# -- a SIGKILL during the import ---------------------------------------------------------

_KILLER = """
import os, signal, sys
from scope.historystores.sqlite import SQLiteStore
from scope.cli import main
calls = 0
append = SQLiteStore.append
async def dying_append(self, batch, **kwargs):
    global calls
    calls += 1
    if calls == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return await append(self, batch, **kwargs)
SQLiteStore.append = dying_append
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("dies_at", [2, 3])
async def test_sigkill_during_import_then_a_rerun_finishes_the_job(
    tmp_path: pathlib.Path, dies_at: int
) -> None:
    source_path = tmp_path / "source.db"
    async with await SQLiteStore.open(source_path) as source:
        await _seed(source, _dt.datetime.now(_dt.UTC) + _DAY)
        erased = await source.erase("erased")  # the file holds the secret and a tombstone
    exported = tmp_path / "export.jsonl"
    status, data, _ = await _export(sqlite_url(source_path))
    assert status == 0
    exported.write_bytes(data)
    target_url = sqlite_url(tmp_path / "target.db")
    args = ["history", "import", "--store", target_url, str(exported)]
    killed = await anyio.run_process(
        [sys.executable, "-c", _KILLER, str(dies_at), *args],
        cwd=tmp_path,
        env=subprocess_env(tmp_path),
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    async with await SQLiteStore.open(tmp_path / "target.db") as target:
        partial = [str(b.id) for b in (await target.read_tree("branched")).batches]
        assert partial == ["a1", "a2"][: dies_at - 1]  # cut short inside the first conversation
        assert await target.conversations() == ["branched"]
    rerun = await anyio.run_process(
        [sys.executable, "-m", "scope", *args],
        cwd=tmp_path,
        env=subprocess_env(tmp_path),
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.decode() == (
        "imported 4, already present 1, failed 0 (of 5 conversations); "  # 'gone', closed
        "tombstones added 0 (of 1)\n"  # the killed run restored them, and the secret
    )
    async with (
        await SQLiteStore.open(source_path) as source,
        await SQLiteStore.open(tmp_path / "target.db") as target,
    ):
        for cid in ("branched", "forever", "kept", "rewound"):
            want_tree, got_tree = await source.read_tree(cid), await target.read_tree(cid)
            assert _shape(got_tree) == _shape(want_tree)
            # The batch appended before the kill and those after it: the source's times.
            assert got_tree.created == want_tree.created, cid
            want, got = await source.read_meta(cid), await target.read_meta(cid)
            assert (got.owner, got.moves, got.retained) == (want.owner, want.moves, want.retained)
        assert await target.check_erased(erased) == []
        assert (await target.read_meta("gone")).closure == "cleared"


# -- bad lines: the whole file is refused before anything is imported -------------------

_GOOD = (
    b'{"batches":[{"created":1.5,"digest":"%s","id":"a1","messages":%s,"parent":""}],'
    b'"conversation_id":"c","expires_at":null,"head":"a1","moves":[],"owner":null,'
    b'"retained":false}'
)


def _good() -> bytes:
    batch = _batch("c", "a1", "hi")
    return _GOOD % (batch.digest.encode(), batch.encoded_messages)


def test_a_good_line_parses() -> None:
    ((number, record),) = parse_export([(2, _good())], "f", 3).records
    assert number == 2 and record.head_id() == "a1" and record.tree.created == (1.5,)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"{", "invalid JSON: "),
        (b"[]", "expected a JSON object"),
        (b'{"conversation_id":"c"}', "expected the keys batches, conversation_id, expires_at"),
        (_good().replace(b'"head":"a1"', b'"head":"zz"'), "head: 'zz' is no batch"),
        (_good().replace(b'"parent":""', b'"parent":"zz"'), "batches[0].parent: 'zz' is no"),
        (_good().replace(b'"created":1.5', b'"created":"x"'), "batches[0].created: expected a"),
        (_good().replace(b'"digest":"sha256:', b'"digest":"sha256:0'), "batches[0].digest: "),
        (_good().replace(b'"text":"hi"', b'"text":"HI"'), "is not the digest of its messages"),
        (_good().replace(b'"moves":[]', b'"moves":[["m1"]]'), "moves: expected an array of"),
        (_good().replace(b'"moves":[]', b'"moves":[["m1","zz"]]'), "move 'm1' names no batch"),
        (_good().replace(b'"owner":null', b'"owner":""'), "owner: owner must be 1 to 256"),
        (_good().replace(b'"retained":false', b'"retained":1'), "retained must be a bool"),
        (_good().replace(b'"conversation_id":"c"', b'"conversation_id":" c"'), "conversation_id:"),
        (_good().replace(b'"batches":[', b'"batches":[{"x":1},'), "batches[0]: expected the keys"),
    ],
)
def test_a_bad_line_refuses_the_whole_file(line: bytes, problem: str) -> None:
    with pytest.raises(CLIError) as info:
        parse_export([(2, _good().replace(b'"c"', b'"d"')), (3, line)], "f", 3)
    message = str(info.value)
    assert message.startswith("f:3: ") and problem in message, message
    assert message.endswith("; nothing was imported")


_SECRET = b'{"secret":"%s"}' % (b"ab" * 32)
_MARK = b'{"tombstone":"hmac-sha256:%s"}' % (b"0" * 64)
_CLOSED = b'{"closure":"cleared","conversation_id":"x","length":2,"owner":"alice"}'


def test_version_3_lines_parse_by_their_keys() -> None:
    contents = parse_export([(2, _SECRET), (3, _MARK), (4, _CLOSED), (5, _good())], "f", 3)
    assert contents.secret == b"\xab" * 32
    assert contents.tombstones == ("hmac-sha256:" + "0" * 64,)
    assert contents.closed == ((4, ClosedConversation("x", "cleared", "alice", 2)),)
    assert [number for number, _ in contents.records] == [5]


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ([_MARK], "f:2: a tombstone before the store secret"),
        ([_SECRET, _SECRET], "f:3: a second store secret"),
        ([b'{"secret":"abc"}'], "f:2: secret: expected 64 hex digits"),
        ([b'{"secret":"%s"}' % (b"ab" * 31)], "f:2: secret: expected 64 hex digits"),
        ([b'{"secret":7}'], "f:2: secret: expected a string"),
        ([_SECRET, b'{"tombstone":"hmac-sha256:00"}'], "f:3: tombstone must be 'hmac-sha256:"),
        ([_CLOSED.replace(b"cleared", b"erased")], "f:2: closure must be 'cleared' or 'expired'"),
        ([_CLOSED.replace(b'"length":2', b'"length":-1')], "f:2: length must be an integer"),
        ([_CLOSED.replace(b'"alice"', b'""')], "f:2: owner: owner must be 1 to 256"),
        ([_CLOSED.replace(b'"x"', b'" x"')], "f:2: conversation id"),
        ([_CLOSED, _CLOSED], "f:3: conversation 'x' already appears on line 2"),
        ([_CLOSED.replace(b'"x"', b'"c"'), _good()], "f:3: conversation 'c' already appears"),
    ],
)
def test_a_bad_version_3_line_refuses_the_whole_file(lines: list[bytes], problem: str) -> None:
    with pytest.raises(CLIError) as info:
        parse_export(enumerate(lines, 2), "f", 3)
    message = str(info.value)
    assert message.startswith(problem) and message.endswith("; nothing was imported"), message


@pytest.mark.parametrize("line", [_SECRET, _CLOSED])
def test_a_version_3_line_in_a_version_2_file_is_refused(line: bytes) -> None:
    with pytest.raises(CLIError, match=r"^f:2: a version 3 line in a version 2 file;"):
        parse_export([(2, line)], "f", 2)


async def test_a_version_2_file_still_imports(tmp_path: pathlib.Path) -> None:
    data = b'{"format":"scope-history-export","version":2}\n' + _good() + b"\n"
    status, out, err = await _import(sqlite_url(tmp_path / "t.db"), data)
    assert (status, err) == (0, "")
    assert out == "imported 1, already present 0, failed 0 (of 1 conversation)\n"
    async with await SQLiteStore.open(tmp_path / "t.db") as store:
        assert [str(b.id) for b in await store.read_batches("c")] == ["a1"]


@over_backends()
async def test_import_of_tombstones_refuses_a_store_with_another_secret(
    backend: Backend, cli_opens: None, source_path: pathlib.Path
) -> None:
    async with await SQLiteStore.open(source_path) as source:
        await source.append(_batch("kept", "a1", "hi"))
        await source.erase("erased")
    _, data, _ = await _export("src://")
    async with await backend.open() as target:
        await target.clear("mine")  # the store is in use: its secret is not the source's
        secret = await target.store_secret()
        with pytest.raises(CLIError) as info:
            await _import("dst://", data)
        message = str(info.value)
        assert message.startswith("cannot import the export's tombstones ("), message
        assert message.endswith(
            "): import a file holding erased conversations into an empty store; "
            "nothing was imported"
        )
        assert await target.store_secret() == secret
        assert await target.tombstones() == []
        assert await target.conversations() == []


def test_a_conversation_given_twice_and_an_unknown_version_are_refused(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CLIError, match=r"^f:3: conversation 'c' already appears on line 2;"):
        parse_export([(2, _good()), (3, _good())], "f", 3)
    path = tmp_path / "v4.jsonl"
    path.write_bytes(b'{"format":"scope-history-export","version":4}\n' + _good() + b"\n")
    target = tmp_path / "t.db"
    assert main(["history", "import", "--store", sqlite_url(target), str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("scope: error: not an export file this scope reads: its header is ")
    assert '"version":4' in err and "reads versions 2 and 3" in err


# -- verify --against: what two stores disagree on ---------------------------------------


async def _copied(store: Any) -> InMemoryStore:
    """A new in-memory store holding what ``store`` lists, restored as ``import`` does
    (stored times included)."""
    sink = io.BytesIO()
    await export_store(store, sink, io.StringIO())
    copy = InMemoryStore()
    contents = parse_export(enumerate(sink.getvalue().splitlines()[1:], 2), "f", 3)
    if contents.secret is not None:
        await copy.restore_erasures(contents.secret, contents.tombstones)
    for _, closed in contents.closed:
        await copy.restore_closed(closed)
    for _, record in contents.records:
        await restore_conversation(copy, record)
    return copy


async def test_differences_name_each_thing_two_stores_disagree_on() -> None:
    a = InMemoryStore()
    until = _dt.datetime.now(_dt.UTC) + _DAY
    await _seed(a, until)
    b = await _copied(a)

    async def read(store: InMemoryStore, cid: str) -> Any:
        return await store.read_tree(cid), await store.read_meta(cid)

    for cid in ("branched", "rewound", "kept", "forever"):
        assert differences(await read(a, cid), await read(b, cid)) == []
    await b.append(_batch("branched", "c2", "three"))  # a batch only there; the head moved
    await b.move_head("rewound", "a1", expected_head="", move_id="fwd-1")  # head and moves
    await b.retain("kept", until + _DAY)
    await b.append(_batch("new", "a1", "x"), owner="zed")
    assert differences(await read(a, "branched"), await read(b, "branched")) == [
        "batches only there: 'c2'",
        "head here 'a2', there 'c2'",
    ]
    assert differences(await read(a, "rewound"), await read(b, "rewound")) == [
        "head here '', there 'a1'",
        "other recorded moves",
    ]
    (line,) = differences(await read(a, "kept"), await read(b, "kept"))
    assert line.startswith("expires here at ") and ", there at " in line
    assert differences(await read(a, "new"), await read(b, "new")) == [
        "batches only there: 'a1'",
        "head here '', there 'a1'",
        "owner here None, there 'zed'",
    ]
    # The same batches stored at other times (a stored time the store has none for,
    # None, is no difference).
    tree, meta = await read(a, "forever")
    later = HistoryTree(
        tree.batches,
        tree.parents,
        [t + 1e-5 for t in tree.created if t is not None],
        tree.head,
    )
    assert differences((tree, meta), (later, meta)) == ["other stored times: 'a1'"]
    unknown = HistoryTree(tree.batches, tree.parents, [None], tree.head)
    assert differences((tree, meta), (unknown, meta)) == []
    close = HistoryTree(
        tree.batches,
        tree.parents,
        [t + 4e-7 for t in tree.created if t is not None],
        tree.head,
    )
    assert differences((tree, meta), (close, meta)) == []
    c = InMemoryStore()
    await c.append(_batch("branched", "a1", "other words"), owner="alice")
    await c.clear("kept")
    (tree, meta), (other, other_meta) = await read(a, "branched"), await read(c, "branched")
    assert differences((tree, meta), (other, other_meta))[0] == "batches only here: 'a2', 'b2'"
    assert differences(await read(a, "kept"), await read(c, "kept"))[0] == (
        "open here, cleared there"
    )
    await c.erase("kept")
    await c.retain("forever", _dt.datetime.now(_dt.UTC) - _DAY)
    assert differences(await read(a, "kept"), await read(c, "kept"))[0] == (
        "open here, erased there"
    )
    assert differences(await read(c, "forever"), await read(a, "forever"))[0] == (
        "expired here, open there"
    )


def test_verify_against_another_store_exits_1_naming_what_differs(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    until = _dt.datetime.now(_dt.UTC) + _DAY

    async def make() -> None:
        async with await SQLiteStore.open(tmp_path / "a.db") as a:
            await _seed(a, until)
        # b: a copy of a's file (the same stored times), then more.
        (tmp_path / "b.db").write_bytes((tmp_path / "a.db").read_bytes())
        async with await SQLiteStore.open(tmp_path / "b.db") as b:
            await b.append(_batch("more", "a1", "x"))
            await b.append(_batch("branched", "c2", "three"))

    anyio.run(make)
    a, b = sqlite_url(tmp_path / "a.db"), sqlite_url(tmp_path / "b.db")
    assert main(["history", "verify", "--store", a, "--against", a]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"compared 4 conversations with {a}: all equal"
    )
    assert main(["history", "verify", "--store", a, "--against", b]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "verified 6 batches in 4 conversations: all sound",
        f"compared 5 conversations with {b}: 2 differ",
    ]
    assert captured.err.splitlines() == [
        "scope: error: conversation 'branched': batches only there: 'c2'; head here 'a2', "
        "there 'c2'",
        "scope: error: conversation 'more': batches only there: 'a1'; head here '', there 'a1'",
    ]
    # Named conversations only.
    assert main(["history", "verify", "--store", a, "--against", b, "kept", "forever"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"compared 2 conversations with {b}: all equal"
    )


# -- the version 3 lines as a codec (hypothesis) ----------------------------------------

_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_LINE_KEYS = ["closure", "conversation_id", "length", "owner", "secret", "tombstone", "batches"]


@given(
    cid=st.text(min_size=1, max_size=40),
    closure=st.sampled_from(["cleared", "expired"]),
    owner=st.none() | st.text(min_size=1, max_size=30),
    length=st.integers(0, 2**53),
)
def test_a_closed_line_round_trips(cid: str, closure: str, owner: str | None, length: int) -> None:
    try:
        closed = ClosedConversation(cid, closure, owner, length)
    except (InvalidConversationIDError, InvalidViewError):
        reject()
    line = closed_line(closed)
    assert parse_export_line(line) == closed
    assert closed_line(parse_export_line(line)) == line  # type: ignore[arg-type]


@given(secret=st.binary(min_size=32, max_size=32), cid=st.text(min_size=1, max_size=20))
def test_secret_and_tombstone_lines_round_trip(secret: bytes, cid: str) -> None:
    assert parse_export_line(b'{"secret":"%s"}' % secret.hex().encode()) == secret
    mark = tombstone(secret, cid)
    assert parse_export_line(b'{"tombstone":"%s"}' % mark.encode()) == mark


@given(st.dictionaries(st.sampled_from(_LINE_KEYS), _JSON_VALUES, min_size=1, max_size=5))
def test_any_json_object_parses_or_is_an_invalid_batch_error(tree: dict[str, Any]) -> None:
    """A line is one of the four kinds or refused with ``InvalidBatchError`` (naming the
    place), never another exception."""
    try:
        item = parse_export_line(orjson.dumps(tree))
    except InvalidBatchError:
        return
    assert isinstance(item, ConversationRecord | ClosedConversation | str | bytes)
