"""RawJSON: canonical bytes, exact number spellings, and every refusal."""

from __future__ import annotations

import enum
import json
import pickle
import re
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scope.errors import InvalidJSONError
from scope.jsonvalue import RawJSON, coerce_raw_json
from tests.helpers import nested, respell
from tests.strategies import json_texts, json_values, raw_json

FAST = settings(max_examples=150, deadline=None)


def nest(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ('{ "b" : 1 ,\n "a" : [ 2.50 , 1E-7 ] }', b'{"a":[2.50,1E-7],"b":1}'),
        ("1", b"1"),
        ("1.0", b"1.0"),
        ("1e0", b"1e0"),
        ("-0", b"-0"),
        ("-0.0e+00", b"-0.0e+00"),
        ("123456789012345678901234567890", b"123456789012345678901234567890"),
        (r'"\u0041\/\u00e9"', '"A/é"'.encode()),
        (r'"\ud83d\ude00"', '"😀"'.encode()),
        ('"\\n\\t\\u0001"', b'"\\n\\t\\u0001"'),
        (
            '{"é":1,"z":2,"a":3,"\U0001f600":4,"\uffff":5}',
            '{"a":3,"z":2,"é":1,"\uffff":5,"😀":4}'.encode(),
        ),
        (" \t\r\n null \n", b"null"),
        ("[true,false]", b"[true,false]"),
    ],
)
def test_parse_canonicalises(text: str, canonical: bytes) -> None:
    raw = RawJSON.parse(text)
    assert raw.bytes == canonical
    assert RawJSON.parse(text.encode()) == raw
    assert RawJSON.parse(raw.bytes).bytes == canonical  # idempotent


def test_numbers_stay_distinct() -> None:
    assert len({RawJSON.parse(t) for t in ("1", "1.0", "1e0", "1E0", "10e-1")}) == 5


BAD_TEXT: list[tuple[str, str | bytes]] = [
    ("empty", ""),
    ("whitespace only", "  "),
    ("truncated", '{"a": 1'),
    ("trailing data", "1 2"),
    ("trailing comma", "[1,]"),
    ("single quotes", "{'a': 1}"),
    ("duplicate key", '{"a": 1, "a": 1}'),
    ("nested duplicate key", '[{"x": {"b": 1, "b": 2}}]'),
    ("duplicate key via escape", '{"a": 1, "\\u0061": 2}'),
    ("NaN", "NaN"),
    ("Infinity", "[Infinity]"),
    ("-Infinity", '{"a": -Infinity}'),
    ("lone surrogate value", r'"\ud800"'),
    ("lone low surrogate", r'["\udc00"]'),
    ("lone surrogate key", r'{"\ud800": 1}'),
    ("lone surrogate in str input", '"\ud800"'),
    ("not UTF-8", b'"\xff"'),
    ("UTF-16", '"a"'.encode("utf-16")),
    ("BOM", b'\xef\xbb\xbf{"a":1}'),
    ("control character", '"a\x01b"'),
    ("leading zero", "01"),
    ("bare dot", "1."),
    ("plus sign", "+1"),
    ("depth 513", nest(513)),
    ("depth 513 objects", '{"a":' * 513 + "1" + "}" * 513),
    ("depth 100000", nest(100000)),
]


@pytest.mark.parametrize("text", [b[1] for b in BAD_TEXT], ids=[b[0] for b in BAD_TEXT])
def test_parse_refuses(text: str | bytes) -> None:
    with pytest.raises(InvalidJSONError):
        RawJSON.parse(text)


def test_depth_512_accepted() -> None:
    raw = RawJSON.parse(nest(512))
    assert raw.bytes == nest(512).encode()
    assert raw.value() == nested(512)
    assert RawJSON.parse('{"a":' * 512 + "1" + "}" * 512)
    assert RawJSON.from_value(nested(512)) == raw


def test_from_value_depth_513_refused() -> None:
    with pytest.raises(InvalidJSONError):
        RawJSON.from_value(nested(513))


def test_parse_refuses_non_text() -> None:
    with pytest.raises(InvalidJSONError):
        RawJSON.parse(1)  # type: ignore[arg-type]


def test_from_value() -> None:
    value = {"b": [1, 2.5, True, None, "x"], "a": (1,)}
    raw = RawJSON.from_value(value)
    assert raw.bytes == b'{"a":[1],"b":[1,2.5,true,null,"x"]}'
    assert raw.value() == {"a": [1], "b": [1, 2.5, True, None, "x"]}
    inner = RawJSON.parse("2.50")
    assert RawJSON.from_value({"x": inner}).bytes == b'{"x":2.50}'
    assert RawJSON.from_value(inner) is inner
    assert RawJSON.from_value(2**70).bytes == str(2**70).encode()
    assert RawJSON.from_value(2**70).value() == 2**70


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        [float("-inf")],
        {"a": {"b": float("nan")}},
        {1: "int key"},
        {"a": object()},
        {"a": {1, 2}},
        b"bytes",
        "\ud800",
        {"\udfff": 1},
        [{"k": "x\ud800"}],
    ],
    # repr, but stable across processes (an object's repr holds its address).
    ids=lambda value: re.sub(r" at 0x[0-9a-f]+", "", repr(value)),
)
def test_from_value_refuses(value: Any) -> None:
    with pytest.raises(InvalidJSONError):
        RawJSON.from_value(value)


