"""The values, settings and hooks the rule groups of ``StoreConformance`` share."""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import anyio
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
from scope.history._batch import Batch
from scope.jsonvalue import RawJSON
from scope.media import Media

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


class Base:
    """What every group of rules shares: the settings, the ``store`` fixture and the
    ``reopen`` hook a subclass of ``StoreConformance`` overrides."""

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

    #: Retention and erasure (DESIGN §6i): the store-wide retention the expiry checks
    #: open a store with (seconds; they sleep about twice it), how many conversations
    #: the resumable ``erase_owner`` check erases, and how many tasks append to other
    #: conversations while one is erased.
    retention_ttl: ClassVar[float] = 1.0
    erase_owner_conversations: ClassVar[int] = 200
    erase_under_load_tasks: ClassVar[int] = 8

    async def open_store(self, *, retention: _dt.timedelta | None = None) -> Any:
        """Override: return a fresh, empty store opened with these options (the store's
        own open option or constructor keyword ``retention``); the retention checks use
        it, and close it with ``aclose()`` when it has one."""
        pytest.skip(
            f"{type(self).__name__} defines no open_store(retention=...): the store-wide "
            "retention checks need a store opened with a retention"
        )

    @contextlib.asynccontextmanager
    async def _opened(self, *, retention: _dt.timedelta | None = None) -> AsyncIterator[Any]:
        store = await self.open_store(retention=retention)
        try:
            yield store
        finally:
            aclose = getattr(store, "aclose", None)
            if aclose is not None:
                await aclose()

    @contextlib.asynccontextmanager
    async def _reopened(self, store: Any) -> AsyncIterator[Any]:
        handle = await self.reopen(store)
        try:
            yield handle
        finally:
            aclose = getattr(handle, "aclose", None)
            if aclose is not None and handle is not store:
                await aclose()

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
