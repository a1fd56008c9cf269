"""Tool definitions, output formats and generation options."""

from __future__ import annotations

import builtins
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar, final

import attrs

from scope._validate import check_int, check_text, nested, to_enum, to_tuple
from scope.chat._types import OutputFormatType, OutputFormatTypeLike
from scope.errors import (
    InvalidOptionsError,
    InvalidOutputFormatError,
    InvalidToolDefinitionError,
)
from scope.jsonvalue import RawJSON, coerce_raw_json
from scope.metadata import EMPTY_EXTENSIONS, Extensions

__all__ = ["Options", "OutputFormat", "ToolDefinition"]

T = TypeVar("T")

_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_object_schema(schema: RawJSON) -> bool:
    # Canonical bytes start with '{' exactly when the document is an object.
    return schema.bytes[:1] == b"{"


def _to_input_schema(value: RawJSON | dict[str, Any]) -> RawJSON:
    return nested(coerce_raw_json, value, InvalidToolDefinitionError, "tool input_schema")


@final
@attrs.frozen
class ToolDefinition:
    """A tool the model may call.

    ``name`` is 1-64 ASCII letters, digits, ``_`` and ``-`` (what every major provider
    accepts); ``input_schema`` is a JSON Schema object whose ``"type"`` is ``"object"``.
    ``strict`` asks providers with a strict mode (OpenAI, Anthropic) to constrain the
    model's arguments to the schema, which must then be in their strict subset
    (``@tool(strict=True)`` makes one); providers without one (Gemini) ignore it.
    ``freeform`` says the tool takes one text, not JSON arguments: the schema is then an
    object of exactly one required string property (the text). OpenAI Responses offers
    it as a custom tool (the model writes the text itself, a ``custom_tool_call``); the
    other providers get the schema, and the text comes as that property.
    """

    name: str
    input_schema: RawJSON = attrs.field(converter=_to_input_schema)
    description: str = ""
    # Last, and omitted from the encoding when False: definitions stored before it
    # existed decode unchanged (as not strict).
    strict: bool = attrs.field(default=False, kw_only=True)
    # Likewise: omitted when False.
    freeform: bool = attrs.field(default=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the definition (construction already did)."""
        check_text(self.name, "tool name", InvalidToolDefinitionError, required=True)
        if _TOOL_NAME.fullmatch(self.name) is None:
            raise InvalidToolDefinitionError(
                f"tool name must be 1-64 ASCII letters, digits, '_' or '-', got {self.name!r}"
            )
        check_text(self.description, "tool description", InvalidToolDefinitionError)
        if type(self.strict) is not bool:
            raise InvalidToolDefinitionError(
                f"tool {self.name!r} strict must be a bool, got {type(self.strict).__name__}"
            )
        if not isinstance(self.input_schema, RawJSON) or not _is_object_schema(self.input_schema):
            raise InvalidToolDefinitionError(
                f"tool {self.name!r} input_schema must be a JSON object"
            )
        schema = self.input_schema.value()
        if schema.get("type") != "object":
            raise InvalidToolDefinitionError(
                f'tool {self.name!r} input_schema must have "type": "object"'
            )
        if type(self.freeform) is not bool:
            raise InvalidToolDefinitionError(
                f"tool {self.name!r} freeform must be a bool, got {type(self.freeform).__name__}"
            )
        if self.freeform and _freeform_property(schema) is None:
            raise InvalidToolDefinitionError(
                f"tool {self.name!r} is freeform: its input_schema must be an object of "
                "exactly one property, a required string (the text)"
            )


def _freeform_property(schema: Any) -> str | None:
    """The one property of a freeform tool's input schema (an object whose only
    property is a required string), or None when ``schema`` is no such object."""
    if type(schema) is not dict:
        return None
    properties = schema.get("properties")
    if type(properties) is not dict or len(properties) != 1:
        return None
    ((name, spec),) = properties.items()
    required = schema.get("required")
    if type(spec) is not dict or spec.get("type") != "string":
        return None
    if type(required) is not list or name not in required:
        return None
    return str(name)


def _optional_schema(value: RawJSON | dict[str, Any] | None) -> RawJSON | None:
    return None if value is None else coerce_raw_json(value)


def _to_output_format_type(value: OutputFormatTypeLike) -> OutputFormatType:
    return to_enum(OutputFormatType, value, InvalidOutputFormatError, "output format type")


def _to_output_schema(value: RawJSON | dict[str, Any] | None) -> RawJSON | None:
    return nested(_optional_schema, value, InvalidOutputFormatError, "output format schema")


@final
@attrs.frozen
class OutputFormat:
    """The shape of the answer: plain text, any JSON, or JSON matching a named schema.

    ``strict`` (json_schema only) asks providers with a strict structured-output mode
    (OpenAI Chat Completions and Responses) to constrain the answer to the schema, which
    must then be in their strict subset; the others ignore it.
    """

    type: OutputFormatType = attrs.field(converter=_to_output_format_type)
    name: str = ""
    description: str = ""
    schema: RawJSON | None = attrs.field(default=None, converter=_to_output_schema)
    # Omitted from the encoding when False: formats stored before it existed decode
    # unchanged (as not strict).
    strict: bool = attrs.field(default=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the format (construction already did)."""
        check_text(self.name, "output format name", InvalidOutputFormatError, strip=True)
        check_text(
            self.description, "output format description", InvalidOutputFormatError, strip=True
        )
        if type(self.strict) is not bool:
            raise InvalidOutputFormatError(
                f"output format strict must be a bool, got {type(self.strict).__name__}"
            )
        if self.strict and self.type is not OutputFormatType.JSON_SCHEMA:
            raise InvalidOutputFormatError(f"a {self.type} output format cannot be strict")
        if self.type is OutputFormatType.JSON_SCHEMA:
            if not self.name:
                raise InvalidOutputFormatError("a json_schema output format needs a name")
            if self.schema is None or not _is_object_schema(self.schema):
                raise InvalidOutputFormatError(
                    "a json_schema output format needs a schema that is a JSON object"
                )
        elif self.name or self.description or self.schema is not None:
            raise InvalidOutputFormatError(
                f"a {self.type} output format takes no name, description or schema"
            )

    @classmethod
    def text(cls) -> OutputFormat:
        """Plain text (the default)."""
        return cls(OutputFormatType.TEXT)

    @classmethod
    def json(cls) -> OutputFormat:
        """Any single JSON value."""
        return cls(OutputFormatType.JSON)

    @classmethod
    def json_schema(
        cls,
        name: str,
        schema: RawJSON | dict[str, Any],
        description: str = "",
        *,
        strict: bool = False,
    ) -> OutputFormat:
        """JSON matching ``schema``, a JSON Schema object; ``strict``: see the class."""
        return cls(
            OutputFormatType.JSON_SCHEMA,
            name=name,
            description=description,
            schema=schema,
            strict=strict,
        )

    def fallback_instruction(self) -> str:
        """An instruction for models without native structured output (empty for text)."""
        if self.type is OutputFormatType.TEXT:
            return ""
        if self.type is OutputFormatType.JSON:
            return "Respond with a single valid JSON value and nothing else."
        about = f" ({self.description})" if self.description else ""
        return (
            f"Respond with a single valid JSON value and nothing else. It must match the JSON "
            f"Schema named {self.name!r}{about}:\n{self.schema}"
        )

    def schema_as(self, cls: builtins.type[T]) -> T:
        """Decode the schema into ``cls`` with the scope codec: ``dict`` (or ``list``,
        ``typing.Any``) for plain JSON types, ``RawJSON``, ``Metadata``, or any class
        ``scope.codec.from_json`` decodes.

        Raises ``InvalidOutputFormatError`` for a text or json format (no schema), for a
        ``cls`` the codec cannot decode into (naming it), and when the schema does not
        decode into ``cls`` (the codec's error chained as the cause).
        """
        if self.type is not OutputFormatType.JSON_SCHEMA or self.schema is None:
            raise InvalidOutputFormatError(f"a {self.type} output format has no schema")
        from scope.codec import from_json

        try:
            return from_json(self.schema.bytes, cls)
        except ValueError as exc:
            raise InvalidOutputFormatError(f"output format schema: {exc}") from exc
        except TypeError as exc:
            # from_json raises TypeError only for a target it cannot decode into (bad
            # input is always its ValueError): a caller's mistake, named as such.
            name = getattr(cls, "__qualname__", None) or repr(cls)
            raise InvalidOutputFormatError(
                f"cannot decode the output format schema into {name}: use dict, list, "
                "typing.Any, RawJSON, Metadata or a scope value class"
            ) from exc


