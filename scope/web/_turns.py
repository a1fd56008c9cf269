"""Running what a chat request asks for on a ``Conversation`` (DESIGN §6h): a new turn,
an edited message, a regenerated answer.

The server's store owns the history; a request only names what to do. A client knows
its messages by the ids it gave them, so every user message a request brings is stored
with its id (message metadata ``CLIENT_MESSAGE_ID_KEY``), and a later request naming
that id finds its turn on the stored head path:

- AI SDK ``submit-message`` without ``messageId``: a new turn.
- ``submit-message`` with ``messageId`` (``sendMessage({messageId})``: an edit): the
  turn whose user message has that id is replaced (``Conversation.stream_edit``).
- ``regenerate-message`` (``regenerate()``): the request ends with the question to
  answer again (the client drops the answer); the turn whose user message has that
  message's id is answered again (``Conversation.stream_regenerate``), with the stored
  question, not the client's copy.
- AG-UI: a run whose earlier user messages are the stored ones is a new turn; one whose
  earlier user messages stop short of the stored ones is refused, unless the service
  opts in (``on_divergence="edit"``): then it is an edit of the first turn the run
  lacks when its new message names that turn's message (its id), and a new turn
  otherwise (a client that sends less than the whole thread); every other divergence is
  refused.

A resent request (the browser posts the same body again: a dropped connection, a
retry) is recognised by the same ids: a new message whose client id is already stored
is never stored a second time. When it is the stored head turn, with the same content,
the request gets that turn again, replayed from the store (no model call); a turn kept
unfinished (``keep_interrupted``) is answered again in place (``stream_regenerate``);
anything else (the id stored with other content, on another branch, or with turns after
it) is a ``HistoryDivergedError``. A new turn is fenced by the head read here, so a
resend that overlaps the first request (``on_overlap="wait"``) finds the first one's
turn stored when its turn may start, and replays it instead of calling the model.

An id the head path does not hold, and a refused divergence, raise
``HistoryDivergedError`` (answer 409) before any model call and before anything moves;
a closed chat (cleared, erased or expired) found by that read raises
``ConversationClosedError`` (answer 410).
Each rewind is fenced by the head these functions read, so a turn that lands in between
makes the turn's stream fail with ``HistoryChangedError`` instead of editing the wrong
turn.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Final, Literal

from scope.chat import FinishReason, Message, Output, Response, Role, ToolCall
from scope.conversation import Conversation, TurnEvent, TurnEventKind, TurnResult
from scope.errors import (
    ConversationClosedError,
    HistoryChangedError,
    HistoryDivergedError,
    NotPendingError,
    StoreError,
)
from scope.history import Batch, HistoryTree
from scope.metadata import Metadata
from scope.web._agui import AGUIRunInput
from scope.web._request import CLIENT_MESSAGE_ID_KEY, REGENERATE, ToolApproval
from scope.web._ui import UIChatRequest

__all__ = ["agui_turn", "ui_turn"]

OnDivergence = Literal["refuse", "edit"]
_DIVERGENCE: Final = ("refuse", "edit")

#: The history's mark on a turn kept unfinished (``keep_interrupted``, DESIGN §6c).
_INTERRUPTED_KEY: Final = "scope/interrupted"
#: The history's mark on a turn that waits for approval (``requires_approval``): the
#: ids of the calls of its last assistant message that wait.
_APPROVAL_KEY: Final = "scope/approval"
#: The mark of the user message that sent an answer back (``output_retries``): its batch
#: continues the turn before it, and the client never held that message.
_OUTPUT_RETRY_KEY: Final = "scope/output_retry"
#: The mark of the tool-result part that answers a denied call (``Conversation.deny``):
#: the reason given.
_DENIED_KEY: Final = "scope/denied"
#: How many times a new turn whose fence found another turn stored (before its model
#: was called) reads the conversation again and decides anew.
_ATTEMPTS: Final = 8

_Events = AsyncGenerator[TurnEvent[Any], None]

#: The reason a denied call's model is told when the client gave none.
DENIED_WITHOUT_REASON: Final = "denied by the user"


def _denied(metadata: Metadata) -> str | None:
    """The reason a tool-result part's call was denied, or None (not denied, or stored
    before the mark existed)."""
    mark = metadata.get(_DENIED_KEY)
    if mark is None:
        return None
    reason = mark.value()
    return reason if isinstance(reason, str) else None


def _stamped(message: Message, client_id: str | None) -> Message:
    """``message`` carrying the client's id for it (nothing else changes)."""
    if client_id is None:
        return message
    return Message(
        message.role, message.parts, message.metadata.merge({CLIENT_MESSAGE_ID_KEY: client_id})
    )


