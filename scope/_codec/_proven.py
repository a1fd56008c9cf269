"""What a strict layout structurer already proves of ``validate()``.

A strict layout structurer (``_structure.strict_in``, one per key layout) knows which
members its object holds, and has checked each one's JSON type and canonical rule before
it assembles the value: every present member is not at its default (``_canonical``), an
enum member is a member, a nested value was built by its own strict structurer (so has
its class), a metadata map is a ``Metadata``; every absent member holds its default.
``proof(cls, present)`` gives an expression over the structurer's locals ``f<index>``
that, when true, means ``cls.validate()`` passes for that value: the structurer then
skips the call. When it is false, or there is no expression for the layout (None), the
structurer calls ``validate()`` as before, so bad input raises the same error with the
same message and path. The expression only ever says "valid", never "invalid".

The rules restate those of the ``validate()`` methods of ``Part``, ``Message``,
``ToolCall``, ``ToolCallDelta``, ``ToolResult``, ``ToolOutput`` and ``NativeItem``
(``scope.chat``) for the values such a layout can hold, and ask ``validate()`` itself
what they can: the part kinds each role may carry (``_allowed``) and a tool output may
hold (``_output_kinds``), and which string fields must be non-empty or free of
surrounding whitespace (``_text_rules``). tests/chat/test_codec_proven.py checks every
layout against ``validate()`` itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

import attrs

from scope._codec._generated import constant
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
)
from scope.errors import ScopeError
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata

__all__ = ["proof"]

#: The part fields that carry a kind's payload, each named as the kind it belongs to.
_PAYLOADS: Final = ("media", "tool_call", "tool_call_delta", "tool_result", "native")


def _allowed() -> dict[Role, frozenset[PartKind]]:
    """The part kinds each role's messages may carry, asked of ``Message.validate``
    itself (a one-part message per role and kind; it looks only at the part's kind), so
    the proofs restate no table of ``scope.chat``'s."""
    return {
        role: frozenset(
            kind
            for kind in PartKind
            if _passes(
                Message,
                {"role": role, "parts": (_bare(Part, {"kind": kind}),), "metadata": Metadata()},
            )
        )
        for role in Role
    }


def _locals(cls: type) -> dict[str, str]:
    """The local each init field is read into (``f<index>``), by field name."""
    return {f.name: f"f{i}" for i, f in enumerate(attrs.fields(cls)) if f.init}


def _metadata_default(cls: type) -> bool:
    """Whether the ``metadata`` field's default is a plain ``Metadata`` (what
    ``validate()`` requires; a present member is structured as one)."""
    field = attrs.fields_dict(cls)["metadata"]
    return field.type in (Metadata, "Metadata") and type(field.default) is Metadata


def _part(present: frozenset[str]) -> str | None:
    """``Part.validate`` for a layout: ``kind`` a ``PartKind``; ``text`` a str (valid
    Unicode when not ASCII), non-empty when present; ``signature`` bytes, non-empty when
    present; ``metadata`` a ``Metadata``; a present payload of its class. What is left is
    the kind: it must select exactly the payload present, with text only for text and
    reasoning parts, and a signature only for reasoning ones."""
    f = _locals(Part)
    if not _metadata_default(Part):  # pragma: no cover - the rules below would not hold
        return None
    payloads = [name for name in _PAYLOADS if name in present]
    text, signature = "text" in present, "signature" in present
    kind = f["kind"]
    if len(payloads) > 1:
        return None
    if payloads:
        if text or signature:
            return None
        rule = f"{kind} is {_kind(payloads[0])}"
    elif signature:
        rule = f"{kind} is {_kind('reasoning')}"
    elif text:
        rule = f"({kind} is {_kind('text')} or {kind} is {_kind('reasoning')})"
    else:
        return None  # no payload, no text, no signature: never valid
    if text:
        rule += f" and {f['text']}.isascii()"  # other text: validate() checks its Unicode
    return rule


def _kind(value: str) -> str:
    return constant("strict", Part, f"kind_{value}", PartKind(value))


def _message(present: frozenset[str]) -> str | None:
    """``Message.validate`` for a layout: ``role`` a ``Role``, ``parts`` a tuple of
    ``Part`` values, ``metadata`` a ``Metadata``. What is left: at least one part, each
    of a kind the role may carry."""
    del present  # every layout holds the same proven types
    if not _metadata_default(Message):  # pragma: no cover - the rules below would not hold
        return None
    f = _locals(Message)
    role, parts = f["role"], f["parts"]
    allowed = constant("strict", Message, "allowed_kinds", _allowed())
    return (
        f"({parts}[0].kind in {allowed}[{role}] if len({parts}) == 1 else "
        f"(len({parts}) > 1 and {allowed}[{role}].issuperset([p.kind for p in {parts}])))"
    )


def _bare(cls: type, values: dict[str, Any]) -> Any:
    """A value of ``cls`` whose init fields hold ``values`` (the others unset), assembled
    as a structurer assembles it: no ``__init__``, so no check has run."""
    obj: Any = object.__new__(cls)
    for name, value in values.items():
        cls.__dict__[name].__set__(obj, value)
    return obj


def _passes(cls: type, values: dict[str, Any]) -> bool:
    """Whether ``validate()`` passes for ``_bare(cls, values)``."""
    try:
        _bare(cls, values).validate()
    except ScopeError:
        return False
    return True


def _is_str(field: attrs.Attribute[Any]) -> bool:
    return field.type in (str, "str")


#: A valid value of each field that is neither a string nor has a default, for the
#: probes of ``_text_rules``.
_SAMPLES: Final[dict[tuple[type, str], Any]] = {(NativeItem, "data"): RawJSON.parse("{}")}


@functools.cache
def _text_rules(cls: type) -> dict[str, tuple[bool, bool]] | None:
    """For each string field of ``cls``: whether ``validate()`` refuses it empty, and
    whether it refuses it with surrounding whitespace, asked of ``validate()`` itself on
    a value whose string fields are ``"x"`` and whose other fields hold their defaults
    (``_SAMPLES`` for those without), which must pass. None when that value does not
    pass: no proof for ``cls``."""
    base: dict[str, Any] = {}
    for field in attrs.fields(cls):
        default: Any = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        if _is_str(field):
            base[field.name] = "x"
        elif default is attrs.NOTHING:
            if (cls, field.name) not in _SAMPLES:  # pragma: no cover - no value to try
                return None
            base[field.name] = _SAMPLES[cls, field.name]
        else:
            base[field.name] = default
    if not _passes(cls, base):  # pragma: no cover - the probes below would mean nothing
        return None
    return {
        field.name: (
            not _passes(cls, {**base, field.name: ""}),
            not _passes(cls, {**base, field.name: " x"}),
        )
        for field in attrs.fields(cls)
        if _is_str(field)
    }


def _text_ok(value: str, required: bool, strip: bool) -> bool:
    """``check_text`` of an ASCII default, as the rules derived for its field."""
    return (
        value.isascii() and (bool(value) or not required) and (not strip or value.strip() == value)
    )


def _texts(
    cls: type, typed: dict[str, Callable[[str], str] | None] | None = None
) -> Callable[[frozenset[str]], str | None]:
    """The proof of a class whose ``validate()`` checks its string fields with
    ``check_text`` (``_text_rules`` finds which must be non-empty or stripped) and each
    field named in ``typed`` for its type, which the structurer has checked (a present
    member; an absent one holds its default, which passed in ``_text_rules``), and for
    the rule ``typed`` gives over its local, if any. A string that is not ASCII is left
    to ``validate()``'s Unicode check. Any other field: no proof."""
    typed = typed or {}

    def rule(present: frozenset[str]) -> str | None:
        texts = _text_rules(cls)
        if texts is None:  # pragma: no cover - see _text_rules
            return None
        f = _locals(cls)
        terms: list[str] = []
        for field in attrs.fields(cls):
            name = field.name
            if name in typed:
                extra = typed[name]
                if extra is not None:
                    if name not in present:  # pragma: no cover - none without a default
                        return None
                    terms.append(extra(f[name]))
                continue
            if name not in texts:  # pragma: no cover - a rule this proof does not know
                return None
            required, strip = texts[name]
            if name not in present:
                if not (type(field.default) is str and _text_ok(field.default, required, strip)):
                    return None  # absent, and its default would not pass
                continue
            local = f[name]
            if required:
                terms.append(local)
            terms.append(f"{local}.isascii()")
            if strip:
                terms.append(f"{local}.strip() == {local}")
        return " and ".join(terms) if terms else "True"

    return rule


def _output_kinds() -> frozenset[PartKind]:
    """The part kinds a tool output's content may hold, asked of ``ToolOutput.validate``
    itself (one part of each kind; it looks only at the parts' kinds)."""
    return frozenset(
        kind
        for kind in PartKind
        if _passes(ToolOutput, {"content": (_bare(Part, {"kind": kind}),), "details": None})
    )


def _tool_output(present: frozenset[str]) -> str | None:
    """``ToolOutput.validate`` for a layout: ``content`` a tuple of ``Part`` values (the
    strict structurers built them), ``details`` not looked at. What is left: every
    part of a kind an output may hold (``_output_kinds``); no content always passes."""
    if "content" not in present:
        return "True"
    content = _locals(ToolOutput)["content"]
    allowed = constant("strict", ToolOutput, "allowed_kinds", _output_kinds())
    return (
        f"({content}[0].kind in {allowed} if len({content}) == 1 else "
        f"{allowed}.issuperset([p.kind for p in {content}]))"
    )


_PROOFS: Final[dict[type, Callable[[frozenset[str]], str | None]]] = {
    Part: _part,
    Message: _message,
    ToolCall: _texts(ToolCall),
    ToolCallDelta: _texts(ToolCallDelta),
    ToolResult: _texts(ToolResult, typed={"output": None, "is_error": None}),
    # NativeItem.validate: data a RawJSON (as the structurer builds it) of an object.
    NativeItem: _texts(NativeItem, typed={"data": lambda data: f"{data}.bytes[:1] == b'{{'"}),
    ToolOutput: _tool_output,
}


def proof(cls: type, present: Any) -> str | None:
    """An expression over the locals ``f<index>`` of a strict layout structurer of
    ``cls`` whose object holds the init fields named in ``present`` (the others at
    their defaults): true only when ``validate()`` would pass. None: no such rule."""
    rule = _PROOFS.get(cls)
    return None if rule is None else rule(frozenset(present))
