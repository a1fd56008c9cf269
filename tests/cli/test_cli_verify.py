"""``scope history verify`` and the stores' ``scan_records``, on every backend: each
corruption the stores' own tests write (changed bytes, changed digest, non-canonical
bytes with a matching digest, an undecodable message) is found and named, a clean store
passes, paging streams every record once, and nothing is ever written (a SELECT-only
PostgreSQL role and a read-only Redis user run it; a SQLite file keeps its bytes).
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from scope.chat import assistant_message, user_message
from scope.cli import _stores
from scope.cli._verify import verify_store
from scope.errors import InvalidConversationIDError, StoreError
from scope.history import Batch, ConversationID
from scope.historystores import PersistentStore, StoredRecord
from tests.helpers import batch, subprocess_env
from tests.servers import Backend, fresh_backend, import_driver, over_backends

pytestmark = pytest.mark.anyio


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
async def backend(kind: str, tmp_path: pathlib.Path) -> AsyncIterator[Backend]:
    async with fresh_backend(kind, tmp_path) as backend:
        yield backend


@pytest.fixture
def cli_opens(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The command line's stores open on ``backend``'s place (its own table or key
    prefix) whatever the URL; ``create`` is passed through."""

    async def open_backend(url: str, *, create: bool = True) -> Any:
        # Redis has no schema to create: its open takes no ``create``.
        return await backend.open(**({} if backend.kind == "redis" else {"create": create}))

    monkeypatch.setattr(_stores, "open_cli_store", open_backend)
    yield


async def verify(*ids: str, page_size: int = 100) -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    status = await verify_store("test://", list(ids), stdout=out, stderr=err, page_size=page_size)
    return status, out.getvalue().splitlines(), err.getvalue().splitlines()


async def seed(backend: Backend, layout: dict[str, int]) -> None:
    """``layout``: conversation id -> how many batches (append ids a1, a2, ...)."""
    async with await backend.open() as store:
        for cid, count in layout.items():
            for index in range(1, count + 1):
                await store.append(batch(cid, f"a{index}"))


# -- what verify finds ------------------------------------------------------------------


@over_backends()
async def test_verify_finds_every_corruption_and_names_it(
    backend: Backend, cli_opens: None
) -> None:
    await seed(backend, {"bytes": 1, "canonical": 1, "clean": 2, "digest": 2, "undecodable": 1})
    good = batch("x", "a1").encoded_messages
    other = batch("x", "a1", "changed").encoded_messages
    # Changed bytes, the digest left alone.
    await backend.rewrite_record("bytes", "a1", data=other)
    # Changed digests (both batches of one conversation: one line names both).
    await backend.rewrite_record("digest", "a1", digest=sha(b"something else"))
    await backend.rewrite_record("digest", "a2", digest="md5:0000")
    # Valid JSON, not the canonical bytes, the digest recomputed to match.
    loose = json.dumps(json.loads(good), indent=1).encode()
    await backend.rewrite_record("canonical", "a1", data=loose, digest=sha(loose))
    # Canonical-looking JSON whose message does not decode, digest matching.
    bad = b'[{"parts":[{"kind":"text","text":""}],"role":"user"}]'
    await backend.rewrite_record("undecodable", "a1", data=bad, digest=sha(bad))

    status, out, err = await verify()

    assert status == 1
    assert out == ["verified 7 batches in 5 conversations: 5 bad batches in 4 conversations"]
    assert len(err) == 4, err
    lines = dict(zip(["bytes", "canonical", "digest", "undecodable"], sorted(err), strict=True))
    assert lines["bytes"] == (
        f"scope: error: conversation 'bytes': batch 'a1' (#1): its messages digest to "
        f"{sha(other)}, the record says {sha(good)}"
    )
    assert lines["canonical"] == (
        "scope: error: conversation 'canonical': batch 'a1' (#1): messages are not in the "
        "canonical encoding"
    )
    assert lines["digest"] == (
        f"scope: error: conversation 'digest': 2 bad batches: batch 'a1' (#1): its messages "
        f"digest to {sha(good)}, the record says {sha(b'something else')}; batch 'a2' (#2): "
        "invalid digest 'md5:0000'"
    )
    assert lines["undecodable"].startswith(
        "scope: error: conversation 'undecodable': batch 'a1' (#1): messages[0]: "
    )
    assert "text" in lines["undecodable"]
    assert not any("'clean'" in line for line in err)


