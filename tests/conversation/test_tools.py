"""scope.tools: schemas from signatures (golden per type family, valid JSON Schema, and
accepting exactly what the decoder accepts), argument decoding, error results the model
can act on, return values, sync and async functions.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import threading
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import annotated_types
import anyio
import attrs
import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from scope.chat import PartKind, ToolCall, ToolOutput
from scope.errors import InvalidToolCallError, InvalidToolDefinitionError
from scope.jsonvalue import RawJSON
from scope.media import Media
from scope.tools import Tool, to_output, tool

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Point:
    x: int
    y: float = 0.0


@dataclasses.dataclass
class Place:
    name: str
    tags: list[str] = dataclasses.field(default_factory=list)
    at: Point | None = None


class Filter(TypedDict):
    field: str
    value: int | str
    exact: NotRequired[bool]


class Sample(BaseModel):
    x: int = Field(ge=-5, lt=5)
    ratio: float | None = Field(None, gt=0, le=1)


class Gauge(BaseModel):
    """A Pydantic model: nested models, an enum, optionals and constrained fields."""

    label: str = Field(pattern=r"^[a-c]+$", max_length=3)
    level: Level
    samples: list[Sample] = Field(default_factory=list, max_length=2)
    spare: Sample | None = None
    step: int = Field(0, multiple_of=2)


Short = Annotated[str, annotated_types.Len(1, 3)]


def schema_of(annotation: Any) -> dict[str, Any]:
    """The schema of a one-parameter tool's only parameter."""

    def probe(value: Any) -> None:
        return None

    probe.__annotations__ = {"value": annotation, "return": None}
    made = Tool(probe)
    schema: dict[str, Any] = made.definition.input_schema.value()
    return dict(schema["properties"]["value"])


# ------------------------------------------------------------------ golden schemas

