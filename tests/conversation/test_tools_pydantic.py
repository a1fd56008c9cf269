"""Pydantic v2 models as tool parameters and as ``output=`` (scope.tools, scope.conversation):
the schema (nested models, enums, optionals, aliases, descriptions, constraints), decoding
into the model, every constraint refused with its path, the model's own validators
reported as error results, refused forms, and pydantic never imported by scope itself.
"""

from __future__ import annotations

import dataclasses
import enum
import subprocess
import sys
from typing import Annotated, Any, NotRequired, TypedDict

import annotated_types
import attrs
import jsonschema
import pytest
from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    RootModel,
    field_validator,
    model_validator,
)

from scope.chat import (
    FinishReason,
    Output,
    Response,
    ToolCall,
    assistant_message,
    tool_call_part,
)
from scope.conversation import Conversation
from scope.errors import InvalidResponseError, InvalidToolCallError
from scope.history.inmemory import InMemoryStore
from scope.jsonvalue import RawJSON
from scope.testing import ScriptedModel
from scope.tools import Tool, to_output, tool

pytestmark = pytest.mark.anyio


class Unit(enum.Enum):
    C = "C"
    F = "F"


class Station(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{4}$", description="the ICAO code")
    height: float | None = Field(None, ge=0, lt=9000)


class Forecast(BaseModel):
    city: str = Field(min_length=1, max_length=40)
    unit: Unit
    days: Annotated[int, Field(gt=0, le=7)] = 1
    station: Station
    backup: Station | None = None
    hours: list[Annotated[int, annotated_types.Interval(ge=0, le=23)]] = Field(
        default_factory=list, max_length=3
    )
    step: int = Field(0, multiple_of=3)
    note: str = Field("", alias="Note")

    @field_validator("city")
    @classmethod
    def _not_nowhere(cls, value: str) -> str:
        if value == "Nowhere":
            raise ValueError("no such city")
        return value

    @model_validator(mode="after")
    def _fahrenheit_needs_a_backup(self) -> Forecast:
        if self.unit is Unit.F and self.backup is None:
            raise ValueError("F needs a backup station")
        return self


STATION = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": r"^[A-Z]{4}$", "description": "the ICAO code"},
        "height": {
            "anyOf": [
                {"type": "number", "minimum": 0, "exclusiveMaximum": 9000},
                {"type": "null"},
            ]
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}

FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "unit": {"type": "string", "enum": ["C", "F"]},
        "days": {"type": "integer", "exclusiveMinimum": 0, "maximum": 7},
        "station": STATION,
        "backup": {"anyOf": [STATION, {"type": "null"}]},
        "hours": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 23},
            "maxItems": 3,
        },
        "step": {"type": "integer", "multipleOf": 3},
        "Note": {"type": "string"},
    },
    "required": ["city", "unit", "station"],
    "additionalProperties": False,
}


@tool
def forecast(request: Forecast) -> Forecast:
    """Check a forecast request."""
    return request


def test_the_schema_of_a_model_is_closed_inline_and_carries_its_constraints() -> None:
    schema = forecast.definition.input_schema.value()
    assert schema == {
        "type": "object",
        "properties": {"request": FORECAST},
        "required": ["request"],
        "additionalProperties": False,
    }
    jsonschema.Draft202012Validator.check_schema(schema)
    # Nothing a strict mode refuses: no $ref/$defs, titles, defaults or open objects.
    text = str(forecast.definition.input_schema)
    for word in ("$ref", "$defs", "title", "default", "allOf"):
        assert word not in text


VALID = (
    '{"request": {"city": "Lisbon", "unit": "F", "days": 2.0, "station": {"code": "LPPT"},'
    ' "backup": {"code": "LPCS", "height": 10}, "hours": [0, 23], "step": 6, "Note": "n"}}'
)


def test_arguments_decode_into_the_model() -> None:
    kwargs = forecast.decode(VALID)
    assert kwargs == {
        "request": Forecast(
            city="Lisbon",
            unit=Unit.F,
            days=2,
            station=Station(code="LPPT"),
            backup=Station(code="LPCS", height=10.0),
            hours=[0, 23],
            step=6,
            Note="n",
        )
    }
    assert type(kwargs["request"].days) is int and type(kwargs["request"].backup.height) is float
    assert jsonschema.Draft202012Validator(forecast.definition.input_schema.value()).is_valid(
        {"request": {"city": "x", "unit": "C", "station": {"code": "ABCD"}}}
    )


async def test_the_returned_model_is_json_output_by_alias() -> None:
    result = await forecast.run(ToolCall("c1", "forecast", VALID))
    assert not result.is_error
    assert result.output.details == RawJSON.from_value(
        {
            "city": "Lisbon",
            "unit": "F",
            "days": 2,
            "station": {"code": "LPPT", "height": None},
            "backup": {"code": "LPCS", "height": 10.0},
            "hours": [0, 23],
            "step": 6,
            "Note": "n",
        }
    )
    assert to_output(Station(code="ABCD")).details == RawJSON.from_value(
        {"code": "ABCD", "height": None}
    )


