"""Pure mapping between scope chat values and the Anthropic Messages API wire format.

No I/O and no HTTP library here: ``build_body`` turns a ``Request`` into the JSON body of
``POST /v1/messages``, ``parse_message`` turns a ``message`` body into a ``Response``, and
``EventMapper`` turns the server-sent events of a stream into accumulator deltas. The
mapping decisions are documented in ``scope.models.anthropic``.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from typing import Any, Final, final

import attrs
import orjson

from scope.chat import (
    FinishReason,
    Message,
    NativeItem,
    Options,
    Output,
    OutputFormatType,
    Part,
    PartKind,
    Request,
    Response,
    ResponseMetadata,
    Role,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    Usage,
    text_delta,
)
from scope.errors import (
    InvalidJSONError,
    InvalidResponseError,
    ScopeError,
    UnsupportedOptionError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, SourceKind
from scope.metadata import EMPTY_METADATA, Metadata
from scope.models._errors import embedded_error, error_message
from scope.models._json_shape import Verbatim
from scope.models._json_shape import bare_mime as _bare_mime
from scope.models._json_shape import count as _count
from scope.models._json_shape import kind as _kind
from scope.models._json_shape import load as _load
from scope.models._json_shape import meta_text as _meta_text
from scope.models._json_shape import nested_count as _nested_count
from scope.models._json_shape import obj as _obj
from scope.models._prefix import PREFIX_KEY, PrefixChain
from scope.models._provenance import DROPPED_KEY, MODEL_KEY, Replay
from scope.models._wire import (
    as_invalid_response,
    extension_fields,
    prepare,
    put_options,
    text_and_media_blocks,
    tool_spec,
)

__all__ = [
    "API",
    "BLOCK_KEY",
    "CALLER_KEY",
    "CITATIONS_KEY",
    "CONTAINER_KEY",
    "DEFAULT_MAX_TOKENS",
    "REASONING_BUDGETS",
    "REDACTED_KEY",
    "RESERVED_FIELDS",
    "PROVIDER",
    "EventMapper",
    "build_body",
    "parse_message",
    "stop_reason",
]

#: The wire protocol and the provider, as the answers' provenance names them (§6c).
API: Final = "anthropic.messages"
PROVIDER: Final = "anthropic"

#: ``max_tokens`` is required by the API: sent when the options set none. With a
#: thinking budget from ``reasoning_effort`` the default is the budget plus this.
DEFAULT_MAX_TOKENS: Final = 4096

#: ``reasoning_effort`` -> ``thinking`` (used only when the ``anthropic/thinking``
#: extension is absent): ``"none"`` disables thinking, the others enable it with this
#: ``budget_tokens`` (the API's minimum is 1024).
REASONING_BUDGETS: Final[dict[str, int]] = {
    "minimal": 1024,
    "low": 4096,
    "medium": 8192,
    "high": 16384,
    "xhigh": 32768,
}

#: Part metadata key marking a reasoning part that holds a ``redacted_thinking`` block
#: (its ``data`` is the part's signature, as UTF-8).
REDACTED_KEY: Final = "anthropic/redacted"

#: Part metadata key that keeps a reasoning block apart from an adjacent one of the same
#: kind (the accumulator would merge them): the block's index in its message.
BLOCK_KEY: Final = "anthropic/block"

#: Part metadata of a text part: the block's ``citations`` (verbatim), sent back with it
#: to the same model only (DESIGN §6k).
CITATIONS_KEY: Final = "anthropic/citations"

#: Part metadata of a tool call: the ``tool_use`` block's ``caller`` (programmatic tool
#: calling), sent back with it to the same model only.
CALLER_KEY: Final = "anthropic/caller"

#: Message metadata: the response's ``container`` (``{"id", "expires_at"}``, verbatim);
#: the next request to the same model names its id, so code execution goes on in it.
CONTAINER_KEY: Final = "anthropic/container"

#: The content blocks scope models with parts of its own; every other block (server
#: tools and their results, MCP, compaction, fallback ...) is kept whole (native).
_MODELLED: Final = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})

#: Body fields the adapter owns: an ``anthropic/<field>`` extension may not set them.
RESERVED_FIELDS: Final = frozenset({"messages", "model", "stream", "system"})

_IMAGE_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

_STOP: Final[dict[str, FinishReason]] = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "refusal": FinishReason.CONTENT_FILTER,
}

#: Options sent as they are: (option, body field).
_OPTION_FIELDS: Final = (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"))

_EMPTY_META: Final = Metadata()
_logger: Final = logging.getLogger("scope.models")
_REDACTED_META: Final = Metadata({REDACTED_KEY: True})


# --------------------------------------------------------------------------- request


def build_body(
    request: Request,
    *,
    default_options: Options,
    model: str,
    stream: bool,
    replay: Replay | None = None,
    drop_mismatched_thinking: bool = False,
    prompt_cache: bool = False,
) -> dict[str, Any]:
    """The JSON body (a dict; RawJSON values and encoded messages as ``orjson.Fragment``)
    for ``request``.

    Validates the request and refuses (``UnsupportedOptionError``) anything populated the
    API cannot carry. Thinking goes back only from the adapter's own messages
    (``replay``, default: provider ``"anthropic"``), and only under the prefix it was
    produced under (``scope/prefix``, DESIGN §6g); every part left out is recorded in
    ``replay.left_out``, and ``replay.prefix`` is set to the digest of the whole request
    (what the answer is stamped with). ``drop_mismatched_thinking`` adds the
    ``thinking.block_binding`` that asks the API to drop blocks failing its own prefix
    check (the ``anthropic-beta`` header is the adapter's); ``prompt_cache`` adds the
    ``cache_control`` breakpoints (tools, system, last message). Raises before any I/O.
    """
    options, chosen = prepare(request, default_options, model, "AnthropicModel")
    if replay is None:
        replay = Replay(API, PROVIDER)
    replay.model = chosen
    system: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role is Role.SYSTEM:
            system.append({"type": "text", "text": message.text})
    # Keys in the order they are sent; messages are filled in once system and tools,
    # the head of every message's prefix, are final.
    body: dict[str, Any] = {"model": chosen, "max_tokens": 0, "messages": None}
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    _options(options, body, system)
    if system:
        body["system"] = system
    system_bytes = _encoded(body, "system", prompt_cache)
    wire = _Wire(PrefixChain(system_bytes, _encoded(body, "tools", prompt_cache)))
    _messages(request, replay, wire)
    if "container" not in body:  # the extension anthropic/container names one itself
        container = _container(request, replay)
        if container is not None:
            body["container"] = container
    replay.prefix = wire.digest()
    body["messages"] = wire.finish(prompt_cache)
    if prompt_cache:
        _breakpoint(body.get("tools"))
        _breakpoint(body.get("system"))
    if drop_mismatched_thinking:
        _bind_thinking(body, options)
    if stream:
        body["stream"] = True
    return body


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    spec = tool_spec(tool, "input_schema")
    if tool.strict:  # strict tool use: the input is sampled to match the schema
        spec["strict"] = True
    return spec


def _container(request: Request, replay: Replay) -> str | None:
    """The id of the container the adapter's own latest answer ran code in (its
    ``anthropic/container`` stamp), so the next call goes on in it; None without one."""
    for message in reversed(request.messages):
        if message.role is not Role.ASSISTANT:
            continue
        stamp = message.metadata.get(CONTAINER_KEY)
        if stamp is None or not replay.owns(message):
            continue
        container = stamp.value()
        identifier = container.get("id") if isinstance(container, dict) else None
        if isinstance(identifier, str) and identifier:
            return identifier
    return None


def _encoded(body: dict[str, Any], field: str, keep: bool) -> bytes:
    """The JSON bytes of ``body[field]`` (``null`` when absent) for the prefix digest;
    unless ``keep`` (its last entry is about to get a ``cache_control`` breakpoint),
    the field is replaced by those bytes, so they are not encoded twice."""
    value = body.get(field)
    if value is None:
        return b"null"
    data = orjson.dumps(value)
    if not keep and type(value) is list:
        body[field] = orjson.Fragment(data)
    return data


#: ``cache_control`` of a prompt-cache breakpoint (DESIGN §6g).
_EPHEMERAL: Final = {"type": "ephemeral"}

#: Blocks that cannot carry ``cache_control`` (the API refuses it on thinking).
_NO_BREAKPOINT: Final = frozenset({"thinking", "redacted_thinking"})


def _breakpoint(blocks: object) -> None:
    """A ``cache_control`` breakpoint on the last block of ``blocks`` that can carry
    one (not thinking); nothing for a field an extension set."""
    if type(blocks) is not list:
        return
    for index in range(len(blocks) - 1, -1, -1):
        block = blocks[index]
        # A native block (an orjson.Fragment) goes back byte for byte: no marker on it.
        if type(block) is not dict or block.get("type") in _NO_BREAKPOINT:
            continue
        blocks[index] = {**block, "cache_control": dict(_EPHEMERAL)}
        return


#: ``thinking.block_binding`` with ``drop_mismatched_thinking``.
_DROP_BLOCK: Final = {"prefix_mismatch_behavior": "drop_block"}


def _bind_thinking(body: dict[str, Any], options: Options) -> None:
    """Ask the API to drop thinking blocks that fail its prefix check instead of
    refusing the request: ``thinking.block_binding.prefix_mismatch_behavior:
    "drop_block"``. Without a ``thinking`` field it is ``{"type": "adaptive"}`` plus the
    binding (what the API documents: models with preserved thinking think adaptively
    by default); disabled thinking sends no blocks to bind and gets none; a binding the
    ``anthropic/thinking`` extension sets itself is kept."""
    thinking = body.get("thinking")
    if thinking is None:
        body["thinking"] = {"type": "adaptive", "block_binding": dict(_DROP_BLOCK)}
    elif type(thinking) is dict:
        if thinking.get("type") != "disabled":
            thinking["block_binding"] = dict(_DROP_BLOCK)
    else:  # the extension, verbatim
        raw = options.extensions.namespace("anthropic").get("thinking")
        value = raw.value() if raw is not None else None
        if (
            isinstance(value, dict)
            and value.get("type") != "disabled"
            and "block_binding" not in value
        ):
            body["thinking"] = {**value, "block_binding": dict(_DROP_BLOCK)}


def _options(options: Options, body: dict[str, Any], system: list[dict[str, Any]]) -> None:
    for name, value in (
        ("frequency_penalty", options.frequency_penalty),
        ("presence_penalty", options.presence_penalty),
    ):
        if value is not None:
            raise UnsupportedOptionError(f"{name} is not part of the Anthropic Messages API")
    if options.temperature is not None and options.temperature > 1:
        raise UnsupportedOptionError(
            f"temperature must be between 0 and 1 for the Anthropic Messages API, "
            f"got {options.temperature}"
        )
    put_options(options, body, _OPTION_FIELDS)
    if options.stop:  # stop=() (an explicit empty list) is the API's default
        body["stop_sequences"] = list(options.stop)
    extensions = options.extensions.namespace("anthropic")
    budget = None
    effort = options.reasoning_effort
    source = f"reasoning_effort {effort!r}"
    thinking = extensions.get("thinking")
    if thinking is not None:
        # The extension, when present, is the thinking configuration: it wins. Its
        # budget still shapes max_tokens (the default grows by it; a set one must exceed it).
        value = thinking.value()
        if isinstance(value, dict) and type(value.get("budget_tokens")) is int:
            budget = value["budget_tokens"]
            source = "the extension 'anthropic/thinking'"
    elif effort:
        if effort == "none":
            body["thinking"] = {"type": "disabled"}
        elif effort in REASONING_BUDGETS:
            budget = REASONING_BUDGETS[effort]
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        else:
            known = ", ".join(["none", *REASONING_BUDGETS])
            raise UnsupportedOptionError(
                f"reasoning_effort {effort!r} has no Anthropic thinking budget (known: "
                f"{known}); pass the extension 'anthropic/thinking' to configure thinking"
            )
    if options.max_tokens is not None:
        if budget is not None and options.max_tokens <= budget:
            raise UnsupportedOptionError(
                f"{source} is a thinking budget of {budget} tokens, which the Anthropic "
                f"Messages API needs below max_tokens ({options.max_tokens})"
            )
        body["max_tokens"] = options.max_tokens
    else:
        body["max_tokens"] = DEFAULT_MAX_TOKENS + (budget or 0)
    fmt = options.output_format
    if fmt is not None and fmt.type is not OutputFormatType.TEXT:
        # The Messages API has no response_format: the format travels as the same
        # fallback instruction every adapter without native support uses.
        system.append({"type": "text", "text": fmt.fallback_instruction()})
    # Extensions of other namespaces are meant for other providers and are ignored.
    for name, raw in extension_fields(options, "anthropic", RESERVED_FIELDS, "AnthropicModel"):
        body[name] = orjson.Fragment(raw.bytes)


def _media(media: Media, where: str) -> dict[str, Any]:
    source = media.source
    mime = _bare_mime(media.mime)
    if mime in _IMAGE_TYPES or (mime.startswith("image/") and source.kind is not SourceKind.BYTES):
        block_type = "image"
    elif mime == "application/pdf" or (mime == "text/plain" and source.kind is SourceKind.BYTES):
        block_type = "document"
    elif source.kind is SourceKind.REFERENCE:
        block_type = "document"  # a file of the Files API: the server knows its type
    else:
        raise UnsupportedOptionError(
            f"{where}: {mime} media cannot be sent over the Anthropic Messages API (images "
            "jpeg/png/gif/webp, PDF documents, plain text, or file references)"
        )
    wire: dict[str, Any]
    if source.kind is SourceKind.URI:
        wire = {"type": "url", "url": source.uri}
    elif source.kind is SourceKind.REFERENCE:
        wire = {"type": "file", "file_id": source.ref}
    elif mime == "text/plain":
        try:
            text = source.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UnsupportedOptionError(f"{where}: text/plain media is not UTF-8") from exc
        wire = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        data = base64.b64encode(source.data).decode("ascii")
        wire = {"type": "base64", "media_type": mime, "data": data}
    block: dict[str, Any] = {"type": block_type, "source": wire}
    if block_type == "document" and media.name:
        block["title"] = media.name
    return block


def _tool_results(message: Message, where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(message.parts):
        result = part.tool_result
        assert result is not None
        here = f"{where}.parts[{index}]"
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.id}
        output = result.output
        if any(p.kind is PartKind.MEDIA for p in output.content):
            block["content"] = text_and_media_blocks(
                output.content, f"{here}.output.content", _media
            )
        else:
            text = output.text()
            if text:
                block["content"] = [{"type": "text", "text": text}]
        if result.is_error:
            block["is_error"] = True
        blocks.append(block)
    return blocks


def _arguments(text: str, where: str) -> orjson.Fragment:
    if not text:
        return orjson.Fragment(b"{}")
    try:
        raw = RawJSON.parse(text)
    except InvalidJSONError as exc:
        raise UnsupportedOptionError(
            f"{where}: tool call arguments are not JSON, and the Anthropic Messages API "
            f"needs a tool call's input as a JSON object: {exc}"
        ) from exc
    if not raw.bytes.startswith(b"{"):
        raise UnsupportedOptionError(
            f"{where}: tool call arguments must be a JSON object for the Anthropic Messages "
            f"API, got {text[:60]!r}"
        )
    return orjson.Fragment(raw.bytes)


def _has_state(message: Message) -> bool:
    """Whether ``message`` carries provider state: a signed (or redacted) reasoning part."""
    return any(part.kind is PartKind.REASONING and part.signature for part in message.parts)


def _assistant_blocks(
    message: Message, where: str, replay: Replay, wire: _Wire
) -> list[dict[str, Any] | orjson.Fragment]:
    """The content blocks of an assistant message, in part order; a native block (DESIGN
    §6k) as the ``orjson.Fragment`` of its stored bytes."""
    blocks: list[dict[str, Any] | orjson.Fragment] = []
    own = replay.owns(message)
    rebound = False
    if own:
        stamped = message.metadata.get(PREFIX_KEY)
        # The state of an answer stamped with another prefix than the one it is about
        # to be sent under would be refused (400 "The block is bound to a different
        # conversation") or dropped: it stays here. A message without the stamp (v0.3)
        # keeps the v0.3 rule.
        if stamped is not None and _has_state(message):
            digest = wire.digest()
            # The stamp's JSON is the digest in quotes (plain ASCII): parsed only when
            # the bytes differ.
            rebound = stamped.bytes != f'"{digest}"'.encode() and stamped.value() != digest
    for index, part in enumerate(message.parts):
        here = f"{where}.parts[{index}]"
        kind = part.kind
        # After a server-side fallback, a part belongs to the model that made it.
        mine = replay.owns_part(message, part, own)
        if kind is PartKind.TEXT:
            text_block: dict[str, Any] = {"type": "text", "text": part.text}
            citations = part.metadata.get(CITATIONS_KEY) if mine else None
            if citations is not None:
                text_block["citations"] = orjson.Fragment(citations.bytes)
            blocks.append(text_block)
        elif kind is PartKind.REASONING:
            if not mine:
                # Another model's thinking: its signature would be refused (400 "Invalid
                # signature in thinking block"), and it never becomes prompt text.
                replay.leave_out(here, "reasoning of another model")
            elif rebound and part.signature:
                replay.leave_out(here, "reasoning produced under another prefix")
            elif part.metadata.get(REDACTED_KEY) == _REDACTED_META[REDACTED_KEY]:
                try:
                    data = part.signature.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise UnsupportedOptionError(
                        f"{here}: a redacted reasoning part's signature must be the block's "
                        "data as UTF-8"
                    ) from exc
                blocks.append({"type": "redacted_thinking", "data": data})
            elif part.signature:
                # Empty text (thinking display "omitted") goes back like any other: the
                # signature carries the block.
                signature = base64.b64encode(part.signature).decode("ascii")
                blocks.append({"type": "thinking", "thinking": part.text, "signature": signature})
            else:
                # The API refuses thinking it cannot verify.
                replay.leave_out(here, "reasoning without a signature")
        elif kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            use: dict[str, Any] = {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": _arguments(call.arguments, here),
            }
            caller = part.metadata.get(CALLER_KEY) if mine else None
            if caller is not None:
                use["caller"] = orjson.Fragment(caller.bytes)
            blocks.append(use)
        elif kind is PartKind.NATIVE:
            block = replay.native(part, mine, here)
            if block is not None:
                blocks.append(block)
        else:
            raise UnsupportedOptionError(
                f"{here}: an assistant message cannot carry {kind} parts over the Anthropic "
                "Messages API"
            )
    return blocks


@final
class _Wire:
    """The wire messages of one request as they are built, and the prefix chain over
    them (``scope.models._prefix``).

    A message is encoded (and added to the chain) once it is complete: when the next
    one starts, or at the end (``finish``), and also when the digest before the next
    one is asked for (``digest``). A user turn can still grow after that (tool results,
    an assistant message left out whole, then the user's words): ``extend`` takes its
    bytes back out of the chain (the chain saved before them). Each message is encoded
    once and sent as those bytes.
    """

    __slots__ = ("_before", "_chain", "_encoded", "_last", "_sent")

    def __init__(self, chain: PrefixChain) -> None:
        self._chain = chain
        self._sent: list[Any] = []  # the encoded messages before the last one
        self._last: dict[str, Any] | None = None
        self._encoded: bytes | None = None  # the last message's bytes, once in the chain
        self._before: PrefixChain | None = None  # the chain before them, if asked early

    def start(self, message: dict[str, Any]) -> None:
        """Begin the next wire message (the one before is complete)."""
        last = self._last
        if last is not None:
            encoded = self._encoded
            if encoded is None:
                encoded = orjson.dumps(last)
                self._chain.add(encoded)
            self._sent.append(orjson.Fragment(encoded))
        self._last = message
        self._encoded = None
        self._before = None

    def extend(self, blocks: Sequence[dict[str, Any] | orjson.Fragment]) -> None:
        """Add ``blocks`` to the content of the last message."""
        assert self._last is not None
        if self._before is not None:
            self._chain = self._before
            self._before = None
            self._encoded = None
        self._last["content"].extend(blocks)

    def digest(self) -> str:
        """The digest of every message so far (the prefix of the next one)."""
        if self._last is not None and self._encoded is None:
            # The last message may still grow: keep the chain as it was before it.
            self._before = self._chain.copy()
            self._seal(self._last)
        return self._chain.digest()

    def finish(self, breakpoint: bool) -> list[Any]:
        """The messages, encoded, the chain complete; with ``breakpoint`` the last one
        has a ``cache_control`` breakpoint on its last block that can carry one (after
        the chain took its bytes: the prefix check ignores the markers)."""
        last = self._last
        if last is None:
            return self._sent
        encoded = self._encoded if self._encoded is not None else self._seal(last)
        if breakpoint:
            _breakpoint(last["content"])
            self._sent.append(last)
        else:
            self._sent.append(orjson.Fragment(encoded))
        return self._sent

    def _seal(self, last: dict[str, Any]) -> bytes:
        encoded = self._encoded = orjson.dumps(last)
        self._chain.add(encoded)
        return encoded


def _messages(request: Request, replay: Replay, wire: _Wire) -> None:
    previous: Role | None = None
    for index, message in enumerate(request.messages):
        role = message.role
        where = f"messages[{index}]"
        if role is Role.SYSTEM:
            continue
        if role is Role.ASSISTANT:
            blocks: Sequence[dict[str, Any] | orjson.Fragment]
            blocks = _assistant_blocks(message, where, replay, wire)
            if not blocks:
                # Only reasoning that cannot go back (an interrupted turn's, say): the
                # message is left out with it; the API joins the user turns around it.
                continue
            wire.start({"role": "assistant", "content": blocks})
        elif role is Role.TOOL:
            blocks = _tool_results(message, where)
            if previous is Role.TOOL:
                # Consecutive tool messages answer one assistant turn: one user turn.
                wire.extend(blocks)
            else:
                wire.start({"role": "user", "content": blocks})
        else:
            blocks = text_and_media_blocks(message.parts, f"{where}.parts", _media)
            if previous is Role.TOOL:
                # The tool results open the user turn; the user's own words follow.
                wire.extend(blocks)
            else:
                wire.start({"role": "user", "content": blocks})
        previous = role


# -------------------------------------------------------------------------- response


def stop_reason(value: object, where: str) -> FinishReason | None:
    """Map a wire stop reason; ``pause_turn`` and unknown strings become ``OTHER``."""
    if value is None:
        return None
    if type(value) is not str:
        raise InvalidResponseError(f"{where} must be a string or null, got {_kind(value)}")
    return _STOP.get(value, FinishReason.OTHER)


def dropped_by_api(value: object, where: str) -> int:
    """How many blocks of the request the API says it dropped: the ``thinking_dropped``
    entries of a response's ``input_transformations`` (``{"type", "path": "messages.{i}
    .content.{j}", "reason"}``; other entry types, such as ``thinking_mismatch_allowed``,
    dropped nothing and are ignored). The dropped blocks are named in a DEBUG record of
    the ``scope.models`` logger. ``None`` (absent) is 0."""
    if value is None:
        return 0
    if type(value) is not list:
        raise InvalidResponseError(f"{where} must be an array, got {_kind(value)}")
    dropped: list[str] = []
    for index, raw in enumerate(value):
        here = f"{where}[{index}]"
        entry = _obj(raw, here)
        if entry.get("type") == "thinking_dropped":
            dropped.append(f"{_str(entry, 'path', here)} ({_str(entry, 'reason', here)})")
    if dropped and _logger.isEnabledFor(logging.DEBUG):
        _logger.debug(
            "AnthropicModel: the API dropped %d block(s) of the request: %s",
            len(dropped),
            "; ".join(dropped),
        )
    return len(dropped)


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        raise InvalidResponseError(f"{where}.{key} must be a string, got {_kind(value)}")
    return value


def _signature(text: str, where: str) -> bytes:
    """The bytes of a thinking block's signature; re-encoding them gives ``text`` back
    exactly, or the response is refused (the signature must round-trip)."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidResponseError(f"{where} is not base64: {exc}") from exc
    if base64.b64encode(data).decode("ascii") != text:
        raise InvalidResponseError(
            f"{where} is not canonical base64 (padded, no stray bits), so it could not be "
            "sent back exactly"
        )
    return data


