"""``OpenAIChatModel``: an OpenAI-compatible Chat Completions adapter, and
``OpenAIResponsesModel``: the same over the Responses API (``scope-chat[openai]``).

One object is both a ``chat.Model`` (``await model.call(request)``) and a
``chat.Streamer`` (``model.stream(request)``) over ``POST {base_url}/chat/completions``,
so it reaches OpenAI and every server that speaks the same protocol (vLLM, Ollama,
llama.cpp, DeepSeek, Groq, OpenRouter, ...):

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
content is ``ToolOutput.text()``. An assistant text part marked
``{"openai/refusal": true}`` is sent back as ``refusal``. Tools become ``function``
tools whose ``parameters`` are the input schema, verbatim.

**State compatible servers attach** (DESIGN §7e) is kept and sent back where it came
from: a tool call's ``extra_content`` (Gemini's compatible endpoint puts its thought
signature in ``extra_content.google.thought_signature``; Gemini 3 refuses a call sent
back without it) is kept verbatim in the tool-call part's metadata
``openai/extra_content`` and sent on the same call; OpenRouter's ``reasoning_details``
array is kept verbatim in the message's metadata ``openai/reasoning_details`` (in a
stream, assembled from its fragments by ``index``: ``text``, ``summary`` and ``data``
concatenate, other members keep their latest value) and sent back on the same
assistant message. Reasoning text otherwise goes back only on an assistant message
that calls tools, as ``reasoning_content`` (DeepSeek and Kimi refuse a tool loop
without it; answers without calls keep it to themselves, as those servers ignore it
there and older ones refuse it).

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
vLLM, Ollama, OpenRouter) a reasoning part before the text. ``content`` may also be an
array of blocks (Mistral's reasoning models, in bodies and stream deltas): its ``text``
blocks are joined in order into the text part and its ``thinking`` blocks (text, or a
list of text chunks) into the reasoning part; a block of any other type is an
``InvalidResponseError``, never dropped. Empty placeholders count as absent (Snowflake
Cortex): ``"id": ""``, ``"finish_reason": ""`` (not finished), a ``function_call`` with
an empty name and arguments, ``"type": ""`` on a tool call. ``tool_calls`` tool-call
parts with arguments verbatim (a call without an id gets ``call_<index>``); finish
reasons ``stop``, ``length``, ``tool_calls`` (and the legacy ``function_call``) and
``content_filter`` map to their ``FinishReason``, any other to ``other``; a complete
answer that states none (``""`` or absent in a body, or on every chunk of a stream that
ended with ``[DONE]``) gets ``tool_calls`` when it calls tools, else ``stop``, so the
history can store it; usage maps ``prompt_tokens_details.cached_tokens`` to
``cache_read_input_tokens`` and ``completion_tokens_details.reasoning_tokens`` to
``reasoning_tokens`` (reasoning a server counts outside ``completion_tokens`` — more of
it than completion tokens, or a ``total_tokens`` of prompt + completion + reasoning, as
Gemini's compatible endpoint reports — is added to the output count); id and model are
kept, ``system_fingerprint`` and ``service_tier`` go to the response's extra metadata as
``openai/…``. Only choice 0 is read.

**Streaming** sends ``stream: true`` with ``stream_options: {"include_usage": true}``
and yields one valid ``ResponseAccumulator`` delta per server-sent event that carries
something: text and reasoning deltas, ``ToolCallDelta`` fragments that carry the id and
name of their ``index`` on every fragment, the finish reason, and the usage snapshot of
the final usage-only chunk. A tool call's fragments are held back until both its id
and its name have arrived (some servers send the id after a first fragment that has
only the ``index``); a call with no id by the finish reason or ``[DONE]`` gets
``call_<index>``. The stream ends at ``[DONE]`` (after reading the response to
its end, so the connection can be reused); a stream that ends without ``[DONE]`` is
accepted only after a finish reason.

**Provenance** (DESIGN §6c, §6g). Every answer's message is stamped with metadata
``scope/provider`` (``provider_name``), ``scope/model`` (the model that answered, else
the one asked for), ``scope/asked`` (the model asked for), ``scope/api``
(``openai.chat`` here, ``openai.responses`` for ``OpenAIResponsesModel``) and, with a
``provider_account``, ``scope/account``. Provider state (``extra_content``,
``reasoning_details``, ``reasoning_content``; the Responses API's reasoning items and
item ids) goes back only from the adapter's own messages: same API and provider, not
another account, and the same model (asked for the same model, or answered by the
model asked for now or a dated snapshot of it; docs/providers.md has the rule); a
message without provenance is foreign. The parts left out are counted in the
response's ``metadata.extra["scope/dropped_parts"]`` (the first chunk of a stream) and
named in a DEBUG record of the ``scope.models`` logger.

**Errors.** HTTP failures become ``scope.errors`` provider errors, with ``status_code``,
the decoded ``body`` and ``request_id`` (the ``x-request-id`` header): 401/403
``AuthenticationError``; 429 ``RateLimitError`` (``retry_after`` from ``Retry-After``);
5xx ``ProviderServerError``; 400, 404, 422 **and every other 4xx** ``BadRequestError``
(``status_code`` says which); any other status ``ProviderError``. httpx timeouts become
``ProviderTimeoutError``, every other transport failure ``ProviderConnectionError``
(the httpx error is ``__cause__``). A body or stream event that breaks the protocol
(not JSON, wrong shapes) is ``InvalidResponseError``. An error object inside a 200 body
or stream (an OpenAI error chunk, Groq's ``event: error`` with a ``status_code``, an
OpenRouter chunk whose ``error.code`` is a status) gets the class of the status it
states (a top-level ``status_code``, ``error.status_code`` / ``status`` / numeric
``code``), else of its ``type`` (``invalid_request_error`` 400, ``authentication_error``
401, ``rate_limit_exceeded`` 429, ``server_error`` 500, ``overloaded_error`` 529, ...),
else the base ``ProviderError``; ``status_code`` is the stated status, or the HTTP
status (200) when none was stated. It is never retried.

**Retries.** 429, 5xx and connection failures (including connect timeouts, but no other
timeout) are retried up to ``max_retries`` times with exponential backoff and jitter
(``retry_backoff * 2**n``, scaled by a random factor in [0.75, 1], at most
``retry_max_delay``), honouring ``Retry-After`` / ``retry-after-ms`` (seconds or an HTTP
date) when the server sends one. A ``Retry-After`` longer than ``retry_max_delay`` is not
waited for: the error is raised at once, its ``retry_after`` telling the caller when to
come back. A stream is never retried once its response has begun (status 200 received).
Waiting uses ``anyio.sleep``, so cancellation interrupts it and propagates untouched.

**OpenAIResponsesModel** (``POST {base_url}/responses``) shares the constructor, the
errors and the retries above; its mapping is in its class docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

try:
    import httpx
except ModuleNotFoundError as exc:  # the extra is not installed
    if exc.name != "httpx":
        raise
    raise ImportError(
        "scope.models.openai needs httpx: install the extra, pip install 'scope-chat[openai]'"
    ) from exc

from scope._context import current_conversation
from scope._validate import check_text, check_type
from scope.chat import Options
from scope.errors import InvalidOptionsError
from scope.models._http import UNSET, HTTPAdapter, Wire
from scope.models._openai_wire import API, PROVIDER, ChunkMapper, build_body, parse_completion
from scope.models._responses_wire import API as RESPONSES_API
from scope.models._responses_wire import PROVIDER as RESPONSES_PROVIDER
from scope.models._responses_wire import EventMapper, parse_response
from scope.models._responses_wire import build_body as build_responses_body

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_TIMEOUT", "OpenAIChatModel", "OpenAIResponsesModel"]

#: Where requests go unless ``base_url`` or ``OPENAI_BASE_URL`` says otherwise.
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"

#: The timeout of a client the model creates: 10 minutes overall, 5 seconds to connect.
DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=5.0)

#: The ``prompt_cache_key`` that sends the id of the conversation being served.
_CONVERSATION: Final = "conversation"


def _check_cache_key(value: object, where: str) -> str | None:
    """A ``prompt_cache_key`` setting: None, or a non-empty string without surrounding
    whitespace (``TypeError`` for another type, ``InvalidOptionsError`` otherwise)."""
    if value is None:
        return None
    what = f"{where} prompt_cache_key"
    check_type(value, str, what, "a string")
    return check_text(value, what, InvalidOptionsError, required=True, strip=True)


def _cache_key(setting: str | None) -> str | None:
    """The ``prompt_cache_key`` to send now: the setting, or for ``"conversation"`` the
    conversation the history Middleware is serving (None outside one: nothing sent)."""
    if setting == _CONVERSATION:
        return current_conversation()
    return setting


@final
class OpenAIChatModel(HTTPAdapter):
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

    ``provider_account``: the account (organisation or project) the key belongs to, a
    name of your choosing; stamped on every answer as ``scope/account``. State stamped
    with another account is never sent back (encrypted reasoning verifies only for the
    organisation that made it); a message stamped without an account is judged by the
    rest of the rule. Never derived from the API key. ``TypeError`` for a non-string,
    ``InvalidOptionsError`` for an empty one, surrounding whitespace or a lone
    surrogate.

    ``prompt_cache_key``: sent as the request's ``prompt_cache_key`` (OpenAI routes
    requests with one key to the same prompt cache). ``"conversation"`` sends the id of
    the conversation the history ``Middleware`` is serving (read when ``call`` or
    ``stream`` is called); outside one, nothing is sent. Validated as
    ``provider_account``. The extension ``openai/prompt_cache_key`` overrides it per
    request. Cache hits come back as ``Usage.cache_read_input_tokens`` (the API
    reports no cache writes).

    Guarantees: requests are validated and mapped before any I/O (``InvalidRequestError``,
    ``UnsupportedOptionError``); the model keeps no reference to a request; concurrent
    calls and streams may share one model; nothing binds to an event loop at
    construction, so one model works under asyncio or trio (one at a time, as httpx).
    """

    __slots__ = ("_prompt_cache_key",)

    _WIRE = Wire(
        name="OpenAIChatModel",
        path="/chat/completions",
        env="OPENAI",
        default_base_url=DEFAULT_BASE_URL,
        default_timeout=DEFAULT_TIMEOUT,
        request_id_header="x-request-id",
        headers=lambda key: {"Authorization": f"Bearer {key}"} if key else {},
        build_body=build_body,
        parse=parse_completion,
        mapper=ChunkMapper,
        api=API,
        provider=PROVIDER,
        unfinished="no finish_reason and no [DONE]",
    )

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
        provider_name: str = "openai",
        provider_account: str | None = None,
        prompt_cache_key: str | None = None,
    ) -> None:
        self._prompt_cache_key = _check_cache_key(prompt_cache_key, "OpenAIChatModel")
        super().__init__(
            model,
            api_key=api_key,
            base_url=base_url,
            http_client=http_client,
            timeout=timeout,
            max_retries=max_retries,
            default_options=default_options,
            headers=headers,
            retry_backoff=retry_backoff,
            retry_max_delay=retry_max_delay,
            provider_name=provider_name,
            provider_account=provider_account,
        )

    @property
    def prompt_cache_key(self) -> str | None:
        """The ``prompt_cache_key`` setting (see the class docstring), or None."""
        return self._prompt_cache_key

    def _body_options(self) -> dict[str, Any]:
        return {"prompt_cache_key": _cache_key(self._prompt_cache_key)}


