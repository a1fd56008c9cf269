"""``scope history verify``: check every stored batch record, read-only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from scope.cli._render import Progress, safe
from scope.cli._stores import opened_store

__all__ = ["verify_store"]


def _plural(count: int, word: str) -> str:
    """``1 batch``, ``2 batches``, ``2 conversations``."""
    plural = word + ("es" if word.endswith("ch") else "s")
    return f"{count} {word if count == 1 else plural}"


def _bad_line(conversation_id: str, bad: list[str]) -> str:
    """One ``scope: error:`` line naming every bad record of one conversation (``bad``:
    each one's label and problem)."""
    found = "; ".join(bad)
    many = f"{_plural(len(bad), 'bad batch')}: " if len(bad) > 1 else ""
    return safe(f"scope: error: conversation {str(conversation_id)!r}: {many}{found}")


async def verify_store(
    url: str,
    conversation_ids: Sequence[str],
    *,
    stdout: TextIO,
    stderr: TextIO,
    page_size: int = 100,
) -> int:
    """Check every stored batch record of the store (or of ``conversation_ids``) as a
    read checks it (``StoredRecord.problem``), going on past bad ones.

    The store is opened with ``create=False`` and only read (``scan_records``), so a
    role that may only ``SELECT`` runs it; records are streamed ``page_size`` at a time.
    Each conversation with a bad record gets one ``scope: error:`` line on stderr
    (its id, then each bad batch and what failed), a named conversation without stored
    batches one too; the summary goes to stdout. Exit status 1 when anything was
    wrong, else 0."""
    batches = conversations = bad_batches = 0
    bad_conversations: list[str] = []
    seen: set[str] = set()
    async with opened_store(url, create=False) as store:
        progress = Progress(stderr, "verified batches")
        current: str | None = None
        bad: list[str] = []  # texts only: no record's bytes are kept

        def finish() -> None:
            if current is not None and bad:
                progress.done()
                stderr.write(_bad_line(current, bad) + "\n")
                stderr.flush()
                bad_conversations.append(current)

        async for record in store.scan_records(conversation_ids or None, page_size=page_size):
            if record.conversation_id != current:
                finish()
                current, bad = record.conversation_id, []
                conversations += 1
                seen.add(current)
            batches += 1
            problem = record.problem()
            if problem is not None:
                bad.append(f"{record.label}: {problem}")
                bad_batches += 1
            progress.step()
        finish()
        progress.done()
    missing = [cid for cid in dict.fromkeys(conversation_ids) if cid not in seen]
    for cid in missing:
        stderr.write(safe(f"scope: error: conversation {str(cid)!r} has no stored batches\n"))
    stderr.flush()
    summary = f"verified {_plural(batches, 'batch')} in {_plural(conversations, 'conversation')}: "
    if bad_batches:
        summary += (
            f"{_plural(bad_batches, 'bad batch')} in "
            f"{_plural(len(bad_conversations), 'conversation')}"
        )
    else:
        summary += "all sound"
    if missing:
        summary += f"; {_plural(len(missing), 'named conversation')} not found"
    stdout.write(summary + "\n")
    stdout.flush()
    return 1 if bad_batches or missing else 0