@over_backends()
async def test_verify_passes_a_clean_store_and_pages_through_it(
    backend: Backend, cli_opens: None
) -> None:
    await seed(backend, {"a": 3, "b": 1, "c": 2})
    assert await verify(page_size=1) == (
        0,
        ["verified 6 batches in 3 conversations: all sound"],
        [],
    )
    assert await verify("c", "a", page_size=2) == (
        0,
        ["verified 5 batches in 2 conversations: all sound"],
        [],
    )


@over_backends()
async def test_verify_reports_a_named_conversation_it_does_not_hold(
    backend: Backend, cli_opens: None
) -> None:
    await seed(backend, {"a": 1})
    status, out, err = await verify("a", "nope")
    assert status == 1
    assert out == ["verified 1 batch in 1 conversation: all sound; 1 named conversation not found"]
    assert err == ["scope: error: conversation 'nope' has no stored batches"]
    # The command line passes ConversationIDs: printed as the plain quoted id too.
    assert await verify(ConversationID("a"), ConversationID("nope")) == (status, out, err)


# -- scan_records ---------------------------------------------------------------------


@over_backends()
async def test_scan_records_streams_every_record_once_in_order(backend: Backend) -> None:
    await seed(backend, {"b": 2, "a": 3, "c": 1})
    async with await backend.open() as store:
        assert isinstance(store, PersistentStore)
        for size in (1, 2, 100):
            records = [r async for r in store.scan_records(page_size=size)]
            assert [(r.conversation_id, r.position, r.append_id) for r in records] == [
                ("a", 0, "a1"),
                ("a", 1, "a2"),
                ("a", 2, "a3"),
                ("b", 0, "a1"),
                ("b", 1, "a2"),
                ("c", 0, "a1"),
            ]
            assert all(r.problem() is None and r.malformed == "" for r in records)
            first = records[0]
            assert bytes(first.data) == batch("a", "a1").encoded_messages
            assert first.digest == batch("a", "a1").digest
        named = [r async for r in store.scan_records(["c", "a", "zzz"], page_size=2)]
        assert [(r.conversation_id, r.append_id) for r in named] == [
            ("c", "a1"),
            ("a", "a1"),
            ("a", "a2"),
            ("a", "a3"),
        ]


@over_backends()
async def test_scan_records_checks_its_arguments_before_any_io(backend: Backend) -> None:
    async with await backend.open() as store:
        for bad in (0, -1, True, 1.5, "2"):
            with pytest.raises(ValueError, match=r"^page_size must be an integer >= 1, got "):
                store.scan_records(page_size=bad)
        with pytest.raises(InvalidConversationIDError):
            store.scan_records([" padded "])
        with pytest.raises(InvalidConversationIDError):
            store.scan_records(["ok", ""])


def test_stored_record_problems_and_labels() -> None:
    good = Batch("c", "a1", [user_message("hi"), assistant_message("hello")])
    data = good.encoded_messages

    def record(**changes: Any) -> StoredRecord:
        fields: dict[str, Any] = {
            "conversation_id": "c",
            "position": 2,
            "append_id": "a1",
            "digest": good.digest,
            "data": data,
        }
        fields.update(changes)
        return StoredRecord(**fields)

    assert record().problem() is None
    assert record(data=bytearray(data)).problem() is None
    assert record().label == "batch 'a1' (#3)"
    assert record(append_id=None).label == "batch #3"
    assert record(append_id=" a1").problem() is not None
    assert record(append_id=" a1").problem().startswith("invalid append id: ")  # type: ignore[union-attr]
    assert record(append_id=7).problem() == "append id is int, not text"
    assert (
        record(conversation_id="bad\nid")
        .problem()
        .startswith(  # type: ignore[union-attr]
            "invalid conversation id: "
        )
    )
    assert record(data="text").problem() == "messages are str, not bytes"
    assert record(digest=None).problem() == "invalid digest None"
    assert record(data=b"[]", digest=sha(b"[]")).problem() == (
        "messages are not a non-empty JSON array"
    )
    assert (
        record(data=b"[", digest=sha(b"["))
        .problem()
        .startswith(  # type: ignore[union-attr]
            "invalid JSON: "
        )
    )
    delta = (
        b'[{"parts":[{"kind":"tool_call_delta","tool_call_delta":{"id":"1","name":"f"}}],'
        b'"role":"assistant"}]'
    )
    assert record(data=delta, digest=sha(delta)).problem() == (
        "messages[0].parts[0]: a stored message must be complete (no tool_call_delta parts)"
    )
    assert record(malformed="record is not usable").problem() == "record is not usable"


