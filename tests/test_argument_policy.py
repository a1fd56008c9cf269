"""The argument policy of scope.errors, across the public constructors: an argument of the
wrong type raises ``TypeError`` (never a ``ValueError``), a wrong value ``ValueError`` or a
``ScopeError`` subclass that is one, each naming the argument (and, for adapters, the
class) in its message."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from scope import otel
from scope.chat import fallback
from scope.errors import InvalidOptionsError, InvalidWindowError
from scope.history import Middleware, Reject, Wait, WindowReader, keyword_layers
from scope.history.inmemory import InMemoryStore
from scope.historystores.postgres import PostgresStore
from scope.historystores.redis import RedisStore
from scope.historystores.sqlite import SQLiteStore
from scope.models.anthropic import AnthropicModel
from scope.models.gemini import GeminiModel
from scope.models.openai import OpenAIChatModel, OpenAIResponsesModel
from scope.testing import ScriptedModel

STORE = InMemoryStore()

# (what is built, the exact error type, what the message says)
WRONG_TYPES: list[tuple[str, Callable[[], object], str]] = [
    ("openai timeout", lambda: OpenAIChatModel("m", timeout="x"), "OpenAIChatModel timeout"),
    ("openai provider_name", lambda: OpenAIChatModel("m", provider_name=1), "provider_name"),
    ("responses switch", lambda: OpenAIResponsesModel(encrypted_reasoning=1), "encrypted"),
    ("anthropic retries", lambda: AnthropicModel("m", max_retries="2"), "max_retries"),
    ("gemini account", lambda: GeminiModel("m", provider_account=1), "provider_account"),
    ("gemini client", lambda: GeminiModel("m", http_client="c"), "GeminiModel http_client"),
    ("middleware reader", lambda: Middleware(object(), STORE, "c"), "reader must be"),
    ("middleware flag", lambda: keyword_layers(keep_interrupted=1), "keep_"),
    (
        "middleware ttl",
        lambda: Middleware(STORE, STORE, "c", layers=(Wait(lease_ttl="5"),)),
        "lease_ttl",
    ),
    ("middleware layers", lambda: Middleware(STORE, STORE, "c", layers=Wait()), "layers must be"),
    ("window reader", lambda: WindowReader(object(), 3), "window reader must be"),
    ("window limit", lambda: WindowReader(STORE, 2.0), "window limit must be an integer"),
    ("fallback on", lambda: fallback(ScriptedModel(), on=[ValueError]), "tuple"),
    ("tracing provider", lambda: otel.tracing(provider_name=b"openai"), "provider_name"),
]

WRONG_VALUES: list[tuple[str, Callable[[], object], type[ValueError], str]] = [
    (
        "openai provider_name",
        lambda: OpenAIChatModel("m", provider_name=""),
        InvalidOptionsError,
        "OpenAIChatModel provider_name must be a non-empty string",
    ),
    (
        "responses provider_account",
        lambda: OpenAIResponsesModel("m", provider_account=" org"),
        InvalidOptionsError,
        "OpenAIResponsesModel provider_account must not have surrounding whitespace",
    ),
    (
        "tracing provider_name",
        lambda: otel.tracing(provider_name=""),
        InvalidOptionsError,
        "tracing provider_name must be a non-empty string",
    ),
    (
        "openai timeout",
        lambda: OpenAIChatModel("m", timeout=-1),
        InvalidOptionsError,
        "OpenAIChatModel timeout must be a finite number of seconds > 0",
    ),
    (
        "anthropic retries",
        lambda: AnthropicModel("m", max_retries=-1),
        InvalidOptionsError,
        "AnthropicModel max_retries must be >= 0",
    ),
    (
        "middleware ttl",
        lambda: Middleware(STORE, STORE, "c", layers=(Reject(lease_ttl=0),)),
        ValueError,
        "lease_ttl must be a finite number of seconds > 0",
    ),
    ("window limit", lambda: WindowReader(STORE, 0), InvalidWindowError, "at least 1"),
    ("fallback on", lambda: fallback(ScriptedModel(), on=()), ValueError, "at least one"),
]


@pytest.mark.parametrize(("case", "build", "match"), WRONG_TYPES, ids=[c[0] for c in WRONG_TYPES])
def test_a_wrong_type_is_a_type_error(case: str, build: Callable[[], object], match: str) -> None:
    with pytest.raises(TypeError, match=match) as info:
        build()
    assert not isinstance(info.value, ValueError), case


@pytest.mark.parametrize(
    ("case", "build", "error", "match"), WRONG_VALUES, ids=[c[0] for c in WRONG_VALUES]
)
def test_a_wrong_value_is_a_value_error(
    case: str, build: Callable[[], object], error: type[ValueError], match: str
) -> None:
    with pytest.raises(ValueError, match=match) as info:
        build()
    assert type(info.value) is error, case


# Stores check before any I/O; they need asyncio (their drivers do).
STORE_CASES: list[tuple[str, Callable[[pathlib.Path], Any], type[Exception], str]] = [
    ("sqlite prefix", lambda p: SQLiteStore.open(p / "db", table_prefix=1), TypeError, "prefix"),
    ("sqlite timeout", lambda p: SQLiteStore.open(p / "db", busy_timeout="5"), TypeError, "busy"),
    (
        "sqlite cache",
        lambda p: SQLiteStore.open(p / "db", cache_bytes=1.5),
        TypeError,
        "cache",
    ),
    ("sqlite path", lambda p: SQLiteStore.open(5), TypeError, "path must be a str or os.PathLike"),
    (
        "postgres dsn",
        lambda p: PostgresStore.open(b"postgresql://x"),
        TypeError,
        "dsn must be a str",
    ),
    (
        "postgres connect_timeout",
        lambda p: PostgresStore.open("postgresql://x", connect_timeout="1"),
        TypeError,
        "connect_timeout must be a number of seconds",
    ),
    ("redis url", lambda p: RedisStore.open(None), TypeError, "url must be a string"),
    ("redis prefix", lambda p: RedisStore.open("redis://x", prefix=3), TypeError, "prefix must be"),
    (
        "redis socket_timeout",
        lambda p: RedisStore.open("redis://x", socket_timeout="1"),
        TypeError,
        "socket_timeout must be a number of seconds",
    ),
    (
        "sqlite bad prefix",
        lambda p: SQLiteStore.open(p / "db", table_prefix="A"),
        ValueError,
        "prefix",
    ),
    (
        "sqlite bad timeout",
        lambda p: SQLiteStore.open(p / "db", busy_timeout=-1),
        ValueError,
        "busy",
    ),
    (
        "postgres bad connect_timeout",
        lambda p: PostgresStore.open("postgresql://x", connect_timeout=0),
        ValueError,
        "connect_timeout must be a finite number of seconds > 0",
    ),
    (
        "redis bad max_connections",
        lambda p: RedisStore.open("redis://x", max_connections=0),
        ValueError,
        "max_connections must be >= 1",
    ),
]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("case", "open_", "error", "match"), STORE_CASES, ids=[c[0] for c in STORE_CASES]
)
@pytest.mark.anyio
async def test_a_store_open_follows_the_policy(
    anyio_backend: str,
    tmp_path: pathlib.Path,
    case: str,
    open_: Callable[[pathlib.Path], Any],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match) as info:
        await open_(tmp_path)
    assert type(info.value) is error, case
