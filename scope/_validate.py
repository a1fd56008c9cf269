"""Small checks and converters shared by the value classes.

attrs converters must be named functions for mypy's attrs plugin to type ``__init__``,
so each value module defines small named converters (``_to_part_kind``,
``_to_part_metadata`` ...) that call the generic helpers here.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeGuard, TypeVar

import attrs

from scope._json import check_str
from scope.errors import InvalidOptionsError, ScopeError

__all__ = [
    "check_limit",
    "MAX_INT",
    "check_int",
    "check_lease",
    "check_name",
    "check_seconds",
    "check_type",
    "check_text",
    "nested",
    "publish",
    "to_bytes",
    "to_enum",
    "to_tuple",
]

#: Every integer must fit a signed 64-bit wire integer.
MAX_INT: Final = 2**63 - 1

E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")


def check_text(
    value: object,
    what: str,
    error: type[Exception],
    *,
    required: bool = False,
    strip: bool = False,
) -> str:
    """Check a string field: a str, valid Unicode (no lone surrogates), optionally
    non-empty (``required``) and free of surrounding whitespace (``strip``)."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__}")
    if required and not value:
        raise error(f"{what} must not be empty")
    if not value.isascii() and not check_str(value):
        raise error(f"{what} is not valid Unicode (lone surrogate)")
    if strip and value and value.strip() != value:
        raise error(f"{what} must not have surrounding whitespace, got {value!r}")
    return value


def check_int(value: object, what: str, error: type[Exception], *, minimum: int = 0) -> int:
    """Check an integer field: a real int (not bool) in [minimum, 2**63 - 1]."""
    if type(value) is not int:
        raise error(f"{what} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise error(f"{what} must be at least {minimum}, got {value}")
    if value > MAX_INT:
        raise error(f"{what} must be below 2**63, got {value}")
    return value


def finite_number(value: object, *, positive: bool = False) -> TypeGuard[int | float]:
    """Whether ``value`` is a real number (an int or float, not a bool) that a float
    holds, finite and ``>= 0`` (``> 0`` with ``positive``): a duration or delay setting.
    An int too large for a float is not one (``math.isfinite`` would raise
    ``OverflowError`` for it)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and (number > 0 if positive else number >= 0)


def check_type(value: object, types: type | tuple[type, ...], what: str, expected: str) -> None:
    """The argument policy's type half (see ``scope.errors``): ``TypeError`` naming
    ``what`` and ``expected`` unless ``value`` is an instance of ``types``. A bool is
    never taken for an int."""
    if not isinstance(value, types) or (isinstance(value, bool) and not _admits_bool(types)):
        raise TypeError(f"{what} must be {expected}, got {type(value).__name__}")


def _admits_bool(types: type | tuple[type, ...]) -> bool:
    return bool in (types if isinstance(types, tuple) else (types,))


def check_name(value: object, what: str) -> str:
    """A name argument (``provider_name`` ...): a string (``TypeError`` otherwise) that
    is not empty or blank (``InvalidOptionsError`` otherwise)."""
    check_type(value, str, what, "a string")
    assert isinstance(value, str)
    if not value.strip():
        raise InvalidOptionsError(f"{what} must be a non-empty string, got {value!r}")
    return value


def check_seconds(
    value: object,
    what: str,
    *,
    positive: bool = False,
    error: type[ValueError] = ValueError,
) -> float:
    """A duration argument: an int or float (``TypeError`` otherwise, a bool included),
    finite and ``>= 0`` (``> 0`` with ``positive``; ``error``, a ``ValueError``,
    otherwise). Returns it as a float."""
    check_type(value, (int, float), what, "a number of seconds")
    if not finite_number(value, positive=positive):
        bound = "> 0" if positive else ">= 0"
        raise error(f"{what} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def check_lease(holder: object, ttl: object) -> tuple[str, float]:
    """The arguments of ``TurnLeaser.acquire_turn``: ``holder`` a non-empty string (valid
    Unicode), ``ttl`` a finite number of seconds > 0. Anything else raises ``ValueError``
    naming the argument, before any I/O."""
    check_text(holder, "lease holder", ValueError, required=True)
    if not finite_number(ttl, positive=True):
        raise ValueError(f"lease ttl must be a finite number of seconds > 0, got {ttl!r}")
    return holder, float(ttl)  # type: ignore[return-value]


def check_limit(limit: object) -> int | None:
    """A listing's ``limit``: None (no bound) or an int >= 1, else ``ValueError``."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1 or None, got {limit!r}")
    return limit


def to_bytes(value: bytes | bytearray | memoryview) -> bytes:
    """Converter: bytes stay, bytearray and memoryview are copied; anything else (only
    possible past the type checker) is left for the class check, which names the bad
    type."""
    if type(value) is bytes:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return value


def to_tuple(value: Iterable[T]) -> tuple[T, ...]:
    """Converter: any iterable except str, bytes and mappings becomes a tuple; anything
    else (only possible past the type checker) is left for the class check, which names
    the bad type.

    Generic, so the attrs plugin cannot use it as a field converter directly: each class
    wraps it in a named converter with the field's precise parameter type.
    """
    if type(value) is tuple:
        return value
    if isinstance(value, str | bytes | bytearray | memoryview | dict) or not isinstance(
        value, Iterable
    ):
        return value  # type: ignore[return-value]
    return tuple(value)


def to_enum(cls: type[E], value: Any, error: type[Exception], what: str) -> E:
    """Convert to a member of ``cls`` (a member or its value), raising ``error`` naming
    ``what`` and the allowed values otherwise."""
    if type(value) is cls:
        return value
    try:
        return cls(value)
    except (ValueError, TypeError):
        allowed = ", ".join(repr(m.value) for m in cls)
        raise error(f"{what} must be one of {allowed}, got {value!r}") from None


def nested(convert: Callable[[Any], T], value: Any, error: type[Exception], path: str) -> T:
    """Run ``convert(value)`` for a nested field; an invalid nested value raises the outer
    ``error`` with ``path`` in the message and the inner error as ``__cause__``."""
    try:
        return convert(value)
    except ScopeError as exc:
        if type(exc) is error:
            raise
        raise error(f"{path}: {exc}") from exc


def publish(module: str, names: Iterable[str], namespace: dict[str, Any]) -> None:
    """Show public classes and functions under their public module in reprs and tracebacks.

    attrs classes get their annotations resolved first, while the private module's
    globals are still the ones to resolve them in.
    """
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type) and attrs.has(obj):
            attrs.resolve_types(obj)
        if isinstance(obj, type) or callable(obj):
            with contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = module
