"""``HistoryView``, ``Batch.expected_length`` and ``HistoryChangedError``: the values of
DESIGN §6b, their validation and their JSON form."""

from __future__ import annotations

import pickle
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.chat import assistant_message, user_message
from scope.errors import (
    CommitError,
    HistoryChangedError,
    HistoryError,
    InvalidBatchError,
    InvalidViewError,
)
from scope.history import Batch, HistoryView, Reader, ViewReader

TURN = (user_message("q"), assistant_message("a"))


# ---------------------------------------------------------------- HistoryView


def test_view_holds_messages_length_and_closure() -> None:
    view = HistoryView(list(TURN), 2)
    assert view.messages == TURN and type(view.messages) is tuple
    assert (view.length, view.closed) == (2, False)
    assert HistoryView((), 0, True).closed is True
    # A window's view: fewer messages than the conversation holds.
    assert HistoryView(TURN[1:], 9).length == 9
    assert HistoryView(TURN, 2) == HistoryView(list(TURN), 2)
    view.validate()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"messages": "text", "length": 0}, "sequence of messages"),
        ({"messages": b"x", "length": 0}, "sequence of messages"),
        ({"messages": 3, "length": 0}, "sequence of messages"),
        ({"messages": [user_message("q"), "a"], "length": 2}, r"messages\[1\] must be a Message"),
        ({"messages": (), "length": -1}, "between 0 and"),
        ({"messages": (), "length": 2**63}, "between 0 and"),
        ({"messages": (), "length": True}, "must be an int"),
        ({"messages": (), "length": 1.0}, "must be an int"),
        ({"messages": (), "length": "3"}, "must be an int"),
        ({"messages": (), "length": 0, "closed": 1}, "must be a bool"),
        ({"messages": (), "length": 0, "closed": None}, "must be a bool"),
        ({"messages": TURN, "length": 2, "closed": True}, "closed conversation's view"),
    ],
)
def test_invalid_views_are_refused(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidViewError, match=problem):
        HistoryView(**kwargs)


def test_evolve_revalidates_a_view() -> None:
    view = HistoryView(TURN, 2)
    with pytest.raises(InvalidViewError):
        attrs.evolve(view, closed=True)
    with pytest.raises(InvalidViewError):
        attrs.evolve(view, length=-2)


def test_view_reader_is_a_separate_optional_protocol() -> None:
    class OnlyRead:
        async def read(self, conversation_id: str) -> list[Any]:
            return []

    class WithView(OnlyRead):
        async def read_view(self, conversation_id: str) -> HistoryView:
            return HistoryView((), 0)

    assert isinstance(OnlyRead(), Reader) and not isinstance(OnlyRead(), ViewReader)
    assert isinstance(WithView(), ViewReader)


# ---------------------------------------------------------------- expected_length


def test_expected_length_is_not_part_of_the_content() -> None:
    plain = Batch("c", "a1", TURN)
    fenced = Batch("c", "a1", TURN, expected_length=4)
    assert fenced.expected_length == 4 and plain.expected_length is None
    assert fenced.digest == plain.digest
    assert fenced.encoded_messages == plain.encoded_messages
    assert fenced == plain and hash(fenced) == hash(plain)
    assert fenced.receipt() == plain.receipt()
    assert plain.fenced(4).expected_length == 4
    assert fenced.fenced(None).expected_length is None
    assert fenced.fenced(0).encoded_messages is fenced.encoded_messages
    assert Batch("c", "a1", TURN, expected_length=0).expected_length == 0


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-1, "between 0 and"),
        (2**63, "between 0 and"),
        (True, "int or None"),
        (1.0, "int or None"),
        ("2", "int or None"),
    ],
)
def test_invalid_expected_length_is_refused(value: Any, problem: str) -> None:
    with pytest.raises(InvalidBatchError, match=problem):
        Batch("c", "a1", TURN, expected_length=value)
    with pytest.raises(InvalidBatchError, match=problem):
        Batch("c", "a1", TURN).fenced(value)


def test_json_form_has_expected_length_only_when_set() -> None:
    plain = Batch("c", "a1", TURN)
    assert b"expected_length" not in plain.to_json()
    fenced = plain.fenced(6)
    document = orjson.loads(fenced.to_json())
    assert document["expected_length"] == 6
    assert list(document) == sorted(document)  # still canonical: sorted keys
    decoded = Batch.from_json(fenced.to_json())
    assert decoded == fenced and decoded.expected_length == 6
    assert Batch.from_json(plain.to_json()).expected_length is None


@pytest.mark.parametrize("bad", ["true", '"6"', "6.0", "-1", "null"])
def test_json_with_an_invalid_expected_length_is_refused(bad: str) -> None:
    document = orjson.loads(Batch("c", "a1", TURN).to_json())
    text = orjson.dumps(document).decode()[:-1] + f',"expected_length":{bad}}}'
    if bad == "null":
        assert Batch.from_json(text).expected_length is None  # null: no fence
        return
    with pytest.raises(InvalidBatchError, match="expected_length"):
        Batch.from_json(text)


@given(st.one_of(st.none(), st.integers(0, 2**63 - 1)))
def test_expected_length_round_trips_through_json(value: int | None) -> None:
    batch = Batch("c", "a1", TURN, expected_length=value)
    assert Batch.from_json(batch.to_json()).expected_length == value


# ---------------------------------------------------------------- the errors


def test_history_changed_error_carries_both_lengths_and_pickles() -> None:
    err = HistoryChangedError(2, 5, "c")
    assert isinstance(err, HistoryError)
    assert (err.expected, err.actual, err.conversation_id) == (2, 5, "c")
    assert "conversation 'c' holds 5 messages, the batch expected 2" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.expected, again.actual, str(again)) == (
        HistoryChangedError,
        2,
        5,
        str(err),
    )
    assert "the conversation holds 1" in str(HistoryChangedError(0, 1))


def test_commit_error_retryable_defaults_to_true() -> None:
    from scope.chat import FinishReason, Output, Response

    response = Response(Output(assistant_message("a"), FinishReason.STOP))
    batch = Batch("c", "a1", TURN)
    assert CommitError("x", batch=batch, response=response).retryable is True
    assert CommitError("x", batch=batch, response=response, retryable=False).retryable is False
