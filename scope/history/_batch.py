"""``Batch`` (an immutable, digested group of messages) and ``Receipt``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, final

import attrs
import orjson

from scope import codec
from scope._documents import check_messages, decode_messages, digest_of
from scope._json import Num, parse_exact_fast
from scope.chat import Message
from scope.codec import encode_messages
from scope.errors import (
    InvalidAppendIDError,
    InvalidBatchError,
    InvalidConversationIDError,
    InvalidReceiptError,
)
from scope.history._ids import AppendID, ConversationID

__all__ = ["Batch", "Receipt"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _conversation_id(value: Any, error: type[Exception]) -> ConversationID:
    try:
        return ConversationID(value)
    except InvalidConversationIDError as exc:
        raise error(f"conversation_id: {exc}") from exc


def _append_id(value: Any, error: type[Exception]) -> AppendID:
    try:
        return AppendID(value)
    except InvalidAppendIDError as exc:
        raise error(f"id: {exc}") from exc


@final
@attrs.frozen(init=False)
class Batch:
    """The unit of history: messages appended atomically under one append id.

    At least one message, each valid and complete (no tool_call_delta parts).
    ``encoded_messages`` is the canonical JSON array of the messages and ``digest`` is
    ``"sha256:" + hex(sha256(encoded_messages))``; both are computed once, at
    construction. Equal messages give an equal digest, however they were built.

    ``expected_length`` fences the append (DESIGN §6b): when set (an int >= 0), a store
    appends the batch only while the conversation holds exactly that many messages, and
    otherwise raises ``HistoryChangedError`` and appends nothing. It is a condition on
    the append, not part of the batch's content: it is not in ``encoded_messages`` or
    the digest, batches that differ only in it are equal, and a retry of an accepted
    batch returns the equal receipt whatever it says. ``None`` (the default): no fence.

    ``expected_head`` fences the append by the head (DESIGN §6h) the same way: when set,
    the batch lands only while the conversation's head is that batch (its append id;
    ``""``: no batch on the head path yet, a new conversation or one rewound to its
    start), so a batch generated on one branch never lands on another of the same
    length. ``None`` (the default): the head is not checked. It is a condition, like
    ``expected_length``: not in the digest or the equality.
    """

    conversation_id: ConversationID
    id: AppendID
    messages: tuple[Message, ...]
    encoded_messages: bytes = attrs.field(eq=False, repr=False)
    digest: str = attrs.field(repr=False)
    expected_length: int | None = attrs.field(default=None, eq=False)
    expected_head: str | None = attrs.field(default=None, eq=False)

    def __init__(
        self,
        conversation_id: str,
        id: str,
        messages: Iterable[Message],
        expected_length: int | None = None,
        expected_head: str | None = None,
    ) -> None:
        cid = _conversation_id(conversation_id, InvalidBatchError)
        aid = _append_id(id, InvalidBatchError)
        if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
            raise InvalidBatchError(
                f"batch messages must be a sequence of messages, got {type(messages).__name__}"
            )
        _check_expected_length(expected_length)
        _check_expected_head(expected_head)
        msgs = tuple(messages)
        _check_messages(msgs)
        encoded = encode_messages(msgs)
        self.__attrs_init__(
            cid, aid, msgs, encoded, digest_of(encoded), expected_length, expected_head
        )

    @classmethod
    def from_verified(
        cls,
        conversation_id: ConversationID,
        id: AppendID,
        messages: tuple[Message, ...],
        encoded_messages: bytes,
        digest: str,
    ) -> Batch:
        """A batch from parts the caller has already checked, without encoding and
        hashing again: for stores, from a record they verified. The caller vouches that
        the ids and messages are valid, ``encoded_messages == encode_messages(messages)``
        and ``digest`` is its digest; nothing is checked here (a wrong part makes a batch
        whose receipt lies). Anyone else constructs ``Batch(...)``."""
        batch = cls.__new__(cls)
        batch.__attrs_init__(conversation_id, id, messages, encoded_messages, digest, None, None)
        return batch

    def __len__(self) -> int:
        return len(self.messages)

    def validate(self) -> None:
        """Check the batch (construction already did)."""
        _check_expected_length(self.expected_length)
        _check_expected_head(self.expected_head)
        _check_messages(self.messages)

    def fenced(self, expected_length: int | None, expected_head: str | None = None) -> Batch:
        """This batch with another ``expected_length`` and ``expected_head`` (``None``
        removes that fence); the messages are not encoded or hashed again."""
        _check_expected_length(expected_length)
        _check_expected_head(expected_head)
        batch = type(self).__new__(type(self))
        batch.__attrs_init__(
            self.conversation_id,
            self.id,
            self.messages,
            self.encoded_messages,
            self.digest,
            expected_length,
            expected_head,
        )
        return batch

    def receipt(self) -> Receipt:
        """The receipt a store returns for this batch."""
        return Receipt(self.conversation_id, self.id, self.digest)

    def to_json(self) -> bytes:
        """``{"conversation_id", "digest", "id", "messages"}``, canonical, with
        ``"expected_length"`` and ``"expected_head"`` only when they are set."""
        document: dict[str, Any] = {
            "conversation_id": str(self.conversation_id),
            "digest": self.digest,
            "id": str(self.id),
            "messages": orjson.Fragment(self.encoded_messages),
        }
        if self.expected_length is not None:
            document["expected_length"] = self.expected_length
        if self.expected_head is not None:
            document["expected_head"] = self.expected_head
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: str | bytes | bytearray | memoryview) -> Batch:
        """Decode a batch and check its digest against its messages (``InvalidBatchError``)."""
        try:
            tree = parse_exact_fast(data)
        except ValueError as exc:
            raise InvalidBatchError(f"invalid JSON: {exc}") from None
        return cls._from_tree(tree)

    @classmethod
    def _from_tree(cls, tree: Any) -> Batch:
        if type(tree) is not dict:
            raise InvalidBatchError("a batch must be a JSON object")
        expected = {"conversation_id", "id", "messages", "digest"}
        keys = set(tree) - {"expected_length", "expected_head"}
        if keys != expected:
            missing = sorted(expected - keys)
            unknown = sorted(keys - expected)
            raise InvalidBatchError(
                f"batch fields: missing {missing or 'none'}, unknown {unknown or 'none'}"
            )
        for key in ("conversation_id", "id", "digest"):
            if type(tree[key]) is not str:
                raise InvalidBatchError(f"{key}: expected a string")
        messages = decode_messages(tree["messages"], InvalidBatchError)
        expected_length = tree.get("expected_length")
        if type(expected_length) is Num and not any(c in expected_length for c in ".eE"):
            # The exact reader (taken for documents not in orjson's one spelling: indented,
            # reordered keys ...) keeps number tokens as written.
            expected_length = int(expected_length)
        if expected_length is not None and type(expected_length) is not int:
            raise InvalidBatchError(
                f"expected_length: expected an integer, got {type(expected_length).__name__}"
            )
        expected_head = tree.get("expected_head")
        if expected_head is not None and type(expected_head) is not str:
            raise InvalidBatchError(
                f"expected_head: expected a string, got {type(expected_head).__name__}"
            )
        batch = cls(tree["conversation_id"], tree["id"], messages, expected_length, expected_head)
        if batch.digest != tree["digest"]:
            raise InvalidBatchError(
                f"digest mismatch: the document says {tree['digest']}, "
                f"its messages digest to {batch.digest}"
            )
        return batch


def _check_expected_length(value: object) -> None:
    if value is None:
        return
    if type(value) is not int:
        raise InvalidBatchError(
            f"expected_length must be an int or None, got {type(value).__name__}"
        )
    if not 0 <= value < 2**63:
        raise InvalidBatchError(f"expected_length must be between 0 and 2**63 - 1, got {value}")


def _check_expected_head(value: object) -> None:
    if value is None or value == "":
        return
    if type(value) is not str:
        raise InvalidBatchError(f"expected_head must be a str or None, got {type(value).__name__}")
    try:
        AppendID(value)
    except InvalidAppendIDError as exc:
        raise InvalidBatchError(f"expected_head: {exc}") from exc


def _check_messages(messages: tuple[Message, ...]) -> None:
    check_messages(messages, InvalidBatchError)


def _receipt_conversation_id(value: str) -> ConversationID:
    return _conversation_id(value, InvalidReceiptError)


def _receipt_append_id(value: str) -> AppendID:
    return _append_id(value, InvalidReceiptError)


@final
@attrs.frozen
class Receipt:
    """A store's acknowledgement that a batch is durably appended."""

    conversation_id: ConversationID = attrs.field(converter=_receipt_conversation_id)
    id: AppendID = attrs.field(converter=_receipt_append_id)
    digest: str

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the receipt (construction already did): valid ids and a
        ``"sha256:" + 64 lowercase hex digits`` digest (``InvalidReceiptError``)."""
        if type(self.conversation_id) is not ConversationID:
            _receipt_conversation_id(self.conversation_id)
        if type(self.id) is not AppendID:
            _receipt_append_id(self.id)
        digest = self.digest
        if type(digest) is not str or _DIGEST.fullmatch(digest) is None:
            raise InvalidReceiptError(f"receipt digest must be 'sha256:<hex>', got {digest!r}")

    def validate_for(self, batch: Batch) -> None:
        """Raise ``InvalidReceiptError`` unless this receipt acknowledges ``batch``."""
        if self.conversation_id != batch.conversation_id:
            raise InvalidReceiptError(
                f"receipt is for conversation {self.conversation_id!r}, "
                f"the batch for {batch.conversation_id!r}"
            )
        if self.id != batch.id:
            raise InvalidReceiptError(
                f"receipt is for append id {self.id!r}, the batch is {batch.id!r}"
            )
        if self.digest != batch.digest:
            raise InvalidReceiptError(
                f"receipt digest {self.digest} does not match the batch digest {batch.digest}"
            )


# scope.codec.to_json(batch) and from_json(data, Batch) use the batch's own JSON form
# (digest checked on decode); registered here, as scope.codec must not import history.
codec.register_own(Batch, InvalidBatchError, Batch._from_tree, Batch.to_json)