def _client_id(message: Message) -> str | None:
    if CLIENT_MESSAGE_ID_KEY not in message.metadata:
        return None
    value = message.metadata.decode(CLIENT_MESSAGE_ID_KEY)
    return value if isinstance(value, str) else None


def _check(conversation: object, request: object, wanted: type, name: str) -> Conversation:
    if not isinstance(conversation, Conversation):
        raise TypeError(
            f"conversation must be a scope.conversation.Conversation, got "
            f"{type(conversation).__name__}"
        )
    if not isinstance(request, wanted):
        raise TypeError(
            f"{name} must be a scope.web.{wanted.__name__}, got {type(request).__name__}"
        )
    return conversation


async def _read_tree(conversation: Conversation) -> HistoryTree:
    """The conversation's tree of batches (one read); ``ConversationClosedError`` for a
    closed conversation."""
    store: Any = conversation.store
    read_tree = getattr(store, "read_tree", None)
    if not inspect.iscoroutinefunction(read_tree):
        raise TypeError(
            "ui_turn and agui_turn need a store with branches (a scope.history.Store: "
            f"async read_tree, read_view, move_head; every bundled store), got "
            f"{type(store).__name__}"
        )
    cid = conversation.conversation_id
    tree: HistoryTree = await read_tree(cid)
    if tree.closed:
        # Nothing a request asks can run on a closed chat: say so before any event (a
        # service answers 410), not as an edit of a turn it cannot find or a stream error;
        # name what closed it (cleared, expired, erased) when the store can say.
        state = "closed"
        read_meta = getattr(store, "read_meta", None)
        if inspect.iscoroutinefunction(read_meta):
            with contextlib.suppress(StoreError):
                state = (await read_meta(cid)).closure or state
        raise ConversationClosedError(
            f"chat {str(cid)!r} is {state}: it takes no new turn; start a new chat"
        )
    return tree


def _head(batches: Sequence[Batch]) -> str:
    return str(batches[-1].id) if batches else ""


def _user_turns(batches: Sequence[Batch]) -> list[tuple[int, Message]]:
    """``(turn number, user message)`` for each batch of the head path that starts with
    a user message (a compaction summary is no user turn, nor an output retry)."""
    return [
        (number, batch.messages[0])
        for number, batch in enumerate(batches, 1)
        if batch.messages and batch.messages[0].role is Role.USER and not _is_retry(batch)
    ]


def _is_retry(batch: Batch) -> bool:
    """Whether a batch is an output retry of the turn before it (``output_retries``)."""
    return bool(batch.messages) and _OUTPUT_RETRY_KEY in batch.messages[0].metadata


def _last_of(batches: Sequence[Batch], number: int) -> int:
    """The number of turn ``number``'s last batch: its own, or the last of the output
    retries that follow it."""
    last = number
    while last < len(batches) and _is_retry(batches[last]):
        last += 1
    return last


def _find(batches: Sequence[Batch], client_id: str) -> int | None:
    for number, user in _user_turns(batches):
        if _client_id(user) == client_id:
            return number
    return None


def _in_tree(tree: HistoryTree, client_id: str) -> bool:
    """Whether any batch of the tree, on any branch, starts with the user message
    ``client_id``."""
    return _find(tree.batches, client_id) is not None


def _complete(batch: Batch) -> bool:
    """Whether a stored turn ended with a final answer (not kept unfinished)."""
    last = batch.messages[-1]
    return (
        last.role is Role.ASSISTANT
        and not last.tool_calls
        and not any(_INTERRUPTED_KEY in m.metadata for m in batch.messages)
    )


def _waiting(batch: Batch) -> tuple[ToolCall, ...]:
    """The calls a stored turn waits on (its last assistant message's, marked), or ()."""
    for message in reversed(batch.messages):
        if message.role is Role.ASSISTANT:
            if _APPROVAL_KEY not in message.metadata:
                return ()
            ids = message.metadata.decode(_APPROVAL_KEY)
            if not isinstance(ids, list):
                return ()
            return tuple(call for call in message.tool_calls if call.id in ids)
    return ()


