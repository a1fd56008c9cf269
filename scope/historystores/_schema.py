"""The SQL stores' schema: its version, the table prefix rule, the mismatch error."""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from scope.errors import StoreError

__all__ = [
    "MAX_TABLE_PREFIX",
    "SCHEMA_VERSION",
    "message_count",
    "schema_mismatch",
    "validate_table_prefix",
]

#: The schema version the SQL stores write and expect. 1: scope 0.1. 2: a ``length``
#: column on the conversations table (the ``expected_length`` fence) and a ``_schema``
#: table holding this number. 3: a ``_leases`` table (``TurnLeaser``, DESIGN §6e).
#: 4: PostgreSQL's folded lease functions ``_acquire_view`` and ``_commit_turn``
#: (the folded lease steps); SQLite's tables are those of 3, its upgrade only records 4.
#: 5: branches (DESIGN §6h): the head on the conversation row, each batch's parent,
#: stored time and path length, a ``_moves`` table (``move_head``'s move ids); retention
#: and erasure (§6i): ``owner``, ``expires_at`` and ``retained`` columns on the
#: conversations table, the ``_secret`` and ``_tombstones`` tables. PostgreSQL's append
#: functions take the head fence, the owner, the tombstone and the retention. Each
#: store's ``_upgrade_branches`` and ``_upgrade_erasure``: idempotent steps.
SCHEMA_VERSION: Final = 5


_TABLE_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]*\Z")


#: PostgreSQL truncates identifiers at 63 bytes; the longest suffix we add is 14 bytes
#: (``_conversations``; every other table and function suffix is shorter).
MAX_TABLE_PREFIX: Final = 63 - len("_conversations")


def validate_table_prefix(prefix: object) -> str:
    """A table prefix: 1-49 characters of lowercase ASCII letters, digits and ``_``, not
    starting with a digit (so it is the same identifier quoted or not, in SQLite and
    PostgreSQL). Not a string: ``TypeError``; any other string: ``ValueError``."""
    if not isinstance(prefix, str):
        raise TypeError(f"table_prefix must be a string, got {type(prefix).__name__}")
    if not _TABLE_PREFIX.match(prefix) or len(prefix) > MAX_TABLE_PREFIX:
        raise ValueError(
            f"table_prefix must be 1-{MAX_TABLE_PREFIX} characters of a-z, 0-9 and _, "
            f"not starting with a digit, got {prefix!r}"
        )
    return prefix


def schema_mismatch(where: str, table: str, version: int | None) -> StoreError:
    """The error of a store opened with ``create=False`` on a schema it cannot use."""
    if version is None:
        found = f"has no scope tables (no {table} table)"
    elif version > SCHEMA_VERSION:
        return StoreError(
            f"{where} has schema version {version}, written by a newer scope; this "
            f"version reads schema {SCHEMA_VERSION}: upgrade scope"
        )
    else:
        found = f"has schema version {version}, this scope needs {SCHEMA_VERSION}"
    return StoreError(
        f"{where} {found}: run `scope history migrate --store URL` (or open once with "
        "create=True) as a role allowed to change the schema"
    )


def message_count(data: Any) -> int:
    """How many messages a stored record holds (schema upgrades count them)."""
    tree = orjson.loads(bytes(data))
    if type(tree) is not list:
        raise StoreError("a stored batch record is not a JSON array of messages")
    return len(tree)
