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
  earlier user messages stop short of the stored ones (the client edited a message and
  dropped what followed) is an edit of the first turn it lacks, when the service opts in
  (``on_divergence="edit"``); every other divergence is refused.

An id the head path does not hold, and a refused divergence, raise
``HistoryDivergedError`` (answer 409) before any model call and before anything moves.
Each rewind is fenced by the head these functions read, so a turn that lands in between
makes the turn's stream fail with ``HistoryChangedError`` instead of editing the wrong
turn.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final, Literal

from scope.chat import Message, Role
from scope.conversation import Conversation, TurnEvent
from scope.errors import HistoryDivergedError
from scope.history import Batch
from scope.web._agui import AGUIRunInput
from scope.web._request import CLIENT_MESSAGE_ID_KEY, REGENERATE
from scope.web._ui import UIChatRequest

__all__ = ["agui_turn", "ui_turn"]

OnDivergence = Literal["refuse", "edit"]
_DIVERGENCE: Final = ("refuse", "edit")


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


async def _head_path(conversation: Conversation) -> list[Batch]:
    """The batches of the conversation's head path (one read)."""
    store: Any = conversation.store
    read_batches = getattr(store, "read_batches", None)
    if not inspect.iscoroutinefunction(read_batches):
        raise TypeError(
            "editing and regenerating need a store with branches (a scope.history.Store: "
            f"async read_batches, read_tree, move_head; every bundled store), got "
            f"{type(store).__name__}"
        )
    batches: list[Batch] = await read_batches(conversation.conversation_id)
    return batches


def _user_turns(batches: Sequence[Batch]) -> list[tuple[int, Message]]:
    """``(turn number, user message)`` for each batch of the head path that starts with
    a user message (a compaction summary is no user turn)."""
    return [
        (number, batch.messages[0])
        for number, batch in enumerate(batches, 1)
        if batch.messages and batch.messages[0].role is Role.USER
    ]


def _find(batches: Sequence[Batch], client_id: str) -> int | None:
    for number, user in _user_turns(batches):
        if _client_id(user) == client_id:
            return number
    return None


async def ui_turn(
    conversation: Conversation, request: UIChatRequest, *, output: object = None
) -> AsyncGenerator[TurnEvent[Any], None]:
    """What an AI SDK chat request (``chat_request_from_ui``) asks of ``conversation``,
    as the turn's events (``Conversation.stream``'s; hand them to
    ``ui_message_stream``):

    - ``submit-message`` without ``messageId``: ``conversation.stream(message)``;
    - ``submit-message`` with ``messageId``: the stored turn whose user message has that
      id is edited (``stream_edit``) with the new message;
    - ``regenerate-message``: the stored turn whose user message has the id of the
      message the request ends with is answered again (``stream_regenerate``).

    The new user message is stored with its client id (``CLIENT_MESSAGE_ID_KEY``). A
    submit reads nothing here; an edit or a regenerate reads the head path once, here,
    and raises ``HistoryDivergedError`` (409) when no turn of it has the id (nothing
    moved, no model called); the rewind is then fenced by the head read here
    (``HistoryChangedError`` in the stream when it moved meanwhile). A regenerate request
    whose last message has no id raises ``HistoryDivergedError`` too. ``output`` as for
    ``Conversation.stream``. ``TypeError`` for arguments of the wrong kind.
    """
    conversation = _check(conversation, request, UIChatRequest, "request")
    cid = conversation.conversation_id
    regenerate = request.trigger == REGENERATE
    named = request.client_message_id if regenerate else request.message_id
    if named is None:
        if regenerate:
            raise HistoryDivergedError(
                f"chat {str(cid)!r}: the regenerate request's last message has no id, so "
                "its stored turn cannot be found",
                conversation_id=cid,
            )
        return conversation.stream(
            _stamped(request.message, request.client_message_id), output=output
        )
    batches = await _head_path(conversation)
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
    head = str(batches[-1].id)
    if regenerate:
        return conversation.stream_regenerate(turn=number, output=output, expected_head=head)
    message = _stamped(request.message, request.message_id)
    return conversation.stream_edit(number, message, output=output, expected_head=head)


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

    The head path is read once, here, and the run's earlier user messages
    (``run.prior``) are compared with the user messages of its turns (the same parts,
    and the same id where both carry one; assistant and tool messages the client holds
    are the server's answers and are not compared):

    - the same: a new turn, ``conversation.stream(message, expected_head=<that head>)``
      (a turn that lands meanwhile makes it fail with ``HistoryChangedError`` before
      the model is called);
    - the client's stop short of the stored ones, which they begin (it edited a message
      and dropped the rest): with ``on_divergence="edit"`` the first turn it lacks is
      edited with the new message (``stream_edit``, fenced by that head); with
      ``"refuse"`` (the default) ``HistoryDivergedError``;
    - any other difference (a message that is not the stored one, more messages than
      the store holds), and a new message whose id is that of the first stored user
      message the client lacks (a retried run that was already stored):
      ``HistoryDivergedError``, whatever ``on_divergence`` says.

    ``HistoryDivergedError`` (``turn``: the first turn that differs) comes before any
    model call, nothing moved: answer it with a 409. The new message is stored with its
    client id (``CLIENT_MESSAGE_ID_KEY``). ``ValueError`` for another ``on_divergence``,
    ``TypeError`` for arguments of the wrong kind.
    """
    conversation = _check(conversation, run, AGUIRunInput, "run")
    if type(on_divergence) is not str or on_divergence not in _DIVERGENCE:
        raise ValueError(
            f"on_divergence must be one of {', '.join(map(repr, _DIVERGENCE))}, got "
            f"{on_divergence!r}"
        )
    cid = conversation.conversation_id
    batches = await _head_path(conversation)
    head = str(batches[-1].id) if batches else ""
    stored = _user_turns(batches)
    client = run.prior
    message = _stamped(run.message, run.client_message_id)
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
        return conversation.stream(message, output=output, expected_head=head)
    number, dropped = stored[len(client)]
    if run.client_message_id is not None and _client_id(dropped) == run.client_message_id:
        # The new message is the stored user message of the first turn the run lacks:
        # a retry of a run that was stored, not an edit (answering it again would
        # regenerate what the client never saw).
        raise HistoryDivergedError(
            f"thread {str(cid)!r}: the run's new message {run.client_message_id!r} is "
            f"already stored as turn {number} (a retried run?): reload the thread",
            conversation_id=cid,
            turn=number,
            message_id=run.client_message_id,
        )
    if on_divergence == "edit":
        return conversation.stream_edit(number, message, output=output, expected_head=head)
    raise HistoryDivergedError(
        f"thread {str(cid)!r}: the run carries {len(client)} earlier user "
        f"message{'s' if len(client) != 1 else ''}, the stored thread {len(stored)}: the "
        f"client dropped turn {number} and what follows (an edit?); reload the thread, or "
        "let the service treat such runs as edits (agui_turn(..., on_divergence='edit'))",
        conversation_id=cid,
        turn=number,
    )