@over_backends("redis")
async def test_scan_reports_a_malformed_redis_element(backend: Backend, cli_opens: None) -> None:
    await seed(backend, {"r": 2})
    client = import_driver("redis.asyncio").Redis.from_url(backend.url)
    try:
        await client.lset(f"{backend.prefix}:{{{b'r'.hex()}}}:batches", 0, b"no header")
    finally:
        await client.aclose()
    status, out, err = await verify()
    assert status == 1
    assert out == ["verified 2 batches in 1 conversation: 1 bad batch in 1 conversation"]
    assert err == [
        "scope: error: conversation 'r': batch #1: "
        r"record is not 'digest\nappend id\nmessages'"
    ]


async def plant_wrong_types(client: Any, prefix: str) -> None:
    """Conversation 'h''s batches key becomes a hash and 'w''s a string, as a writer
    other than scope could leave them (both stay listed)."""
    for cid, plant in (("h", lambda key: client.hset(key, "f", "v")), ("w", None)):
        key = f"{prefix}:{{{cid.encode().hex()}}}:batches"
        await client.delete(key)
        await (client.set(key, b"not a list") if plant is None else plant(key))


WRONG_TYPE_LINES = [
    "scope: error: conversation 'h': batch #1: its records cannot be read: key "
    "'{prefix}:{{68}}:batches' holds a hash, not a list (written outside scope)",
    "scope: error: conversation 'w': batch #1: its records cannot be read: key "
    "'{prefix}:{{77}}:batches' holds a string, not a list (written outside scope)",
]


@over_backends("redis")
async def test_verify_reports_a_redis_key_of_the_wrong_type_and_goes_on(
    backend: Backend, cli_opens: None
) -> None:
    await seed(backend, {"a": 1, "h": 2, "w": 1, "z": 2})
    await backend.rewrite_record("z", "a2", digest=sha(b"x"))
    client = import_driver("redis.asyncio").Redis.from_url(backend.url)
    try:
        await plant_wrong_types(client, backend.prefix)
    finally:
        await client.aclose()
    status, out, err = await verify(page_size=1)
    assert status == 1
    assert out == ["verified 5 batches in 4 conversations: 3 bad batches in 3 conversations"]
    assert err[:2] == [line.format(prefix=backend.prefix) for line in WRONG_TYPE_LINES]
    assert err[2].startswith("scope: error: conversation 'z': batch 'a2' (#2): ")
    assert len(err) == 3
    # The scan itself: one record saying so, then the next conversation.
    async with await backend.open() as store:
        records = [r async for r in store.scan_records()]
    assert [(r.conversation_id, r.position, r.append_id) for r in records] == [
        ("a", 0, "a1"),
        ("h", 0, None),
        ("w", 0, None),
        ("z", 0, "a1"),
        ("z", 1, "a2"),
    ]
    assert records[1].problem() == records[1].malformed
    assert "holds a hash, not a list" in records[1].malformed


async def plant_other_wrong_types(client: Any, prefix: str) -> None:
    """Conversation 'n''s nodes key becomes a string; 't''s tree key a list and its moves
    key a set: keys other than the batches, which every append (or the tree read) meets."""
    for cid, suffix, plant in (
        ("n", "nodes", lambda key: client.set(key, b"x")),
        ("t", "tree", lambda key: client.rpush(key, b"x")),
        ("t", "moves", lambda key: client.sadd(key, b"x")),
    ):
        key = f"{prefix}:{{{cid.encode().hex()}}}:{suffix}"
        await client.delete(key)
        await plant(key)


OTHER_WRONG_TYPE_LINES = [
    "scope: error: conversation 'n': batch #1: its keys cannot be used: key "
    "'{prefix}:{{6e}}:nodes' holds a string, not a hash (written outside scope)",
    "scope: error: conversation 't': batch #1: its keys cannot be used: key "
    "'{prefix}:{{74}}:tree' holds a list, not a hash; key '{prefix}:{{74}}:moves' holds a "
    "set, not a hash (written outside scope)",
]