GOLDEN: list[tuple[Any, dict[str, Any]]] = [
    (str, {"type": "string"}),
    (int, {"type": "integer"}),
    (float, {"type": "number"}),
    (bool, {"type": "boolean"}),
    (None, {"type": "null"}),
    (Any, {}),
    (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
    (Literal["a", 1, None], {"enum": ["a", 1, None]}),
    (Color, {"type": "string", "enum": ["red", "blue"]}),
    (Level, {"type": "integer", "enum": [1, 2]}),
    (list[int], {"type": "array", "items": {"type": "integer"}}),
    (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
    (
        tuple[int, str],
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string"}],
            "minItems": 2,
            "maxItems": 2,
        },
    ),
    (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
    (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
    (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    (
        Point,
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
            "required": ["x"],
            "additionalProperties": False,
        },
    ),
    (
        Place,
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "at": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
                            "required": ["x"],
                            "additionalProperties": False,
                        },
                        {"type": "null"},
                    ]
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    ),
    (
        Filter,
        {
            "type": "object",
            "properties": {
                "field": {"type": "string"},
                "value": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "exact": {"type": "boolean"},
            },
            "required": ["field", "value"],
            "additionalProperties": False,
        },
    ),
    (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
]


@pytest.mark.parametrize(("annotation", "expected"), GOLDEN, ids=repr)
def test_schema_of_each_type_family(annotation: Any, expected: dict[str, Any]) -> None:
    schema = schema_of(annotation)
    assert schema == expected
    jsonschema.Draft202012Validator.check_schema(schema)


def test_tool_definition_from_signature_and_sphinx_docstring() -> None:
    @tool
    async def get_weather(city: str, unit: Literal["C", "F"] = "C", days: int = 1) -> str:
        """The current weather in a city.

        Uses the nearest station.

        :param city: the city's name,
            e.g. Lisbon
        :param unit: the temperature unit
        """
        return city

    definition = get_weather.definition
    assert definition.name == "get_weather"
    assert definition.description == "The current weather in a city."
    assert definition.input_schema.value() == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name, e.g. Lisbon"},
            "unit": {"type": "string", "enum": ["C", "F"], "description": "the temperature unit"},
            "days": {"type": "integer"},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    jsonschema.Draft202012Validator.check_schema(definition.input_schema.value())


def test_google_style_docstring_and_overrides() -> None:
    @tool(name="sum-two", description="Adds.")
    def add(a: int, b: int = 0) -> int:
        """Add two numbers.

        Args:
            a: the first
              number
            b (int): the second
        Returns:
            the sum
        """
        return a + b

    assert add.name == "sum-two"
    assert add.definition.description == "Adds."
    properties = add.definition.input_schema.value()["properties"]
    assert properties["a"]["description"] == "the first number"
    assert properties["b"]["description"] == "the second"
    assert add(2, 3) == 5  # the Tool still calls the function


def test_a_tool_without_parameters() -> None:
    @tool
    def now() -> str:
        return "12:00"

    assert now.definition.input_schema.value() == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert now.decode("") == {}
    assert now.decode("  ") == {}
    assert now.decode("{}") == {}


# ------------------------------------------------------------------ refused signatures


class Node:
    pass


@attrs.frozen
class Tree:
    children: list[Tree]


@pytest.mark.parametrize(
    ("annotation", "match"),
    [
        (bytes, r"parameter value: bytes has no JSON Schema form"),
        (list, r"parameter value: list needs its item types"),
        (dict[int, str], r"parameter value: dict\[int, str\]: JSON object keys are strings"),
        (Node, r"parameter value: Node has no JSON Schema form"),
        (Tree, r"parameter value: children: Tree refers to itself"),
        (Literal[1.5], r"Literal values must be str, int, bool or None"),
    ],
)
def test_types_without_a_json_form_are_refused_naming_the_parameter(
    annotation: Any, match: str
) -> None:
    def probe(value: Any) -> None:
        return None

    probe.__annotations__ = {"value": annotation}
    with pytest.raises(TypeError, match=match):
        Tool(probe)


def test_parameters_that_cannot_be_keywords_or_lack_annotations_are_refused() -> None:
    def star(*items: int) -> None:
        return None

    def positional(a: int, /) -> None:
        return None

    def bare(a) -> None:  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(TypeError, match=r"tool 'star', parameter items: .*passed by keyword"):
        tool(star)
    with pytest.raises(TypeError, match=r"tool 'positional', parameter a: .*passed by keyword"):
        tool(positional)
    with pytest.raises(TypeError, match=r"tool 'bare', parameter a: needs a type annotation"):
        tool(bare)

    def fine(a: int) -> None:
        return None

    with pytest.raises(InvalidToolDefinitionError, match="name"):
        tool(name="has space")(fine)
    with pytest.raises(TypeError, match="tool needs a function"):
        Tool(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="thread must be a bool"):
        Tool(star, thread=1)  # type: ignore[arg-type]


# ------------------------------------------------------------------ decoding


@tool
def plan(place: Place, when: Literal["today", "tomorrow"], filters: list[Filter] = []) -> str:  # noqa: B006
    """Plan a trip."""
    return "ok"


def test_decoding_builds_the_annotated_types() -> None:
    kwargs = plan.decode(
        '{"place": {"name": "Lisbon", "at": {"x": 2.0}}, "when": "today",'
        ' "filters": [{"field": "f", "value": 3, "exact": true}]}'
    )
    assert kwargs == {
        "place": Place("Lisbon", [], Point(2, 0.0)),
        "when": "today",
        "filters": [{"field": "f", "value": 3, "exact": True}],
    }
    assert type(kwargs["place"].at.x) is int  # 2.0 is a JSON Schema integer


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("{", "are not valid JSON"),
        ("[1]", "must be a JSON object, got an array"),
        ('{"when": "today"}', "$.place: required field missing"),
        (
            '{"place": {"name": 1}, "when": "today"}',
            "$.place.name: expected a string, got the number 1",
        ),
        (
            '{"place": {"name": "x"}, "when": "soon"}',
            "$.when: expected one of 'today', 'tomorrow', got the string 'soon'",
        ),
        (
            '{"place": {"name": "x"}, "when": "today", "extra": 1}',
            "$: unknown field(s) ['extra'] (not in the schema)",
        ),
        (
            '{"place": {"name": "x", "at": {"x": 1.5}}, "when": "today"}',
            "$.place.at: expected Point or null, got an object",
        ),
        (
            '{"place": {"name": "x"}, "when": "today", "filters": [{"field": "f"}]}',
            "$.filters[0].value: required field missing",
        ),
        (
            '{"place": {"name": "x", "tags": "a"}, "when": "today"}',
            "$.place.tags: expected an array, got the string 'a'",
        ),
    ],
)
def test_invalid_arguments_name_the_path_and_the_problem(arguments: str, problem: str) -> None:
    with pytest.raises(InvalidToolCallError, match="plan") as caught:
        plan.decode(arguments)
    assert problem in str(caught.value)


