"""Opening the history store a ``--store URL`` names, and the default store locations."""

from __future__ import annotations

import contextlib
import os
import pathlib
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import TypeAlias

from scope.cli._errors import CLIError
from scope.errors import StoreError
from scope.history import Store
from scope.historystores import PersistentStore, open_store

__all__ = [
    "CLIStore",
    "chat_store_url",
    "check_sqlite_location",
    "closed_as",
    "open_cli_store",
    "opened_store",
    "prepare_sqlite_parent",
    "sqlite_url",
]

#: Environment variable naming the store ``scope chat`` and ``scope history`` use when
#: ``--store`` is not given.
STORE_ENV = "SCOPE_STORE"


#: What the command line needs of a store: Store + Lister, closed with ``aclose()``.
CLIStore: TypeAlias = PersistentStore


def sqlite_url(path: os.PathLike[str] | str) -> str:
    """The ``sqlite:///`` URL of a database file, made absolute (``sqlite:////abs/path``:
    the path follows the three slashes of the empty authority)."""
    return "sqlite:///" + urllib.parse.quote(str(pathlib.Path(path).resolve()))


def chat_store_url(environ: Mapping[str, str]) -> str:
    """``$SCOPE_STORE``, else the SQLite file ``$XDG_DATA_HOME/scope/chat.sqlite3``
    (``~/.local/share/scope/chat.sqlite3`` without ``XDG_DATA_HOME``)."""
    if environ.get(STORE_ENV):
        return environ[STORE_ENV]
    data_home = environ.get("XDG_DATA_HOME") or ""
    base = (
        pathlib.Path(data_home)
        if os.path.isabs(data_home)  # the XDG spec says: ignore a relative value
        else pathlib.Path.home() / ".local" / "share"
    )
    return sqlite_url(base / "scope" / "chat.sqlite3")


def _sqlite_file(url: str) -> pathlib.Path | None:
    """The file a ``sqlite:`` URL names (as ``open_store`` reads it), else None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() == "sqlite" and not parts.netloc and len(parts.path) > 1:
        return pathlib.Path(urllib.parse.unquote(parts.path)[1:])
    return None


def check_sqlite_location(url: str, *, must_exist: bool) -> None:
    """Refuse, with a ``CLIError`` naming the path, a ``sqlite:`` URL whose directory is
    missing or, with ``must_exist`` (commands that only read), whose file is missing: a
    mistyped path must not become a new, empty store. Other URLs pass unchecked."""
    path = _sqlite_file(url)
    if path is None:
        return
    where = path.absolute()
    if not where.parent.is_dir():
        raise CLIError(
            f"directory {str(where.parent)!r} does not exist (for the SQLite file {str(path)!r})"
        )
    if must_exist and not where.exists():
        raise CLIError(
            f"no SQLite store at {str(where)!r}: the file does not exist (reading commands "
            "never create one; check the path, or create it with scope history migrate)"
        )


def prepare_sqlite_parent(url: str) -> None:
    """Create the parent directory of a ``sqlite:`` URL's file when it is missing."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() == "sqlite" and not parts.netloc and len(parts.path) > 1:
        path = pathlib.Path(urllib.parse.unquote(parts.path)[1:])
        path.parent.mkdir(parents=True, exist_ok=True)


async def open_cli_store(url: str, *, create: bool = True) -> CLIStore:
    """Open the store ``url`` names (``sqlite:///path``, ``postgresql://…``,
    ``redis://…``).

    A malformed URL raises ``ValueError``; a missing driver ``ImportError``; an
    unreachable server the store's ``StoreError``.
    """
    return await open_store(url, create=create)


def redact_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


@contextlib.asynccontextmanager
async def opened_store(url: str, *, create: bool = True) -> AsyncIterator[CLIStore]:
    """``open_cli_store(url)``, closed on every path."""
    store = await open_cli_store(url, create=create)
    try:
        yield store
    finally:
        await store.aclose()


async def closed_as(store: Store, conversation_id: str) -> str:
    """How a closed conversation was closed, the word the command line prints:
    ``cleared``, ``expired`` or ``erased`` (``Store.read_meta``'s ``closure``);
    ``closed`` when the store cannot say (its meta cannot be read, or it reads open
    again: a race)."""
    try:
        closure = (await store.read_meta(conversation_id)).closure
    except StoreError:
        return "closed"
    return closure or "closed"
