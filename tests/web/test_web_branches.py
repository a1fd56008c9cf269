"""scope.web on branches (DESIGN §6h): ``ui_turn`` maps the AI SDK's requests (a new
message, ``submit-message`` naming an earlier message: an edit, ``regenerate-message``)
to turns of a ``Conversation``, finding turns by the client ids it stores; ``agui_turn``
refuses an AG-UI run whose earlier messages are not the stored head path
(``HistoryDivergedError``) unless the service treats dropped turns as an edit. Over the
in-memory reference store, under asyncio and trio. (The real clients: test_web_clients.)
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

import pytest

from scope.chat import Message, Request, assistant_message, system_message, user_message
from scope.conversation import Conversation, TurnEvent
from scope.errors import (
    ConversationClosedError,
    HistoryChangedError,
    HistoryDivergedError,
    InvalidRequestError,
)
from scope.history import Batch, erase
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from scope.web import (
    CLIENT_MESSAGE_ID_KEY,
    agui_turn,
    chat_request_from_ui,
    run_input_from_agui,
    ui_turn,
)

pytestmark = pytest.mark.anyio


class Answers:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, request: Request) -> str:
        self.asked.append(request.messages[-1].text)
        return f"answer {len(self.asked)} to {request.messages[-1].text}"


def setup() -> tuple[InMemoryStore, Answers, Conversation]:
    store, answers = InMemoryStore(), Answers()
    return store, answers, Conversation(FunctionModel(answers), store, "chat")


async def run(events: Any) -> str:
    """The turn's answer text (the events run to the end)."""
    done: list[TurnEvent[Any]] = []
    async with contextlib.aclosing(events):
        async for event in events:
            if event.result is not None:
                done.append(event)
    assert done and done[0].result is not None
    return str(done[0].result.output)


def ui(text: str, message_id: str | None, **body: Any) -> dict[str, Any]:
    last: dict[str, Any] = {"role": "user", "parts": [{"type": "text", "text": text}]}
    if message_id is not None:
        last["id"] = message_id
    return {"id": "chat", "messages": [last], **body}


async def texts(store: InMemoryStore) -> list[str]:
    return [m.text for m in await store.read("chat")]


async def two_ui_turns() -> tuple[InMemoryStore, Answers, Conversation]:
    store, answers, conversation = setup()
    await run(await ui_turn(conversation, chat_request_from_ui(ui("q1", "u1"))))
    await run(await ui_turn(conversation, chat_request_from_ui(ui("q2", "u2"))))
    return store, answers, conversation


async def test_a_submitted_message_is_stored_with_its_client_id() -> None:
    store, _, _ = await two_ui_turns()
    stored = await store.read("chat")
    assert [m.text for m in stored] == ["q1", "answer 1 to q1", "q2", "answer 2 to q2"]
    assert stored[0].metadata.decode(CLIENT_MESSAGE_ID_KEY) == "u1"
    assert stored[2].metadata.decode(CLIENT_MESSAGE_ID_KEY) == "u2"
    assert CLIENT_MESSAGE_ID_KEY not in stored[1].metadata


async def test_regenerate_answers_the_turn_of_the_last_message_again() -> None:
    store, answers, conversation = await two_ui_turns()
    request = chat_request_from_ui(ui("q2 (the client's copy)", "u2", trigger="regenerate-message"))
    assert await run(await ui_turn(conversation, request)) == "answer 3 to q2"
    assert answers.asked[-1] == "q2"  # the stored question, not the client's copy
    assert await texts(store) == ["q1", "answer 1 to q1", "q2", "answer 3 to q2"]
    # An earlier turn: the AI SDK sends the messages up to its question.
    request = chat_request_from_ui(ui("q1", "u1", trigger="regenerate-message", messageId="a"))
    assert await run(await ui_turn(conversation, request)) == "answer 4 to q1"
    assert await texts(store) == ["q1", "answer 4 to q1"]
    assert len((await store.read_tree("chat")).batches) == 4  # nothing deleted


