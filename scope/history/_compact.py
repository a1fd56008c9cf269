"""``compact``: summarise the older part of a conversation as one fenced append (DESIGN §6d)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Final

import anyio

from scope.chat import (
    Message,
    Model,
    PartKind,
    Request,
    Response,
    Role,
    system_message,
    text_part,
    user_message,
)
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidResponseError,
)
from scope.history._batch import Batch, Receipt
from scope.history._ids import AppendID, ConversationID
from scope.history._protocols import ViewReader, Writer
from scope.history._turns import COMPACTION_KEY, project
from scope.history._view import HistoryView

__all__ = ["DEFAULT_INSTRUCTIONS", "compact", "compaction_append_id"]

#: How many times ``compact`` reads, summarises and appends before it gives up when the
#: conversation changed under it every time.
ATTEMPTS: Final = 8

#: The pause before the second attempt, in seconds; it doubles per attempt up to
#: ``BACKOFF_CAP`` (see ``backoff_delay``).
BACKOFF_FIRST: Final = 0.02
BACKOFF_CAP: Final = 1.0

#: What the summarizer is told when ``instructions`` is None.
DEFAULT_INSTRUCTIONS: Final = (
    "You condense conversations so that they can continue without their full text. "
    "The user sends the transcript of the earlier part of a conversation (it may start "
    "with the summary of an even earlier part). Write one summary of all of it, in the "
    "language of the conversation: the facts, names, numbers, decisions and preferences "
    "stated, what the tools returned that still matters, and what is open or was "
    "promised. Write only the summary, in plain prose or short lists, without a preamble."
)


def backoff_delay(retry: int, jitter: float) -> float:
    """The pause before retry number ``retry`` (1 for the second attempt): ``d =
    min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (retry - 1))``, of which half is fixed and
    half scaled by ``jitter`` (a number in [0, 1), random per pause), so the pause lies
    in [d/2, d): compactions and turns that raced once spread apart, and a burst of
    turns has time to pass."""
    delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** (retry - 1))
    return delay / 2 + delay / 2 * jitter


def compaction_append_id(conversation_id: str, boundary: int, head: str = "") -> AppendID:
    """The append id of the compaction of ``conversation_id`` at ``boundary`` (the
    number of stored messages it covers) after the head ``head`` (the append id of the
    batch it follows; DESIGN §6h): derived from all three, so concurrent compactions of
    one view land one message, and a compaction of another branch that reaches the same
    boundary (after a rewind) is a batch of its own, not a retry of this one (append
    ids are unique across every branch)."""
    key = f"{conversation_id}\x00{boundary}" + (f"\x00{head}" if head else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return AppendID(f"compact-v1:{digest}")


async def compact(
    store: object,
    conversation_id: str,
    summarizer: Model,
    *,
    keep_turns: int = 2,
    instructions: str | None = None,
) -> Receipt | None:
    """Summarise everything before the last ``keep_turns`` turns as one appended message.

    - ``store``: a store that is a ``ViewReader`` and a ``Writer`` (every bundled store).
    - ``conversation_id``: the conversation.
    - ``summarizer``: any ``Model``; it receives ``instructions`` as a system message
      and the transcript to summarise as one user message (text; reasoning left out,
      media named by type), never the provider state of the stored turns.
    - ``keep_turns``: whole turns kept verbatim after the boundary (an int >= 0),
      default 2.
    - ``instructions``: the summarizer's system prompt, default
      ``DEFAULT_INSTRUCTIONS``.

    It reads a view of the conversation, puts the boundary at the start of the
    ``keep_turns``-th newest turn after the newest compaction, and asks ``summarizer``
    for a summary of the merged system message (the previous summary included) and the
    turns before the boundary. Then it appends one fenced batch
    (``expected_length`` = the view's length, ``expected_head`` = its head; append id
    ``compaction_append_id``)
    holding one system message with the summary text and the metadata
    ``scope/compaction`` = ``{"covers": <boundary>}``. Nothing is rewritten: ``read()``
    still returns every stored message; ``WindowReader`` replays the summary in place
    of what it covers.

    Returns the receipt, or None when there is nothing to compact (fewer than
    ``keep_turns + 1`` turns since the newest compaction). When a turn lands during
    the summarizer call (``HistoryChangedError``) or a concurrent compaction of the same
    boundary landed a different summary (``AppendConflictError``), it pauses, reads the
    view again and starts over: the boundary is recomputed (and a concurrent
    compaction's summary counts as done). The pauses back off with jitter (20 ms
    doubling to 1 s, each between half and all of that: ``backoff_delay``), at most 8
    attempts (so at most 8 summarizer calls); then the last of those errors is raised,
    its message naming the attempts and what raced each (the length the batch expected
    and the length found).
    A closed conversation raises ``ConversationClosedError`` before the summarizer is
    called; the summarizer's errors propagate, and an answer without text raises
    ``InvalidResponseError``, nothing appended. Invalid arguments raise ``TypeError``
    (``store``, ``summarizer``) or ``ValueError`` (``keep_turns``, ``instructions``;
    ``InvalidConversationIDError`` for the id) before any I/O. Cancellation propagates
    unchanged; a cancelled append lands all or nothing, and calling ``compact`` again
    settles it.
    """
    if not isinstance(store, ViewReader) or not isinstance(store, Writer):
        raise TypeError(
            "compact needs a store that is a scope.history.ViewReader and Writer (every "
            f"bundled store is), got {type(store).__name__}"
        )
    if not callable(getattr(summarizer, "call", None)):
        raise TypeError(
            f"compact's summarizer must be a scope.chat.Model (an object with an async "
            f"call(request)), got {type(summarizer).__name__}"
        )
    if type(keep_turns) is not int or keep_turns < 0:
        raise ValueError(f"compact's keep_turns must be an int >= 0, got {keep_turns!r}")
    if instructions is not None and (type(instructions) is not str or not instructions.strip()):
        raise ValueError(
            f"compact's instructions must be None or a non-blank str, got {instructions!r}"
        )
    cid = ConversationID(conversation_id)
    prompt = DEFAULT_INSTRUCTIONS if instructions is None else instructions
    failure: HistoryChangedError | AppendConflictError | None = None
    races: list[str] = []  # what raced each attempt, for the error when all did
    for attempt in range(ATTEMPTS):
        if attempt:
            await anyio.sleep(backoff_delay(attempt, random.random()))
        view = await store.read_view(cid)
        if not isinstance(view, HistoryView):
            raise TypeError(f"read_view returned {type(view).__name__}, not a HistoryView")
        if view.closed:
            raise ConversationClosedError(
                f"conversation {str(cid)!r} is closed (cleared, expired or erased): "
                "nothing to compact"
            )
        projection = project(None, cid, view.messages)
        turns = projection.turns
        if len(turns) <= keep_turns:
            return None
        cut = len(turns) - keep_turns
        boundary = projection.starts[cut] if keep_turns else len(view.messages)
        older: list[Message] = [] if projection.system is None else [projection.system]
        for turn in turns[:cut]:
            older.extend(turn)
        summary = await _summarise(summarizer, prompt, older)
        batch = Batch(
            cid,
            compaction_append_id(cid, boundary, view.head),
            [
                Message(
                    Role.SYSTEM,
                    [text_part(summary)],
                    {COMPACTION_KEY: {"covers": boundary}},
                )
            ],
            expected_length=view.length,
            expected_head=view.fence_head,
        )
        try:
            receipt = await store.append(batch)
        except HistoryChangedError as exc:
            failure = exc
            if exc.expected == exc.actual and exc.expected_head != exc.actual_head:
                # The same length on another branch (a rewind, then a turn).
                races.append(f"expected head {exc.expected_head!r}, found {exc.actual_head!r}")
            else:
                races.append(f"expected {exc.expected} messages, found {exc.actual}")
            continue
        except AppendConflictError as exc:
            failure = exc
            races.append(f"another summary of the first {boundary} messages landed first")
            continue
        if not isinstance(receipt, Receipt):
            raise TypeError(f"append returned {type(receipt).__name__}, not a Receipt")
        receipt.validate_for(batch)
        return receipt
    assert failure is not None
    raise _gave_up(cid, races, failure) from failure


def _gave_up(
    cid: ConversationID, races: list[str], last: HistoryChangedError | AppendConflictError
) -> HistoryChangedError | AppendConflictError:
    """The error ``compact`` raises when every attempt raced another append: the type
    of the ``last`` failure (its attributes kept), the message naming every attempt."""
    error: HistoryChangedError | AppendConflictError = (
        HistoryChangedError(
            last.expected,
            last.actual,
            last.conversation_id,
            expected_head=last.expected_head,
            actual_head=last.actual_head,
        )
        if isinstance(last, HistoryChangedError)
        else AppendConflictError()
    )
    raced = "; ".join(f"#{n}: {race}" for n, race in enumerate(races, 1))
    error.args = (
        f"compact of conversation {str(cid)!r} gave up after {len(races)} attempts, each "
        f"raced by an append that landed while the summary was made ({raced}); nothing "
        "was appended: call compact again when the conversation is quieter",
    )
    return error


async def _summarise(summarizer: Model, prompt: str, messages: Sequence[Message]) -> str:
    request = Request([system_message(prompt), user_message(transcript(messages))])
    response = await summarizer.call(request)
    if not isinstance(response, Response):
        raise InvalidResponseError(
            f"the summarizer returned {type(response).__name__}, not a Response"
        )
    text = response.text.strip()
    if not text:
        raise InvalidResponseError("the summarizer's answer has no text: nothing to store")
    return text


def transcript(messages: Sequence[Message]) -> str:
    """The messages as plain text for a summarizer: one block per message headed by its
    role; tool calls and results spelled out, media and provider-native items named by
    type, reasoning left out (it is provider state, and not part of what was said)."""
    blocks: list[str] = []
    for message in messages:
        lines: list[str] = []
        for part in message.parts:
            kind = part.kind
            if kind is PartKind.TEXT:
                lines.append(part.text)
            elif kind is PartKind.MEDIA:
                assert part.media is not None
                lines.append(f"[media: {part.media.mime}]")
            elif kind is PartKind.TOOL_CALL:
                call = part.tool_call
                assert call is not None
                lines.append(f"[tool call {call.name} (id {call.id})] {call.arguments}")
            elif kind is PartKind.TOOL_RESULT:
                result = part.tool_result
                assert result is not None
                error = " error" if result.is_error else ""
                output = result.output.text()
                body = output if output is not None else "[media]"
                lines.append(f"[tool{error} result {result.name} (id {result.id})] {body}")
            elif kind is PartKind.NATIVE:
                native = part.native
                assert native is not None
                lines.append(f"[{native.provider} {native.type}]")
        if lines:
            blocks.append(f"{message.role}:\n" + "\n".join(lines))
    return "\n\n".join(blocks) if blocks else "(empty)"
