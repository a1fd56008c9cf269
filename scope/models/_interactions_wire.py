"""Pure mapping between scope chat values and the Gemini Interactions API
(``POST /v1beta/interactions``, the "steps" shape of revision ``2026-05-20``).

No I/O and no HTTP library here: ``build_body`` turns a ``Request`` into the JSON body of
an interaction, ``parse_response`` turns an ``Interaction`` into a ``Response``,
``EventMapper`` turns the server-sent events of a stream (``interaction.created``,
``step.start``/``step.delta``/``step.stop``, ``interaction.completed``, ``error``) into
accumulator deltas, ``refine_error`` reads what the error bodies say beyond the status.
What it shares with the ``generateContent`` mapping (thought signature decoding and
ownership, the placeholder signature, the error refinements) comes from
``_gemini_wire``. The mapping decisions are documented in ``scope.models.gemini``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final, final

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
    ToolCallDelta,
    Usage,
    response_metadata,
    text_delta,
    token_usage,
)
from scope.errors import (
    InvalidJSONError,
    InvalidResponseError,
    ProviderError,
    ScopeError,
    UnsupportedOptionError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, SourceKind
from scope.metadata import EMPTY_METADATA, Metadata
from scope.models._errors import error_for_status, error_message
from scope.models._gemini_wire import (
    PLACEHOLDER_SIGNATURE,
    PROVIDER,
    SIGNATURE_KEY,
    decode_signature,
    inline_bytes,
    merge_config,
    object_arguments,
    sendable_signature,
    string_member,
)
from scope.models._gemini_wire import refine_error as _refine_gemini_error
from scope.models._json_shape import count as _count
from scope.models._json_shape import kind as _kind
from scope.models._json_shape import load as _load
from scope.models._json_shape import meta_text as _meta_text
from scope.models._json_shape import obj as _obj
from scope.models._provenance import Replay
from scope.models._wire import as_invalid_response, extension_fields, prepare, put_options

__all__ = [
    "API",
    "API_REVISION",
    "EXTENSION_NAMESPACE",
    "INTERACTION_KEY",
    "PROVIDER",
    "REASONING_LEVELS",
    "RESERVED_FIELDS",
    "STATUS_KEY",
    "STEP_KEY",
    "EventMapper",
    "build_body",
    "finish_reason",
    "parse_response",
    "refine_error",
]

#: The wire protocol, as the answers' provenance names it (§6c). The provider is the
#: ``generateContent`` adapter's (``gcp.gemini``): the same service, another API, so
#: neither adapter owns the other's messages.
API: Final = "gemini.interactions"

#: The schema revision the adapter speaks, sent as the ``Api-Revision`` header.
API_REVISION: Final = "2026-05-20"

#: Extensions ``gemini-interactions/<field>`` become body fields.
EXTENSION_NAMESPACE: Final = "gemini-interactions"

#: Part metadata: the ordinal of the output step a part came from (0 for the first step
#: the model produced). Parts of one step share it, so the accumulator keeps two
#: adjacent steps apart (two signed thoughts would otherwise merge) and the request puts
#: each part back into its own step.
STEP_KEY: Final = "gemini/step"

#: Message metadata: the interaction's ``id``, when the API gives one (it answers ``""``
#: for an interaction it does not store, ``store: false``); with ``store=True`` the next
#: request continues from the last own message carrying it (``previous_interaction_id``).
INTERACTION_KEY: Final = "gemini/interaction_id"

#: Output metadata: the interaction's ``status`` as the API spelled it.
STATUS_KEY: Final = "gemini/status"

#: Message metadata: the ``annotations`` (citations) of the answer's text, verbatim, as
#: a JSON object from the output step's ordinal (a string) to its annotations in order.
#: A stream sends them after the text they annotate (``text_annotation_delta``), so they
#: cannot be part metadata there (a chunk without a message carries them); call and
#: stream both keep them here, stored with the message. The model's own citations:
#: never sent back.
ANNOTATIONS_KEY: Final = "gemini/annotations"

#: ``reasoning_effort`` -> ``generation_config.thinking_level`` (with
#: ``thinking_summaries: "auto"``). The API has no level that turns thinking off.
REASONING_LEVELS: Final[dict[str, str]] = {
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
}

#: Body fields the adapter owns: a ``gemini-interactions/<field>`` extension may not set
#: them (``generation_config`` is merged key by key instead, see ``build_body``).
RESERVED_FIELDS: Final = frozenset(
    {
        "model",
        "input",
        "system_instruction",
        "tools",
        "stream",
        "store",
        "previous_interaction_id",
        "response_format",
        "response_mime_type",
        "agent",
        "background",
    }
)

#: Options sent in ``generation_config`` as they are: (option, field).
_OPTION_FIELDS: Final = (("max_tokens", "max_output_tokens"),)

#: Options the API has no field for (``temperature`` and ``top_p`` are deprecated in
#: the API reference's ``GenerationConfig``: gone from it in July 2026, back marked
#: "will be removed"; the extension ``gemini-interactions/generation_config`` still
#: sends them for whoever must).
_REFUSED_OPTIONS: Final = (
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
)

#: Media content types by the MIME type's top-level type; everything else is a document.
_MEDIA_TYPES: Final = {"image": "image", "audio": "audio", "video": "video"}
_CONTENT_MEDIA: Final = frozenset({"image", "audio", "video", "document"})

#: The status an ``error`` event's string ``code`` stands for.
_CODE_STATUS: Final[dict[str, int]] = {
    "invalid_request": 400,
    "invalid_argument": 400,
    "failed_precondition": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "resource_exhausted": 429,
    "rate_limit_exceeded": 429,
    "internal": 500,
    "internal_error": 500,
    "unavailable": 503,
    "gateway_timeout": 504,
    "deadline_exceeded": 504,
}

_API_NAME: Final = "the Gemini Interactions API"
_NO_USAGE: Final = Usage()


# --------------------------------------------------------------------------- request


def build_body(
    request: Request,
    *,
    default_options: Options,
    model: str,
    stream: bool,
    replay: Replay | None = None,
    store: bool = False,
) -> dict[str, Any]:
    """The JSON body (a dict; RawJSON values as ``orjson.Fragment``) for ``request``.

    Validates the request and refuses (``UnsupportedOptionError``) anything populated the
    API cannot carry; raises before any I/O. Thought signatures, signed thoughts and
    native steps go back only from the adapter's own messages (``replay``, default:
    provider ``gcp.gemini``); every part left out is recorded in ``replay.left_out``.
    ``store``: keep the interaction on the server and continue from the last own
    message's interaction id (``previous_interaction_id``), sending only what follows it.
    """
    options, chosen = prepare(request, default_options, model, "GeminiInteractionsModel")
    if replay is None:
        replay = Replay(API, PROVIDER)
    replay.model = chosen
    for option in _REFUSED_OPTIONS:
        if getattr(options, option) is not None:
            raise UnsupportedOptionError(
                f"{option} has no field in the Gemini Interactions API (or a deprecated "
                "one); leave it unset"
            )
    messages = request.messages
    start = 0
    previous = ""
    if store:
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            stamped = message.metadata.get(INTERACTION_KEY)
            if message.role is Role.ASSISTANT and stamped is not None and replay.owns(message):
                value = stamped.value()
                if isinstance(value, str) and value:
                    previous, start = value, index + 1
                break
    body: dict[str, Any] = {"model": chosen}
    body["input"] = _input(messages, start, replay)
    system = [part.text for m in messages if m.role is Role.SYSTEM for part in m.parts]
    if system:
        body["system_instruction"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                **({"description": tool.description} if tool.description else {}),
                "parameters": orjson.Fragment(tool.input_schema.bytes),
            }
            for tool in request.tools
        ]
    fmt = options.output_format
    if fmt is not None and fmt.type is not OutputFormatType.TEXT:
        response_format: dict[str, Any] = {"type": "text", "mime_type": "application/json"}
        if fmt.type is OutputFormatType.JSON_SCHEMA:
            assert fmt.schema is not None
            response_format["schema"] = orjson.Fragment(fmt.schema.bytes)
        body["response_format"] = response_format
    config = _generation_config(options)
    # Extensions of other namespaces are meant for other providers and are ignored.
    for name, raw in extension_fields(
        options, EXTENSION_NAMESPACE, RESERVED_FIELDS, "GeminiInteractionsModel"
    ):
        if name == "generation_config":
            merge_config(config, raw, f"{EXTENSION_NAMESPACE}/generation_config")
            continue
        body[name] = orjson.Fragment(raw.bytes)
    if config:
        body["generation_config"] = config
    body["store"] = store
    if previous:
        body["previous_interaction_id"] = previous
    if stream:
        body["stream"] = True
    return body


def _generation_config(options: Options) -> dict[str, Any]:
    config: dict[str, Any] = {}
    put_options(options, config, _OPTION_FIELDS)
    if options.stop:  # stop=() (an explicit empty list) is the API's default
        config["stop_sequences"] = list(options.stop)
    effort = options.reasoning_effort
    if effort in REASONING_LEVELS:
        config["thinking_level"] = REASONING_LEVELS[effort]
        config["thinking_summaries"] = "auto"
    elif effort:
        known = ", ".join(REASONING_LEVELS)
        raise UnsupportedOptionError(
            f"reasoning_effort {effort!r} has no Gemini Interactions thinking level "
            f"(known: {known}; thinking cannot be turned off)"
        )
    return config


def _content(part: Part, where: str) -> dict[str, Any]:
    """A text or media part as a content item."""
    if part.kind is PartKind.TEXT:
        return {"type": "text", "text": part.text}
    media = part.media
    assert media is not None
    kind = _MEDIA_TYPES.get(media.mime.partition("/")[0], "document")
    source = media.source
    if source.kind is SourceKind.BYTES:
        data = base64.b64encode(source.data).decode("ascii")
        return {"type": kind, "mime_type": media.mime, "data": data}
    if source.kind is SourceKind.URI:
        return {"type": kind, "mime_type": media.mime, "uri": source.uri}
    raise UnsupportedOptionError(
        f"{where}: media by reference cannot be sent to the Gemini Interactions API (send "
        "its bytes, or the file's URI from the Files API as a URI source)"
    )


def _step_of(part: Part) -> RawJSON | None:
    return part.metadata.get(STEP_KEY)


def _model_steps(
    message: Message, where: str, replay: Replay, current: bool
) -> list[dict[str, Any] | orjson.Fragment]:
    """The steps of an assistant message, in its order; ``current``: it belongs to the
    turn being answered, where a function call needs a signed thought before it."""
    own = replay.owns(message)
    steps: list[dict[str, Any] | orjson.Fragment] = []
    # The step the last part went into, and its step key: parts of one output step (or
    # adjacent text/media parts without a step key) go into one step.
    open_step: dict[str, Any] | None = None
    open_key: RawJSON | None = None
    thought_sent = False
    # The output steps of which a reasoning part carries a signature this request sends:
    # their other reasoning parts (summary text) go into the same thought step.
    signed = {
        _step_of(part)
        for part in message.parts
        if part.kind is PartKind.REASONING
        and sendable_signature(part, replay.owns_part(message, part, own)) is not None
    }
    for index, part in enumerate(message.parts):
        here = f"{where}.parts[{index}]"
        kind = part.kind
        key = _step_of(part)
        if kind is PartKind.TEXT or kind is PartKind.MEDIA:
            item = _content(part, here)
            if open_step is not None and open_step["type"] == "model_output" and key == open_key:
                open_step["content"].append(item)
            else:
                open_step, open_key = {"type": "model_output", "content": [item]}, key
                steps.append(open_step)
        elif kind is PartKind.REASONING:
            part_own = replay.owns_part(message, part, own)
            signature = sendable_signature(part, part_own)
            if signature is None and not (part_own and key is not None and key in signed):
                why = "reasoning of another model" if not own else "reasoning without a signature"
                replay.leave_out(here, why)
                continue
            if (
                open_step is not None
                and open_step["type"] == "thought"
                and key == open_key
                and key is not None
            ):
                # One thought step whose summary and signature came as separate parts
                # (a stream's signature with a spelling kept in metadata).
                if part.text:
                    open_step.setdefault("summary", []).append({"type": "text", "text": part.text})
                if signature is not None:
                    open_step["signature"] = signature
                continue
            open_step, open_key = {"type": "thought"}, key
            if signature is not None:
                open_step["signature"] = signature
            if part.text:
                open_step["summary"] = [{"type": "text", "text": part.text}]
            steps.append(open_step)
            thought_sent = True
        elif kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            if current and not own and not thought_sent:
                # The API refuses a function call of the current turn without a signed
                # thought before it; a foreign call has none of Gemini's: Google's
                # documented placeholder stands in for it.
                steps.append({"type": "thought", "signature": PLACEHOLDER_SIGNATURE})
                thought_sent = True
            step: dict[str, Any] = {
                "type": "function_call",
                "id": call.id,
                "name": call.name,
                "arguments": object_arguments(call.arguments, here, _API_NAME),
            }
            signature = sendable_signature(part, own)
            if signature is not None:
                step["signature"] = signature
            steps.append(step)
            open_step, open_key = step, key
        elif kind is PartKind.NATIVE:
            native = replay.native(part, replay.owns_part(message, part, own), here)
            if native is not None:
                steps.append(native)
            open_step = open_key = None
        else:  # pragma: no cover - Request refuses tool_call_delta parts
            raise UnsupportedOptionError(
                f"{here}: {kind} parts cannot be sent to the Gemini Interactions API"
            )
    return steps


def _function_results(message: Message, where: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for index, part in enumerate(message.parts):
        result = part.tool_result
        assert result is not None
        here = f"{where}.parts[{index}].output"
        output = result.output
        answer: Any = None
        if any(p.kind is PartKind.MEDIA for p in output.content):
            items = []
            for position, item in enumerate(output.content):
                content = _content(item, f"{here}.content[{position}]")
                if content["type"] not in ("text", "image"):
                    raise UnsupportedOptionError(
                        f"{here}: a function result carries text and images only, "
                        f"got {content['type']}"
                    )
                items.append(content)
            answer = items
        else:
            text = output.text() or ""
            if text.lstrip().startswith("{"):
                try:
                    answer = orjson.Fragment(RawJSON.parse(text).bytes)
                except InvalidJSONError:
                    answer = None
            if answer is None:
                answer = [{"type": "text", "text": text}]
        step: dict[str, Any] = {
            "type": "function_result",
            "call_id": result.id,
            "name": result.name,
            "result": answer,
        }
        if result.is_error:
            step["is_error"] = True
        steps.append(step)
    return steps


def _input(
    messages: Sequence[Message], start: int, replay: Replay
) -> list[dict[str, Any] | orjson.Fragment]:
    out: list[dict[str, Any] | orjson.Fragment] = []
    # The turn being answered starts after the last user message.
    turn_start = max((i for i, m in enumerate(messages) if m.role is Role.USER), default=-1)
    for index in range(start, len(messages)):
        message = messages[index]
        where = f"messages[{index}]"
        role = message.role
        if role is Role.SYSTEM:
            continue
        if role is Role.ASSISTANT:
            out.extend(_model_steps(message, where, replay, index > turn_start))
        elif role is Role.TOOL:
            out.extend(_function_results(message, where))
        else:
            content = [
                _content(part, f"{where}.parts[{position}]")
                for position, part in enumerate(message.parts)
            ]
            out.append({"type": "user_input", "content": content})
    return out


# -------------------------------------------------------------------------- response


def finish_reason(status: str, calls: bool) -> FinishReason | None:
    """The finish reason of an interaction's ``status`` (``calls``: the answer has
    function calls); ``None`` while it is in progress."""
    if status in ("", "in_progress", "queued"):
        return None
    if status == "completed":
        return FinishReason.TOOL_CALLS if calls else FinishReason.STOP
    if status == "requires_action":
        return FinishReason.TOOL_CALLS if calls else FinishReason.OTHER
    if status == "incomplete":
        return FinishReason.LENGTH
    return FinishReason.OTHER


_str = string_member


_USAGE_KEYS: Final = (
    "total_input_tokens",
    "total_output_tokens",
    "total_thought_tokens",
    "total_cached_tokens",
)


def _usage(raw: object, where: str) -> Usage:
    here = f"{where}.usage"
    usage = _obj(raw, here)
    counts = [_count(usage, key, here) for key in _USAGE_KEYS]
    prompt, output, thoughts = (value or 0 for value in counts[:3])
    with as_invalid_response(here):
        return token_usage(
            prompt,
            output + thoughts,
            counts[2],
            counts[3],
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _media(item: dict[str, Any], kind: str, where: str) -> Media:
    mime = _str(item, "mime_type", where)
    with as_invalid_response(where):
        if item.get("data") is not None:
            return Media.from_bytes(mime, inline_bytes(_str(item, "data", where), where))
        return Media.from_uri(mime, _str(item, "uri", where))


def _signature(text: str, where: str) -> tuple[bytes, Metadata]:
    """The bytes of a thought signature and the part metadata that keeps its spelling
    when it is not the standard padded base64 of those bytes."""
    signature = decode_signature(text, where)
    if base64.b64encode(signature).decode("ascii") != text:
        return signature, Metadata({SIGNATURE_KEY: text})
    return signature, EMPTY_METADATA


def _step_meta(ordinal: int, extra: Metadata = EMPTY_METADATA) -> Metadata:
    meta = Metadata({STEP_KEY: ordinal})
    return meta.merge(extra) if extra else meta


def _native(step: dict[str, Any], kind: str, where: str) -> Part:
    with as_invalid_response(where):
        return Part(PartKind.NATIVE, native=NativeItem(API, kind, RawJSON.from_value(step)))
    raise AssertionError("unreachable")  # pragma: no cover


def _summary_text(summary: object, where: str) -> str | None:
    """The text of a thought's ``summary`` (its text items joined), or None when it
    holds something else (an image): the step is then kept whole."""
    if summary is None:
        return ""
    if type(summary) is not list:
        raise InvalidResponseError(f"{where}.summary must be an array, got {_kind(summary)}")
    texts = []
    for position, raw in enumerate(summary):
        item = _obj(raw, f"{where}.summary[{position}]")
        if item.get("type") != "text":
            return None
        texts.append(_str(item, "text", f"{where}.summary[{position}]"))
    return "".join(texts)


def _content_parts(
    content: object,
    ordinal: int,
    where: str,
    out: list[Part],
    step: dict[str, Any],
    annotations: dict[str, list[Any]],
) -> None:
    """The parts of a ``model_output`` step's content, appended to ``out`` (its text's
    annotations to ``annotations``, under the step's ordinal)."""
    if content is None:
        return
    if type(content) is not list:
        raise InvalidResponseError(f"{where}.content must be an array, got {_kind(content)}")
    for position, raw in enumerate(content):
        here = f"{where}.content[{position}]"
        item = _obj(raw, here)
        kind = item.get("type")
        if kind == "text":
            text = _str(item, "text", here)
            _annotate(annotations, ordinal, item.get("annotations"), here)
            if text:
                with as_invalid_response(here):
                    out.append(Part(PartKind.TEXT, text=text, metadata=_step_meta(ordinal)))
        elif kind in _CONTENT_MEDIA:
            with as_invalid_response(here):
                out.append(
                    Part(
                        PartKind.MEDIA,
                        media=_media(item, str(kind), here),
                        metadata=_step_meta(ordinal),
                    )
                )
        else:
            # Content scope does not model: kept as a one-item model_output step.
            single = {**step, "content": [item]}
            out.append(_native(single, "model_output", here))


