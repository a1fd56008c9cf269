"""Decoding: from a parsed tree (``scope._json.parse_exact_fast``) or Python builtins
into values, strictly (no coercion, unknown keys refused, every value validated).

Leaf structurers are closures over the error they raise; each attrs class gets one
generated function (``structure_<Class>``, see ``_generated``) that reads its fields,
inlining the common cases, then assembles the value and validates it (see
``_make_class_in``).
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import enum
import math
import threading
import types
import typing
from collections.abc import Callable
from typing import Any, Final

import attrs

from scope._codec._errors import ERRORS, PLAIN, Fail, Key, decode_error_for, expected
from scope._codec._generated import NAMESPACE, constant, define, hook_name
from scope._json import Num, canonical, parse_plain_unchecked
from scope.errors import InvalidJSONError, InvalidMetadataError, ScopeError
from scope.jsonvalue import RawJSON
from scope.media import Source
from scope.metadata import Metadata

__all__ = [
    "CLASS_IN",
    "FROM_BUILTINS",
    "NotCanonical",
    "Structurer",
    "register",
    "register_own",
    "strict_in",
    "top_in",
    "wire_name",
]

Structurer = Callable[[Any], Any]

#: True while from_builtins runs: Python objects may hold NaN/Infinity, which orjson
#: would silently write as null. Parsed trees cannot (both readers refuse them).
FROM_BUILTINS: Final = contextvars.ContextVar("scope_codec_from_builtins", default=False)

#: JSON names that differ from the attribute names.
WIRE_NAMES: Final[dict[tuple[type, str], str]] = {(Source, "data"): "bytes"}


def wire_name(cls: type, field: attrs.Attribute[Any]) -> str:
    """The JSON member name of a field."""
    return WIRE_NAMES.get((cls, field.name), field.name)


# ---------------------------------------------------------------- leaf structurers


def _exact_in(kind: type, what: str) -> Callable[[type[Exception]], Structurer]:
    """Structurers of a JSON type read as it is (``str``, ``bool``)."""

    def make(error: type[Exception]) -> Structurer:
        def structure(value: Any) -> Any:
            if type(value) is not kind:
                raise expected(what, value, error)
            return value

        return structure

    return make


def _int_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> int:
        kind = type(value)
        if kind is int:
            return value  # type: ignore[no-any-return]
        if kind is Num:
            if "." in value or "e" in value or "E" in value:
                raise Fail(f"expected an integer, got {value}", error)
            if len(value) > 20:  # longer than any 64-bit integer; int() would be slow
                raise Fail(f"integer {value[:20]}... does not fit in 64 bits", error)
            return int(value)
        raise expected("an integer", value, error)

    return structure


def _float_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> float:
        kind = type(value)
        if kind is float:
            return value  # type: ignore[no-any-return]
        if kind is int:
            try:
                return float(value)
            except OverflowError:  # from_builtins: a Python int beyond any float
                raise Fail(f"number {value} is out of range", error) from None
        if kind is Num:
            result = float(value)
            if math.isinf(result):
                raise Fail(f"number {value} is out of range", error)
            return result
        raise expected("a number", value, error)

    return structure


def _bytes_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> bytes:
        if type(value) is not str:
            raise expected("a base64 string", value, error)
        try:
            # base64.b64decode(value, validate=True) without its copy of the str:
            # a2b_base64 reads an ASCII str itself (ValueError for any other str).
            data = binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError):
            raise Fail("invalid base64 (standard alphabet, padded)", error) from None
        # validate=True already refused stray characters and bad padding; what remains
        # non-canonical is non-zero unused bits in the last, padded group.
        tail = len(data) % 3
        if tail and base64.b64encode(data[-tail:]).decode("ascii") != value[-4:]:
            raise Fail("non-canonical base64 (unused bits set in the last group)", error)
        return data

    return structure


def _raw_json_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> RawJSON:
        # canonical() enforces the depth limit relative to this value.
        try:
            return RawJSON.from_canonical(canonical(value, check_floats=FROM_BUILTINS.get()))
        except (ValueError, TypeError) as exc:
            raise Fail(f"invalid JSON value: {exc}", error) from None

    return structure


def _metadata_in(cls: type[Metadata], error: type[Exception]) -> Structurer:
    """Each key checked (``cls._check_key``), each value a RawJSON (``_raw_json_in``).

    Inlined, for the commonest entries: a non-empty ASCII ``str`` key is one that
    ``Metadata._check_key`` accepts (a class with its own key rule always runs it), and
    a ``Num`` token's canonical bytes are its spelling (what ``canonical`` writes for
    it). The value is assembled as ``cls._trusted`` would, through the slot setters.
    """
    raw = _raw_json_in(InvalidMetadataError)
    check_key = cls._check_key
    # The rule the class has, inherited or its own (Extensions adds to Metadata's).
    plain_keys = getattr(check_key, "__func__", None) is Metadata.__dict__["_check_key"].__func__
    set_raw = RawJSON.__dict__["_raw_json_bytes"].__set__
    set_data, set_hash, set_json = (
        Metadata.__dict__[name].__set__ for name in ("_data", "_hash", "_json")
    )
    new = object.__new__

    def structure(value: Any) -> Metadata:
        if type(value) is not dict:
            raise expected("an object", value, error)
        data: dict[str, RawJSON] = {}
        for key, item in value.items():
            try:
                if not (plain_keys and type(key) is str and key and key.isascii()):
                    check_key(key)
                if type(item) is Num:
                    data[key] = entry = new(RawJSON)
                    set_raw(entry, item.encode())
                else:
                    data[key] = raw(item)
            except Fail as fail:
                raise fail.at(Key(key)) from None
            except InvalidMetadataError as exc:
                raise Fail(str(exc), InvalidMetadataError, exc).at(Key(key)) from None
        metadata: Metadata = new(cls)
        set_data(metadata, data)
        set_hash(metadata, None)
        set_json(metadata, None)
        return metadata

    return structure


def _enum_in(cls: type[enum.Enum], error: type[Exception]) -> Structurer:
    members = {member.value: member for member in cls}
    allowed = ", ".join(repr(v) for v in members)

    def structure(value: Any) -> enum.Enum:
        if type(value) is not str:
            raise expected("a string", value, error)
        member = members.get(value)
        if member is None:
            raise Fail(f"must be one of {allowed}, got {value!r}", error)
        return member

    return structure


def _tuple_in(item: Structurer, error: type[Exception]) -> Structurer:
    def structure(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise expected("an array", value, error)
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except Fail as fail:
                raise fail.at(index) from None
        return tuple(out)

    return structure


def _list_in(item: Structurer, error: type[Exception]) -> Structurer:
    as_tuple = _tuple_in(item, error)

    def structure(value: Any) -> list[Any]:
        return list(as_tuple(value))

    return structure


def _optional_in(inner: Structurer) -> Structurer:
    def structure(value: Any) -> Any:
        return None if value is None else inner(value)

    return structure


def _classes_in(
    cls: type, error: type[Exception], container: type[list[Any]] | type[tuple[Any, ...]]
) -> Structurer:
    """The structurer of an array of ``cls`` values (a list or tuple of them): one
    comprehension of ``_dispatch`` calls; on a failure the element loop (``_tuple_in``)
    runs again to name the index of the bad element, which fails the same way."""
    loop = _tuple_in(_class_in(cls), error)
    name = f"{container.__name__}_of_{error.__name__}"  # one function per pair
    make = constant("structure", cls, name, tuple) if container is tuple else ""
    bad = constant("structure", cls, f"{name}_error", error)
    again = constant("structure", cls, f"{name}_loop", loop)
    return define(
        "structure",
        cls,
        [
            "    if type(value) is not list:",
            f"        raise expected('an array', value, {bad})",
            "    try:",
            f"        return {make}([{_dispatch(cls, 'e')} for e in value])",
            "    except Fail:",
            f"        {again}(value)",
            "        raise",  # pragma: no cover - the loop fails the same way
        ],
        name,
    )


#: The structurer of every registered class (generated, or the class's own).
CLASS_IN: Final[dict[type, Structurer]] = {}


def _class_in(cls: type) -> Structurer:
    """The structurer of a registered class, looked up when it runs (classes nest)."""
    name = hook_name("structure", cls)

    def structure(value: Any) -> Any:
        return NAMESPACE[name](value)

    return structure


def _optional_type(hint: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {hint!r}")
        return args[0]
    return None


def structurer_for(hint: Any, error: type[Exception]) -> Structurer:
    """The structurer of one field (or top-level) type."""
    optional = _optional_type(hint)
    if optional is not None:
        return _optional_in(structurer_for(optional, error))
    origin = typing.get_origin(hint)
    if origin is tuple:
        item_type, _ellipsis = typing.get_args(hint)
        if attrs.has(item_type):
            return _classes_in(item_type, error, tuple)
        return _tuple_in(structurer_for(item_type, error), error)
    if origin is list:
        (item_type,) = typing.get_args(hint)
        if attrs.has(item_type):
            return _classes_in(item_type, error, list)
        return _list_in(structurer_for(item_type, error), error)
    leaf = _LEAVES.get(hint)
    if leaf is not None:
        return leaf(error)
    if isinstance(hint, type) and issubclass(hint, Metadata):
        return _metadata_in(hint, error)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_in(hint, error)
    if attrs.has(hint):
        return _class_in(hint)
    raise TypeError(f"no structurer for {hint!r}")


_LEAVES: Final[dict[Any, Callable[[type[Exception]], Structurer]]] = {
    str: _exact_in(str, "a string"),
    bool: _exact_in(bool, "a boolean"),
    int: _int_in,
    float: _float_in,
    bytes: _bytes_in,
    RawJSON: _raw_json_in,
}


# ---------------------------------------------------------------- generated class structurers

NAMESPACE.update(
    Fail=Fail, ScopeError=ScopeError, expected=expected, MISSING=object(), new=object.__new__
)


def _dispatch(cls: type, var: str, strict: bool = False) -> str:
    """The expression that structures ``var`` as ``cls``: the structurer of its key
    layout when one was learned (``_make_class_in``), called directly, else the class's
    structurer (which checks it is an object, reads it and learns its layout). It returns
    and raises what ``structure_<Class>(var)`` would, one call shorter.

    ``strict``: the same through the class's strict structurers (``strict_<Class>`` and
    its layouts), which also raise ``Fail`` (of ``NotCanonical``) for a value whose
    encoding would differ from the tree (see ``_make_class_in``)."""
    name = hook_name("structure", cls)
    if strict:
        generic = hook_name("strict", cls)
        return (
            f"(_{name}_strict.get(tuple({var})) or {generic})({var}) "
            f"if type({var}) is dict else {generic}({var})"
        )
    return (
        f"(_{name}_shapes.get(tuple({var})) or {name})({var}) "
        f"if type({var}) is dict else {name}({var})"
    )


def _guarded(indent: str, body: list[str], wire: str) -> list[str]:
    """``body`` with a failure inside it prefixed with the field's name in the path."""
    return [
        f"{indent}try:",
        *(f"{indent}    {line}" for line in body),
        f"{indent}except Fail as fail:",
        f"{indent}    raise fail.at({wire!r}) from None",
    ]


