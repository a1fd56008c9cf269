"""Strict mode (issue 46): ``@tool(strict=True)`` and ``Conversation(strict_output=True)``
make schemas in the strict subset (every object closed, every property required, the
optional ones nullable, bounds outside the subset moved into the description), decode as
those schemas say (every key present, a null for an optional field is its default), and
refuse, naming the field and the keyword, what the subset cannot express. The
``strict`` flag of ``ToolDefinition``/``OutputFormat``: validated, encoded only when set,
older encodings decoding unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import annotated_types
import attrs
import jsonschema
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from scope import codec
from scope.chat import (
    FinishReason,
    Output,
    OutputFormat,
    Response,
    ToolCall,
    ToolDefinition,
    assistant_message,
)
from scope.conversation import Conversation
from scope.errors import InvalidOutputFormatError, InvalidToolCallError, InvalidToolDefinitionError
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.tools import tool

pytestmark = pytest.mark.anyio


class Size(enum.Enum):
    S = "s"
    L = "l"


class Street(BaseModel):
    name: str = Field(description="the street's name")
    number: int | None = None


class Address(BaseModel):
    street: Street
    floor: int = Field(0, ge=0, le=99)
    code: str = Field(pattern=r"^[0-9]{4}$", min_length=4)


class Order(BaseModel):
    size: Size
    count: Annotated[int, Field(gt=0)]
    address: Address
    gift: Address | None = None
    notes: list[Annotated[str, Field(max_length=20)]] = []
    kind: Literal["a", "b"] = "a"


@tool(strict=True)
def place(order: Order, rush: bool = False) -> str:
    """Place an order."""
    return f"{order.size.value} x{order.count} rush={rush}"


STREET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "the street's name"},
        "number": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    },
    "required": ["name", "number"],
    "additionalProperties": False,
}
ADDRESS = {
    "type": "object",
    "properties": {
        "street": STREET,
        "floor": {
            "anyOf": [{"type": "integer"}, {"type": "null"}],
            "description": "(minimum 0, maximum 99)",
        },
        "code": {"type": "string", "pattern": "^[0-9]{4}$", "description": "(minLength 4)"},
    },
    "required": ["street", "floor", "code"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "size": {"type": "string", "enum": ["s", "l"]},
        "count": {"type": "integer", "description": "(exclusiveMinimum 0)"},
        "address": ADDRESS,
        "gift": {"anyOf": [ADDRESS, {"type": "null"}]},
        "notes": {
            "anyOf": [
                {"type": "array", "items": {"type": "string", "description": "(maxLength 20)"}},
                {"type": "null"},
            ]
        },
        "kind": {"type": "string", "enum": ["a", "b"]},
    },
    "required": ["size", "count", "address", "gift", "notes", "kind"],
    "additionalProperties": False,
}
# Literal["a", "b"] with a default: null is not one of its values, so it is wrapped.
ORDER["properties"]["kind"] = {"anyOf": [{"type": "string", "enum": ["a", "b"]}, {"type": "null"}]}
PLACE = {
    "type": "object",
    "properties": {"order": ORDER, "rush": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
    "required": ["order", "rush"],
    "additionalProperties": False,
}


def _walk(schema: Any) -> Any:
    """Every object schema in ``schema``."""
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            yield schema
        for value in schema.values():
            yield from _walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _walk(value)


def test_the_strict_schema_of_a_pydantic_model() -> None:
    schema = place.definition.input_schema.value()
    assert schema == PLACE
    assert place.definition.strict
    jsonschema.Draft202012Validator.check_schema(schema)
    for node in _walk(schema):  # the subset's rules, at every depth
        assert node["additionalProperties"] is False
        assert sorted(node["required"]) == sorted(node["properties"])
    text = orjson.dumps(schema).decode()
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength"):
        assert f'"{keyword}"' not in text


def _order(**changes: Any) -> dict[str, Any]:
    street = {"name": "Rua", "number": None}
    order = {
        "size": "s",
        "count": 2,
        "address": {"street": street, "floor": None, "code": "1000"},
        "gift": None,
        "notes": None,
        "kind": None,
    }
    return {"order": {**order, **changes}, "rush": None}


def test_nulls_for_optional_fields_decode_to_their_defaults() -> None:
    arguments = _order()
    jsonschema.validate(arguments, PLACE)
    decoded = place.decode(orjson.dumps(arguments).decode())
    order = decoded["order"]
    assert decoded == {"order": order}  # rush=None: left out, the default (False) applies
    assert order == Order(
        size=Size.S, count=2, address=Address(street=Street(name="Rua"), code="1000")
    )
    assert order.address.floor == 0 and order.notes == [] and order.kind == "a"
    assert order.address.street.number is None  # its type accepts None: None


async def test_a_strict_call_runs_with_the_defaults() -> None:
    result = await place.run(ToolCall("c1", "place", orjson.dumps(_order()).decode()))
    assert not result.is_error
    assert result.output.text() == "s x2 rush=False"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (
            {"order": _order()["order"]},
            "invalid arguments for place: $.rush: required field missing",
        ),
        (
            _order(address={"street": {"name": "Rua"}, "floor": 1, "code": "1000"}),
            "invalid arguments for place: $.order.address.street.number: required field missing",
        ),
        (
            _order(count=0),  # the bound left the schema; the decoder still checks it
            "invalid arguments for place: $.order.count: expected a number greater than 0, "
            "got the number 0",
        ),
        (
            _order(notes=["x" * 21]),
            "invalid arguments for place: $.order.notes[0]: expected at most 20 characters, "
            "got 21 characters",
        ),
        (
            _order(size=None),  # required: null is not a size
            "invalid arguments for place: $.order.size: expected one of 's', 'l', got null",
        ),
    ],
)
def test_a_strict_decoder_refuses_what_the_strict_schema_refuses(
    arguments: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidToolCallError) as caught:
        place.decode(orjson.dumps(arguments).decode())
    assert str(caught.value) == problem


@dataclasses.dataclass
class Window:
    width: int
    height: int = 10
    label: str | None = "w"


@attrs.frozen
class Door:
    width: int
    color: str = "red"


class Room(TypedDict):
    name: str
    area: NotRequired[float]


@tool(strict=True)
def build(window: Window, door: Door, room: Room) -> str:
    """Build."""
    return f"{window} {door} {room}"


def test_dataclasses_attrs_and_typeddicts_work_strictly() -> None:
    schema = build.definition.input_schema.value()
    for node in _walk(schema):
        assert node["additionalProperties"] is False
        assert sorted(node["required"]) == sorted(node["properties"])
    properties = schema["properties"]
    assert properties["window"]["properties"]["label"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}]
    }
    assert properties["room"]["properties"]["area"] == {
        "anyOf": [{"type": "number"}, {"type": "null"}]
    }
    arguments = {
        "window": {"width": 1, "height": None, "label": None},
        "door": {"width": 2, "color": None},
        "room": {"name": "hall", "area": None},
    }
    jsonschema.validate(arguments, schema)
    decoded = build.decode(orjson.dumps(arguments).decode())
    # label accepts None: null is None; height and color do not: their defaults; area
    # has no default: the key is left out of the TypedDict.
    assert decoded == {
        "window": Window(1, 10, None),
        "door": Door(2),
        "room": {"name": "hall"},
    }
    del arguments["room"]["area"]
    with pytest.raises(InvalidToolCallError, match=r"\$\.room\.area: required field missing"):
        build.decode(orjson.dumps(arguments).decode())


def test_without_strict_nothing_changes() -> None:
    @tool
    def loose(window: Window) -> str:
        return str(window)

    assert not loose.definition.strict
    schema = loose.definition.input_schema.value()["properties"]["window"]
    assert schema["required"] == ["width"]
    assert loose.decode('{"window": {"width": 1}}') == {"window": Window(1)}


class Open(BaseModel):
    meta: dict[str, int]


class Pair(BaseModel):
    both: tuple[int, str]


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (
            dict[str, int],
            "tool 'bad', parameter value: additionalProperties: a mapping (dict[str, ...]) "
            'has no strict form (the strict subset needs "additionalProperties": false on '
            "every object); use a class with named fields",
        ),
        (
            Open,
            "tool 'bad', parameter value.meta: additionalProperties: a mapping (dict[str, "
            '...]) has no strict form (the strict subset needs "additionalProperties": false '
            "on every object); use a class with named fields",
        ),
        (
            list[Pair],
            "tool 'bad', parameter value[].both: prefixItems: a fixed-length tuple has no "
            "strict form; use tuple[T, ...], list[T] or a class",
        ),
        (
            tuple[()],
            "tool 'bad', parameter value: maxItems: the empty tuple has no strict form",
        ),
        (
            Any,
            "tool 'bad', parameter value: Any has no strict form (the strict subset needs a "
            '"type" for every value)',
        ),
        (
            list[Any] | None,
            "tool 'bad', parameter value[]: Any has no strict form (the strict subset needs "
            'a "type" for every value)',
        ),
    ],
    ids=["mapping", "nested-mapping", "fixed-tuple", "empty-tuple", "any", "nested-any"],
)
def test_what_the_strict_subset_cannot_express_is_refused_at_decoration(
    annotation: Any, message: str
) -> None:
    def bad(value: Any) -> None:
        pass

    bad.__annotations__ = {"value": annotation, "return": None}
    tool(bad)  # fine without strict
    with pytest.raises(TypeError) as caught:
        tool(strict=True)(bad)
    assert type(caught.value) is TypeError
    assert str(caught.value) == message


def test_strict_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^strict must be a bool, got int$"):
        tool(strict=1)(lambda: None)  # type: ignore[call-overload]
    with pytest.raises(InvalidToolDefinitionError) as caught:
        ToolDefinition("t", {"type": "object"}, strict="yes")  # type: ignore[arg-type]
    assert str(caught.value) == "tool 't' strict must be a bool, got str"
    with pytest.raises(InvalidOutputFormatError) as format_error:
        OutputFormat.json_schema("x", {"type": "object"}, strict=1)  # type: ignore[arg-type]
    assert str(format_error.value) == "output format strict must be a bool, got int"
    with pytest.raises(InvalidOutputFormatError, match=r"^a json output format cannot be strict$"):
        OutputFormat(OutputFormat.json().type, strict=True)


def test_the_flags_encode_only_when_set_and_old_encodings_decode() -> None:
    definition = place.definition
    encoded = codec.to_json(definition)
    assert orjson.loads(encoded)["strict"] is True
    assert codec.from_json(encoded, ToolDefinition) == definition
    legacy = b'{"input_schema":{"type":"object"},"name":"t"}'  # before strict existed
    assert codec.from_json(legacy, ToolDefinition) == ToolDefinition("t", {"type": "object"})
    assert codec.to_json(ToolDefinition("t", {"type": "object"})) == legacy
    fmt = OutputFormat.json_schema("x", {"type": "object"}, strict=True)
    assert codec.from_json(codec.to_json(fmt), OutputFormat) == fmt
    legacy_format = b'{"name":"x","schema":{"type":"object"},"type":"json_schema"}'
    assert codec.from_json(legacy_format, OutputFormat) == OutputFormat.json_schema(
        "x", {"type": "object"}
    )
    assert codec.to_json(OutputFormat.json_schema("x", {"type": "object"})) == legacy_format


# ------------------------------------------------------------------ property


@given(
    st.fixed_dictionaries(
        {"width": st.integers(-5, 5)},
        optional={
            "height": st.none() | st.integers(-5, 5),
            "label": st.none() | st.text(max_size=3),
        },
    )
)
def test_the_strict_decoder_accepts_exactly_the_complete_objects(window: dict[str, Any]) -> None:
    """Against the strict schema (checked by a JSON Schema validator): an object with
    every key decodes (nulls to the defaults, or None where the type accepts it); one
    with a key missing is refused, as the schema refuses it."""
    schema = build.definition.input_schema.value()["properties"]["window"]
    complete = len(window) == 3
    valid = jsonschema.Draft202012Validator(schema).is_valid(window)
    assert valid == complete
    arguments = orjson.dumps(
        {"window": window, "door": {"width": 1, "color": "b"}, "room": {"name": "r", "area": 1}}
    ).decode()
    if not complete:
        with pytest.raises(InvalidToolCallError, match="required field missing"):
            build.decode(arguments)
        return
    decoded = build.decode(arguments)["window"]
    height = 10 if window["height"] is None else window["height"]
    assert decoded == Window(window["width"], height, window["label"])


# ------------------------------------------------------------------ output=


def _answer(value: Any) -> Response:
    return Response(Output(assistant_message(orjson.dumps(value).decode()), FinishReason.STOP))


async def test_strict_output_sends_a_strict_format_and_decodes_as_it_says() -> None:
    model = ScriptedModel(_answer(_order()["order"]))
    conversation = Conversation(model, InMemoryStore(), "c", strict_output=True)
    result = await conversation.ask("order", output=Order)
    assert result.output == Order(
        size=Size.S, count=2, address=Address(street=Street(name="Rua"), code="1000")
    )
    fmt = model.requests[0].options.output_format
    assert fmt is not None and fmt.strict and fmt.name == "Order"
    assert fmt.schema is not None and fmt.schema.value() == ORDER


async def test_without_strict_output_the_format_is_not_strict() -> None:
    model = ScriptedModel(_answer({"street": {"name": "Rua"}, "code": "1000"}))
    result = await Conversation(model, InMemoryStore(), "c").ask("where", output=Address)
    assert result.output == Address(street=Street(name="Rua"), code="1000")
    fmt = model.requests[0].options.output_format
    assert fmt is not None and not fmt.strict


async def test_strict_output_refuses_what_the_subset_cannot_express() -> None:
    conversation = Conversation(ScriptedModel(), InMemoryStore(), "c", strict_output=True)
    with pytest.raises(TypeError) as caught:
        await conversation.ask("n", output=list[int])
    assert str(caught.value) == (
        "output: list[int]: a strict schema's root must be an object (an attrs class, "
        "dataclass, TypedDict or Pydantic model)"
    )
    with pytest.raises(TypeError) as nested:
        await conversation.ask("n", output=Open)
    assert str(nested.value).startswith("output: meta: additionalProperties: a mapping")
    with pytest.raises(TypeError, match=r"^strict_output must be a bool, got str$"):
        Conversation(ScriptedModel(), InMemoryStore(), "c", strict_output="yes")  # type: ignore[arg-type]


def test_interval_bounds_are_said_in_the_description() -> None:
    @tool(strict=True)
    def pick(n: Annotated[int, annotated_types.Interval(ge=1, lt=10), "how many"]) -> int:
        return n

    assert pick.definition.input_schema.value()["properties"]["n"] == {
        "type": "integer",
        "description": "how many (minimum 1, exclusiveMaximum 10)",
    }
    with pytest.raises(InvalidToolCallError, match=r"\$\.n: expected a number less than 10"):
        pick.decode('{"n": 10}')
