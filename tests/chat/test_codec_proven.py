"""The layout proofs of ``scope._codec._proven`` against ``validate()`` itself: for every
key layout a strict structurer can meet and every value it can hold there, the proof is
true exactly when ``validate()`` passes (never true for an invalid value; true for every
valid one it covers, so the fast path does not silently stop applying)."""

from __future__ import annotations

import itertools
from typing import Any, Final

import attrs
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope import codec
from scope._codec._generated import NAMESPACE
from scope._codec._proven import _text_rules, proof
from scope._documents import digest_of
from scope.chat import (
    Message,
    NativeItem,
    Part,
    PartKind,
    Role,
    ToolCall,
    ToolCallDelta,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    text_part,
    tool_call_part,
    tool_message,
)
from scope.codec import encode_messages
from scope.errors import ScopeError, StoreError
from scope.historystores._records import decode_record
from scope.jsonvalue import RawJSON
from scope.media import Media, Source
from scope.metadata import Metadata
from tests.historystores.test_record_decode import reference

#: What a strict structurer holds for a present member: never the default (the
#: canonical rules refuse a member at its default). Text in each form ``validate()``
#: tells apart: ASCII, other valid Unicode, a lone surrogate.
PRESENT: dict[str, list[Any]] = {
    "text": ["hi", "h\u00e9", "h\ud800"],
    "media": [Media("image/png", Source("uri", uri="https://x.example"))],
    "signature": [b"\x01"],
    "tool_call": [ToolCall("c1", "f")],
    "tool_call_delta": [ToolCallDelta("c1", "f")],
    "tool_result": [ToolResult("c1", "f")],
    "metadata": [Metadata({"a": 1})],
    "native": [NativeItem("p", "t", {})],
}


def _built(cls: type, values: dict[str, Any]) -> Any:
    """The value as a structurer assembles it (no ``__init__``, no ``validate()``)."""
    obj = object.__new__(cls)
    for field in attrs.fields(cls):
        value = values.get(field.name, field.default)
        if isinstance(value, attrs.Factory):  # type: ignore[arg-type]
            value = value.factory()
        cls.__dict__[field.name].__set__(obj, value)
    return obj


def _valid(obj: Any) -> bool:
    try:
        obj.validate()
    except ScopeError:
        return False
    return True


def _holds(cls: type, rule: str | None, values: dict[str, Any]) -> bool:
    if rule is None:
        return False
    names = {f"f{i}": values.get(f.name) for i, f in enumerate(attrs.fields(cls))}
    return bool(eval(rule, NAMESPACE, names))


def _part_cases() -> Any:
    optional = [f.name for f in attrs.fields(Part) if f.name != "kind"]
    for size in range(len(optional) + 1):
        for present in itertools.combinations(optional, size):
            choices = [PRESENT[name] for name in present]
            for kind in PartKind:
                for chosen in itertools.product(*choices):
                    yield present, {"kind": kind, **dict(zip(present, chosen, strict=True))}


def test_a_part_layout_proof_holds_exactly_when_validate_passes() -> None:
    checked = proven = 0
    for present, values in _part_cases():
        rule = proof(Part, {"kind", *present})
        part = _built(Part, values)
        holds = _holds(Part, rule, values)
        valid = _valid(part)
        if holds:
            assert valid, (present, values, rule)
            proven += 1
        elif valid:  # left to validate(): only text that is not ASCII
            assert not values.get("text", "").isascii(), (present, values, rule)
        checked += 1
    assert checked == 256 * 7 * 2 and proven > 10


@pytest.mark.parametrize("present", [{"role", "parts"}, {"role", "parts", "metadata"}])
def test_a_message_layout_proof_holds_exactly_when_validate_passes(present: set[str]) -> None:
    samples = [
        _built(Part, {"kind": PartKind(name), name: PRESENT[name][0]})
        for name in ("media", "tool_call", "tool_call_delta", "tool_result", "native")
    ]
    samples += [text_part("hi"), _built(Part, {"kind": PartKind.REASONING, "text": "r"})]
    rule = proof(Message, present)
    for role in Role:
        for count in range(4):
            for parts in itertools.product(samples, repeat=count):
                values: dict[str, Any] = {"role": role, "parts": parts}
                if "metadata" in present:
                    values["metadata"] = Metadata({"a": 1})
                message = _built(Message, values)
                assert _holds(Message, rule, values) == _valid(message), (role, parts)