async def test_a_submit_naming_an_earlier_message_edits_its_turn() -> None:
    store, _, conversation = await two_ui_turns()
    request = chat_request_from_ui(ui("q1, edited", "u1", messageId="u1"))
    assert await run(await ui_turn(conversation, request)) == "answer 3 to q1, edited"
    stored = await store.read("chat")
    assert [m.text for m in stored] == ["q1, edited", "answer 3 to q1, edited"]
    assert stored[0].metadata.decode(CLIENT_MESSAGE_ID_KEY) == "u1"  # found again later
    again = chat_request_from_ui(ui("q1, edited twice", "u1", messageId="u1"))
    assert await run(await ui_turn(conversation, again)) == "answer 4 to q1, edited twice"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            ui("q", "nope", trigger="regenerate-message"),
            "no stored turn has the user message 'nope'",
        ),
        (ui("q", None, trigger="regenerate-message"), "last message has no id"),
        (ui("q", "x", messageId="nope"), "no stored turn has the user message 'nope' to edit"),
    ],
)
async def test_an_id_the_head_path_does_not_hold_is_diverged(
    body: dict[str, Any], problem: str
) -> None:
    store, answers, conversation = await two_ui_turns()
    before = await store.read_tree("chat")
    with pytest.raises(HistoryDivergedError, match=problem) as caught:
        await ui_turn(conversation, chat_request_from_ui(body))
    assert caught.value.conversation_id == "chat"
    assert len(answers.asked) == 2
    assert await store.read_tree("chat") == before


async def test_an_id_on_another_branch_only_is_diverged() -> None:
    _, _, conversation = await two_ui_turns()
    await run(await ui_turn(conversation, chat_request_from_ui(ui("q1b", "u1", messageId="u1"))))
    # u2 is still stored, but on the old branch: not on the head path.
    with pytest.raises(HistoryDivergedError) as caught:
        await ui_turn(conversation, chat_request_from_ui(ui("q2", "u2", messageId="u2")))
    assert caught.value.message_id == "u2"


async def test_an_edit_racing_a_turn_fails_in_its_stream() -> None:
    store, answers, conversation = await two_ui_turns()
    events = await ui_turn(conversation, chat_request_from_ui(ui("q1b", "u1", messageId="u1")))
    await store.append(Batch("chat", "other", (user_message("o"), assistant_message("a"))))
    with pytest.raises(HistoryChangedError):
        await run(events)
    assert len(answers.asked) == 2  # the model was not called
    assert (await texts(store))[-2:] == ["o", "a"]


async def test_the_arguments_are_checked() -> None:
    _, _, conversation = setup()
    request = chat_request_from_ui(ui("q", "u"))
    with pytest.raises(TypeError, match=r"conversation must be a scope\.conversation"):
        await ui_turn(object(), request)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"request must be a scope\.web\.UIChatRequest"):
        await ui_turn(conversation, {"id": "chat"})  # type: ignore[arg-type]
    run_input = run_input_from_agui(agui([user("q", "u")]))
    with pytest.raises(TypeError, match=r"run must be a scope\.web\.AGUIRunInput"):
        await agui_turn(conversation, request)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_divergence must be one of 'refuse', 'edit'"):
        await agui_turn(conversation, run_input, on_divergence="merge")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ AG-UI


