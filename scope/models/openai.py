"""``OpenAIChatModel``: an OpenAI-compatible Chat Completions adapter (extra ``scope[openai]``).

One object is both a ``chat.Model`` (``await model.call(request)``) and a
``chat.Streamer`` (``model.stream(request)``) over ``POST {base_url}/chat/completions``,
so it reaches OpenAI and every server that speaks the same protocol (vLLM, Ollama,
llama.cpp, DeepSeek, Groq, OpenRouter, ...)::

    from scope.chat import Request, user_message
    from scope.models.openai import OpenAIChatModel

    async with OpenAIChatModel("gpt-4o-mini") as model:       # OPENAI_API_KEY from the env
        answer = await model.call(Request([user_message("Hi!")]))

Importing ``scope`` never imports this module; importing it imports httpx.

**Request mapping.** System messages keep role ``system``; user text and media become
content parts (image bytes as a ``data:`` URL and image URIs as ``image_url``; wav and
mp3 bytes as ``input_audio``; other bytes as a ``file`` with ``file_data``; every file
reference as a ``file`` with ``file_id``); assistant text and tool calls (arguments sent
verbatim) form an assistant message; each tool result becomes one ``tool`` message whose
content is ``ToolOutput.text()``. Reasoning parts in the history are **not sent back**
(the protocol has no field for them and DeepSeek-style servers refuse them); an assistant
text part marked ``{"openai/refusal": true}`` is sent back as ``refusal``. Tools become
``function`` tools whose ``parameters`` are the input schema, verbatim.

**Options** are ``default_options.resolve(request.options)``; the model is
``options.model`` or the constructor's ``model``. ``max_tokens`` is sent as
``max_completion_tokens``; temperature, top_p, stop, the penalties and reasoning_effort
keep their names; a JSON output format becomes ``response_format`` ``json_object`` and a
schema one ``json_schema`` (not strict: strict mode only accepts a subset of JSON Schema;
pass ``openai/response_format`` to choose it). Every extension ``openai/<field>`` is
written into the body as ``<field>`` last, so it can set any other body field (``seed``,
``parallel_tool_calls``, ``top_k`` for a server that knows it, ``max_tokens`` for one
that predates ``max_completion_tokens``, ...). Extensions of other namespaces are meant
for other providers and are ignored.

**Refused before any I/O** with ``UnsupportedOptionError`` (a ``ValueError``) — never
dropped silently: ``top_k`` (not in the protocol; ``openai/top_k`` passes it to servers
that accept it), media in a tool result, media in an assistant message, audio other than
wav/mp3, non-image media by URI, the extensions ``openai/messages``, ``openai/model``,
``openai/stream`` and ``openai/stream_options`` (the adapter owns those fields) and
``openai/n`` other than 1 (a ``Response`` has one choice). ``ToolResult.is_error`` has no
field in the protocol: say so in the tool's output text.

**Response mapping.** Text becomes a text part; ``refusal`` a text part with part
metadata ``{"openai/refusal": true}``; ``reasoning_content`` / ``reasoning`` (DeepSeek,
vLLM, Ollama, OpenRouter) a reasoning part before the text; ``tool_calls`` tool-call
parts with arguments verbatim (a call without an id gets ``call_<index>``); finish
reasons ``stop``, ``length``, ``tool_calls`` (and the legacy ``function_call``) and
``content_filter`` map to their ``FinishReason``, any other to ``other``; usage maps
``prompt_tokens_details.cached_tokens`` to ``cache_read_input_tokens`` and
``completion_tokens_details.reasoning_tokens`` to ``reasoning_tokens``; id and model are
kept, ``system_fingerprint`` and ``service_tier`` go to the response's extra metadata as
``openai/…``. Only choice 0 is read.

**Streaming** sends ``stream: true`` with ``stream_options: {"include_usage": true}``
and yields one valid ``ResponseAccumulator`` delta per server-sent event that carries
something: text and reasoning deltas, ``ToolCallDelta`` fragments that carry the id and
name of their ``index`` on every fragment, the finish reason, and the usage snapshot of
the final usage-only chunk. The stream ends at ``[DONE]`` (after reading the response to
its end, so the connection can be reused); a stream that ends without ``[DONE]`` is
accepted only after a finish reason.

**Errors.** HTTP failures become ``scope.errors`` provider errors, with ``status_code``,
the decoded ``body`` and ``request_id`` (the ``x-request-id`` header): 401/403
``AuthenticationError``; 429 ``RateLimitError`` (``retry_after`` from ``Retry-After``);
5xx ``ProviderServerError``; 400, 404, 422 **and every other 4xx** ``BadRequestError``
(``status_code`` says which); any other status ``ProviderError``. httpx timeouts become
``ProviderTimeoutError``, every other transport failure ``ProviderConnectionError``
(the httpx error is ``__cause__``). A body or stream event that breaks the protocol
(not JSON, wrong shapes) is ``InvalidResponseError``; an error object inside a 200 body
or stream is ``ProviderError``.

**Retries.** 429, 5xx and connection failures (including connect timeouts, but no other
timeout) are retried up to ``max_retries`` times with exponential backoff and jitter
(``retry_backoff * 2**n``, scaled by a random factor in [0.75, 1], at most
``retry_max_delay``), honouring ``Retry-After`` / ``retry-after-ms`` (seconds or an HTTP
date) when the server sends one. A ``Retry-After`` longer than ``retry_max_delay`` is not
waited for: the error is raised at once, its ``retry_after`` telling the caller when to
come back. A stream is never retried once its response has begun (status 200 received).
Waiting uses ``anyio.sleep``, so cancellation interrupts it and propagates untouched.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Final, final

import anyio
import httpx
import orjson

from scope import __version__
from scope.chat._request import Request
from scope.chat._response import Response
from scope.chat._tools import Options
from scope.errors import (
    AuthenticationError,
    BadRequestError,
    InvalidOptionsError,
    InvalidResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)
from scope.models._openai_wire import ChunkMapper, build_body, parse_completion
from scope.models._sse import SSEDecoder

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_TIMEOUT", "OpenAIChatModel"]

#: Where requests go unless ``base_url`` or ``OPENAI_BASE_URL`` says otherwise.
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"

#: The timeout of a client the model creates: 10 minutes overall, 5 seconds to connect.
DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=5.0)

_UNSET: Final[Any] = object()


@final
class OpenAIChatModel:
    """A ``chat.Model`` and ``chat.Streamer`` over OpenAI Chat Completions.

    ``model`` is used when the request's (resolved) options name none; it may be ``""``
    when every request names its model. ``api_key`` falls back to ``OPENAI_API_KEY``
    (no ``Authorization`` header is sent when neither is set, as local servers need
    none); ``base_url`` to ``OPENAI_BASE_URL``, then ``DEFAULT_BASE_URL``. ``headers``
    are added to every request (and may override the defaults). ``default_options`` lie
    under every request's options.

    ``http_client``: an ``httpx.AsyncClient`` to use; the model never closes a client it
    did not create. Without one the model creates its own on first use, with
    ``timeout`` (default ``DEFAULT_TIMEOUT``), and closes it in ``aclose()`` /
    ``async with``. ``timeout`` given together with ``http_client`` applies per request;
    left out, the client's own timeout applies.

    Retries: see the module docstring (``max_retries``, ``retry_backoff``,
    ``retry_max_delay``).

    ``provider_name`` (default ``"openai"``) names the service for tracing
    (``gen_ai.provider.name`` in ``scope.otel``): say ``"deepseek"``, ``"groq"``, ...
    when the base URL points at another OpenAI-compatible provider.

    Guarantees: requests are validated and mapped before any I/O (``InvalidRequestError``,
    ``UnsupportedOptionError``); the model keeps no reference to a request; concurrent
    calls and streams may share one model; nothing binds to an event loop at
    construction, so one model works under asyncio or trio (one at a time, as httpx).
    """

    __slots__ = (
        "_api_key",
        "_base_url",
        "_client",
        "_closed",
        "_default_options",
        "_headers",
        "_max_retries",
        "_model",
        "_owns_client",
        "_provider_name",
        "_retry_backoff",
        "_retry_max_delay",
        "_sleep",
        "_timeout",
        "_url",
    )

    def __init__(
        self,
        model: str = "",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        timeout: float | httpx.Timeout | None = _UNSET,
        max_retries: int = 2,
        default_options: Options | None = None,
        headers: Mapping[str, str] | None = None,
        retry_backoff: float = 0.5,
        retry_max_delay: float = 60.0,
        provider_name: str = "openai",
    ) -> None:
        if not isinstance(provider_name, str) or not provider_name.strip():
            raise InvalidOptionsError(
                f"provider_name must be a non-empty string, got {provider_name!r}"
            )
        if not isinstance(model, str) or model != model.strip():
            raise InvalidOptionsError(
                f"model must be a string without surrounding whitespace, got {model!r}"
            )
        if type(max_retries) is not int or max_retries < 0:
            raise InvalidOptionsError(
                f"max_retries must be a non-negative integer, got {max_retries!r}"
            )
        for name, value in (("retry_backoff", retry_backoff), ("retry_max_delay", retry_max_delay)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidOptionsError(f"{name} must be a finite number >= 0, got {value!r}")
        if default_options is not None and not isinstance(default_options, Options):
            raise InvalidOptionsError(
                f"default_options must be Options, got {type(default_options).__name__}"
            )
        if http_client is not None and not isinstance(http_client, httpx.AsyncClient):
            raise InvalidOptionsError(
                f"http_client must be an httpx.AsyncClient, got {type(http_client).__name__}"
            )
        base = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL") or ""
        base = (base or DEFAULT_BASE_URL).rstrip("/")
        try:
            url = httpx.URL(base + "/chat/completions")
        except httpx.InvalidURL as exc:
            raise InvalidOptionsError(f"base_url {base!r} is not a URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise InvalidOptionsError(f"base_url must be an http(s) URL, got {base!r}")
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        merged: dict[str, str] = {
            "Content-Type": "application/json",
            "User-Agent": f"scope/{__version__}",
        }
        if key:
            merged["Authorization"] = f"Bearer {key}"
        for header, header_value in (headers or {}).items():
            # Header names are case-insensitive: "authorization" replaces the default
            # "Authorization" rather than being sent beside it.
            for existing in [name for name in merged if name.lower() == header.lower()]:
                del merged[existing]
            merged[header] = header_value
        self._model = model
        self._provider_name = provider_name
        self._api_key = key
        self._base_url = base
        self._url = url
        self._headers = merged
        self._client = http_client
        self._owns_client = http_client is None
        self._closed = False
        if timeout is _UNSET:
            # With a given client and no timeout, _UNSET stays: the client's own applies
            # (None is a timeout too: "wait for ever").
            self._timeout: Any = DEFAULT_TIMEOUT if http_client is None else _UNSET
        else:
            self._timeout = httpx.Timeout(timeout) if http_client is None else timeout
        self._max_retries = max_retries
        self._default_options = default_options if default_options is not None else Options()
        self._retry_backoff = float(retry_backoff)
        self._retry_max_delay = float(retry_max_delay)
        # Replaceable in tests: how the model waits between attempts.
        self._sleep = anyio.sleep

    # ------------------------------------------------------------------ public API

    @property
    def model(self) -> str:
        """The model used when a request's options name none (may be ``""``)."""
        return self._model

    @property
    def provider_name(self) -> str:
        """Who serves the API (``"openai"`` unless given): what ``scope.otel`` reports as
        ``gen_ai.provider.name`` (e.g. ``"deepseek"``, ``"groq"`` for those servers)."""
        return self._provider_name

    @property
    def base_url(self) -> str:
        """The API root requests go to, without a trailing slash."""
        return self._base_url

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self._model!r}, base_url={self._base_url!r})"

    async def call(self, request: Request) -> Response:
        """Answer ``request`` with one complete response (``POST /chat/completions``).

        Raises before any I/O for an invalid or unsupported request; then the provider
        errors of the module docstring, after the retries. Cancellation propagates; the
        HTTP response is closed on every path.
        """
        content = self._encode(request, stream=False)
        response = await self._send(content, stream=False)
        try:
            return parse_completion(response.content)
        except ProviderError as exc:
            _fill_origin(exc, response)
            raise

    def stream(self, request: Request) -> AsyncIterator[Response]:
        """A lazy stream of deltas answering ``request``.

        Nothing happens until the first iteration; then the request is validated and
        mapped (raising before any I/O) and sent, with retries until the response
        begins. Each yielded ``Response`` is a valid ``ResponseAccumulator`` delta. A
        failure (a dropped connection: ``ProviderConnectionError``; a malformed event:
        ``InvalidResponseError``; an error event: ``ProviderError``) is raised once and
        ends the stream. ``aclose()`` — or leaving ``contextlib.aclosing`` early —
        closes the HTTP response (the connection is dropped, so the server stops
        generating) before it returns; nothing runs in the background.
        """
        return self._stream(request)

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it; idempotent.

        Afterwards ``call`` and ``stream`` raise ``RuntimeError``. A client passed in as
        ``http_client`` is left open.
        """
        self._closed = True
        client = self._client
        if self._owns_client and client is not None:
            self._client = None
            await client.aclose()

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals

    def _encode(self, request: Request, *, stream: bool) -> bytes:
        body = build_body(
            request, default_options=self._default_options, model=self._model, stream=stream
        )
        return orjson.dumps(body)

    def _get_client(self) -> httpx.AsyncClient:
        if self._closed:
            raise RuntimeError("OpenAIChatModel is closed")
        client = self._client
        if client is None:
            # Created on first use, not in __init__: nothing exists to leak or to bind to
            # an event loop until the model is used. No await: atomic within a thread.
            client = self._client = httpx.AsyncClient(timeout=self._timeout)
        return client

    def _backoff(self, retry: int) -> float:
        delay = self._retry_backoff * (2.0**retry) * random.uniform(0.75, 1.0)
        return min(delay, self._retry_max_delay)

    async def _send(self, content: bytes, *, stream: bool) -> httpx.Response:
        """POST ``content``; return a 2xx response (body read unless ``stream``).

        Retries as the module docstring says; raises the mapped provider error.
        """
        client = self._get_client()
        headers = dict(self._headers)
        headers["Accept"] = "text/event-stream" if stream else "application/json"
        timeout = httpx.USE_CLIENT_DEFAULT if self._timeout is _UNSET else self._timeout
        retry = 0
        while True:
            request = client.build_request(
                "POST", self._url, content=content, headers=headers, timeout=timeout
            )
            try:
                response = await client.send(request, stream=stream)
            except httpx.HTTPError as exc:
                error = _map_transport_error(exc)
                if retry >= self._max_retries or not _retryable_transport(exc):
                    raise error from exc
                delay = self._backoff(retry)
            else:
                if response.is_success:
                    return response
                if stream:
                    try:
                        error_body = await response.aread()
                    except httpx.HTTPError:
                        error_body = b""  # the status alone decides; the body is a courtesy
                    finally:
                        await _close(response)
                else:
                    error_body = response.content
                status_error = _map_status_error(response, error_body)
                retryable = response.status_code == 429 or response.status_code >= 500
                if retry >= self._max_retries or not retryable:
                    raise status_error
                hint = _retry_after(response.headers)
                if hint is not None and hint > self._retry_max_delay:
                    raise status_error
                delay = self._backoff(retry) if hint is None else hint
            retry += 1
            await self._sleep(delay)

    async def _stream(self, request: Request) -> AsyncGenerator[Response, None]:
        content = self._encode(request, stream=True)
        del request  # the model keeps no reference to it
        response = await self._send(content, stream=True)
        mapper = ChunkMapper()
        chunks: AsyncIterator[bytes] | None = None
        try:
            content_type = response.headers.get("content-type", "")
            if content_type.startswith("application/json"):
                # A server that ignored "stream": one complete response is a valid delta.
                try:
                    body = await response.aread()
                except httpx.HTTPError as exc:
                    raise _map_transport_error(exc) from exc
                try:
                    parsed = parse_completion(body)
                except ProviderError as exc:
                    _fill_origin(exc, response)
                    raise
                yield parsed
                return
            decoder = SSEDecoder()
            chunks = response.aiter_bytes()
            while True:
                try:
                    raw = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as exc:
                    raise _map_transport_error(exc) from exc
                for event, data in decoder.feed(raw):
                    try:
                        chunk = mapper.map(event, data)
                    except ProviderError as exc:
                        _fill_origin(exc, response)
                        raise
                    if chunk is not None:
                        yield chunk
            if not mapper.done and not mapper.finished:
                raise ProviderConnectionError(
                    "the stream ended before it finished (no finish_reason and no [DONE])",
                    status_code=response.status_code,
                    request_id=response.headers.get("x-request-id"),
                )
        finally:
            await _release(response, chunks)


async def _close(response: httpx.Response) -> None:
    # Shielded: an early stop or a cancellation must still close the connection before
    # the caller goes on, and closing a response does not wait on the network.
    with anyio.CancelScope(shield=True):
        await response.aclose()


async def _release(response: httpx.Response, chunks: AsyncIterator[bytes] | None) -> None:
    """Close ``response`` (dropping the connection unless the body was read to its end)
    and finish httpx's byte iterator.

    httpx's byte iterators are nested async generators, and ``aclose()`` on the outer
    one does not reach the inner ones (encode/httpx#3686): left to the garbage collector
    they make trio warn. Once the response is closed, pulling again makes every level
    fail (or end) at once, so each one finishes here. The pull only reads what was
    already buffered; the socket is closed. Shielded, like ``_close``.
    """
    with anyio.CancelScope(shield=True):
        await response.aclose()
        if chunks is None:
            return
        while True:
            try:
                await chunks.__anext__()
            except (StopAsyncIteration, httpx.HTTPError):
                return


def _retryable_transport(exc: httpx.HTTPError) -> bool:
    """Connection failures are retried; timeouts other than connecting are not."""
    if isinstance(exc, httpx.ConnectTimeout):
        return True
    return isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError)


def _map_transport_error(exc: httpx.HTTPError) -> ProviderError | InvalidResponseError:
    """The scope error for an httpx failure (the caller chains ``exc``).

    Timeouts: ``ProviderTimeoutError``; a body whose content encoding cannot be decoded:
    ``InvalidResponseError``; every other httpx error (network, protocol, proxy, an
    unsupported scheme, redirects): ``ProviderConnectionError``.
    """
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return ProviderTimeoutError(f"the provider did not answer in time ({message})")
    if isinstance(exc, httpx.DecodingError):
        return InvalidResponseError(f"the response body could not be decoded ({message})")
    status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
    return ProviderConnectionError(
        f"the connection to the provider failed ({message})", status_code=status
    )


def _map_status_error(response: httpx.Response, content: bytes) -> ProviderError:
    """The scope error for a non-2xx ``response`` whose body is ``content``."""
    status = response.status_code
    body: Any
    try:
        body = orjson.loads(content) if content else None
    except orjson.JSONDecodeError:
        body = content.decode("utf-8", "replace")
    detail = _detail(body)
    request_id = response.headers.get("x-request-id")
    message = f"the provider answered {status} {response.reason_phrase}".rstrip()
    if detail:
        message += f": {detail}"
    if request_id:
        message += f" (request id {request_id})"
    kwargs: dict[str, Any] = {"status_code": status, "body": body, "request_id": request_id}
    if status == 429:
        return RateLimitError(message, retry_after=_retry_after(response.headers), **kwargs)
    if status in (401, 403):
        return AuthenticationError(message, **kwargs)
    if 400 <= status < 500:
        return BadRequestError(message, **kwargs)
    if status >= 500:
        return ProviderServerError(message, **kwargs)
    return ProviderError(message, **kwargs)


def _detail(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, str):
        return body[:500]
    return ""


def _retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": a date in UTC without a stated zone
        when = when.replace(tzinfo=datetime.UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _fill_origin(exc: ProviderError, response: httpx.Response) -> None:
    """Give an error object the server sent inside a 200 body or stream the HTTP
    response's status and request id."""
    if exc.status_code is None:
        exc.status_code = response.status_code
    if exc.request_id is None:
        exc.request_id = response.headers.get("x-request-id")
