"""The stored-record check without re-encoding (``scope.codec.decode_canonical``): it
calls bytes canonical exactly when encoding the decoded messages again gives them back."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope import codec
from scope._codec._generated import NAMESPACE
from scope.chat import Message, Role, ToolOutput, ToolResult, text_part, tool_result_part
from scope.codec import encode_messages, from_json
from tests.strategies import messages

#: Member names of the message value classes, and values the encoder omits or writes
#: in another form: what a hand-written (not scope-written) record could hold.
NAMES = ["text", "media", "metadata", "signature", "tool_call", "arguments", "is_error"]
NAMES += ["content", "details", "id", "name", "uri", "ref", "data", "bytes", "output"]
VALUES: list[Any] = ["", 0, False, [], {}, None, 0.0, 1, "x", True, {"a": 1}]


def _dicts(tree: Any) -> list[dict[str, Any]]:
    """Every object in ``tree``."""
    if isinstance(tree, dict):
        return [tree, *(d for v in tree.values() for d in _dicts(v))]
    if isinstance(tree, list):
        return [d for v in tree for d in _dicts(v)]
    return []


def _fresh_bytes(message: Message) -> bytes:
    """The message's canonical bytes, computed (not read from its cache)."""
    return orjson.dumps(NAMESPACE["fields_Message"](message), option=orjson.OPT_SORT_KEYS)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(deltas=True), min_size=1, max_size=4), st.data())
def test_the_verdict_equals_encoding_again(drawn: list[Message], data: st.DataObject) -> None:
    tree = orjson.loads(encode_messages(drawn))
    for _ in range(data.draw(st.integers(0, 3))):
        target = data.draw(st.sampled_from(_dicts(tree)))
        value = copy.deepcopy(data.draw(st.sampled_from(VALUES)))  # no shared objects
        target[data.draw(st.sampled_from(NAMES))] = value
    raw = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
    try:
        decoded = from_json(raw, list[Message])
    except ValueError:
        assert codec.decode_canonical(raw) is None  # does not decode: the exact path
        return
    found = codec.decode_canonical(raw)
    assert found is not None
    values, canonical = found
    assert list(values) == decoded
    assert canonical == (encode_messages(decoded) == raw)
    if canonical:
        for message in values:
            assert message._json == _fresh_bytes(message)


@pytest.mark.parametrize(
    ("member", "value"),
    [("metadata", {}), ("text", ""), ("details", None), ("is_error", False)],
)
def test_a_member_at_its_default_is_not_canonical(member: str, value: Any) -> None:
    message = Message(Role.TOOL, (tool_result_part(ToolResult("c", "f", ToolOutput())),))
    tree = orjson.loads(encode_messages((message,)))
    part = tree[0]["parts"][0]
    where = {"metadata": tree[0], "text": part, "is_error": part["tool_result"]}
    where.get(member, part["tool_result"]["output"])[member] = value
    raw = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
    assert from_json(raw, list[Message]) == [message]  # the strict decoder accepts it
    assert codec.decode_canonical(raw) == ((message,), False)


def test_the_always_written_member_at_its_default_is_canonical() -> None:
    message = Message(Role.TOOL, (tool_result_part(ToolResult("c", "f", ToolOutput())),))
    raw = encode_messages((message,))
    assert b'"output":{}' in raw
    assert codec.decode_canonical(raw) == ((message,), True)


def test_other_spellings_take_the_exact_path() -> None:
    raw = encode_messages((Message(Role.USER, (text_part("hi"),)),))
    assert codec.decode_canonical(raw.replace(b":", b": ")) is None  # whitespace
    assert codec.decode_canonical(b'[{"role":"user","parts":[]}]') is None  # key order
    assert codec.decode_canonical(b"[]") is None
    assert codec.decode_canonical(b"{}") is None
    assert codec.decode_canonical(b"[1") is None
