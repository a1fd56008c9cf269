"""``ResponseAccumulator``: merge streamed response deltas into one response."""

from __future__ import annotations

from typing import Final, final

from scope.chat._message import Message, Part, ToolCall
from scope.chat._response import Output, OutputMetadata, Response, ResponseMetadata, Usage
from scope.chat._types import FinishReason, PartKind, Role
from scope.errors import InvalidResponseError, ScopeError
from scope.metadata import EMPTY_METADATA, Metadata

__all__ = ["ResponseAccumulator"]

_TEXT: Final = PartKind.TEXT
_REASONING: Final = PartKind.REASONING
_TOOL_CALL: Final = PartKind.TOOL_CALL
_TOOL_CALL_DELTA: Final = PartKind.TOOL_CALL_DELTA
_EMPTY: Final = Metadata()
_ZERO_USAGE: Final = Usage()
_ASSISTANT: Final = Role.ASSISTANT


class _Slot:
    """One part of the accumulated message, built from one or more fragments.

    Fragments are kept in lists and joined once, when a response is built; the built
    part is cached until the slot changes, so asking for ``response()`` after every
    chunk only rebuilds the part that grew.
    """

    __slots__ = ("args", "built", "call_id", "kind", "metadata", "name", "sigs", "texts")

    def __init__(self, kind: PartKind, metadata: Metadata) -> None:
        self.kind = kind
        self.metadata = metadata
        self.texts: list[str] = []  # text / reasoning text fragments
        self.sigs: list[bytes] = []  # reasoning signature fragments
        self.args: list[str] = []  # tool-call argument fragments
        self.call_id = ""
        self.name = ""
        self.built: Part | None = None

    def build(self) -> Part:
        part = self.built
        if part is not None:
            return part
        kind = self.kind
        if kind is _TOOL_CALL:  # assembled from tool_call_delta fragments
            args = "".join(self.args)
            self.args = [args] if args else []
            part = Part(
                _TOOL_CALL,
                tool_call=ToolCall(self.call_id, self.name, args),
                metadata=self.metadata,
            )
        else:
            text = "".join(self.texts)
            self.texts = [text] if text else []
            signature = b"".join(self.sigs)
            self.sigs = [signature] if signature else []
            part = Part(kind, text=text, signature=signature, metadata=self.metadata)
        self.built = part
        return part


class _FixedSlot:
    """A part that never merges: media, or a tool call that arrived complete."""

    __slots__ = ("built", "kind", "metadata")

    def __init__(self, part: Part) -> None:
        self.kind = part.kind
        self.metadata = part.metadata
        self.built = part

    def build(self) -> Part:
        return self.built


