"""The backend kit every persistent store shares (``scope.historystores._driver``,
``_store`` and ``_records``): what a server-side append's outcome means, the retry-once
wrapper, the driver error mapping and the decoding of stored conversation ids, each in
one place."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from scope.chat import assistant_message, user_message
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidConversationIDError,
    StoreError,
)
from scope.history import Batch, ConversationID
from scope.historystores._driver import (
    Driver,
    retry_once,
    store_closed,
)
from scope.historystores._records import (
    ListedIDs,
    stored_id,
)
from scope.historystores._store import (
    check_outcome,
)

BATCH = Batch("c", "a1", [user_message("q"), assistant_message("a")], expected_length=4)


def test_inserted_and_a_retry_of_the_same_digest_are_fine() -> None:
    check_outcome(BATCH, "inserted", "the script")
    check_outcome(BATCH, f"accepted:{BATCH.digest}", "the script")


def test_each_refusal_is_its_own_error() -> None:
    with pytest.raises(ConversationClosedError, match="conversation 'c' is closed"):
        check_outcome(BATCH, "closed", "the script")
    with pytest.raises(AppendConflictError, match="was accepted with digest sha256:00"):
        check_outcome(BATCH, "accepted:sha256:00", "the script")
    with pytest.raises(HistoryChangedError) as caught:
        check_outcome(BATCH, "changed:6", "the script")
    assert (caught.value.expected, caught.value.actual) == (4, 6)


@pytest.mark.parametrize("outcome", ["", "inserted!", "changed:", "changed:x", "deleted"])
def test_anything_else_names_its_source(outcome: str) -> None:
    with pytest.raises(StoreError, match="the script returned"):
        check_outcome(BATCH, outcome, "the script")


def test_a_fence_outcome_for_an_unfenced_batch_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="returned 'changed:2'"):
        check_outcome(BATCH.fenced(None), "changed:2", "the script")


def test_the_outcome_may_come_as_bytes() -> None:
    check_outcome(BATCH, b"inserted", "the script")
    with pytest.raises(ConversationClosedError):
        check_outcome(BATCH, b"closed", "the script")
    with pytest.raises(StoreError, match="the script returned 'x\ufffd'"):
        check_outcome(BATCH, b"x\xff", "the script")


# -- retry_once ---------------------------------------------------------------------


class Dropped(ConnectionError):
    """The connection went away (retryable)."""


class Slow(TimeoutError):
    """A timeout (never retried)."""


class Refused(Exception):
    """A deterministic driver error (mapped, never retried)."""


DRIVER = Driver("Fake", errors=(Refused, OSError), retryable=(ConnectionError,), timeouts=(Slow,))


class FakeStore:
    """What ``retry_once`` needs: ``closed``, ``_timed_out`` and ``_reconnect``."""

    def __init__(self) -> None:
        self.closed = False
        self.reconnects = 0

    def _timed_out(self, exc: BaseException, what: str) -> StoreError:
        return StoreError(f"Fake {what} timed out: {exc}")

    async def _reconnect(self) -> None:
        self.reconnects += 1


def attempts(*outcomes: BaseException | str) -> tuple[Callable[[], Awaitable[str]], list[int]]:
    """An attempt that raises or returns each outcome in turn, and its call count."""
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(len(calls))
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return attempt, calls


@pytest.mark.anyio
async def test_a_dropped_connection_is_retried_once_on_a_fresh_one() -> None:
    store = FakeStore()
    attempt, calls = attempts(Dropped("gone"), "done")
    assert await retry_once(store, DRIVER, attempt, "read") == "done"
    assert (len(calls), store.reconnects) == (2, 1)


@pytest.mark.anyio
async def test_a_second_drop_is_a_store_error_naming_the_retry() -> None:
    store = FakeStore()
    second = Dropped("gone again")
    attempt, calls = attempts(Dropped("gone"), second)
    with pytest.raises(StoreError) as caught:
        await retry_once(store, DRIVER, attempt, "read")
    assert str(caught.value) == (
        "Fake read (retried on a fresh connection) failed: Dropped: gone again"
    )
    assert caught.value.__cause__ is second
    assert len(calls) == 2


@pytest.mark.anyio
async def test_timeouts_and_other_errors_are_not_retried() -> None:
    for failure, text in [
        (Slow("late"), "Fake append timed out: late"),
        (Refused("no"), "Fake append failed: Refused: no"),
        (OSError("disk"), "Fake append failed: OSError: disk"),
    ]:
        store = FakeStore()
        attempt, calls = attempts(failure)
        with pytest.raises(StoreError) as caught:
            await retry_once(store, DRIVER, attempt, "append")
        assert str(caught.value) == text
        assert caught.value.__cause__ is failure
        assert (len(calls), store.reconnects) == (1, 0)


@pytest.mark.anyio
async def test_an_answer_of_the_server_is_never_retried_even_from_inside_the_driver() -> None:
    # redis-py raises WRONGTYPE from inside its package, where an unknown exception counts
    # as a dropped connection: ``answers`` picks it out first.
    class Answer(Exception):
        pass

    driver = Driver(
        "Fake",
        errors=(Answer, Refused),
        retryable=(ConnectionError, Answer),
        package="tests",
        answers=lambda exc: isinstance(exc, Answer) and str(exc).startswith("WRONGTYPE"),
    )
    wrong = Answer("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert driver.kind(wrong) == "error"
    assert driver.kind(Answer("TRYAGAIN")) == "retry"
    store = FakeStore()
    attempt, calls = attempts(wrong, "never")
    with pytest.raises(StoreError) as caught:
        await retry_once(store, driver, attempt, "append")
    assert str(caught.value) == f"Fake append failed: Answer: {wrong}"
    assert "retried" not in str(caught.value)
    assert (len(calls), store.reconnects) == (1, 0)


@pytest.mark.anyio
async def test_a_store_closed_meanwhile_refuses_the_retry() -> None:
    store = FakeStore()
    store.closed = True
    attempt, calls = attempts(Dropped("gone"), "never")
    with pytest.raises(StoreError, match=r"^the FakeStore is closed$"):
        await retry_once(store, DRIVER, attempt, "read")
    assert (len(calls), store.reconnects) == (1, 0)


@pytest.mark.anyio
async def test_settle_runs_after_each_attempt_and_may_raise_instead() -> None:
    seen: list[Any] = []

    async def settle(exc: BaseException | None) -> None:
        seen.append(exc)

    drop = Dropped("gone")
    attempt, _ = attempts(drop, "done")
    assert await retry_once(FakeStore(), DRIVER, attempt, "read", settle) == "done"
    assert seen == [drop, None]

    class Cancelled(BaseException):
        pass

    async def cancel(exc: BaseException | None) -> None:
        raise Cancelled from exc

    store = FakeStore()
    attempt, calls = attempts(Dropped("gone"), "never")
    with pytest.raises(Cancelled):
        await retry_once(store, DRIVER, attempt, "read", cancel)
    assert (len(calls), store.reconnects) == (1, 0)


def test_driver_failure_and_closed_store_texts() -> None:
    assert str(DRIVER.failed(Refused("x"), "clear of conversation 'c'")) == (
        "Fake clear of conversation 'c' failed: Refused: x"
    )
    assert type(store_closed("SQLiteStore")) is StoreError
    assert str(store_closed("SQLiteStore")) == "the SQLiteStore is closed"


# -- stored conversation ids ----------------------------------------------------------


def test_stored_ids_decode_from_text_or_utf8_bytes() -> None:
    for raw in (
        "c\u00e9",
        "c\u00e9".encode(),
        bytearray("c\u00e9".encode()),
        memoryview(b"c\xc3\xa9"),
    ):
        found = stored_id(raw)
        assert type(found) is ConversationID and found == "c\u00e9"
    with pytest.raises(ValueError, match=r"^conversation id is not UTF-8: ") as caught:
        stored_id(b"\xff")
    assert type(caught.value) is ValueError
    with pytest.raises(ValueError, match=r"^conversation id is stored as int$"):
        stored_id(7)
    with pytest.raises(InvalidConversationIDError):
        stored_id(" padded ")


def test_listed_ids_skip_and_remember_what_stored_id_refuses() -> None:
    listed = ListedIDs("FakeStore")
    assert listed.valid([b"a", "b", b"\xff", 7, " c", b"a"]) == ["a", "b", "a"]
    assert listed.invalid == (" c", "7", "\\xff")


@pytest.mark.anyio
async def test_an_odd_exception_from_inside_the_driver_package_is_retried_then_mapped() -> None:
    # The driver package here is json: an exception its code raises that the driver
    # table does not list (as redis-py raises AttributeError from a torn-down
    # connection) is the driver's failure.
    driver = Driver("Fake", errors=(Refused,), package="json")
    store = FakeStore()
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        return str(json.loads("{"))

    with pytest.raises(
        StoreError, match=r"retried on a fresh connection\) failed: JSONDecodeError"
    ):
        await retry_once(store, driver, attempt, "append")
    assert (len(calls), store.reconnects) == (2, 1)


@pytest.mark.anyio
async def test_an_odd_exception_from_scope_code_is_not_the_drivers() -> None:
    driver = Driver("Fake", errors=(Refused,), package="json")
    store = FakeStore()

    async def attempt() -> str:
        raise AttributeError("a bug of ours")

    with pytest.raises(AttributeError, match="a bug of ours"):
        await retry_once(store, driver, attempt, "append")
    assert store.reconnects == 0