async def test_run_turns_invalid_arguments_into_an_error_result_the_model_can_fix() -> None:
    result = await plan.run(ToolCall("c1", "plan", '{"place": {"name": 7}, "when": "today"}'))
    assert result.is_error
    assert result.id == "c1" and result.name == "plan"
    text = result.output.text()
    assert text is not None
    assert "$.place.name: expected a string, got the number 7" in text
    assert "Call plan again with corrected arguments" in text


async def test_run_turns_a_raised_exception_into_an_error_result() -> None:
    @tool
    async def lookup(key: str) -> str:
        raise KeyError(key)

    result = await lookup.run(ToolCall("c1", "lookup", '{"key": "k"}'))
    assert result.is_error
    assert result.output.text() == "lookup failed: KeyError: 'k'"


async def test_run_refuses_a_call_to_another_tool() -> None:
    with pytest.raises(ValueError, match="tool 'plan' cannot answer a call to 'other'"):
        await plan.run(ToolCall("c1", "other", "{}"))


async def test_cancellation_inside_a_tool_propagates() -> None:
    @tool
    async def slow() -> str:
        await anyio.sleep_forever()
        return "never"

    with anyio.move_on_after(0.01) as scope:
        await slow.run(ToolCall("c1", "slow", "{}"))
    assert scope.cancelled_caught


async def test_sync_tools_run_in_a_worker_thread_unless_told_not_to() -> None:
    loop_thread = threading.get_ident()

    @tool
    def where() -> int:
        return threading.get_ident()

    @tool(thread=False)
    def here() -> int:
        return threading.get_ident()

    threaded = await where.run(ToolCall("c1", "where", ""))
    inline = await here.run(ToolCall("c2", "here", ""))
    assert threaded.output.details is not None and inline.output.details is not None
    assert threaded.output.details.value() != loop_thread
    assert inline.output.details.value() == loop_thread


# ------------------------------------------------------------------ return values


def test_return_values_become_tool_output() -> None:
    media = Media.from_uri("image/png", "https://example.com/a.png")
    assert to_output("hi") == ToolOutput.of_text("hi")
    assert to_output(None) == ToolOutput()
    assert to_output(ToolOutput.of_text("x")) == ToolOutput.of_text("x")
    assert to_output(media).content[0].kind is PartKind.MEDIA
    assert to_output(RawJSON.parse("2.50")).details == RawJSON.parse("2.50")
    assert to_output({"b": [1, True]}).details == RawJSON.from_value({"b": [1, True]})
    assert to_output(Point(1)).details == RawJSON.from_value({"x": 1, "y": 0.0})
    assert to_output(Color.RED).details == RawJSON.from_value("red")
    with pytest.raises(TypeError, match="object has no JSON form"):
        to_output(object())


async def test_a_return_value_without_a_json_form_is_an_error_result() -> None:
    @tool
    def broken() -> object:
        return object()

    result = await broken.run(ToolCall("c1", "broken", ""))
    assert result.is_error
    assert "broken returned a value that cannot be sent" in (result.output.text() or "")


# ------------------------------------------------------------------ schema == decoder


