"""Where the server-backed store tests find their servers, and what they do without them.

``SCOPE_TEST_POSTGRES_DSN`` and ``SCOPE_TEST_REDIS_URL`` name the servers (``bash
.ci/services.sh start`` starts throwaway ones and prints both). A test that needs a server
that is not configured or does not accept TCP connections is skipped with the reason,
unless ``SCOPE_REQUIRE_SERVERS=1``: then it fails, so CI cannot pass by skipping.

Every test uses its own table or key prefix (``unique_table_prefix``,
``unique_key_prefix``) and removes what it created, so tests never see each other's data
and a shared server stays clean.
"""

from __future__ import annotations

import functools
import importlib
import os
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

__all__ = [
    "POSTGRES_ENV",
    "REDIS_ENV",
    "import_driver",
    "postgres_dsn_or_skip",
    "redis_url_or_skip",
    "unique_key_prefix",
    "unique_table_prefix",
]

POSTGRES_ENV = "SCOPE_TEST_POSTGRES_DSN"
REDIS_ENV = "SCOPE_TEST_REDIS_URL"
_HOW = 'start local servers with: eval "$(bash .ci/services.sh start)"'


def _required() -> bool:
    return os.environ.get("SCOPE_REQUIRE_SERVERS", "") == "1"


@functools.cache
def _problem(env: str, default_port: int) -> str | None:
    """Why the server named by ``env`` cannot be used, or None when it accepts TCP."""
    url = os.environ.get(env, "")
    if not url:
        return f"{env} is not set; {_HOW}"
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or default_port
    except ValueError as exc:
        return f"{env} has an invalid port: {exc}"
    try:
        with socket.create_connection((host, port), timeout=3):
            pass
    except OSError as exc:
        return f"{env} names {host}:{port}, which does not accept connections ({exc}); {_HOW}"
    return None


def _url_or_skip(env: str, default_port: int) -> str:
    problem = _problem(env, default_port)
    if problem is not None:
        if _required():
            pytest.fail(f"SCOPE_REQUIRE_SERVERS=1 but {problem}", pytrace=False)
        pytest.skip(problem)
    return os.environ[env]


def import_driver(name: str) -> Any:
    """Import a store driver (``asyncpg``, ``redis``); skip without it, or fail when
    ``SCOPE_REQUIRE_SERVERS=1``."""
    if _required():
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed (pip install scope[...])")


def postgres_dsn_or_skip() -> str:
    """The test PostgreSQL DSN; skips (or fails under SCOPE_REQUIRE_SERVERS=1) without it."""
    return _url_or_skip(POSTGRES_ENV, 5432)


def redis_url_or_skip() -> str:
    """The test Redis URL; skips (or fails under SCOPE_REQUIRE_SERVERS=1) without it."""
    return _url_or_skip(REDIS_ENV, 6379)


def unique_table_prefix() -> str:
    """A fresh, valid table prefix: ``scope_test_<12 hex digits>``."""
    return f"scope_test_{uuid.uuid4().hex[:12]}"


def unique_key_prefix() -> str:
    """A fresh, valid key prefix: ``scope-test:<12 hex digits>``."""
    return f"scope-test:{uuid.uuid4().hex[:12]}"
