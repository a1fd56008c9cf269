"""``AnthropicModel``: the Anthropic Messages API (extra ``scope-chat[anthropic]``).

One object is both a ``chat.Model`` (``await model.call(request)``) and a
``chat.Streamer`` (``model.stream(request)``) over ``POST {base_url}/v1/messages``; it
speaks the wire protocol itself with httpx (the ``anthropic`` SDK is not needed):

    from scope.chat import Request, user_message
    from scope.models.anthropic import AnthropicModel

    async with AnthropicModel("claude-sonnet-4-5") as model:   # ANTHROPIC_API_KEY
        answer = await model.call(Request([user_message("Hi!")]))

``base_url`` is the API root *without* ``/v1``, as in the official SDK (default
``https://api.anthropic.com``, or ``ANTHROPIC_BASE_URL``). Headers: ``x-api-key``
(``api_key`` or ``ANTHROPIC_API_KEY``; none sent when neither is set) and
``anthropic-version: 2023-06-01``; ``headers`` adds or overrides (``anthropic-beta``,
say). Importing ``scope`` never imports this module; importing it imports httpx.

**Request mapping.** System messages become the ``system`` field (one text block each).
User text and media become content blocks: images (jpeg, png, gif, webp) as ``image``
blocks, PDFs and UTF-8 ``text/plain`` as ``document`` blocks (a media ``name`` is the
document's ``title``); bytes travel as base64 (plain text as text), URIs as ``url``
sources, references as ``file`` sources (Files API ids). Tool results become
``tool_result`` blocks (text, or text and media blocks; the details JSON when the
content is empty; ``is_error`` kept) at the start of a user turn: consecutive tool
messages, and a user message right after them, form one user turn, as the API requires.
Assistant messages become ``text``, ``thinking``, ``redacted_thinking`` and
``tool_use`` blocks; a tool call's arguments must be a JSON object (``""`` is sent as
``{}``), sent with their numbers as spelled. Tools become ``tools`` entries with
``input_schema`` verbatim.

**Provenance** (DESIGN §6c, §6g). Every answer's message is stamped with metadata
``scope/provider`` (``provider_name``), ``scope/model`` (the model that answered, else
the one asked for), ``scope/asked`` (the model asked for), ``scope/api``
(``anthropic.messages``) and, with a ``provider_account``, ``scope/account``. Provider
state (thinking and redacted thinking) goes back only from the adapter's own messages:
same API and provider, not another account, and the same model (asked for the same
model, or answered by the model asked for now or a dated snapshot of it:
``claude-sonnet-4-0`` owns what ``claude-sonnet-4-20250514`` answered, also in
messages stamped before ``scope/asked``); a message without provenance is foreign.
The parts left out are counted in the response's
``metadata.extra["scope/dropped_parts"]`` (the first chunk of a stream) and named in a
DEBUG record of the ``scope.models`` logger.

**The prefix** (DESIGN §6g). Anthropic's preserved thinking binds each thinking block to
its prefix: the ``system`` prompt, the ``tools`` and every message before it. A block
replayed under a changed prefix (a window that dropped old turns, a rebuilt system
prompt, another tool set, an edited message, an earlier block left out or moved) is
refused (400 "The block is bound to a different conversation") or dropped, and every
later block with it. So every answer is also stamped with ``scope/prefix``: a digest of
what the request sent before it (``"sha256:..."``; a hash chain over the wire
``system``, ``tools`` and messages, one pass over the request, ``cache_control`` left
out). Replaying, the adapter computes the same chain over what it is actually sending
(earlier drops applied) and sends an own message's thinking back only where the digest
before it equals its stamp; elsewhere the thinking is left out and counted as above
(``reasoning produced under another prefix``), never refused. A drop changes the prefix
after it, so the older thinking after it falls too; thinking produced since (the
current turn's tool loop) still matches and goes back. Messages without the stamp
(stored before v0.4) keep the rule above. Empty-text thinking (``thinking.display:
"omitted"``) is a reasoning part with a signature and goes back like any other.

``drop_mismatched_thinking=True`` also asks the API to drop blocks failing its own
check rather than refuse the request (for histories scope did not stamp): the
``thinking`` object gets ``block_binding: {"prefix_mismatch_behavior": "drop_block"}``
(a request without one sends ``{"type": "adaptive", ...}``, as the API documents;
disabled thinking gets none; a binding the ``anthropic/thinking`` extension sets is
kept) and every request the header ``anthropic-beta:
thinking-binding-controls-2026-08-01`` (joined to any ``anthropic-beta`` of
``headers``). The ``thinking_dropped`` entries of the response's
``input_transformations`` are added to ``scope/dropped_parts`` and named in a DEBUG
record (a stream's ``message_delta`` list replaces its ``message_start`` one).

``prompt_cache=True`` puts ``cache_control: {"type": "ephemeral"}`` breakpoints on the
last tool, the last system block and the last block of the last message (not on a
thinking block): at most three, so one of the API's four stays free. The cached
counts are in ``Usage`` (below).

**Reasoning.** A ``thinking`` block is a reasoning part whose signature bytes are the
base64-decoded ``signature`` (a signature that is not canonical base64 is refused, as
it could not be sent back exactly); it is sent back as ``thinking`` with the signature
re-encoded: byte for byte what was received. A ``redacted_thinking`` block is a
reasoning part with empty text, the block's ``data`` (UTF-8) as its signature and part
metadata ``{"anthropic/redacted": true}``; it is sent back as ``redacted_thinking``. A
reasoning block directly after another reasoning block with the same metadata also gets
``{"anthropic/block": <index>}``, so that ``ResponseAccumulator`` keeps the two apart
(adjacent redacted blocks stay separate parts). A reasoning part without a signature
(from another provider) is not sent back: the API refuses thinking it cannot verify.

**Options** are ``default_options.resolve(request.options)``; the model is
``options.model`` or the constructor's ``model``. ``max_tokens`` (required by the API)
is ``options.max_tokens``, else ``DEFAULT_MAX_TOKENS`` (4096) plus the thinking budget
if any (from ``reasoning_effort`` or the ``budget_tokens`` of ``anthropic/thinking``; a
``max_tokens`` not above that budget is refused); temperature (0 to 1 here), ``top_p``,
``top_k`` and ``stop`` (as ``stop_sequences``) keep their meaning. ``reasoning_effort``
maps to ``thinking`` when the extension ``anthropic/thinking`` is absent (that extension
is the ``thinking`` object, verbatim, and wins):

=============  ===============================================
``none``       ``{"type": "disabled"}``
``minimal``    ``{"type": "enabled", "budget_tokens": 1024}``
``low``        ``budget_tokens`` 4096
``medium``     ``budget_tokens`` 8192
``high``       ``budget_tokens`` 16384
``xhigh``      ``budget_tokens`` 32768
=============  ===============================================

A JSON or JSON-schema output format is carried by ``OutputFormat.fallback_instruction()``
as a last ``system`` block (the API has no ``response_format``; pass
``anthropic/output_config`` for native structured outputs). Every extension
``anthropic/<field>`` is written into the body as ``<field>`` (``thinking``,
``tool_choice``, ``metadata``, ``service_tier``, ``cache_control``, ...). Extensions of
other namespaces are ignored.

**Refused before any I/O** with ``UnsupportedOptionError``: the frequency and presence
penalties; a temperature above 1; a ``reasoning_effort`` not in the table; a
``max_tokens`` not above the thinking budget ``reasoning_effort`` asks for; media of
other types (audio, say), in user messages or tool results; media, or only unsigned
reasoning, in an assistant message; tool-call arguments that are not a JSON object; the
extensions ``anthropic/messages``, ``anthropic/model``, ``anthropic/stream`` and
``anthropic/system`` (the adapter owns those fields).

**Response mapping.** ``text`` blocks become text parts, ``thinking`` and
``redacted_thinking`` reasoning parts (above), ``tool_use`` blocks tool calls whose
arguments are the input as JSON text. ``server_tool_use``, server tool results and
other block types are the server's own business: never tool calls, not carried. Stop
reasons: ``end_turn`` and ``stop_sequence`` -> ``stop``, ``max_tokens`` -> ``length``,
``tool_use`` -> ``tool_calls``, ``refusal`` -> ``content_filter``, ``pause_turn`` and
anything else -> ``other``; the matched stop sequence is response metadata
``anthropic/stop_sequence``. Usage: ``input_tokens`` is Anthropic's ``input_tokens +
cache_read_input_tokens + cache_creation_input_tokens`` (scope's cache counts are parts
of the input), ``cache_read_input_tokens`` and ``cache_write_input_tokens`` carry the
two cache counts, ``reasoning_tokens`` ``output_tokens_details.thinking_tokens``.

**Streaming** sends ``stream: true`` and yields one valid ``ResponseAccumulator`` delta
per event that carries something (see ``EventMapper``): text and thinking deltas; a
thinking block's signature as a signature-only reasoning part when the block stops;
``tool_use`` blocks as ``ToolCallDelta`` fragments (the block index names the call; a
block without input ends as ``{}``); the usage snapshots of ``message_start`` and
``message_delta`` and the stop reason. ``ping`` and unknown events are skipped. The
stream ends at ``message_stop``; one that ends without it is accepted only after a stop
reason.

**Errors and retries** are those of ``OpenAIChatModel`` (shared code): 401/403
``AuthenticationError``, 429 ``RateLimitError`` (``retry_after``), 5xx (529
``overloaded_error`` included) ``ProviderServerError``, other 4xx ``BadRequestError``;
``request_id`` is the ``request-id`` header. 429, 5xx and connection failures are
retried up to ``max_retries`` times with backoff and jitter, honouring ``retry-after``,
never once a stream has begun. An ``error`` event mid-stream (``overloaded_error``,
``api_error``, ...) raises the class of its type and ends the stream.
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
        "scope.models.anthropic needs httpx: install the extra, pip install 'scope-chat[anthropic]'"
    ) from exc

from scope._validate import check_type
from scope.chat import Options
from scope.models._anthropic_wire import (
    API,
    DEFAULT_MAX_TOKENS,
    PROVIDER,
    REASONING_BUDGETS,
    EventMapper,
    build_body,
    parse_message,
)
from scope.models._http import UNSET, HTTPAdapter, Wire

__all__ = [
    "API_VERSION",
    "AnthropicModel",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TIMEOUT",
    "REASONING_BUDGETS",
]

#: Where requests go unless ``base_url`` or ``ANTHROPIC_BASE_URL`` says otherwise
#: (without ``/v1``, as in the official SDK).
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"

#: The ``anthropic-version`` header sent with every request.
API_VERSION: Final = "2023-06-01"

#: The ``anthropic-beta`` value that ``drop_mismatched_thinking`` sends: the API reads
#: ``thinking.block_binding`` only with it.
_BINDING_BETA: Final = "thinking-binding-controls-2026-08-01"

#: The timeout of a client the model creates: 10 minutes overall, 5 seconds to connect.
DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=5.0)


@final
class AnthropicModel(HTTPAdapter):
    """A ``chat.Model`` and ``chat.Streamer`` over the Anthropic Messages API.

    ``model`` is used when the request's (resolved) options name none. ``api_key`` falls
    back to ``ANTHROPIC_API_KEY``; ``base_url`` (without ``/v1``) to
    ``ANTHROPIC_BASE_URL``, then ``DEFAULT_BASE_URL``. ``headers`` are added to every
    request (and may override the defaults). ``default_options`` lie under every
    request's options. ``http_client``, ``timeout``, ``max_retries``, ``retry_backoff``,
    ``retry_max_delay``, ``provider_name`` and ``provider_account`` behave as in
    ``OpenAIChatModel`` (signatures verify only for the organisation that made them).
    ``drop_mismatched_thinking`` and ``prompt_cache`` (bools, default False;
    ``TypeError`` otherwise) are described in the module docstring.

    Guarantees: requests are validated and mapped before any I/O (``InvalidRequestError``,
    ``UnsupportedOptionError``); the model keeps no reference to a request; concurrent
    calls and streams may share one model; nothing binds to an event loop at
    construction, so one model works under asyncio or trio (one at a time, as httpx).
    """

    __slots__ = ("_drop_mismatched_thinking", "_prompt_cache")

    _WIRE = Wire(
        name="AnthropicModel",
        path="/v1/messages",
        env="ANTHROPIC",
        default_base_url=DEFAULT_BASE_URL,
        default_timeout=DEFAULT_TIMEOUT,
        request_id_header="request-id",
        headers=lambda key: {
            "anthropic-version": API_VERSION,
            **({"x-api-key": key} if key else {}),
        },
        build_body=build_body,
        parse=parse_message,
        mapper=EventMapper,
        api=API,
        provider=PROVIDER,
        unfinished="no stop_reason and no message_stop",
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
        drop_mismatched_thinking: bool = False,
        prompt_cache: bool = False,
    ) -> None:
        check_type(
            drop_mismatched_thinking, bool, "AnthropicModel drop_mismatched_thinking", "a bool"
        )
        check_type(prompt_cache, bool, "AnthropicModel prompt_cache", "a bool")
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
        self._drop_mismatched_thinking = drop_mismatched_thinking
        self._prompt_cache = prompt_cache
        if drop_mismatched_thinking:
            self._headers = _with_beta(self._headers, _BINDING_BETA)

    # ------------------------------------------------------------------ public API

    @property
    def drop_mismatched_thinking(self) -> bool:
        """Whether the API is asked to drop thinking blocks that fail its prefix check
        rather than refuse the request (see the module docstring)."""
        return self._drop_mismatched_thinking

    @property
    def prompt_cache(self) -> bool:
        """Whether requests carry prompt-cache breakpoints (see the module docstring)."""
        return self._prompt_cache

    def _body_options(self) -> dict[str, Any]:
        return {
            "drop_mismatched_thinking": self._drop_mismatched_thinking,
            "prompt_cache": self._prompt_cache,
        }


def _with_beta(headers: dict[str, str], beta: str) -> dict[str, str]:
    """``headers`` with ``beta`` among the ``anthropic-beta`` values (comma-separated,
    the header's form), kept once; the header's name compares case-insensitively."""
    merged = dict(headers)
    for name, value in headers.items():
        if name.lower() == "anthropic-beta":
            values = [v.strip() for v in value.split(",") if v.strip()]
            if beta not in values:
                merged[name] = ",".join([*values, beta])
            return merged
    merged["anthropic-beta"] = beta
    return merged