async def _replay(
    turn: Sequence[Batch],
    decode: Callable[[Response], Any],
    waiting: tuple[ToolCall, ...] = (),
) -> AsyncGenerator[TurnEvent[Any], None]:
    """The events of a stored turn (its batch and those of its output retries), as
    ``Conversation.stream`` gave them when it ran (no model call, nothing stored): per
    answer one chunk with the whole message, its tool calls and the tool results, then
    ``done`` with the stored messages. Finish reasons are not stored: ``tool_calls`` for
    a step that called tools, ``stop`` for the final answer. A turn that waits for
    approval (``waiting``) ends with ``done`` saying so (``pending``, no output)."""
    steps = 0
    response: Response | None = None
    messages = tuple(m for batch in turn for m in batch.messages)
    for message in messages[1:]:
        if message.role is Role.ASSISTANT:
            calls = message.tool_calls
            reason = FinishReason.TOOL_CALLS if calls else FinishReason.STOP
            response = Response(Output(message, reason))
            steps += 1
            yield TurnEvent(TurnEventKind.CHUNK, chunk=response)
            for call in calls:
                yield TurnEvent(TurnEventKind.TOOL_CALL, tool_call=call)
        elif message.role is Role.TOOL:
            for part in message.parts:
                if part.tool_result is not None:
                    yield TurnEvent(
                        TurnEventKind.TOOL_RESULT,
                        tool_result=part.tool_result,
                        denied=_denied(part.metadata),
                    )
    assert response is not None  # _complete or _waiting: the batch has an answer
    retries = len(turn) - 1
    if waiting:
        done = TurnResult(response, None, steps, messages, retries, pending=waiting)
    else:
        done = TurnResult(response, decode(response), steps, messages, output_retries=retries)
    yield TurnEvent(TurnEventKind.DONE, result=done)


def _again(
    conversation: Conversation, batches: Sequence[Batch], number: int, output: object
) -> _Events:
    """What a resent request gets for its turn ``number``, the head path's last: the
    stored turn replayed, or, when it was kept unfinished, answered again in place."""
    last = _last_of(batches, number)
    waiting = _waiting(batches[last - 1])
    if waiting:  # it waits for a decision: asked for again, no model call
        return _replay(batches[number - 1 : last], conversation.decoder(output), waiting)
    if _complete(batches[last - 1]):
        # The decoder ``output`` asks for, as Conversation.stream would apply it.
        decode = conversation.decoder(output)
        return _replay(batches[number - 1 : last], decode)
    # Kept unfinished (the turn's own batch, or its last output retry's): that batch
    # is answered again in place.
    return conversation.stream_regenerate(turn=last, output=output, expected_head=_head(batches))


def _resent(
    conversation: Conversation,
    tree: HistoryTree,
    message: Message,
    client_id: str,
    output: object,
    noun: str,
) -> _Events | None:
    """A new message whose client id the tree already holds: what the resent request
    gets (``_again``), or ``HistoryDivergedError``; None when the id is not stored."""
    cid = conversation.conversation_id
    batches = tree.head_path()
    number = _find(batches, client_id)
    if number is None:
        if not _in_tree(tree, client_id):
            return None
        raise HistoryDivergedError(
            f"{noun} {str(cid)!r}: the new message {client_id!r} is already stored, on a "
            "branch the conversation has left (a late resend?): reload the "
            f"{noun}",
            conversation_id=cid,
            message_id=client_id,
        )
    stored = batches[number - 1].messages[0]
    if stored.parts != message.parts:
        raise HistoryDivergedError(
            f"{noun} {str(cid)!r}: the new message {client_id!r} is already stored as turn "
            f"{number}, with other content (to change a message, edit it): reload the "
            f"{noun}",
            conversation_id=cid,
            turn=number,
            message_id=client_id,
        )
    last = _last_of(batches, number)
    if last != len(batches):
        raise HistoryDivergedError(
            f"{noun} {str(cid)!r}: the new message {client_id!r} is already stored as turn "
            f"{number}, and {len(batches) - last} more turn"
            f"{'s' if len(batches) - last != 1 else ''} follow (a stale resend?): reload "
            f"the {noun}",
            conversation_id=cid,
            turn=number,
            message_id=client_id,
        )
    return _again(conversation, batches, number, output)