def user(text: str, message_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": text}
    if message_id is not None:
        message["id"] = message_id
    return message


def answer(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "content": text}


def agui(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"threadId": "chat", "runId": "r", "messages": messages}


async def two_agui_turns(
    on_divergence: Any = "refuse",
) -> tuple[InMemoryStore, Answers, Conversation]:
    store, answers, conversation = setup()
    first = run_input_from_agui(agui([user("q1", "u1")]))
    await run(await agui_turn(conversation, first, on_divergence=on_divergence))
    second = agui([user("q1", "u1"), answer("answer 1 to q1", "r:1"), user("q2", "u2")])
    await run(await agui_turn(conversation, run_input_from_agui(second)))
    return store, answers, conversation


async def test_an_agui_run_in_step_with_the_store_is_a_new_turn() -> None:
    store, _, conversation = await two_agui_turns()
    third = agui(
        [
            user("q1", "u1"),
            answer("answer 1 to q1", "r:1"),
            user("q2", "u2"),
            answer("whatever the client shows", "r:2"),  # answers are not compared
            user("q3", "u3"),
        ]
    )
    assert await run(await agui_turn(conversation, run_input_from_agui(third))) == "answer 3 to q3"
    stored = await store.read("chat")
    assert [m.text for m in stored][-2:] == ["q3", "answer 3 to q3"]
    assert stored[-2].metadata.decode(CLIENT_MESSAGE_ID_KEY) == "u3"


async def test_user_messages_without_ids_are_compared_by_content() -> None:
    _, _, conversation = setup()
    await conversation.ask("q1")  # stored without a client id
    run_input = run_input_from_agui(agui([user("q1", "x"), user("q2")]))
    assert await run(await agui_turn(conversation, run_input)) == "answer 2 to q2"
    changed = run_input_from_agui(agui([user("q1, changed"), user("q3")]))
    with pytest.raises(HistoryDivergedError, match="user message 1 is not the stored one"):
        await agui_turn(conversation, changed)


@pytest.mark.parametrize(
    ("messages", "problem", "turn"),
    [
        # The client dropped turn 2 and sends a new message there: an edit (refused).
        (
            [user("q1", "u1"), answer("a", "r:1"), user("q2, edited", "u9")],
            "the client dropped turn 2 and what follows",
            2,
        ),
        ([user("new", "u9")], "the client dropped turn 1", 1),
        # An earlier message that is not the stored one.
        ([user("q1, changed", "u1"), user("q2", "u2"), user("q3")], "user message 1 is not", 1),
        ([user("q1", "u7"), user("q2", "u2"), user("q3")], "user message 1 is not the stored", 1),
        # Messages the server never stored.
        (
            [user("q1", "u1"), user("q2", "u2"), user("q2b", "u5"), user("q3")],
            "holds messages the server never stored",
            3,
        ),
    ],
)
async def test_a_diverged_agui_run_is_refused(
    messages: list[dict[str, Any]], problem: str, turn: int
) -> None:
    store, answers, conversation = await two_agui_turns()
    before = await store.read_tree("chat")
    with pytest.raises(HistoryDivergedError, match=problem) as caught:
        await agui_turn(conversation, run_input_from_agui(agui(messages)))
    assert caught.value.turn == turn
    assert len(answers.asked) == 2
    assert await store.read_tree("chat") == before


async def test_with_on_divergence_edit_a_run_naming_a_dropped_message_edits_its_turn() -> None:
    store, _, conversation = await two_agui_turns()
    # The client edited q2 and kept its id: the edit names the message it replaces.
    edited = run_input_from_agui(agui([user("q1", "u1"), user("q2, edited", "u2")]))
    result = await run(await agui_turn(conversation, edited, on_divergence="edit"))
    assert result == "answer 3 to q2, edited"
    assert await texts(store) == ["q1", "answer 1 to q1", "q2, edited", "answer 3 to q2, edited"]
    first = run_input_from_agui(agui([user("q1 again", "u1")]))
    assert await run(await agui_turn(conversation, first, on_divergence="edit")) == (
        "answer 4 to q1 again"
    )
    assert await texts(store) == ["q1 again", "answer 4 to q1 again"]
    assert len((await store.read_tree("chat")).batches) == 4  # nothing deleted
    # Under the default, the same named edit is refused, nothing moved.
    before = await store.read_tree("chat")
    again = run_input_from_agui(agui([user("q1 a third time", "u1")]))
    with pytest.raises(HistoryDivergedError, match="the client dropped turn 1") as caught:
        await agui_turn(conversation, again)
    assert caught.value.turn == 1
    assert await store.read_tree("chat") == before
    # Other divergences stay refused.
    changed = run_input_from_agui(agui([user("q1, changed", "u8"), user("x")]))
    with pytest.raises(HistoryDivergedError, match="user message 1 is not the stored one"):
        await agui_turn(conversation, changed, on_divergence="edit")


@pytest.mark.parametrize(
    "messages",
    [
        [user("q3", "u3")],  # only the new message
        [user("q1", "u1"), answer("answer 1 to q1", "r:1"), user("q3", "u3")],  # part of it
        [user("q3")],  # only the new message, no id
        [user("q1", "u1"), user("q3")],
    ],
    ids=["alone", "prefix", "alone-no-id", "prefix-no-id"],
)
async def test_with_on_divergence_edit_a_prefix_and_a_new_message_is_a_new_turn(
    messages: list[dict[str, Any]],
) -> None:
    store, answers, conversation = await two_agui_turns()
    before = (await store.read_tree("chat")).batches
    run_input = run_input_from_agui(agui(messages))
    result = await run(await agui_turn(conversation, run_input, on_divergence="edit"))
    assert result == "answer 3 to q3"
    # A third turn on the head: turns 1 and 2 stay on the head path, nothing rewound.
    assert await texts(store) == [
        "q1",
        "answer 1 to q1",
        "q2",
        "answer 2 to q2",
        "q3",
        "answer 3 to q3",
    ]
    tree = await store.read_tree("chat")
    assert tree.batches[:2] == before and len(tree.batches) == 3
    assert tree.parents[2] == 1
    assert answers.asked == ["q1", "q2", "q3"]
    # Under the default the client's copy is stale: refused, nothing moved.
    with pytest.raises(HistoryDivergedError, match="the client dropped turn"):
        await agui_turn(conversation, run_input_from_agui(agui([user("q4", "u4")])))
    assert (await store.read_tree("chat")) == tree


async def test_with_on_divergence_edit_a_resent_partial_run_is_stored_once() -> None:
    store, answers, conversation = await two_agui_turns()
    run_input = run_input_from_agui(agui([user("q3", "u3")]))
    assert await run(await agui_turn(conversation, run_input, on_divergence="edit")) == (
        "answer 3 to q3"
    )
    # The same body posted again: the stored head turn, replayed (no model call).
    assert await run(await agui_turn(conversation, run_input, on_divergence="edit")) == (
        "answer 3 to q3"
    )
    assert answers.asked == ["q1", "q2", "q3"]
    assert len((await store.read_tree("chat")).batches) == 3
    # Once another turn follows it, the resend is refused, not answered again.
    await run(
        await agui_turn(
            conversation, run_input_from_agui(agui([user("q4", "u4")])), on_divergence="edit"
        )
    )
    with pytest.raises(HistoryDivergedError, match="'u3' is already stored as turn 3"):
        await agui_turn(conversation, run_input, on_divergence="edit")
    assert answers.asked == ["q1", "q2", "q3", "q4"]


async def test_with_on_divergence_edit_a_partial_run_racing_a_turn_fails_in_its_stream() -> None:
    store, answers, conversation = await two_agui_turns()
    run_input = run_input_from_agui(agui([user("q3", "u3")]))
    events = await agui_turn(conversation, run_input, on_divergence="edit")
    await store.append(Batch("chat", "other", (user_message("o"), assistant_message("a"))))
    with pytest.raises(HistoryChangedError):
        await run(events)
    assert answers.asked == ["q1", "q2"]


async def test_a_compaction_summary_is_no_user_turn() -> None:
    store, _, conversation = setup()
    await conversation.ask("q1")
    await store.append(Batch("chat", "summary", (system_message("a summary"),)))
    run_input = run_input_from_agui(agui([user("q1"), user("q2")]))
    assert await run(await agui_turn(conversation, run_input)) == "answer 2 to q2"


async def test_an_agui_run_racing_a_turn_fails_in_its_stream() -> None:
    store, answers, conversation = await two_agui_turns()
    third = run_input_from_agui(agui([user("q1", "u1"), user("q2", "u2"), user("q3", "u3")]))
    events = await agui_turn(conversation, third)
    await store.append(Batch("chat", "other", (user_message("o"), assistant_message("a"))))
    with pytest.raises(HistoryChangedError):
        await run(events)
    assert len(answers.asked) == 2


async def test_a_malformed_earlier_user_message_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match=r"messages\[0\].content must be a string"):
        run_input_from_agui(agui([{"id": "u", "role": "user", "content": 5}, user("q")]))
    with pytest.raises(InvalidRequestError, match=r"messages\[0\] must be an object"):
        run_input_from_agui(agui([5, user("q")]))  # type: ignore[list-item]