@final
class OpenAIResponsesModel(HTTPAdapter):
    """A ``chat.Model`` and ``chat.Streamer`` over the OpenAI Responses API
    (``POST {base_url}/responses``): OpenAI and the servers of the Open Responses
    family (Azure, OpenRouter, Groq, xAI, Ollama, vLLM, LM Studio).

    The constructor is ``OpenAIChatModel``'s (same ``OPENAI_API_KEY`` /
    ``OPENAI_BASE_URL`` variables and default base URL; ``provider_name`` default
    ``"openai"``; ``provider_account``), plus:

    - ``encrypted_reasoning``: ask for the reasoning's ``encrypted_content`` (``include:
      ["reasoning.encrypted_content"]``) and send it back on the next turns; default
      True. Turn it off for a server that refuses the ``include``: then no reasoning
      item is sent back (reasoning summaries still arrive as reasoning parts).
    - ``prompt_cache_key``: as in ``OpenAIChatModel`` (a string, or ``"conversation"``
      for the id of the conversation the history ``Middleware`` is serving; cache hits
      in ``Usage.cache_read_input_tokens``).

    **Stateless.** Every request sends ``store: false`` and never
    ``previous_response_id``: scope's history is the source of truth, and the reasoning
    of reasoning models survives across turns only because its encrypted content goes
    back with the history.

    **Request mapping.** Input items in stored order: a system message becomes a
    ``system`` message item; a user message a ``user`` message (``input_text``; images
    as ``input_image``: bytes as a ``data:`` URL, a URI, a file reference as
    ``file_id``, ``detail`` from media metadata ``openai/detail``, else ``"auto"``; other
    media as ``input_file``: ``file_data``, ``file_url`` or ``file_id``); assistant text
    parts ``message`` items (``output_text``; a part marked ``{"openai/refusal": true}``
    a ``refusal``) with their ``msg_`` id, or plain assistant text when the part has no
    ``openai/item_id``; reasoning parts ``reasoning`` items with their id, their
    ``encrypted_content`` byte for byte and their summary (one ``summary_text``: the
    part's text); tool calls ``function_call`` items (``call_id``, arguments verbatim,
    their ``fc_`` id); tool results ``function_call_output`` items (the output text, or
    its content as input items when it carries media). A reasoning part goes back only
    when it has an ``openai/item_id`` and a signature (and ``encrypted_reasoning`` is
    on), and only when the item that followed it goes back with its id (the API
    refuses a reasoning item without its following item); otherwise it is omitted,
    never turned into text. Tools become ``function`` tools, ``strict: false``
    (the schema is sent verbatim). ``ToolResult.is_error`` has no field: say so in the
    output text.

    **Options.** ``max_tokens`` -> ``max_output_tokens``; ``temperature`` and ``top_p``
    keep their names; ``reasoning_effort`` -> ``reasoning: {"effort": ...}`` (pass
    ``openai/reasoning``, e.g. ``{"effort": "low", "summary": "auto"}``, to ask for
    reasoning summaries); a JSON output format -> ``text.format`` ``json_object``, a
    schema -> ``json_schema`` (not strict). Every extension ``openai/<field>`` is written
    into the body last. Refused before any I/O with ``UnsupportedOptionError``:
    ``top_k``, the penalties and a non-empty ``stop`` (the API has none of them),
    assistant media, and the extensions ``openai/input``, ``openai/model``,
    ``openai/stream``, ``openai/store``, ``openai/include``,
    ``openai/previous_response_id`` and ``openai/conversation`` (the adapter owns them).

    **Response mapping.** ``message`` items become text parts (refusals marked
    ``{"openai/refusal": true}``), ``reasoning`` items a reasoning part (text: the summary
    texts joined by a blank line; signature: the ``encrypted_content`` string's UTF-8
    bytes), ``function_call`` items tool calls (id = ``call_id``); each part carries its
    item's id in part metadata ``openai/item_id`` (and a message item's ``phase``,
    ``openai/phase``, which goes back with it). Items of other types (hosted tools)
    are dropped, never read as calls; reasoning ``content`` (``reasoning_text``) and
    annotations are not mapped. Finish: ``completed`` -> ``tool_calls`` with a function
    call, else ``stop``; ``incomplete`` for ``max_output_tokens`` -> ``length``, for
    ``content_filter`` -> ``content_filter``; anything else -> ``other``. Usage:
    ``input_tokens``, ``output_tokens``, ``input_tokens_details.cached_tokens`` (cache
    read), ``output_tokens_details.reasoning_tokens``. Id and model are kept.

    **Streaming** sends ``stream: true`` and maps the typed events: text, refusal and
    reasoning-summary deltas; a call's ``ToolCallDelta`` when its item is added, then
    per argument delta; the encrypted reasoning from ``response.output_item.done`` (the
    one in ``response.output_item.added`` is unfinished); id and model from
    ``response.created``; finish reason and usage from ``response.completed`` /
    ``response.incomplete``, which end the stream. Accumulated, the deltas give what
    ``call`` gives. ``response.failed`` and ``error`` events raise the ``ProviderError``
    of the status or code they state (``server_error`` -> ``ProviderServerError``,
    ``rate_limit_exceeded`` -> ``RateLimitError``, ...), never retried.

    Errors, retries, clients, timeouts and the guarantees are ``OpenAIChatModel``'s
    (an unknown model is a 400: ``BadRequestError``).
    """

    __slots__ = ("_encrypted_reasoning", "_prompt_cache_key")

    _WIRE = Wire(
        name="OpenAIResponsesModel",
        path="/responses",
        env="OPENAI",
        default_base_url=DEFAULT_BASE_URL,
        default_timeout=DEFAULT_TIMEOUT,
        request_id_header="x-request-id",
        headers=lambda key: {"Authorization": f"Bearer {key}"} if key else {},
        build_body=build_responses_body,
        parse=parse_response,
        mapper=EventMapper,
        unfinished="no response.completed or response.incomplete event",
        api=RESPONSES_API,
        provider=RESPONSES_PROVIDER,
    )

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
        provider_name: str = "openai",
        provider_account: str | None = None,
        prompt_cache_key: str | None = None,
        encrypted_reasoning: bool = True,
    ) -> None:
        check_type(encrypted_reasoning, bool, "OpenAIResponsesModel encrypted_reasoning", "a bool")
        self._prompt_cache_key = _check_cache_key(prompt_cache_key, "OpenAIResponsesModel")
        super().__init__(
            model,
            api_key=api_key,
            base_url=base_url,
            http_client=http_client,
            timeout=timeout,
            max_retries=max_retries,
            default_options=default_options,
            headers=headers,
            retry_backoff=retry_backoff,
            retry_max_delay=retry_max_delay,
            provider_name=provider_name,
            provider_account=provider_account,
        )
        self._encrypted_reasoning = encrypted_reasoning

    # ------------------------------------------------------------------ public API

    @property
    def encrypted_reasoning(self) -> bool:
        """Whether encrypted reasoning is asked for and sent back (see the class
        docstring)."""
        return self._encrypted_reasoning

    @property
    def prompt_cache_key(self) -> str | None:
        """The ``prompt_cache_key`` setting (see ``OpenAIChatModel``), or None."""
        return self._prompt_cache_key

    def _body_options(self) -> dict[str, Any]:
        return {
            "encrypted_reasoning": self._encrypted_reasoning,
            "prompt_cache_key": _cache_key(self._prompt_cache_key),
        }
