"""HTTP plumbing shared by the provider adapters: the client's life cycle, retries and the
mapping of HTTP failures to ``scope.errors`` provider errors.

Importing this module imports httpx; only the adapter modules (``scope.models.openai``,
``scope.models.anthropic``) import it.

The policy, identical for every adapter (each module docstring repeats it for its users):

- **Errors.** 401/403 ``AuthenticationError``; 429 ``RateLimitError`` (``retry_after``);
  5xx ``ProviderServerError``; every other 4xx ``BadRequestError``; any other status
  ``ProviderError``. httpx timeouts become ``ProviderTimeoutError``, a body whose content
  encoding cannot be decoded ``InvalidResponseError``, every other transport failure
  ``ProviderConnectionError`` (the httpx error is ``__cause__``).
- **Retries.** 429, 5xx and connection failures (connect timeouts included, no other
  timeout) are retried up to ``max_retries`` times with exponential backoff and jitter,
  honouring ``retry-after-ms`` / ``Retry-After``; a hint longer than ``retry_max_delay``
  is not waited for (the error is raised at once). Nothing is retried once a response
  has begun (a 2xx status received).
"""

from __future__ import annotations

import datetime
import email.utils
import math
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Final, NamedTuple, Protocol, Self

import anyio
import attrs
import httpx
import orjson

from scope import __version__
from scope._validate import check_name, check_seconds, check_text, check_type
from scope.chat import Options, Request, Response
from scope.errors import (
    InvalidOptionsError,
    InvalidResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
)
from scope.models._errors import error_for_status
from scope.models._provenance import DROPPED_KEY, Replay, with_dropped
from scope.models._sse import SSEDecoder

__all__ = [
    "UNSET",
    "HTTPAdapter",
    "StreamMapper",
    "Wire",
    "close",
    "detail",
    "fill_origin",
    "map_status_error",
    "map_transport_error",
    "release",
    "retry_after",
    "retryable_transport",
]

#: "Not given" for ``timeout`` (``None`` is a timeout too: "wait for ever").
UNSET: Final[Any] = object()

#: The first byte of a JSON body (an event stream's first line starts otherwise).
_JSON_START: Final = (b"{", b"[")


class Wire(NamedTuple):
    """What an adapter subclass tells ``HTTPAdapter`` about its provider (``_WIRE``)."""

    #: The adapter's class name, for messages.
    name: str
    #: The endpoint, appended to the base URL (``"/chat/completions"``).
    path: str
    #: The environment variable prefix: ``<env>_BASE_URL`` and ``<env>_API_KEY``.
    env: str
    default_base_url: str
    default_timeout: httpx.Timeout
    #: The response header that carries the provider's request id.
    request_id_header: str
    #: The provider's own headers (version, authentication) for an API key (maybe ``""``).
    headers: Callable[[str], dict[str, str]]
    #: The wire mapping: ``build_body(request, default_options=, model=, stream=)``.
    build_body: Callable[..., dict[str, Any]]
    #: A complete JSON answer (or a stream answered with JSON) -> ``Response``.
    parse: Callable[[bytes], Response]
    #: A fresh mapper for the events of one stream.
    mapper: Callable[[], StreamMapper]
    #: What the stream lacked when it ended early (for ``ProviderConnectionError``).
    unfinished: str
    #: The wire protocol, stamped on every answer as ``scope/api`` (``"openai.chat"``).
    api: str
    #: The default ``provider_name``, stamped as ``scope/provider`` (``"openai"``).
    provider: str
    #: The path (and query) for the chosen model and the stream flag, for a provider
    #: whose endpoint depends on them (Gemini's ``/v1beta/models/{model}:...``); when
    #: ``None``, every request goes to ``path``.
    route: Callable[[str, bool], str] | None = None
    #: Refines the error ``map_status_error`` made of a non-2xx answer from its body
    #: (``error.body``): another class for a reason the status hides, a ``retry_after``
    #: the body states. ``None``: the status decides alone.
    refine_error: Callable[[ProviderError], ProviderError] | None = None


