"""The layout proofs of ``scope._codec._proven`` against ``validate()`` itself: for every
key layout a strict structurer can meet and every value it can hold there, the proof is
true exactly when ``validate()`` passes (never true for an invalid value; true for every
valid one it covers, so the fast path does not silently stop applying)."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

from scope import codec
from scope._codec._generated import NAMESPACE
from scope._codec._proven import proof
from scope.chat import (
    Message,
    NativeItem,
    Part,
    PartKind,
    Role,
    ToolCall,
    ToolCallDelta,
    ToolResult,
    text_part,
)
from scope.errors import ScopeError
from scope.media import Media, Source
from scope.metadata import Metadata

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