def _check_range(value: object, what: str, low: float, high: float) -> None:
    if value is None:
        return
    if type(value) is bool or not isinstance(value, int | float):
        raise InvalidOptionsError(f"{what} must be a number, got {type(value).__name__}")
    # Compared exactly: math.isfinite() of a huge int would raise OverflowError.
    if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        raise InvalidOptionsError(f"{what} must be between {low:g} and {high:g}, got {value!r}")


def _to_float(value: float | None) -> float | None:
    """Converter: an int becomes a float (so equal options compare and encode equal)."""
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # beyond any float: left for validate() to refuse
            return value
    return value


def _stop(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else to_tuple(value)


def _to_extensions(value: Mapping[str, Any]) -> Extensions:
    return nested(Extensions.coerce, value, InvalidOptionsError, "options extensions")


@final
@attrs.frozen
class Options:
    """Generation settings. ``None`` (or ``""``) means unset; ``stop=()`` is an explicit
    empty list. Provider-specific settings go in ``extensions`` as ``provider/name``."""

    model: str = ""
    output_format: OutputFormat | None = None
    frequency_penalty: float | None = attrs.field(default=None, converter=_to_float)
    max_tokens: int | None = None
    presence_penalty: float | None = attrs.field(default=None, converter=_to_float)
    reasoning_effort: str = ""
    stop: tuple[str, ...] | None = attrs.field(default=None, converter=_stop)
    temperature: float | None = attrs.field(default=None, converter=_to_float)
    top_k: int | None = None
    top_p: float | None = attrs.field(default=None, converter=_to_float)
    extensions: Extensions = attrs.field(default=EMPTY_EXTENSIONS, converter=_to_extensions)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the options (construction already did)."""
        check_text(self.model, "model", InvalidOptionsError, strip=True)
        check_text(self.reasoning_effort, "reasoning_effort", InvalidOptionsError, strip=True)
        if self.output_format is not None and not isinstance(self.output_format, OutputFormat):
            raise InvalidOptionsError(
                f"output_format must be an OutputFormat, got {type(self.output_format).__name__}"
            )
        _check_range(self.frequency_penalty, "frequency_penalty", -2, 2)
        _check_range(self.presence_penalty, "presence_penalty", -2, 2)
        _check_range(self.temperature, "temperature", 0, 2)
        _check_range(self.top_p, "top_p", 0, 1)
        if self.max_tokens is not None:
            check_int(self.max_tokens, "max_tokens", InvalidOptionsError, minimum=1)
        if self.top_k is not None:
            check_int(self.top_k, "top_k", InvalidOptionsError, minimum=1)
        if self.stop is not None:
            if type(self.stop) is not tuple:
                raise InvalidOptionsError(
                    f"stop must be a sequence of strings, got {type(self.stop).__name__}"
                )
            for index, entry in enumerate(self.stop):
                check_text(entry, f"stop[{index}]", InvalidOptionsError, required=True)

    def resolve(self, override: Options | None) -> Options:
        """These options with ``override``'s populated fields laid over them.

        A field is populated when it is not None and not the empty string, so
        ``stop=()`` clears the base's stop list. Extensions merge, override winning.
        """
        if override is None:
            return self
        changes: dict[str, Any] = {}
        for field in attrs.fields(Options):
            if field.name == "extensions":
                continue
            value = getattr(override, field.name)
            if value is not None and value != "":
                changes[field.name] = value
        changes["extensions"] = self.extensions.merge(override.extensions)
        return attrs.evolve(self, **changes)
