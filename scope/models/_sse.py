"""A small incremental parser for ``text/event-stream`` (server-sent events).

It follows the WHATWG event-stream parsing rules that matter for model APIs: lines end
with LF, CR or CRLF (also when a CRLF is split between two network reads); a line
starting with ``:`` is a comment; ``data`` lines of one event are joined with LF; a blank
line dispatches the event; an event without data, or whose data is empty, is not
dispatched; ``id`` and ``retry`` are ignored (nothing here reconnects); a UTF-8 byte
order mark at the very start is skipped. Data stays bytes, so a JSON parser can read it
without a decode step.
"""

from __future__ import annotations

from typing import Final, final

from scope.errors import InvalidResponseError

__all__ = ["MAX_LINE_BYTES", "SSEDecoder", "SSEEvent"]

#: A line longer than this (no line end in sight) is treated as a broken stream rather
#: than buffered without bound.
MAX_LINE_BYTES: Final = 64 * 1024 * 1024

_BOM: Final = b"\xef\xbb\xbf"

SSEEvent = tuple[str, bytes]
"""One dispatched event: its type (``"message"`` unless an ``event:`` line said
otherwise) and its data, the ``data`` lines joined with LF."""


@final
class SSEDecoder:
    """Feed raw bytes with ``feed``; it returns the events those bytes completed.

    An event still incomplete when the stream ends is discarded (that is what the
    standard says, and it is what a stream cut in the middle of an event must do).
    """

    __slots__ = ("_buffer", "_data", "_event", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._event = ""
        self._started = False
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse ``chunk``; return the events it completed, in order."""
        if not chunk:
            return []
        data = self._buffer + chunk if self._buffer else chunk
        if not self._started:
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._buffer = data
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
        if self._skip_lf:
            # The previous read ended with CR: an LF now completes that CRLF.
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data:
            self._skip_lf = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_LINE_BYTES:
            raise InvalidResponseError(
                f"event stream line longer than {MAX_LINE_BYTES} bytes without a line end"
            )
        self._buffer = rest
        events: list[SSEEvent] = []
        pending = self._data
        for line in lines:
            if not line:
                # An empty data buffer (no data lines, or one empty one) dispatches nothing.
                if pending:
                    if pending != [b""]:
                        events.append(
                            (
                                self._event or "message",
                                pending[0] if len(pending) == 1 else b"\n".join(pending),
                            )
                        )
                    pending = self._data = []
                self._event = ""
                continue
            if line[0] == 0x3A:  # ":" starts a comment
                continue
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                pending.append(value)
            elif field == b"event":
                try:
                    self._event = value.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidResponseError(
                        f"event stream event name is not UTF-8: {exc}"
                    ) from exc
            # "id", "retry" and unknown fields are ignored, as the standard says.
        return events