def _field_lines(
    cls: type,
    index: int,
    field: attrs.Attribute[Any],
    error: str,
    indent: str,
    strict: bool = False,
) -> list[str]:
    """The lines that read field ``index`` (JSON value ``v``) into ``f<index>``; with
    ``strict``, nested values of attrs classes through their strict structurers."""

    def const(what: str, value: Any) -> str:
        return constant("structure", cls, f"{what}{index}", value)

    wire, hint, local = wire_name(cls, field), field.type, f"f{index}"
    fn = const("s", structurer_for(hint, ERRORS[cls]))
    optional = _optional_type(hint)
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else None
    if hint is str:  # inlined: the commonest field type
        return [
            f"{indent}if type(v) is not str:",
            f"{indent}    raise expected('a string', v, {error}).at({wire!r})",
            f"{indent}{local} = v",
        ]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        # Inlined: a dict lookup; the structurer only runs to report a bad value.
        members = const("m", {member.value: member for member in hint})
        return [
            f"{indent}{local} = {members}.get(v) if type(v) is str else None",
            f"{indent}if {local} is None:",
            *_guarded(indent + "    ", [f"{fn}(v)"], wire),
        ]
    if optional is not None and attrs.has(optional):  # inlined: a part's media, say
        read = _dispatch(optional, "v", strict)
        return _guarded(indent, [f"{local} = None if v is None else {read}"], wire)
    if item is not None and attrs.has(item):
        # Inlined: a list comprehension (one element, the commonest: read as it is,
        # without the comprehension's frame); on failure the loop structurer re-runs
        # to name the index of the bad element.
        return [
            f"{indent}try:",
            f"{indent}    if type(v) is not list:",
            f"{indent}        raise Fail('', {error})",
            f"{indent}    if len(v) == 1:",
            f"{indent}        e = v[0]",
            f"{indent}        {local} = ({_dispatch(item, 'e', strict)},)",
            f"{indent}    else:",
            f"{indent}        {local} = tuple([{_dispatch(item, 'e', strict)} for e in v])",
            f"{indent}except Fail:",
            *_guarded(indent + "    ", [f"{fn}(v)"], wire),
            f"{indent}    raise",  # pragma: no cover - the loop fails the same way
        ]
    # Inlined: a tool result's output, a media's source.
    if isinstance(hint, type) and attrs.has(hint):
        return _guarded(indent, [f"{local} = {_dispatch(hint, 'v', strict)}"], wire)
    return _guarded(indent, [f"{local} = {fn}(v)"], wire)


