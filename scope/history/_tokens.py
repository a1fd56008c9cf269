"""Token counting for budgeted windows (DESIGN §6d): ``TokenCounter`` and the default counter."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final, Protocol, final, runtime_checkable

import attrs

from scope.chat import Message, Part, PartKind, Role
from scope.errors import InvalidWindowError

__all__ = ["DefaultTokenCounter", "TokenCounter", "message_usage"]

#: Message metadata keys the Middleware and the adapters stamp (DESIGN §6c, §6d).
USAGE_KEY: Final = "scope/usage"
PROVIDER_KEY: Final = "scope/provider"
MODEL_KEY: Final = "scope/model"


@runtime_checkable
class TokenCounter(Protocol):
    """Measures messages in tokens, for ``WindowReader(max_tokens=...)``.

    ``count`` is synchronous and pure: the same messages give the same number, and it
    does no I/O (it runs on every budgeted read). It may look at the whole sequence (the
    default counter does: a provider's figures are relative to what came before), so a
    window is measured as the list it is, never as a sum of its pieces.
    """

    def count(self, messages: Sequence[Message]) -> int:
        """The number of tokens ``messages`` take, in this order, as a prompt."""
        ...


def message_usage(message: Message) -> tuple[int, int] | None:
    """``(input_tokens, output_tokens)`` of the ``scope/usage`` metadata the history
    Middleware stored on an assistant message, or None when it has none (or it is not a
    JSON object of two non-negative integers: hand-written metadata is ignored, never
    trusted)."""
    raw = message.metadata.get(USAGE_KEY)
    if raw is None:
        return None
    value = raw.value()
    if type(value) is not dict:
        return None
    counts = value.get("input_tokens", 0), value.get("output_tokens", 0)
    if any(type(n) is not int or n < 0 for n in counts):
        return None
    return counts


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def _check_positive(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not int:
        raise InvalidWindowError(
            f"token counter {attribute.name} must be an integer, got {type(value).__name__}"
        )
    if value < 1:
        raise InvalidWindowError(f"token counter {attribute.name} must be at least 1, got {value}")


def _check_cost(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not int:
        raise InvalidWindowError(
            f"token counter {attribute.name} must be an integer, got {type(value).__name__}"
        )
    if value < 0:
        raise InvalidWindowError(f"token counter {attribute.name} must be at least 0, got {value}")


@final
@attrs.frozen(eq=True)
class DefaultTokenCounter:
    """The counter ``WindowReader`` uses unless given one: the provider's own figures
    where the history has them, an estimate elsewhere.

    The estimate of one message is ``message_tokens`` plus, per part: text and
    reasoning text, UTF-8 bytes / ``bytes_per_token`` (rounded up; signatures are not
    counted); a tool call, its name and argument bytes the same way plus
    ``tool_tokens``; a tool result, its name and output (text, details JSON, media) the
    same way plus ``tool_tokens``; media, a fixed cost by kind: ``image_tokens``,
    ``audio_tokens``, ``video_tokens``, else ``document_tokens`` (a PDF, a file); a
    provider's native item (DESIGN §6k), its JSON bytes the same way.

    Stored figures: the history Middleware keeps each answer's usage on the assistant
    message it commits (``scope/usage``). Such a message is counted as its
    ``output_tokens``. Its ``input_tokens`` is everything before it as the provider
    counted it, so between two such messages of the same provider and model (both
    stamped ``scope/provider`` and ``scope/model``) in the sequence being counted, the difference
    of their ``input_tokens`` replaces the estimate of the earlier answer and of
    everything between them: a window of whole turns is measured in the provider's
    tokens except for its oldest turn's question. The system prompt and tools a
    request adds are in both figures and cancel out. When the difference is negative
    (another system prompt, say), the estimate stands.

    Per-message estimates are remembered for the message objects counted recently (the
    last 65,536; stores hand out the same immutable objects on every read), so a
    budgeted read of an unchanged history does not re-measure text; by weak reference,
    so a counter never keeps a message (or its media) alive. Thread-safe. Invalid settings raise
    ``InvalidWindowError``.
    """

    bytes_per_token: int = attrs.field(default=4, validator=_check_positive)
    message_tokens: int = attrs.field(default=4, validator=_check_cost)
    tool_tokens: int = attrs.field(default=8, validator=_check_cost)
    image_tokens: int = attrs.field(default=1600, validator=_check_cost)
    audio_tokens: int = attrs.field(default=2000, validator=_check_cost)
    video_tokens: int = attrs.field(default=10000, validator=_check_cost)
    document_tokens: int = attrs.field(default=3000, validator=_check_cost)
    _memo: _Memo = attrs.field(factory=lambda: _Memo(), init=False, eq=False, repr=False)

    def validate(self) -> None:
        """Check the settings (construction already did)."""
        for field in attrs.fields(type(self)):
            if field.init:
                assert field.validator is not None
                field.validator(self, field, getattr(self, field.name))

    def estimate(self, message: Message) -> int:
        """The estimate of one message alone (see the class docstring)."""
        return self._info(message)[0]

    def count(self, messages: Sequence[Message]) -> int:
        """The tokens ``messages`` take (see the class docstring)."""
        return self._fold(FOLD_START, messages)[0]

    def _fold(self, state: Fold, messages: Sequence[Message]) -> Fold:
        """The count as a left fold: ``_fold(_fold(FOLD_START, a), b)`` is the state of
        ``a + b``, its first item ``count(a + b)``. ``WindowReader`` measures a stable
        window that grows by a turn with it, without counting it again from its start."""
        total, anchor, pending = state
        info = self._info
        for message in messages:
            entry = info(message)
            usage = entry[1]
            if usage is None:
                total += entry[0]
                pending += entry[0]
                continue
            if anchor is not None:
                last = anchor[1]
                assert last is not None
                grown = usage[2] - last[2]
                if usage[0] and usage[:2] == last[:2] and grown >= 0:
                    # The provider measured the anchor as sent back and all since: use it.
                    total += grown - last[3] - pending
            total += usage[3]
            anchor = entry
            pending = 0
        return total, anchor, pending

    def _info(self, message: Message) -> _Info:
        memo = self._memo
        cached = memo.get(message)
        if cached is not None:
            return cached
        usage: _Usage | None = None
        if message.role is Role.ASSISTANT:
            counts = message_usage(message)
            if counts is not None:
                usage = (*(_source(message) or ("", "")), *counts)
        entry = (self.message_tokens + sum(self._part(part) for part in message.parts), usage)
        memo.put(message, entry)
        return entry

    def _part(self, part: Part) -> int:
        kind = part.kind
        bpt = self.bytes_per_token
        if kind is PartKind.TEXT or kind is PartKind.REASONING:
            return _ceil_div(len(part.text.encode("utf-8", "surrogatepass")), bpt)
        if kind is PartKind.MEDIA:
            assert part.media is not None
            return self._media(part.media.mime)
        if kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            size = len(call.name.encode()) + len(call.arguments.encode("utf-8", "surrogatepass"))
            return self.tool_tokens + _ceil_div(size, bpt)
        if kind is PartKind.TOOL_RESULT:
            result = part.tool_result
            assert result is not None
            cost = self.tool_tokens + _ceil_div(len(result.name.encode()), bpt)
            output = result.output
            if output.details is not None:
                cost += _ceil_div(len(output.details.bytes), bpt)
            return cost + sum(self._part(inner) for inner in output.content)
        if kind is PartKind.NATIVE:
            # A provider's own item (DESIGN §6k): sent back whole to its own model.
            native = part.native
            assert native is not None
            return _ceil_div(len(native.data.bytes), bpt)
        # A tool-call fragment never reaches a stored history; count it like a call.
        delta = part.tool_call_delta
        assert delta is not None
        return self.tool_tokens + _ceil_div(len(delta.arguments.encode()), bpt)

    def _media(self, mime: str) -> int:
        major = mime.split("/", 1)[0].lower()
        if major == "image":
            return self.image_tokens
        if major == "audio":
            return self.audio_tokens
        if major == "video":
            return self.video_tokens
        return self.document_tokens


def _source(message: Message) -> tuple[str, str] | None:
    """The ``(scope/provider, scope/model)`` stamps of a message, or None."""
    metadata = message.metadata
    provider = metadata.get(PROVIDER_KEY)
    model = metadata.get(MODEL_KEY)
    if provider is None or model is None:
        return None
    p, m = provider.value(), model.value()
    if type(p) is not str or type(m) is not str:
        return None
    return p, m


#: provider, model (both "" when not stamped), input and output tokens of stored usage.
_Usage = tuple[str, str, int, int]
#: A message's estimate and its stored usage (None: it has none).
_Info = tuple[int, "_Usage | None"]
#: ``DefaultTokenCounter.fold``'s state: the count so far, the last message with stored
#: usage (its ``_Info``, None before the first) and the estimated tokens counted since it.
Fold = tuple[int, "_Info | None", int]
#: The state of no messages.
FOLD_START: Final[Fold] = (0, None, 0)


@final
class _Memo:
    """Estimates of recently counted message objects (LRU by identity, bounded).

    Keyed by ``id`` with a weak reference to the message, so an entry never keeps a
    message (its media, say) alive, and a reused id never matches: the reference of a
    collected message is dead. Identity, not equality, so a lookup costs no hashing of
    the message."""

    __slots__ = ("_entries", "_lock", "size")

    def __init__(self, size: int = 65536) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[weakref.ref[Message], _Info]] = OrderedDict()

    def get(self, message: Message) -> _Info | None:
        entry = self._entries.get(id(message))
        if entry is None or entry[0]() is not message:
            return None
        return entry[1]

    def put(self, message: Message, cost: _Info) -> None:
        with self._lock:
            entries = self._entries
            entries[id(message)] = (weakref.ref(message), cost)
            if len(entries) > self.size:
                entries.popitem(last=False)