def _annotate(annotations: dict[str, list[Any]], ordinal: int, found: object, where: str) -> None:
    if found is None:
        return
    if type(found) is not list:
        raise InvalidResponseError(f"{where}.annotations must be an array, got {_kind(found)}")
    annotations.setdefault(str(ordinal), []).extend(found)


def _step_parts(
    step: dict[str, Any],
    ordinal: int,
    where: str,
    out: list[Part],
    annotations: dict[str, list[Any]] | None = None,
) -> bool:
    """The parts of one complete output step, appended to ``out`` (the annotations of
    its text to ``annotations``); True for a function call."""
    kind = step.get("type")
    if kind == "thought":
        text = _summary_text(step.get("summary"), where)
        if text is None:
            out.append(_native(step, "thought", where))
            return False
        signature_text = _str(step, "signature", where)
        signature, extra = b"", EMPTY_METADATA
        if signature_text:
            signature, extra = _signature(signature_text, f"{where}.signature")
        if text or signature:
            with as_invalid_response(where):
                out.append(
                    Part(
                        PartKind.REASONING,
                        text=text,
                        signature=signature,
                        metadata=_step_meta(ordinal, extra),
                    )
                )
        return False
    if kind == "model_output":
        if step.get("error") is not None:
            out.append(_native(step, "model_output", where))
            return False
        found: dict[str, list[Any]] = {} if annotations is None else annotations
        _content_parts(step.get("content"), ordinal, where, out, step, found)
        return False
    if kind == "function_call":
        arguments = step.get("arguments")
        encoded = orjson.dumps(
            _obj(arguments if arguments is not None else {}, f"{where}.arguments")
        )
        meta = _step_meta(ordinal)
        call_signature = _str(step, "signature", where)
        if call_signature:
            decode_signature(call_signature, f"{where}.signature")
            meta = meta.merge(Metadata({SIGNATURE_KEY: call_signature}))
        with as_invalid_response(where):
            call = ToolCall(_str(step, "id", where), _str(step, "name", where), encoded.decode())
            out.append(Part(PartKind.TOOL_CALL, tool_call=call, metadata=meta))
        return True
    if type(kind) is not str or not kind:
        raise InvalidResponseError(f"{where}.type must be a non-empty string, got {kind!r}")
    # Server-side tool steps (google_search_call, code_execution_result, ...) and any
    # step type scope does not model: kept whole (DESIGN §6k).
    out.append(_native(step, kind, where))
    return False


