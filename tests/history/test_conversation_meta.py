"""``ConversationMeta``: every field rule, with the bad input and the error it raises."""

from __future__ import annotations

import math

import pytest

from scope.errors import InvalidViewError
from scope.history import AppendID, ConversationMeta


def test_defaults_are_an_unknown_conversation() -> None:
    meta = ConversationMeta()
    assert (meta.owner, meta.expires_at, meta.retained, meta.moves) == (None, None, False, ())
    assert meta.closure is None


@pytest.mark.parametrize("closure", ["cleared", "expired", "erased"])
def test_each_closure_is_valid(closure: str) -> None:
    assert ConversationMeta(closure=closure).closure == closure  # type: ignore[arg-type]
    if closure != "erased":  # a cleared or expired conversation keeps its owner
        assert ConversationMeta("alice", closure=closure).owner == "alice"  # type: ignore[arg-type]


def test_moves_are_sorted_by_move_id() -> None:
    meta = ConversationMeta(moves=[("m2", "a1"), ("m1", "")])
    assert meta.moves == (("m1", ""), ("m2", "a1"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"owner": ""}, "owner"),
        ({"owner": "nul\x00"}, "owner"),
        ({"owner": 7}, "owner"),
        ({"expires_at": 1}, "expires_at"),
        ({"expires_at": math.inf}, "expires_at"),
        ({"expires_at": math.nan}, "expires_at"),
        ({"retained": 1}, "retained"),
        ({"moves": [("m1",)]}, "moves"),
        ({"moves": [("m1", 3)]}, "moves"),
        ({"moves": [(" m1", "a1")]}, "moves"),
        ({"moves": [("m1", " a1")]}, "moves"),
        ({"moves": [("m1", "a1"), ("m1", "a2")]}, "given twice"),
        ({"closure": "deleted"}, "closure must be one of cleared, expired, erased"),
        ({"closure": ""}, "closure must be one of"),
        ({"closure": 1}, "closure must be one of"),
        ({"closure": "erased", "owner": "alice"}, "an erased conversation keeps nothing"),
        ({"closure": "erased", "expires_at": 1.0}, "an erased conversation keeps nothing"),
        ({"closure": "erased", "retained": True}, "an erased conversation keeps nothing"),
        ({"closure": "erased", "moves": [("m1", "")]}, "an erased conversation keeps nothing"),
    ],
)
def test_invalid_fields_raise_invalid_view_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidViewError, match=message):
        ConversationMeta(**kwargs)  # type: ignore[arg-type]


def test_moves_of_str_subclasses_are_plain_strings() -> None:
    meta = ConversationMeta(moves=[(AppendID("m1"), AppendID("a1"))])
    assert meta.moves == (("m1", "a1"),)
    assert all(type(x) is str for x in meta.moves[0])
