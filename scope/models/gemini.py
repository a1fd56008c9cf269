"""``GeminiModel``: the Google Gemini API's ``generateContent`` (extra
``scope-chat[gemini]``).

One object is both a ``chat.Model`` (``await model.call(request)``) and a
``chat.Streamer`` (``model.stream(request)``) over
``POST {base_url}/v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``; it speaks the wire protocol itself with httpx (the
``google-genai`` SDK is never imported):

    from scope.chat import Request, user_message
    from scope.models.gemini import GeminiModel

    async with GeminiModel("gemini-2.5-flash") as model:   # GEMINI_API_KEY
        answer = await model.call(Request([user_message("Hi!")]))

``base_url`` is the host root (default ``https://generativelanguage.googleapis.com``, or
``GEMINI_BASE_URL``); the key (``api_key`` or ``GEMINI_API_KEY``) travels in
``x-goog-api-key``. The model is part of the URL: ``options.model`` or the
constructor's ``model`` (a leading ``models/`` is accepted). Importing ``scope`` never
imports this module; importing it imports httpx.

**Provenance** (DESIGN §6c, §6g). Every answer's message is stamped with metadata
``scope/provider`` (``gcp.gemini``), ``scope/model`` (the model that answered, else the
one asked for), ``scope/asked`` (the model asked for), ``scope/api``
(``gemini.generate_content``) and, with a ``provider_account``, ``scope/account``.
Thought signatures (and signed thoughts) go back only from the adapter's own messages:
same API and provider, not another account, and the same model (asked for the same
model — ``gemini-flash-latest`` owns what it answered as a preview's name — or
answered by the model asked for now or a dated snapshot of it); a message without
provenance is foreign. A foreign
function call of the current turn (after the last user message) carries Google's
documented placeholder ``skip_thought_signature_validator`` on the first call of its
step, as Gemini 3 requires. The parts left out are counted in the response's
``metadata.extra["scope/dropped_parts"]`` (the first chunk of a stream) and named in a
DEBUG record of the ``scope.models`` logger.

**Request mapping.** System messages become ``systemInstruction`` (one text part each).
User messages are ``user`` contents: text parts, media as ``inlineData`` (bytes, base64)
or ``fileData`` (a URI; a Files API file's URI too). Assistant messages are ``model``
contents: text, media and ``functionCall`` parts (``id`` when the call had one from the
API, ``args`` the arguments as a JSON object, ``""`` as ``{}``), each with its thought
signature; reasoning parts go back as ``thought: true`` parts only when they carry a
signature, else they are left out (never turned into prompt text). Tool results become
``functionResponse`` parts (``name``; ``id`` unless the call's id was made by the
adapter; ``response`` the output's JSON object when it is one, else ``{"result":
text}``, or ``{"error": text}`` for an error result) in one ``user`` content per step,
the user's next words joining it. Tools are ``functionDeclarations`` with the input
schema as ``parametersJsonSchema``, verbatim.

**Thought signatures** round-trip byte for byte. On a ``functionCall``, text or media
part the received string is kept in that part's metadata ``gemini/thought_signature``
and sent back verbatim on the same part (so the alphabet and padding are what was
received: the API sends standard base64, Google's SDK sends URL-safe base64 back; both
are accepted). On a ``thought`` part it is the reasoning part's signature bytes (and
the metadata too when the string is not the standard padded spelling of those bytes). A
stream's last chunk may carry the answer's only signature on an empty text part alone:
that becomes a signature-only reasoning part with metadata ``gemini/signature_only:
true``, kept in order and sent back as ``{"text": "", "thoughtSignature": ...}``.
Whether a message's signatures may be sent back is decided in one place
(``_gemini_wire.sendable_signature``): today, whenever the part carries one.

**Options** are ``default_options.resolve(request.options)``, mapped into
``generationConfig``:

=====================  ============================================================
``temperature``        ``temperature``
``top_p``, ``top_k``   ``topP``, ``topK``
``max_tokens``         ``maxOutputTokens``
``stop``               ``stopSequences`` (``stop=()`` sends nothing)
penalties              ``presencePenalty``, ``frequencyPenalty``
``output_format``      json: ``responseMimeType: application/json``; json_schema: also
                       ``responseJsonSchema`` (the schema verbatim)
``reasoning_effort``   ``none``: ``thinkingConfig {thinkingBudget: 0}``; ``minimal``,
                       ``low``, ``medium``, ``high``, ``xhigh``: ``thinkingConfig
                       {thinkingLevel: <upper case>, includeThoughts: true}``
=====================  ============================================================

Every extension ``gemini/<field>`` is written into the body as ``<field>``
(``safetySettings``, ``toolConfig``, ``cachedContent``, ``labels``, ...), except
``gemini/generationConfig``, whose keys join the generated ``generationConfig``
(``thinkingConfig``, ``responseModalities``, ``seed``, ...). **Refused before any I/O**
with ``UnsupportedOptionError``: a ``reasoning_effort`` not in the table; the extensions
``gemini/contents``, ``gemini/systemInstruction`` and ``gemini/tools`` (the adapter owns
those fields) and a ``gemini/generationConfig`` key the options already set; media by
reference; media in tool results; tool-call arguments that are not a JSON object.

**Response mapping** (first candidate): ``text`` -> text, ``thought: true`` ->
reasoning, ``inlineData``/``fileData`` -> media, ``functionCall`` -> a tool call
(arguments = JSON of ``args``; id = the call's ``id``, else ``<responseId>-<n>`` with
metadata ``gemini/synthetic_id: true``, never sent back). Code execution parts are not
carried. Finish: ``STOP`` -> ``stop`` (``tool_calls`` when function calls are present),
``MAX_TOKENS`` -> ``length``, ``SAFETY``/``RECITATION``/``BLOCKLIST``/
``PROHIBITED_CONTENT``/``SPII`` -> ``content_filter``, others -> ``other``; the reason as
spelled is output metadata ``gemini/finish_reason``. A blocked prompt
(``promptFeedback.blockReason``, no candidates) is an answer with finish
``content_filter``, no message and response metadata ``gemini/block_reason``. Usage:
``promptTokenCount`` -> input, ``candidatesTokenCount + thoughtsTokenCount`` -> output,
``thoughtsTokenCount`` -> reasoning, ``cachedContentTokenCount`` -> cache read; id
``responseId``, model ``modelVersion``.

**Streaming**: every event is a whole ``GenerateContentResponse``, mapped as above into a
valid ``ResponseAccumulator`` delta (``call`` merges its one body the same way, so both
modes give the same ``Response``); there is no end marker: the stream ends after the
chunk with a ``finishReason``, and one that ends before it raises
``ProviderConnectionError``. Gemini repeats ``responseId``, ``modelVersion`` and
``usageMetadata`` on every chunk; a delta carries its response metadata only on the first
chunk and when one of them changed (the merged response is the same).

**Errors and retries** are those of ``OpenAIChatModel`` (shared code), read from the
``{"error": {code, message, status, details}}`` body: 401/403 ``AuthenticationError``,
and a 400 whose details give the reason ``API_KEY_INVALID`` too; 429 ``RateLimitError``
whose ``retry_after`` is ``Retry-After``, else the body's ``RetryInfo.retryDelay``
(honoured by the retries); 5xx ``ProviderServerError``; other 4xx ``BadRequestError``.
An error answered as JSON to a stream request (whatever its content type) is raised
the same way.

**GeminiInteractionsModel** speaks the Interactions API (``POST
{base_url}/v1beta/interactions``, the steps shape of revision ``2026-05-20``, sent as the
``Api-Revision`` header; the model in the body), with the same constructor plus
``store``. Its provenance is ``scope/api`` ``gemini.interactions`` (provider
``gcp.gemini``): it and ``GeminiModel`` never send each other's state. Requests send
``store: false`` and the whole conversation as ``input`` steps: ``user_input``,
``model_output`` (text and media of one output step together), ``thought`` (own signed
reasoning: the received ``signature`` and the text as its summary), ``function_call``
(with a ``signature`` it came with), ``function_result`` and native steps verbatim; a
foreign function call of the current turn follows a ``thought`` signed with the
placeholder. ``store=True`` sends ``store: true``, stamps the interaction's id on the
answer (message metadata ``gemini/interaction_id``) and continues from the last own
message carrying one (``previous_interaction_id``, only what follows as ``input``).
Options: ``max_tokens`` -> ``max_output_tokens``, ``stop`` -> ``stop_sequences``,
``reasoning_effort`` -> ``thinking_level`` with ``thinking_summaries: "auto"``, output
formats -> ``response_format``, extensions ``gemini-interactions/<field>`` (and
``.../generation_config`` merged); ``temperature`` and ``top_p`` (deprecated in the
API reference), ``top_k``, the penalties and ``reasoning_effort`` ``none`` are refused.
Answers: ``thought`` -> reasoning (summary text, signature bytes), ``model_output`` ->
text and media, ``function_call`` -> a tool call, any other step -> a native part
holding it whole; every part carries ``gemini/step`` (its output step's ordinal); text
annotations are output metadata ``gemini/annotations``; the status is output metadata
``gemini/status`` (``completed`` -> ``stop``/``tool_calls``, ``requires_action`` ->
``tool_calls``, ``incomplete`` -> ``length``, others ``other``). A stream maps
``step.start``/``step.delta``/``step.stop`` to the same parts and ends at ``[DONE]``;
an ``error`` event raises the error its ``code`` stands for. Errors and retries are
``GeminiModel``'s; an error answered as an event stream reads its ``data``. Details:
docs/providers.md.
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
        "scope.models.gemini needs httpx: install the extra, pip install 'scope-chat[gemini]'"
    ) from exc

from scope.chat import Options
from scope.models import _interactions_wire as interactions
from scope.models._gemini_wire import (
    API,
    PROVIDER,
    REASONING_LEVELS,
    ChunkMapper,
    build_body,
    parse_response,
    refine_error,
    route,
)
from scope.models._http import UNSET, HTTPAdapter, Wire

__all__ = [
    "API_REVISION",
    "DEFAULT_BASE_URL",
    "DEFAULT_TIMEOUT",
    "GeminiInteractionsModel",
    "GeminiModel",
    "REASONING_LEVELS",
]

#: The Interactions API schema revision ``GeminiInteractionsModel`` speaks (the
#: ``Api-Revision`` header it sends): the "steps" shape.
API_REVISION: Final = interactions.API_REVISION

#: Where requests go unless ``base_url`` or ``GEMINI_BASE_URL`` says otherwise (the host
#: root: the adapter adds ``/v1beta/models/...``).
DEFAULT_BASE_URL: Final = "https://generativelanguage.googleapis.com"

#: The timeout of a client the model creates: 10 minutes overall, 5 seconds to connect.
DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=5.0)


@final
class GeminiModel(HTTPAdapter):
    """A ``chat.Model`` and ``chat.Streamer`` over the Gemini API's ``generateContent``.

    ``model`` is used when the request's (resolved) options name none. ``api_key`` falls
    back to ``GEMINI_API_KEY``; ``base_url`` (the host root) to ``GEMINI_BASE_URL``, then
    ``DEFAULT_BASE_URL``. ``headers`` are added to every request (and may override the
    defaults). ``default_options`` lie under every request's options. ``http_client``,
    ``timeout``, ``max_retries``, ``retry_backoff``, ``retry_max_delay``,
    ``provider_name`` and ``provider_account`` behave as in ``OpenAIChatModel``.

    Guarantees: requests are validated and mapped before any I/O (``InvalidRequestError``,
    ``UnsupportedOptionError``); the model keeps no reference to a request; concurrent
    calls and streams may share one model; nothing binds to an event loop at
    construction, so one model works under asyncio or trio (one at a time, as httpx).
    """

    __slots__ = ()

    _WIRE = Wire(
        name="GeminiModel",
        path="/v1beta/models",
        env="GEMINI",
        default_base_url=DEFAULT_BASE_URL,
        default_timeout=DEFAULT_TIMEOUT,
        request_id_header="x-request-id",
        headers=lambda key: {"x-goog-api-key": key} if key else {},
        build_body=build_body,
        parse=parse_response,
        mapper=ChunkMapper,
        unfinished="no finishReason",
        api=API,
        provider=PROVIDER,
        route=route,
        refine_error=refine_error,
    )


def _interactions_headers(key: str) -> dict[str, str]:
    headers = {"Api-Revision": API_REVISION}
    if key:
        headers["x-goog-api-key"] = key
    return headers


@final
class GeminiInteractionsModel(HTTPAdapter):
    """A ``chat.Model`` and ``chat.Streamer`` over the Gemini Interactions API
    (``POST {base_url}/v1beta/interactions``, revision ``2026-05-20``: the steps shape).

    The constructor is ``GeminiModel``'s (``GEMINI_API_KEY``, ``GEMINI_BASE_URL``, the
    host root), plus ``store``: ``False`` (the default) sends ``store: false``, so
    scope's history is the only copy and every request carries the whole conversation;
    ``True`` keeps each interaction on the server, stamps its id on the answer's message
    (metadata ``gemini/interaction_id``, stored and erased with the conversation) and
    continues the next request from the last own message carrying one
    (``previous_interaction_id``, sending only the messages after it).

    Guarantees: those of ``GeminiModel``.
    """

    __slots__ = ("_store",)

    _WIRE = Wire(
        name="GeminiInteractionsModel",
        path="/v1beta/interactions",
        env="GEMINI",
        default_base_url=DEFAULT_BASE_URL,
        default_timeout=DEFAULT_TIMEOUT,
        request_id_header="x-request-id",
        headers=_interactions_headers,
        build_body=interactions.build_body,
        parse=interactions.parse_response,
        mapper=interactions.EventMapper,
        unfinished="no interaction.completed or [DONE]",
        api=interactions.API,
        provider=interactions.PROVIDER,
        refine_error=interactions.refine_error,
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
        provider_name: str | None = None,
        provider_account: str | None = None,
        store: bool = False,
    ) -> None:
        if type(store) is not bool:
            raise TypeError(
                f"GeminiInteractionsModel store must be a bool, got {type(store).__name__}"
            )
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
        self._store = store

    @property
    def store(self) -> bool:
        """Whether interactions are kept on the server (see the class docstring)."""
        return self._store

    def _body_options(self) -> dict[str, Any]:
        return {"store": self._store}