def _interaction_metadata(interaction: dict[str, Any], where: str) -> ResponseMetadata:
    raw_usage = interaction.get("usage")
    usage = _NO_USAGE if raw_usage is None else _usage(raw_usage, where)
    interaction_id = _meta_text(f"{where}.id", _str(interaction, "id", where))
    model = _meta_text(f"{where}.model", _str(interaction, "model", where))
    return response_metadata(interaction_id, model, usage)


def _raise_errors(interaction: dict[str, Any], where: str) -> None:
    """A ``failed`` interaction names its errors: the first one is raised."""
    errors = interaction.get("errors")
    if _str(interaction, "status", where) == "failed" and type(errors) is list and errors:
        raise _error(errors[0], interaction)


def _error(error: object, body: object) -> ProviderError:
    """The provider error for an error object of the API (``{"code", "message"}``)."""
    code = error.get("code") if isinstance(error, dict) else None
    status: int | None = None
    if type(code) is int and 100 <= code <= 599:
        status = code
    elif isinstance(code, str):
        status = _CODE_STATUS.get(code.lower())
    exc = error_for_status(
        status, f"the server answered with an error: {error_message(error)}", body=body
    )
    exc.status_code = None  # the adapter fills in the HTTP status
    return exc


def parse_response(data: bytes) -> Response:
    """Map an ``Interaction`` body to a ``Response`` (an ``error`` body raises the
    matching ``ProviderError``; a malformed one ``InvalidResponseError``)."""
    body = _load(data, "response body")
    if body.get("error") is not None:
        raise _error(body["error"], body)
    where = "interaction"
    _raise_errors(body, where)
    steps = body.get("steps")
    if steps is None:
        steps = []
    if type(steps) is not list:
        raise InvalidResponseError(f"{where}.steps must be an array, got {_kind(steps)}")
    parts: list[Part] = []
    annotations: dict[str, list[Any]] = {}
    calls = False
    ordinal = 0
    for position, raw in enumerate(steps):
        here = f"{where}.steps[{position}]"
        step = _obj(raw, here)
        if step.get("type") == "user_input":
            continue  # the input echoed back: not part of the answer
        calls = _step_parts(step, ordinal, here, parts, annotations) or calls
        ordinal += 1
    status = _str(body, "status", where)
    chunk = _answer(
        parts, status, calls, _interaction_metadata(body, where), body, where, annotations
    )
    accumulator = ResponseAccumulator()
    accumulator.add(chunk)  # the same merging as a stream's, so both modes agree
    response = accumulator.response()
    assert response is not None
    return response


