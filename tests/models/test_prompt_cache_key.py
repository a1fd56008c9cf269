"""``prompt_cache_key`` on the OpenAI adapters (DESIGN §6g): a string is sent as the
request's ``prompt_cache_key``; ``"conversation"`` sends the id of the conversation the
history Middleware is serving, and nothing outside one; cache hits land in
``Usage.cache_read_input_tokens``. Each test runs for OpenAIChatModel and
OpenAIResponsesModel on their loopback servers, by ``call`` and by ``stream``, under
asyncio and trio."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scope.chat import Options, Request, user_message, wrap, wrap_stream
from scope.errors import InvalidOptionsError
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.metadata import Extensions
from tests.helpers import OPENAI, RESPONSES, Provider, answer

pytestmark = pytest.mark.anyio

ADAPTERS = [pytest.param(OPENAI, id="chat"), pytest.param(RESPONSES, id="responses")]
MODES = ["call", "stream"]
HI = Request([user_message("Hi")])


def _exchange(provider: Provider, mode: str) -> dict[str, Any]:
    name = provider.text if mode == "call" else "stream_text"
    exchange: dict[str, Any] = copy.deepcopy(provider.load_transcript(name)[0])
    return exchange


def _with_cache_hits(value: Any) -> int | None:
    """Set every usage's cached-token count (``prompt_tokens_details`` or
    ``input_tokens_details``) of ``value`` to its input count minus 3; return it."""
    found: int | None = None
    if isinstance(value, dict):
        for inputs, details in (
            ("prompt_tokens", "prompt_tokens_details"),
            ("input_tokens", "input_tokens_details"),
        ):
            if isinstance(value.get(inputs), int) and value[inputs] > 3:
                found = value[inputs] - 3
                value[details] = {**(value.get(details) or {}), "cached_tokens": found}
        for item in value.values():
            found = _with_cache_hits(item) or found
    elif isinstance(value, list):
        for item in value:
            found = _with_cache_hits(item) or found
    return found


@pytest.mark.parametrize("provider", ADAPTERS)
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (5, TypeError, "prompt_cache_key must be a string, got int"),
        (b"k", TypeError, "prompt_cache_key must be a string, got bytes"),
        ("", InvalidOptionsError, "prompt_cache_key must not be empty"),
        (" user-1", InvalidOptionsError, "prompt_cache_key must not have surrounding"),
        ("user-1\t", InvalidOptionsError, "prompt_cache_key must not have surrounding"),
        ("k\udc00", InvalidOptionsError, "prompt_cache_key is not valid Unicode"),
    ],
)
def test_the_setting_is_checked(
    provider: Provider, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"{provider.model_class.__name__} {message}") as info:
        provider.model_class(provider.model, prompt_cache_key=value)  # type: ignore[call-arg]
    assert (error is TypeError) is not isinstance(info.value, ValueError)


@pytest.mark.parametrize("provider", ADAPTERS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_string_is_sent_and_cache_hits_land_in_usage(provider: Provider, mode: str) -> None:
    exchange = _exchange(provider, mode)
    cached = _with_cache_hits(exchange)
    assert cached is not None
    with provider.serve() as server:
        server.script(exchange)
        async with provider.make(server.base_url, prompt_cache_key="user-42") as model:
            assert model.prompt_cache_key == "user-42"
            response = await answer(model, HI, mode)
        (body,) = server.bodies()
    assert body["prompt_cache_key"] == "user-42"
    assert response.usage.cache_read_input_tokens == cached
    assert response.usage.input_tokens == cached + 3  # a part of the input, not beside it


@pytest.mark.parametrize("provider", ADAPTERS)
@pytest.mark.parametrize("mode", MODES)
async def test_without_a_setting_nothing_is_sent(provider: Provider, mode: str) -> None:
    with provider.serve() as server:
        server.script(_exchange(provider, mode))
        async with provider.make(server.base_url) as model:
            assert model.prompt_cache_key is None
            await answer(model, HI, mode)
        (body,) = server.bodies()
    assert "prompt_cache_key" not in body


@pytest.mark.parametrize("provider", ADAPTERS)
@pytest.mark.parametrize("mode", MODES)
async def test_conversation_sends_the_id_the_middleware_serves(
    provider: Provider, mode: str
) -> None:
    store = InMemoryStore()
    with provider.serve() as server:
        server.script(*(_exchange(provider, mode) for _ in range(3)))
        async with provider.make(server.base_url, prompt_cache_key="conversation") as model:
            for cid in ("conv-a", "conv-b"):
                history = Middleware(store, store, cid)
                if mode == "call":
                    await wrap(model, history.call).call(HI)
                else:
                    await answer(wrap_stream(model, history.stream), HI, mode)
            # Outside a Middleware there is no conversation: no key (not the word).
            await answer(model, HI, mode)
        bodies = server.bodies()
    assert [body.get("prompt_cache_key") for body in bodies] == ["conv-a", "conv-b", None]


@pytest.mark.parametrize("provider", ADAPTERS)
async def test_the_extension_overrides_the_setting(provider: Provider) -> None:
    request = Request(
        [user_message("Hi")],
        options=Options(extensions=Extensions({"openai/prompt_cache_key": "per-request"})),
    )
    with provider.serve() as server:
        server.script(_exchange(provider, "call"))
        async with provider.make(server.base_url, prompt_cache_key="user-42") as model:
            await model.call(request)
        (body,) = server.bodies()
    assert body["prompt_cache_key"] == "per-request"