def _unknown_field(cls: type, error: type[Exception]) -> Callable[[dict[str, Any]], Fail]:
    names = {wire_name(cls, f) for f in attrs.fields(cls) if f.init}

    def unknown(value: dict[str, Any]) -> Fail:
        name = sorted(set(value) - names)[0]
        return Fail(f"unknown field {name!r} in {cls.__name__}", error).at(name)

    return unknown


def _missing_field(cls: type, error: type[Exception]) -> Callable[[str], Fail]:
    def missing(name: str) -> Fail:
        return Fail(f"missing required field {name!r} of {cls.__name__}", error).at(name)

    return missing


#: How many key layouts of one class get a structurer of their own (``_make_class_in``);
#: objects of any other layout take the generic one.
_SHAPES: Final = 32
_LEARNING: Final = threading.Lock()


def _make_class_in(cls: type) -> Structurer:
    """Generate ``structure_<Class>``: check the object's keys, read every field (its
    default when absent), then assemble the value and ``validate()`` it.

    The value is assembled without ``__init__``, by ``_builder(cls)``: an instance of
    the builder, each slot written by plain assignment, then its class set to ``cls``.
    That is what ``__init__`` would build, because every converter is a no-op on what
    the field structurers produce, and runs the same checks, because every
    ``__attrs_post_init__`` is ``validate()`` (tests/chat/test_codec_generated.py pins both).
    Measured building the standard turn of benchmarks/bench_codec.py from a parsed tree
    (best of 150 rounds, shared 2-core box, CPython 3.11): through ``__init__`` 124 µs,
    ``object.__setattr__`` per slot 115 µs, the member descriptors' ``__set__`` 105 µs.
    Assigning through the builder costs about a third of the descriptor calls per
    object (one Part: 0.51 µs with the descriptors, 0.18 µs through the builder).
    """

    def const(what: str, value: Any) -> str:
        return constant("structure", cls, what, value)

    error = const("error", ERRORS[cls])
    allowed = const("allowed", frozenset(wire_name(cls, f) for f in attrs.fields(cls) if f.init))
    shapes: dict[tuple[Any, ...], Structurer] = {}
    body = [
        "    if type(value) is not dict:",
        f"        raise expected('an object ({cls.__name__})', value, {error})",
        f"    shaped = {const('shapes', shapes)}.get(tuple(value))",
        "    if shaped is not None:",
        "        return shaped(value)",
        f"    if not {allowed}.issuperset(value):",
        f"        raise {const('unknown', _unknown_field(cls, ERRORS[cls]))}(value)",
        "    get = value.get",
    ]
    fields = list(enumerate(attrs.fields(cls)))
    for index, field in fields:
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()  # values are immutable: one shared default
        if default is not attrs.NOTHING:
            const(f"d{index}", default)
        if not field.init:
            continue
        wire = wire_name(cls, field)
        body.append(f"    v = get({wire!r}, MISSING)")
        if default is attrs.NOTHING:
            missing = const("missing", _missing_field(cls, ERRORS[cls]))
            body += ["    if v is MISSING:", f"        raise {missing}({wire!r})"]
            indent = "    "
        else:
            body += [
                "    if v is MISSING:",
                f"        f{index} = _structure_{cls.__name__}_d{index}",
                "    else:",
            ]
            indent = "        "
        body += _field_lines(cls, index, field, error, indent)
    builder, final = const("builder", _builder(cls)), const("cls", cls)

    def assemble(absent: frozenset[int] = frozenset()) -> list[str]:
        """The lines that assemble the value from the locals ``f<index>``, the fields
        numbered in ``absent`` (and those not in ``__init__``) from their defaults."""
        lines = [f"    obj = new({builder})"]
        for index, field in fields:
            value = (
                f"f{index}"
                if field.init and index not in absent
                else f"_structure_{cls.__name__}_d{index}"
            )
            lines.append(f"    obj.{field.name} = {value}")
        return [*lines, f"    obj.__class__ = {final}"]

    validate = [
        "    try:",
        "        obj.validate()",
        "    except ScopeError as exc:",
        "        raise Fail(str(exc), type(exc), exc) from None",
    ]
    finish = [*assemble(), *validate]

    def learn(keys: tuple[Any, ...]) -> None:
        """Generate the structurer of objects with exactly ``keys`` (in that order), a
        key set the generic structurer just accepted: the same field lines and checks
        in the same order, each member read with ``value[name]``, the absent ones at
        their defaults, so it returns and raises what the generic one would."""
        if len(shapes) >= _SHAPES or keys in shapes:
            return
        with _LEARNING:  # decoding may run on any thread: one name per function
            if len(shapes) < _SHAPES and keys not in shapes:
                shapes[keys] = _shape(keys)

    def _shape(keys: tuple[Any, ...]) -> Structurer:
        present = set(keys)
        lines: list[str] = []
        absent: set[int] = set()
        for index, field in fields:
            if not field.init:
                continue
            wire = wire_name(cls, field)
            if wire in present:
                lines.append(f"    v = value[{wire!r}]")
                lines += _field_lines(cls, index, field, error, "    ")
            else:
                absent.add(index)  # assembled from its default
        lines += [*assemble(frozenset(absent)), *validate, "    return obj"]
        return define("structure", cls, lines, f"shape{len(shapes)}")

    strict: dict[tuple[Any, ...], Structurer] = {}
    const("strict", strict)

    def learn_strict(keys: tuple[Any, ...]) -> None:
        """Generate the strict structurer of objects with exactly ``keys`` (a layout
        ``strict_<Class>`` just accepted), as ``learn`` does."""
        if len(strict) >= _SHAPES or keys in strict:
            return
        with _LEARNING:
            if len(strict) < _SHAPES and keys not in strict:
                strict[keys] = _strict_shape(keys)

    def _strict_shape(keys: tuple[Any, ...]) -> Structurer:
        """The layout's structurer (``_shape``) with the canonical rule of every present
        member checked where it is read (``_canonical.field_rule``), nested values of
        attrs classes through their strict structurers (which check their own)."""
        from scope._codec._canonical import field_rule  # it imports this module
        from scope._codec._proven import proof  # it imports scope.chat

        present = set(keys)
        lines: list[str] = []
        absent: set[int] = set()
        for index, field in fields:
            if not field.init:
                continue
            wire = wire_name(cls, field)
            written, check = field_rule(cls, index, field)
            if wire not in present:
                absent.add(index)  # assembled from its default
                if written is None:  # written even at its default: the tree lacks it
                    lines.append("    raise NOT_CANONICAL()")
                continue
            lines.append(f"    v = value[{wire!r}]")
            lines += _field_lines(cls, index, field, error, "    ", strict=True)
            if _strict_inlined(field.type):
                check = None  # the strict structurers checked the nested values
            for rule in (written, check):
                if rule is not None:
                    lines += [f"    if not ({rule}):", "        raise NOT_CANONICAL()"]
        # validate() only where the layout does not already prove it passes (_proven).
        proven = proof(cls, {f.name for f in attrs.fields(cls) if wire_name(cls, f) in present})
        lines += assemble(frozenset(absent))
        if proven is not None:
            lines += [f"    if not ({proven}):", *(f"    {line}" for line in validate)]
        else:
            lines += validate
        return define("strict", cls, [*lines, "    return obj"], f"shape{len(strict)}")

    strict_body = [
        f"    obj = {hook_name('structure', cls)}(value)",
        f"    if not {hook_name('canonical', cls)}(value):",
        "        raise NOT_CANONICAL()",
        f"    {const('learn_strict', learn_strict)}(tuple(value))",
        "    return obj",
    ]
    made: list[Structurer] = []

    def first_strict(value: Any) -> Any:
        """Stands in for ``strict_<Class>`` until its first call generates it (most
        classes never reach a stored record: no compile at import); a caller that kept
        this function goes on calling the generated one."""
        if not made:
            with _LEARNING:
                if not made:
                    made.append(define("strict", cls, strict_body))
        return made[0](value)

    NAMESPACE[hook_name("strict", cls)] = first_strict
    return define(
        "structure",
        cls,
        [*body, *finish, f"    {const('learn', learn)}(tuple(value))", "    return obj"],
    )


