"""``scope history list|show|export|import|clear``."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import pathlib
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, Any, BinaryIO, TextIO, final

import attrs
import orjson

from scope import codec
from scope._documents import check_messages, decode_messages
from scope.chat import Message, Model
from scope.cli._errors import CLIError
from scope.cli._export import export_store, export_version, import_records, parse_export
from scope.cli._render import Progress, render_batches
from scope.cli._stores import CLIStore, closed_as, opened_store, redact_url
from scope.codec import encode_messages
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    InvalidBatchError,
    InvalidConversationIDError,
)
from scope.history import (
    COMPACTION_KEY,
    AppendID,
    Batch,
    ConversationID,
    compact,
)
from scope.historystores import SCHEMA_VERSION

__all__ = [
    "ConversationLine",
    "load_summarizer",
    "ImportLine",
    "clear_conversation",
    "compact_conversation",
    "export_conversations",
    "import_append_id",
    "import_conversations",
    "list_conversations",
    "parse_import",
    "read_import_file",
    "show_conversation",
]


def import_append_id(conversation_id: str) -> AppendID:
    """The append id ``scope history import`` uses for a conversation.

    Derived from the conversation id alone, never from the messages: importing the same
    line twice is a retry of one batch (an equal receipt, nothing appended) and a line
    whose messages changed since is an ``AppendConflictError``, not a second copy.
    """
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()[:32]
    return AppendID(f"import-v1:{digest}")


def _line_conversation_id(value: Any) -> ConversationID:
    if type(value) is ConversationID:
        return value
    if type(value) is not str:  # not a Num: the exact reader's number tokens are str too
        raise InvalidBatchError("conversation_id: expected a string")
    try:
        return ConversationID(value)
    except InvalidConversationIDError as exc:
        raise InvalidBatchError(f"conversation_id: {exc}") from exc


def _line_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


@final
@attrs.frozen
class ConversationLine:
    """One line of ``scope history export`` and of an import file: a conversation and
    its messages, ``{"conversation_id", "messages"}``.

    The messages obey the rules of a history ``Batch`` (at least one, each a complete
    ``Message``), so an import line always becomes a batch (``batch``). Registered with
    the codec: ``scope.codec.from_json(line, ConversationLine)`` decodes one strictly
    (the messages with the one message-document decoder, ``scope._documents``) and
    ``to_json()`` writes the canonical line; bad input raises ``InvalidBatchError``.
    """

    conversation_id: ConversationID = attrs.field(converter=_line_conversation_id)
    messages: tuple[Message, ...] = attrs.field(converter=_line_messages)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the line (construction already did): a valid conversation id and at
        least one message, each a complete ``Message`` (``InvalidBatchError``)."""
        _line_conversation_id(self.conversation_id)
        check_messages(self.messages, InvalidBatchError)

    def to_json(self) -> bytes:
        """The canonical line, without the newline: keys sorted, the messages the
        codec's canonical encoding (byte for byte what a ``Batch`` of them digests, so
        number spellings inside metadata survive)."""
        return orjson.dumps(
            {
                "conversation_id": str(self.conversation_id),
                "messages": orjson.Fragment(encode_messages(self.messages)),
            },
            option=orjson.OPT_SORT_KEYS,
        )

    @classmethod
    def _from_tree(cls, tree: Any) -> ConversationLine:
        if type(tree) is not dict:
            raise InvalidBatchError("expected a JSON object")
        expected = {"conversation_id", "messages"}
        if set(tree) != expected:
            missing = sorted(expected - set(tree))
            unknown = sorted(set(tree) - expected)
            raise InvalidBatchError(
                f"expected the keys conversation_id and messages (missing {missing or 'none'}, "
                f"unknown {unknown or 'none'})"
            )
        cid = _line_conversation_id(tree["conversation_id"])
        return cls(cid, decode_messages(tree["messages"], InvalidBatchError))

    def batch(self, append_id: str) -> Batch:
        """The batch appending this line's messages under ``append_id``."""
        return Batch(self.conversation_id, append_id, self.messages)


codec.register_own(
    ConversationLine, InvalidBatchError, ConversationLine._from_tree, ConversationLine.to_json
)