def test_value_str_repr_eq_hash_pickle() -> None:
    raw = RawJSON.parse('{"a": 2.50}')
    assert raw.value() == {"a": 2.5}
    assert raw.value() is not raw.value()
    assert str(raw) == '{"a":2.50}'
    assert repr(raw) == "RawJSON('{\"a\":2.50}')"
    assert len(repr(RawJSON.from_value("x" * 200))) < 100
    assert raw == RawJSON.parse('{ "a" : 2.50 }')
    assert raw != RawJSON.parse('{"a": 2.5}')
    assert raw != '{"a":2.50}'
    assert hash(raw) == hash(RawJSON.parse('{"a":2.50}'))
    assert pickle.loads(pickle.dumps(raw)) == raw
    with pytest.raises(AttributeError):
        raw.x = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        del raw._raw_json_bytes


def test_coerce() -> None:
    raw = RawJSON.parse("[1]")
    assert coerce_raw_json(raw) is raw
    assert coerce_raw_json([1]) == raw
    assert coerce_raw_json({"a": 1}) == RawJSON.parse('{"a":1}')
    with pytest.raises(InvalidJSONError):
        coerce_raw_json("[1]")
    with pytest.raises(InvalidJSONError):
        coerce_raw_json(1)


# ------------------------------------------------------------------ properties


def _reorder(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


@FAST
@given(json_texts())
@example('{"":true,": ":true}')  # a key holding ": " is not whitespace
def test_parse_keeps_numbers_and_values(text: str) -> None:
    raw = RawJSON.parse(text)
    # Same document: every number token kept as spelled, same values.
    assert json.loads(raw.bytes, parse_float=str, parse_int=str) == json.loads(
        text, parse_float=str, parse_int=str
    )
    # Canonical: sorted keys, no whitespace, one string spelling (orjson's).
    assert RawJSON.parse(raw.bytes).bytes == raw.bytes
    # No whitespace outside strings (a key or a value may well hold ": ").
    outside = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', raw.bytes)
    assert not re.search(rb"\s", outside)


@FAST
@given(json_texts(), st.sampled_from(["", " ", "\t"]), st.booleans())
def test_parse_is_canonical_under_respelling(text: str, indent: str, ascii_: bool) -> None:
    assert RawJSON.parse(respell(text, indent=indent, ascii_=ascii_)) == RawJSON.parse(text)


@FAST
@given(json_values())
def test_from_value_round_trips(value: Any) -> None:
    raw = RawJSON.from_value(value)
    assert raw.value() == orjson.loads(orjson.dumps(value))
    assert RawJSON.parse(raw.bytes) == raw
    assert RawJSON.from_value(raw.value()) == raw


@FAST
@given(raw_json())
def test_raw_json_bytes_are_a_fixed_point(raw: RawJSON) -> None:
    assert RawJSON.parse(str(raw)) == raw
    assert RawJSON.parse(raw.bytes).bytes == raw.bytes


@pytest.mark.parametrize(
    "number",
    [10**30, 2**64 + 1, -(2**63) - 1, -(10**25) - 7, 123456789012345678901234567890],
)
def test_value_keeps_big_integers_exact(number: int) -> None:
    # orjson.loads reads integers beyond 64 bits as (lossy) floats; value() must not.
    for raw in (RawJSON.from_value(number), RawJSON.parse(f'{{"n":[{number}]}}')):
        value = raw.value()
        got = value if isinstance(value, int) else value["n"][0]
        assert got == number
        assert type(got) is int


def test_from_value_counts_embedded_raw_json_toward_depth() -> None:
    inner = RawJSON.parse(nest(511))
    assert RawJSON.from_value([inner]).bytes == nest(512).encode()
    deep = RawJSON.parse(nest(512))
    for value in ([deep], {"a": deep}, [[1], {"b": (deep,)}]):
        with pytest.raises(InvalidJSONError):
            RawJSON.from_value(value)


def test_embedded_raw_json_counts_its_nesting_not_the_brackets_in_its_strings() -> None:
    # Brackets inside strings, an escaped backslash and an escaped quote before more
    # brackets: none of them nest. Depth 1 inside 510 lists is 511 levels: accepted.
    strings = RawJSON.parse('["' + "[" * 600 + r'", "\\", "\"[{[{"]')
    assert RawJSON.from_value(_lists(510, strings)).bytes.endswith(strings.bytes + b"]" * 510)
    # Three real levels (one string holds an escaped quote and a bracket): 512 at 509
    # lists, 513 at 510.
    deep = RawJSON.parse(r'[[["[\"]"]]]')
    assert RawJSON.from_value(_lists(509, deep)).bytes == b"[" * 509 + deep.bytes + b"]" * 509
    with pytest.raises(InvalidJSONError, match="nesting deeper than 512 levels"):
        RawJSON.from_value(_lists(510, deep))


def _lists(depth: int, inner: Any) -> Any:
    """``inner`` inside ``depth`` one-item lists."""
    for _ in range(depth):
        inner = [inner]
    return inner


class _Name(str):
    __slots__ = ()


class _Count(int):
    pass


class _Ratio(float):
    pass


def test_from_value_encodes_builtin_subclasses_as_their_values() -> None:
    # A str subclass (scope.history.ConversationID, say) is a str: it encodes as one.
    assert RawJSON.from_value(_Name("a")).bytes == b'"a"'
    assert RawJSON.from_value({"k": [_Name("x"), _Count(3), _Ratio(0.5)]}).bytes == (
        b'{"k":["x",3,0.5]}'
    )
    assert RawJSON.from_value([_Count(2**70)]).bytes == f"[{2**70}]".encode()
    with pytest.raises(InvalidJSONError):
        RawJSON.from_value([_Ratio("nan")])
    # The same beside an integer beyond 64 bits, which canonical's own writer writes: it
    # refused a float subclass (orjson does not write one by itself).
    assert _beside_big([_Name("x"), _Count(3), _Ratio(0.5)]) == (
        b'[["x",3,0.5],' + str(BIG).encode() + b"]"
    )
    with pytest.raises(InvalidJSONError, match="is not a JSON number"):
        _beside_big(_Ratio("inf"))


#: Beyond orjson's 64-bit integers: a value holding it is written by canonical's own
#: writer (scope._json._write) instead of orjson.
BIG: int = 2**64 + 1


def _beside_big(value: Any) -> bytes:
    """``from_value([value, BIG])``: ``value`` written by the writer orjson cannot be."""
    return RawJSON.from_value([value, BIG]).bytes


def _encoded(value: Any) -> bytes | None:
    """``from_value(value).bytes``, None when refused (``InvalidJSONError``)."""
    try:
        return RawJSON.from_value(value).bytes
    except InvalidJSONError:
        return None


@FAST
@given(st.data())
def test_the_writer_for_big_integers_writes_what_orjson_writes(data: st.DataObject) -> None:
    # JSON values, builtin subclasses, Enum members of every kind and embedded RawJSON:
    # orjson writes the value alone, scope's writer the value beside BIG.
    value = data.draw(json_values() | _unusual_values())
    alone, beside = _encoded(value), _encoded([value, BIG])
    if alone is None:
        assert beside is None
    else:
        assert beside == b"[" + alone + b"," + str(BIG).encode() + b"]"


def _unusual_values() -> st.SearchStrategy[Any]:
    scalars = json_values().filter(lambda v: not isinstance(v, list | dict))
    leaves = st.one_of(
        scalars,
        st.sampled_from([*_Plain, *_Level, _Name("n"), _Count(-4), _Ratio(0.25)]),
        scalars.map(RawJSON.from_value),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=4), inner, max_size=3),
        ),
        max_leaves=8,
    )