async def _fenced(
    conversation: Conversation,
    events: _Events,
    decide: Callable[[HistoryTree], _Events | None],
) -> AsyncGenerator[TurnEvent[Any], None]:
    """A new turn's events, fenced by the head it was decided on. When the fence finds
    another turn stored before the model was called (``HistoryChangedError`` before any
    event: an overlapping turn, the first copy of a resent request among them), the
    conversation is read again and ``decide`` says what the request gets now (None:
    the fence's error stands)."""
    for attempt in range(1, _ATTEMPTS + 1):
        started = False
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    started = True
                    yield event
            return
        except HistoryChangedError:
            if started or attempt == _ATTEMPTS:
                raise
            again = decide(await _read_tree(conversation))
            if again is None:
                raise
            events = again


async def ui_turn(
    conversation: Conversation, request: UIChatRequest, *, output: object = None
) -> AsyncGenerator[TurnEvent[Any], None]:
    """What an AI SDK chat request (``chat_request_from_ui``) asks of ``conversation``,
    as the turn's events (``Conversation.stream``'s; hand them to
    ``ui_message_stream``):

    - ``submit-message`` without ``messageId``: a new turn,
      ``conversation.stream(message, expected_head=<the head read here>)``;
    - ``submit-message`` with ``messageId``: the stored turn whose user message has that
      id is edited (``stream_edit``) with the new message;
    - ``regenerate-message``: the stored turn whose user message has the id of the
      message the request ends with is answered again (``stream_regenerate``).

    The new user message is stored with its client id (``CLIENT_MESSAGE_ID_KEY``), and
    the conversation's tree is read once, here (a message without an id: nothing is
    read, and nothing tells a resend from a new message). A **resent** request is
    never stored twice:

    - a submit whose message id the head path's last turn holds, with the same content,
      gets that turn again: its events replayed from the store (one chunk per stored
      answer, ``tool_call``/``tool_result`` events, ``done``; finish reason ``stop``),
      no model call, nothing written; when that turn was kept unfinished
      (``keep_interrupted``) it is answered again in place (``stream_regenerate``);
    - an edit whose message is already the head turn's (the same id and content) gets
      that turn again the same way (so an "edit" that changes nothing is no new answer:
      that is ``regenerate-message``);
    - a submit whose id is stored with other content, with turns after it, or only on
      a branch the chat left raises ``HistoryDivergedError`` (409);
    - a resend that overlaps the first request: the new turn is fenced by the head read
      here, so when the first request's turn lands before the resend's model call (it
      waited: ``on_overlap="wait"``), the tree is read again and the resend gets that
      turn as above; ``"reject"`` refuses it (``TurnInProgressError``) and
      ``"interrupt"`` stops the first (the turn is stored once, the resend's). Another
      turn that lands first is simply waited for, as before: the submit runs on the
      history as it is then.

    An edit or a regenerate raises ``HistoryDivergedError`` (409) when no turn of the
    head path has the id (nothing moved, no model called); the rewind is then fenced by
    the head read here (``HistoryChangedError`` in the stream when it moved meanwhile).
    A regenerate request whose last message has no id raises ``HistoryDivergedError``
    too (a resent regenerate is not told from a second one: each answers again, the
    earlier answer kept on its branch). ``output`` as for ``Conversation.stream``; a
    turn whose answer was sent back (``output_retries``) is one turn here, with its
    retries: their user messages are never the client's, a resend replays every answer,
    a regenerate or an edit replaces them all.
    A closed conversation (cleared, erased or expired) raises
    ``ConversationClosedError`` here, before any event, when the tree is read (every
    request whose message has an id); a message without one meets it in the stream.
    Another turn refused by the conversation's overlap strategy
    (``on_overlap="reject"``: ``TurnInProgressError``) is met when the turn starts, in
    the stream, as the protocol's error event: the response is already a 200.
    Needs a store with branches (every bundled store; ``TypeError`` otherwise).
    ``TypeError`` for arguments of the wrong kind.

    **Tool approvals.** A turn that reaches a call of a tool with
    ``requires_approval`` ends its stream waiting (``TurnResult.pending``);
    ``ui_message_stream`` sends a ``tool-approval-request`` part per waiting call. The
    client's answer (``addToolApprovalResponse``, then its automatic request) is a
    request with ``approvals`` (``chat_request_from_ui``): each decision is taken in
    order, ``conversation.stream_approve(call_id)`` or ``stream_deny(call_id,
    reason)`` (the client's reason, or ``"denied by the user"``), and the events are
    the decided calls' results, each after a ``tool_call`` event for its call (which
    ``ui_message_stream`` sends again, so that the stream read alone, a resumed one,
    holds it), then the resumed turn's (only the last decision's ``done``: the turn
    goes on once every waiting call is decided). A call that does
    not wait (decided already, never pending, or the chat moved on) raises
    ``NotPendingError`` here, before any event (answer 409); a closed chat
    ``ConversationClosedError`` (410). ``output`` as for ``stream_approve``. The
    client appends the answer to the assistant message it holds: encode it with
    ``message_id`` None or ``request.message_id`` (another id starts a new message).
    """
    conversation = _check(conversation, request, UIChatRequest, "request")
    cid = conversation.conversation_id
    if request.approvals:
        return await _decide(conversation, request.approvals, output, "chat")
    regenerate = request.trigger == REGENERATE
    named = request.client_message_id if regenerate else request.message_id
    if named is None:
        if regenerate:
            raise HistoryDivergedError(
                f"chat {str(cid)!r}: the regenerate request's last message has no id, so "
                "its stored turn cannot be found",
                conversation_id=cid,
            )
        client_id = request.client_message_id
        if client_id is None:  # nothing to know a resend by: a new turn
            return conversation.stream(request.message, output=output)
        message = _stamped(request.message, client_id)

        def submit(tree: HistoryTree) -> _Events:
            resent = _resent(conversation, tree, message, client_id, output, "chat")
            if resent is not None:
                return resent
            head = _head(tree.head_path())
            return conversation.stream(message, output=output, expected_head=head)

        return _fenced(conversation, submit(await _read_tree(conversation)), submit)
    batches = (await _read_tree(conversation)).head_path()
    number = _find(batches, named)
    if number is None:
        what = "answer again" if regenerate else "edit"
        raise HistoryDivergedError(
            f"chat {str(cid)!r}: no stored turn has the user message {named!r} to {what} "
            f"(the stored conversation has {len(batches)} turn"
            f"{'s' if len(batches) != 1 else ''}): the client's copy of the chat is not "
            "the server's; reload it",
            conversation_id=cid,
            message_id=named,
        )
    head = _head(batches)
    if regenerate:
        return conversation.stream_regenerate(turn=number, output=output, expected_head=head)
    if (
        _last_of(batches, number) == len(batches)
        and request.client_message_id in (None, named)
        and batches[number - 1].messages[0].parts == request.message.parts
        and _complete(batches[-1])
    ):
        # The edit is stored already, as the head turn: a resent edit gets it again.
        return _again(conversation, batches, number, output)
    message = _stamped(request.message, request.message_id)
    return conversation.stream_edit(number, message, output=output, expected_head=head)


