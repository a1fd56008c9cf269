"""``StoreConformance``: the pytest suite every history store must pass.

A backend's test module subclasses it and provides an async ``store`` fixture that yields
a fresh, empty store (a ``Store`` and ``Lister``):

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

A store that also implements the optional ``scope.history.BatchReader`` protocol
(``read_batches``) or ``scope.history.ViewReader`` (``read_view``) is checked against it
too, and so is ``scope.history.TurnLeaser`` (``acquire_turn``/``release_turn``: mutual
exclusion under many tasks and across two handles, expiry, holder tokens, renewal,
release only by the holder; the expiry checks sleep ``lease_ttl`` seconds, 0.25 by
default), and so is ``scope.history.FoldedTurnLeaser`` (``acquire_turn_view``: the lease
and the view in one step, nothing read under another holder's lease;
``append_release_turn``: the append's rules, the release only by the holder and only
when the append returns; turns handed over between tasks and handles never read a stale
history); for any other store those tests skip and say why. The ``expected_length`` fence of
DESIGN §6b is part of ``append`` and checked for every store.

Each rule of the store contract is its own test, named after the rule, so a failure says
which rule a backend breaks. The suite needs pytest and anyio; it imports nothing from a
project's ``tests/``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import anyio
import anyio.lowlevel
import anyio.pytest_plugin
import pytest

from scope.chat import (
    Message,
    Role,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.codec import encode_messages, from_json, to_json
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    InvalidConversationIDError,
)
from scope.history._batch import Batch, Receipt
from scope.history._ids import AppendID, ConversationID
from scope.history._protocols import (
    BatchReader,
    Clearer,
    FoldedTurnLeaser,
    Lister,
    Reader,
    TurnLeaser,
    ViewReader,
    Writer,
)
from scope.history._view import HistoryView
from scope.jsonvalue import RawJSON
from scope.media import Media

__all__ = ["HOSTILE_IDS", "StoreConformance", "rich_messages"]


@runtime_checkable
class _ListingStore(Reader, Writer, Clearer, Lister, Protocol):
    """What the suite exercises: a Store that is also a Lister."""


#: Ids that break naive key building, quoting, LIKE/glob patterns and prefix scans. Each is
#: a valid ``ConversationID`` and ``AppendID``; a store must keep them apart and intact.
HOSTILE_IDS: tuple[str, ...] = (
    "plain",
    'say "hi"',
    "it's",
    "100%",
    "100_",
    "a;DROP TABLE messages;--",
    "{braces}",
    "}{",
    "*",
    "a*",
    "?",
    "[ab]",
    "a:b",
    "a:",
    "scope:history:x",
    "back\\slash",
    "$1",
    "a b",
    "nbsp\u00a0inside",
    "日本語の会話",
    "emoji 🙂🚀",
    "é" * 256,  # 512 UTF-8 bytes: the longest valid id
    "x" * 512,
)


def rich_messages() -> list[Message]:
    """Messages using every stored part kind, media source, signatures, metadata and
    RawJSON number spellings that a decoder could lose (``2.50``, ``1e0``, ``-0``)."""
    spelled = RawJSON.parse('{"b": 2.50, "a": [1e0, 1.0, -0, 10]}')
    return [
        system_message("Be brief."),
        Message(
            Role.USER,
            (
                text_part("Look at these.", metadata={"price": RawJSON.parse("2.50")}),
                media_part(Media.from_bytes("image/png", bytes(range(256)) * 4)),
                media_part(Media.from_uri("image/jpeg", "https://example.com/cat.jpg")),
                media_part(Media.from_reference("application/pdf", "file-123")),
            ),
            metadata={"spelled": spelled, "plain": "ünïcode"},
        ),
        assistant_message(
            reasoning_part("Let me think.", signature=b"\x00\xffsig\n"),
            reasoning_part(signature=b"opaque-only"),
            # Arguments are the model's exact text: spacing and spelling must survive.
            tool_call_part("call_1", "lookup", '{"q": "cats",  "n": 1.50}'),
            tool_call_part("call_2", "broken", '{"unterminated": '),
        ),
        tool_message(
            ToolResult(
                "call_1",
                "lookup",
                ToolOutput(
                    (
                        text_part("found"),
                        media_part(Media.from_bytes("text/plain; charset=utf-8", b"\x00\x01")),
                    ),
                    details=RawJSON.parse('{"z": 1E+2, "price": 2.50}'),
                ),
            ),
            ToolResult("call_2", "broken", ToolOutput.of_text("bad arguments"), is_error=True),
        ),
        Message(
            Role.ASSISTANT,
            (text_part("Two cats."),),
            metadata={"n": RawJSON.parse("0.10"), "deep": {"list": [1, "two", None, True]}},
        ),
    ]


def _turn(tag: str, size: int = 2) -> list[Message]:
    """A user message followed by ``size - 1`` assistant messages, all tagged."""
    return [user_message(f"{tag}/0")] + [assistant_message(f"{tag}/{i}") for i in range(1, size)]


def _texts(messages: Sequence[Message]) -> list[str]:
    return [m.text for m in messages]


def _flatten(batches: Sequence[Batch]) -> list[Message]:
    return [m for batch in batches for m in batch.messages]


#: Invalid conversation ids (and their test ids): each must be rejected before any I/O.
_BAD_IDS: tuple[Any, ...] = (
    "",
    " padded",
    "padded ",
    "ctl\x00",
    "nl\nid",
    "\ud800",
    "x" * 513,
    "é" * 257,
    42,
    None,
)
_BAD_ID_NAMES: tuple[str, ...] = (
    "empty",
    "leading-space",
    "trailing-space",
    "nul",
    "newline",
    "lone-surrogate",
    "513-bytes",
    "514-utf8-bytes",
    "int",
    "none",
)


def _fixture_parts(definition: Any) -> tuple[Callable[..., Any], Any] | None:
    """The function and the ``pytest.fixture`` settings behind a fixture definition."""
    get_wrapped = getattr(definition, "_get_wrapped_function", None)  # pytest >= 8.4
    if get_wrapped is not None:
        return get_wrapped(), definition._fixture_function_marker
    marker = getattr(definition, "_pytestfixturefunction", None)  # pytest < 8.4
    wrapped = getattr(definition, "__pytest_wrapped__", None)
    if marker is None or wrapped is None:
        return None
    return wrapped.obj, marker


def _with_backend(func: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
    """Give ``wrapper`` the signature of ``func`` plus ``anyio_backend``, so pytest passes
    it ``func``'s fixtures and the backend."""
    signature = inspect.signature(func)
    parameters = list(signature.parameters.values())
    if "anyio_backend" not in signature.parameters:
        parameters.append(inspect.Parameter("anyio_backend", inspect.Parameter.KEYWORD_ONLY))
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=inspect.Signature.empty
    )
    del wrapper.__wrapped__  # type: ignore[attr-defined]  # pytest reads the signature above


def _runner(anyio_backend: object) -> contextlib.AbstractContextManager[Any]:
    """anyio's test runner for ``anyio_backend``: the one already running, if any."""
    backend, options = anyio.pytest_plugin.extract_backend_and_options(anyio_backend)
    return anyio.pytest_plugin.get_runner(backend, options)


