"""JSON Schemas from Python types, and the strict decoder that accepts exactly what each
schema accepts: the machinery under ``scope.tools`` (tool arguments) and
``scope.conversation`` (structured answers).

The families (DESIGN §6f): ``str``, ``int``, ``float``, ``bool``, ``None``, ``Literal``,
``Enum``, ``list``/``tuple``/``dict``, unions and optionals, attrs classes, dataclasses,
``TypedDict``, Pydantic v2 models (and ``Any``, ``Annotated[T, "description"]``).
Anything else is refused when the schema is built (``TypeError`` naming the type), never
when a model calls.

Constraints (``annotated_types`` metadata, as Pydantic's ``Field(gt=..., max_length=...,
pattern=...)`` gives it, in ``Annotated`` or on a Pydantic model's field) become the JSON
Schema keywords of the JSON type they apply to (``exclusiveMinimum``, ``minLength``,
``minItems``, ...) and the decoder checks them as validators do. Pydantic is recognised
only once the program has imported it: this module never imports it itself, and a
Pydantic model decodes field by field through the strict hooks, then through the model's
own validation (``model_validate``), whose errors are reported with their paths.

Decoding runs on a dedicated ``cattrs.Converter`` with strict hooks: cattrs is lenient by
default (``"1"`` becomes ``1``, a string is an iterable of characters), and a tool's
arguments must be refused exactly where the schema refuses them. The rules follow JSON
Schema (draft 2020-12) as validators implement it: an ``integer`` is a number with no
fractional part (``2.0`` is accepted and becomes ``2``), a ``number`` accepts integers
(made floats), booleans are never numbers, ``enum`` compares numbers by value and
booleans only with booleans. Objects built from classes refuse unknown keys
(``additionalProperties: false``).

Strict mode (``schema_for(tp, strict=True)``, ``strict_schema``; ``structure(...,
strict=True)`` on a second converter): the schema in the subset the providers' strict
modes accept, and a decoder that agrees with it (every key of an object made from a
class present; a null for an optional field that does not accept null is its default).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any, Final, Literal, Union, get_args, get_origin

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
import cattrs.gen.typeddicts
import cattrs.v

__all__ = [
    "ArgumentError",
    "admits_null",
    "describe",
    "fields_of",
    "is_typeddict",
    "kind_of",
    "object_schema",
    "schema_for",
    "strict_schema",
    "structure",
    "unstructure",
]

_NoneType: Final = type(None)

#: TypedDict key qualifiers (``ReadOnly`` from Python 3.13): the schema is the inner type's.
_QUALIFIERS: Final = tuple(
    q for q in (typing.Required, typing.NotRequired, getattr(typing, "ReadOnly", None)) if q
)


class ArgumentError(ValueError):
    """A value that does not match its type; the message says what was expected."""


def is_typeddict(tp: object) -> bool:
    return isinstance(tp, type) and typing.is_typeddict(tp)


def _is_union(tp: object) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_literal(tp: object) -> bool:
    return get_origin(tp) is Literal


def _is_enum(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _is_array(tp: Any) -> bool:
    return get_origin(tp) in (list, tuple)


def _is_mapping(tp: Any) -> bool:
    return get_origin(tp) is dict


def is_pydantic(tp: object) -> bool:
    """A Pydantic v2 model class. Looked up in ``sys.modules``, never imported: a program
    that has not imported Pydantic has no Pydantic model."""
    main = sys.modules.get("pydantic.main")
    base = getattr(main, "BaseModel", None)
    return base is not None and isinstance(tp, type) and issubclass(tp, base) and tp is not base


def _is_class_like(tp: object) -> bool:
    return isinstance(tp, type) and (
        attrs.has(tp) or dataclasses.is_dataclass(tp) or is_typeddict(tp) or is_pydantic(tp)
    )


def describe(tp: Any) -> str:
    """A short name for a type, as an error message shows it (``int``, ``list[str]``)."""
    if tp is _NoneType or tp is None:
        return "null"
    if tp is Any:
        return "any JSON value"
    if get_origin(tp) is typing.Annotated:
        return describe(get_args(tp)[0])
    if _is_literal(tp):
        return "one of " + ", ".join(repr(value) for value in get_args(tp))
    if _is_enum(tp):
        return "one of " + ", ".join(repr(member.value) for member in tp)
    if _is_union(tp):
        return " or ".join(describe(arg) for arg in get_args(tp))
    origin = get_origin(tp)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(describe(a) for a in get_args(tp))}]"
    return str(getattr(tp, "__name__", tp))


# ------------------------------------------------------------------ JSON equality


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema's ``enum``/``const`` equality: booleans equal only booleans, numbers
    compare by value (``1 == 1.0``), everything else by type and value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def kind_of(value: Any) -> str:
    """The JSON type of a decoded JSON value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ------------------------------------------------------------------ schemas