#: The usage counts ``_Usage.update`` keeps: (wire key, attribute).
_USAGE_COUNTS: Final = (
    ("input_tokens", "input"),
    ("output_tokens", "output"),
    ("cache_read_input_tokens", "cache_read"),
    ("cache_creation_input_tokens", "cache_creation"),
)


class _Usage:
    """The usage counts seen so far (``message_delta`` repeats or updates them)."""

    __slots__ = ("cache_creation", "cache_read", "input", "output", "thinking")

    def __init__(self) -> None:
        self.input = 0
        self.output = 0
        self.cache_read: int | None = None
        self.cache_creation: int | None = None
        self.thinking: int | None = None

    def update(self, raw: object, where: str) -> None:
        obj = _obj(raw, where)
        for key, attribute in _USAGE_COUNTS:
            value = _count(obj, key, where)
            if value is not None:
                setattr(self, attribute, value)
        value = _nested_count(obj, "output_tokens_details", "thinking_tokens", where)
        if value is not None:
            self.thinking = value

    def usage(self, where: str) -> Usage:
        # scope's input count includes the cached parts; Anthropic's input_tokens does not.
        total_input = self.input + (self.cache_read or 0) + (self.cache_creation or 0)
        with as_invalid_response(where):
            return Usage(
                total_input, self.output, self.thinking, self.cache_read, self.cache_creation
            )


