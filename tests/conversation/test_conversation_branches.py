"""scope.conversation on branches (DESIGN §6h): ``regenerate`` and ``edit`` (and their
streams) rewind the head and run a new turn, fenced at both steps; nothing is deleted;
a turn that is not stored moves the head back; ``expected_head`` on ``ask``/``stream``.
Every test runs under asyncio and trio, over the in-memory reference store.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio
import pytest

from scope.chat import Message, Request, Role, assistant_message, system_message, user_message
from scope.conversation import Conversation, TurnEventKind
from scope.errors import (
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    ProviderServerError,
    TurnInterruptedError,
    UnknownHeadError,
)
from scope.history import Batch, Unfenced, erase
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel

pytestmark = pytest.mark.anyio


class Answers:
    """A model answering ``answer <n> to <question>``, recording each question."""

    def __init__(self) -> None:
        self.asked: list[Message] = []
        self.fail = False

    def __call__(self, request: Request) -> str:
        question = request.messages[-1]
        self.asked.append(question)
        if self.fail:
            raise ProviderServerError("upstream 503")
        return f"answer {len(self.asked)} to {question.text}"

    def model(self) -> FunctionModel:
        return FunctionModel(self)


async def texts(store: InMemoryStore, cid: str = "c") -> list[str]:
    return [m.text for m in await store.read(cid)]


async def two_turns() -> tuple[InMemoryStore, Answers, Conversation]:
    store, answers = InMemoryStore(), Answers()
    conversation = Conversation(answers.model(), store, "c")
    await conversation.ask("q1")
    await conversation.ask("q2")
    return store, answers, conversation


async def test_regenerate_answers_the_last_turn_again_and_keeps_the_old_answer() -> None:
    store, answers, conversation = await two_turns()

    result = await conversation.regenerate()

    assert result.output == "answer 3 to q2"
    assert [m.text for m in result.messages] == ["q2", "answer 3 to q2"]
    assert answers.asked[-1] == user_message("q2")  # the stored question, as stored
    assert await texts(store) == ["q1", "answer 1 to q1", "q2", "answer 3 to q2"]
    tree = await store.read_tree("c")
    assert len(tree.batches) == 3  # nothing deleted: the old answer is on its branch
    assert tree.parents == (-1, 0, 0)
    assert tree.head == 2


async def test_regenerate_an_earlier_turn() -> None:
    store, _, conversation = await two_turns()
    result = await conversation.regenerate(turn=1)
    assert result.output == "answer 3 to q1"
    assert await texts(store) == ["q1", "answer 3 to q1"]
    assert (await store.read_tree("c")).parents == (-1, 0, -1)


async def test_edit_replaces_a_turn_with_a_new_message() -> None:
    store, _, conversation = await two_turns()
    result = await conversation.edit(1, "q1, edited")
    assert result.output == "answer 3 to q1, edited"
    assert await texts(store) == ["q1, edited", "answer 3 to q1, edited"]
    await conversation.ask("q2 again")
    edited = await conversation.edit(2, user_message("q2, edited"))
    assert edited.output == "answer 5 to q2, edited"
    assert await texts(store) == [
        "q1, edited",
        "answer 3 to q1, edited",
        "q2, edited",
        "answer 5 to q2, edited",
    ]
    tree = await store.read_tree("c")
    assert tree.parents == (-1, 0, -1, 2, 2)  # every old turn is still in the tree


async def test_the_streams_give_the_turns_events() -> None:
    store, _, conversation = await two_turns()
    kinds = []
    async with contextlib.aclosing(conversation.stream_regenerate()) as events:
        async for event in events:
            kinds.append(event.kind)
    assert kinds[-1] is TurnEventKind.DONE
    assert TurnEventKind.CHUNK in kinds
    async with contextlib.aclosing(conversation.stream_edit(2, "other")) as events:
        done = [event.result async for event in events if event.result is not None]
    assert done[0] is not None and done[0].output == "answer 4 to other"
    assert await texts(store) == ["q1", "answer 1 to q1", "other", "answer 4 to other"]


async def test_no_turn_to_regenerate_or_edit_is_unknown_head() -> None:
    store, answers = InMemoryStore(), Answers()
    conversation = Conversation(answers.model(), store, "c")
    with pytest.raises(UnknownHeadError, match=r"no last turn to regenerate \(it has 0 turns on"):
        await conversation.regenerate()
    await conversation.ask("q1")
    with pytest.raises(UnknownHeadError, match=r"no turn 2 to edit \(it has 1 turn on"):
        await conversation.edit(2, "x")
    with pytest.raises(UnknownHeadError, match="no turn 3 to regenerate"):
        await conversation.regenerate(turn=3)
    assert len(answers.asked) == 1
    assert (await store.read_tree("c")).head == 0  # nothing moved


@pytest.mark.parametrize(
    ("turn", "error"),
    [("1", TypeError), (1.0, TypeError), (True, TypeError), (0, ValueError), (-1, ValueError)],
)
async def test_a_bad_turn_is_refused_before_any_io(turn: Any, error: type[Exception]) -> None:
    _, answers, conversation = await two_turns()
    with pytest.raises(error, match="turn must be an int >= 1"):
        conversation.stream_edit(turn, "x")
    with pytest.raises(error, match="turn must be an int >= 1"):
        conversation.stream_regenerate(turn=turn)
    with pytest.raises(error, match="turn must be an int >= 1"):
        await conversation.edit(turn, "x")
    with pytest.raises(TypeError, match="expected_head must be a str"):
        conversation.stream_regenerate(expected_head=5)  # type: ignore[arg-type]
    assert len(answers.asked) == 2


async def test_a_closed_conversation_is_closed() -> None:
    store, answers, conversation = await two_turns()
    await store.clear("c")
    with pytest.raises(ConversationClosedError, match="nothing to regenerate"):
        await conversation.regenerate()
    with pytest.raises(ConversationClosedError, match="nothing to edit"):
        await conversation.edit(1, "x")
    assert len(answers.asked) == 2


async def test_expected_head_fences_the_rewind() -> None:
    store, answers, conversation = await two_turns()
    tree = await store.read_tree("c")
    first = tree.batches[0].id
    with pytest.raises(HistoryChangedError) as caught:
        await conversation.regenerate(expected_head=first)
    assert caught.value.expected_head == first
    assert caught.value.actual_head == tree.batches[1].id
    assert len(answers.asked) == 2
    assert await store.read_tree("c") == tree  # nothing moved
    result = await conversation.regenerate(expected_head=tree.batches[1].id)
    assert result.output == "answer 3 to q2"


class Racing(InMemoryStore):
    """Another turn lands right after each head move (between the rewind and the turn)."""

    def __init__(self) -> None:
        super().__init__()
        self.race = False

    async def move_head(self, conversation_id: str, head: str, **kwargs: Any) -> int:
        moved = await super().move_head(conversation_id, head, **kwargs)
        if self.race:
            self.race = False
            batch = Batch(conversation_id, "other", (user_message("o"), assistant_message("a")))
            await self.append(batch)
        return moved


async def test_a_turn_landing_after_the_rewind_stops_the_new_turn_before_the_model() -> None:
    store, answers = Racing(), Answers()
    conversation = Conversation(answers.model(), store, "c")
    await conversation.ask("q1")
    await conversation.ask("q2")
    store.race = True
    with pytest.raises(HistoryChangedError) as caught:
        await conversation.regenerate()
    assert caught.value.actual_head == "other"
    assert len(answers.asked) == 2  # the model was not called
    # The other turn stays the head (the move back is fenced by the head it moved to).
    assert await texts(store) == ["q1", "answer 1 to q1", "o", "a"]


async def test_a_turn_that_is_not_stored_moves_the_head_back() -> None:
    store, answers, conversation = await two_turns()
    before = await store.read_tree("c")
    answers.fail = True
    with pytest.raises(ProviderServerError):
        await conversation.regenerate()
    with pytest.raises(ProviderServerError):
        await conversation.edit(1, "x")
    assert await texts(store) == ["q1", "answer 1 to q1", "q2", "answer 2 to q2"]
    assert await store.read_tree("c") == before
    answers.fail = False
    # An early stop of the stream moves it back too.
    async with contextlib.aclosing(conversation.stream_regenerate()) as events:
        async for event in events:
            assert event.kind is TurnEventKind.CHUNK
            break
    assert await store.read_tree("c") == before


async def test_regenerate_needs_one_user_turn() -> None:
    store, answers = InMemoryStore(), Answers()
    conversation = Conversation(answers.model(), store, "c")
    await conversation.ask("q1")
    await store.append(Batch("c", "summary", (system_message("a summary"),)))
    with pytest.raises(ValueError, match=r"turn 2 \(batch 'summary'\) is not one user turn"):
        await conversation.regenerate()
    await store.append(
        Batch(
            "c",
            "imported",
            (user_message("a"), assistant_message("b"), user_message("c"), assistant_message("d")),
        )
    )
    with pytest.raises(ValueError, match="holds 2 user messages"):
        await conversation.regenerate()
    assert len(answers.asked) == 1
    assert (await store.read_tree("c")).head == 2


async def test_regenerate_sends_a_kept_interrupted_question_without_its_mark() -> None:
    store, answers = InMemoryStore(), Answers()
    conversation = Conversation(answers.model(), store, "c")
    marked = Message(Role.USER, user_message("q").parts, {"scope/interrupted": "stopped"})
    await store.append(Batch("c", "kept", (marked,)))
    result = await conversation.regenerate()
    assert answers.asked == [user_message("q")]
    assert result.messages[0] == user_message("q")


async def test_expected_head_on_ask_and_stream() -> None:
    store, answers, conversation = await two_turns()
    tree = await store.read_tree("c")
    with pytest.raises(HistoryChangedError):
        await conversation.ask("q3", expected_head=tree.batches[0].id)
    with pytest.raises(HistoryChangedError):
        async with contextlib.aclosing(conversation.stream("q3", expected_head="")) as events:
            async for _ in events:
                pass
    assert len(answers.asked) == 2
    result = await conversation.ask("q3", expected_head=tree.batches[1].id)
    assert result.output == "answer 3 to q3"


@pytest.mark.parametrize("on_overlap", ["reject", "wait", "interrupt"])
async def test_regenerate_under_a_lease_strategy(on_overlap: Any) -> None:
    store, answers = InMemoryStore(), Answers()
    conversation = Conversation(answers.model(), store, "c", on_overlap=on_overlap)
    await conversation.ask("q1")
    result = await conversation.regenerate()
    assert result.output == "answer 2 to q1"
    assert await texts(store) == ["q1", "answer 2 to q1"]
    assert await store.acquire_turn("c", "someone", 1.0)  # the lease was released


class PlainStore:
    """A simple store without branches (read and append only)."""

    def __init__(self) -> None:
        self.inner = InMemoryStore()

    async def read(self, conversation_id: str) -> list[Message]:
        return await self.inner.read(conversation_id)

    async def append(self, batch: Batch) -> Any:
        return await self.inner.append(batch)


async def test_a_store_without_branches_is_a_type_error() -> None:
    answers = Answers()
    conversation = Conversation(answers.model(), PlainStore(), "c", layers=(Unfenced(),))  # type: ignore[arg-type]
    await conversation.ask("q1")
    with pytest.raises(TypeError, match="regenerate needs a store with branches"):
        await conversation.regenerate()
    with pytest.raises(TypeError, match="edit needs a store with branches"):
        await conversation.edit(1, "x")
    assert len(answers.asked) == 1


class Meddling(Answers):
    """Answers, and while answering the ``when``-th question does ``act`` to the store."""

    def __init__(self, store: InMemoryStore, when: int, act: str) -> None:
        super().__init__()
        self.store, self.when, self.act = store, when, act

    async def __call__(self, request: Request) -> str:  # type: ignore[override]
        text = Answers.__call__(self, request)
        if len(self.asked) == self.when:
            if self.act == "append":
                other = (user_message("o"), assistant_message("a"))
                await self.store.append(Batch("c", "other", other))
            elif self.act == "erase":
                await erase(self.store, "c")
            else:
                await self.store.clear("c")
        return text


async def test_a_turn_landing_while_the_new_turn_runs_wins_the_commit() -> None:
    store = InMemoryStore()
    answers = Meddling(store, 3, "append")
    conversation = Conversation(answers.model(), store, "c")
    await conversation.ask("q1")
    await conversation.ask("q2")
    with pytest.raises(CommitError) as caught:
        await conversation.regenerate()
    assert not caught.value.retryable
    assert isinstance(caught.value.__cause__, HistoryChangedError)
    assert caught.value.__cause__.expected_head == (await store.read_tree("c")).batches[0].id
    # The other turn stays the head; the regenerated answer was never stored.
    assert await texts(store) == ["q1", "answer 1 to q1", "o", "a"]
    assert len((await store.read_tree("c")).batches) == 3


@pytest.mark.parametrize("act", ["clear", "erase"])
async def test_a_conversation_closed_during_a_regenerate_is_not_logged_by_id(
    caplog: pytest.LogCaptureFixture, act: str
) -> None:
    # An erase racing a regenerate: the head cannot move back (no head is left), and no
    # log line names the conversation, whose id the store no longer keeps.
    store = InMemoryStore()
    answers = Meddling(store, 2, act)
    conversation = Conversation(answers.model(), store, "c")
    await conversation.ask("q1")
    with caplog.at_level(logging.DEBUG), pytest.raises(CommitError):
        await conversation.regenerate()
    assert caplog.records  # the debug line was written, without the id
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "'c'" not in caplog.text and '"c"' not in caplog.text
    assert (await store.read_tree("c")).closed


class LosingMoves(InMemoryStore):
    """A store whose head moves after the first fail as if the batch vanished."""

    moves = 0

    async def move_head(self, *args: Any, **kwargs: Any) -> int:
        self.moves += 1
        if self.moves > 1:
            raise UnknownHeadError("conversation 'c' holds no batch 'x'")
        return await super().move_head(*args, **kwargs)


async def test_a_move_back_that_fails_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = LosingMoves()
    answers = Meddling(store, 2, "append")
    conversation = Conversation(answers.model(), store, "c")
    await conversation.ask("q1")
    with caplog.at_level(logging.WARNING, logger="scope.history"), pytest.raises(CommitError):
        await conversation.regenerate()
    assert any(
        "the head could not move back" in r.getMessage() and "UnknownHeadError" in r.getMessage()
        for r in caplog.records
    )


async def test_a_cancelled_regenerate_moves_the_head_back() -> None:
    store, answers = InMemoryStore(), Answers()

    async def slow(request: Request) -> str:
        text = answers(request)
        if len(answers.asked) > 1:
            await anyio.sleep(10)
        return text

    conversation = Conversation(FunctionModel(slow), store, "c")
    await conversation.ask("q1")
    before = await store.read_tree("c")
    with anyio.move_on_after(0.2) as scope:
        await conversation.regenerate()
    assert scope.cancelled_caught
    assert len(answers.asked) == 2  # it was answering
    assert await store.read_tree("c") == before


async def test_regenerate_through_a_window() -> None:
    store, answers = InMemoryStore(), Answers()
    replayed: list[int] = []

    def answer(request: Request) -> str:
        replayed.append(len(request.messages))
        return answers(request)

    conversation = Conversation(FunctionModel(answer), store, "c", limit=2)
    for question in ("q1", "q2", "q3"):
        await conversation.ask(question)
    result = await conversation.regenerate()
    assert result.output == "answer 4 to q3"
    assert replayed == [1, 3, 3, 3]  # the window: the last stored turn and the question
    assert (await texts(store))[-2:] == ["q3", "answer 4 to q3"]
    edited = await conversation.edit(1, "q0")
    assert edited.output == "answer 5 to q0"
    assert replayed[-1] == 1


class Steps(InMemoryStore):
    """The in-memory store, recording its head moves and lease releases in order."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []

    async def move_head(self, conversation_id: str, head: str, **kwargs: Any) -> int:
        moved = await super().move_head(conversation_id, head, **kwargs)
        self.steps.append(f"move {head}")
        return moved

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        released = await super().release_turn(conversation_id, holder)
        if released:
            self.steps.append("release")
        return released