def _check_literal(tp: Any) -> list[Any]:
    values = list(get_args(tp))
    for value in values:
        if not (value is None or isinstance(value, str | int | bool)):
            raise TypeError(f"{tp!r}: Literal values must be str, int, bool or None")
    return values


def _check_enum(tp: type[enum.Enum]) -> list[Any]:
    values = [member.value for member in tp]
    if not values:
        raise TypeError(f"{tp.__name__}: an Enum without members")
    for value in values:
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise TypeError(f"{tp.__name__}: Enum values must be str or int, got {value!r}")
    return values


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"enum": values}
    kinds = {_schema_type(value) for value in values}
    if len(kinds) == 1:
        schema = {"type": kinds.pop(), **schema}
    return schema


def _schema_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "string"


def fields_of(cls: type) -> list[tuple[str, Any, bool]]:
    """``(name, type, required)`` of each field of an attrs class, dataclass, TypedDict or
    Pydantic model (its fields by alias, their constraints and description as
    ``Annotated`` metadata)."""
    if is_pydantic(cls):
        return _pydantic_fields(cls)
    if is_typeddict(cls):
        # Required-ness from the hints themselves: ``__required_keys__`` is wrong for
        # a TypedDict written under ``from __future__ import annotations``.
        hints = typing.get_type_hints(cls, include_extras=True)
        total = getattr(cls, "__total__", True)
        out = []
        for name, hint in hints.items():
            required = total
            while get_origin(hint) in _QUALIFIERS:
                if get_origin(hint) is typing.Required:
                    required = True
                elif get_origin(hint) is typing.NotRequired:
                    required = False
                hint = get_args(hint)[0]
            out.append((name, hint, required))
        return out
    if attrs.has(cls):
        attrs.resolve_types(cls)
        return [
            (field.name, field.type, field.default is attrs.NOTHING)
            for field in attrs.fields(cls)
            if field.init
        ]
    hints = typing.get_type_hints(cls, include_extras=True)
    return [
        (
            field.name,
            hints[field.name],
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING,
        )
        for field in dataclasses.fields(cls)
        if field.init
    ]


def _pydantic_fields(cls: Any) -> list[tuple[str, Any, bool]]:
    if getattr(cls, "__pydantic_root_model__", False):
        raise TypeError(
            f"{cls.__name__} is a RootModel: its JSON form is not an object, use its root "
            "type instead"
        )
    out = []
    for name, field in cls.model_fields.items():
        key = field.validation_alias if field.validation_alias is not None else field.alias
        if key is None:
            key = name
        elif not isinstance(key, str):
            raise TypeError(
                f"{cls.__name__}.{name}: a validation alias that is not one name "
                f"({type(key).__name__}) has no JSON Schema form"
            )
        extras = [*field.metadata, *([field.description] if field.description else [])]
        hint = typing.Annotated[(field.annotation, *extras)] if extras else field.annotation
        out.append((key, hint, field.is_required()))
    return out