def _request(**changes: Any) -> str:
    request: dict[str, Any] = {"city": "Lisbon", "unit": "C", "station": {"code": "LPPT"}}
    request.update(changes)
    return str(RawJSON.from_value({"request": request}))


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (_request(city=""), "$.request.city: expected at least 1 characters, got 0 characters"),
        (_request(city="x" * 41), "$.request.city: expected at most 40 characters, got 41"),
        (_request(days=0), "$.request.days: expected a number greater than 0, got the number 0"),
        (_request(days=8), "$.request.days: expected a number at most 7, got the number 8"),
        (_request(days="2"), "$.request.days: expected an integer, got the string '2'"),
        (
            _request(station={"code": "lppt"}),
            "$.request.station.code: expected a string matching '^[A-Z]{4}$', got the string",
        ),
        (
            _request(station={"code": "LPPT", "height": -1}),
            "$.request.station.height: expected a number at least 0, got the number -1",
        ),
        (
            _request(station={"code": "LPPT", "height": 9000}),
            "$.request.station.height: expected a number less than 9000, got the number 9000",
        ),
        (_request(hours=[24]), "$.request.hours[0]: expected a number at most 23, got"),
        (_request(hours=[1, 2, 3, 4]), "$.request.hours: expected at most 3 items, got 4 items"),
        (_request(step=4), "$.request.step: expected a multiple of 3, got the number 4"),
        (_request(unit="K"), "$.request.unit: expected one of 'C', 'F', got the string 'K'"),
        (_request(station={}), "$.request.station.code: required field missing"),
        (_request(extra=1), "$.request: unknown field(s) ['extra'] (not in the schema)"),
        (_request(note="by name"), "$.request: unknown field(s) ['note'] (not in the schema)"),
        # The model's own validators, with their paths.
        (_request(city="Nowhere"), "$.request.city: Value error, no such city"),
        (_request(unit="F"), "$.request: Value error, F needs a backup station"),
    ],
)
def test_each_invalid_argument_is_refused_with_its_path(arguments: str, problem: str) -> None:
    with pytest.raises(InvalidToolCallError, match="invalid arguments for forecast") as caught:
        forecast.decode(arguments)
    assert problem in str(caught.value)


async def test_the_models_own_errors_become_an_error_result_the_model_can_fix() -> None:
    result = await forecast.run(ToolCall("c1", "forecast", _request(unit="F")))
    assert result.is_error
    text = result.output.text() or ""
    assert "$.request: Value error, F needs a backup station" in text
    assert "Call forecast again with corrected arguments" in text


@dataclasses.dataclass
class Window:
    start: Annotated[int, annotated_types.Ge(0)]
    tags: Annotated[dict[str, str], annotated_types.MaxLen(1)] = dataclasses.field(
        default_factory=dict
    )


@attrs.frozen
class Span:
    end: Annotated[float, annotated_types.Lt(1)]


class Label(TypedDict):
    text: NotRequired[Annotated[str, annotated_types.MaxLen(2)]]


def test_constraints_work_outside_models_too() -> None:
    @tool
    def pick(
        window: Window,
        count: Annotated[int, Field(gt=0)] = 1,
        span: Span | None = None,
        label: Label | None = None,
    ) -> None:
        return None

    properties = pick.definition.input_schema.value()["properties"]
    assert properties["count"] == {"type": "integer", "exclusiveMinimum": 0}
    assert properties["window"]["properties"]["start"] == {"type": "integer", "minimum": 0}
    assert properties["window"]["properties"]["tags"] == {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "maxProperties": 1,
    }
    assert pick.decode('{"window": {"start": 0}}') == {"window": Window(0)}
    assert pick.decode('{"window": {"start": 0}, "label": {"text": "ab"}}')["label"] == {
        "text": "ab"
    }
    assert properties["label"]["anyOf"][0]["properties"]["text"] == {
        "type": "string",
        "maxLength": 2,
    }
    assert pick.decode('{"window": {"start": 0}, "span": {"end": 0.5}}')["span"] == Span(0.5)
    assert properties["span"]["anyOf"][0]["properties"]["end"] == {
        "type": "number",
        "exclusiveMaximum": 1,
    }
    for arguments, problem in [
        ('{"window": {"start": -1}}', "$.window.start: expected a number at least 0"),
        (
            '{"window": {"start": 0}, "span": {"end": 1}}',
            "$.span: expected Span or null, got an object",
        ),
        ('{"window": {"start": 0}, "count": 0}', "$.count: expected a number greater than 0"),
        (
            '{"window": {"start": 0, "tags": {"a": "", "b": ""}}}',
            "$.window.tags: expected at most 1 items, got 2 items",
        ),
        (
            '{"window": {"start": 0}, "label": {"text": "abc"}}',
            "$.label: expected Label or null, got an object",
        ),
    ]:
        with pytest.raises(InvalidToolCallError) as caught:
            pick.decode(arguments)
        assert problem in str(caught.value)