@pytest.mark.parametrize("strategy", ["wait", "interrupt"])
async def test_a_failed_regenerate_moves_the_head_back_before_it_gives_up_the_lease(
    strategy: str,
) -> None:
    """The head moves back while the failed turn still holds the lease, so the turn
    that waited for it reads the head as it was, and is stored (moved back after the
    release, it could be refused at its commit after its model call)."""
    store = Steps()
    regenerating, fail = anyio.Event(), anyio.Event()
    asked: list[str] = []

    async def answer(request: Request) -> str:
        question = request.messages[-1].text
        asked.append(question)
        if question == "q2" and asked.count("q2") == 2:  # the regenerate
            regenerating.set()
            await fail.wait()
            raise ProviderServerError("upstream 503")
        return f"answer to {question}"

    conversation = Conversation(FunctionModel(answer), store, "c", on_overlap="wait")
    other = Conversation(FunctionModel(answer), store, "c", on_overlap=strategy)
    await conversation.ask("q1")
    await conversation.ask("q2")
    head = (await store.read_view("c")).head
    store.steps.clear()
    outcomes: list[object] = []

    async def regenerate() -> None:
        try:
            await conversation.regenerate()
        except Exception as exc:
            outcomes.append(type(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(regenerate)
        await regenerating.wait()
        tg.start_soon(other.ask, "q3")
        await anyio.wait_all_tasks_blocked()  # q3 waits for the lease (or stops the turn)
        fail.set()

    assert outcomes in ([ProviderServerError], [TurnInterruptedError])
    first = (await store.read_tree("c")).batches[0].id
    # Moved, moved back, and only then released (the regenerate's lease).
    assert store.steps[:3] == [f"move {first}", f"move {head}", "release"]
    assert await texts(store) == [
        "q1",
        "answer to q1",
        "q2",
        "answer to q2",
        "q3",
        "answer to q3",
    ]