class HTTPAdapter:
    """The part of an adapter that owns its settings and the HTTP client and sends with
    retries.

    Subclasses set ``_WIRE`` (a ``Wire``) and add only their own constructor arguments
    (``_body_options`` passes them to the wire's ``build_body``): ``call``, ``stream``
    and the properties are defined here, once. Nothing is created before first use, so
    nothing binds to an event loop at construction.
    """

    __slots__ = (
        "_base_url",
        "_client",
        "_closed",
        "_default_options",
        "_headers",
        "_max_retries",
        "_model",
        "_owns_client",
        "_provider_account",
        "_provider_name",
        "_retry_backoff",
        "_retry_max_delay",
        "_sleep",
        "_timeout",
        "_url",
    )

    _WIRE: ClassVar[Wire]

    def __init__(
        self,
        model: str = "",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        timeout: float | httpx.Timeout | None = UNSET,
        max_retries: int = 2,
        default_options: Options | None = None,
        headers: Mapping[str, str] | None = None,
        retry_backoff: float = 0.5,
        retry_max_delay: float = 60.0,
        provider_name: str | None = None,
        provider_account: str | None = None,
    ) -> None:
        """Validate and keep the settings every adapter takes (see the adapter's class
        docstring): ``TypeError`` for an argument of the wrong type,
        ``InvalidOptionsError`` for a bad value (the policy of ``scope.errors``). Nothing
        is created yet."""
        wire = self._WIRE
        where = wire.name
        check_type(model, str, f"{where} model", "a string")
        if model != model.strip():
            raise InvalidOptionsError(
                f"{where} model must not have surrounding whitespace, got {model!r}"
            )
        _check_retries(where, max_retries, retry_backoff, retry_max_delay)
        if timeout is not UNSET and timeout is not None and not isinstance(timeout, httpx.Timeout):
            check_seconds(timeout, f"{where} timeout", positive=True, error=InvalidOptionsError)
        if http_client is not None:
            check_type(
                http_client, httpx.AsyncClient, f"{where} http_client", "an httpx.AsyncClient"
            )
        if default_options is not None:
            check_type(default_options, Options, f"{where} default_options", "scope.chat.Options")
        base = base_url if base_url is not None else os.environ.get(f"{wire.env}_BASE_URL") or ""
        base = (base or wire.default_base_url).rstrip("/")
        url = _parse_url(base, wire.path)
        key = api_key if api_key is not None else os.environ.get(f"{wire.env}_API_KEY", "")
        defaults = {"Content-Type": "application/json", "User-Agent": f"scope/{__version__}"}
        defaults.update(wire.headers(key))
        self._model = model
        self._base_url = base
        self._default_options = default_options if default_options is not None else Options()
        self._url = url
        self._headers = _merge_headers(defaults, headers)
        self._client = http_client
        self._owns_client = http_client is None
        self._closed = False
        if timeout is UNSET:
            # With a given client and no timeout, UNSET stays: the client's own applies.
            self._timeout: Any = wire.default_timeout if http_client is None else UNSET
        else:
            self._timeout = httpx.Timeout(timeout) if http_client is None else timeout
        self._max_retries = max_retries
        self._retry_backoff = float(retry_backoff)
        self._retry_max_delay = float(retry_max_delay)
        if provider_name is not None:
            check_name(provider_name, f"{wire.name} provider_name")
        self._provider_name = wire.provider if provider_name is None else provider_name
        if provider_account is not None:
            check_type(provider_account, str, f"{where} provider_account", "a string")
            check_text(
                provider_account,
                f"{where} provider_account",
                InvalidOptionsError,
                required=True,
                strip=True,
            )
        self._provider_account = provider_account
        # Replaceable in tests: how the adapter waits between attempts.
        self._sleep = anyio.sleep

    def __repr__(self) -> str:
        return f"{self._WIRE.name}(model={self._model!r}, base_url={self._base_url!r})"

    @property
    def model(self) -> str:
        """The model used when a request's options name none (may be ``""``)."""
        return self._model

    @property
    def base_url(self) -> str:
        """The root requests go to (the ``base_url`` setting, else the environment's or
        the adapter's default), without a trailing slash."""
        return self._base_url

    @property
    def provider_name(self) -> str:
        """Who serves the API: what ``scope.otel`` reports as ``gen_ai.provider.name``
        and what the answers' provenance (``scope/provider``) says (the adapter's default
        unless ``provider_name`` was given: ``"deepseek"``, ``"groq"``...)."""
        return self._provider_name

    @property
    def provider_account(self) -> str | None:
        """The account (organisation, project) the adapter's key belongs to, as the
        ``provider_account`` setting named it, or None. Stamped on every answer as
        ``scope/account``: a message stamped with another account is foreign, so its
        provider state (signatures, encrypted reasoning), which only that account can
        verify, is never sent. Never derived from the API key."""
        return self._provider_account

    async def aclose(self) -> None:
        """Close the HTTP client if this adapter created it; idempotent.

        Afterwards ``call`` and ``stream`` raise ``RuntimeError``. A client passed in as
        ``http_client`` is left open.
        """
        self._closed = True
        client = self._client
        if self._owns_client and client is not None:
            self._client = None
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _get_client(self) -> httpx.AsyncClient:
        if self._closed:
            raise RuntimeError(f"{self._WIRE.name} is closed")
        client = self._client
        if client is None:
            # Created on first use, not in __init__: nothing exists to leak or to bind to
            # an event loop until the adapter is used. No await: atomic within a thread.
            client = self._client = httpx.AsyncClient(timeout=self._timeout)
        return client

    def _backoff(self, retry: int) -> float:
        delay = self._retry_backoff * (2.0**retry) * random.uniform(0.75, 1.0)
        return min(delay, self._retry_max_delay)

    def _request_id(self, response: httpx.Response) -> str | None:
        value: str | None = response.headers.get(self._WIRE.request_id_header)
        return value

    async def _send(
        self, content: bytes, *, stream: bool, url: httpx.URL | None = None
    ) -> httpx.Response:
        """POST ``content`` to ``url`` (default: the adapter's one URL); return a 2xx
        response (body read unless ``stream``).

        Retries as the module docstring says; raises the mapped provider error.
        """
        client = self._get_client()
        target = self._url if url is None else url
        headers = dict(self._headers)
        headers["Accept"] = "text/event-stream" if stream else "application/json"
        timeout = httpx.USE_CLIENT_DEFAULT if self._timeout is UNSET else self._timeout
        retry = 0
        while True:
            request = client.build_request(
                "POST", target, content=content, headers=headers, timeout=timeout
            )
            try:
                response = await client.send(request, stream=stream)
            except httpx.HTTPError as exc:
                error = map_transport_error(exc)
                if retry >= self._max_retries or not retryable_transport(exc):
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
                        await close(response)
                else:
                    error_body = response.content
                status_error = map_status_error(
                    response, error_body, request_id=self._request_id(response)
                )
                if self._WIRE.refine_error is not None:
                    status_error = self._WIRE.refine_error(status_error)
                retryable = response.status_code == 429 or response.status_code >= 500
                if retry >= self._max_retries or not retryable:
                    raise status_error
                hint = retry_after(response.headers)
                if hint is None and isinstance(status_error, RateLimitError):
                    hint = status_error.retry_after  # a delay the body states
                if hint is not None and hint > self._retry_max_delay:
                    raise status_error
                delay = self._backoff(retry) if hint is None else hint
            retry += 1
            await self._sleep(delay)

    def _fill_origin(self, exc: ProviderError, response: httpx.Response) -> None:
        fill_origin(exc, response, self._request_id(response))

    def _encode(
        self, request: Request, *, stream: bool, options: dict[str, Any]
    ) -> tuple[bytes, Replay, httpx.URL | None]:
        """The body for ``request`` (``options``: what ``_body_options`` said when the
        request was made), the ``Replay`` that decided whose state it carries (its
        ``model`` the model asked for, its ``left_out`` what it does not), and the URL it
        goes to (``None``: the adapter's one URL; a ``Wire.route`` makes it from the
        chosen model and ``stream``)."""
        wire = self._WIRE
        replay = Replay(wire.api, self._provider_name, account=self._provider_account)
        body = wire.build_body(
            request,
            default_options=self._default_options,
            model=self._model,
            stream=stream,
            replay=replay,
            **options,
        )
        url = None
        if wire.route is not None:
            # The model the body was built for (build_body set it on the replay).
            url = httpx.URL(self._base_url + wire.route(replay.model, stream))
        return orjson.dumps(body), replay, url

    def _body_options(self) -> dict[str, Any]:
        """What the adapter's own settings add to its ``build_body`` call, as keywords.
        Read when the request is made (on ``call``, and in ``stream()`` itself, before
        the stream runs), so what it reads from the context (the conversation the
        history Middleware serves) is the caller's."""
        return {}

    def _stamped(self, response: Response, replay: Replay, dropped: int) -> Response:
        """``response`` with its message's provenance (DESIGN §6c, §6g: ``Replay.stamp``)
        and the count of parts left out, if any."""
        output = response.output
        if output is not None and output.message is not None:
            answered = response.metadata.model if response.metadata is not None else ""
            message = replay.stamp(output.message, answered)
            response = attrs.evolve(response, output=attrs.evolve(output, message=message))
        return with_dropped(response, dropped) if dropped else response

    def _parse(self, body: bytes, response: httpx.Response) -> Response:
        """``Wire.parse`` of a whole body; an error it raises gets the response's origin."""
        try:
            return self._WIRE.parse(body)
        except ProviderError as exc:
            self._fill_origin(exc, response)
            raise

    # ------------------------------------------------------------------ public API

    async def call(self, request: Request) -> Response:
        """Answer ``request`` with one complete response (one ``POST`` to the endpoint
        the module docstring names).

        Raises before any I/O for an invalid or unsupported request
        (``InvalidRequestError``, ``UnsupportedOptionError``); then the provider errors
        of the module docstring, after the retries. The answer's message carries its
        provenance (``scope/api``, ``scope/provider``, ``scope/model``). Cancellation
        propagates; the HTTP response is closed on every path.
        """
        content, replay, url = self._encode(request, stream=False, options=self._body_options())
        dropped = replay.report(self._WIRE.name)
        response = await self._send(content, stream=False, url=url)
        return self._stamped(self._parse(response.content, response), replay, dropped)

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        """A lazy stream of deltas answering ``request`` (``stream: true``, or the
        provider's streaming endpoint).

        Nothing happens until the first iteration; then the request is validated and
        mapped (raising before any I/O) and sent, with retries until the response
        begins. Each yielded ``Response`` is a valid ``ResponseAccumulator`` delta; the
        first one carrying a message carries its provenance. A JSON body (a server that
        ignored ``stream``, or an error answered as JSON under an event-stream content
        type) is parsed whole and yielded as one delta. A failure (a dropped connection,
        or a stream that ends before its end marker or a finish reason:
        ``ProviderConnectionError``; a malformed event: ``InvalidResponseError``; an
        error event: the ``ProviderError`` it states) is raised once and ends the
        stream. ``aclose()`` — or leaving ``contextlib.aclosing`` early — closes the
        HTTP response (the connection is dropped, so the server stops generating)
        before it returns; nothing runs in the background, and the request is not kept
        once encoded.
        """
        return self._stream(request, self._body_options())

    async def _stream(
        self, request: Request, options: dict[str, Any]
    ) -> AsyncGenerator[Response, None]:
        wire = self._WIRE
        content, replay, url = self._encode(request, stream=True, options=options)
        del request
        dropped = local = replay.report(wire.name)
        mapper = wire.mapper()
        response = await self._send(content, stream=True, url=url)
        chunks: AsyncIterator[bytes] | None = None
        # Until the first message is stamped: the model the stream named so far.
        unstamped = True
        answered = ""
        try:
            content_type = response.headers.get("content-type", "")
            if content_type.startswith("application/json"):
                # A server that ignored "stream": one complete response is a valid delta.
                try:
                    body = await response.aread()
                except httpx.HTTPError as exc:
                    raise map_transport_error(exc) from exc
                yield self._stamped(self._parse(body, response), replay, dropped)
                return
            decoder = SSEDecoder()
            chunks = response.aiter_bytes()
            first = True
            while True:
                try:
                    raw = await chunks.__anext__()
                    if first and raw.lstrip()[:1] in _JSON_START:
                        # JSON under an event-stream type (Gemini answers errors so):
                        # no event stream starts with "{" or "[".
                        body = raw + b"".join([rest async for rest in chunks])
                        yield self._stamped(self._parse(body, response), replay, dropped)
                        return
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as exc:
                    raise map_transport_error(exc) from exc
                first = False
                for event, data in decoder.feed(raw):
                    try:
                        chunk = mapper.map(event, data)
                    except ProviderError as exc:
                        self._fill_origin(exc, response)
                        raise
                    if chunk is None:
                        continue
                    if unstamped:
                        # The first delta carries the count of parts left out, and the
                        # first message the provenance: the accumulator merges message
                        # metadata per key, so once is enough.
                        metadata = chunk.metadata
                        if metadata is not None and metadata.model:
                            answered = metadata.model
                        output = chunk.output
                        if output is not None and output.message is not None:
                            unstamped = False
                            message = replay.stamp(output.message, answered)
                            output = attrs.evolve(output, message=message)
                            chunk = attrs.evolve(chunk, output=output)
                    if dropped:
                        chunk = with_dropped(chunk, dropped)
                        dropped = 0
                    elif (
                        local and chunk.metadata is not None and DROPPED_KEY in chunk.metadata.extra
                    ):
                        # A later count of the parts the provider dropped replaces the
                        # first one (the accumulator keeps the last): it gets ours too.
                        chunk = with_dropped(chunk, local)
                    yield chunk
            if not mapper.end_marker_seen and not mapper.finish_reason_seen:
                raise ProviderConnectionError(
                    f"the stream ended before it finished ({wire.unfinished})",
                    status_code=response.status_code,
                    request_id=self._request_id(response),
                )
        finally:
            await release(response, chunks)


