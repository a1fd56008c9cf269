"""A real HTTP server on loopback that replays OpenAI Chat Completions wire transcripts.

Used by tests/test_openai*.py and benchmarks/bench_openai.py. It is the stdlib
``ThreadingHTTPServer`` in a background thread, speaking HTTP/1.1 with keep-alive and
chunked transfer encoding for event streams, so the adapter under test runs its real
httpx transport against real sockets.

A transcript (tests/openai_transcripts/*.json) is ``{"description": ..., "exchanges":
[...]}``; each POST takes the next exchange (``OpenAIServer.default`` answers once the
queue is empty). An exchange is ``{"status": 200, "headers": {...}}`` plus one of:

- ``"json"``: a JSON body (a ``chat.completion`` object or an error object);
- ``"sse"``: a ``text/event-stream`` body, one item per event: an object is sent as
  ``data: <json>`` (a ``chat.completion.chunk``), the string ``"[DONE]"`` as
  ``data: [DONE]``; control items are objects with one ``$`` key: ``{"$raw": text}``
  writes text verbatim, ``{"$drop": true}`` writes half an HTTP chunk and closes the
  connection, ``{"$hold": true}`` waits for the client to close the connection and
  records that in ``closed_by_client``;
- ``"stall": true``: answer nothing until the server stops (for timeouts).

With ``"named_events": true`` every object of an ``sse`` body is preceded by an
``event: <its "type">`` line (the Anthropic Messages API's framing;
tests/anthropic_server.py sets it).

With ``"burst": true`` an ``sse`` body (no control items) goes out in one write instead
of one write per event (benchmarks use it to measure the client, not the server).

Every request is recorded (path, headers, decoded JSON body) in ``requests``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs

TRANSCRIPTS = Path(__file__).parent / "openai_transcripts"

__all__ = [
    "TRANSCRIPTS",
    "OpenAIServer",
    "Recorded",
    "check_chunk",
    "check_completion",
    "check_request_body",
    "load_transcript",
    "sse_body",
    "validate_body",
]


def load_transcript(name: str) -> list[dict[str, Any]]:
    """The exchanges of ``tests/openai_transcripts/<name>.json``."""
    data = json.loads((TRANSCRIPTS / f"{name}.json").read_text(encoding="utf-8"))
    exchanges: list[dict[str, Any]] = data["exchanges"]
    return exchanges


def sse_body(items: list[Any], *, named: bool = False) -> list[bytes]:
    """The wire pieces of an ``sse`` item list (control items are kept as objects).

    ``named``: each object goes out with an ``event: <its "type">`` line first, as the
    Anthropic Messages API sends them.
    """
    pieces: list[Any] = []
    for item in items:
        if isinstance(item, str):
            pieces.append(f"data: {item}\n\n".encode())
        elif any(key.startswith("$") for key in item):
            pieces.append(item)
        else:
            text = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
            event = f"event: {item['type']}\n" if named else ""
            pieces.append(f"{event}data: {text}\n\n".encode())
    return pieces


def _burst(pieces: list[Any]) -> bytes:
    if not all(isinstance(piece, bytes) for piece in pieces):
        raise ValueError("a burst body cannot hold control items")
    wire = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return wire + b"0\r\n\r\n"


@attrs.frozen
class Recorded:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    owner: OpenAIServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle's algorithm
        # meets the client's delayed ACK and every response waits ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        headers = {k.lower(): v for k, v in self.headers.items()}
        with owner.lock:
            recorded = Recorded(self.path, headers, body)
            owner.requests.append(recorded)
            exchange = owner.next_exchange(recorded)
        if exchange is None:
            self._json(500, {"error": {"message": "no exchange scripted"}}, {})
            return
        if exchange.get("stall"):
            owner.stopping.wait(30)
            self.close_connection = True
            return
        status = int(exchange.get("status", 200))
        headers_out = dict(exchange.get("headers", {}))
        if "sse" in exchange:
            self._sse(status, headers_out, exchange)
        else:
            self._json(status, exchange.get("json"), headers_out)

    def _json(self, status: int, body: Any, headers: dict[str, str]) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, status: int, headers: dict[str, str], exchange: dict[str, Any]) -> None:
        pieces = exchange.get("_pieces")
        if pieces is None:
            pieces = sse_body(exchange["sse"], named=exchange.get("named_events", False))
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self._write_pieces(exchange, pieces)
        except (BrokenPipeError, ConnectionResetError):
            # The client closed the connection while the stream was still being
            # written (a cancellation that came before the hold, on a loaded box).
            self.server.owner.closed_by_client.set()
            self.close_connection = True

    def _write_pieces(self, exchange: dict[str, Any], pieces: Any) -> None:
        out = self.wfile
        wire = exchange.get("_wire")
        if wire is None and exchange.get("burst"):
            wire = _burst(pieces)
        if wire is not None:
            out.write(wire)
            return
        for piece in pieces:
            if isinstance(piece, bytes):
                out.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                continue
            if "$raw" in piece:
                data = piece["$raw"].encode()
                out.write(b"%x\r\n%s\r\n" % (len(data), data))
            elif "$drop" in piece:
                out.write(b'40\r\ndata: {"id":')  # half a chunk, then the end
                out.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            elif "$hold" in piece:
                out.flush()
                self._wait_for_close()
                self.close_connection = True
                return
        out.write(b"0\r\n\r\n")

    def _wait_for_close(self) -> None:
        owner = self.server.owner
        self.connection.settimeout(10)
        try:
            data = self.connection.recv(1)
        except (ConnectionError, OSError):
            data = b""
        if data == b"":
            owner.closed_by_client.set()


class OpenAIServer:
    """The loopback server; use as a context manager (``with OpenAIServer() as s``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: deque[dict[str, Any]] = deque()
        self.default: dict[str, Any] | None = None
        self.requests: list[Recorded] = []
        self.closed_by_client = threading.Event()
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *exchanges: dict[str, Any]) -> None:
        """Queue exchanges, answered in order."""
        with self.lock:
            self.queue.extend(exchanges)

    def next_exchange(self, recorded: Recorded) -> dict[str, Any] | None:
        """The exchange answering ``recorded`` (called with ``lock`` held): the next
        scripted one, else ``default``. A subclass may make its answers itself."""
        return self.queue.popleft() if self.queue else self.default

    def serve_repeatedly(self, exchange: dict[str, Any]) -> None:
        """Answer every request not otherwise scripted with ``exchange`` (pre-encoded)."""
        if "sse" in exchange:
            pieces = sse_body(exchange["sse"], named=exchange.get("named_events", False))
            exchange = {**exchange, "_pieces": pieces}
            if exchange.get("burst"):
                exchange["_wire"] = _burst(pieces)
        self.default = exchange

    def bodies(self) -> list[Any]:
        with self.lock:
            return [r.body for r in self.requests]

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __iter__(self) -> Iterator[Recorded]:
        return iter(list(self.requests))

    def check_requests(self) -> None:
        """Validate every request body received with the official SDK's request types
        (``check_request_body``); the tests' ``server`` fixtures call it at the end."""
        for recorded in self.requests:
            check_request_body(recorded.body)