def test_client_ids_live_in_message_metadata() -> None:
    message = Message(user_message("q").role, user_message("q").parts, {CLIENT_MESSAGE_ID_KEY: "u"})
    assert message.metadata.decode(CLIENT_MESSAGE_ID_KEY) == "u"


def test_history_diverged_error_is_a_history_error_and_pickles() -> None:
    import pickle

    from scope.errors import HistoryError

    err = HistoryDivergedError("diverged", conversation_id="c", turn=2, message_id="u2")
    assert isinstance(err, HistoryError) and not isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is HistoryDivergedError and str(again) == "diverged"
    assert (again.conversation_id, again.turn, again.message_id) == ("c", 2, "u2")


@pytest.mark.parametrize("on_divergence", ["refuse", "edit"])
async def test_a_retried_agui_run_that_was_stored_is_not_an_edit(on_divergence: Any) -> None:
    store, answers, conversation = await two_agui_turns()
    retried = run_input_from_agui(agui([user("q1", "u1"), answer("a", "r:1"), user("q2", "u2")]))
    # The stored head turn: it is replayed, not answered again (test_web_resend).
    result = await run(await agui_turn(conversation, retried, on_divergence=on_divergence))
    assert result == "answer 2 to q2"
    assert len(answers.asked) == 2
    assert len((await store.read_tree("chat")).batches) == 2
    # An earlier turn, retried: refused.
    with pytest.raises(HistoryDivergedError, match="'u1' is already stored as turn 1") as caught:
        await agui_turn(conversation, run_input_from_agui(agui([user("q1", "u1")])))
    assert (caught.value.turn, caught.value.message_id) == (1, "u1")