@functools.cache  # one strategy object per annotation: hypothesis validates it once
def _valid(annotation: Any) -> st.SearchStrategy[Any]:
    """JSON values of ``annotation`` (as the decoder's own families describe them)."""
    if annotation is str:
        return st.text(max_size=5)
    if annotation is int:
        return st.integers(-(2**40), 2**40) | st.integers(-100, 100).map(float)
    if annotation is float:
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-9, 9)
    if annotation is bool:
        return st.booleans()
    if annotation is None:
        return st.none()
    if annotation is Color:
        return st.sampled_from(["red", "blue"])
    if annotation is Level:
        return st.sampled_from([1, 2, 1.0])
    if annotation == Literal["a", 1, None]:
        return st.sampled_from(["a", 1, None, 1.0])
    if annotation == list[int]:
        return st.lists(_valid(int), max_size=3)
    if annotation == tuple[int, str]:
        return st.tuples(_valid(int), _valid(str)).map(list)
    if annotation == dict[str, float]:
        return st.dictionaries(st.text(max_size=3), _valid(float), max_size=3)
    if annotation == int | None:
        return _valid(int) | st.none()
    if annotation is Point:
        return st.fixed_dictionaries({"x": _valid(int)}, optional={"y": _valid(float)})
    if annotation is Place:
        return st.fixed_dictionaries(
            {"name": _valid(str)},
            optional={"tags": st.lists(_valid(str), max_size=2), "at": _valid(Point) | st.none()},
        )
    if annotation is Filter:
        return st.fixed_dictionaries(
            {"field": _valid(str), "value": _valid(int) | _valid(str)},
            optional={"exact": st.booleans()},
        )
    if annotation is Sample:
        ratio = st.floats(min_value=0, max_value=1, exclude_min=True) | st.none()
        return st.fixed_dictionaries(
            {"x": st.integers(-5, 4) | st.integers(-5, 4).map(float)}, optional={"ratio": ratio}
        )
    if annotation is Gauge:
        return st.fixed_dictionaries(
            {"label": st.from_regex(r"[a-c]{1,3}", fullmatch=True), "level": _valid(Level)},
            optional={
                "samples": st.lists(_valid(Sample), max_size=2),
                "spare": _valid(Sample) | st.none(),
                "step": st.integers(-10, 10).map(lambda n: 2 * n),
            },
        )
    if annotation == Short:
        return st.text(min_size=1, max_size=3)
    raise AssertionError(annotation)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["x", "y", "name", "tags", "at", "z", "label", "ratio", "step"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)


@functools.cache
def _mutated(annotation: Any) -> st.SearchStrategy[Any]:
    """Near misses: a valid object with one member replaced, added or dropped."""

    def mutate(value: Any, data: st.DataObject) -> Any:
        if isinstance(value, dict) and value:
            key = data.draw(st.sampled_from(sorted(value)))
            action = data.draw(st.sampled_from(["replace", "drop", "add"]))
            value = dict(value)
            if action == "replace":
                value[key] = data.draw(_JSON)
            elif action == "drop":
                del value[key]
            else:
                value["unknown"] = 1
        elif isinstance(value, list) and value:
            index = data.draw(st.integers(0, len(value) - 1))
            value = [*value]
            value[index] = data.draw(_JSON)
        return value

    return st.builds(lambda v, d: (v, d), _valid(annotation), st.data()).map(
        lambda pair: mutate(*pair)
    )


FAMILIES = [
    str,
    int,
    float,
    bool,
    None,
    Color,
    Level,
    Literal["a", 1, None],
    list[int],
    tuple[int, str],
    dict[str, float],
    int | None,
    Point,
    Place,
    Filter,
    Sample,
    Gauge,
    Short,
]


@functools.cache
def _candidates(annotation: Any) -> st.SearchStrategy[Any]:
    """Valid values, any JSON, and near misses of ``annotation``'s values."""
    return st.one_of(_valid(annotation), _JSON, _mutated(annotation))


@functools.cache
def _probe(annotation: Any) -> tuple[Tool[..., Any], jsonschema.Draft202012Validator]:
    """A tool taking one ``value: annotation`` and its schema's validator, made once per
    annotation (not per example: building them is most of an example's cost)."""

    def probe(value: Any) -> None:
        return None

    probe.__annotations__ = {"value": annotation}
    made = Tool(probe)
    return made, jsonschema.Draft202012Validator(made.definition.input_schema.value())


@pytest.mark.parametrize("annotation", FAMILIES, ids=repr)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_schema_accepts_exactly_what_the_decoder_accepts(
    annotation: Any, data: st.DataObject
) -> None:
    made, validator = _probe(annotation)
    value = data.draw(_candidates(annotation))
    arguments = {"value": value}
    try:
        made.decode(orjson.dumps(arguments).decode())
        decodes = True
    except InvalidToolCallError:
        decodes = False
    assert validator.is_valid(arguments) == decodes, (arguments, decodes)


@pytest.mark.parametrize("annotation", FAMILIES, ids=repr)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_every_valid_value_decodes(annotation: Any, data: st.DataObject) -> None:
    made, _ = _probe(annotation)
    value = data.draw(_valid(annotation))
    made.decode(orjson.dumps({"value": value}).decode())