@final
class ResponseAccumulator:
    """Merge streamed ``Response`` deltas into one response.

    ``add(chunk)`` validates a chunk and merges it **atomically**: when it raises
    ``InvalidResponseError`` the accumulator is exactly as it was before the call, so a
    caller may log the bad chunk and go on. ``response()`` returns the merged response so
    far (``None`` before the first successful ``add``); it is an immutable value, not a
    view, so later chunks never change a response already returned. ``text`` is the text
    so far (text parts only, no reasoning).

    Merge rules:

    - **Parts.** A text fragment merges into the last accumulated part when that part is
      also text and has equal part metadata; a reasoning fragment likewise merges into a
      last reasoning part (text concatenates, signatures concatenate). Anything else
      starts a new part. Media parts never merge.
    - **Tool calls.** ``tool_call_delta`` fragments merge by call id, even when the
      fragments of parallel calls interleave: the call keeps the position of its first
      fragment, its arguments concatenate and its part metadata merges last-write-wins.
      A fragment naming another tool for an id already seen is an error. Deltas become
      ``tool_call`` parts in the result (arguments are never parsed, so a call whose
      arguments are still incomplete is reported as it stands). A complete ``tool_call``
      part whose id was already seen (complete or as deltas) is an error, and so is a
      delta for an id that arrived as a complete call.
    - **Scalars.** Response id, model and finish reason take the latest non-empty value.
    - **Metadata.** Response extra, output extra and message metadata each merge per key,
      last write wins. A chunk's ``output.message_metadata`` (metadata for the message
      sent after its parts) merges into the message metadata the same way; the result
      keeps it in ``message_metadata`` only while no part has come.
    - **Usage** is a cumulative snapshot: the latest non-zero one replaces the previous
      one; a zero usage (nothing reported) never overwrites.
    - **After the finish reason.** Once a finish reason was merged, a chunk that carries
      message parts is an ``InvalidResponseError``: the generation is over. Chunks without
      parts are accepted — usage-only chunks (OpenAI sends usage after ``finish_reason``),
      metadata, id or model updates, or a later finish reason (latest wins).

    ``Output``/``OutputMetadata``/``ResponseMetadata`` are present in the result when
    any chunk carried one, so splitting a response into chunks and accumulating them
    gives back an equal response (when its adjacent text and reasoning parts differ in
    kind or metadata, as a provider's would).

    Cost is linear in the bytes streamed: fragments are collected in lists and joined
    once when a response is built; the built response is cached until the next ``add``.
    The accumulator is a plain object: use it from one task at a time.
    """

    __slots__ = (
        "_cache",
        "_calls",
        "_complete_ids",
        "_extra",
        "_finish",
        "_has_output",
        "_has_output_meta",
        "_has_response_meta",
        "_id",
        "_message_meta",
        "_model",
        "_output_extra",
        "_slots",
        "_started",
        "_usage",
    )

    def __init__(self) -> None:
        self._started = False
        self._has_output = False
        self._has_output_meta = False
        self._has_response_meta = False
        self._id = ""
        self._model = ""
        self._usage = _ZERO_USAGE
        self._finish: FinishReason | None = None
        self._extra = _EMPTY
        self._output_extra = _EMPTY
        self._message_meta = _EMPTY
        self._slots: list[_Slot | _FixedSlot] = []
        self._calls: dict[str, _Slot] = {}
        self._complete_ids: set[str] = set()
        self._cache: Response | None = None

    def add(self, chunk: Response) -> None:
        """Validate ``chunk`` and merge it; on ``InvalidResponseError`` nothing changed."""
        # The hot path: one text part and nothing else, before the finish reason (almost
        # every chunk of a streamed answer). The type and role tests below are exactly
        # what the validate() calls of the general path check for a chunk of this shape
        # (every class here is final, so ``type(x) is C`` is ``isinstance(x, C)``); any
        # other chunk takes the general path.
        if type(chunk) is Response and chunk.metadata is None and self._finish is None:
            output = chunk.output
            if type(output) is Output and output.metadata is None and output.finish_reason is None:
                message = output.message
                if (
                    type(message) is Message
                    and message.role is _ASSISTANT
                    and message.metadata is EMPTY_METADATA
                ):
                    parts = message.parts
                    if type(parts) is tuple and len(parts) == 1:
                        part = parts[0]
                        if type(part) is Part and part.kind is _TEXT:
                            self._add_text(part)
                            return
        self._add(chunk)

    def _add_text(self, part: Part) -> None:
        """Merge one valid text part (the hot path of ``add``); cannot fail."""
        self._started = True
        self._has_output = True
        self._cache = None
        slots = self._slots
        if slots:
            last = slots[-1]
            if last.kind is _TEXT and (
                last.metadata is part.metadata or last.metadata == part.metadata
            ):
                if part.text:
                    last.texts.append(part.text)  # type: ignore[union-attr]
                last.built = None
                return
        slot = _Slot(_TEXT, part.metadata)
        if part.text:
            slot.texts.append(part.text)
        slots.append(slot)

    def _add(self, chunk: Response) -> None:
        """``add`` for any chunk: validate everything, then merge atomically."""
        if not isinstance(chunk, Response):
            raise InvalidResponseError(f"a chunk must be a Response, got {type(chunk).__name__}")
        output = chunk.output
        meta = chunk.metadata
        parts: tuple[Part, ...] = ()
        message: Message | None = None
        try:
            chunk.validate()
            if meta is not None:
                meta.validate()
                meta.usage.validate()
            if output is not None:
                output.validate()
                message = output.message
                if message is not None:
                    message.validate()
                    parts = message.parts
        except ScopeError as exc:
            if isinstance(exc, InvalidResponseError):
                raise
            raise InvalidResponseError(f"invalid chunk: {exc}") from exc

        # Phase 1: every check, no change to self.
        if parts and self._finish is not None:
            raise InvalidResponseError(
                f"a chunk carries message parts after the finish reason {self._finish!s}"
            )
        new_calls: dict[str, str] = {}  # id -> name of calls whose first delta is here
        new_complete: set[str] = set()  # ids of complete tool calls in this chunk
        calls = self._calls
        complete_ids = self._complete_ids
        for index, part in enumerate(parts):
            kind = part.kind
            if kind is _TOOL_CALL_DELTA:
                delta = part.tool_call_delta
                assert delta is not None
                call_id = delta.id
                if call_id in complete_ids or call_id in new_complete:
                    raise InvalidResponseError(
                        f"output.message.parts[{index}]: tool call delta for {call_id!r}, "
                        "which already arrived as a complete tool call"
                    )
                seen = calls.get(call_id)
                known = seen.name if seen is not None else new_calls.setdefault(call_id, delta.name)
                if known != delta.name:
                    raise InvalidResponseError(
                        f"output.message.parts[{index}]: tool call {call_id!r} changed its "
                        f"name from {known!r} to {delta.name!r}"
                    )
            elif kind is _TOOL_CALL:
                call = part.tool_call
                assert call is not None
                call_id = call.id
                if (
                    call_id in calls
                    or call_id in complete_ids
                    or call_id in new_calls
                    or call_id in new_complete
                ):
                    raise InvalidResponseError(
                        f"output.message.parts[{index}]: tool call id {call_id!r} was already seen"
                    )
                new_complete.add(call_id)

        extra = self._extra
        output_extra = self._output_extra
        message_meta = self._message_meta
        if meta is not None and meta.extra:
            extra = extra.merge(meta.extra)
        if output is not None and output.metadata is not None and output.metadata.extra:
            output_extra = output_extra.merge(output.metadata.extra)
        if message is not None and message.metadata:
            message_meta = message_meta.merge(message.metadata)
        elif output is not None and output.message_metadata:
            message_meta = message_meta.merge(output.message_metadata)

        # Phase 2: apply. Nothing below can fail.
        self._started = True
        self._cache = None
        self._extra = extra
        self._output_extra = output_extra
        self._message_meta = message_meta
        if meta is not None:
            self._has_response_meta = True
            if meta.id:
                self._id = meta.id
            if meta.model:
                self._model = meta.model
            usage = meta.usage
            if usage is not _ZERO_USAGE and not usage.is_zero():
                self._usage = usage
        if output is not None:
            self._has_output = True
            if output.metadata is not None:
                self._has_output_meta = True
            if output.finish_reason is not None:
                self._finish = output.finish_reason
        slots = self._slots
        for part in parts:
            kind = part.kind
            if kind is _TEXT or kind is _REASONING:
                last = slots[-1] if slots else None
                if (
                    last is not None
                    and last.kind is kind
                    and (last.metadata is part.metadata or last.metadata == part.metadata)
                ):
                    assert isinstance(last, _Slot)
                    if part.text:
                        last.texts.append(part.text)
                    if part.signature:
                        last.sigs.append(part.signature)
                    last.built = None
                else:
                    slot = _Slot(kind, part.metadata)
                    if part.text:
                        slot.texts.append(part.text)
                    if part.signature:
                        slot.sigs.append(part.signature)
                    slots.append(slot)
            elif kind is _TOOL_CALL_DELTA:
                delta = part.tool_call_delta
                assert delta is not None
                call_slot = calls.get(delta.id)
                if call_slot is None:
                    call_slot = _Slot(_TOOL_CALL, part.metadata)
                    call_slot.call_id = delta.id
                    call_slot.name = delta.name
                    calls[delta.id] = call_slot
                    slots.append(call_slot)
                elif part.metadata:
                    call_slot.metadata = call_slot.metadata.merge(part.metadata)
                if delta.arguments:
                    call_slot.args.append(delta.arguments)
                call_slot.built = None
            else:
                if kind is _TOOL_CALL:
                    assert part.tool_call is not None
                    complete_ids.add(part.tool_call.id)
                slots.append(_FixedSlot(part))

    def response(self) -> Response | None:
        """The merged response so far, or ``None`` before the first successful ``add``.

        The result is an immutable value: later ``add`` calls do not change it. It is
        cached, so asking again without an ``add`` in between costs nothing.
        """
        if not self._started:
            return None
        cached = self._cache
        if cached is None:
            cached = self._cache = self._build()
        return cached

    @property
    def text(self) -> str:
        """The text so far: text parts concatenated, reasoning excluded (``""`` before
        the first chunk)."""
        response = self.response()
        return "" if response is None else response.text

    def _build(self) -> Response:
        output = None
        if self._has_output:
            message = None
            if self._slots:
                message = Message(
                    Role.ASSISTANT,
                    tuple(slot.build() for slot in self._slots),
                    self._message_meta,
                )
            output = Output(
                message,
                self._finish,
                OutputMetadata(self._output_extra) if self._has_output_meta else None,
                EMPTY_METADATA if message is not None else self._message_meta,
            )
        metadata = None
        if self._has_response_meta:
            metadata = ResponseMetadata(self._id, self._model, self._usage, self._extra)
        return Response(output, metadata)
