"""``scope history erase``, ``scope history expire`` and ``scope history verify
--erased``: retention and erasure from the command line (DESIGN §6i)."""

from __future__ import annotations

import sys
from typing import Any, BinaryIO, TextIO

from scope.cli._errors import CLIError
from scope.cli._render import safe
from scope.cli._stores import opened_store
from scope.errors import InvalidReceiptError
from scope.history import ConversationID, ErasureReceipt, erase, erase_owner

__all__ = [
    "check_receipts",
    "erase_command",
    "expire_all",
    "expire_command",
    "parse_receipts",
    "read_receipt_file",
    "verify_erased",
]

#: The page size ``expire`` removes at a time when no ``--limit`` is given.
EXPIRE_PAGE = 1000


def _needs(store: Any, name: str) -> None:
    """``CLIError`` when ``store`` has no ``name`` step (a store of an older scope)."""
    if not callable(getattr(store, name, None)):
        raise CLIError(f"this store ({type(store).__name__}) cannot {name.replace('_', ' ')}")


def _confirm(question: str, stdin: TextIO, stderr: TextIO) -> bool:
    from scope.cli._history import _confirm as confirm

    return confirm(question, stdin, stderr)


async def erase_command(
    url: str,
    conversation_id: str | None,
    owner: str | None,
    *,
    yes: bool,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Erase one conversation (``conversation_id``) or every conversation of ``owner``,
    after confirmation on a terminal unless ``yes``; each receipt is printed on stdout as
    one canonical JSON line (keep them: ``scope history verify --erased FILE`` checks
    them later)."""
    async with opened_store(url) as store:
        return await erase_in(
            store, conversation_id, owner, yes=yes, stdin=stdin, stdout=stdout, stderr=stderr
        )


async def erase_in(
    store: Any,
    conversation_id: str | None,
    owner: str | None,
    *,
    yes: bool,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """``erase_command`` on an open store."""
    if (conversation_id is None) == (owner is None):
        raise CLIError("name one CONVERSATION or --owner OWNER to erase")
    _needs(store, "erase" if owner is None else "erase_owned")
    if conversation_id is not None:
        cid = ConversationID(conversation_id)
        what = f"conversation {str(cid)!r}"
        if not yes:
            count = len(await store.read(cid))
            what += f" ({count} message{'s' if count != 1 else ''} on its current branch)"
    else:
        assert owner is not None
        what = f"every conversation of owner {owner!r}"
        if not yes:
            count = len(await store.conversations(owner=owner))
            what += f" ({count} open, and any cleared or expired ones)"
    if not yes and not _confirm(
        f"Erase {safe(what)}? Every batch of every branch is deleted and the id is closed "
        "for ever; only a keyed hash of it remains.",
        stdin,
        stderr,
    ):
        raise CLIError("not confirmed; nothing was erased (pass --yes to erase without asking)")
    if conversation_id is not None:
        receipts = [await erase(store, conversation_id)]
    else:
        assert owner is not None
        receipts = await erase_owner(store, owner)
    for receipt in receipts:
        stdout.write(receipt.to_json().decode() + "\n")
    stdout.flush()
    if owner is not None:
        stderr.write(f"erased {len(receipts)} conversation{'s' if len(receipts) != 1 else ''}\n")
        stderr.flush()
    return 0


async def expire_all(store: Any, limit: int | None) -> int:
    """Remove expired conversations: at most ``limit`` (one ``expire`` call), or all of
    them (``EXPIRE_PAGE`` at a time) when ``limit`` is None; how many were removed."""
    _needs(store, "expire")
    if limit is not None:
        return int(await store.expire(limit=limit))
    total = 0
    while True:
        removed = int(await store.expire(limit=EXPIRE_PAGE))
        total += removed
        if removed < EXPIRE_PAGE:
            return total


async def expire_command(url: str, limit: int | None, *, stdout: TextIO) -> int:
    """``scope history expire``: remove expired conversations and say how many."""
    async with opened_store(url) as store:
        removed = await expire_all(store, limit)
    stdout.write(f"expired {removed} conversation{'s' if removed != 1 else ''}\n")
    stdout.flush()
    return 0


def read_receipt_file(path: str, stdin: BinaryIO | None = None) -> tuple[bytes, str]:
    """The bytes of the receipt file ``path`` (``-``: stdin) and its name for messages;
    ``CLIError`` when it cannot be read."""
    if path == "-":
        return (stdin or sys.stdin.buffer).read(), "<stdin>"
    try:
        with open(path, "rb") as file:
            return file.read(), path
    except OSError as exc:
        raise CLIError(f"cannot read the receipt file {path!r}: {exc.strerror or exc}") from None


def parse_receipts(data: bytes, source: str) -> list[ErasureReceipt]:
    """The receipts of a file: one JSON receipt per non-empty line (what ``scope history
    erase`` prints); ``CLIError`` naming the line of the first invalid one, or an empty
    file."""
    receipts: list[ErasureReceipt] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            receipts.append(ErasureReceipt.from_json(line))
        except InvalidReceiptError as exc:
            raise CLIError(f"{source}, line {number}: {exc}") from None
    if not receipts:
        raise CLIError(f"{source} holds no erasure receipt")
    return receipts


async def check_receipts(
    store: Any, receipts: list[ErasureReceipt], *, stdout: TextIO, stderr: TextIO
) -> int:
    """Check each receipt against ``store`` (``check_erased``): one ``scope: error:``
    line per problem on stderr, a summary on stdout; 1 when anything is wrong."""
    _needs(store, "check_erased")
    bad = 0
    for receipt in receipts:
        problems = await store.check_erased(receipt)
        for problem in problems:
            stderr.write(safe(f"scope: error: receipt {receipt.tombstone}: {problem}") + "\n")
        bad += bool(problems)
    stderr.flush()
    count = len(receipts)
    noun = f"erasure receipt{'s' if count != 1 else ''}"
    if bad:
        stdout.write(f"{bad} of {count} {noun} not proven\n")
    else:
        stdout.write(f"{count} {noun} verified: no residue\n")
    stdout.flush()
    return 1 if bad else 0


async def verify_erased(
    url: str, path: str, *, stdin: BinaryIO | None = None, stdout: TextIO, stderr: TextIO
) -> int:
    """``scope history verify --erased FILE``: read-only (the store is opened with
    ``create=False``)."""
    data, source = read_receipt_file(path, stdin)
    receipts = parse_receipts(data, source)
    async with opened_store(url, create=False) as store:
        return await check_receipts(store, receipts, stdout=stdout, stderr=stderr)