def _test_on_anyio_runner(test: Callable[..., Any]) -> Callable[..., None]:
    """An async test method as a sync one that runs it on anyio's test runner (the one
    its ``store`` fixture runs on). pytest-asyncio, which in auto mode claims every async
    test and runs it on its own asyncio loop, leaves a sync test alone."""

    @functools.wraps(test)
    def run(self: Any, **kwargs: Any) -> None:
        arguments = {name: kwargs[name] for name in names}
        with _runner(kwargs["anyio_backend"]) as runner:
            runner.run_test(functools.partial(test, self), arguments)

    names = list(inspect.signature(test).parameters)[1:]  # after self
    _with_backend(test, run)
    return run


def _on_anyio_runner(definition: Any) -> Any:
    """An async fixture method as a sync fixture that runs it on anyio's test runner.

    That is what anyio's pytest plugin does for an async fixture, done before any plugin
    sees it: pytest-asyncio (in auto mode it claims every async fixture and runs it on
    its own asyncio loop) leaves a sync fixture alone, and the fixture then shares the
    runner, so the loop, of the test under every ``anyio_backend``.
    """
    parts = _fixture_parts(definition)
    if parts is None:
        return definition
    func, marker = parts
    is_generator = inspect.isasyncgenfunction(func)
    if not (is_generator or inspect.iscoroutinefunction(func)):
        return definition
    names = list(inspect.signature(func).parameters)[1:]  # after self

    # Not func's __dict__: a @pytest_asyncio.fixture mark on it would hand this sync
    # fixture back to pytest-asyncio.
    @functools.wraps(func, updated=())
    def fixture(self: Any, **kwargs: Any) -> Iterator[Any]:
        arguments = {name: kwargs[name] for name in names}
        bound = functools.partial(func, self)
        with _runner(kwargs["anyio_backend"]) as runner:
            if is_generator:
                yield from runner.run_asyncgen_fixture(bound, arguments)
            else:
                yield runner.run_fixture(bound, arguments)

    _with_backend(func, fixture)
    return pytest.fixture(
        fixture,
        scope=marker.scope,
        params=marker.params,
        autouse=marker.autouse,
        ids=marker.ids,
        name=marker.name,
    )


def _optional(store: Any, protocol: type, method: str, checks: str) -> Any:
    """``store`` when it implements the optional ``protocol``; otherwise skip the
    calling test, saying which ``checks`` do not apply."""
    if not isinstance(store, protocol):
        pytest.skip(
            f"{type(store).__name__} is not a scope.history.{protocol.__name__} (it has no "
            f"{method}): the optional {checks} checks do not apply"
        )
    return store