def _consume(value: Any) -> Any:
    # pydantic validates Iterable[...] fields lazily: walk everything so each item is
    # validated now.
    if isinstance(value, dict):
        return {key: _consume(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_consume(item) for item in value]
    if hasattr(value, "__next__"):
        return [_consume(item) for item in value]
    return value


_VALIDATORS: dict[tuple[Callable[[bool], Any], bool], Any] = {}


def validate_body(body: dict[str, Any], params: Callable[[bool], Any]) -> None:
    """Validate a request body with an SDK's request TypedDict, ``params(streaming)``.

    Unknown fields are refused at every level (``extra="forbid"`` reaches the nested
    TypedDicts), and lazily validated iterables are consumed. Raises pydantic's
    ``ValidationError`` for an invalid body.
    """
    streaming = bool(body.get("stream"))
    wrapper = _VALIDATORS.get((params, streaming))
    if wrapper is None:
        from pydantic import BaseModel, ConfigDict

        target = params(streaming)

        class Wrapper(BaseModel):
            model_config = ConfigDict(extra="forbid")
            body: target  # type: ignore[valid-type]

        wrapper = _VALIDATORS[params, streaming] = Wrapper
    _consume(wrapper(body=body).body)


def _openai_params(streaming: bool) -> Any:
    from openai.types.chat import completion_create_params as params

    if streaming:
        return params.CompletionCreateParamsStreaming
    return params.CompletionCreateParamsNonStreaming


def check_request_body(body: Any) -> None:
    """Validate a request body with the official ``openai`` package's request types
    (``validate_body``).

    The state compatible servers attach (DESIGN §7e), which the SDK's types do not
    list, is checked here by hand and removed before they see the body: an assistant
    message's ``reasoning_content`` (a string, only beside ``tool_calls``) and
    ``reasoning_details`` (an array of objects), a tool call's ``extra_content`` (an
    object).
    """
    assert isinstance(body, dict), f"request body is not a JSON object: {body!r}"
    messages = body.get("messages")
    if isinstance(messages, list):
        body = {**body, "messages": [_without_state(message) for message in messages]}
    validate_body(body, _openai_params)


def _without_state(message: Any) -> Any:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return message
    message = dict(message)
    reasoning = message.pop("reasoning_content", None)
    if reasoning is not None:
        assert isinstance(reasoning, str) and reasoning, reasoning
        assert message.get("tool_calls"), "reasoning_content is only sent beside tool calls"
    details = message.pop("reasoning_details", None)
    if details is not None:
        assert isinstance(details, list) and all(isinstance(d, dict) for d in details), details
        assert reasoning is None, "reasoning_details and reasoning_content are never both sent"
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        stripped = []
        for call in calls:
            call = dict(call)
            extra = call.pop("extra_content", None)
            assert extra is None or isinstance(extra, dict), extra
            stripped.append(call)
        message["tool_calls"] = stripped
    return message


def check_completion(body: Any) -> None:
    """Parse a ``chat.completion`` body with the official ``openai`` package's model."""
    from openai.types.chat import ChatCompletion

    ChatCompletion.model_validate(body)


def check_chunk(body: Any) -> None:
    """Parse a ``chat.completion.chunk`` with the official ``openai`` package's model."""
    from openai.types.chat import ChatCompletionChunk

    ChatCompletionChunk.model_validate(body)