@functools.cache
def _resolved(tp: type) -> Any:
    """A TypedDict equal to ``tp`` whose required keys are right: cattrs reads
    ``__required_keys__``, which is wrong under ``from __future__ import annotations``
    before Python 3.14; this one is made from ``fields_of``, as the schema is."""
    make: Any = typing.TypedDict
    return make(
        tp.__name__,
        {
            name: (typing.Required if required else typing.NotRequired)[hint]
            for name, hint, required in fields_of(tp)
        },
    )


def object_schema(
    fields: list[tuple[str, Any, bool]],
    descriptions: Mapping[str, str] | None = None,
    seen: tuple[Any, ...] = (),
) -> dict[str, Any]:
    """The schema of a JSON object with these ``(name, type, required)`` members."""
    properties: dict[str, Any] = {}
    for name, tp, _ in fields:
        try:
            schema = _schema(tp, seen)
        except TypeError as exc:
            raise TypeError(f"{name}: {exc}") from None
        description = (descriptions or {}).get(name)
        if description:
            schema = {**schema, "description": description}
        properties[name] = schema
    schema = {"type": "object", "properties": properties}
    required = [name for name, _, is_required in fields if is_required]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def schema_for(tp: Any, *, strict: bool = False) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the JSON values that decode into ``tp``;
    ``strict``: in the strict subset (``strict_schema``), whose root must be an object.

    Raises ``TypeError`` naming the part of ``tp`` that has no JSON form (or no strict
    form).
    """
    schema = _schema(tp, ())
    if not strict:
        return schema
    if schema.get("type") != "object":
        raise TypeError(
            f"{describe(tp)}: a strict schema's root must be an object (an attrs class, "
            "dataclass, TypedDict or Pydantic model)"
        )
    return strict_schema(schema)


def _schema(tp: Any, seen: tuple[Any, ...]) -> dict[str, Any]:
    if get_origin(tp) is typing.Annotated:
        inner, *extras = get_args(tp)
        schema = _schema(inner, seen)
        constraints = _constraints(extras)
        for name, value in constraints:
            schema, applied = _constrain(schema, name, value)
            if not applied:
                raise TypeError(
                    f"{describe(inner)}: the constraint {name}={value!r} applies to none "
                    "of its values"
                )
        notes = [note for note in _flat(extras) if isinstance(note, str)]
        return {**schema, "description": " ".join(notes)} if notes else schema
    if tp is Any:
        return {}
    if tp is None or tp is _NoneType:
        return {"type": "null"}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if _is_literal(tp):
        return _enum_schema(_check_literal(tp))
    if _is_enum(tp):
        return _enum_schema(_check_enum(tp))
    if _is_union(tp):
        return {"anyOf": [_schema(arg, seen) for arg in get_args(tp)]}
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return {"type": "array", "items": _schema(args[0], seen)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _schema(args[0], seen)}
        if args == ((),) or not args:
            return {"type": "array", "maxItems": 0}
        return {
            "type": "array",
            "prefixItems": [_schema(arg, seen) for arg in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"{describe(tp)}: JSON object keys are strings, use dict[str, ...]")
        return {"type": "object", "additionalProperties": _schema(args[1], seen)}
    if _is_class_like(tp):
        if tp in seen:
            raise TypeError(f"{tp.__name__} refers to itself: recursive types are not supported")
        return object_schema(fields_of(tp), None, (*seen, tp))
    if tp in (list, tuple, dict):
        raise TypeError(f"{tp.__name__} needs its item types ({tp.__name__}[...])")
    raise TypeError(f"{describe(tp)} has no JSON Schema form (see scope.tools for the types)")


# ------------------------------------------------------------------ the strict subset

#: Keywords outside the strict subset that the decoder checks itself: a strict schema
#: leaves them out (Anthropic's strict mode refuses them all, OpenAI's some) and says them
#: in the description instead, so the model still reads the bound and a call that breaks
#: it is still refused, as an error result the model can correct.
_CHECKED_ONLY: Final = (
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
)


def strict_schema(schema: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``schema`` (as ``_schema`` makes it) in the strict subset that OpenAI's and
    Anthropic's strict modes accept: every object closed (``additionalProperties:
    false``) with every property required, a property that was optional made nullable
    (``anyOf`` with ``{"type": "null"}``, unless it already accepts null), the
    ``_CHECKED_ONLY`` keywords moved into the description. ``where`` is the path of
    ``schema`` (``address.lines[]``; empty at the root).

    Raises ``TypeError`` naming the path and the keyword for what the subset cannot
    express: an open mapping (``additionalProperties`` with a schema), a fixed-length
    tuple (``prefixItems``), the empty tuple, ``Any`` (a schema with no ``type``).
    """
    at = where or "the root"
    if "anyOf" in schema:
        return {**schema, "anyOf": [strict_schema(member, where) for member in schema["anyOf"]]}
    if "type" not in schema:
        if "enum" in schema:  # a Literal or Enum of mixed JSON types
            return schema
        raise TypeError(
            f'{at}: Any has no strict form (the strict subset needs a "type" for every value)'
        )
    out = dict(schema)
    kind = out["type"]
    if kind == "object":
        extra = out.get("additionalProperties", False)
        if extra is not False:
            raise TypeError(
                f"{at}: additionalProperties: a mapping (dict[str, ...]) has no strict form "
                '(the strict subset needs "additionalProperties": false on every object); '
                "use a class with named fields"
            )
        required = set(out.get("required", ()))
        properties: dict[str, Any] = {}
        for name, member in out.get("properties", {}).items():
            member = strict_schema(member, f"{where}.{name}" if where else name)
            properties[name] = member if name in required or _nullable(member) else _or_null(member)
        out["properties"] = properties
        out["required"] = list(properties)
        out["additionalProperties"] = False
    elif kind == "array":
        if "prefixItems" in out:
            raise TypeError(
                f"{at}: prefixItems: a fixed-length tuple has no strict form; use "
                "tuple[T, ...], list[T] or a class"
            )
        if "items" not in out:
            raise TypeError(f"{at}: maxItems: the empty tuple has no strict form")
        out["items"] = strict_schema(out["items"], f"{where}[]")
    notes = [f"{key} {out.pop(key)!r}" for key in _CHECKED_ONLY if key in out]
    if notes:
        said = f"({', '.join(notes)})"
        out["description"] = f"{out['description']} {said}" if out.get("description") else said
    return out