def _reasoning_meta(base: Metadata, last: Part | None, index: int) -> Metadata:
    """``base``, or ``base`` plus the block index when the previous part is reasoning with
    the same metadata (so the accumulator keeps the two blocks apart)."""
    if last is not None and last.kind is PartKind.REASONING and last.metadata == base:
        return base.merge(Metadata({BLOCK_KEY: index}))
    return base


def _arguments_text(value: object, where: str) -> str:
    obj = _obj(value if value is not None else {}, where)
    return orjson.dumps(obj).decode("utf-8")


def parse_message(data: bytes) -> Response:
    """Map a ``message`` JSON body to a ``Response`` (an ``error`` body raises the
    matching ``ProviderError``; a malformed one ``InvalidResponseError``)."""
    body = _load(data, "response body")
    verbatim = Verbatim(data)
    if body.get("type") == "error" or body.get("error") is not None:
        raise embedded_error(
            f"the server answered with an error: {error_message(body.get('error'))}",
            body,
            body.get("error"),
        )
    where = "response"
    content = body.get("content")
    if content is None:
        content = []
    if type(content) is not list:
        raise InvalidResponseError(f"{where}.content must be an array, got {_kind(content)}")
    parts: list[Part] = []
    with as_invalid_response(where):
        for index, raw in enumerate(content):
            here = f"{where}.content[{index}]"
            block = _obj(raw, here)
            kind = block.get("type")
            last = parts[-1] if parts else None
            if kind == "text":
                text = _str(block, "text", here)
                meta = _EMPTY_META
                if block.get("citations"):
                    meta = Metadata({CITATIONS_KEY: verbatim.at("content", index, "citations")})
                if (
                    text
                    and last is not None
                    and last.kind is PartKind.TEXT
                    and last.metadata == meta
                ):
                    # Adjacent blocks of one kind and metadata: one part, as a stream
                    # accumulates them.
                    parts[-1] = Part(PartKind.TEXT, text=last.text + text, metadata=meta)
                elif text:
                    parts.append(Part(PartKind.TEXT, text=text, metadata=meta))
            elif kind == "thinking":
                signature = _signature(_str(block, "signature", here), f"{here}.signature")
                text = _str(block, "thinking", here)
                if text or signature:
                    meta = _reasoning_meta(_EMPTY_META, last, index)
                    parts.append(
                        Part(PartKind.REASONING, text=text, signature=signature, metadata=meta)
                    )
            elif kind == "redacted_thinking":
                data_text = _str(block, "data", here)
                if not data_text:
                    raise InvalidResponseError(f"{here}.data must not be empty")
                meta = _reasoning_meta(_REDACTED_META, last, index)
                parts.append(
                    Part(PartKind.REASONING, signature=data_text.encode("utf-8"), metadata=meta)
                )
            elif kind == "tool_use":
                arguments = _arguments_text(block.get("input"), f"{here}.input")
                with as_invalid_response(here):
                    call = ToolCall(_str(block, "id", here), _str(block, "name", here), arguments)
                meta = _EMPTY_META
                if block.get("caller") is not None:
                    meta = Metadata({CALLER_KEY: verbatim.at("content", index, "caller")})
                parts.append(Part(PartKind.TOOL_CALL, tool_call=call, metadata=meta))
            else:
                # server_tool_use and its result, MCP blocks, compaction, fallback ...:
                # the server's own items, never client tool calls; kept whole (§6k).
                parts.append(_native(kind, verbatim.tree("content", index), here))
        reason = stop_reason(body.get("stop_reason"), f"{where}.stop_reason")
        usage = _Usage()
        if body.get("usage") is not None:
            usage.update(body["usage"], f"{where}.usage")
        extra = _EMPTY_META
        matched = body.get("stop_sequence")
        if matched is not None:
            if type(matched) is not str:
                raise InvalidResponseError(f"{where}.stop_sequence must be a string or null")
            extra = Metadata({"anthropic/stop_sequence": matched})
        dropped = dropped_by_api(
            body.get("input_transformations"), f"{where}.input_transformations"
        )
        if dropped:
            extra = extra.merge(Metadata({DROPPED_KEY: dropped}))
        metadata = ResponseMetadata(
            _meta_text(f"{where}.id", _str(body, "id", where)),
            _meta_text(f"{where}.model", _str(body, "model", where)),
            usage.usage(f"{where}.usage"),
            extra,
        )
        parts = _after_fallbacks(parts)
        message_meta = _EMPTY_META
        if body.get("container") is not None:
            _obj(body["container"], f"{where}.container")
            message_meta = Metadata({CONTAINER_KEY: verbatim.at("container")})
        if parts:
            output = Output(Message(Role.ASSISTANT, parts, message_meta), reason)
        else:  # the container of an answer without content, kept as a stream keeps it
            output = Output(None, reason, message_metadata=message_meta)
        return Response(output, metadata)