class StoreConformance:
    """The store contract of ``scope.history`` as pytest tests. Subclass it (see the
    module docstring); never instantiate it directly."""

    pytestmark: ClassVar[Any] = pytest.mark.anyio

    #: How many tasks append distinct batches at once, and how many retry one batch.
    concurrent_appends: ClassVar[int] = 40
    concurrent_retries: ClassVar[int] = 25
    #: How many cancellation points the cancellation test tries.
    cancellation_rounds: ClassVar[int] = 12
    #: How many tasks race fenced appends at one ``expected_length`` (at least 20).
    concurrent_fenced_appends: ClassVar[int] = 24
    #: How many tasks race for one turn lease, and the short lease the expiry checks use
    #: (seconds; raise it for a store whose lease steps take longer).
    concurrent_leases: ClassVar[int] = 20
    lease_ttl: ClassVar[float] = 0.25

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "store" in cls.__dict__:
            cls.store = _on_anyio_runner(cls.__dict__["store"])  # type: ignore[method-assign]

    # -- hooks ------------------------------------------------------------------------

    @pytest.fixture
    async def store(self) -> AsyncIterator[Any]:
        """Override: yield a fresh, empty store."""
        raise NotImplementedError(
            f"{type(self).__name__} must define an async `store` fixture yielding a fresh, "
            "empty store"
        )
        yield  # pragma: no cover

    async def reopen(self, store: Any) -> Any:
        """Override: return a new handle on the same data as ``store``."""
        pytest.skip(
            f"{type(self).__name__} defines no reopen(store): durability checks need a second "
            "handle on the same data"
        )

    @contextlib.asynccontextmanager
    async def _reopened(self, store: Any) -> AsyncIterator[Any]:
        handle = await self.reopen(store)
        try:
            yield handle
        finally:
            aclose = getattr(handle, "aclose", None)
            if aclose is not None and handle is not store:
                await aclose()

    # -- shape ------------------------------------------------------------------------

    async def test_store_implements_the_protocols(self, store: Any) -> None:
        assert isinstance(store, _ListingStore)

    # -- empty and unknown ------------------------------------------------------------

    async def test_read_of_unknown_conversation_is_empty(self, store: Any) -> None:
        assert await store.read("never-written") == []

    async def test_conversations_of_empty_store_is_empty(self, store: Any) -> None:
        assert await store.conversations() == []

    async def test_read_returns_a_new_list_each_time(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        first = await store.read("c")
        assert type(first) is list
        first.clear()
        second = await store.read("c")
        assert _texts(second) == ["t/0", "t/1"]
        assert second is not await store.read("c")

    async def test_str_and_conversation_id_are_the_same_conversation(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        assert await store.read(ConversationID("c")) == await store.read("c")
        await store.clear(ConversationID("c"))
        assert await store.read("c") == []

    # -- exact round trip -------------------------------------------------------------

    async def test_round_trip_is_exact_for_every_part_kind(self, store: Any) -> None:
        messages = rich_messages()
        batch = Batch("rich", "a1", messages)
        await store.append(batch)
        stored = await store.read("rich")
        assert stored == messages
        # Byte-exact: the stored messages digest to the batch's digest.
        assert encode_messages(stored) == batch.encoded_messages
        assert Batch("rich", "a1", stored).digest == batch.digest

    async def test_round_trip_keeps_media_bytes_and_signatures(self, store: Any) -> None:
        data = bytes(range(256)) * 64
        messages = [
            user_message(media_part(Media.from_bytes("application/octet-stream", data))),
            assistant_message(reasoning_part("r", signature=bytes(range(255, -1, -1)))),
        ]
        await store.append(Batch("bytes", "a1", messages))
        stored = await store.read("bytes")
        media = stored[0].parts[0].media
        assert media is not None and media.source.data == data
        assert stored[1].parts[0].signature == bytes(range(255, -1, -1))

    async def test_round_trip_keeps_number_spellings(self, store: Any) -> None:
        spellings = ["2.50", "1e0", "1E+2", "1.0", "-0", "0.10", "10"]
        messages = [
            user_message(
                text_part(
                    "n", metadata={f"k{i}": RawJSON.parse(s) for i, s in enumerate(spellings)}
                )
            ),
            assistant_message(tool_call_part("c1", "t")),
            tool_message(
                ToolResult("c1", "t", ToolOutput.of_json(RawJSON.parse('{"v":[2.50,1e0,-0]}')))
            ),
        ]
        await store.append(Batch("numbers", "a1", messages))
        stored = await store.read("numbers")
        assert stored == messages
        assert stored[0].parts[0].metadata["k0"].bytes == b"2.50"
        assert [stored[0].parts[0].metadata[f"k{i}"].bytes.decode() for i in range(7)] == (
            spellings
        )
        output = stored[2].parts[0].tool_result
        assert output is not None and output.output.details is not None
        assert output.output.details.bytes == b'{"v":[2.50,1e0,-0]}'

    async def test_round_trip_of_a_one_mebibyte_message(self, store: Any) -> None:
        chunk = "héllo wörld 🙂 ɐ "
        text = (chunk * ((1 << 20) // len(chunk.encode()) + 1))[: 1 << 20]
        assert len(text.encode()) >= 1 << 20
        batch = Batch("big", "a1", [user_message(text), assistant_message("ok")])
        await store.append(batch)
        stored = await store.read("big")
        assert stored[0].text == text
        assert encode_messages(stored) == batch.encoded_messages

    async def test_unicode_ids_round_trip(self, store: Any) -> None:
        ids = ["日本語", "emoji 🙂", "ñandú", "Ελληνικά", "עברית", "a\u00a0b"]
        for cid in ids:
            await store.append(Batch(cid, f"append {cid}", _turn(cid)))
        for cid in ids:
            assert _texts(await store.read(cid)) == [f"{cid}/0", f"{cid}/1"]
        assert await store.conversations() == sorted(ids)

    async def test_conversations_pages_with_after_and_limit(self, store: Any) -> None:
        ids = sorted([*HOSTILE_IDS, "日本語", "ñandú", "z"])
        for cid in ids:
            await store.append(Batch(cid, "a1", _turn(cid)))
        await store.clear("z")
        ids.remove("z")
        # Pages of 3 (after = the last id of the previous page) list each id once.
        paged: list[ConversationID] = []
        after: str | None = None
        for _ in range(len(ids) + 1):  # bounded: a store that repeats ids fails, not hangs
            page = await store.conversations(after=after, limit=3)
            if not page:
                break
            assert len(page) <= 3
            paged += page
            after = page[-1]
        assert paged == ids
        assert await store.conversations(limit=2) == ids[:2]
        assert await store.conversations(after=ids[1]) == ids[2:]
        # ``after`` need not be listed: ids after it in code point order.
        assert await store.conversations(after="a0", limit=1) == [c for c in ids if c > "a0"][:1]
        assert await store.conversations(after=ids[-1]) == []

    async def test_conversations_refuses_bad_page_arguments(self, store: Any) -> None:
        for limit in (0, -1, True, 1.5, "2"):
            with pytest.raises(ValueError, match="limit must be an integer >= 1"):
                await store.conversations(limit=limit)
        with pytest.raises(InvalidConversationIDError):
            await store.conversations(after=" padded ")

    async def test_hostile_ids_round_trip_and_stay_apart(self, store: Any) -> None:
        for cid in HOSTILE_IDS:
            receipt = await store.append(Batch(cid, cid, _turn(cid)))
            assert receipt == Receipt(cid, cid, receipt.digest)
        for cid in HOSTILE_IDS:
            assert _texts(await store.read(cid)) == [f"{cid}/0", f"{cid}/1"]
            # The same hostile append id is remembered, exactly, per conversation.
            assert (await store.append(Batch(cid, cid, _turn(cid)))).id == cid
            with pytest.raises(AppendConflictError):
                await store.append(Batch(cid, cid, _turn(cid + "!")))
        listed = await store.conversations()
        assert listed == sorted(HOSTILE_IDS)
        assert all(type(c) is ConversationID for c in listed)
        # Clearing pattern-like ids touches nothing else.
        for cid in ("*", "a*", "?", "[ab]", "100%", "100_", "a:"):
            await store.clear(cid)
        remaining = sorted(set(HOSTILE_IDS) - {"*", "a*", "?", "[ab]", "100%", "100_", "a:"})
        assert await store.conversations() == remaining
        for cid in remaining:
            assert _texts(await store.read(cid)) == [f"{cid}/0", f"{cid}/1"]

    # -- receipts and retries ---------------------------------------------------------

    async def test_append_returns_a_receipt_for_the_batch(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        receipt = await store.append(batch)
        assert isinstance(receipt, Receipt)
        receipt.validate_for(batch)
        assert receipt == batch.receipt()

    async def test_retry_of_accepted_batch_returns_equal_receipt_and_appends_nothing(
        self, store: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"))
        first = await store.append(batch)
        for _ in range(3):
            assert await store.append(batch) == first
        assert _texts(await store.read("c")) == ["t/0", "t/1"]

    async def test_retry_of_batch_rebuilt_from_same_messages_appends_nothing(
        self, store: Any
    ) -> None:
        messages = rich_messages()
        batch = Batch("c", "a1", messages)
        first = await store.append(batch)
        decoded = Batch.from_json(batch.to_json())
        rebuilt = Batch("c", "a1", [from_json(to_json(m), Message) for m in messages])
        assert await store.append(decoded) == first
        assert await store.append(rebuilt) == first
        # Even a batch rebuilt from what the store returned is the same batch.
        assert await store.append(Batch("c", "a1", await store.read("c"))) == first
        assert await store.read("c") == messages

    async def test_retry_after_later_appends_still_appends_nothing(self, store: Any) -> None:
        first = Batch("c", "a1", _turn("one"))
        await store.append(first)
        await store.append(Batch("c", "a2", _turn("two")))
        assert await store.append(first) == first.receipt()
        assert _texts(await store.read("c")) == ["one/0", "one/1", "two/0", "two/1"]

    async def test_same_id_other_digest_conflicts_and_appends_nothing(self, store: Any) -> None:
        accepted = Batch("c", "a1", _turn("t"))
        await store.append(accepted)
        for other in (
            Batch("c", "a1", _turn("other")),
            Batch("c", "a1", _turn("t", 3)),
            Batch("c", "a1", _turn("t")[:1]),
        ):
            with pytest.raises(AppendConflictError):
                await store.append(other)
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        # The accepted batch is still recognised after the conflicts.
        assert await store.append(accepted) == accepted.receipt()
        assert _texts(await store.read("c")) == ["t/0", "t/1"]

    async def test_conflict_detection_is_exact_about_number_spelling(self, store: Any) -> None:
        def batch(spelling: str) -> Batch:
            meta = {"x": RawJSON.parse(spelling)}
            return Batch("c", "a1", [user_message(text_part("n", metadata=meta))])

        await store.append(batch("2.5"))
        with pytest.raises(AppendConflictError):
            await store.append(batch("2.50"))
        assert len(await store.read("c")) == 1

    async def test_append_ids_are_scoped_per_conversation(self, store: Any) -> None:
        one = Batch("one", "shared", _turn("one"))
        two = Batch("two", "shared", _turn("two"))
        assert await store.append(one) == one.receipt()
        assert await store.append(two) == two.receipt()
        assert _texts(await store.read("one")) == ["one/0", "one/1"]
        assert _texts(await store.read("two")) == ["two/0", "two/1"]
        # Same id and messages in a third conversation: a new batch there, not a retry.
        three = Batch("three", "shared", _turn("one"))
        assert await store.append(three) == three.receipt()
        assert _texts(await store.read("three")) == ["one/0", "one/1"]

    # -- order ------------------------------------------------------------------------

    async def test_batches_read_back_in_append_order_and_contiguous(self, store: Any) -> None:
        expected: list[str] = []
        for i in range(10):
            messages = _turn(f"b{i}", 1 + i % 4)
            await store.append(Batch("c", f"a{i}", messages))
            expected += _texts(messages)
            assert _texts(await store.read("c")) == expected

    async def test_messages_of_a_batch_keep_their_order(self, store: Any) -> None:
        messages = [user_message(f"m{i}") for i in range(50)]
        await store.append(Batch("c", "a1", messages))
        assert await store.read("c") == messages

    async def test_conversations_do_not_mix(self, store: Any) -> None:
        for i in range(6):
            await store.append(Batch(f"c{i % 2}", f"a{i}", _turn(f"{i}")))
        assert _texts(await store.read("c0")) == ["0/0", "0/1", "2/0", "2/1", "4/0", "4/1"]
        assert _texts(await store.read("c1")) == ["1/0", "1/1", "3/0", "3/1", "5/0", "5/1"]

    # -- closure ----------------------------------------------------------------------

    async def test_cleared_conversation_reads_empty(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("c")
        assert await store.read("c") == []

    async def test_cleared_conversation_rejects_new_appends(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a2", _turn("new")))
        assert await store.read("c") == []

    async def test_cleared_conversation_rejects_retries_of_accepted_batches(
        self, store: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.append(batch)
        # Closure wins over a conflict, too.
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a1", _turn("other")))
        assert await store.read("c") == []

    async def test_clear_of_never_written_id_closes_it(self, store: Any) -> None:
        await store.clear("fresh")
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("fresh", "a1", _turn("t")))
        assert await store.read("fresh") == []
        assert await store.conversations() == []

    async def test_clear_is_idempotent(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("c")
        await store.clear("c")
        await store.clear("c")
        assert await store.read("c") == []
        assert await store.conversations() == []
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a1", _turn("t")))

    async def test_cleared_conversation_leaves_the_listing(self, store: Any) -> None:
        for cid in ("a", "b", "c"):
            await store.append(Batch(cid, "a1", _turn(cid)))
        await store.clear("b")
        assert await store.conversations() == ["a", "c"]

    async def test_clear_leaves_other_conversations_alone(self, store: Any) -> None:
        await store.append(Batch("keep", "a1", _turn("keep")))
        await store.append(Batch("drop", "a1", _turn("drop")))
        await store.clear("drop")
        assert _texts(await store.read("keep")) == ["keep/0", "keep/1"]
        second = Batch("keep", "a2", _turn("more"))
        assert await store.append(second) == second.receipt()

    # -- listing ----------------------------------------------------------------------

    async def test_conversations_are_unique_in_lexical_order(self, store: Any) -> None:
        ids = ["b", "a", "B", "a b", "ab", "é", "z", "日本", "🙂", "a:b", "10", "9", "A", "~"]
        for i, cid in enumerate(ids):
            await store.append(Batch(cid, f"a{i}", _turn(cid)))
            await store.append(Batch(cid, f"again{i}", _turn(cid)))
        listed = await store.conversations()
        # Code point order, which is also UTF-8 byte order (not a locale collation).
        assert listed == sorted(ids)
        assert all(type(c) is ConversationID for c in listed)

    async def test_conversations_returns_a_new_list(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        listed = await store.conversations()
        listed.clear()
        assert await store.conversations() == ["c"]

    # -- invalid input ----------------------------------------------------------------

    async def _rejects_without_suspending(
        self, error: type[Exception], call: Any, *args: Any
    ) -> None:
        # Inside an already-cancelled scope, the first checkpoint (any I/O, lock or
        # thread hop) would raise Cancelled instead; the error must come first.
        rejected = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(error):
                await call(*args)
            rejected = True
        assert rejected, f"{call.__name__}{args!r} suspended before rejecting invalid input"

    @pytest.mark.parametrize("bad_id", _BAD_IDS, ids=_BAD_ID_NAMES)
    async def test_invalid_conversation_ids_rejected_before_io(
        self, store: Any, bad_id: Any
    ) -> None:
        await self._rejects_without_suspending(InvalidConversationIDError, store.read, bad_id)
        await self._rejects_without_suspending(InvalidConversationIDError, store.clear, bad_id)
        assert await store.conversations() == []

    @pytest.mark.parametrize(
        "bad_batch",
        [None, "batch", {"conversation_id": "c", "id": "a", "messages": []}, [user_message("x")]],
        ids=["none", "str", "dict", "list"],
    )
    async def test_non_batch_append_rejected_before_io(self, store: Any, bad_batch: Any) -> None:
        await self._rejects_without_suspending(InvalidBatchError, store.append, bad_batch)
        assert await store.conversations() == []

    # -- batches (optional BatchReader) -----------------------------------------------

    def _batch_reader(self, store: Any) -> Any:
        """``store`` when it is a ``BatchReader``; otherwise skip the calling test."""
        return _optional(store, BatchReader, "read_batches", "batch-reading")

    async def test_read_batches_round_trip_in_order_with_receipts(self, store: Any) -> None:
        reader = self._batch_reader(store)
        batches = [
            Batch("c", "a1", rich_messages()),
            Batch("c", "a2", _turn("two")),
            Batch("c", "a3", _turn("three", 4)),
        ]
        receipts = [await store.append(batch) for batch in batches]
        await store.append(Batch("other", "a1", _turn("other")))
        # A retry and a conflict add no batch.
        assert await store.append(batches[0]) == receipts[0]
        with pytest.raises(AppendConflictError):
            await store.append(Batch("c", "a2", _turn("conflict")))
        stored = await reader.read_batches("c")
        assert type(stored) is list
        assert stored == batches
        for got, batch, receipt in zip(stored, batches, receipts, strict=True):
            assert type(got) is Batch
            assert type(got.conversation_id) is ConversationID
            assert type(got.id) is AppendID
            assert (got.conversation_id, got.id, got.digest) == (
                batch.conversation_id,
                batch.id,
                batch.digest,
            )
            assert got.messages == batch.messages
            assert got.encoded_messages == batch.encoded_messages
            assert got.receipt() == receipt
            receipt.validate_for(got)
        assert await reader.read_batches("other") == [Batch("other", "a1", _turn("other"))]

    async def test_read_batches_returns_a_new_list_each_time(self, store: Any) -> None:
        reader = self._batch_reader(store)
        await store.append(Batch("c", "a1", _turn("t")))
        first = await reader.read_batches("c")
        first.clear()
        second = await reader.read_batches("c")
        assert [b.id for b in second] == ["a1"]
        assert second is not await reader.read_batches("c")

    async def test_read_batches_keeps_hostile_ids_apart(self, store: Any) -> None:
        reader = self._batch_reader(store)
        # Two hostile append ids per conversation: its own id and the next one's.
        pairs = list(zip(HOSTILE_IDS, HOSTILE_IDS[1:] + HOSTILE_IDS[:1], strict=True))
        for cid, second in pairs:
            await store.append(Batch(cid, cid, _turn(cid)))
            await store.append(Batch(cid, second, _turn(second)))
        for cid, second in pairs:
            stored = await reader.read_batches(cid)
            assert [(b.conversation_id, b.id) for b in stored] == [(cid, cid), (cid, second)]
            assert _texts(_flatten(stored)) == _texts(_turn(cid) + _turn(second))

    async def test_read_batches_of_unknown_conversation_is_empty(self, store: Any) -> None:
        reader = self._batch_reader(store)
        await store.append(Batch("known", "a1", _turn("t")))
        assert await reader.read_batches("never-written") == []

    async def test_read_batches_of_cleared_conversation_is_empty(self, store: Any) -> None:
        reader = self._batch_reader(store)
        await store.append(Batch("c", "a1", _turn("t")))
        await store.append(Batch("c", "a2", _turn("u")))
        await store.append(Batch("keep", "a1", _turn("k")))
        await store.clear("c")
        await store.clear("fresh")
        assert await reader.read_batches("c") == []
        assert await reader.read_batches("fresh") == []
        assert [b.id for b in await reader.read_batches("keep")] == ["a1"]

    @pytest.mark.parametrize("bad_id", _BAD_IDS, ids=_BAD_ID_NAMES)
    async def test_read_batches_rejects_invalid_ids_before_io(
        self, store: Any, bad_id: Any
    ) -> None:
        reader = self._batch_reader(store)
        await self._rejects_without_suspending(
            InvalidConversationIDError, reader.read_batches, bad_id
        )

    async def test_read_equals_the_concatenated_read_batches(self, store: Any) -> None:
        reader = self._batch_reader(store)
        for i in range(8):
            await store.append(Batch(f"c{i % 2}", f"a{i}", _turn(f"{i}", 1 + i % 3)))
        await store.append(Batch("c0", "a0", _turn("0", 1)))  # a retry: nothing added

        async def append(i: int) -> None:
            await store.append(Batch("c1", f"concurrent{i}", _turn(f"x{i}", 2)))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(append, i)
        for cid in ("c0", "c1", "unknown"):
            batches = await reader.read_batches(cid)
            assert await store.read(cid) == _flatten(batches)
        assert [b.id for b in await reader.read_batches("c0")] == ["a0", "a2", "a4", "a6"]
        c1 = [b.id for b in await reader.read_batches("c1")]
        # Order between concurrent batches is the backend's; the sequential ones come first.
        assert c1[:4] == ["a1", "a3", "a5", "a7"]
        assert sorted(c1[4:]) == sorted(f"concurrent{i}" for i in range(10))

    # -- concurrency ------------------------------------------------------------------

    async def test_concurrent_appends_all_land_each_batch_contiguous(self, store: Any) -> None:
        n = self.concurrent_appends
        batches = [Batch("c", f"a{i}", _turn(f"b{i}", 3)) for i in range(n)]
        receipts: dict[int, Receipt] = {}

        async def append(i: int) -> None:
            receipts[i] = await store.append(batches[i])

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(append, i)
        for i, batch in enumerate(batches):
            receipts[i].validate_for(batch)
        stored = _texts(await store.read("c"))
        assert len(stored) == 3 * n
        assert sorted(stored) == sorted(t for b in batches for t in _texts(b.messages))
        for i in range(n):
            start = stored.index(f"b{i}/0")
            assert stored[start : start + 3] == [f"b{i}/0", f"b{i}/1", f"b{i}/2"], (
                f"batch {i} is not contiguous"
            )

    async def test_concurrent_retries_of_one_batch_land_once(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("once", 3))
        receipts: list[Receipt] = []

        async def append() -> None:
            receipts.append(await store.append(batch))

        async with anyio.create_task_group() as tg:
            for _ in range(self.concurrent_retries):
                tg.start_soon(append)
        assert len(receipts) == self.concurrent_retries
        assert all(r == batch.receipt() for r in receipts)
        assert _texts(await store.read("c")) == ["once/0", "once/1", "once/2"]

    async def test_concurrent_appends_to_many_conversations(self, store: Any) -> None:
        async def append(i: int) -> None:
            for j in range(3):
                await store.append(Batch(f"c{i}", f"a{j}", _turn(f"{i}.{j}")))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(append, i)
        assert await store.conversations() == sorted(f"c{i}" for i in range(10))
        for i in range(10):
            expected = [f"{i}.{j}/{k}" for j in range(3) for k in range(2)]
            assert _texts(await store.read(f"c{i}")) == expected

    # -- cancellation -----------------------------------------------------------------

    async def test_cancelled_append_leaves_all_or_nothing_and_retry_resolves(
        self, store: Any
    ) -> None:
        # Cancel the append after 0, 1, 2, ... scheduling rounds, so cancellation lands
        # before, inside and after the store's work, then once more with a cancelled scope.
        for round_ in itertools.chain(range(self.cancellation_rounds), [-1]):
            cid = f"cancel-{round_}"
            batch = Batch(cid, "a1", _turn(cid, 4))
            if round_ < 0:
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await store.append(batch)
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(store.append, batch)
                    for _ in range(round_):
                        await anyio.lowlevel.checkpoint()
                    tg.cancel_scope.cancel()
            after_cancel = await store.read(cid)
            assert after_cancel in ([], list(batch.messages)), (
                f"round {round_}: a cancelled append left part of a batch: {_texts(after_cancel)}"
            )
            assert await store.append(batch) == batch.receipt()
            assert await store.read(cid) == list(batch.messages), f"round {round_}"

    # -- the expected_length fence (DESIGN §6b) ----------------------------------------

    async def test_fenced_append_lands_at_the_current_length(self, store: Any) -> None:
        first = Batch("c", "a1", _turn("one"), expected_length=0)
        assert await store.append(first) == first.receipt()
        second = Batch("c", "a2", _turn("two", 3), expected_length=2)
        assert await store.append(second) == second.receipt()
        # Unfenced appends move the length too.
        await store.append(Batch("c", "a3", _turn("three")))
        fourth = Batch("c", "a4", _turn("four"), expected_length=7)
        assert await store.append(fourth) == fourth.receipt()
        assert _texts(await store.read("c")) == _texts(
            _turn("one") + _turn("two", 3) + _turn("three") + _turn("four")
        )

    async def test_stale_expected_length_is_refused_and_appends_nothing(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("one")))
        await store.append(Batch("c", "a2", _turn("two")))
        for stale in (0, 2, 3):
            with pytest.raises(HistoryChangedError) as caught:
                await store.append(Batch("c", f"stale{stale}", _turn("late"), stale))
            assert (caught.value.expected, caught.value.actual) == (stale, 4)
        assert _texts(await store.read("c")) == _texts(_turn("one") + _turn("two"))
        # A refused batch leaves no dedupe record: the same id lands at the right length.
        retry = Batch("c", "stale0", _turn("late"), expected_length=4)
        assert await store.append(retry) == retry.receipt()

    async def test_future_expected_length_is_refused_and_appends_nothing(self, store: Any) -> None:
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(Batch("new", "a1", _turn("t"), expected_length=2))
        assert (caught.value.expected, caught.value.actual) == (2, 0)
        assert await store.read("new") == []
        assert await store.conversations() == []
        await store.append(Batch("c", "a1", _turn("t")))
        with pytest.raises(HistoryChangedError):
            await store.append(Batch("c", "a2", _turn("u"), expected_length=3))
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        assert await store.conversations() == ["c"]

    async def test_retry_of_accepted_batch_with_stale_expected_length_returns_equal_receipt(
        self, store: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"), expected_length=0)
        first = await store.append(batch)
        await store.append(Batch("c", "a2", _turn("u"), expected_length=2))
        # The turn already landed: the dedupe record answers before the fence.
        assert await store.append(batch) == first
        assert await store.append(batch.fenced(None)) == first
        assert await store.append(batch.fenced(99)) == first
        assert _texts(await store.read("c")) == ["t/0", "t/1", "u/0", "u/1"]

    async def test_closed_and_conflict_win_over_the_fence(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        # Same id, other digest, wrong length: the conflict is reported, not the fence.
        with pytest.raises(AppendConflictError):
            await store.append(Batch("c", "a1", _turn("other"), expected_length=0))
        await store.clear("c")
        for expected in (0, 2, 5):
            with pytest.raises(ConversationClosedError):
                await store.append(Batch("c", "a2", _turn("x"), expected_length=expected))
            with pytest.raises(ConversationClosedError):
                await store.append(Batch("c", "a1", _turn("t"), expected_length=expected))
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a1", _turn("other"), expected_length=0))

    async def test_concurrent_fenced_appends_at_one_length_exactly_one_lands(
        self, store: Any
    ) -> None:
        n = self.concurrent_fenced_appends
        await store.append(Batch("c", "base", _turn("base")))
        landed: list[int] = []
        refused: list[HistoryChangedError] = []

        async def append(i: int) -> None:
            try:
                await store.append(Batch("c", f"a{i}", _turn(f"b{i}", 3), expected_length=2))
            except HistoryChangedError as exc:
                refused.append(exc)
            else:
                landed.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(append, i)
        assert len(landed) == 1, f"{len(landed)} fenced appends at one length landed"
        assert len(refused) == n - 1
        assert all((e.expected, e.actual) == (2, 5) for e in refused)
        winner = landed[0]
        assert _texts(await store.read("c")) == _texts(_turn("base") + _turn(f"b{winner}", 3))

    # -- views (optional ViewReader) --------------------------------------------------

    def _view_reader(self, store: Any) -> Any:
        """``store`` when it is a ``ViewReader``; otherwise skip the calling test."""
        return _optional(store, ViewReader, "read_view", "view")

    async def test_views_agree_with_read(self, store: Any) -> None:
        reader = self._view_reader(store)
        assert await reader.read_view("unknown") == HistoryView((), 0, False)
        messages = rich_messages()
        await store.append(Batch("c", "a1", messages))
        await store.append(Batch("c", "a2", _turn("t", 3)))
        await store.append(Batch("other", "a1", _turn("o")))
        view = await reader.read_view("c")
        assert type(view) is HistoryView
        assert view.closed is False
        assert list(view.messages) == await store.read("c")
        assert view.length == len(messages) + 3
        assert await reader.read_view(ConversationID("other")) == HistoryView(
            tuple(_turn("o")), 2, False
        )

    async def test_view_of_a_closed_conversation(self, store: Any) -> None:
        reader = self._view_reader(store)
        await store.append(Batch("c", "a1", _turn("t", 3)))
        await store.clear("c")
        view = await reader.read_view("c")
        assert view.closed is True and view.messages == ()
        assert view.length in (0, 3), "a closed conversation keeps its last length or 0"
        await store.clear("never-written")
        assert await reader.read_view("never-written") == HistoryView((), 0, True)

    async def test_views_are_atomic_under_concurrent_appends(self, store: Any) -> None:
        reader = self._view_reader(store)
        sizes = [1 + i % 3 for i in range(16)]
        views: list[HistoryView] = []
        done = anyio.Event()

        async def append_all() -> None:
            for i, size in enumerate(sizes):
                await store.append(Batch("c", f"a{i}", _turn(f"b{i}", size)))
                await anyio.lowlevel.checkpoint()
            done.set()

        async def watch() -> None:
            while not done.is_set():
                views.append(await reader.read_view("c"))
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            tg.start_soon(watch)
            tg.start_soon(append_all)
        views.append(await reader.read_view("c"))
        for view in views:
            # One state: the length is the messages', and they are whole batches in order.
            assert view.length == len(view.messages), "a view mixed two states"
            expected: list[str] = []
            for i, size in enumerate(sizes):
                if len(expected) >= view.length:
                    break
                expected += _texts(_turn(f"b{i}", size))
            assert _texts(view.messages) == expected
        assert views[-1].length == sum(sizes)

    @pytest.mark.parametrize("bad_id", _BAD_IDS, ids=_BAD_ID_NAMES)
    async def test_read_view_rejects_invalid_ids_before_io(self, store: Any, bad_id: Any) -> None:
        reader = self._view_reader(store)
        await self._rejects_without_suspending(InvalidConversationIDError, reader.read_view, bad_id)

    # -- turn leases (optional TurnLeaser) --------------------------------------------

    def _leaser(self, store: Any) -> Any:
        """``store`` when it is a ``TurnLeaser``; otherwise skip the calling test."""
        return _optional(store, TurnLeaser, "acquire_turn", "turn-lease")

    async def test_lease_of_a_free_conversation_is_taken(self, store: Any) -> None:
        leaser = self._leaser(store)
        assert await leaser.acquire_turn("c", "h1", 30) is True
        assert await leaser.acquire_turn(ConversationID("other"), "h2", 30) is True

    async def test_lease_holder_token_excludes_other_holders(self, store: Any) -> None:
        leaser = self._leaser(store)
        assert await leaser.acquire_turn("c", "h1", 30) is True
        assert await leaser.acquire_turn("c", "h2", 30) is False
        assert await leaser.acquire_turn("c", "h1-", 30) is False
        assert await leaser.release_turn("c", "h2") is False
        assert await leaser.acquire_turn("c", "h2", 30) is False  # still h1's
        assert await leaser.release_turn("c", "h1") is True
        assert await leaser.release_turn("c", "h1") is False  # released already
        assert await leaser.acquire_turn("c", "h2", 30) is True

    async def test_lease_renewal_by_its_holder_extends_it(self, store: Any) -> None:
        leaser = self._leaser(store)
        ttl = self.lease_ttl
        assert await leaser.acquire_turn("c", "h1", ttl) is True
        for _ in range(3):  # renewed every ttl/2: alive for 1.5 ttl past the first expiry
            await anyio.sleep(ttl / 2)
            assert await leaser.acquire_turn("c", "h1", ttl) is True
            assert await leaser.acquire_turn("c", "h2", ttl) is False
        assert await leaser.release_turn("c", "h1") is True

    async def test_lease_expires_by_itself(self, store: Any) -> None:
        leaser = self._leaser(store)
        ttl = self.lease_ttl
        assert await leaser.acquire_turn("c", "crashed", ttl) is True
        assert await leaser.acquire_turn("c", "h2", 30) is False
        await anyio.sleep(ttl * 2)
        assert await leaser.acquire_turn("c", "h2", 30) is True
        # The expired holder can neither renew nor release what is now h2's.
        assert await leaser.acquire_turn("c", "crashed", ttl) is False
        assert await leaser.release_turn("c", "crashed") is False
        assert await leaser.release_turn("c", "h2") is True

    async def test_lease_release_after_expiry_is_not_held(self, store: Any) -> None:
        leaser = self._leaser(store)
        ttl = self.lease_ttl
        assert await leaser.acquire_turn("c", "h1", ttl) is True
        await anyio.sleep(ttl * 2)
        assert await leaser.release_turn("c", "h1") is False
        assert await leaser.acquire_turn("c", "h2", 30) is True

    async def test_leases_are_per_conversation(self, store: Any) -> None:
        leaser = self._leaser(store)
        for cid in HOSTILE_IDS[:8]:
            assert await leaser.acquire_turn(cid, "h1", 30) is True
        for cid in HOSTILE_IDS[8:16]:
            assert await leaser.acquire_turn(cid, "h2", 30) is True
        assert await leaser.acquire_turn(HOSTILE_IDS[0], "h2", 30) is False
        assert await leaser.acquire_turn(HOSTILE_IDS[8], "h1", 30) is False

    async def test_concurrent_lease_acquires_exactly_one_wins(self, store: Any) -> None:
        leaser = self._leaser(store)
        for round_ in range(3):
            won: list[str] = []

            async def acquire(holder: str, won: list[str] = won) -> None:
                if await leaser.acquire_turn("c", holder, 30):
                    won.append(holder)

            async with anyio.create_task_group() as group:
                for i in range(self.concurrent_leases):
                    group.start_soon(acquire, f"r{round_}h{i}")
            assert len(won) == 1, f"round {round_}: {len(won)} holders won the lease"
            assert await leaser.release_turn("c", won[0]) is True

    async def test_lease_is_exclusive_across_two_handles(self, store: Any) -> None:
        leaser = self._leaser(store)
        async with self._reopened(store) as again:
            other = self._leaser(again)
            assert await leaser.acquire_turn("c", "h1", 30) is True
            assert await other.acquire_turn("c", "h2", 30) is False
            assert await other.release_turn("c", "h2") is False
            assert await other.release_turn("c", "h1") is True  # the token, not the handle
            won: list[str] = []

            async def acquire(handle: Any, holder: str) -> None:
                if await handle.acquire_turn("d", holder, 30):
                    won.append(holder)

            async with anyio.create_task_group() as group:
                for i in range(self.concurrent_leases):
                    group.start_soon(acquire, (leaser, other)[i % 2], f"h{i}")
            assert len(won) == 1, f"{len(won)} holders on two handles won the lease"

    @pytest.mark.parametrize("bad_holder", ["", 3, None, b"h", "\ud800"])
    async def test_lease_holder_rejected_before_io(self, store: Any, bad_holder: Any) -> None:
        leaser = self._leaser(store)
        await self._rejects_without_suspending(ValueError, leaser.acquire_turn, "c", bad_holder, 30)
        await self._rejects_without_suspending(ValueError, leaser.release_turn, "c", bad_holder)
        with pytest.raises(ValueError, match=r"lease holder (must|is not valid)"):
            await leaser.acquire_turn("c", bad_holder, 30)

    @pytest.mark.parametrize("bad_ttl", [0, -1, float("nan"), float("inf"), "1", True, None])
    async def test_lease_ttl_rejected_before_io(self, store: Any, bad_ttl: Any) -> None:
        leaser = self._leaser(store)
        await self._rejects_without_suspending(ValueError, leaser.acquire_turn, "c", "h1", bad_ttl)
        with pytest.raises(ValueError, match="lease ttl must be a finite number of seconds > 0"):
            await leaser.acquire_turn("c", "h1", bad_ttl)
        assert await leaser.acquire_turn("c", "h2", 30) is True  # nothing was taken

    @pytest.mark.parametrize("bad_id", _BAD_IDS, ids=_BAD_ID_NAMES)
    async def test_lease_conversation_id_rejected_before_io(self, store: Any, bad_id: Any) -> None:
        leaser = self._leaser(store)
        await self._rejects_without_suspending(
            InvalidConversationIDError, leaser.acquire_turn, bad_id, "h1", 30
        )
        await self._rejects_without_suspending(
            InvalidConversationIDError, leaser.release_turn, bad_id, "h1"
        )

    # -- folded lease steps (optional FoldedTurnLeaser) --------------------------------

    #: How many tasks hand one conversation over with the folded steps, and how many
    #: turns each commits.
    folded_turn_tasks: ClassVar[int] = 8
    folded_turns_each: ClassVar[int] = 4

    def _folded(self, store: Any) -> Any:
        """``store`` when it is a ``FoldedTurnLeaser``; otherwise skip the calling test."""
        return _optional(store, FoldedTurnLeaser, "acquire_turn_view", "folded turn-lease")

    async def _lease_is_free(self, store: Any) -> bool:
        """Whether conversation ``c``'s lease is free (probed, then released again)."""
        if not await store.acquire_turn("c", "probe", 30):
            return False
        assert await store.release_turn("c", "probe") is True
        return True

    async def test_folded_acquire_returns_the_view_and_takes_the_lease(self, store: Any) -> None:
        folded = self._folded(store)
        await store.append(Batch("c", "a1", _turn("one")))
        await store.append(Batch("c", "a2", _turn("two", 3)))
        view = await folded.acquire_turn_view("c", "h1", 30)
        assert view == await folded.read_view("c")
        assert (_texts(view.messages), view.length, view.closed) == (
            _texts(_turn("one") + _turn("two", 3)),
            5,
            False,
        )
        assert await folded.acquire_turn("c", "h2", 30) is False
        assert await folded.acquire_turn_view("c", "h1", 30) == view  # the holder renews
        assert await folded.release_turn("c", "h1") is True

    async def test_folded_acquire_of_unknown_and_closed_conversations(self, store: Any) -> None:
        folded = self._folded(store)
        assert await folded.acquire_turn_view("never-written", "h1", 30) == HistoryView((), 0)
        assert await folded.acquire_turn("never-written", "h2", 30) is False
        await store.append(Batch("c", "a1", _turn("t", 3)))
        await store.clear("c")
        view = await folded.acquire_turn_view("c", "h1", 30)
        assert view == await folded.read_view("c")  # its last length, or 0
        assert view.closed and view.messages == ()
        assert await folded.acquire_turn("c", "h2", 30) is False

    async def test_folded_acquire_under_another_holders_lease_reads_nothing(
        self, store: Any
    ) -> None:
        folded = self._folded(store)
        await store.append(Batch("c", "a1", _turn("t")))
        assert await folded.acquire_turn("c", "h1", 30) is True
        assert await folded.acquire_turn_view("c", "h2", 30) is None
        assert await folded.release_turn("c", "h2") is False  # h2 never held it
        assert await folded.release_turn("c", "h1") is True  # h1's lease untouched
        assert await folded.acquire_turn_view("c", "h2", 30) is not None

    async def test_folded_acquire_takes_an_expired_lease(self, store: Any) -> None:
        folded = self._folded(store)
        ttl = self.lease_ttl
        assert await folded.acquire_turn("c", "crashed", ttl) is True
        assert await folded.acquire_turn_view("c", "h2", 30) is None
        await anyio.sleep(ttl * 2)
        assert await folded.acquire_turn_view("c", "h2", 30) == HistoryView((), 0)
        assert await folded.acquire_turn("c", "crashed", ttl) is False

    async def test_concurrent_folded_acquires_exactly_one_reads(self, store: Any) -> None:
        folded = self._folded(store)
        await store.append(Batch("c", "a1", _turn("t")))
        for round_ in range(3):
            won: list[str] = []

            async def acquire(holder: str, won: list[str] = won) -> None:
                if await folded.acquire_turn_view("c", holder, 30) is not None:
                    won.append(holder)

            async with anyio.create_task_group() as group:
                for i in range(self.concurrent_leases):
                    group.start_soon(acquire, f"r{round_}h{i}")
            assert len(won) == 1, f"round {round_}: {len(won)} holders read under the lease"
            assert await folded.release_turn("c", won[0]) is True

    async def test_folded_append_lands_and_releases_the_lease(self, store: Any) -> None:
        folded = self._folded(store)
        view = await folded.acquire_turn_view("c", "h1", 30)
        batch = Batch("c", "a1", _turn("t"), expected_length=view.length)
        assert await folded.append_release_turn(batch, "h1") == batch.receipt()
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        assert await folded.release_turn("c", "h1") is False  # released already
        assert await self._lease_is_free(store)

    async def test_folded_append_retry_returns_the_receipt_and_releases(self, store: Any) -> None:
        folded = self._folded(store)
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        assert await folded.acquire_turn("c", "h1", 30) is True
        stale = Batch("c", "a1", _turn("t"), expected_length=0)  # the fence yields to dedupe
        assert await folded.append_release_turn(stale, "h1") == batch.receipt()
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        assert await self._lease_is_free(store)

    async def test_folded_append_leaves_another_holders_lease(self, store: Any) -> None:
        folded = self._folded(store)
        assert await folded.acquire_turn("c", "h1", 30) is True
        batch = Batch("c", "a1", _turn("t"))
        assert await folded.append_release_turn(batch, "h2") == batch.receipt()
        assert await folded.acquire_turn("c", "h2", 30) is False  # still h1's
        assert await folded.release_turn("c", "h1") is True

    async def test_folded_append_refused_keeps_the_lease_and_appends_nothing(
        self, store: Any
    ) -> None:
        folded = self._folded(store)
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("closed")
        refusals = [
            (HistoryChangedError, Batch("c", "a2", _turn("late"), expected_length=0)),
            (AppendConflictError, Batch("c", "a1", _turn("other"))),
            (ConversationClosedError, Batch("closed", "a1", _turn("t"))),
        ]
        for error, batch in refusals:
            cid = batch.conversation_id
            assert await folded.acquire_turn(cid, "h1", 30) is True
            with pytest.raises(error):
                await folded.append_release_turn(batch, "h1")
            assert await folded.acquire_turn(cid, "h2", 30) is False, (
                f"{error.__name__} released the lease"
            )
            assert await folded.release_turn(cid, "h1") is True
        assert _texts(await store.read("c")) == ["t/0", "t/1"]

    async def _hand_over(self, handles: Sequence[Any]) -> None:
        """``folded_turn_tasks`` tasks on ``handles`` take turns on ``c`` with the folded
        steps: each turn's fenced batch must land (its view was never stale)."""
        tasks, each = self.folded_turn_tasks, self.folded_turns_each

        async def turns(task: int) -> None:
            handle = handles[task % len(handles)]
            for turn in range(each):
                holder = f"t{task}n{turn}"
                # Busy polling (a checkpoint, not a sleep): every waiting task tries
                # again in every scheduling round, so a lease handed over at any point
                # is taken at once, and a store whose steps are not atomic is caught.
                while (view := await handle.acquire_turn_view("c", holder, 30)) is None:
                    await anyio.lowlevel.checkpoint()
                for _ in range((task + turn) % 3 + 1):  # the model call, of varied length
                    await anyio.lowlevel.checkpoint()
                batch = Batch("c", holder, _turn(holder), expected_length=view.length)
                await handle.append_release_turn(batch, holder)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for task in range(tasks):
                    group.start_soon(turns, task)
        assert (await handles[0].read_view("c")).length == 2 * tasks * each
        assert await self._lease_is_free(handles[0])

    async def test_folded_turns_hand_over_without_a_stale_view(self, store: Any) -> None:
        await self._hand_over([self._folded(store)])

    async def test_folded_turns_hand_over_across_two_handles(self, store: Any) -> None:
        folded = self._folded(store)
        async with self._reopened(store) as again:
            await self._hand_over([folded, self._folded(again)])

    @pytest.mark.parametrize("bad_holder", ["", 3, None, b"h", "\ud800"])
    async def test_folded_steps_reject_a_bad_holder_before_io(
        self, store: Any, bad_holder: Any
    ) -> None:
        folded = self._folded(store)
        batch = Batch("c", "a1", _turn("t"))
        await self._rejects_without_suspending(
            ValueError, folded.acquire_turn_view, "c", bad_holder, 30
        )
        await self._rejects_without_suspending(
            ValueError, folded.append_release_turn, batch, bad_holder
        )
        with pytest.raises(ValueError, match=r"lease holder (must|is not valid)"):
            await folded.append_release_turn(batch, bad_holder)
        assert await store.read("c") == []

    @pytest.mark.parametrize("bad_ttl", [0, -1, float("nan"), float("inf"), "1", True, None])
    async def test_folded_acquire_rejects_a_bad_ttl_before_io(
        self, store: Any, bad_ttl: Any
    ) -> None:
        folded = self._folded(store)
        await self._rejects_without_suspending(
            ValueError, folded.acquire_turn_view, "c", "h1", bad_ttl
        )
        with pytest.raises(ValueError, match="lease ttl must be a finite number of seconds > 0"):
            await folded.acquire_turn_view("c", "h1", bad_ttl)
        assert await self._lease_is_free(store)

    @pytest.mark.parametrize("bad_id", _BAD_IDS, ids=_BAD_ID_NAMES)
    async def test_folded_acquire_rejects_invalid_ids_before_io(
        self, store: Any, bad_id: Any
    ) -> None:
        folded = self._folded(store)
        await self._rejects_without_suspending(
            InvalidConversationIDError, folded.acquire_turn_view, bad_id, "h1", 30
        )

    @pytest.mark.parametrize(
        "bad_batch", [None, "batch", [user_message("x")]], ids=["none", "str", "list"]
    )
    async def test_folded_append_rejects_a_non_batch_before_io(
        self, store: Any, bad_batch: Any
    ) -> None:
        folded = self._folded(store)
        await self._rejects_without_suspending(
            InvalidBatchError, folded.append_release_turn, bad_batch, "h1"
        )

    # -- durability (needs reopen) ----------------------------------------------------

    async def test_durable_messages_survive_reopen(self, store: Any) -> None:
        messages = rich_messages()
        await store.append(Batch("c", "a1", messages))
        await store.append(Batch("d", "a1", _turn("d")))
        async with self._reopened(store) as again:
            assert await again.read("c") == messages
            assert _texts(await again.read("d")) == ["d/0", "d/1"]
            assert await again.conversations() == ["c", "d"]

    async def test_durable_batches_survive_reopen(self, store: Any) -> None:
        self._batch_reader(store)
        batches = [Batch("c", "a1", rich_messages()), Batch("c", "a2", _turn("t"))]
        receipts = [await store.append(batch) for batch in batches]
        async with self._reopened(store) as again:
            stored = await self._batch_reader(again).read_batches("c")
            assert stored == batches
            assert [b.receipt() for b in stored] == receipts

    async def test_durable_dedupe_evidence_survives_reopen(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        async with self._reopened(store) as again:
            assert await again.append(batch) == batch.receipt()
            with pytest.raises(AppendConflictError):
                await again.append(Batch("c", "a1", _turn("other")))
            assert _texts(await again.read("c")) == ["t/0", "t/1"]

    async def test_durable_length_survives_reopen(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t", 3)))
        await store.append(Batch("c", "a2", _turn("u")))
        async with self._reopened(store) as again:
            with pytest.raises(HistoryChangedError):
                await again.append(Batch("c", "a3", _turn("late"), expected_length=3))
            fenced = Batch("c", "a3", _turn("v"), expected_length=5)
            assert await again.append(fenced) == fenced.receipt()
            if isinstance(again, ViewReader):
                assert (await again.read_view("c")).length == 7

    async def test_durable_closure_survives_reopen(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        await store.clear("c")
        await store.clear("never-written")
        async with self._reopened(store) as again:
            assert await again.read("c") == []
            assert await again.conversations() == []
            for cid, aid in (("c", "a1"), ("c", "a2"), ("never-written", "a1")):
                with pytest.raises(ConversationClosedError):
                    await again.append(Batch(cid, aid, _turn("t")))


# The suite's tests run on anyio's test runner whatever else is installed (see
# _test_on_anyio_runner); a subclass's own async tests are its plugins' business.
for _name, _test in list(vars(StoreConformance).items()):
    if _name.startswith("test_") and inspect.iscoroutinefunction(_test):
        setattr(StoreConformance, _name, _test_on_anyio_runner(_test))
del _name, _test