def _nullable(schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(_nullable(member) for member in schema["anyOf"])
    return schema.get("type") == "null" or None in schema.get("enum", ())


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null; a description stays on the outside."""
    inner = {key: value for key, value in schema.items() if key != "description"}
    out: dict[str, Any] = {"anyOf": [inner, {"type": "null"}]}
    if "description" in schema:
        out["description"] = schema["description"]
    return out


def admits_null(tp: Any) -> bool:
    """Whether ``None`` is a value of ``tp`` (JSON null decodes into it)."""
    if get_origin(tp) is typing.Annotated:
        return admits_null(get_args(tp)[0])
    if tp is Any or tp is None or tp is _NoneType:
        return True
    if _is_union(tp):
        return any(admits_null(arg) for arg in get_args(tp))
    if _is_literal(tp):
        return None in get_args(tp)
    return False


# ------------------------------------------------------------------ constraints

#: The constraints with a JSON Schema form, by the JSON type each applies to.
_KEYWORDS: Final[Mapping[tuple[str, str], str]] = {
    **{
        (name, kind): keyword
        for kind in ("integer", "number")
        for name, keyword in (
            ("gt", "exclusiveMinimum"),
            ("ge", "minimum"),
            ("lt", "exclusiveMaximum"),
            ("le", "maximum"),
            ("multiple_of", "multipleOf"),
        )
    },
    ("min_length", "string"): "minLength",
    ("max_length", "string"): "maxLength",
    ("pattern", "string"): "pattern",
    ("min_length", "array"): "minItems",
    ("max_length", "array"): "maxItems",
    ("min_length", "object"): "minProperties",
    ("max_length", "object"): "maxProperties",
}
_NAMES: Final = frozenset(name for name, _ in _KEYWORDS)
#: Metadata that changes nothing here (the decoder is always strict).
_NEUTRAL: Final = frozenset({"strict"})


def _flat(extras: list[Any]) -> Iterator[Any]:
    """``Annotated`` metadata with grouped metadata (``Interval``, ``Len``) and Pydantic's
    ``FieldInfo`` (its metadata, then its description) opened up."""
    fields = sys.modules.get("pydantic.fields")
    grouped = getattr(sys.modules.get("annotated_types"), "GroupedMetadata", None)
    for extra in extras:
        if fields is not None and isinstance(extra, fields.FieldInfo):
            yield from _flat([*extra.metadata])
            if extra.description:
                yield extra.description
        elif grouped is not None and isinstance(extra, grouped):
            yield from _flat(list(extra))
        else:
            yield extra


def _constraints(extras: list[Any]) -> list[tuple[str, Any]]:
    """The ``(name, value)`` constraints in ``Annotated`` metadata; ``TypeError`` for
    ``annotated_types`` or Pydantic metadata with no JSON Schema form (a predicate, a
    timezone): what the schema cannot say, the decoder must not check."""
    metadata = getattr(sys.modules.get("annotated_types"), "BaseMetadata", None)
    out: list[tuple[str, Any]] = []
    for extra in _flat(extras):
        if metadata is None or not isinstance(extra, metadata):
            continue  # a description, or metadata for another library
        attributes = (
            {field.name: getattr(extra, field.name) for field in dataclasses.fields(extra)}
            if dataclasses.is_dataclass(extra)
            else vars(extra)
        )
        found = {
            key: value
            for key, value in attributes.items()
            if value is not None and not key.startswith("_")
        }
        for key, value in found.items():
            if key in _NEUTRAL:
                continue
            if key not in _NAMES:
                raise TypeError(f"{extra!r} has no JSON Schema form")
            if key == "pattern":
                if not isinstance(value, str):
                    raise TypeError(f"pattern={value!r}: a pattern must be a string")
                re.compile(value)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{key}={value!r}: the bound must be a number")
            out.append((key, value))
        if not found:
            raise TypeError(f"{extra!r} has no JSON Schema form")
    merged: dict[str, Any] = {}
    for key, value in out:
        merged[key] = _stricter(key, merged[key], value) if key in merged else value
    return list(merged.items())


def _constrain(schema: dict[str, Any], name: str, value: Any) -> tuple[dict[str, Any], bool]:
    """``schema`` with the constraint on each alternative it applies to, and whether it
    applied to any."""
    if "anyOf" in schema:
        members = [_constrain(member, name, value) for member in schema["anyOf"]]
        return (
            {**schema, "anyOf": [member for member, _ in members]},
            any(applied for _, applied in members),
        )
    keyword = _KEYWORDS.get((name, schema.get("type", "")))
    if keyword is None:
        return schema, False
    if keyword in schema:  # a bound from a nested Annotated: both hold
        value = _stricter(name, schema[keyword], value)
    return {**schema, keyword: value}, True


def _stricter(name: str, old: Any, new: Any) -> Any:
    """The one bound that means both ``name`` bounds; ``TypeError`` for two different
    patterns or multiples (JSON Schema has one keyword each)."""
    if name in ("gt", "ge", "min_length"):
        return max(old, new)
    if name in ("lt", "le", "max_length"):
        return min(old, new)
    if old != new:
        raise TypeError(f"two {name} constraints ({old!r} and {new!r}): give one")
    return old


def _violation(name: str, bound: Any, value: Any) -> str | None:
    """What is wrong with the JSON value ``value`` under a constraint (``None``: nothing,
    or the constraint does not apply to a value of its JSON type, as in JSON Schema)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if name == "gt" and not value > bound:
            return f"expected a number greater than {bound!r}, got {kind_of(value)}"
        if name == "ge" and not value >= bound:
            return f"expected a number at least {bound!r}, got {kind_of(value)}"
        if name == "lt" and not value < bound:
            return f"expected a number less than {bound!r}, got {kind_of(value)}"
        if name == "le" and not value <= bound:
            return f"expected a number at most {bound!r}, got {kind_of(value)}"
        if name == "multiple_of" and (Fraction(value) / Fraction(bound)).denominator != 1:
            return f"expected a multiple of {bound!r}, got {kind_of(value)}"
        return None
    if isinstance(value, str | list | dict) and name in ("min_length", "max_length"):
        unit = "characters" if isinstance(value, str) else "items"
        if name == "min_length" and len(value) < bound:
            return f"expected at least {bound} {unit}, got {len(value)} {unit}"
        if name == "max_length" and len(value) > bound:
            return f"expected at most {bound} {unit}, got {len(value)} {unit}"
        return None
    if isinstance(value, str) and name == "pattern" and re.search(bound, value) is None:
        return f"expected a string matching {bound!r}, got {kind_of(value)}"
    return None


# ------------------------------------------------------------------ the strict decoder


def _str(value: Any, _: Any) -> str:
    if type(value) is not str:
        raise ArgumentError(f"expected a string, got {kind_of(value)}")
    return value


def _bool(value: Any, _: Any) -> bool:
    if type(value) is not bool:
        raise ArgumentError(f"expected a boolean, got {kind_of(value)}")
    return value


def _int(value: Any, _: Any) -> int:
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    raise ArgumentError(f"expected an integer, got {kind_of(value)}")


def _float(value: Any, _: Any) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise ArgumentError(f"expected a number, got {kind_of(value)}")


def _none(value: Any, _: Any) -> None:
    if value is not None:
        raise ArgumentError(f"expected null, got {kind_of(value)}")


def _any(value: Any, _: Any) -> Any:
    return value


def _choice(tp: Any, values: list[Any], results: list[Any]) -> Callable[[Any, Any], Any]:
    expected = describe(tp)

    def hook(value: Any, _: Any) -> Any:
        for candidate, result in zip(values, results, strict=True):
            if _json_equal(candidate, value):
                return result
        raise ArgumentError(f"expected {expected}, got {kind_of(value)}")

    return hook


@functools.cache
def _enum_hook(tp: type[enum.Enum]) -> Callable[[Any, Any], Any]:
    return _choice(tp, _check_enum(tp), list(tp))


def _or_enum(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``hook``, except for an Enum that is also a str or int (``StrEnum``, ``IntEnum``):
    cattrs dispatches those to the str or int hook, and they decode as their Enum."""

    def structure(value: Any, tp: Any) -> Any:
        if tp is not int and tp is not str and _is_enum(tp):
            return _enum_hook(tp)(value, tp)
        return hook(value, tp)

    return structure


def _needs(kind: type, what: str, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def hook(value: Any, tp: Any) -> Any:
        if type(value) is not kind:
            raise ArgumentError(f"expected {what}, got {kind_of(value)}")
        return inner(value, tp)

    return hook


def _make_converter(*, strict: bool) -> cattrs.Converter:
    """The decoder; ``strict``: objects made from classes need every key (as a strict
    schema requires them all), and a null for an optional field that does not accept
    null is the field left out (its default)."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for tp, hook in (
        (str, _str),
        (bool, _bool),
        (int, _int),
        (float, _float),
        (_NoneType, _none),
    ):
        converter.register_structure_hook(tp, _or_enum(hook))
    converter.register_structure_hook_func(lambda tp: tp is Any, _any)

    def literal(tp: Any) -> Callable[[Any, Any], Any]:
        values = _check_literal(tp)
        return _choice(tp, values, values)

    def enum_(tp: Any) -> Callable[[Any, Any], Any]:
        return _enum_hook(tp)

    def union(tp: Any) -> Callable[[Any, Any], Any]:
        hooks = [(arg, converter.get_structure_hook(arg)) for arg in get_args(tp)]
        expected = describe(tp)

        def hook(value: Any, _: Any) -> Any:
            for arg, member in hooks:
                try:
                    return member(value, arg)
                except Exception:  # this member does not match: try the next one
                    continue
            raise ArgumentError(f"expected {expected}, got {kind_of(value)}")

        return hook

    def array(tp: Any) -> Callable[[Any, Any], Any]:
        origin, args = get_origin(tp), get_args(tp)
        if origin is list:
            return _needs(list, "an array", cattrs.cols.list_structure_factory(tp, converter))
        if len(args) == 2 and args[1] is Ellipsis:
            inner = cattrs.cols.homogenous_tuple_structure_factory(tp, converter)
            return _needs(list, "an array", inner)
        size = 0 if args == ((),) else len(args)
        items = [(arg, converter.get_structure_hook(arg)) for arg in args[:size]]

        def hook(value: Any, _: Any) -> tuple[Any, ...]:
            if type(value) is not list:
                raise ArgumentError(f"expected an array of {size} items, got {kind_of(value)}")
            if len(value) != size:
                raise ArgumentError(f"expected an array of {size} items, got {len(value)} items")
            out, errors = [], []
            for index, ((arg, member), item) in enumerate(zip(items, value, strict=True)):
                try:
                    out.append(member(item, arg))
                except Exception as exc:  # collected below, each with its index
                    exc.__notes__ = [*getattr(exc, "__notes__", []), _index_note(index, arg)]
                    errors.append(exc)
            if errors:
                raise cattrs.IterableValidationError("invalid items", errors, tp)
            return tuple(out)

        return hook

    def mapping(tp: Any) -> Callable[[Any, Any], Any]:
        inner = cattrs.cols.mapping_structure_factory(tp, converter)
        return _needs(dict, "an object", inner)

    def constrained(tp: Any) -> Callable[[Any, Any], Any]:
        inner, *extras = get_args(tp)
        constraints = _constraints(extras)
        member = converter.get_structure_hook(inner)

        def hook(value: Any, _: Any) -> Any:
            result = member(value, inner)
            for name, bound in constraints:
                problem = _violation(name, bound, value)
                if problem is not None:
                    raise ArgumentError(problem)
            return result

        return hook

    def record(tp: Any) -> Callable[[Any, Any], Any]:
        hook = _record(tp)
        return _every_key(tp, hook) if strict else hook

    def _record(tp: Any) -> Callable[[Any, Any], Any]:
        if is_pydantic(tp):
            return _needs(dict, "an object", _model_hook(tp, converter))
        if is_typeddict(tp):
            inner = cattrs.gen.typeddicts.make_dict_structure_fn(_resolved(tp), converter)
        else:
            # cattrs drops ``Annotated`` from a dataclass's string annotations (``from
            # __future__ import annotations``): constrained fields get their hooks here.
            overrides = {
                name: cattrs.gen.override(struct_hook=converter.get_structure_hook(hint))
                for name, hint, _ in fields_of(tp)
                if _is_constrained(hint)
            }
            # (Field overrides are keyword arguments beside cattrs' own options.)
            make: Callable[..., Callable[[Any, Any], Any]] = cattrs.gen.make_dict_structure_fn
            inner = make(tp, converter, **overrides)
        return _needs(dict, "an object", inner)

    converter.register_structure_hook_factory(_is_literal, literal)
    converter.register_structure_hook_factory(_is_enum, enum_)
    converter.register_structure_hook_factory(_is_union, union)
    converter.register_structure_hook_factory(_is_array, array)
    converter.register_structure_hook_factory(_is_mapping, mapping)
    converter.register_structure_hook_factory(_is_class_like, record)
    converter.register_structure_hook_factory(_is_constrained, constrained)
    converter.register_unstructure_hook_func(is_pydantic, _dump)
    return converter


def _every_key(tp: Any, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``inner`` (an object's hook) under a strict schema: every field's key must be
    there, and a null for an optional field whose type does not accept null leaves the
    field out (its default, or no key in a ``TypedDict``)."""
    fields = fields_of(tp)
    names = [name for name, _, _ in fields]
    nulled = frozenset(
        name for name, hint, required in fields if not required and not admits_null(hint)
    )

    def hook(value: Any, _: Any) -> Any:
        if type(value) is not dict:
            raise ArgumentError(f"expected an object, got {kind_of(value)}")
        missing = [name for name in names if name not in value]
        if missing:
            problems: list[Exception] = []
            for name in missing:
                problem = KeyError(name)
                problem.__notes__ = [
                    cattrs.AttributeValidationNote(f"Structuring {name}", name, tp)
                ]
                problems.append(problem)
            raise cattrs.ClassValidationError(f"invalid {describe(tp)}", problems, tp)
        if nulled:
            value = {
                key: item for key, item in value.items() if item is not None or key not in nulled
            }
        return inner(value, tp)

    return hook


def _is_constrained(tp: Any) -> bool:
    if get_origin(tp) is not typing.Annotated:
        return False
    try:
        return bool(_constraints(list(get_args(tp)[1:])))
    except TypeError:  # refused when the schema was made: never decoded
        return False


def _model_hook(tp: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """A Pydantic model's hook: its fields through the strict hooks (a TypedDict of its
    fields by alias), then the model's own validation (validators, constraints); each
    error the model reports keeps its path."""
    fields = cattrs.gen.typeddicts.make_dict_structure_fn(_resolved(tp), converter)

    def hook(value: Any, _: Any) -> Any:
        from pydantic import ValidationError  # imported already: tp is a Pydantic model

        decoded = fields(value, tp)
        try:
            return tp.model_validate(decoded)
        except ValidationError as exc:
            problems: list[Exception] = []
            for error in exc.errors(include_url=False):
                problem = ArgumentError(error["msg"])
                if error["loc"]:  # a field's path; none for the model's own validators
                    path = "".join(
                        f"[{part}]" if isinstance(part, int) else f".{part}"
                        for part in error["loc"]
                    )
                    note = cattrs.AttributeValidationNote(f"Structuring {path}", path[1:], tp)
                    problem.__notes__ = [note]
                problems.append(problem)
            raise cattrs.ClassValidationError(f"invalid {tp.__name__}", problems, tp) from None

    return hook


def _dump(value: Any) -> Any:
    """A Pydantic model instance as JSON-ready Python, by alias (as it decodes)."""
    return value.model_dump(mode="json", by_alias=True)


def _index_note(index: int, tp: Any) -> cattrs.IterableValidationNote:
    return cattrs.IterableValidationNote(f"Structuring {tp!r} @ index {index}", index, tp)


_converter: Final = _make_converter(strict=False)
_strict_converter: Final = _make_converter(strict=True)


def _format(exc: BaseException, tp: Any) -> str:
    if isinstance(exc, ArgumentError):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {sorted(exc.extra_fields)} (not in the schema)"
    return cattrs.v.format_exception(exc, tp)


def structure(value: Any, tp: Any, *, strict: bool = False) -> Any:
    """Decode a JSON value (as ``json.loads`` gives it) into ``tp``; ``strict``: as
    ``schema_for(tp, strict=True)`` says (every key of an object made from a class
    present, null for an optional field that does not accept null is its default).

    Raises ``ArgumentError`` whose message lists every problem with its path
    (``$.city: expected a string, got the number 3``).
    """
    try:
        return (_strict_converter if strict else _converter).structure(value, tp)
    except ArgumentError as exc:
        raise ArgumentError(f"$: {exc}") from None
    except cattrs.BaseValidationError as exc:
        problems = cattrs.transform_error(exc, path="$", format_exception=_format)
        raise ArgumentError("; ".join(_swap(problem) for problem in problems)) from None
    except (TypeError, ValueError) as exc:  # a class's own validator refused the value
        raise ArgumentError(f"$: {exc}") from None


def _swap(problem: str) -> str:
    """cattrs writes ``message @ $.path``; put the path first (``$.path: message``)."""
    message, at, path = problem.rpartition(" @ ")
    return f"{path}: {message}" if at else problem


def unstructure(value: Any) -> Any:
    """A tool's return value as plain JSON-ready Python (attrs classes and dataclasses as
    dicts, enums as their values, tuples as lists)."""
    return _converter.unstructure(value)
