"""``decode_record`` (the stored-record check every store's read runs) against the
reference check it must equal: digest over the bytes, the exact reader, every message
decoded strictly and complete, and encoding the decoded messages again gives the bytes
back. For random valid records and records with one member changed, both accept or
both refuse (with ``StoreError``), and accepted records decode to equal values."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope._documents import decode_messages, digest_of
from scope._json import parse_exact_fast
from scope.chat import Message, assistant_message, text_part, tool_call_delta_part
from scope.codec import encode_messages
from scope.errors import StoreError
from scope.historystores._records import corrupt, decode_record
from tests.chat.test_codec_canonical import NAMES, VALUES, _dicts
from tests.strategies import messages


def reference(data: bytes) -> tuple[Message, ...]:
    """The record's messages, checked the long way (no fast path, nothing skipped)."""

    def fail(problem: str) -> StoreError:
        return corrupt("c", "a", problem)

    try:
        tree = parse_exact_fast(data)
    except ValueError as exc:
        raise fail(f"invalid JSON: {exc}") from None
    if type(tree) is not list or not tree:
        raise fail("messages are not a non-empty JSON array")
    out = decode_messages(tree, fail)  # strict, and complete: no tool_call_delta parts
    if encode_messages(out) != data:
        raise fail("messages are not in the canonical encoding")
    return out


def verdicts(data: bytes) -> tuple[Any, Any]:
    """(``decode_record``'s messages or error type, the reference's)."""
    outcomes = []
    for check in (lambda: decode_record("c", "a", digest_of(data), data), lambda: reference(data)):
        try:
            outcomes.append(check())
        except StoreError as exc:
            outcomes.append(type(exc))
    return outcomes[0], outcomes[1]


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(deltas=True), min_size=1, max_size=4), st.data())
def test_decode_record_equals_the_reference_check(
    drawn: list[Message], data: st.DataObject
) -> None:
    tree = orjson.loads(encode_messages(drawn))
    for _ in range(data.draw(st.integers(0, 2))):  # 0: a valid record as scope writes it
        target = data.draw(st.sampled_from(_dicts(tree)))
        value = copy.deepcopy(data.draw(st.sampled_from(VALUES)))
        target[data.draw(st.sampled_from(NAMES))] = value
    raw = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
    fast, slow = verdicts(raw)
    assert fast == slow
    if isinstance(slow, tuple):
        for message in fast:
            assert message._json == encode_messages([message])[1:-1]


@pytest.mark.parametrize(
    "record",
    [
        # A tool_call_delta part: refused whichever way its token is spelled around it.
        encode_messages([assistant_message(tool_call_delta_part("c1", "f", "{"))]),
        encode_messages([assistant_message("x", tool_call_delta_part("c1", "f"))]),
    ],
)
def test_an_incomplete_message_is_refused_naming_its_part(record: bytes) -> None:
    with pytest.raises(StoreError, match=r"parts\[\d\]: a stored message must be complete"):
        decode_record("c", "a", digest_of(record), record)


def test_the_delta_token_inside_a_text_is_just_text() -> None:
    # The kind's token inside a text: the record is complete and decodes as written.
    message = assistant_message(text_part('say "tool_call_delta'))  # written ...delta"
    record = encode_messages([message])
    assert b'"tool_call_delta"' in record
    assert decode_record("c", "a", digest_of(record), record) == (message,)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t[0].__setitem__("role", "robot"), "messages[0]"),
        (lambda t: t[0]["parts"][0].__setitem__("kind", 1), "messages[0]"),
        (lambda t: t[0]["parts"][0].__setitem__("text", ""), "messages[0]"),
        (lambda t: t[0]["parts"][0].__setitem__("media", None), "canonical"),
        (lambda t: t[0].__setitem__("metadata", {}), "canonical"),
        (lambda t: t[0].__setitem__("extra", 1), "messages[0]"),
        (lambda t: t[0].__setitem__("parts", []), "messages[0]"),
    ],
    ids=["role", "kind-type", "empty-text", "null-media", "empty-metadata", "unknown", "no-parts"],
)
def test_one_broken_member_is_refused_as_the_reference_refuses_it(
    change: Any, problem: str
) -> None:
    tree = orjson.loads(encode_messages([assistant_message("hello")]))
    change(tree)
    record = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
    with pytest.raises(StoreError, match="'c': stored batch 'a' is corrupt") as caught:
        decode_record("c", "a", digest_of(record), record)
    assert problem in str(caught.value)
    with pytest.raises(StoreError):
        reference(record)


class _EqualToAll(str):
    """A str that says it equals anything (what no driver returns; still refused)."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


RECORD = encode_messages((assistant_message("hi"),))


@pytest.mark.parametrize(
    ("digest", "problem"),
    [
        (digest_of(RECORD).encode(), "invalid digest b'sha256:"),
        (digest_of(RECORD)[7:], "invalid digest '"),
        (_EqualToAll("x"), "invalid digest 'x'"),
        (_EqualToAll(digest_of(RECORD)), None),
        ("sha256:" + "0" * 64, f"its messages digest to {digest_of(RECORD)}, the record says"),
    ],
)
def test_a_record_digest_is_checked_before_anything_else(digest: Any, problem: str | None) -> None:
    if problem is None:  # a str subclass holding the digest: the checks as for a str
        assert decode_record("c", "a", digest, RECORD) == (assistant_message("hi"),)
        return
    with pytest.raises(StoreError) as caught:
        decode_record("c", "a", digest, RECORD)
    assert f"stored batch 'a' is corrupt: {problem}" in str(caught.value)
