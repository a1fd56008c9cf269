"""``scope history verify``: check every stored batch record, read-only."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, TextIO

from scope.cli._branches import chain_problems
from scope.cli._render import Progress, safe
from scope.cli._stores import opened_store
from scope.errors import InvalidConversationIDError, StoreError
from scope.history import ConversationID

__all__ = ["verify_store"]


def _plural(count: int, word: str) -> str:
    """``1 batch``, ``2 batches``, ``2 conversations``."""
    plural = word + ("es" if word.endswith("ch") else "s")
    return f"{count} {word if count == 1 else plural}"


def _bad_line(conversation_id: str, bad: list[str], what: str = "bad batch") -> str:
    """One ``scope: error:`` line naming every bad record (or path: ``what``) of one
    conversation (``bad``: each one's label and problem)."""
    found = "; ".join(bad)
    many = f"{_plural(len(bad), what)}: " if len(bad) > 1 else ""
    return safe(f"scope: error: conversation {str(conversation_id)!r}: {many}{found}")


async def _path_problems(store: Any, conversation_id: str) -> list[str] | StoreError:
    """The chain problems of every path of a conversation whose records are sound
    (``chain_problems``); none for a store without branches (no ``read_tree``) or an id
    a read would refuse (already named); the ``StoreError`` when its tree cannot be read
    (a role that may read records but not run the store's tree read, say)."""
    read_tree = getattr(store, "read_tree", None)
    if not inspect.iscoroutinefunction(read_tree):
        return []
    try:
        cid = ConversationID(conversation_id)
    except InvalidConversationIDError:
        return []
    try:
        tree = await read_tree(cid)
    except StoreError as exc:
        return exc
    return chain_problems(tree)


async def verify_store(
    url: str,
    conversation_ids: Sequence[str],
    *,
    stdout: TextIO,
    stderr: TextIO,
    page_size: int = 100,
) -> int:
    """Check every stored batch record of the store (or of ``conversation_ids``) as a
    read checks it (``StoredRecord.problem``), going on past bad ones, and the chain
    digest of every path (branch) of each conversation whose records are sound
    (``chain_problems``: recomputed from the messages, compared with the chain of the
    stored digests). A conversation whose tree this handle cannot read (``StoreError``:
    a role allowed to read records only) gets one ``scope: warning:`` line and is
    counted as not checked in the summary, not as bad.

    The store is opened with ``create=False`` and only read (``scan_records``), so a
    role that may only ``SELECT`` runs it; records are streamed ``page_size`` at a time.
    Each conversation with a bad record gets one ``scope: error:`` line on stderr
    (its id, then each bad batch and what failed), a named conversation without stored
    batches one too; the summary goes to stdout. Exit status 1 when anything was
    wrong, else 0."""
    batches = conversations = bad_batches = bad_paths = 0
    bad_conversations: list[str] = []
    unchecked: list[str] = []  # sound records, but a tree this handle cannot read
    seen: set[str] = set()
    async with opened_store(url, create=False) as store:
        progress = Progress(stderr, "verified batches")
        current: str | None = None
        bad: list[str] = []  # texts only: no record's bytes are kept

        async def finish() -> None:
            nonlocal bad_paths
            if current is None:
                return
            what = "bad batch"
            if not bad:  # sound records: check the chain of every path
                paths = await _path_problems(store, current)
                if isinstance(paths, StoreError):
                    progress.done()
                    stderr.write(
                        safe(
                            f"scope: warning: conversation {str(current)!r}: its paths "
                            f"were not checked: its tree cannot be read ({paths})"
                        )
                        + "\n"
                    )
                    unchecked.append(current)
                    return
                bad.extend(paths)
                bad_paths += len(bad)
                what = "bad path"
            if bad:
                progress.done()
                stderr.write(_bad_line(current, bad, what) + "\n")
                stderr.flush()
                bad_conversations.append(current)

        async for record in store.scan_records(conversation_ids or None, page_size=page_size):
            if record.conversation_id != current:
                await finish()
                current, bad = record.conversation_id, []
                conversations += 1
                seen.add(current)
            batches += 1
            problem = record.problem()
            if problem is not None:
                bad.append(f"{record.label}: {problem}")
                bad_batches += 1
            progress.step()
        await finish()
        progress.done()
    missing = [cid for cid in dict.fromkeys(conversation_ids) if cid not in seen]
    for cid in missing:
        stderr.write(safe(f"scope: error: conversation {str(cid)!r} has no stored batches\n"))
    stderr.flush()
    summary = f"verified {_plural(batches, 'batch')} in {_plural(conversations, 'conversation')}: "
    if bad_batches or bad_paths:
        found = [
            _plural(count, what)
            for count, what in ((bad_batches, "bad batch"), (bad_paths, "bad path"))
            if count
        ]
        summary += f"{' and '.join(found)} in {_plural(len(bad_conversations), 'conversation')}"
    else:
        summary += "all sound"
    if missing:
        summary += f"; {_plural(len(missing), 'named conversation')} not found"
    if unchecked:
        summary += f"; the paths of {_plural(len(unchecked), 'conversation')} not checked"
    stdout.write(summary + "\n")
    stdout.flush()
    return 1 if bad_batches or bad_paths or missing else 0
