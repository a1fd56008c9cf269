"""What the provider adapters share (scope.models._http.HTTPAdapter): the constructor,
retries and Retry-After, error status mapping, connection errors and timeouts, the HTTP
client's life, headers, cancellation and early stream close.

Each test runs for every adapter (tests.helpers.PROVIDERS) against its loopback server
(tests/openai_server.py, tests/anthropic_server.py, tests/gemini_server.py,
tests/responses_server.py), under asyncio and trio; the few values that differ by provider
come from the provider's entry. What one adapter alone does is tested in
test_openai_http.py / test_anthropic_http.py / test_gemini.py / test_openai_responses.py.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import anyio
import httpx
import pytest

from scope.chat import (
    Message,
    Model,
    Options,
    Request,
    Response,
    Streamer,
    collect,
    user_message,
)
from scope.errors import (
    AuthenticationError,
    BadRequestError,
    InvalidOptionsError,
    InvalidRequestError,
    InvalidResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    UnsupportedOptionError,
)
from scope.models import _http
from tests.helpers import PROVIDERS, Provider, accumulate, answer, hello, recording_sleeps
from tests.openai_server import OpenAIServer

MODES = ["call", "stream"]
HI = Request([user_message("Hi")])


@pytest.fixture(params=PROVIDERS, ids=str)
def provider(request: pytest.FixtureRequest) -> Provider:
    chosen: Provider = request.param
    return chosen


@pytest.fixture
def server(provider: Provider) -> Iterator[OpenAIServer]:
    with provider.serve() as srv:
        yield srv


def test_the_model_is_a_model_and_a_streamer(provider: Provider) -> None:
    model = provider.model_class(provider.model, api_key="k")
    assert isinstance(model, Model) and isinstance(model, Streamer)
    assert provider.model_class.__module__ == provider.module
    assert model.base_url == provider.default_base_url
    assert repr(model) == (
        f"{provider.model_class.__name__}(model={provider.model!r},"
        f" base_url={provider.default_base_url!r})"
    )


def test_call_and_stream_are_defined_once_in_the_base(provider: Provider) -> None:
    # One definition (one docstring) for every adapter: an adapter adds only its own
    # constructor arguments, never a copy of the request path.
    for name in ("call", "stream", "aclose", "model", "base_url", "provider_name"):
        assert name not in vars(provider.model_class), name
        assert (getattr(_http.HTTPAdapter, name).__doc__ or "").strip(), name


# ------------------------------------------------------------------------- constructor


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": " gpt"}, "model must not have surrounding whitespace"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a finite number"),
        ({"retry_max_delay": -1}, "retry_max_delay must be a finite number"),
        ({"retry_backoff": 10**400}, "retry_backoff must be a finite number"),
        ({"timeout": -1}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": float("inf")}, "timeout must be a finite number of seconds > 0"),
        ({"base_url": "ftp://example.com/v1"}, "base_url must be an http\\(s\\) URL"),
        ({"base_url": "not a url"}, "base_url"),
        ({"base_url": "http://[::1"}, "is not a URL"),
        ({"provider_account": ""}, "provider_account must not be empty"),
        ({"provider_account": " org-a"}, "provider_account must not have surrounding whitespace"),
        ({"provider_account": "org-a\n"}, "provider_account must not have surrounding whitespace"),
        ({"provider_account": "org-\ud800"}, "provider_account is not valid Unicode"),
    ],
)
def test_constructor_values_are_checked(
    provider: Provider, kwargs: dict[str, Any], match: str
) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by both providers' runs
    model = kwargs.pop("model", provider.model)
    with pytest.raises(InvalidOptionsError, match=match):
        provider.model_class(model, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": 5}, "model must be a string, got int"),
        ({"max_retries": True}, "max_retries must be an integer, got bool"),
        ({"max_retries": 2.0}, "max_retries must be an integer, got float"),
        ({"retry_backoff": "1"}, "retry_backoff must be a number of seconds, got str"),
        ({"timeout": "x"}, "timeout must be a number of seconds, got str"),
        ({"timeout": True}, "timeout must be a number of seconds, got bool"),
        ({"default_options": {"temperature": 1}}, "default_options must be scope.chat.Options"),
        ({"http_client": object()}, "http_client must be an httpx.AsyncClient, got object"),
        ({"provider_account": 42}, "provider_account must be a string, got int"),
        ({"provider_account": b"org-a"}, "provider_account must be a string, got bytes"),
    ],
)
def test_constructor_argument_types_are_checked(
    provider: Provider, kwargs: dict[str, Any], match: str
) -> None:
    kwargs = dict(kwargs)
    model = kwargs.pop("model", provider.model)
    with pytest.raises(TypeError, match=f"{provider.model_class.__name__} {match}") as info:
        provider.model_class(model, **kwargs)
    assert not isinstance(info.value, ValueError)


def test_provider_account_is_kept_as_given(provider: Provider) -> None:
    assert provider.model_class(provider.model).provider_account is None
    model = provider.model_class(provider.model, provider_account="org-ä 1")
    assert model.provider_account == "org-ä 1"


@pytest.mark.parametrize("timeout", [None, 3, 2.5, httpx.Timeout(5.0, connect=1.0)])
def test_timeout_accepts_seconds_none_or_an_httpx_timeout(
    provider: Provider, timeout: object
) -> None:
    provider.model_class(provider.model, timeout=timeout)


def test_no_model_anywhere_is_an_invalid_request(provider: Provider) -> None:
    with pytest.raises(InvalidRequestError, match="no model"):
        provider.build_body(hello(), default_options=Options(), model="", stream=False)


def test_a_non_request_is_an_invalid_request(provider: Provider) -> None:
    with pytest.raises(InvalidRequestError, match="must be a Request"):
        provider.build_body("hi", default_options=Options(), model="m", stream=False)


# ------------------------------------------------------------------------ retries


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_rate_limit_then_success_honours_retry_after(
    provider: Provider, server: OpenAIServer, mode: str
) -> None:
    exchanges = provider.load_transcript("rate_limit_then_ok")
    if mode == "stream":
        # The stream retries too: the 429 came before the response began.
        exchanges[-1] = provider.stream_text()
    server.script(*exchanges)
    model, sleeps = provider.recorded(server)
    async with model:
        response = await answer(model, HI, mode)
    assert response.text == ("Done waiting." if mode == "call" else "Hello world!")
    assert sleeps.delays == [2.0]
    first, second = server.requests
    assert first.body == second.body


@pytest.mark.anyio
async def test_rate_limit_exhausted(provider: Provider, server: OpenAIServer) -> None:
    server.script(*provider.load_transcript("rate_limit_then_ok"))
    model, sleeps = provider.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(RateLimitError) as info:
            await model.call(HI)
    error = info.value
    assert (error.status_code, error.retry_after, error.request_id) == (429, 2.0, "req_429_1")
    key, value = provider.rate_limit_error
    assert error.body["error"][key] == value
    assert provider.rate_limit_message in str(error) and "req_429_1" in str(error)
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
async def test_a_retry_after_longer_than_allowed_is_not_waited(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script(*provider.load_transcript("rate_limit_then_ok"))
    model, sleeps = provider.recorded(server, retry_max_delay=1.0)
    async with model:
        with pytest.raises(RateLimitError) as info:
            await model.call(HI)
    assert info.value.retry_after == 2.0
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_server_errors_are_retried_with_exponential_backoff(
    provider: Provider, server: OpenAIServer, mode: str
) -> None:
    # Streams retry too: the errors came before the first byte of the response.
    exchanges = provider.load_transcript(provider.server_error)
    if mode == "stream":
        exchanges[-1] = provider.stream_text()
    server.script(*exchanges)
    model, sleeps = provider.recorded(server, retry_backoff=0.1)
    async with model:
        response = await answer(model, HI, mode)
    expected = provider.server_error_answer if mode == "call" else "Hello world!"
    assert response.text == expected
    failures = len(provider.server_errors)
    assert len(server.requests) == failures + 1
    assert len(sleeps.delays) == failures
    for retry, delay in enumerate(sleeps.delays):  # exponential, with jitter
        assert 0.075 * 2**retry <= delay <= 0.1 * 2**retry


@pytest.mark.anyio
async def test_server_errors_exhausted(provider: Provider, server: OpenAIServer) -> None:
    server.script(*provider.load_transcript(provider.server_error))
    retries = len(provider.server_errors) - 1
    model, sleeps = provider.recorded(server, max_retries=retries)
    async with model:
        with pytest.raises(ProviderServerError, match=provider.server_error_message) as info:
            await model.call(HI)
    assert (info.value.status_code, info.value.request_id) == provider.server_errors[-1]
    assert info.value.body["error"][provider.error_kind] == provider.server_error_type
    assert len(server.requests) == retries + 1 and len(sleeps.delays) == retries


@pytest.mark.anyio
async def test_cancellation_during_backoff_propagates(
    provider: Provider, server: OpenAIServer
) -> None:
    server.serve_repeatedly(provider.load_transcript(provider.server_error)[0])
    model = provider.make(server.base_url, api_key="k", retry_backoff=30)
    async with model:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tasks:

                async def call() -> None:
                    await model.call(HI)
                    raise AssertionError("the call ended before it was cancelled")

                tasks.start_soon(call)
                # Cancelled once the server answered the first try with its error (no
                # deadline: a busy machine may take any time to get there); the 30 s
                # backoff is what the call is then waiting in.
                while not server.requests:  # noqa: ASYNC110 - filled by the server's thread
                    await anyio.sleep(0.01)
                await anyio.sleep(0.05)
                scope.cancel()
    assert scope.cancelled_caught
    assert len(server.requests) == 1


# ------------------------------------------------------------------------ errors


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_unauthorized(provider: Provider, server: OpenAIServer, mode: str) -> None:
    server.script(*provider.load_transcript("unauthorized"))
    model, sleeps = provider.recorded(server, api_key="sk-bad")
    async with model:
        with pytest.raises(AuthenticationError, match=provider.unauthorized_message) as info:
            await answer(model, HI, mode)
    assert (info.value.status_code, info.value.request_id) == (401, "req_401_1")
    key, value = provider.unauthorized_error
    assert info.value.body["error"][key] == value
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, BadRequestError),
        (403, AuthenticationError),
        (404, BadRequestError),
        (409, BadRequestError),
        (413, BadRequestError),
        (422, BadRequestError),
        (302, ProviderError),
        (503, ProviderServerError),
    ],
)
async def test_status_mapping(
    provider: Provider, server: OpenAIServer, status: int, error: type[ProviderError]
) -> None:
    server.script({"status": status, "json": provider.error_body(f"status {status}")})
    model, _ = provider.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(ProviderError, match=f"status {status}") as info:
            await model.call(HI)
    assert type(info.value) is error
    assert info.value.status_code == status


@pytest.mark.anyio
async def test_a_non_json_error_body_is_kept_as_text(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script({"status": 502, "sse": [{"$raw": "<html>Bad gateway</html>"}]})
    model, _ = provider.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(ProviderServerError, match="Bad gateway") as info:
            await collect(model.stream(HI))
    assert info.value.body == "<html>Bad gateway</html>"


@pytest.mark.anyio
async def test_an_error_body_cut_short_still_maps_the_status(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script({"status": 503, "sse": [{"$drop": True}]})
    model, _ = provider.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(ProviderServerError) as info:
            await collect(model.stream(HI))
    assert (info.value.status_code, info.value.body) == (503, None)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.anyio
async def test_connection_refused_is_retried_then_raised(provider: Provider) -> None:
    model, sleeps = recording_sleeps(
        provider.make(f"http://127.0.0.1:{_closed_port()}/v1", api_key="k")
    )
    async with model:
        with pytest.raises(ProviderConnectionError) as info:
            await model.call(HI)
        with pytest.raises(ProviderConnectionError):
            await collect(model.stream(HI))
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert len(sleeps.delays) == 4


@pytest.mark.anyio
async def test_a_read_timeout_is_not_retried(provider: Provider, server: OpenAIServer) -> None:
    server.script({"stall": True})
    model, sleeps = provider.recorded(server, timeout=0.2)
    async with model:
        with pytest.raises(ProviderTimeoutError) as info:
            await model.call(HI)
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)
    assert sleeps.delays == [] and len(server.requests) == 1


def test_every_httpx_error_is_mapped() -> None:
    def subclasses(cls: type[httpx.HTTPError]) -> Iterator[type[httpx.HTTPError]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    request = httpx.Request("POST", "http://x.test")
    response = httpx.Response(500, request=request)
    seen: set[type[httpx.HTTPError]] = set()
    classes: list[type[httpx.HTTPError]] = [httpx.HTTPError, *subclasses(httpx.HTTPError)]
    for cls in classes:
        exc: httpx.HTTPError
        if cls is httpx.HTTPStatusError:
            exc = httpx.HTTPStatusError("boom", request=request, response=response)
        else:
            exc = cls("boom")
        mapped = _http.map_transport_error(exc)
        expected: type[Exception]
        if issubclass(cls, httpx.TimeoutException):
            expected = ProviderTimeoutError
        elif issubclass(cls, httpx.DecodingError):
            expected = InvalidResponseError
        else:
            expected = ProviderConnectionError
        assert type(mapped) is expected, cls
        seen.add(cls)
    assert httpx.RemoteProtocolError in seen and httpx.PoolTimeout in seen


# ------------------------------------------------------------------------ streams


E = TypeVar("E", bound=Exception)


async def texts_before_error(
    stream: AsyncIterator[Response], error: type[E], match: str | None = None
) -> tuple[tuple[str, ...], E]:
    """The texts of the chunks ``stream`` yields before it raises ``error`` (matching
    ``match``), and the error; the stream raises it once: the next pull ends it."""
    texts = []
    with pytest.raises(error, match=match) as info:
        async for chunk in stream:
            texts.append(chunk.text)
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    return tuple(texts), info.value


@pytest.mark.anyio
async def test_an_error_event_mid_stream_is_raised_once_and_not_retried(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script(*provider.load_transcript("stream_error_event"))
    before, message, request_id, kind = provider.error_event
    model, sleeps = provider.recorded(server)
    async with model:
        texts, error = await texts_before_error(model.stream(HI), ProviderError, message)
    assert texts == before
    # The error type says what the missing status would have: a server error.
    assert type(error) is ProviderServerError
    # The HTTP status (200) when the event stated none, else the stated one.
    assert error.status_code == provider.error_event_status
    assert error.request_id == request_id
    assert error.body["error"][provider.error_kind] == kind
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
async def test_a_malformed_event_raises_once(provider: Provider, server: OpenAIServer) -> None:
    server.script(provider.malformed())
    model, sleeps = provider.recorded(server)
    async with model:
        texts, _ = await texts_before_error(
            model.stream(HI), InvalidResponseError, "not valid JSON"
        )
    assert texts == provider.malformed_texts
    assert len(server.requests) == 1 and sleeps.delays == []


@pytest.mark.anyio
async def test_a_dropped_connection_raises_once(provider: Provider, server: OpenAIServer) -> None:
    server.script(provider.dropped())
    model, sleeps = provider.recorded(server)
    async with model:
        texts, error = await texts_before_error(model.stream(HI), ProviderConnectionError)
    assert texts == provider.dropped_texts
    assert isinstance(error.__cause__, httpx.HTTPError)
    assert len(server.requests) == 1 and sleeps.delays == []  # never retried mid-stream


@pytest.mark.anyio
async def test_a_stream_that_ends_early_is_a_connection_error(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script(provider.unfinished())
    model, _ = provider.recorded(server)
    async with model:
        with pytest.raises(ProviderConnectionError, match="before it finished"):
            await collect(model.stream(HI))


@pytest.mark.anyio
async def test_a_finished_stream_without_its_end_event_is_accepted(
    provider: Provider, server: OpenAIServer
) -> None:
    # No [DONE] (OpenAI), no message_stop (Anthropic).
    if not provider.end_event:
        pytest.skip(f"{provider}: no end event of its own after the finish")
    events = provider.stream_text()["sse"]
    server.script({"status": 200, "sse": events[:-1]})
    model, _ = provider.recorded(server)
    async with model:
        response = await collect(model.stream(HI))
    assert response.text == "Hello world!"


@pytest.mark.anyio
async def test_a_server_that_ignores_stream_true(provider: Provider, server: OpenAIServer) -> None:
    server.script(*provider.load_transcript(provider.text))
    model, _ = provider.recorded(server)
    async with model:
        chunks, response = await accumulate(model.stream(HI))
    assert len(chunks) == 1 and response.text == provider.text_answer


@pytest.mark.anyio
async def test_a_stream_starts_nothing_until_iterated_and_validates_first(
    provider: Provider, server: OpenAIServer
) -> None:
    model, _ = provider.recorded(server)
    bad = Request([user_message("Hi")], options=Options(**provider.unsupported))
    (name,) = provider.unsupported
    async with model:
        stream = model.stream(bad)
        assert server.requests == []
        with pytest.raises(UnsupportedOptionError, match=name):
            await stream.__anext__()
        with pytest.raises(UnsupportedOptionError, match=name):
            await model.call(bad)
    assert server.requests == []


@pytest.mark.anyio
async def test_an_early_stop_closes_the_connection(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script(*provider.load_transcript("stream_early_stop"))
    model, _ = provider.recorded(server)
    async with model:
        stream = model.stream(Request([user_message("Count")]))
        texts = []
        async for chunk in stream:
            texts.append(chunk.text)
            if chunk.text == " two":
                break
        await stream.aclose()
        # The server is blocked reading the socket: it sees EOF only if the client closed.
        assert await anyio.to_thread.run_sync(server.closed_by_client.wait, 10)
        assert model._client is not None
        assert not model._client.is_closed  # the connection, not the client, was closed
    early = provider.early_stop_texts
    assert tuple(texts) == early[: early.index(" two") + 1]


@pytest.mark.anyio
async def test_cancellation_mid_stream_closes_the_connection(
    provider: Provider, server: OpenAIServer
) -> None:
    server.script(*provider.load_transcript("stream_early_stop"))
    model, _ = provider.recorded(server)
    texts: list[str] = []
    async with model:
        with anyio.CancelScope() as scope:
            async for chunk in model.stream(Request([user_message("Count")])):
                texts.append(chunk.text)
                if len(texts) == len(provider.early_stop_texts):
                    # The server holds after the last chunk: the cancellation lands
                    # while the stream awaits the next one (no wall-clock deadline).
                    scope.cancel()
        assert scope.cancelled_caught
        assert await anyio.to_thread.run_sync(server.closed_by_client.wait, 60)
    assert tuple(texts) == provider.early_stop_texts


# ------------------------------------------------------------------------ clients


@pytest.mark.anyio
async def test_own_client_is_closed_and_a_given_one_is_not(
    provider: Provider, server: OpenAIServer
) -> None:
    server.serve_repeatedly(provider.load_transcript(provider.text)[0])
    model, _ = provider.recorded(server)
    assert model._client is None  # nothing created before first use
    async with model:
        await model.call(HI)
        own = model._client
        assert own is not None
    assert own.is_closed
    closed = f"{provider.model_class.__name__} is closed"
    with pytest.raises(RuntimeError, match=closed):
        await model.call(HI)

    async with httpx.AsyncClient() as client:
        given = provider.make(server.base_url, api_key="k", http_client=client)
        async with given:
            await given.call(HI)
        await given.aclose()  # idempotent
        assert not client.is_closed
        response = await client.get(server.base_url + "/")
        assert response.status_code == 501  # the client still works
    with pytest.raises(RuntimeError, match=closed):
        await given.call(HI)


@pytest.mark.anyio
async def test_environment_key_and_base_url_reach_the_server(
    provider: Provider, server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"{provider.env}_API_KEY", "sk-from-env")
    monkeypatch.setenv(f"{provider.env}_BASE_URL", server.base_url + "/")
    server.script(*provider.load_transcript(provider.text))
    header, value = provider.extra_header
    async with provider.model_class(provider.model, headers={header: value}) as model:
        assert model.base_url == server.base_url
        await model.call(HI)
    (recorded,) = server.requests
    assert recorded.path == provider.path
    assert recorded.headers[provider.auth_header] == provider.auth_value("sk-from-env")
    assert recorded.headers[header.lower()] == value


@pytest.mark.anyio
async def test_concurrent_calls_share_one_model(provider: Provider, server: OpenAIServer) -> None:
    server.serve_repeatedly(provider.load_transcript(provider.text)[0])
    model, _ = provider.recorded(server)
    results: list[Message] = []

    async def one() -> None:
        response = await model.call(HI)
        assert response.output is not None and response.output.message is not None
        results.append(response.output.message)

    async with model, anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert len(results) == 8 and len(server.requests) == 8


def _capturing_client(
    provider: Provider, seen: list[httpx.Request], **kwargs: Any
) -> httpx.AsyncClient:
    answer = provider.load_transcript(provider.text)[0]["json"]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), **kwargs)


@pytest.mark.anyio
async def test_an_explicit_timeout_none_overrides_a_given_clients_timeout(
    provider: Provider,
) -> None:
    # timeout=None with http_client means "no timeout for these requests", not "the
    # client's own timeout" (which leaving timeout out means).
    seen: list[httpx.Request] = []
    async with _capturing_client(provider, seen, timeout=5.0) as client:
        unlimited = provider.make("http://x/v1", http_client=client, timeout=None)
        await unlimited.call(HI)
        default = provider.make("http://x/v1", http_client=client)
        await default.call(HI)
    assert seen[0].extensions["timeout"] == httpx.Timeout(None).as_dict()
    assert seen[1].extensions["timeout"] == httpx.Timeout(5.0).as_dict()


@pytest.mark.anyio
async def test_headers_override_the_defaults_whatever_their_case(provider: Provider) -> None:
    seen: list[httpx.Request] = []
    other = provider.auth_value("sk-other")
    async with _capturing_client(provider, seen) as client:
        model = provider.make(
            "http://x/v1",
            api_key="sk-default",
            http_client=client,
            headers={provider.auth_header.upper(): other, "user-agent": "mine/1"},
        )
        await model.call(HI)
    (request,) = seen
    assert request.headers.get_list(provider.auth_header) == [other]
    assert request.headers.get_list("user-agent") == ["mine/1"]