# ---------------------------------------------------------------- closed chats


async def closed(how: str) -> tuple[Answers, Conversation]:
    """A chat with one turn (``u1``), then cleared, erased or expired."""
    now = [1_000.0]
    store = InMemoryStore(retention=datetime.timedelta(hours=1), clock=lambda: now[0])
    answers = Answers()
    conversation = Conversation(FunctionModel(answers), store, "chat")
    await run(await ui_turn(conversation, chat_request_from_ui(ui("q1", "u1"))))
    if how == "cleared":
        await store.clear("chat")
    elif how == "erased":
        await erase(store, "chat")
    else:
        now[0] += 7_200  # two hours on: past the retention
    return answers, conversation


@pytest.mark.parametrize("how", ["cleared", "erased", "expired"])
@pytest.mark.parametrize(
    "body",
    [
        ui("q2", "u2"),  # a new message
        ui("q1, edited", "u1", messageId="u1"),  # an edit
        ui("q1", "u1", trigger="regenerate-message"),  # a regenerate
    ],
    ids=["submit", "edit", "regenerate"],
)
async def test_a_request_to_a_closed_chat_is_refused_before_any_event(
    how: str, body: dict[str, Any]
) -> None:
    answers, conversation = await closed(how)
    with pytest.raises(ConversationClosedError, match=rf"^chat 'chat' is {how}: it takes no"):
        await ui_turn(conversation, chat_request_from_ui(body))
    assert answers.asked == ["q1"]  # no model call


@pytest.mark.parametrize("how", ["cleared", "erased", "expired"])
@pytest.mark.parametrize("on_divergence", ["refuse", "edit"])
async def test_an_agui_run_on_a_closed_thread_is_refused_before_any_event(
    how: str, on_divergence: Any
) -> None:
    answers, conversation = await closed(how)
    for messages in (
        [user("q1", "u1"), answer("answer 1 to q1", "r:1"), user("q2", "u2")],
        [user("q2", "u2")],
    ):
        with pytest.raises(
            ConversationClosedError, match=rf"^chat .chat. is {how}: it takes no new turn"
        ):
            await agui_turn(
                conversation, run_input_from_agui(agui(messages)), on_divergence=on_divergence
            )
    assert answers.asked == ["q1"]