def test_bounds_given_twice_are_one_bound_in_the_schema_and_the_decoder() -> None:
    @tool
    def pick(
        n: Annotated[int, annotated_types.Ge(1), annotated_types.Ge(0), Field(le=5)],
        m: Annotated[Annotated[int, annotated_types.Ge(5)] | None, annotated_types.Ge(0)] = None,
    ) -> None:
        return None

    properties = pick.definition.input_schema.value()["properties"]
    assert properties["n"] == {"type": "integer", "minimum": 1, "maximum": 5}
    assert properties["m"] == {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "null"}]}
    assert pick.decode('{"n": 1, "m": 5}') == {"n": 1, "m": 5}
    for arguments, problem in [
        ('{"n": 0}', "$.n: expected a number at least 1, got the number 0"),
        ('{"n": 1, "m": 3}', "$.m: expected int or null, got the number 3"),
    ]:
        with pytest.raises(InvalidToolCallError) as caught:
            pick.decode(arguments)
        assert problem in str(caught.value)


# ------------------------------------------------------------------ refused forms


class Tree(BaseModel):
    children: list[Tree] = []


class Dated(BaseModel):
    when: bytes


class Chosen(BaseModel):
    name: str = Field(validation_alias=AliasChoices("name", "title"))


class Hours(RootModel[list[int]]):
    pass


@pytest.mark.parametrize(
    ("annotation", "match"),
    [
        (Tree, r"parameter value: children: Tree refers to itself"),
        (Dated, r"parameter value: when: bytes has no JSON Schema form"),
        (Chosen, r"Chosen.name: a validation alias that is not one name"),
        (
            Annotated[int, annotated_types.Predicate(bool)],
            r"parameter value: Predicate\(bool\) has no JSON Schema form",
        ),
        (
            Annotated[str, annotated_types.Gt(0)],
            r"str: the constraint gt=0 applies to none of its values",
        ),
        (Annotated[int, Field(pattern="x")], r"int: the constraint pattern='x' applies to none"),
        (Hours, r"Hours is a RootModel: its JSON form is not an object, use its root type"),
        (
            Annotated[int, annotated_types.MultipleOf(2), annotated_types.MultipleOf(3)],
            r"two multiple_of constraints \(2 and 3\): give one",
        ),
    ],
)
def test_forms_without_a_schema_are_refused_when_the_tool_is_made(
    annotation: Any, match: str
) -> None:
    def probe(value: Any) -> None:
        return None

    probe.__annotations__ = {"value": annotation}
    with pytest.raises(TypeError, match=match):
        Tool(probe)


def test_scope_never_imports_pydantic_itself() -> None:
    code = (
        "import sys, dataclasses, typing\n"
        "import scope.tools, scope.conversation\n"
        "@dataclasses.dataclass\n"
        "class Point:\n"
        "    x: int\n"
        "def f(p: Point, n: typing.Annotated[int, 'how many'] = 1) -> None: ...\n"
        'scope.tools.tool(f).decode(\'{"p": {"x": 1}}\')\n'
        "assert 'pydantic' not in sys.modules, 'pydantic imported'\n"
        "assert 'annotated_types' not in sys.modules, 'annotated_types imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------ in a conversation


def _calls(arguments: str) -> Response:
    message = assistant_message(tool_call_part("c1", "forecast", arguments))
    return Response(Output(message, FinishReason.TOOL_CALLS))


def _answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


async def test_a_model_round_trips_as_a_tool_argument_and_as_output() -> None:
    answer = RawJSON.parse(VALID).value()["request"]
    model = ScriptedModel(
        _calls(_request(unit="F")), _calls(VALID), _answer(str(RawJSON.from_value(answer)))
    )
    conversation = Conversation(model, InMemoryStore(), "c", tools=[forecast])
    result = await conversation.ask("plan", output=Forecast)
    assert result.output == forecast.decode(VALID)["request"]
    first, second, third = model.requests
    assert first.tools[0].input_schema.value()["properties"]["request"] == FORECAST
    output_format = first.options.output_format
    assert output_format is not None and output_format.name == "Forecast"
    assert output_format.schema is not None and output_format.schema.value() == FORECAST
    refused = second.messages[-1].parts[0].tool_result
    assert refused is not None and refused.is_error
    assert "F needs a backup station" in (refused.output.text() or "")
    answered = third.messages[-1].parts[0].tool_result
    assert answered is not None and not answered.is_error


async def test_an_answer_the_model_refuses_raises_with_the_path() -> None:
    model = ScriptedModel(_answer('{"city": "Nowhere", "unit": "C", "station": {"code": "LPPT"}}'))
    with pytest.raises(InvalidResponseError, match="the turn is stored") as caught:
        await Conversation(model, InMemoryStore(), "c").ask(
            "plan", output=Forecast, output_retries=0
        )
    assert "does not decode into Forecast: $.city: Value error, no such city" in str(caught.value)
