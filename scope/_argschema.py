"""JSON Schemas from Python types, and the strict decoder that accepts exactly what each
schema accepts: the machinery under ``scope.tools`` (tool arguments) and
``scope.conversation`` (structured answers).

The families (DESIGN §6f): ``str``, ``int``, ``float``, ``bool``, ``None``, ``Literal``,
``Enum``, ``list``/``tuple``/``dict``, unions and optionals, attrs classes, dataclasses,
``TypedDict`` (and ``Any``, ``Annotated[T, "description"]``). Anything else is refused
when the schema is built (``TypeError`` naming the type), never when a model calls.

Decoding runs on a dedicated ``cattrs.Converter`` with strict hooks: cattrs is lenient by
default (``"1"`` becomes ``1``, a string is an iterable of characters), and a tool's
arguments must be refused exactly where the schema refuses them. The rules follow JSON
Schema (draft 2020-12) as validators implement it: an ``integer`` is a number with no
fractional part (``2.0`` is accepted and becomes ``2``), a ``number`` accepts integers
(made floats), booleans are never numbers, ``enum`` compares numbers by value and
booleans only with booleans. Objects built from classes refuse unknown keys
(``additionalProperties: false``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Union, get_args, get_origin

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
import cattrs.gen.typeddicts
import cattrs.v

__all__ = [
    "ArgumentError",
    "describe",
    "fields_of",
    "is_typeddict",
    "kind_of",
    "object_schema",
    "schema_for",
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


def _is_class_like(tp: object) -> bool:
    return isinstance(tp, type) and (
        attrs.has(tp) or dataclasses.is_dataclass(tp) or is_typeddict(tp)
    )


def describe(tp: Any) -> str:
    """A short name for a type, as an error message shows it (``int``, ``list[str]``)."""
    if tp is _NoneType or tp is None:
        return "null"
    if tp is Any:
        return "any JSON value"
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
    """``(name, type, required)`` of each field of an attrs class, dataclass or TypedDict."""
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


def schema_for(tp: Any) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the JSON values that decode into ``tp``.

    Raises ``TypeError`` naming the part of ``tp`` that has no JSON form.
    """
    return _schema(tp, ())


def _schema(tp: Any, seen: tuple[Any, ...]) -> dict[str, Any]:
    if get_origin(tp) is typing.Annotated:
        inner, *extras = get_args(tp)
        schema = _schema(inner, seen)
        notes = [extra for extra in extras if isinstance(extra, str)]
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


def _make_converter() -> cattrs.Converter:
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

    def record(tp: Any) -> Callable[[Any, Any], Any]:
        if is_typeddict(tp):
            inner = cattrs.gen.typeddicts.make_dict_structure_fn(_resolved(tp), converter)
        else:
            inner = cattrs.gen.make_dict_structure_fn(tp, converter)
        return _needs(dict, "an object", inner)

    converter.register_structure_hook_factory(_is_literal, literal)
    converter.register_structure_hook_factory(_is_enum, enum_)
    converter.register_structure_hook_factory(_is_union, union)
    converter.register_structure_hook_factory(_is_array, array)
    converter.register_structure_hook_factory(_is_mapping, mapping)
    converter.register_structure_hook_factory(_is_class_like, record)
    return converter


def _index_note(index: int, tp: Any) -> cattrs.IterableValidationNote:
    return cattrs.IterableValidationNote(f"Structuring {tp!r} @ index {index}", index, tp)


_converter: Final = _make_converter()


def _format(exc: BaseException, tp: Any) -> str:
    if isinstance(exc, ArgumentError):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {sorted(exc.extra_fields)} (not in the schema)"
    return cattrs.v.format_exception(exc, tp)


def structure(value: Any, tp: Any) -> Any:
    """Decode a JSON value (as ``json.loads`` gives it) into ``tp``.

    Raises ``ArgumentError`` whose message lists every problem with its path
    (``$.city: expected a string, got the number 3``).
    """
    try:
        return _converter.structure(value, tp)
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