def _builder(cls: type) -> type:
    """The class the generated structurers of ``cls`` assemble a value in: a subclass
    that adds nothing to its layout (no slots, so the same memory layout, which lets an
    instance's class be set to ``cls``) and writes its slots by plain assignment (the
    frozen class's ``__setattr__``/``__delattr__`` refuse it; with ``object``'s, CPython
    stores to a slot without a call). A structurer sets the class to ``cls`` as soon as
    every slot is written, before anything can see the object, so no value of this
    class escapes.

    Checked here on a fresh instance: a class whose instances cannot change class this
    way raises ``TypeError`` at registration."""
    if not all(hasattr(cls.__dict__.get(f.name), "__set__") for f in attrs.fields(cls)):
        raise TypeError(f"scope.codec: {cls.__name__} must be a slotted attrs class")
    namespace = {
        "__slots__": (),
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        "__module__": __name__,
        "__qualname__": f"_builder.<{cls.__qualname__}>",
    }
    builder = type(cls.__name__, (cls,), namespace)
    probe: Any = object.__new__(builder)
    probe.__class__ = cls
    return builder


def _strict_inlined(hint: Any) -> bool:
    """Whether ``_field_lines`` reads a field of this type through strict structurers:
    an attrs value, optional or not, or a tuple of them."""
    optional = _optional_type(hint)
    if optional is not None:
        return attrs.has(optional)
    if attrs.has(hint):
        return True
    return typing.get_origin(hint) is tuple and attrs.has(typing.get_args(hint)[0])