def _fallback_model(part: Part) -> str | None:
    """The model a ``fallback`` block hands over to (its ``to.model``), or None."""
    native = part.native
    if native is None or native.type != "fallback":
        return None
    to = native.data.value().get("to")
    model = to.get("model") if isinstance(to, dict) else None
    return model if isinstance(model, str) and model else None


def _with_model(part: Part, model: str) -> Part:
    """``part`` stamped as made by ``model`` (part metadata ``scope/model``)."""
    return attrs.evolve(part, metadata=part.metadata.merge(Metadata({MODEL_KEY: model})))


def _after_fallbacks(parts: list[Part]) -> list[Part]:
    """The parts, each after a ``fallback`` block stamped with the model it handed over
    to (DESIGN §6k: one answer from several models; ownership is decided per part)."""
    model: str | None = None
    out: list[Part] = []
    for part in parts:
        out.append(part if model is None else _with_model(part, model))
        model = _fallback_model(part) or model
    return out


def _citations(data: bytes) -> list[Any]:
    """The citations a ``content_block_start`` event's text block starts with."""
    citations = Verbatim(data).tree("content_block", "citations")
    if type(citations) is not list:
        raise InvalidResponseError("content_block_start.content_block.citations must be an array")
    return citations


def _native(kind: object, tree: Any, where: str) -> Part:
    """A native part (DESIGN §6k) of a content block the adapter does not model."""
    if type(kind) is not str or not kind or kind != kind.strip():
        raise InvalidResponseError(f"{where}.type must be a block type, got {kind!r}")
    with as_invalid_response(where):
        return Part(PartKind.NATIVE, native=NativeItem(API, kind, RawJSON.from_value(tree)))


