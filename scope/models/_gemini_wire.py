"""Pure mapping between scope chat values and the Gemini API's ``generateContent`` wire
format.

No I/O and no HTTP library here: ``build_body`` turns a ``Request`` into the JSON body of
``POST /v1beta/models/{model}:generateContent`` (or ``:streamGenerateContent``),
``parse_response`` turns a ``GenerateContentResponse`` into a ``Response``, ``ChunkMapper``
turns the server-sent events of a stream (each a whole ``GenerateContentResponse``) into
accumulator deltas, ``refine_error`` reads what Gemini's error bodies say beyond the
status. The mapping decisions are documented in ``scope.models.gemini``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, final
from urllib.parse import quote

import orjson

from scope.chat import (
    FinishReason,
    Message,
    NativeItem,
    Options,
    Output,
    OutputFormatType,
    OutputMetadata,
    Part,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    Role,
    ToolCall,
    Usage,
    response_metadata,
    text_delta,
    token_usage,
)
from scope.errors import (
    AuthenticationError,
    InvalidJSONError,
    InvalidResponseError,
    ProviderError,
    RateLimitError,
    ScopeError,
    UnsupportedOptionError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, SourceKind
from scope.metadata import EMPTY_METADATA, Metadata
from scope.models._errors import embedded_error, error_message
from scope.models._json_shape import Verbatim
from scope.models._json_shape import count as _count
from scope.models._json_shape import kind as _kind
from scope.models._json_shape import load as _load
from scope.models._json_shape import meta_text as _meta_text
from scope.models._json_shape import obj as _obj
from scope.models._provenance import Replay
from scope.models._wire import as_invalid_response, extension_fields, prepare, put_options

__all__ = [
    "API",
    "PLACEHOLDER_SIGNATURE",
    "PROVIDER",
    "BLOCK_KEY",
    "BLOCK_REASON_KEY",
    "FINISH_REASON_KEY",
    "REASONING_LEVELS",
    "RESERVED_FIELDS",
    "SIGNATURE_KEY",
    "SIGNATURE_ONLY_KEY",
    "SYNTHETIC_ID_KEY",
    "ChunkMapper",
    "GROUNDING_KEY",
    "build_body",
    "decode_signature",
    "finish_reason",
    "inline_bytes",
    "merge_config",
    "object_arguments",
    "parse_response",
    "refine_error",
    "route",
    "sendable_signature",
    "string_member",
]

#: The wire protocol and the provider, as the answers' provenance names them (§6c).
API: Final = "gemini.generate_content"
PROVIDER: Final = "gcp.gemini"

#: What Google documents for a function call whose signature cannot be had (one made
#: by another model): the first call of each step of the current turn carries it.
PLACEHOLDER_SIGNATURE: Final = "skip_thought_signature_validator"

#: Part metadata: the ``thoughtSignature`` of a text, media or ``functionCall`` part, as
#: the exact string received (sent back verbatim on the same part). On a reasoning part
#: it appears only when the received string is not the standard padded base64 of the
#: signature bytes (URL-safe, say), so that the same string goes back.
SIGNATURE_KEY: Final = "gemini/thought_signature"

#: Part metadata ``true`` on a reasoning part that stands for an empty text part that
#: carried only a signature (a stream's last chunk does that); sent back as such.
SIGNATURE_ONLY_KEY: Final = "gemini/signature_only"

#: Part metadata ``true`` on a tool call whose id the adapter made (the API sent none):
#: that id is never sent back, nor on the function response answering the call.
SYNTHETIC_ID_KEY: Final = "gemini/synthetic_id"

#: Part metadata keeping a signed reasoning part apart from the next one (the accumulator
#: would merge them and concatenate the signatures): the wire part's index.
BLOCK_KEY: Final = "gemini/part"

#: Response metadata: ``promptFeedback.blockReason`` of a blocked prompt.
BLOCK_REASON_KEY: Final = "gemini/block_reason"

#: Output metadata: the candidate's ``finishReason`` as the API spelled it.
FINISH_REASON_KEY: Final = "gemini/finish_reason"

#: Message metadata: the candidate's ``groundingMetadata`` (search queries, the pages or
#: documents the answer rests on, which text each supports), verbatim. The API takes no
#: such member in a request: it is kept for the application (and ``scope.web``'s source
#: parts), never sent back. A stream carries it on the chunk that has it (with its parts,
#: or as metadata for the message when that chunk has none).
GROUNDING_KEY: Final = "gemini/grounding"

#: ``reasoning_effort`` -> ``generationConfig.thinkingConfig``: ``"none"`` is a zero
#: thinking budget; the others a ``thinkingLevel`` with thought summaries included.
REASONING_LEVELS: Final[dict[str, str]] = {
    "minimal": "MINIMAL",
    "low": "LOW",
    "medium": "MEDIUM",
    "high": "HIGH",
    "xhigh": "XHIGH",
}

#: Body fields the adapter owns: a ``gemini/<field>`` extension may not set them
#: (``generationConfig`` is merged key by key instead, see ``build_body``).
RESERVED_FIELDS: Final = frozenset({"contents", "systemInstruction", "tools"})

_FINISH: Final[dict[str, FinishReason]] = {
    "STOP": FinishReason.STOP,
    "MAX_TOKENS": FinishReason.LENGTH,
    "SAFETY": FinishReason.CONTENT_FILTER,
    "RECITATION": FinishReason.CONTENT_FILTER,
    "BLOCKLIST": FinishReason.CONTENT_FILTER,
    "PROHIBITED_CONTENT": FinishReason.CONTENT_FILTER,
    "SPII": FinishReason.CONTENT_FILTER,
}

#: Options sent in ``generationConfig`` as they are: (option, field).
_OPTION_FIELDS: Final = (
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("top_k", "topK"),
    ("max_tokens", "maxOutputTokens"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
)

_B64: Final = re.compile(r"[A-Za-z0-9+/]*={0,2}\Z")
_B64_URL: Final = re.compile(r"[A-Za-z0-9_-]*={0,2}\Z")
_EMPTY_META: Final = Metadata()
_NO_USAGE: Final = Usage()
_TRUE: Final = RawJSON.parse("true")
_TEXT: Final = PartKind.TEXT
#: Members of a wire part that are not its kind (a native part's type is its first other
#: member: ``executableCode``, ``codeExecutionResult``, ``toolCall`` ...).
_NOT_KINDS: Final = frozenset({"thought", "thoughtSignature", "partMetadata"})

#: ``ChunkMapper._last`` after a text part without a signature (metadata empty).
_PLAIN_TEXT: Final = (PartKind.TEXT, _EMPTY_META, _EMPTY_META, False)


def route(model: str, stream: bool) -> str:
    """The path (and query) of a request for ``model``."""
    name = quote(model.removeprefix("models/"), safe="-._~")
    if stream:
        return f"/v1beta/models/{name}:streamGenerateContent?alt=sse"
    return f"/v1beta/models/{name}:generateContent"


# --------------------------------------------------------------------------- request


def sendable_signature(part: Part, own: bool) -> str | None:
    """The thought signature to send back on ``part`` of an assistant message, or
    ``None``: the one place that decides whether a message's provider state goes back
    (only the adapter's own messages', DESIGN §6c)."""
    if not own:
        return None
    meta = part.metadata.get(SIGNATURE_KEY)
    if meta is not None:
        value = meta.value()
        if isinstance(value, str) and value:
            return value
    if part.kind is PartKind.REASONING and part.signature:
        return base64.b64encode(part.signature).decode("ascii")
    return None


def build_body(
    request: Request,
    *,
    default_options: Options,
    model: str,
    stream: bool,
    replay: Replay | None = None,
) -> dict[str, Any]:
    """The JSON body (a dict; RawJSON values as ``orjson.Fragment``) for ``request``.

    Validates the request and refuses (``UnsupportedOptionError``) anything populated the
    API cannot carry. Raises before any I/O. The model goes in the URL (``route``), not
    the body; so does ``stream``. Signatures go back only from the adapter's own
    messages (``replay``, default: provider ``"gcp.gemini"``; its ``model`` is set to
    the chosen model); every part left out is recorded in ``replay.left_out``.
    """
    options, chosen = prepare(request, default_options, model, "GeminiModel")
    del stream
    if replay is None:
        replay = Replay(API, PROVIDER)
    replay.model = chosen
    system: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role is Role.SYSTEM:
            system.extend({"text": part.text} for part in message.parts)
    body: dict[str, Any] = {"contents": _contents(request, replay)}
    if system:
        body["systemInstruction"] = {"parts": system}
    if request.tools:
        declarations = []
        for tool in request.tools:
            spec: dict[str, Any] = {"name": tool.name}
            if tool.description:
                spec["description"] = tool.description
            spec["parametersJsonSchema"] = orjson.Fragment(tool.input_schema.bytes)
            declarations.append(spec)
        body["tools"] = [{"functionDeclarations": declarations}]
    config = _generation_config(options)
    # Extensions of other namespaces are meant for other providers and are ignored.
    for name, raw in extension_fields(options, "gemini", RESERVED_FIELDS, "GeminiModel"):
        if name == "generationConfig":
            merge_config(config, raw, "gemini/generationConfig")
            continue
        body[name] = orjson.Fragment(raw.bytes)
    if config:
        body["generationConfig"] = config
    return body


def _generation_config(options: Options) -> dict[str, Any]:
    config: dict[str, Any] = {}
    put_options(options, config, _OPTION_FIELDS)
    if options.stop:  # stop=() (an explicit empty list) is the API's default
        config["stopSequences"] = list(options.stop)
    fmt = options.output_format
    if fmt is not None and fmt.type is not OutputFormatType.TEXT:
        config["responseMimeType"] = "application/json"
        if fmt.type is OutputFormatType.JSON_SCHEMA:
            assert fmt.schema is not None
            config["responseJsonSchema"] = orjson.Fragment(fmt.schema.bytes)
    effort = options.reasoning_effort
    if effort == "none":
        config["thinkingConfig"] = {"thinkingBudget": 0}
    elif effort in REASONING_LEVELS:
        config["thinkingConfig"] = {
            "includeThoughts": True,
            "thinkingLevel": REASONING_LEVELS[effort],
        }
    elif effort:
        known = ", ".join(["none", *REASONING_LEVELS])
        raise UnsupportedOptionError(
            f"reasoning_effort {effort!r} has no Gemini thinking level (known: {known}); "
            "pass the extension 'gemini/generationConfig' with a thinkingConfig instead"
        )
    return config


def _media(media: Media, where: str) -> dict[str, Any]:
    source = media.source
    if source.kind is SourceKind.BYTES:
        data = base64.b64encode(source.data).decode("ascii")
        return {"inlineData": {"mimeType": media.mime, "data": data}}
    if source.kind is SourceKind.URI:
        return {"fileData": {"mimeType": media.mime, "fileUri": source.uri}}
    raise UnsupportedOptionError(
        f"{where}: media by reference cannot be sent to the Gemini API (send its bytes, or "
        "the file's URI from the Files API as a URI source)"
    )


def object_arguments(text: str, where: str, api: str = "the Gemini API") -> orjson.Fragment:
    """Tool call arguments as the JSON object a function call carries (``""`` is
    ``{}``); ``UnsupportedOptionError`` naming ``api`` for anything else."""
    if not text:
        return orjson.Fragment(b"{}")
    try:
        raw = RawJSON.parse(text)
    except InvalidJSONError as exc:
        raise UnsupportedOptionError(
            f"{where}: tool call arguments are not JSON, and {api} needs a "
            f"function call's arguments as a JSON object: {exc}"
        ) from exc
    if not raw.bytes.startswith(b"{"):
        raise UnsupportedOptionError(
            f"{where}: tool call arguments must be a JSON object for {api}, got {text[:60]!r}"
        )
    return orjson.Fragment(raw.bytes)


def merge_config(config: dict[str, Any], raw: RawJSON, extension: str) -> None:
    """Merge the extension ``extension`` (``raw``, a JSON object) into the generation
    config the options made, key by key; ``UnsupportedOptionError`` for anything else or
    a key the options already set."""
    value = raw.value()
    if not isinstance(value, dict):
        raise UnsupportedOptionError(f"extension {extension!r} must be a JSON object")
    for key in value:
        if key in config:
            raise UnsupportedOptionError(
                f"extension {extension!r} sets {key!r}, which the options already set"
            )
    nested = orjson.loads(raw.bytes)  # the object, numbers re-read for the body
    for key in value:
        config[key] = orjson.Fragment(orjson.dumps(nested[key]))


def _signed(wire: dict[str, Any], part: Part, own: bool) -> dict[str, Any]:
    signature = sendable_signature(part, own)
    if signature is not None:
        wire["thoughtSignature"] = signature
    return wire


def _model_parts(
    message: Message, where: str, synthetic: set[str], replay: Replay, current: bool
) -> list[dict[str, Any] | orjson.Fragment]:
    """The parts of an assistant message; ``current``: it belongs to the turn being
    answered (after the last user message), where Gemini 3 checks signatures. A native
    part (DESIGN §6k) is the ``orjson.Fragment`` of its stored bytes."""
    own = replay.owns(message)
    placeholder = current and not own  # the first foreign call of this step gets one
    parts: list[dict[str, Any] | orjson.Fragment] = []
    for index, part in enumerate(message.parts):
        here = f"{where}.parts[{index}]"
        kind = part.kind
        if kind is PartKind.TEXT:
            parts.append(_signed({"text": part.text}, part, own))
        elif kind is PartKind.REASONING:
            signature = sendable_signature(part, own)
            if signature is None:
                # Reasoning the API cannot verify (unsigned, another model's) is left
                # out: it is never turned into prompt text.
                why = "reasoning of another model" if not own else "reasoning without a signature"
                replay.leave_out(here, why)
                continue
            if part.metadata.get(SIGNATURE_ONLY_KEY) == _TRUE:
                parts.append({"text": "", "thoughtSignature": signature})
            else:
                parts.append({"text": part.text, "thought": True, "thoughtSignature": signature})
        elif kind is PartKind.MEDIA:
            assert part.media is not None
            parts.append(_signed(_media(part.media, here), part, own))
        elif kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            function: dict[str, Any] = {"name": call.name}
            if part.metadata.get(SYNTHETIC_ID_KEY) == _TRUE:
                synthetic.add(call.id)  # made by the adapter: the API never saw it
            else:
                function["id"] = call.id
            function["args"] = object_arguments(call.arguments, here)
            wire = _signed({"functionCall": function}, part, own)
            if placeholder:
                # Gemini 3 refuses a step of the current turn whose first call has no
                # signature; a foreign call has none of Gemini's: Google's documented
                # placeholder stands in for it.
                wire["thoughtSignature"] = PLACEHOLDER_SIGNATURE
                placeholder = False
            parts.append(wire)
        elif kind is PartKind.NATIVE:
            native = replay.native(part, own, here)
            if native is not None:
                parts.append(native)
        else:  # pragma: no cover - Request refuses tool_call_delta parts
            raise UnsupportedOptionError(f"{here}: {kind} parts cannot be sent to the Gemini API")
    return parts


def _function_responses(message: Message, where: str, synthetic: set[str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(message.parts):
        result = part.tool_result
        assert result is not None
        here = f"{where}.parts[{index}].output"
        output = result.output
        if any(p.kind is PartKind.MEDIA for p in output.content):
            raise UnsupportedOptionError(
                f"{here}: tool results with media cannot be sent to the Gemini API"
            )
        text = output.text() or ""
        answer: Any = None
        if text.lstrip().startswith("{"):
            try:
                answer = orjson.Fragment(RawJSON.parse(text).bytes)
            except InvalidJSONError:
                answer = None
        if answer is None:
            answer = {"error" if result.is_error else "result": text}
        function: dict[str, Any] = {"name": result.name}
        if result.id not in synthetic:
            function["id"] = result.id
        function["response"] = answer
        parts.append({"functionResponse": function})
    return parts


def _contents(request: Request, replay: Replay) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous: Role | None = None
    synthetic: set[str] = set()
    messages = request.messages
    # The turn being answered starts after the last user message.
    turn_start = max((i for i, m in enumerate(messages) if m.role is Role.USER), default=-1)
    for index, message in enumerate(messages):
        role = message.role
        where = f"messages[{index}]"
        if role is Role.SYSTEM:
            continue
        if role is Role.ASSISTANT:
            parts: Sequence[dict[str, Any] | orjson.Fragment]
            parts = _model_parts(message, where, synthetic, replay, index > turn_start)
            if not parts:
                # Only unverifiable reasoning: nothing of this message can be sent.
                previous = None
                continue
            out.append({"role": "model", "parts": parts})
        else:
            if role is Role.TOOL:
                parts = _function_responses(message, where, synthetic)
            else:
                parts = []
                for position, part in enumerate(message.parts):
                    if part.kind is PartKind.TEXT:
                        parts.append({"text": part.text})
                    else:
                        assert part.media is not None
                        parts.append(_media(part.media, f"{where}.parts[{position}]"))
            if previous is Role.TOOL:
                # Function responses of one step, and the user's words after them, form
                # one user content.
                out[-1]["parts"].extend(parts)
            else:
                out.append({"role": "user", "parts": parts})
        previous = role
    return out


# -------------------------------------------------------------------------- response


def finish_reason(value: object, where: str) -> FinishReason | None:
    """Map a wire ``finishReason``; unknown reasons become ``OTHER``."""
    if value is None:
        return None
    if type(value) is not str:
        raise InvalidResponseError(f"{where} must be a string or null, got {_kind(value)}")
    if value == "FINISH_REASON_UNSPECIFIED":
        return None
    return _FINISH.get(value, FinishReason.OTHER)


def string_member(source: dict[str, Any], key: str, where: str) -> str:
    """A string member, ``""`` when absent or null."""
    value = source.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        raise InvalidResponseError(f"{where}.{key} must be a string, got {_kind(value)}")
    return value


def decode_signature(text: str, where: str) -> bytes:
    """The bytes of a ``thoughtSignature`` (standard or URL-safe base64, as Google's SDK
    sends it back)."""
    alphabet = _B64 if _B64.match(text) else _B64_URL if _B64_URL.match(text) else None
    try:
        if alphabet is None:
            raise ValueError("characters outside both base64 alphabets")
        padded = text + "=" * (-len(text) % 4)
        if alphabet is _B64:
            return base64.b64decode(padded, validate=True)
        return base64.urlsafe_b64decode(padded)
    except (binascii.Error, ValueError) as exc:
        raise InvalidResponseError(f"{where} is not base64: {exc}") from exc


_str = string_member

_USAGE_KEYS: Final = (
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
)


def _usage(raw: object, parent: str) -> Usage:
    """The ``Usage`` of ``<parent>.usageMetadata`` (it may come with every chunk: the
    messages naming it are made only for an error)."""
    if type(raw) is not dict:
        raise InvalidResponseError(f"{parent}.usageMetadata must be an object, got {_kind(raw)}")
    get = raw.get
    prompt = get("promptTokenCount")
    candidates = get("candidatesTokenCount")
    thoughts = get("thoughtsTokenCount")
    cached = get("cachedContentTokenCount")
    if not (
        (prompt is None or (type(prompt) is int and prompt >= 0))
        and (candidates is None or (type(candidates) is int and candidates >= 0))
        and (thoughts is None or (type(thoughts) is int and thoughts >= 0))
        and (cached is None or (type(cached) is int and cached >= 0))
    ):
        for key in _USAGE_KEYS:
            _count(raw, key, f"{parent}.usageMetadata")  # raises at the first bad one
    try:
        return token_usage(prompt or 0, (candidates or 0) + (thoughts or 0), thoughts, cached)
    except ScopeError as exc:
        raise InvalidResponseError(f"{parent}.usageMetadata: {exc}") from exc


@final
class ChunkMapper:
    """Turns ``GenerateContentResponse`` objects into ``Response`` deltas: every server-
    sent event of a stream (``map``), or the one body of ``generateContent``
    (``parse_response`` maps it as a one-chunk stream and merges it, so both give the
    same ``Response``).

    Parts of the first candidate become parts in order: ``text`` text (a signature in
    metadata ``gemini/thought_signature``), ``thought: true`` reasoning (its signature as
    the part's signature bytes), an empty text part with only a signature a signature-
    only reasoning part marked ``gemini/signature_only``, ``inlineData``/``fileData``
    media, ``functionCall`` a complete tool call (arguments the JSON text of ``args``;
    id the call's, else ``<responseId or "call">-<n>`` marked ``gemini/synthetic_id``).
    A reasoning part right after a signed reasoning part gets ``gemini/part`` (its wire
    index) so the two stay apart. Other parts (code execution, ...) are not carried.
    ``finish_reason_seen`` is true once a ``finishReason`` (or a prompt block) arrived;
    Gemini streams have no end marker.

    Every chunk of a Gemini stream repeats ``responseId``, ``modelVersion`` and
    ``usageMetadata``: a delta carries its ``ResponseMetadata`` only on the first chunk,
    when one of the three differs from the previous chunk's, or with a prompt block's
    reason. Repeating an unchanged one would merge to the same response (the
    accumulator keeps the latest non-empty id and model and the latest non-zero usage),
    so the merged response is the same, and most deltas are one text part.
    """

    __slots__ = ("_calls", "_index", "_last", "_raw", "end_marker_seen", "finish_reason_seen")

    def __init__(self) -> None:
        self._calls = 0  # function calls seen (for made-up ids)
        self._index = 0  # wire parts seen
        # The last part handed out: kind, metadata without BLOCK_KEY, metadata, and
        # whether it (merged with what it continues) carries a signature.
        self._last: tuple[PartKind, Metadata, Metadata, bool] | None = None
        # The last chunk's responseId, modelVersion and usageMetadata as received (None
        # before the first chunk, whose metadata is always sent).
        self._raw: tuple[object, object, object] | None = None
        self.end_marker_seen = False
        self.finish_reason_seen = False

    def map(self, event: str, data: bytes) -> Response | None:
        """Map one event (a whole ``GenerateContentResponse``); see the class docstring."""
        del event
        if self.finish_reason_seen:
            raise InvalidResponseError("stream event after the finishReason")
        try:
            body = orjson.loads(data)  # _load, inlined: this runs for every chunk
        except orjson.JSONDecodeError:
            body = None
        if type(body) is not dict:
            body = _load(data, "stream event")  # raises, saying what is wrong
        return self.chunk(body, "stream event", data)

    def chunk(self, body: dict[str, Any], where: str, data: bytes) -> Response:
        """The delta for one decoded ``GenerateContentResponse`` (``data``: the document
        it was decoded from, read again exactly only for the parts kept whole)."""
        get = body.get
        error = get("error")
        if error is not None:
            raise embedded_error(
                f"the server answered with an error: {error_message(error)}", body, error
            )
        # What ``as_invalid_response(where)`` does, without a context manager per chunk
        # (a try costs nothing in CPython 3.11 until something raises).
        try:
            # The hot path: one candidate (index 0) with one plain text part, no finish
            # reason, no grounding, no prompt feedback (almost every chunk of an answer).
            # Exactly the chunks for which ``_chunk`` would make one text part with empty metadata
            # and no output metadata: no thought, signature, call or media member, so
            # ``_part`` reads only ``text``; the bookkeeping ``_parts`` does for such a
            # part is the two assignments below.
            candidates = get("candidates")
            if type(candidates) is list and len(candidates) == 1 and get("promptFeedback") is None:
                candidate = candidates[0]
                if (
                    type(candidate) is dict
                    and candidate.get("finishReason") is None
                    and candidate.get("index", 0) == 0
                    and candidate.get("groundingMetadata") is None
                ):
                    content = candidate.get("content")
                    parts = content.get("parts") if type(content) is dict else None
                    if type(parts) is list and len(parts) == 1:
                        wire = parts[0]
                        text = wire.get("text") if type(wire) is dict and len(wire) == 1 else None
                        if type(text) is str and text:
                            metadata = self._metadata(body, _EMPTY_META, where)
                            self._index += 1
                            self._last = _PLAIN_TEXT
                            return text_delta(_TEXT, text, EMPTY_METADATA, metadata)
            return self._chunk(body, where, data)
        except InvalidResponseError:
            raise
        except ScopeError as exc:
            raise InvalidResponseError(f"{where}: {exc}") from exc

    def _metadata(
        self, body: dict[str, Any], extra: Metadata, where: str
    ) -> ResponseMetadata | None:
        """The chunk's ``ResponseMetadata``, or None when its id, model version and usage
        are the previous chunk's and it has no ``extra`` (see the class docstring)."""
        get = body.get
        raw = (get("responseId"), get("modelVersion"), get("usageMetadata"))
        if raw == self._raw and not extra:
            return None
        raw_id, raw_model, raw_usage = raw
        # A string without surrounding whitespace is taken as it is; the checks that name
        # what is wrong run (and raise) for anything else but null.
        response_id = (
            raw_id
            if type(raw_id) is str and raw_id.strip() == raw_id
            else _meta_text(f"{where}.responseId", _str(body, "responseId", where))
        )
        usage = _NO_USAGE if raw_usage is None else _usage(raw_usage, where)
        model = (
            raw_model
            if type(raw_model) is str and raw_model.strip() == raw_model
            else _meta_text(f"{where}.modelVersion", _str(body, "modelVersion", where))
        )
        metadata = response_metadata(response_id, model, usage, extra)
        self._raw = raw
        return metadata

    def _chunk(self, body: dict[str, Any], where: str, data: bytes) -> Response:
        verbatim = Verbatim(data)
        extra = _EMPTY_META
        reason: FinishReason | None = None
        raw_reason = ""
        parts: list[Part] = []
        feedback = body.get("promptFeedback")
        candidates = body.get("candidates")
        if candidates is None:
            candidates = []
        if type(candidates) is not list:
            raise InvalidResponseError(
                f"{where}.candidates must be an array, got {_kind(candidates)}"
            )
        if feedback is not None:
            here = f"{where}.promptFeedback"
            blocked = _str(_obj(feedback, here), "blockReason", here)
            if blocked and not candidates:
                extra = Metadata({BLOCK_REASON_KEY: blocked})
                reason = FinishReason.CONTENT_FILTER
        response_id = _meta_text(f"{where}.responseId", _str(body, "responseId", where))
        message_meta = _EMPTY_META
        for position, raw in enumerate(candidates):
            here = f"{where}.candidates[{position}]"
            candidate = _obj(raw, here)
            if candidate.get("index", 0) != 0:
                continue  # one candidate is asked for; others are not carried
            if candidate.get("groundingMetadata") is not None:
                _obj(candidate["groundingMetadata"], f"{here}.groundingMetadata")
                grounding = verbatim.at("candidates", position, "groundingMetadata")
                message_meta = Metadata({GROUNDING_KEY: grounding})
            content = candidate.get("content")
            if content is not None:
                self._parts(
                    _obj(content, f"{here}.content"),
                    f"{here}.content",
                    response_id,
                    parts,
                    functools.partial(verbatim.at, "candidates", position, "content", "parts"),
                )
            raw_reason = _str(candidate, "finishReason", here)
            reason = finish_reason(candidate.get("finishReason"), f"{here}.finishReason")
            if reason is FinishReason.STOP and self._calls:
                reason = FinishReason.TOOL_CALLS
            break
        metadata = self._metadata(body, extra, where)
        output = None
        if parts or reason is not None or message_meta:
            output_meta = None
            if raw_reason:
                output_meta = OutputMetadata(Metadata({FINISH_REASON_KEY: raw_reason}))
            if parts:
                output = Output(Message(Role.ASSISTANT, parts, message_meta), reason, output_meta)
            else:  # grounding on a chunk without parts: metadata for the message
                output = Output(None, reason, output_meta, message_meta)
        if reason is not None:
            self.finish_reason_seen = True
        return Response(output, metadata)

    def _parts(
        self,
        content: dict[str, Any],
        where: str,
        response_id: str,
        out: list[Part],
        verbatim: Callable[[int], RawJSON],
    ) -> None:
        raw_parts = content.get("parts")
        if raw_parts is None:
            return
        if type(raw_parts) is not list:
            raise InvalidResponseError(f"{where}.parts must be an array, got {_kind(raw_parts)}")
        for position, raw in enumerate(raw_parts):
            here = f"{where}.parts[{position}]"
            index = self._index
            self._index += 1
            part = self._part(
                _obj(raw, here), here, response_id, index, functools.partial(verbatim, position)
            )
            if part is not None:
                out.append(part)
                last = self._last
                signed = bool(part.signature) or SIGNATURE_KEY in part.metadata
                if last is not None and last[0] is part.kind and last[2] == part.metadata:
                    signed = signed or last[3]  # merged into the same part
                base = part.metadata
                if BLOCK_KEY in base:
                    base = Metadata({k: v for k, v in base.items() if k != BLOCK_KEY})
                self._last = (part.kind, base, part.metadata, signed)

    def _reasoning_meta(self, base: Metadata, index: int) -> Metadata:
        """``base``, continuing the last reasoning part when that has the same base and no
        signature yet, or ``base`` plus the wire index when that one is signed (the
        accumulator would otherwise append to a finished, signed thought)."""
        last = self._last
        if last is None or last[0] is not PartKind.REASONING or last[1] != base:
            return base
        if last[3]:
            return base.merge(Metadata({BLOCK_KEY: index}))
        return last[2]

    def _part(
        self,
        wire: dict[str, Any],
        where: str,
        response_id: str,
        index: int,
        verbatim: Callable[[], RawJSON],
    ) -> Part | None:
        signature_text = _str(wire, "thoughtSignature", where)
        signature = b""
        if signature_text:
            signature = decode_signature(signature_text, f"{where}.thoughtSignature")
        meta = Metadata({SIGNATURE_KEY: signature_text}) if signature_text else _EMPTY_META
        thought = wire.get("thought")
        if thought is not None and type(thought) is not bool:
            raise InvalidResponseError(f"{where}.thought must be a boolean, got {_kind(thought)}")
        if "functionCall" in wire:
            call = _obj(wire["functionCall"], f"{where}.functionCall")
            here = f"{where}.functionCall"
            args = call.get("args")
            arguments = orjson.dumps(_obj(args if args is not None else {}, f"{here}.args"))
            self._calls += 1
            call_id = _str(call, "id", here)
            if not call_id:
                call_id = f"{response_id or 'call'}-{self._calls}"
                meta = meta.merge(Metadata({SYNTHETIC_ID_KEY: True}))
            with as_invalid_response(here):
                tool_call = ToolCall(call_id, _str(call, "name", here), arguments.decode())
            return Part(PartKind.TOOL_CALL, tool_call=tool_call, metadata=meta)
        for key in ("inlineData", "fileData"):
            if key in wire:
                return Part(PartKind.MEDIA, media=_media_of(wire[key], key, where), metadata=meta)
        if "text" not in wire and not (thought and signature):
            # executableCode, codeExecutionResult, toolCall, toolResponse ...: kept whole,
            # its thought signature included (DESIGN §6k).
            kind = next((key for key in wire if key not in _NOT_KINDS), None)
            if kind is None:
                return None  # nothing but a signature or a thought flag: nothing to keep
            with as_invalid_response(where):
                native = NativeItem(API, kind, verbatim())
            return Part(PartKind.NATIVE, native=native)
        text = _str(wire, "text", where)
        if thought or (not text and signature):
            meta = _EMPTY_META
            if signature and base64.b64encode(signature).decode("ascii") != signature_text:
                meta = Metadata({SIGNATURE_KEY: signature_text})  # send back as received
            if not thought:
                meta = meta.merge(Metadata({SIGNATURE_ONLY_KEY: True}))
            meta = self._reasoning_meta(meta, index)
            if not text and not signature:
                return None
            return Part(PartKind.REASONING, text=text, signature=signature, metadata=meta)
        if not text:
            return None
        return Part(PartKind.TEXT, text=text, metadata=meta)


def _media_of(raw: object, key: str, where: str) -> Media:
    here = f"{where}.{key}"
    source = _obj(raw, here)
    mime = _str(source, "mimeType", here)
    with as_invalid_response(here):
        if key == "inlineData":
            return Media.from_bytes(mime, inline_bytes(_str(source, "data", here), here))
        return Media.from_uri(mime, _str(source, "fileUri", here))


def inline_bytes(data: str, where: str) -> bytes:
    """The bytes of a base64 ``data`` member (``InvalidResponseError`` naming
    ``<where>.data`` when it is not base64)."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidResponseError(f"{where}.data is not base64: {exc}") from exc


def parse_response(data: bytes) -> Response:
    """Map a ``GenerateContentResponse`` body to a ``Response`` (an ``error`` body raises
    the matching ``ProviderError``; a malformed one ``InvalidResponseError``)."""
    body = _load(data, "response body")
    chunk = ChunkMapper().chunk(body, "response", data)
    accumulator = ResponseAccumulator()
    accumulator.add(chunk)  # the same merging as a stream's, so both modes agree
    response = accumulator.response()
    assert response is not None
    return response


# ---------------------------------------------------------------------------- errors

_DELAY: Final = re.compile(r"(\d+(?:\.\d+)?)s\Z")


def refine_error(error: ProviderError) -> ProviderError:
    """What a Gemini error body says beyond its status: a 400 whose details name the
    reason ``API_KEY_INVALID`` is an ``AuthenticationError``; a 429's
    ``RetryInfo.retryDelay`` (``"12s"``) is its ``retry_after`` when no header gave one."""
    body = error.body
    if isinstance(body, list) and len(body) == 1:
        body = body[0]  # a stream request's error may come as a one-element array
    payload = body.get("error") if isinstance(body, dict) else None
    details = payload.get("details") if isinstance(payload, dict) else None
    if not isinstance(details, list):
        return error
    for detail in details:
        if not isinstance(detail, dict):
            continue
        kind = detail.get("@type")
        if (
            error.status_code == 400
            and isinstance(kind, str)
            and kind.endswith("google.rpc.ErrorInfo")
            and detail.get("reason") == "API_KEY_INVALID"
        ):
            return AuthenticationError(
                str(error), status_code=400, body=error.body, request_id=error.request_id
            )
        if isinstance(error, RateLimitError) and error.retry_after is None:
            delay = detail.get("retryDelay")
            if isinstance(kind, str) and kind.endswith("google.rpc.RetryInfo"):
                match = _DELAY.match(delay) if isinstance(delay, str) else None
                if match is not None:
                    error.retry_after = float(match.group(1))
    return error