class NotCanonical(Exception):
    """The error of the ``Fail`` a strict structurer raises for a value whose encoding
    would differ from the tree it was read from (never raised out of the codec)."""


def _not_canonical() -> Fail:
    return Fail("not in the canonical encoding", NotCanonical)


NAMESPACE["NOT_CANONICAL"] = _not_canonical


def strict_in(cls: type) -> Structurer:
    """The strict structurer of a registered class: ``structure_<Class>``'s value, or
    ``Fail`` (of ``NotCanonical`` when the structurer accepted the tree but the value
    would encode otherwise). Only for trees from ``orjson.loads`` whose ``orjson.dumps``
    (keys sorted) gives back the input: the rules of ``_canonical`` assume that."""
    found: Structurer = NAMESPACE[hook_name("strict", cls)]
    return found


def register(cls: type) -> None:
    """Generate the structurer of an attrs value class (its error is in ``ERRORS``)."""
    CLASS_IN[cls] = _make_class_in(cls)


def register_own(cls: type, error: type[Exception], from_tree: Callable[[Any], Any]) -> None:
    """Register a class that decodes itself: ``from_tree`` raises ``error`` for bad input,
    whose message already names the path inside the value."""

    def structure(value: Any) -> Any:
        try:
            return from_tree(value)
        except ScopeError as exc:
            if type(exc) is not error:
                raise
            # The value's own message already names the path inside it; its cause (the
            # nested error, if any) stays the cause.
            raise Fail(str(exc), error, exc.__cause__) from None

    def strict(value: Any) -> Any:
        raise _not_canonical()  # no canonical rule known: the caller takes its exact path

    ERRORS[cls] = error
    CLASS_IN[cls] = NAMESPACE[hook_name("structure", cls)] = structure
    NAMESPACE[hook_name("strict", cls)] = strict
    constant("structure", cls, "shapes", {})  # no layouts: ``_dispatch`` calls ``structure``
    constant("structure", cls, "strict", {})