def _answer(
    parts: list[Part],
    status: str,
    calls: bool,
    metadata: ResponseMetadata | None,
    interaction: dict[str, Any],
    where: str,
    annotations: dict[str, list[Any]],
) -> Response:
    reason = finish_reason(status, calls)
    message = None
    cited = EMPTY_METADATA
    if annotations:
        cited = Metadata({ANNOTATIONS_KEY: RawJSON.from_value(annotations)})
    if parts:
        message_meta = cited
        interaction_id = _str(interaction, "id", where)
        if interaction_id:
            message_meta = message_meta.merge(Metadata({INTERACTION_KEY: interaction_id}))
        with as_invalid_response(where):
            message = Message(Role.ASSISTANT, parts, message_meta)
        cited = EMPTY_METADATA
    extra: dict[str, Any] = {STATUS_KEY: status} if status else {}
    output_meta = OutputMetadata(Metadata(extra)) if extra else None
    if message or reason or extra or cited:
        return Response(Output(message, reason, output_meta, cited), metadata)
    return Response(None, metadata)


# ---------------------------------------------------------------------------- stream


@final
class EventMapper:
    """Turns the server-sent events of a streamed interaction into ``Response`` deltas.

    ``interaction.created`` gives the response id and model; a step's ``step.start``,
    ``step.delta`` and ``step.stop`` give its parts as they come: ``text`` deltas text,
    ``thought_summary`` deltas reasoning text, a ``thought_signature`` delta the
    thought's signature (a reasoning part of the same step), a ``function_call`` step a
    tool call begun at its start (name and id) whose ``arguments_delta`` texts
    concatenate, exactly as sent (a call without argument deltas gets the JSON of the
    start's ``arguments``). Content already on a step's start (a ``model_output`` step
    or a thought summary may carry its first text there) counts as its first delta. A
    step of a type scope does not model is kept whole: the start's step, updated with
    every member its deltas carry (other than ``type``), as one native part at
    ``step.stop``. ``interaction.completed`` gives the status (the finish reason) and
    the usage; ``data: [DONE]`` ends the stream; an ``error`` event raises the
    ``ProviderError`` its code stands for. ``interaction.status_update`` carries nothing.
    """

    __slots__ = (
        "_annotations",
        "_calls",
        "_id",
        "_kinds",
        "_native",
        "_ordinals",
        "_pending_args",
        "_started",
        "end_marker_seen",
        "finish_reason_seen",
    )

    def __init__(self) -> None:
        self._annotations: dict[str, list[Any]] = {}  # step ordinal -> its annotations
        self._calls: dict[int, tuple[str, str, bool]] = {}  # index -> id, name, args seen
        self._kinds: dict[int, str] = {}  # step index -> type
        self._ordinals: dict[int, int] = {}  # step index -> output step ordinal
        self._native: dict[int, dict[str, Any]] = {}  # step index -> the step so far
        self._pending_args: dict[int, object] = {}  # call step index -> start's arguments
        self._id = ""
        self._started = False
        self.end_marker_seen = False
        self.finish_reason_seen = False

    def map(self, event: str, data: bytes) -> Response | None:
        """Map one event; see the class docstring."""
        del event  # every payload names its own event_type
        if data == b"[DONE]":
            self.end_marker_seen = True
            return None
        if self.end_marker_seen:
            raise InvalidResponseError("stream event after [DONE]")
        body = _load(data, "stream event")
        kind = body.get("event_type")
        where = f"{kind} event" if isinstance(kind, str) else "stream event"
        try:
            if kind == "step.delta":
                return self._delta(body, where)
            if kind == "step.start":
                return self._start(body, where)
            if kind == "step.stop":
                return self._stop(body, where)
            if kind == "interaction.created":
                interaction = _obj(body.get("interaction"), f"{where}.interaction")
                self._id = _str(interaction, "id", f"{where}.interaction")
                return Response(None, _interaction_metadata(interaction, f"{where}.interaction"))
            if kind in ("interaction.completed", "interaction.requires_action"):
                return self._completed(body, where)
            if kind == "error":
                raise _error(body.get("error"), body)
            return None  # interaction.status_update and events scope has no use for
        except (InvalidResponseError, ProviderError):
            raise
        except ScopeError as exc:
            raise InvalidResponseError(f"{where}: {exc}") from exc

    def _index(self, body: dict[str, Any], where: str) -> int:
        index = body.get("index")
        if type(index) is not int or index < 0:
            raise InvalidResponseError(f"{where}.index must be a non-negative integer")
        return index

    def _ordinal(self, index: int, where: str) -> int:
        ordinal = self._ordinals.get(index)
        if ordinal is None:
            raise InvalidResponseError(f"{where}: step {index} was never started")
        return ordinal

    def _start(self, body: dict[str, Any], where: str) -> Response | None:
        if self.finish_reason_seen:
            raise InvalidResponseError(f"{where} after interaction.completed")
        index = self._index(body, where)
        step = _obj(body.get("step"), f"{where}.step")
        kind = step.get("type")
        if type(kind) is not str or not kind:
            raise InvalidResponseError(f"{where}.step.type must be a non-empty string")
        if index in self._kinds:
            raise InvalidResponseError(f"{where}: step {index} started twice")
        if kind == "user_input":
            # The input echoed back (a stream skips it; be lenient): its deltas and stop
            # carry nothing of the answer.
            self._kinds[index] = kind
            self._ordinals[index] = -1
            return None
        ordinal = sum(1 for value in self._ordinals.values() if value >= 0)
        self._kinds[index] = kind
        self._ordinals[index] = ordinal
        here = f"{where}.step"
        parts: list[Part] = []
        if kind == "function_call":
            call_id, name = _str(step, "id", here), _str(step, "name", here)
            self._calls[index] = (call_id, name, False)
            meta = _step_meta(ordinal)
            signature = _str(step, "signature", here)
            if signature:
                decode_signature(signature, f"{here}.signature")
                meta = meta.merge(Metadata({SIGNATURE_KEY: signature}))
            with as_invalid_response(here):
                delta = ToolCallDelta(call_id, name, "")
            parts.append(Part(PartKind.TOOL_CALL_DELTA, tool_call_delta=delta, metadata=meta))
            self._pending_args[index] = step.get("arguments")
        elif kind == "model_output" or (
            kind == "thought" and _summary_text(step.get("summary"), here) is not None
        ):
            before = len(orjson.dumps(self._annotations))
            _step_parts(step, ordinal, here, parts, self._annotations)
            if len(orjson.dumps(self._annotations)) != before:
                return self._with_annotations(self._parts(parts))
        else:
            self._native[index] = dict(step)
            return None
        return self._parts(parts)

    def _delta(self, body: dict[str, Any], where: str) -> Response | None:
        if self.finish_reason_seen:
            raise InvalidResponseError(f"{where} after interaction.completed")
        index = self._index(body, where)
        ordinal = self._ordinal(index, where)
        if ordinal < 0:
            return None  # a delta of the echoed input
        delta = _obj(body.get("delta"), f"{where}.delta")
        here = f"{where}.delta"
        kind = delta.get("type")
        native = self._native.get(index)
        if native is not None:
            if kind == "thought_summary":
                native.setdefault("summary", []).append(delta.get("content"))
            elif kind == "thought_signature":
                native["signature"] = delta.get("signature")
            else:
                native.update((key, value) for key, value in delta.items() if key != "type")
            return None
        if kind == "text":
            text = _str(delta, "text", here)
            if not text:
                return None
            return text_delta(PartKind.TEXT, text, _step_meta(ordinal))
        if kind == "thought_summary":
            content = delta.get("content")
            if content is None:
                return None
            item = _obj(content, f"{here}.content")
            if item.get("type") != "text":
                raise InvalidResponseError(
                    f"{here}.content: a thought summary of type {item.get('type')!r} "
                    "cannot be streamed as reasoning text"
                )
            text = _str(item, "text", f"{here}.content")
            if not text:
                return None
            return text_delta(PartKind.REASONING, text, _step_meta(ordinal))
        if kind == "thought_signature":
            text = _str(delta, "signature", here)
            if not text:
                return None
            signature, extra = _signature(text, f"{here}.signature")
            part = Part(
                PartKind.REASONING, signature=signature, metadata=_step_meta(ordinal, extra)
            )
            return self._parts([part])
        if kind == "arguments_delta":
            call = self._calls.get(index)
            if call is None:
                raise InvalidResponseError(f"{here}: arguments for step {index}, not a call")
            text = _str(delta, "arguments", here)
            self._calls[index] = (call[0], call[1], True)
            if not text:
                return None
            part = Part(
                PartKind.TOOL_CALL_DELTA,
                tool_call_delta=ToolCallDelta(call[0], call[1], text),
                metadata=_step_meta(ordinal),
            )
            return self._parts([part])
        if kind == "text_annotation_delta":
            _annotate(self._annotations, ordinal, delta.get("annotations"), here)
            return self._with_annotations(None)
        if kind in _CONTENT_MEDIA:
            parts: list[Part] = []
            item = {k: v for k, v in delta.items()}
            _content_parts([item], ordinal, where, parts, {"type": "model_output"}, {})
            return self._parts(parts)
        raise InvalidResponseError(
            f"{here}: a {kind!r} delta in a {self._kinds.get(index)!r} step is not understood"
        )

    def _stop(self, body: dict[str, Any], where: str) -> Response | None:
        index = self._index(body, where)
        ordinal = self._ordinal(index, where)
        if ordinal < 0:
            return None
        native = self._native.pop(index, None)
        if native is not None:
            parts: list[Part] = []
            _step_parts(native, ordinal, f"{where} (step {index})", parts)
            return self._parts(parts)
        call = self._calls.get(index)
        if call is not None and not call[2]:
            # No arguments_delta: the start's arguments are the call's.
            arguments = self._pending_args.get(index)
            text = orjson.dumps(_obj(arguments if arguments is not None else {}, where))
            part = Part(
                PartKind.TOOL_CALL_DELTA,
                tool_call_delta=ToolCallDelta(call[0], call[1], text.decode()),
                metadata=_step_meta(ordinal),
            )
            self._calls[index] = (call[0], call[1], True)
            return self._parts([part])
        return None

    def _completed(self, body: dict[str, Any], where: str) -> Response:
        here = f"{where}.interaction"
        interaction = _obj(body.get("interaction"), here)
        _raise_errors(interaction, here)
        status = _str(interaction, "status", here)
        metadata = _interaction_metadata(interaction, here)
        reason = finish_reason(status, bool(self._calls))
        if reason is not None:
            self.finish_reason_seen = True
        extra: dict[str, Any] = {STATUS_KEY: status} if status else {}
        output_meta = OutputMetadata(Metadata(extra)) if extra else None
        output = Output(None, reason, output_meta) if reason or output_meta else None
        return Response(output, metadata)

    def _with_annotations(self, chunk: Response | None) -> Response:
        """``chunk`` (or one without a message) carrying every annotation so far as
        message metadata (it merges per key: the latest object wins)."""
        cited = Metadata({ANNOTATIONS_KEY: RawJSON.from_value(self._annotations)})
        output = chunk.output if chunk is not None else None
        message = output.message if output is not None else None
        if message is None:
            return Response(Output(message_metadata=cited))
        message = Message(message.role, message.parts, message.metadata.merge(cited))
        return Response(Output(message), chunk.metadata if chunk is not None else None)

    def _parts(self, parts: list[Part]) -> Response | None:
        if not parts:
            return None
        meta = EMPTY_METADATA
        if not self._started and self._id:
            meta = Metadata({INTERACTION_KEY: self._id})
        self._started = True
        return Response(Output(Message(Role.ASSISTANT, parts, meta)))


# ---------------------------------------------------------------------------- errors


def refine_error(error: ProviderError) -> ProviderError:
    """What an error body says beyond its status: the ``generateContent`` adapter's
    refinements (``API_KEY_INVALID``, ``RetryInfo``), and an error that came as an
    event stream (``event: error`` then ``data: {...}``; the API answers so when it
    finds a bad thought signature after the stream began) read from its ``data``."""
    body = error.body
    if isinstance(body, str) and body.lstrip().startswith(("event:", "data:")):
        for line in body.splitlines():
            if not line.startswith("data:"):
                continue
            try:
                decoded = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                continue
            if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
                error.body = decoded
                break
    return _refine_gemini_error(error)