def test_a_stored_record_outside_the_proofs_is_still_validated() -> None:
    """Through ``decode_canonical``: a layout whose proof fails runs ``validate()``,
    and the record is refused as the checked decoder refuses it."""
    good = b'[{"parts":[{"kind":"text","text":"hi"}],"role":"user"}]'
    assert codec.decode_canonical(good) is not None
    for bad in (
        b'[{"parts":[{"kind":"reasoning","text":"hi"}],"role":"user"}]',
        b'[{"parts":[{"kind":"tool_call","text":"hi"}],"role":"assistant"}]',
        b'[{"parts":[],"role":"user"}]',
        b'[{"parts":[{"kind":"text","text":"\\ud800"}],"role":"user"}]',
    ):
        assert codec.decode_canonical(bad) is None


#: Strings for the string fields of tool calls and results: each rule ``check_text``
#: applies (empty, surrounding whitespace, ASCII or not, lone surrogate) on both sides.
TEXTS: list[str] = [
    "",
    "x",
    "call_1",
    " x",
    "x ",
    " ",
    "\t",
    "\x1f",
    "a b",
    "h\u00e9",
    "\u00a0x",
    "h\ud800",
    "\udc00",
]

#: What a strict structurer can hold in the typed fields of a ``ToolResult``.
TYPED: dict[str, list[Any]] = {
    "output": [
        ToolOutput(),
        ToolOutput.of_text("r"),
        ToolOutput.of_json({"a": 1}),
        ToolOutput((media_part(PRESENT["media"][0]),)),
    ],
    "is_error": [True, False],
}


def _check_layouts(cls: type, samples: dict[str, list[Any]]) -> tuple[int, int]:
    """Every subset of ``cls``'s fields present, every choice of samples for them (the
    others at their defaults): the proof holds only where ``validate()`` passes, and
    holds wherever it passes except for a present string that is not ASCII."""
    names = [f.name for f in attrs.fields(cls)]
    checked = proven = 0
    for size in range(len(names) + 1):
        for present in itertools.combinations(names, size):
            rule = proof(cls, set(present))
            for chosen in itertools.product(*(samples[name] for name in present)):
                values = dict(zip(present, chosen, strict=True))
                holds = _holds(cls, rule, values)
                valid = _valid(_built(cls, values))
                if holds:
                    assert valid, (present, values, rule)
                    proven += 1
                elif valid:  # left to validate(): a string that is not ASCII
                    strings = [v for v in values.values() if type(v) is str]
                    assert not all(s.isascii() for s in strings), (present, values, rule)
                checked += 1
    return checked, proven


@pytest.mark.parametrize("cls", [ToolCall, ToolCallDelta])
def test_a_tool_call_layout_proof_holds_exactly_when_validate_passes(cls: type) -> None:
    checked, proven = _check_layouts(cls, {name: TEXTS for name in ("id", "name", "arguments")})
    assert checked == 1 + 3 * 13 + 3 * 13**2 + 13**3
    assert proven == 8 * 8 * (1 + 9)  # non-empty ASCII id and name, any ASCII arguments


def test_a_tool_result_layout_proof_holds_exactly_when_validate_passes() -> None:
    checked, proven = _check_layouts(ToolResult, {"id": TEXTS, "name": TEXTS, **TYPED})
    assert checked == (1 + 13) ** 2 * (1 + 4) * (1 + 2)
    assert proven == 8 * 8 * (1 + 4) * (1 + 2)  # non-empty ASCII id and name


@pytest.mark.parametrize("details", [None, RawJSON.parse('{"a":1}'), RawJSON.parse("[1]")])
def test_a_tool_output_layout_proof_holds_exactly_when_validate_passes(details: Any) -> None:
    samples = [
        _built(Part, {"kind": PartKind(name), name: PRESENT[name][0]})
        for name in ("media", "tool_call", "tool_call_delta", "tool_result", "native")
    ]
    samples += [text_part("hi"), _built(Part, {"kind": PartKind.REASONING, "text": "r"})]
    for count in range(4):
        for content in itertools.product(samples, repeat=count):
            values: dict[str, Any] = {"content": content} if content else {}
            if details is not None:
                values["details"] = details
            rule = proof(ToolOutput, set(values))
            holds = _holds(ToolOutput, rule, values)
            assert holds == _valid(_built(ToolOutput, values)), (content, details, rule)


#: What a strict structurer can hold in a native item's data: any JSON value.
DATA: list[Any] = [RawJSON.parse(text) for text in ("{}", '{"a":[1]}', "[1]", '"{"', "1", "null")]


def test_a_native_item_layout_proof_holds_exactly_when_validate_passes() -> None:
    checked, proven = _check_layouts(NativeItem, {"provider": TEXTS, "type": TEXTS, "data": DATA})
    assert checked == (1 + 13) ** 2 * (1 + 6)
    assert proven == 3 * 3 * 2  # "x", "call_1", "a b"; data "{}", '{"a":[1]}'