# ---------------------------------------------------------------- top-level targets


def _plain_in(kind: type | None) -> Structurer:
    """Decode into plain JSON types (dicts, lists, str, int, float, bool, None): a fresh
    tree, numbers as Python numbers; ``kind`` is the JSON type the top must have."""

    def structure(value: Any) -> Any:
        if kind is not None and type(value) is not kind:
            raise expected("an object" if kind is dict else "an array", value, InvalidJSONError)
        try:
            return parse_plain_unchecked(canonical(value, check_floats=FROM_BUILTINS.get()))
        except (ValueError, TypeError) as exc:
            raise Fail(f"invalid JSON value: {exc}", InvalidJSONError) from None

    return structure


_TOP_IN: Final[dict[Any, Structurer]] = {}


def top_in(cls: Any) -> Structurer:
    """The structurer of a ``from_json`` target; ``TypeError`` for one it cannot decode."""
    found = CLASS_IN.get(cls) or _TOP_IN.get(cls)
    if found is not None:
        return found
    origin = typing.get_origin(cls)
    if cls in PLAIN:
        found = _plain_in(PLAIN[cls])
    elif cls is RawJSON or (isinstance(cls, type) and issubclass(cls, Metadata)):
        found = structurer_for(cls, decode_error_for(cls))
    elif origin is list or origin is tuple:
        item = typing.get_args(cls)[0]
        if item not in CLASS_IN:
            raise TypeError(f"scope.codec cannot decode {cls!r}")
        found = structurer_for(cls, decode_error_for(item))
    else:
        raise TypeError(f"scope.codec cannot decode {cls!r}")
    _TOP_IN[cls] = found
    return found