class _Plain(enum.Enum):
    TEXT = "x"
    WHOLE = 3
    HALF = 1.5
    PAIR = (1, "b")
    OBJECT = {"b": 1, "a": [2]}  # noqa: RUF012 - an Enum value, never mutated
    NAN = float("nan")
    INFINITE = float("inf")


class _Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        (_Plain.TEXT, b'"x"'),
        (_Plain.WHOLE, b"3"),
        (_Plain.HALF, b"1.5"),
        (_Plain.PAIR, b'[1,"b"]'),
        (_Plain.OBJECT, b'{"a":[2],"b":1}'),
        (_Level.HIGH, b"3"),
    ],
)
def test_from_value_encodes_an_enum_member_as_its_value(member: Any, expected: bytes) -> None:
    # orjson writes a member as its value; the writer for big integers did not: it
    # refused a plain Enum ("type _Plain is not a JSON value") beside a big integer.
    assert RawJSON.from_value(member).bytes == expected
    assert RawJSON.from_value({"k": [member]}).bytes == b'{"k":[' + expected + b"]}"
    assert _beside_big(member) == b"[" + expected + b"," + str(BIG).encode() + b"]"


@pytest.mark.parametrize("member", [_Plain.NAN, _Plain.INFINITE])
def test_from_value_refuses_an_enum_member_whose_value_is_not_finite(member: Any) -> None:
    # orjson writes NaN and infinities as null: the member's value is checked as a float.
    for value in (member, [member], {"k": member}, [member, BIG]):
        with pytest.raises(InvalidJSONError, match="is not a JSON number"):
            RawJSON.from_value(value)


@pytest.mark.parametrize("text", ["{x", "[1,", "tru"])
def test_a_syntax_error_says_invalid_json_once(text: str) -> None:
    with pytest.raises(InvalidJSONError, match=r"^invalid JSON: .* at line 1 column \d+$") as info:
        RawJSON.parse(text)
    assert "not valid JSON" not in str(info.value)