async def _decide(
    conversation: Conversation, approvals: Sequence[ToolApproval], output: object, noun: str
) -> _Events:
    """The decisions a request brings, checked before any event: each call must wait
    (``NotPendingError``), the conversation be open (``ConversationClosedError``)."""
    cid = conversation.conversation_id
    await _read_tree(conversation)  # closed: ConversationClosedError; the store's kind
    waiting = {call.id: call for call in await conversation.pending()}
    for approval in approvals:
        if approval.call_id not in waiting:
            listed = ", ".join(map(repr, sorted(waiting))) or "none"
            raise NotPendingError(
                f"{noun} {str(cid)!r}: tool call {approval.call_id!r} does not wait for a "
                f"decision (the calls that wait: {listed}): decided already, or the "
                f"client's copy of the {noun} is not the server's; reload it",
                conversation_id=str(cid),
                call_id=approval.call_id,
            )
    return _decisions(conversation, approvals, waiting, output)


async def _decisions(
    conversation: Conversation,
    approvals: Sequence[ToolApproval],
    calls: Mapping[str, ToolCall],
    output: object,
) -> AsyncGenerator[TurnEvent[Any], None]:
    """Each decision's events in order, its first one (the decided call's result)
    after a ``tool_call`` event for that call: the encoders send the call again, for a
    reader of this stream alone (a resumed stream replayed from its start). The
    ``done`` of all but the last decision is dropped (the turn still waits for the
    later decisions)."""
    last = len(approvals) - 1
    for index, approval in enumerate(approvals):
        if approval.approved:
            events = conversation.stream_approve(approval.call_id, output=output)
        else:
            reason = approval.reason or DENIED_WITHOUT_REASON
            events = conversation.stream_deny(approval.call_id, reason, output=output)
        first = True
        async with contextlib.aclosing(events):
            async for event in events:
                if first:  # the call is claimed: its result comes
                    first = False
                    yield TurnEvent(TurnEventKind.TOOL_CALL, tool_call=calls[approval.call_id])
                if index < last and event.kind is TurnEventKind.DONE:
                    continue
                yield event


