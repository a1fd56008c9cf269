"""Batch (validation, canonical digest, JSON) and Receipt."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.chat import (
    Message,
    Role,
    ToolOutput,
    ToolResult,
    assistant_message,
    system_message,
    text_part,
    tool_call_delta_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.codec import encode_messages, from_json, to_builtins, to_json
from scope.errors import (
    InvalidAppendIDError,
    InvalidBatchError,
    InvalidConversationIDError,
    InvalidReceiptError,
)
from scope.history import AppendID, Batch, ConversationID, Receipt
from scope.history.storetest import rich_messages
from scope.jsonvalue import RawJSON
from tests.strategies import messages as message_strategy


def _meta_message(raw: str) -> Message:
    return user_message(text_part("x", metadata={"k": RawJSON.parse(raw)}))


def _digest(messages: list[Message]) -> str:
    return Batch("c", "a", messages).digest


# -- digest ------------------------------------------------------------------------------


def test_digest_is_sha256_of_the_canonical_message_array() -> None:
    messages = rich_messages()
    batch = Batch("c", "a", messages)
    assert batch.encoded_messages == encode_messages(messages) == to_json(messages)
    assert batch.digest == "sha256:" + hashlib.sha256(batch.encoded_messages).hexdigest()
    assert batch.encoded_messages.startswith(b"[") and batch.encoded_messages.endswith(b"]")
    assert batch.encoded_messages == b"[" + b",".join(to_json(m) for m in messages) + b"]"
    assert orjson.loads(batch.encoded_messages) == [to_builtins(m) for m in messages]


def test_digest_ignores_key_order_and_whitespace_inside_raw_json() -> None:
    a = _meta_message('{"b": 1, "a": [1, 2]}')
    b = _meta_message('{ "a" :[1,2],\n  "b":1 }')
    assert _digest([a]) == _digest([b])


def test_digest_ignores_how_metadata_was_built() -> None:
    a = user_message(text_part("x", metadata={"b": 1, "a": "s"}))
    b = user_message(text_part("x", metadata={"a": RawJSON.parse('"s"'), "b": RawJSON.parse("1")}))
    assert _digest([a]) == _digest([b])


@pytest.mark.parametrize(("one", "other"), [("2.5", "2.50"), ("1", "1.0"), ("1e0", "1E0")])
def test_digest_depends_on_number_spelling(one: str, other: str) -> None:
    assert _digest([_meta_message(one)]) != _digest([_meta_message(other)])


def test_digest_depends_on_string_values() -> None:
    assert _digest([_meta_message('"a"')]) != _digest([_meta_message('"b"')])
    assert _digest([user_message("hi")]) != _digest([user_message("hi!")])


def test_digest_depends_on_tool_call_argument_text() -> None:
    # Arguments are the model's text, never re-spelled: equal JSON, different text.
    a = assistant_message(tool_call_part("c1", "t", '{"a":1}'))
    b = assistant_message(tool_call_part("c1", "t", '{"a": 1}'))
    assert _digest([a]) != _digest([b])


def test_digest_depends_on_message_order_and_count() -> None:
    one, two = user_message("1"), assistant_message("2")
    assert _digest([one, two]) != _digest([two, one])
    assert _digest([one]) != _digest([one, one])


def test_digest_does_not_depend_on_ids() -> None:
    messages = [user_message("hi")]
    assert Batch("c", "a", messages).digest == Batch("d", "b", messages).digest


@given(st.lists(message_strategy(), min_size=1, max_size=4))
def test_digest_survives_a_codec_round_trip(messages: list[Message]) -> None:
    batch = Batch("c", "a", messages)
    rebuilt = Batch("c", "a", [from_json(to_json(m), Message) for m in messages])
    assert rebuilt.digest == batch.digest
    assert rebuilt == batch
    assert Batch.from_json(batch.to_json()) == batch


def test_null_tool_output_details_keep_their_digest_through_the_codec() -> None:
    # A JSON null details document is no details: the wire cannot tell them apart.
    message = tool_message(ToolResult("c1", "t", ToolOutput(details=RawJSON.parse("null"))))
    assert from_json(to_json(message), Message) == message
    assert (
        Batch("c", "a", [message]).digest
        == Batch("c", "a", [from_json(to_json(message), Message)]).digest
    )


# -- validation --------------------------------------------------------------------------


def test_batch_holds_validated_ids_and_a_tuple() -> None:
    batch = Batch("c", "a", [user_message("hi")])
    assert type(batch.conversation_id) is ConversationID
    assert type(batch.id) is AppendID
    assert batch.messages == (user_message("hi"),)
    assert len(batch) == 1
    batch.validate()
    assert batch.receipt() == Receipt("c", "a", batch.digest)


def test_batch_accepts_any_iterable() -> None:
    assert Batch("c", "a", iter([user_message("hi")])) == Batch("c", "a", (user_message("hi"),))


def test_empty_batch_is_invalid() -> None:
    with pytest.raises(InvalidBatchError, match="at least one message"):
        Batch("c", "a", [])


def test_tool_call_delta_is_invalid_in_a_batch() -> None:
    delta = assistant_message(tool_call_delta_part("c1", "t", "{"))
    with pytest.raises(InvalidBatchError, match="tool_call_delta"):
        Batch("c", "a", [user_message("hi"), delta])


@pytest.mark.parametrize(
    "messages", ["text", b"bytes", 42, None], ids=["str", "bytes", "int", "none"]
)
def test_batch_messages_must_be_a_sequence(messages: Any) -> None:
    with pytest.raises(InvalidBatchError):
        Batch("c", "a", messages)


def test_batch_items_must_be_messages() -> None:
    with pytest.raises(InvalidBatchError, match=r"messages\[1\]"):
        Batch("c", "a", [user_message("hi"), {"role": "user"}])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", ["", " c", "c\x00", "\ud800", "x" * 513, 7])
def test_bad_conversation_id_is_an_invalid_batch(bad: Any) -> None:
    with pytest.raises(InvalidBatchError) as info:
        Batch(bad, "a", [user_message("hi")])
    assert type(info.value.__cause__) is InvalidConversationIDError


@pytest.mark.parametrize("bad", ["", "a ", "a\nb", "\udfff", "é" * 257, None])
def test_bad_append_id_is_an_invalid_batch(bad: Any) -> None:
    with pytest.raises(InvalidBatchError) as info:
        Batch("c", bad, [user_message("hi")])
    assert type(info.value.__cause__) is InvalidAppendIDError


def test_batch_is_immutable() -> None:
    batch = Batch("c", "a", [user_message("hi")])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        batch.id = AppendID("b")  # type: ignore[misc]


def test_batch_equality_is_structural() -> None:
    assert Batch("c", "a", [user_message("hi")]) == Batch("c", "a", [user_message("hi")])
    assert Batch("c", "a", [user_message("hi")]) != Batch("c", "b", [user_message("hi")])
    assert hash(Batch("c", "a", [user_message("hi")])) == hash(
        Batch("c", "a", [user_message("hi")])
    )


# -- JSON --------------------------------------------------------------------------------


def test_batch_json_round_trip() -> None:
    batch = Batch("c", "a", rich_messages())
    data = batch.to_json()
    assert sorted(orjson.loads(data)) == ["conversation_id", "digest", "id", "messages"]
    assert orjson.loads(data)["digest"] == batch.digest
    decoded = Batch.from_json(data)
    assert decoded == batch
    assert decoded.encoded_messages == batch.encoded_messages
    assert decoded.to_json() == data


def test_batch_json_keeps_number_spelling() -> None:
    batch = Batch("c", "a", [_meta_message("2.50")])
    assert b"2.50" in batch.to_json()
    assert Batch.from_json(batch.to_json()).messages[0].parts[0].metadata["k"].bytes == b"2.50"


@pytest.mark.parametrize(("length", "error"), [("2", None), ("-1", "between"), ("2.0", "integer")])
def test_batch_json_expected_length_in_any_spelling(length: str, error: str | None) -> None:
    # Indented JSON takes the exact reader, which keeps number tokens as written.
    data = Batch("c", "a", [user_message("hi")], expected_length=7).to_json()
    pretty = json.dumps(json.loads(data), indent=2)
    pretty = pretty.replace('"expected_length": 7', f'"expected_length": {length}')
    if error is None:
        assert Batch.from_json(pretty).expected_length == int(length)
    else:
        with pytest.raises(InvalidBatchError, match=error):
            Batch.from_json(pretty)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (5, "^expected_head must be a str or None, got int$"),
        (b"a1", "^expected_head must be a str or None, got bytes$"),
        (" a1", "^expected_head: append id ' a1' must not have surrounding whitespace$"),
        ("a\x00b", r"^expected_head: append id 'a\\x00b' must not contain control characters$"),
    ],
)
def test_expected_head_must_be_an_append_id(bad: Any, match: str) -> None:
    with pytest.raises(InvalidBatchError, match=match):
        Batch("c", "a", [user_message("hi")], expected_head=bad)


@pytest.mark.parametrize(("length", "head"), [(None, None), (0, ""), (7, "a1")])
def test_batch_json_round_trips_the_fences(length: int | None, head: str | None) -> None:
    # The fences are not part of a batch's equality: compare them one by one.
    batch = Batch("c", "a2", [user_message("hi")], expected_length=length, expected_head=head)
    data = batch.to_json()
    tree = orjson.loads(data)
    assert tree.get("expected_length") == length and ("expected_length" in tree) == (
        length is not None
    )
    assert tree.get("expected_head") == head and ("expected_head" in tree) == (head is not None)
    for document in (data, json.dumps(tree, indent=2)):  # orjson's spelling, the exact reader
        decoded = Batch.from_json(document)
        assert decoded == batch
        assert (decoded.expected_length, decoded.expected_head) == (length, head)


@pytest.mark.parametrize(
    ("head", "match"),
    [
        (5, "^expected_head: expected a string, got int$"),
        ([], "^expected_head: expected a string, got list$"),
        (" a1", "^expected_head: append id ' a1' must not have surrounding whitespace$"),
    ],
)
def test_batch_json_expected_head_must_be_an_append_id(head: Any, match: str) -> None:
    tree = orjson.loads(Batch("c", "a", [user_message("hi")]).to_json())
    tree["expected_head"] = head
    with pytest.raises(InvalidBatchError, match=match):
        Batch.from_json(orjson.dumps(tree))


def test_batch_json_with_wrong_digest_is_invalid() -> None:
    tree = orjson.loads(Batch("c", "a", [user_message("hi")]).to_json())
    tree["digest"] = "sha256:" + "0" * 64
    with pytest.raises(InvalidBatchError, match="digest mismatch"):
        Batch.from_json(orjson.dumps(tree))


def test_batch_json_with_respelled_number_is_a_digest_mismatch() -> None:
    data = Batch("c", "a", [_meta_message("2.50")]).to_json()
    with pytest.raises(InvalidBatchError, match="digest mismatch"):
        Batch.from_json(data.replace(b"2.50", b"2.5"))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.pop("digest"),
        lambda t: t.update(extra=1),
        lambda t: t.update(messages={}),
        lambda t: t.update(messages=[]),
        lambda t: t.update(id=1),
        lambda t: t.update(conversation_id=" c"),
        lambda t: t.update(messages=[{"role": "user", "parts": []}]),
    ],
    ids=["missing", "extra", "messages-object", "no-messages", "id-int", "bad-cid", "bad-msg"],
)
def test_batch_json_shape_errors_are_invalid_batch(mutate: Any) -> None:
    tree = orjson.loads(Batch("c", "a", [user_message("hi")]).to_json())
    mutate(tree)
    with pytest.raises(InvalidBatchError):
        Batch.from_json(orjson.dumps(tree))


@pytest.mark.parametrize("data", [b"", b"[", b"\xff", b"[]", b"null"])
def test_batch_json_that_is_not_an_object_is_invalid(data: bytes) -> None:
    with pytest.raises(InvalidBatchError):
        Batch.from_json(data)


# -- Receipt -----------------------------------------------------------------------------


def test_receipt_validate_for_accepts_its_batch() -> None:
    batch = Batch("c", "a", [user_message("hi")])
    Receipt("c", "a", batch.digest).validate_for(batch)
    batch.receipt().validate_for(Batch.from_json(batch.to_json()))


@pytest.mark.parametrize(
    "receipt",
    [
        lambda b: Receipt("other", b.id, b.digest),
        lambda b: Receipt(b.conversation_id, "other", b.digest),
        lambda b: Receipt(b.conversation_id, b.id, "sha256:" + "0" * 64),
        lambda b: Batch(b.conversation_id, b.id, [user_message("bye")]).receipt(),
    ],
    ids=["conversation", "append-id", "digest", "other-batch"],
)
def test_receipt_validate_for_rejects_a_mismatch(receipt: Any) -> None:
    batch = Batch("c", "a", [user_message("hi")])
    with pytest.raises(InvalidReceiptError):
        receipt(batch).validate_for(batch)


@pytest.mark.parametrize(
    ("cid", "aid", "digest"),
    [("", "a", "sha256:00"), ("c", " a", "sha256:00"), ("c", "a", "md5:00"), ("c", "a", None)],
    ids=["bad-cid", "bad-aid", "bad-scheme", "no-digest"],
)
def test_invalid_receipt_fields(cid: str, aid: str, digest: Any) -> None:
    with pytest.raises(InvalidReceiptError):
        Receipt(cid, aid, digest)


def test_receipts_compare_by_value() -> None:
    batch = Batch("c", "a", [system_message("s"), user_message("hi")])
    assert batch.receipt() == Receipt(ConversationID("c"), AppendID("a"), batch.digest)
    assert type(batch.receipt().conversation_id) is ConversationID


def test_tool_results_and_roles_are_digested() -> None:
    ok = tool_message(ToolResult("c1", "t", ToolOutput.of_text("x")))
    err = tool_message(ToolResult("c1", "t", ToolOutput.of_text("x"), is_error=True))
    assert _digest([ok]) != _digest([err])
    assert _digest([Message(Role.USER, [text_part("x")])]) != _digest([assistant_message("x")])


@pytest.mark.parametrize(
    "digest", ["sha256:", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "sha1:" + "0" * 64]
)
def test_receipt_digest_must_be_a_sha256_hex_digest(digest: str) -> None:
    with pytest.raises(InvalidReceiptError, match="sha256:<hex>"):
        Receipt("c", "a", digest)


def test_receipt_validate_checks_a_receipt_that_came_from_elsewhere() -> None:
    receipt = Batch("c", "a", [user_message("q")]).receipt()
    receipt.validate()
    object.__setattr__(receipt, "digest", "md5:00")
    with pytest.raises(InvalidReceiptError, match="sha256:<hex>"):
        receipt.validate()
    object.__setattr__(receipt, "digest", "sha256:" + "0" * 64)
    object.__setattr__(receipt, "id", " padded")
    with pytest.raises(InvalidReceiptError, match="id"):
        receipt.validate()


# -- the one message-document decoder (scope._documents) ----------------------------


class _Corrupt(Exception):
    """A caller's own error type, as a store's ``corrupt`` builds one."""


def test_decode_messages_raises_the_callers_error_with_the_path() -> None:
    from scope._documents import decode_messages
    from scope.errors import InvalidMessageError

    good = orjson.loads(encode_messages([user_message("hi"), assistant_message("ho")]))
    assert decode_messages(good, _Corrupt) == (user_message("hi"), assistant_message("ho"))
    assert decode_messages([], _Corrupt) == ()
    with pytest.raises(_Corrupt, match=r"^messages: expected an array$"):
        decode_messages({"role": "user"}, _Corrupt)
    with pytest.raises(_Corrupt, match=r"^messages\[1\]: role: ") as caught:
        decode_messages([good[0], {"role": "nope", "parts": []}], _Corrupt)
    assert type(caught.value.__cause__) is InvalidMessageError
    delta = orjson.loads(to_json(assistant_message(tool_call_delta_part("c1", "f", "{"))))
    with pytest.raises(_Corrupt, match=r"^messages\[1\]\.parts\[0\]: a stored message must be"):
        decode_messages([good[0], delta], _Corrupt)
    # A factory works as well as a class: the stores pass their ``corrupt``.
    with pytest.raises(_Corrupt, match=r"^record 7: messages: expected an array$"):
        decode_messages("x", lambda problem: _Corrupt(f"record 7: {problem}"))


def test_batch_from_json_and_the_decoder_agree_on_messages() -> None:
    from scope._documents import decode_messages

    bad = [{"role": "user", "parts": [{"kind": "nope"}]}]
    with pytest.raises(InvalidBatchError) as direct:
        decode_messages(bad, InvalidBatchError)
    document = {"conversation_id": "c", "digest": "sha256:" + "0" * 64, "id": "a", "messages": bad}
    with pytest.raises(InvalidBatchError) as via_batch:
        Batch.from_json(orjson.dumps(document))
    assert str(via_batch.value) == str(direct.value)
    assert type(via_batch.value.__cause__) is type(direct.value.__cause__)


def test_digest_of_is_the_batch_digest() -> None:
    from scope._documents import DIGEST_PREFIX, digest_of

    batch = Batch("c", "a", rich_messages())
    assert digest_of(batch.encoded_messages) == batch.digest
    assert batch.digest.startswith(DIGEST_PREFIX)
    assert digest_of(b"[]") == "sha256:" + hashlib.sha256(b"[]").hexdigest()


def test_check_messages_is_the_batch_rule() -> None:
    from scope._documents import check_messages

    check_messages((user_message("x"),), _Corrupt)
    with pytest.raises(_Corrupt, match=r"^a batch needs at least one message$"):
        check_messages((), _Corrupt)
    with pytest.raises(_Corrupt, match=r"^messages\[1\] must be a Message, got str$"):
        check_messages((user_message("x"), "y"), _Corrupt)  # type: ignore[arg-type]
    delta = assistant_message(tool_call_delta_part("c1", "f", "{"))
    with pytest.raises(_Corrupt, match=r"^messages\[0\]\.parts\[0\]: a stored message"):
        check_messages((delta,), _Corrupt)
    with pytest.raises(InvalidBatchError, match=r"^messages\[0\]\.parts\[0\]: a stored message"):
        Batch("c", "a", [delta])


def test_ids_share_one_base_and_stay_apart() -> None:
    import pickle

    cid, aid = ConversationID("x"), AppendID("x")
    assert (repr(cid), repr(aid)) == ("ConversationID('x')", "AppendID('x')")
    assert not isinstance(cid, AppendID) and not isinstance(aid, ConversationID)
    assert ConversationID(cid) is cid
    assert type(pickle.loads(pickle.dumps(cid))) is ConversationID
    assert type(pickle.loads(pickle.dumps(aid))) is AppendID
    with pytest.raises(InvalidConversationIDError, match=r"^conversation id must not be empty"):
        ConversationID("")
    with pytest.raises(InvalidAppendIDError, match=r"^append id must not be empty"):
        AppendID("")