async def migrate_store(url: str, out: TextIO) -> int:
    """Create the store's schema, or upgrade it to this version's (SQL stores)."""
    async with opened_store(url, create=True):
        pass
    out.write(f"schema of {redact_url(url)} is at version {SCHEMA_VERSION}\n")
    out.flush()
    return 0


def _report_invalid_ids(store: CLIStore, stderr: TextIO) -> int:
    """Name on stderr each stored id the listing skipped as invalid; the exit status:
    1 when there was one, else 0."""
    invalid = store.invalid_conversation_ids
    for raw in invalid:
        stderr.write(
            f"scope: error: skipped stored conversation id {raw!r}: not a valid "
            "conversation id (written outside scope; repair or delete it)\n"
        )
    stderr.flush()
    return 1 if invalid else 0


#: How many ids one listing round trip of ``scope history list`` asks for.
LIST_PAGE = 1000


async def list_conversations(url: str, out: TextIO, *, stderr: TextIO, create: bool = True) -> int:
    """Print every open conversation id, one per line, in lexical order, paging through
    the listing (bounded memory). A stored id that is not valid is skipped and named on
    stderr, after the listing (exit 1)."""
    async with opened_store(url, create=create) as store:
        after: str | None = None
        while page := await store.conversations(after=after, limit=LIST_PAGE):
            for conversation_id in page:
                out.write(f"{conversation_id}\n")
            after = page[-1]
        out.flush()
        return _report_invalid_ids(store, stderr)


def _count_batches(count: int) -> str:
    return "1 batch is" if count == 1 else f"{count} batches are"


async def show_conversation(url: str, conversation_id: str, *, as_json: bool, out: TextIO) -> int:
    """Print one conversation's head path readably, or as one export-format JSON line
    (``inspect`` shows every branch).

    The readable form shows each batch's receipt, a ``batch <append id>  <digest>``
    line before its messages (numbered continuously across batches). The JSON line
    holds the messages.
    """
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        if (await store.read_view(cid)).closed:
            state = await closed_as(store, cid)
            raise CLIError(f"conversation {str(cid)!r} is {state}: no messages")
        batches = await store.read_batches(cid)
        messages = [m for batch in batches for m in batch.messages]
        read_tree = getattr(store, "read_tree", None)  # a store with branches
        elsewhere = len((await read_tree(cid)).batches) if not messages and read_tree else 0
    if elsewhere:
        raise CLIError(
            f"conversation {str(cid)!r} has no messages on its head path (rewound to its "
            f"start); its {_count_batches(elsewhere)} on other "
            "branches: scope history branches lists them"
        )
    if not messages:
        raise CLIError(f"conversation {str(cid)!r} has no messages (unknown)")
    if as_json:
        out.write(ConversationLine(cid, messages).to_json().decode() + "\n")
    else:
        count = len(messages)
        out.write(f"conversation {cid} ({count} message{'s' if count != 1 else ''})\n")
        for line in render_batches(batches):
            out.write(line + "\n")
    out.flush()
    return 0


@contextlib.contextmanager
def _output(path: str | None, stdout: BinaryIO) -> Iterator[IO[bytes]]:
    """``stdout``, or a temporary file renamed over ``path`` only when all went well."""
    if path is None or path == "-":
        yield stdout
        stdout.flush()
        return
    target = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def export_conversations(
    url: str, output: str | None, *, stdout: BinaryIO, stderr: TextIO, create: bool = True
) -> int:
    """Write the whole store in the export format (version 3, see
    ``scope.cli._export``): the header line, the store secret and tombstones (when it
    erased anything), one line per closed conversation, then one line per conversation
    it lists with its whole tree (every branch, the head, the recorded moves), owner and
    retention; a conversation rewound to its start too.

    With ``output`` the file is written to a temporary name and renamed when complete,
    so a failed export never leaves a partial file behind. Nothing is skipped silently:
    a stored conversation id that is not valid, a conversation whose stored records are
    corrupt, or one closed between the listing and its read is named on stderr at the
    end, every other conversation is exported, and the exit status is 1.
    """
    async with opened_store(url, create=create) as store:
        with _output(output, stdout) as sink:
            count, marks, failed = await export_store(store, sink, stderr)
        if output not in (None, "-"):
            also = f" and {marks} tombstone{'s' if marks != 1 else ''}" if marks else ""
            stderr.write(
                f"exported {count} conversation{'s' if count != 1 else ''}{also} to {output}\n"
            )
        stderr.writelines(failed)
        return max(_report_invalid_ids(store, stderr), 1 if failed else 0)