def _same(client: Message, stored: Message) -> bool:
    """Whether a user message a client holds is the stored one: the same parts, and the
    same client id when both have one."""
    if client.parts != stored.parts:
        return False
    ours, theirs = _client_id(stored), _client_id(client)
    return ours is None or theirs is None or ours == theirs


async def agui_turn(
    conversation: Conversation,
    run: AGUIRunInput,
    *,
    on_divergence: OnDivergence = "refuse",
    output: object = None,
) -> AsyncGenerator[TurnEvent[Any], None]:
    """What an AG-UI run (``run_input_from_agui``) asks of ``conversation``, as the
    turn's events (hand them to ``agui_events``).

    The conversation's tree is read once, here, and the run's earlier user messages
    (``run.prior``) are compared with the user messages of its turns (the same parts,
    and the same id where both carry one; assistant and tool messages the client holds
    are the server's answers and are not compared):

    - the same: a new turn, ``conversation.stream(message, expected_head=<that head>)``
      (a turn that lands meanwhile makes it fail with ``HistoryChangedError`` before
      the model is called), unless its id is stored already (a resend: below);
    - the client's stop short of the stored ones, which they begin: with ``"refuse"``
      (the default) ``HistoryDivergedError``. With ``on_divergence="edit"``, when the new
      message names the first turn the run lacks (it has the id of that turn's user
      message, with other content: the client edited that message and dropped the
      rest), that turn is edited with it (``stream_edit``, fenced by the head read);
      otherwise the run is a new turn on the head, as above (a client that sends only
      its new message, or part of the thread: the store owns the history), never an
      edit of a turn nobody named;
    - a new message whose id is that of the first stored user message the client
      lacks, with the same content: a resent run. When that turn is the head path's
      last, the run gets it again, as ``ui_turn`` gives a resent submit (replayed from
      the store, no model call; answered again in place when it was kept unfinished),
      whatever ``on_divergence`` says; with turns after it, ``HistoryDivergedError``;
    - any other difference (a message that is not the stored one, more messages than
      the store holds, a new message whose id is stored elsewhere in the tree and is
      not the head turn's resend): ``HistoryDivergedError``, whatever ``on_divergence``
      says.

    A new turn that finds another turn stored before its model is called (it waited,
    ``on_overlap="wait"``) fails with ``HistoryChangedError`` in its stream (the run's
    copy of the thread is stale), unless the turn that landed is the run's own new
    message (a resend overlapping the first request): then the run gets that turn.

    ``HistoryDivergedError`` (``turn``: the first turn that differs) comes before any
    model call, nothing moved: answer it with a 409. A closed conversation (cleared,
    erased or expired) raises ``ConversationClosedError`` the same way (answer 410).
    The new message is stored with its client id (``CLIENT_MESSAGE_ID_KEY``).
    ``ValueError`` for another ``on_divergence``, ``TypeError`` for arguments of the
    wrong kind.

    **Tool approvals.** A turn that reaches a call of a tool with
    ``requires_approval`` ends its run waiting: ``agui_events`` ends it with
    ``RUN_FINISHED`` carrying an interrupt outcome, one interrupt per waiting call
    (its id the call's). A resume run (``run.approvals``, from ``RunAgentInput.resume``)
    takes the decisions as ``ui_turn`` takes the AI SDK's (the same rules and errors:
    ``NotPendingError`` for a call that does not wait, before any event); its messages
    are not compared with the stored thread (the decision is fenced by the store).
    """
    conversation = _check(conversation, run, AGUIRunInput, "run")
    if type(on_divergence) is not str or on_divergence not in _DIVERGENCE:
        raise ValueError(
            f"on_divergence must be one of {', '.join(map(repr, _DIVERGENCE))}, got "
            f"{on_divergence!r}"
        )
    if run.approvals:
        return await _decide(conversation, run.approvals, output, "thread")
    client_id = run.client_message_id

    def again(tree: HistoryTree) -> _Events | None:
        # Another turn landed first: the run's own (a resend overlapping it) gets it
        # again; any other keeps the fence's HistoryChangedError.
        if client_id is None or _find(tree.head_path(), client_id) is None:
            return None
        return _agui_plan(conversation, run, tree, on_divergence, output)[0]

    events, new_turn = _agui_plan(
        conversation, run, await _read_tree(conversation), on_divergence, output
    )
    return _fenced(conversation, events, again) if new_turn else events