@over_backends("redis")
async def test_verify_reports_every_redis_key_of_the_wrong_type_of_a_conversation(
    backend: Backend, cli_opens: None
) -> None:
    await seed(backend, {"a": 1, "n": 2, "t": 1})
    client = import_driver("redis.asyncio").Redis.from_url(backend.url)
    try:
        await plant_other_wrong_types(client, backend.prefix)
    finally:
        await client.aclose()
    status, out, err = await verify()
    assert status == 1
    assert out == ["verified 3 batches in 3 conversations: 2 bad batches in 2 conversations"]
    assert err == [line.format(prefix=backend.prefix) for line in OTHER_WRONG_TYPE_LINES]
    # Named, the same.
    assert await verify("n") == (
        1,
        ["verified 1 batch in 1 conversation: 1 bad batch in 1 conversation"],
        [OTHER_WRONG_TYPE_LINES[0].format(prefix=backend.prefix)],
    )
    assert await verify("a") == (0, ["verified 1 batch in 1 conversation: all sound"], [])


@over_backends("redis")
async def test_a_redis_wrongtype_answer_is_not_retried_on_a_fresh_connection(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scope.historystores.redis import RedisStore

    await seed(backend, {"n": 1})
    client = import_driver("redis.asyncio").Redis.from_url(backend.url)
    try:
        await plant_other_wrong_types(client, backend.prefix)
    finally:
        await client.aclose()
    reconnects: list[object] = []
    reconnect = RedisStore._reconnect

    async def counted(self: RedisStore) -> None:
        reconnects.append(self)
        await reconnect(self)

    monkeypatch.setattr(RedisStore, "_reconnect", counted)
    async with await backend.open() as store:
        with pytest.raises(StoreError, match="WRONGTYPE") as caught:
            await store.append(batch("n", "a2"))
    assert "retried on a fresh connection" not in str(caught.value)
    assert reconnects == []


@over_backends("redis")
async def test_verify_names_a_redis_listing_of_the_wrong_type(
    backend: Backend, cli_opens: None
) -> None:
    await seed(backend, {"a": 1})
    client = import_driver("redis.asyncio").Redis.from_url(backend.url)
    try:
        await client.delete(f"{backend.prefix}:conversations")
        await client.set(f"{backend.prefix}:conversations", b"x")
    finally:
        await client.aclose()
    listing = f"'{backend.prefix}:conversations'"
    with pytest.raises(StoreError, match=f"listing key {listing} holds a string, not a sorted set"):
        await verify()
    # Named conversations need no listing.
    assert await verify("a") == (0, ["verified 1 batch in 1 conversation: all sound"], [])


@pytest.mark.servers
async def test_verify_reports_a_wrong_type_on_redis_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis.asyncio.cluster import RedisCluster

    from scope.historystores.redis import RedisStore
    from tests.servers import drop_keys, redis_cluster_url_or_skip, unique_key_prefix

    import_driver("redis")
    url = redis_cluster_url_or_skip()
    prefix = unique_key_prefix()

    async def open_cluster(_: str, *, create: bool = True) -> Any:
        return await RedisStore.open(url, prefix=prefix, cluster=True, check_persistence=False)

    monkeypatch.setattr(_stores, "open_cli_store", open_cluster)
    client: Any = RedisCluster.from_url(url)
    await client.initialize()
    try:
        async with await open_cluster(url) as store:
            for cid in ("a", "h", "w", "z"):
                await store.append(batch(cid, "a1"))
        await plant_wrong_types(client, prefix)
        status, out, err = await verify()
        assert status == 1
        assert out == ["verified 4 batches in 4 conversations: 2 bad batches in 2 conversations"]
        assert err == [line.format(prefix=prefix) for line in WRONG_TYPE_LINES]
    finally:
        await client.aclose()
        await drop_keys(url, prefix, cluster=True)


# -- read-only --------------------------------------------------------------------------


def _sqlite_files(directory: pathlib.Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
        if path.name.startswith("h.db") and not path.name.endswith("-shm")
    }


@over_backends("sqlite")
async def test_verify_leaves_a_sqlite_file_unchanged(
    backend: Backend, cli_opens: None, tmp_path: pathlib.Path
) -> None:
    await seed(backend, {"a": 2, "b": 1})
    await backend.rewrite_record("b", "a1", digest=sha(b"x"))
    before = _sqlite_files(tmp_path)
    assert (await verify())[0] == 1
    assert _sqlite_files(tmp_path) == before


@over_backends("postgres")
async def test_verify_runs_as_a_select_only_postgres_role(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scope.historystores.postgres import PostgresStore

    await seed(backend, {"a": 2, "b": 1})
    await backend.rewrite_record("b", "a1", digest=sha(b"x"))
    asyncpg = import_driver("asyncpg")
    admin = await asyncpg.connect(backend.url)
    role = f"scope_reader_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        tables = ", ".join(
            f'"{backend.prefix}_{t}"'
            for t in ("conversations", "batches", "schema", "secret", "tombstones", "moves")
        )
        await admin.execute(f'GRANT SELECT ON {tables} TO "{role}"')
        reader_dsn = backend.url.replace("://scope@", f"://{role}@", 1)
        assert reader_dsn != backend.url

        async def open_as_reader(url: str, *, create: bool = True) -> Any:
            return await PostgresStore.open(reader_dsn, table_prefix=backend.prefix, create=create)

        monkeypatch.setattr(_stores, "open_cli_store", open_as_reader)
        status, out, err = await verify()
        assert status == 1
        assert out == ["verified 3 batches in 2 conversations: 1 bad batch in 1 conversation"]
        assert len(err) == 1 and err[0].startswith("scope: error: conversation 'b': batch 'a1'")
        # The role really cannot write: verify succeeded without that right.
        async with await PostgresStore.open(
            reader_dsn, table_prefix=backend.prefix, create=False
        ) as store:
            with pytest.raises(StoreError, match="permission denied"):
                await store.append(batch("c", "a1"))
    finally:
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


@over_backends("redis")
async def test_verify_runs_as_a_read_only_redis_user(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scope.historystores.redis import RedisStore

    await seed(backend, {"a": 2, "b": 1})
    await backend.rewrite_record("b", "a1", digest=sha(b"x"))
    client = import_driver("redis.asyncio").Redis.from_url(backend.url)
    user = f"scope-reader-{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    await client.execute_command(
        "ACL",
        "SETUSER",
        user,
        "on",
        f">{password}",
        f"~{backend.prefix}:*",
        "+@read",
        "+@connection",
        "-@write",
    )
    try:
        url = backend.url.replace("redis://", f"redis://{user}:{password}@", 1)

        async def open_as_reader(_: str, *, create: bool = True) -> Any:
            return await RedisStore.open(url, prefix=backend.prefix, check_persistence=False)

        monkeypatch.setattr(_stores, "open_cli_store", open_as_reader)
        status, out, err = await verify()
        assert status == 1
        assert out == ["verified 3 batches in 2 conversations: 1 bad batch in 1 conversation"]
        assert len(err) == 1 and err[0].startswith("scope: error: conversation 'b': batch 'a1'")
        async with await RedisStore.open(
            url, prefix=backend.prefix, check_persistence=False
        ) as store:
            with pytest.raises(StoreError, match="no permissions"):
                await store.append(batch("c", "a1"))
    finally:
        await client.execute_command("ACL", "DELUSER", user)
        await client.aclose()


# -- the command line -------------------------------------------------------------------


def scope(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "scope", *args],
        input=b"",
        capture_output=True,
        cwd=tmp_path,
        env=subprocess_env(tmp_path),
        timeout=60,
        check=False,
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_history_verify_command(tmp_path: pathlib.Path) -> None:
    from scope.historystores.sqlite import SQLiteStore

    async with await SQLiteStore.open(tmp_path / "h.db") as store:
        await store.append(batch("fine", "a1"))
        await store.append(batch("broken", "a1"))
    url = "sqlite:///h.db"
    clean = scope(tmp_path, "history", "verify", "--store", url, "fine")
    assert (clean.returncode, clean.stdout, clean.stderr) == (
        0,
        b"verified 1 batch in 1 conversation: all sound\n",
        b"",
    )
    import sqlite3

    with sqlite3.connect(tmp_path / "h.db") as conn:
        conn.execute(
            "UPDATE scope_history_batches SET messages = X'00' WHERE conversation_id = 'broken'"
        )
    bad = scope(tmp_path, "history", "verify", "--store", url)
    assert bad.returncode == 1
    assert bad.stdout == b"verified 2 batches in 2 conversations: 1 bad batch in 1 conversation\n"
    [line] = bad.stderr.decode().splitlines()
    assert line.startswith("scope: error: conversation 'broken': batch 'a1' (#1): its messages ")
    missing = scope(tmp_path, "history", "verify", "--store", "sqlite:///missing.db")
    assert missing.returncode == 1 and b"no SQLite store at" in missing.stderr
    assert not (tmp_path / "missing.db").exists()
    usage = scope(tmp_path, "history", "verify", "--store", url, " padded")
    assert usage.returncode == 2 and usage.stderr.startswith(b"scope: error: argument")