@final
@attrs.frozen
class ImportLine:
    """One validated line of an import file: where it was and the batch it becomes."""

    number: int
    batch: Batch


def _line_error(source: str, number: int, problem: str) -> CLIError:
    return CLIError(f"{source}:{number}: {problem}; nothing was imported")


def _parse_line(source: str, number: int, line: bytes) -> Batch:
    try:
        parsed = codec.from_json(line, ConversationLine)
    except InvalidBatchError as exc:
        raise _line_error(source, number, str(exc)) from None
    return parsed.batch(import_append_id(parsed.conversation_id))


def parse_import(data: bytes, source: str) -> list[ImportLine]:
    """Validate a whole import file: every non-blank line must become a ``Batch``.

    Raises ``CLIError`` naming ``source:line`` for the first bad line (invalid JSON,
    unexpected keys, an invalid message, a conversation given twice); nothing is
    appended by anyone before this returns.
    """
    lines: list[ImportLine] = []
    seen: dict[ConversationID, int] = {}
    for number, raw in enumerate(data.split(b"\n"), 1):
        line = raw.removesuffix(b"\r")
        if not line.strip():
            continue
        batch = _parse_line(source, number, line)
        first = seen.setdefault(batch.conversation_id, number)
        if first != number:
            raise _line_error(
                source,
                number,
                f"conversation {str(batch.conversation_id)!r} already appears on line {first}",
            )
        lines.append(ImportLine(number, batch))
    return lines


async def _import_one(store: CLIStore, batch: Batch) -> bool:
    """Import one batch; True when messages were appended, False when already there."""
    before = await store.read(batch.conversation_id)
    if before[: len(batch.messages)] == list(batch.messages):
        # The stored history already starts with these messages (imported before, or
        # this is the store the file was exported from, perhaps gone on since):
        # appending them would only duplicate them.
        return False
    receipt = await store.append(batch)
    receipt.validate_for(batch)
    after = await store.read(batch.conversation_id)
    return len(after) != len(before)


def read_import_file(path: str, stdin: BinaryIO) -> tuple[bytes, str]:
    """The bytes of an import file (``-``: stdin) and the name errors call it by."""
    if path == "-":
        return stdin.read(), "<stdin>"
    try:
        return pathlib.Path(path).read_bytes(), path
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None


async def import_conversations(
    url: str, data: bytes, source: str, *, stdout: TextIO, stderr: TextIO
) -> int:
    """Import an export file: one of version 3 or 2 (its header line first) restores
    the tombstones and closed conversations, then each conversation's whole tree
    (``scope.cli._export.import_records``); one of the
    old format (``ConversationLine`` lines) appends each line as one batch (see
    ``import_append_id``), as below.

    The whole file is validated before the store is opened. Each batch is atomic; a
    conflict or a closed conversation is reported on its own line and the import goes
    on with the next conversation (exit status 1 at the end). Running the same import
    again is a no-op for every conversation that landed.
    """
    numbered = [
        (number, raw.removesuffix(b"\r"))
        for number, raw in enumerate(data.split(b"\n"), 1)
        if raw.strip()
    ]
    version = export_version(numbered[0][1]) if numbered else None
    if version is not None:
        contents = parse_export(numbered[1:], source, version)
        return await import_records(url, contents, source, stdout=stdout, stderr=stderr)
    lines = parse_import(data, source)
    imported = unchanged = failed = 0
    async with opened_store(url) as store:
        progress = Progress(stderr, "imported", len(lines))
        for item in lines:
            cid = str(item.batch.conversation_id)
            try:
                appended = await _import_one(store, item.batch)
            except AppendConflictError:
                failed += 1
                progress.done()
                stderr.write(
                    f"scope: error: {source}:{item.number}: conversation {cid!r} was imported "
                    "before with other messages (append conflict); nothing appended\n"
                )
            except ConversationClosedError:
                failed += 1
                progress.done()
                state = await closed_as(store, cid)
                stderr.write(
                    f"scope: error: {source}:{item.number}: conversation {cid!r} is {state}; "
                    "nothing appended\n"
                )
            else:
                if appended:
                    imported += 1
                else:
                    unchanged += 1
            progress.step()
        progress.done()
    stdout.write(
        f"imported {imported}, already present {unchanged}, failed {failed} "
        f"(of {len(lines)} conversation{'s' if len(lines) != 1 else ''})\n"
    )
    stdout.flush()
    return 1 if failed else 0