def test_the_text_rules_are_those_of_validate() -> None:
    """What ``_text_rules`` asked of ``validate()``: ids and names must be non-empty,
    a native item's provider and type also stripped (a proof that skipped a rule would
    fail above)."""
    required = {"id": (True, False), "name": (True, False)}
    assert _text_rules(ToolCall) == {**required, "arguments": (False, False)}
    assert _text_rules(ToolCallDelta) == {**required, "arguments": (False, False)}
    assert _text_rules(ToolResult) == required
    assert _text_rules(NativeItem) == {"provider": (True, True), "type": (True, True)}
    assert proof(ToolResult, {"id", "output"}) is None  # a required name at its default


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([ToolCall, ToolCallDelta, ToolResult, NativeItem]),
    st.lists(
        st.text(max_size=6) | st.text(st.characters(max_codepoint=127), max_size=6),
        min_size=3,
        max_size=3,
    ),
    st.sets(st.sampled_from(["arguments", "is_error", "output"])),
    st.booleans(),
)
def test_a_tool_proof_never_holds_for_a_value_validate_refuses(
    cls: type, strings: list[str], extra: set[str], is_error: bool
) -> None:
    """Any strings (any code points, lone surrogates included; ASCII half the time)."""
    names = {f.name for f in attrs.fields(cls)}
    values: dict[str, Any] = {"id": strings[0], "name": strings[1]}
    if cls is NativeItem:
        values = {"provider": strings[0], "type": strings[1], "data": DATA[is_error]}
    if "arguments" in extra and "arguments" in names:
        values["arguments"] = strings[2]
    if "output" in extra and "output" in names:
        values["output"] = ToolOutput.of_text("r")
    if "is_error" in extra and "is_error" in names:
        values["is_error"] = is_error
    holds = _holds(cls, proof(cls, set(values)), values)
    valid = _valid(_built(cls, values))
    assert holds <= valid
    if valid and all(v.isascii() for v in values.values() if type(v) is str):
        assert holds


TOOL_TURN: Final = (
    assistant_message(tool_call_part("call_1", "get_weather", '{"city":"Paris"}')),
    tool_message(ToolResult("call_1", "get_weather", ToolOutput.of_text("18 C"))),
)


def _outcome(check: Any) -> Any:
    try:
        return check()
    except StoreError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (None, None),  # as written
        ((0, "tool_call", "id"), ""),
        ((0, "tool_call", "name"), ""),
        ((0, "tool_call", "name"), "h\u00e9"),  # valid, left to validate()
        ((0, "tool_call", "arguments"), '{"city":"P\u00e4ris"}'),
        ((1, "tool_result", "id"), ""),
        ((1, "tool_result", "name"), ""),
        ((1, "tool_result", "name"), "\u00e9"),
        ((1, "tool_result", "is_error"), 1),
        ((1, "tool_result", "output"), {"content": [{"kind": "tool_call", "text": "x"}]}),
        ((1, "tool_result", "output"), {"content": [{"kind": "reasoning", "text": "x"}]}),
        ((1, "tool_result", "output"), {"content": [{"kind": "text", "text": "\u00e9"}]}),
    ],
)
def test_a_tool_record_decodes_as_the_checked_decoder_decodes_it(
    path: tuple[Any, ...] | None, value: Any
) -> None:
    """Through ``decode_record`` (the strict structurers and their proofs) against the
    long way (every ``validate()`` run): equal messages, or the same error class and
    message. A layout's strict structurer exists once a value of that layout was
    decoded through the strict structurer of its parent's layout (before, the generic
    structurer validates everything), so the good record is decoded first."""
    good = encode_messages(TOOL_TURN)
    for _ in range(5):  # one more level of nesting learned each time: proofs apply
        decode_record("c", "a", digest_of(good), good)
    for cls in (ToolCall, ToolResult, ToolOutput):
        assert NAMESPACE[f"_structure_{cls.__name__}_strict"], cls
    tree = orjson.loads(good)
    if path is not None:
        index, payload, name = path
        tree[index]["parts"][0][payload][name] = value
    data = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
    fast = _outcome(lambda: decode_record("c", "a", digest_of(data), data))
    slow = _outcome(lambda: reference(data))
    assert fast == slow
    if path is None:
        assert list(fast) == list(TOOL_TURN)
    elif value in ("", 1) or (type(value) is dict and "\u00e9" not in str(value)):
        assert fast[0] is StoreError, fast  # refused, by validate()
    else:  # valid text that is not ASCII: accepted through validate()
        assert all(type(message) is Message for message in fast), fast