class StreamMapper(Protocol):
    """What ``HTTPAdapter.stream`` needs of a provider's event mapper:
    ``end_marker_seen`` (the provider's end-of-stream event arrived: ``[DONE]``,
    ``message_stop``) and ``finish_reason_seen`` (a finish or stop reason did)."""

    end_marker_seen: bool
    finish_reason_seen: bool

    def map(self, event: str, data: bytes) -> Response | None:
        """The delta for one server-sent event, or None for one that carries none."""
        ...


async def close(response: httpx.Response) -> None:
    """Close ``response``, shielded: an early stop or a cancellation must still close the
    connection before the caller goes on, and closing does not wait on the network."""
    with anyio.CancelScope(shield=True):
        await response.aclose()


async def release(response: httpx.Response, chunks: AsyncIterator[bytes] | None) -> None:
    """Close ``response`` (dropping the connection unless the body was read to its end)
    and finish httpx's byte iterator.

    httpx's byte iterators are nested async generators, and ``aclose()`` on the outer
    one does not reach the inner ones (encode/httpx#3686): left to the garbage collector
    they make trio warn. Once the response is closed, pulling again makes every level
    fail (or end) at once, so each one finishes here. The pull only reads what was
    already buffered; the socket is closed. Shielded, like ``close``.
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


def retryable_transport(exc: httpx.HTTPError) -> bool:
    """Connection failures are retried; timeouts other than connecting are not."""
    if isinstance(exc, httpx.ConnectTimeout):
        return True
    return isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError)


def map_transport_error(exc: httpx.HTTPError) -> ProviderError | InvalidResponseError:
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


def map_status_error(
    response: httpx.Response, content: bytes, *, request_id: str | None
) -> ProviderError:
    """The scope error for a non-2xx ``response`` whose body is ``content``."""
    status = response.status_code
    body: Any
    try:
        body = orjson.loads(content) if content else None
    except orjson.JSONDecodeError:
        body = content.decode("utf-8", "replace")
    text = detail(body)
    message = f"the provider answered {status} {response.reason_phrase}".rstrip()
    if text:
        message += f": {text}"
    if request_id:
        message += f" (request id {request_id})"
    return error_for_status(
        status,
        message,
        body=body,
        request_id=request_id,
        retry_after=retry_after(response.headers) if status == 429 else None,
    )


def detail(body: Any) -> str:
    """The human message of an error body (OpenAI and Anthropic shapes), or ``""``."""
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


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
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


def fill_origin(exc: ProviderError, response: httpx.Response, request_id: str | None) -> None:
    """Give an error the server sent inside a 200 body or stream the HTTP response's
    status (unless the error named its own) and request id."""
    if exc.status_code is None:
        exc.status_code = response.status_code
    if exc.request_id is None:
        exc.request_id = request_id


def _check_retries(
    where: str, max_retries: object, retry_backoff: object, retry_max_delay: object
) -> None:
    check_type(max_retries, int, f"{where} max_retries", "an integer")
    assert isinstance(max_retries, int)
    if max_retries < 0:
        raise InvalidOptionsError(f"{where} max_retries must be >= 0, got {max_retries!r}")
    check_seconds(retry_backoff, f"{where} retry_backoff", error=InvalidOptionsError)
    check_seconds(retry_max_delay, f"{where} retry_max_delay", error=InvalidOptionsError)


def _parse_url(base: str, path: str) -> httpx.URL:
    """``base + path`` as an http(s) URL, or ``InvalidOptionsError``."""
    try:
        url = httpx.URL(base + path)
    except httpx.InvalidURL as exc:
        raise InvalidOptionsError(f"base_url {base!r} is not a URL: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidOptionsError(f"base_url must be an http(s) URL, got {base!r}")
    return url


def _merge_headers(defaults: dict[str, str], extra: Mapping[str, str] | None) -> dict[str, str]:
    """``defaults`` overridden by ``extra``; header names compare case-insensitively
    ("authorization" replaces "Authorization" rather than being sent beside it)."""
    merged = dict(defaults)
    for header, value in (extra or {}).items():
        for existing in [name for name in merged if name.lower() == header.lower()]:
            del merged[existing]
        merged[header] = value
    return merged