def _agui_plan(
    conversation: Conversation,
    run: AGUIRunInput,
    tree: HistoryTree,
    on_divergence: OnDivergence,
    output: object,
) -> tuple[_Events, bool]:
    """``agui_turn``'s decision on the tree just read (its docstring gives the rules):
    the events, and whether they are a new turn (fenced by the head read)."""
    cid = conversation.conversation_id
    batches = tree.head_path()
    head = _head(batches)
    stored = _user_turns(batches)
    client = run.prior
    client_id = run.client_message_id
    message = _stamped(run.message, client_id)
    for index, held in enumerate(client):
        if index >= len(stored):
            raise HistoryDivergedError(
                f"thread {str(cid)!r}: the run carries {len(client)} earlier user "
                f"message{'s' if len(client) != 1 else ''}, the stored thread "
                f"{len(stored)}: the client holds messages the server never stored; "
                "reload the thread",
                conversation_id=cid,
                turn=len(batches) + 1,
            )
        number, ours = stored[index]
        if not _same(held, ours):
            raise HistoryDivergedError(
                f"thread {str(cid)!r}: the run's user message {index + 1} is not the "
                f"stored one (turn {number}): the client's copy of the thread diverged; "
                "reload the thread",
                conversation_id=cid,
                turn=number,
            )
    if len(client) == len(stored):
        if client_id is not None:
            resent = _resent(conversation, tree, message, client_id, output, "thread")
            if resent is not None:
                return resent, False
        return conversation.stream(message, output=output, expected_head=head), True
    number, dropped = stored[len(client)]
    if client_id is not None and _client_id(dropped) == client_id:
        # The new message has the id of the first stored turn the run lacks: a resent
        # run (the same content) or an edit naming the message it replaces (other content).
        if dropped.parts == run.message.parts:
            if _last_of(batches, number) == len(batches):  # the head turn: got again
                return _again(conversation, batches, number, output), False
            raise HistoryDivergedError(
                f"thread {str(cid)!r}: the run's new message {client_id!r} is already "
                f"stored as turn {number}, and turns follow (a retried run?): reload the "
                "thread",
                conversation_id=cid,
                turn=number,
                message_id=client_id,
            )
        if on_divergence == "edit":
            edit = conversation.stream_edit(number, message, output=output, expected_head=head)
            return edit, False
    elif on_divergence == "edit":
        # A strict prefix of the stored thread and a new message that names no turn it
        # lacks: a client that sends less than the whole thread (only its new message,
        # say), not an edit. The store owns the history: a new turn on the head.
        if client_id is not None:
            resent = _resent(conversation, tree, message, client_id, output, "thread")
            if resent is not None:
                return resent, False
        return conversation.stream(message, output=output, expected_head=head), True
    elif client_id is not None and _in_tree(tree, client_id):
        raise HistoryDivergedError(
            f"thread {str(cid)!r}: the run's new message {client_id!r} is already stored, "
            f"but not as turn {number}, the turn it would replace (a stale run?): reload "
            "the thread",
            conversation_id=cid,
            turn=number,
            message_id=client_id,
        )
    raise HistoryDivergedError(
        f"thread {str(cid)!r}: the run carries {len(client)} earlier user "
        f"message{'s' if len(client) != 1 else ''}, the stored thread {len(stored)}: the "
        f"client dropped turn {number} and what follows (an edit?); reload the thread, or "
        "let the service take such runs as new turns, and an edit of turn "
        f"{number} when the new message has its id (agui_turn(..., on_divergence='edit'))",
        conversation_id=cid,
        turn=number,
    )