def _confirm(question: str, stdin: TextIO, stderr: TextIO) -> bool:
    """Ask on stderr, read one answer from a terminal stdin; anything but yes is no."""
    try:
        interactive = stdin.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        return False
    stderr.write(f"{question} [y/N] ")
    stderr.flush()
    answer = stdin.readline()
    if not answer.endswith("\n"):  # EOF
        stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


async def clear_conversation(
    url: str, conversation_id: str, *, yes: bool, stdin: TextIO, stdout: TextIO, stderr: TextIO
) -> int:
    """Close a conversation for ever, after confirmation unless ``yes``."""
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        if not yes:
            count = len(await store.read(cid))
            question = (
                f"Clear conversation {str(cid)!r} ({count} message{'s' if count != 1 else ''})? "
                "Its messages are deleted and it can never be written again."
            )
            if not _confirm(question, stdin, stderr):
                raise CLIError(
                    f"not confirmed; conversation {str(cid)!r} was not cleared "
                    "(pass --yes to clear without asking)"
                )
        await store.clear(cid)
    stdout.write(f"cleared conversation {cid}\n")
    stdout.flush()
    return 0


def load_summarizer(spec: str) -> Model:
    """The model ``--summarizer module:attribute`` names: ``attribute`` of the imported
    ``module`` (dots reach into it), a ``Model`` (an object with an async ``call``), or
    a class of one, made without arguments. ``CLIError`` naming what is wrong."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CLIError(
            f"--summarizer {spec!r} must be module:attribute, e.g. scope.testing:offline_summarizer"
        )
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CLIError(f"--summarizer {spec!r}: cannot import {module_name}: {exc}") from None
    for name in attribute.split("."):
        try:
            found = getattr(found, name)
        except AttributeError:
            raise CLIError(f"--summarizer {spec!r}: {module_name} has no {attribute}") from None
    if isinstance(found, type):
        try:
            found = found()
        except Exception as exc:
            raise CLIError(
                f"--summarizer {spec!r}: {found.__name__}() failed: {type(exc).__name__}: {exc}"
            ) from None
    if not inspect.iscoroutinefunction(getattr(found, "call", None)):
        raise CLIError(
            f"--summarizer {spec!r} is a {type(found).__name__}, not a scope.chat Model (an "
            "object with an async call(request))"
        )
    return found  # type: ignore[no-any-return]


async def compact_conversation(
    url: str, conversation_id: str, summarizer: Model, *, keep_turns: int, out: TextIO
) -> int:
    """``scope history compact``: ``scope.history.compact`` on a stored conversation."""
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        try:
            receipt = await compact(store, cid, summarizer, keep_turns=keep_turns)
        except ConversationClosedError:
            state = await closed_as(store, cid)
            raise CLIError(f"conversation {str(cid)!r} is {state}: nothing to compact") from None
        if receipt is None:
            out.write(
                f"nothing to compact in conversation {cid}: it has at most {keep_turns} "
                f"turn{'s' if keep_turns != 1 else ''} since its last compaction\n"
            )
        else:
            covers = next(
                m.metadata.decode(COMPACTION_KEY)["covers"]
                for m in reversed(await store.read(cid))
                if COMPACTION_KEY in m.metadata
            )
            out.write(
                f"compacted conversation {cid}: a summary of its first {covers} messages "
                f"was appended (batch {receipt.id}); the transcript is unchanged\n"
            )
    out.flush()
    return 0