# ---------------------------------------------------------------------------- stream


@final
class EventMapper:
    """Turns the events of one Messages stream into ``Response`` deltas.

    Every delta it returns is valid for ``ResponseAccumulator``: text and thinking
    deltas become text and reasoning parts (a thinking block's signature, gathered from
    its ``signature_delta`` events, arrives as a signature-only reasoning part when the
    block stops, so it is decoded whole); a ``redacted_thinking`` block is one reasoning
    part; a ``tool_use`` block is a ``ToolCallDelta`` when it starts and one per
    ``input_json_delta`` (the block index gives the call's id and name), and ``{}`` when
    it stops without input; a block the adapter does not model is one native part when
    it stops, holding what its deltas brought (a server tool's ``input_json_delta``
    input, a compaction block's ``compaction_delta`` summary); ``message_start`` and
    ``message_delta`` give id, model, usage snapshots and the finish reason. ``ping``
    and unknown events add nothing.
    ``end_marker_seen`` is true once ``message_stop`` arrived, ``finish_reason_seen``
    once a stop reason did. ``map`` returns ``None`` for an event that adds nothing. A
    malformed event raises ``InvalidResponseError``; an ``error`` event the
    ``ProviderError`` of its type (``overloaded_error``: ``ProviderServerError``, ...).
    """

    __slots__ = (
        "_blocks",
        "_data",
        "_last",
        "_model",
        "_usage",
        "end_marker_seen",
        "finish_reason_seen",
    )

    def __init__(self) -> None:
        # index -> [type, tool id, tool name, got input?, pieces, metadata, kept]: pieces
        # are a thinking block's signature, a cited text block's text or a native
        # block's input fragments; kept is a cited text block's citations or a native
        # block's start (both as parsed exactly), else None.
        self._blocks: dict[int, list[Any]] = {}
        self._data = b""  # the event being mapped, for what is kept verbatim
        self._model: str | None = None  # the model a fallback block handed over to
        self._last: Part | None = None  # the last part handed out (for adjacency)
        self._usage = _Usage()
        self.end_marker_seen = False
        self.finish_reason_seen = False

    def map(self, event: str, data: bytes) -> Response | None:
        """Map one event; see the class docstring."""
        if self.end_marker_seen:
            raise InvalidResponseError("stream event after message_stop")
        payload = _load(data, "stream event")
        self._data = data
        kind = payload.get("type", event)
        if kind == "error" or event == "error":
            raise embedded_error(
                f"the server reported an error mid-stream: {error_message(payload.get('error'))}",
                payload,
                payload.get("error"),
            )
        # What ``as_invalid_response(f"stream event {kind}")`` does, without building the
        # message and a context manager per event (a try costs nothing until it raises).
        try:
            return self._map(kind, payload)
        except InvalidResponseError:
            raise
        except ScopeError as exc:
            raise InvalidResponseError(f"stream event {kind}: {exc}") from exc

    def _parts(self, parts: list[Part]) -> Response:
        if self.finish_reason_seen:
            raise InvalidResponseError("stream event carries content after the stop_reason")
        model = self._model
        if model is not None:
            parts = [_with_model(part, model) for part in parts]
        self._last = parts[-1]
        self._model = _fallback_model(parts[-1]) or model
        return Response(Output(Message(Role.ASSISTANT, parts)))

    def _text(self, kind: PartKind, text: str, metadata: Metadata) -> Response:
        """``_parts([Part(kind, text=text, metadata=metadata)])``, built by ``text_delta``
        (the hot path: one text or thinking fragment)."""
        if self.finish_reason_seen:
            raise InvalidResponseError("stream event carries content after the stop_reason")
        if self._model is not None:
            metadata = metadata.merge(Metadata({MODEL_KEY: self._model}))
        chunk = text_delta(kind, text, metadata)
        self._last = chunk.message.parts[0]
        return chunk

    def _map(self, kind: object, payload: dict[str, Any]) -> Response | None:
        if kind == "content_block_delta":
            return self._delta(payload)
        if kind == "content_block_start":
            return self._start(payload)
        if kind == "content_block_stop":
            return self._stop(payload)
        if kind == "message_start":
            message = _obj(payload.get("message"), "message_start.message")
            where = "message_start.message"
            if message.get("usage") is not None:
                self._usage.update(message["usage"], f"{where}.usage")
            dropped = dropped_by_api(
                message.get("input_transformations"), f"{where}.input_transformations"
            )
            metadata = ResponseMetadata(
                _meta_text(f"{where}.id", _str(message, "id", where)),
                _meta_text(f"{where}.model", _str(message, "model", where)),
                self._usage.usage(f"{where}.usage"),
                Metadata({DROPPED_KEY: dropped}) if dropped else _EMPTY_META,
            )
            return Response(None, metadata)
        if kind == "message_delta":
            delta = _obj(payload.get("delta") or {}, "message_delta.delta")
            reason = stop_reason(delta.get("stop_reason"), "message_delta.delta.stop_reason")
            extra = _EMPTY_META
            matched = delta.get("stop_sequence")
            if matched is not None:
                if type(matched) is not str:
                    raise InvalidResponseError(
                        "message_delta.delta.stop_sequence must be a string or null"
                    )
                extra = Metadata({"anthropic/stop_sequence": matched})
            if payload.get("usage") is not None:
                self._usage.update(payload["usage"], "message_delta.usage")
            transformations = payload.get("input_transformations")
            if transformations is not None:
                # Sent here only after a mid-stream fallback: it replaces the count of
                # message_start (the accumulator keeps the last value).
                dropped = dropped_by_api(transformations, "message_delta.input_transformations")
                extra = extra.merge(Metadata({DROPPED_KEY: dropped}))
            metadata = ResponseMetadata(usage=self._usage.usage("message_delta.usage"), extra=extra)
            # The code execution container comes after the last block: metadata for the
            # message without a part (DESIGN §6k: a stream keeps what a call keeps).
            message_meta = _EMPTY_META
            if delta.get("container") is not None:
                _obj(delta["container"], "message_delta.delta.container")
                message_meta = Metadata(
                    {CONTAINER_KEY: Verbatim(self._data).at("delta", "container")}
                )
            output = None
            if reason is not None:
                self.finish_reason_seen = True
            if reason is not None or message_meta:
                output = Output(finish_reason=reason, message_metadata=message_meta)
            return Response(output, metadata)
        if kind == "message_stop":
            self.end_marker_seen = True
            return None
        return None  # ping, and event types added after this adapter was written

    def _index(self, payload: dict[str, Any], where: str) -> int:
        index = payload.get("index")
        if type(index) is not int or index < 0:
            raise InvalidResponseError(f"{where}.index must be a non-negative integer")
        return index

    def _started(self, payload: dict[str, Any], where: str) -> tuple[int, list[Any]]:
        """The index and state of the block an event names, which must have started."""
        index = self._index(payload, where)
        state = self._blocks.get(index)
        if state is None:
            raise InvalidResponseError(f"{where}: block {index} was never started")
        return index, state

    def _start(self, payload: dict[str, Any]) -> Response | None:
        where = "content_block_start"
        index = self._index(payload, where)
        block = _obj(payload.get("content_block"), f"{where}.content_block")
        here = f"{where}.content_block"
        kind = block.get("type")
        if index in self._blocks:
            raise InvalidResponseError(f"{where}: block {index} started twice")
        state: list[Any] = [kind, "", "", False, [], _EMPTY_META, None]
        self._blocks[index] = state
        if kind == "text":
            text = _str(block, "text", here)
            if "citations" in block:
                # A cited block: its text waits for its citations (the part carries
                # them in its metadata, as a call's does) until the block stops.
                state[6] = [] if not block["citations"] else _citations(self._data)
                if text:
                    state[4].append(text)
                return None
            return self._parts([Part(PartKind.TEXT, text=text)]) if text else None
        if kind == "thinking":
            state[5] = _reasoning_meta(_EMPTY_META, self._last, index)
            text = _str(block, "thinking", here)
            signature = _str(block, "signature", here)
            if signature:
                state[4].append(signature)
            if text:
                return self._parts([Part(PartKind.REASONING, text=text, metadata=state[5])])
            return None
        if kind == "redacted_thinking":
            data_text = _str(block, "data", here)
            if not data_text:
                raise InvalidResponseError(f"{here}.data must not be empty")
            meta = _reasoning_meta(_REDACTED_META, self._last, index)
            part = Part(PartKind.REASONING, signature=data_text.encode("utf-8"), metadata=meta)
            return self._parts([part])
        if kind == "tool_use":
            state[1] = _str(block, "id", here)
            state[2] = _str(block, "name", here)
            if block.get("caller") is not None:
                state[5] = Metadata(
                    {CALLER_KEY: Verbatim(self._data).at("content_block", "caller")}
                )
            initial = block.get("input")
            arguments = ""
            if initial:  # usually {} here, the input following as input_json_delta
                arguments = _arguments_text(initial, f"{here}.input")
                state[3] = True
            return self._parts([self._call(state, arguments, here)])
        # Server tool blocks, their results, MCP blocks, ...: kept whole when they stop
        # (a server_tool_use's input follows as input_json_delta).
        _native(kind, {}, here)  # checks the type
        state[6] = Verbatim(self._data).tree("content_block")
        return None

    def _call(self, state: list[Any], arguments: str, where: str) -> Part:
        with as_invalid_response(where):
            delta = ToolCallDelta(state[1], state[2], arguments)
        return Part(PartKind.TOOL_CALL_DELTA, tool_call_delta=delta, metadata=state[5])

    def _delta(self, payload: dict[str, Any]) -> Response | None:
        where = "content_block_delta"
        _, state = self._started(payload, where)
        here = "content_block_delta.delta"
        delta = _obj(payload.get("delta"), here)
        kind = delta.get("type")
        block_type = state[0]
        if kind == "text_delta" and block_type == "text":
            text = _str(delta, "text", here)
            if state[6] is not None:  # a cited block: kept until it stops
                state[4].append(text)
                return None
            return self._text(PartKind.TEXT, text, EMPTY_METADATA) if text else None
        if kind == "citations_delta" and block_type == "text":
            _obj(delta.get("citation"), f"{here}.citation")
            if state[6] is None:  # a block that started without citations
                state[6] = []
            state[6].append(Verbatim(self._data).tree("delta", "citation"))
            return None
        if kind == "thinking_delta" and block_type == "thinking":
            text = _str(delta, "thinking", here)
            if not text:
                return None
            return self._text(PartKind.REASONING, text, state[5])
        if kind == "signature_delta" and block_type == "thinking":
            state[4].append(_str(delta, "signature", here))
            return None
        if kind == "compaction_delta" and block_type == "compaction":
            # A compaction block starts with content null: its summary (and opaque
            # state) arrive here, kept for the block's stop.
            for member in ("content", "encrypted_content"):
                if delta.get(member) is not None:
                    state[4].append((member, _str(delta, member, here)))
            return None
        if kind == "input_json_delta" and block_type not in _MODELLED:
            state[4].append(_str(delta, "partial_json", here))  # a server tool's input
            return None
        if kind == "input_json_delta" and block_type == "tool_use":
            fragment = _str(delta, "partial_json", here)
            if not fragment:
                return None
            state[3] = True
            return self._parts([self._call(state, fragment, here)])
        if block_type in ("text", "thinking", "redacted_thinking", "tool_use") and kind in (
            "text_delta",
            "thinking_delta",
            "signature_delta",
            "input_json_delta",
        ):
            article = "an" if kind.startswith("input") else "a"
            raise InvalidResponseError(f"{here}: {article} {kind} for a {block_type} block")
        return None  # deltas added later: not carried

    def _stop(self, payload: dict[str, Any]) -> Response | None:
        where = "content_block_stop"
        index, state = self._started(payload, where)
        kept = state[6]
        if kept is not None and state[0] == "text":
            text = "".join(state[4])
            if not text:
                return None
            meta = Metadata({CITATIONS_KEY: RawJSON.from_value(kept)}) if kept else _EMPTY_META
            return self._parts([Part(PartKind.TEXT, text=text, metadata=meta)])
        if kept is not None and state[0] == "compaction":
            joined: dict[str, str] = {}
            for member, fragment in state[4]:
                joined[member] = joined.get(member, "") + fragment
            kept.update(joined)
            return self._parts([_native(state[0], kept, where)])
        if kept is not None:
            fragments = "".join(state[4])
            if fragments.strip():
                try:
                    kept["input"] = Verbatim(fragments.encode("utf-8")).tree()
                except ValueError as exc:
                    raise InvalidResponseError(f"block {index} input: {exc}") from exc
            return self._parts([_native(state[0], kept, where)])
        if state[0] == "thinking" and state[4]:
            signature = _signature("".join(state[4]), f"block {index} signature")
            state[4] = []
            if signature:
                part = Part(PartKind.REASONING, signature=signature, metadata=state[5])
                return self._parts([part])
        if state[0] == "tool_use" and not state[3]:
            state[3] = True
            return self._parts([self._call(state, "{}", where)])  # no input: {}
        return None
