"""Terminal output: messages as readable text, a progress counter."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from typing import Final, TextIO, final

import anyio

from scope.chat import Message, Part, PartKind, Response, ResponseAccumulator, ToolOutput
from scope.codec import to_json
from scope.history import Batch
from scope.media import Media, SourceKind
from scope.metadata import Metadata

__all__ = [
    "Progress",
    "render_batches",
    "render_conversation",
    "render_message",
    "safe",
]

# C0 and C1 control characters other than newline and tab: a stored message must not be
# able to move the cursor or recolour the terminal of whoever reads it.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_INDENT: Final = "    "


def safe(text: str) -> str:
    """``text`` with terminal control characters spelled as escapes (``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _metadata(metadata: Metadata) -> str:
    return safe(to_json(metadata).decode())


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def _media(media: Media) -> str:
    source = media.source
    if source.kind is SourceKind.BYTES:
        where = _size(len(source.data))
    elif source.kind is SourceKind.URI:
        where = f"uri {source.uri}"
    else:
        where = f"ref {source.ref}"
    extra = "".join(
        f", {label} {value!r}" for label, value in (("name", media.name), ("id", media.id)) if value
    )
    return safe(f"media {media.mime}, {where}{extra}")


def _block(label: str, text: str) -> list[str]:
    """``label`` followed by ``text``; continuation lines indented under it."""
    lines = safe(text).split("\n")
    head = f"{label}{lines[0]}" if label else lines[0]
    return [head, *(_INDENT + line for line in lines[1:])]


def _tool_output(output: ToolOutput) -> list[str]:
    lines: list[str] = []
    for part in output.content:
        if part.kind is PartKind.MEDIA and part.media is not None:
            lines.append(_media(part.media))
        else:
            lines.extend(_block("", part.text))
    if output.details is not None:
        lines.append(safe(f"details {output.details}"))
    return lines or ["(empty output)"]


def _part(part: Part) -> list[str]:
    kind = part.kind
    if kind is PartKind.TEXT:
        lines = _block("", part.text)
    elif kind is PartKind.REASONING:
        signature = f" [signature {_size(len(part.signature))}]" if part.signature else ""
        lines = _block("(reasoning) ", part.text + signature if part.text else signature.strip())
    elif kind is PartKind.MEDIA and part.media is not None:
        lines = [_media(part.media)]
    elif kind is PartKind.TOOL_CALL and part.tool_call is not None:
        call = part.tool_call
        lines = _block(f"-> tool call {safe(call.name)} [{safe(call.id)}] ", call.arguments)
    elif kind is PartKind.TOOL_CALL_DELTA and part.tool_call_delta is not None:
        delta = part.tool_call_delta
        lines = _block(
            f"-> tool call fragment {safe(delta.name)} [{safe(delta.id)}] ", delta.arguments
        )
    elif kind is PartKind.TOOL_RESULT and part.tool_result is not None:
        result = part.tool_result
        verb = "tool error" if result.is_error else "tool result"
        body = _tool_output(result.output)
        lines = [f"<- {verb} {safe(result.name)} [{safe(result.id)}] {body[0]}"]
        lines.extend(_INDENT + line for line in body[1:])
    elif kind is PartKind.NATIVE and part.native is not None:
        native = part.native
        size = _size(len(native.data.bytes))
        lines = [f"(native {safe(native.provider)} {safe(native.type)}) [{size}]"]
    else:  # pragma: no cover - every kind is handled above
        lines = [f"({kind})"]
    if part.metadata:
        lines.append(f"{_INDENT}metadata {_metadata(part.metadata)}")
    return lines


def render_message(number: int, message: Message) -> list[str]:
    """A message as indented lines: ``[n] role``, then one block per part."""
    lines = [f"[{number}] {message.role}"]
    for part in message.parts:
        lines.extend(_INDENT + line for line in _part(part))
    if message.metadata:
        lines.append(f"{_INDENT}metadata {_metadata(message.metadata)}")
    return lines


def render_conversation(messages: Iterable[Message], *, first: int = 1) -> list[str]:
    """Every message of a conversation, numbered from ``first``."""
    out: list[str] = []
    for number, message in enumerate(messages, first):
        out.extend(render_message(number, message))
    return out


def render_batches(batches: Iterable[Batch], *, first: int = 1) -> list[str]:
    """Every batch of a conversation: its receipt line ``batch <append id>  <digest>``,
    then its messages, numbered continuously from ``first`` across the batches."""
    out: list[str] = []
    number = first
    for batch in batches:
        out.append(safe(f"batch {batch.id}  {batch.digest}"))
        out.extend(render_conversation(batch.messages, first=number))
        number += len(batch.messages)
    return out


@final
class Progress:
    """A ``\\r`` counter on ``stream`` while it is a terminal; silent otherwise."""

    def __init__(self, stream: TextIO, label: str, total: int | None = None) -> None:
        self._stream = stream
        self._label = label
        self._total = total
        self._count = 0
        try:
            self._on = stream.isatty()
        except (AttributeError, ValueError):
            self._on = False

    def step(self) -> None:
        """Count one more item."""
        self._count += 1
        if self._on:
            total = "" if self._total is None else f"/{self._total}"
            self._stream.write(f"\r{self._label} {self._count}{total}")
            self._stream.flush()

    def done(self) -> None:
        """End the counter's line (nothing when silent or nothing was counted)."""
        if self._on and self._count:
            self._stream.write("\n")
            self._stream.flush()


async def print_stream(
    chunks: AsyncIterator[Response], out: TextIO, prefix: str, pause: float = 0.0
) -> Response | None:
    """Write each chunk's text to ``out`` as it arrives (control characters escaped: model
    text is untrusted), after ``prefix`` and ending with a newline once any text came;
    return the accumulated response (None when nothing arrived). The stream is closed on
    every path before this returns."""
    accumulator = ResponseAccumulator()
    started = False
    try:
        async for chunk in chunks:
            accumulator.add(chunk)
            if chunk.text:
                if not started:
                    out.write(prefix)
                    started = True
                out.write(safe(chunk.text))
                out.flush()
                if pause:
                    await anyio.sleep(pause)
    finally:
        if started:
            out.write("\n")
            out.flush()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    return accumulator.response()
