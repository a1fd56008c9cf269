"""ConversationID and AppendID validation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.errors import InvalidAppendIDError, InvalidConversationIDError
from scope.history import AppendID, ConversationID

ID_CLASSES = [(ConversationID, InvalidConversationIDError), (AppendID, InvalidAppendIDError)]

BAD_IDS: dict[str, Any] = {
    "empty": "",
    "513-ascii-bytes": "x" * 513,
    "514-utf8-bytes": "é" * 257,
    "nul": "a\x00b",
    "newline-inside": "a\nb",
    "tab-inside": "a\tb",
    "del": "a\x7fb",
    "c1-control": "a\x85b",
    "lone-high-surrogate": "a\ud800b",
    "lone-low-surrogate": "\udc00",
    "leading-space": " a",
    "trailing-space": "a ",
    "trailing-newline": "a\n",
    "leading-ideographic-space": "\u3000a",
    "only-whitespace": "   ",
    "int": 42,
    "none": None,
    "bytes": b"abc",
}


@pytest.mark.parametrize(("cls", "error"), ID_CLASSES)
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_invalid_ids_raise_the_exact_error(
    cls: type[str], error: type[Exception], bad: Any
) -> None:
    with pytest.raises(error) as info:
        cls(bad)
    assert type(info.value) is error
    assert isinstance(info.value, ValueError)


GOOD_IDS = ["a", "x" * 512, "é" * 256, "🙂" * 128, "a b", "a\u00a0b", 'q"uote', "日本語", "%;{}*"]


@pytest.mark.parametrize(("cls", "error"), ID_CLASSES)
@pytest.mark.parametrize("good", GOOD_IDS)
def test_valid_ids_are_the_same_string(cls: type[str], error: type[Exception], good: str) -> None:
    value = cls(good)
    assert value == good
    assert isinstance(value, str)
    assert type(value) is cls
    assert cls(value) is value


def test_512_bytes_is_the_boundary() -> None:
    assert len(ConversationID("é" * 256).encode()) == 512
    with pytest.raises(InvalidConversationIDError, match="512"):
        ConversationID("é" * 256 + "x")


def test_repr_names_the_class() -> None:
    assert repr(ConversationID("c")) == "ConversationID('c')"
    assert repr(AppendID("a")) == "AppendID('a')"


@given(st.text(min_size=1, max_size=40))
def test_ids_accept_exactly_the_rule(text: str) -> None:
    valid = (
        len(text.encode("utf-8", "surrogatepass")) <= 512
        and text.strip() == text
        and not any(ch < " " or "\x7f" <= ch <= "\x9f" or "\ud800" <= ch <= "\udfff" for ch in text)
    )
    if valid:
        assert ConversationID(text) == text
        assert AppendID(text) == text
    else:
        with pytest.raises(InvalidConversationIDError):
            ConversationID(text)
        with pytest.raises(InvalidAppendIDError):
            AppendID(text)


@given(st.lists(st.one_of(st.text(max_size=140), st.sampled_from(list(BAD_IDS.values())))))
def test_the_listing_fast_path_never_accepts_what_one_by_one_refuses(values: list[Any]) -> None:
    """``ConversationID.bulk`` checks a whole listing page at once: when it answers, the
    answer is what validating each value gives (None sends a page to that path)."""
    fast = ConversationID.bulk(values)
    if fast is None:
        return
    assert fast == [ConversationID(value) for value in values]
    assert all(type(cid) is ConversationID for cid in fast)


def test_the_listing_fast_path_takes_a_page_of_plain_ids() -> None:
    page = [f"conversation-{i}" for i in range(100)] + ["日本語", "x" * 128]
    assert ConversationID.bulk(page) == page
    assert ConversationID.bulk(["ok", "a\u00a0b"]) is None  # not printable: one by one
    assert ConversationID.bulk(["ok", "x" * 129]) is None  # may be over 512 bytes
