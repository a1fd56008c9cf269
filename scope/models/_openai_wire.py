"""Pure mapping between scope chat values and the OpenAI Chat Completions wire format.

No I/O and no HTTP library here: ``build_body`` turns a ``Request`` into the JSON body,
``parse_completion`` turns a ``chat.completion`` body into a ``Response``, and
``ChunkMapper`` turns ``chat.completion.chunk`` events into accumulator deltas.
"""

from __future__ import annotations

import base64
import mimetypes
from typing import Any, Final, final

import orjson

from scope.chat import (
    FinishReason,
    Message,
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
    InvalidResponseError,
    ScopeError,
    UnsupportedOptionError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, SourceKind
from scope.metadata import EMPTY_METADATA, Metadata
from scope.models._errors import embedded_error, error_message
from scope.models._json_shape import bare_mime as _bare_mime
from scope.models._json_shape import count as _count
from scope.models._json_shape import kind as _kind
from scope.models._json_shape import load as _load
from scope.models._json_shape import meta_text as _meta_text
from scope.models._json_shape import nested_count as _nested_count
from scope.models._json_shape import obj as _obj
from scope.models._provenance import Replay
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
    "EXTRA_CONTENT_KEY",
    "FREEFORM_KEY",
    "PROVIDER",
    "REASONING_DETAILS_KEY",
    "REFUSAL_KEY",
    "RESERVED_FIELDS",
    "ChunkMapper",
    "build_body",
    "data_url",
    "finish_reason",
    "parse_completion",
]

#: The wire protocol and the default provider, as the answers' provenance names them.
API: Final = "openai.chat"
PROVIDER: Final = "openai"

#: Part metadata key marking a text part that is the model's refusal.
REFUSAL_KEY: Final = "openai/refusal"

#: Tool-call part metadata: a call's ``extra_content`` (Gemini's compatible endpoint puts
#: its thought signature there), kept verbatim and sent back on the same call.
EXTRA_CONTENT_KEY: Final = "openai/extra_content"

#: Tool-call part metadata of a call whose arguments are the text the model wrote, not
#: JSON: a custom tool's call (Chat Completions ``"type": "custom"``, a Responses
#: ``custom_tool_call``), whose input a freeform tool takes as its text. The same string
#: as ``scope.tools.FREEFORM_KEY``.
FREEFORM_KEY: Final = "scope/freeform"

#: Message metadata: the ``annotations`` array of the answer (citations that OpenAI's
#: search models and compatible servers attach), as received; a stream's deltas are
#: joined in order and sent with the finish reason (DESIGN §6k: a stream keeps what a
#: call keeps). Never sent back: the API takes no annotations on an input message.
ANNOTATIONS_KEY: Final = "openai/annotations"

#: Message metadata: OpenRouter's ``reasoning_details`` array, kept verbatim (assembled
#: from its fragments in a stream) and sent back on the same assistant message.
REASONING_DETAILS_KEY: Final = "openai/reasoning_details"

#: The members of a ``reasoning_details`` entry whose stream fragments concatenate.
_DETAIL_TEXTS: Final = ("text", "summary", "data")

#: Body fields the adapter owns: an ``openai/<field>`` extension may not set them.
RESERVED_FIELDS: Final = frozenset({"messages", "model", "stream", "stream_options"})

_REFUSAL_META: Final = Metadata({REFUSAL_KEY: True})
_FREEFORM_META: Final = Metadata({FREEFORM_KEY: True})
_EMPTY_META: Final = Metadata()
_TEXT: Final = PartKind.TEXT

_FINISH: Final[dict[str, FinishReason]] = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}

#: Options sent as they are: (option, body field).
_OPTION_FIELDS: Final = (
    ("max_tokens", "max_completion_tokens"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("frequency_penalty", "frequency_penalty"),
    ("presence_penalty", "presence_penalty"),
)

_AUDIO_FORMATS: Final[dict[str, str]] = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}


# --------------------------------------------------------------------------- request


def build_body(
    request: Request,
    *,
    default_options: Options,
    model: str,
    stream: bool,
    replay: Replay | None = None,
    prompt_cache_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body (a dict; RawJSON values as ``orjson.Fragment``) for ``request``.

    Validates the request and refuses (``UnsupportedOptionError``) anything populated the
    protocol cannot carry. Provider state goes back only from the adapter's own messages
    (``replay``, default: provider ``"openai"``); every part left out is recorded in
    ``replay.left_out``. ``prompt_cache_key``, when given, is sent as itself (before the
    extensions, so ``openai/prompt_cache_key`` wins). Raises before any I/O.
    """
    options, chosen = prepare(request, default_options, model, "OpenAIChatModel")
    if replay is None:
        replay = Replay(API, PROVIDER)
    replay.model = chosen
    body: dict[str, Any] = {"model": chosen, "messages": _messages(request.messages, replay)}
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    if prompt_cache_key is not None:
        body["prompt_cache_key"] = prompt_cache_key
    _options(options, body)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _options(options: Options, body: dict[str, Any]) -> None:
    if options.top_k is not None:
        raise UnsupportedOptionError(
            "top_k is not part of the OpenAI Chat Completions protocol; for a compatible "
            "server that accepts it, pass the extension 'openai/top_k' instead"
        )
    put_options(options, body, _OPTION_FIELDS)
    if options.stop:  # stop=() (an explicit empty list) is the protocol's default
        body["stop"] = list(options.stop)
    if options.reasoning_effort:
        body["reasoning_effort"] = options.reasoning_effort
    fmt = options.output_format
    if fmt is not None:
        if fmt.type is OutputFormatType.JSON:
            body["response_format"] = {"type": "json_object"}
        elif fmt.type is OutputFormatType.JSON_SCHEMA:
            assert fmt.schema is not None
            spec: dict[str, Any] = {"name": fmt.name}
            if fmt.description:
                spec["description"] = fmt.description
            spec["schema"] = orjson.Fragment(fmt.schema.bytes)
            if fmt.strict:
                spec["strict"] = True
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
        # OutputFormat.text() is the protocol's default: nothing to send.
    # Extensions of other namespaces are meant for other providers and are ignored.
    for name, raw in extension_fields(options, "openai", RESERVED_FIELDS, "OpenAIChatModel"):
        if name == "n" and raw.value() != 1:
            raise UnsupportedOptionError(
                f"extension 'openai/n' must be 1: a Response carries one choice, got {raw}"
            )
        body[name] = orjson.Fragment(raw.bytes)


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    function = tool_spec(tool, "parameters")
    if tool.strict:  # absent is the protocol's default (not strict)
        function["strict"] = True
    return {"type": "function", "function": function}


def _messages(messages: tuple[Message, ...], replay: Replay) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.role
        where = f"messages[{index}]"
        if role is Role.SYSTEM:
            out.append({"role": "system", "content": message.text})
        elif role is Role.USER:
            out.append({"role": "user", "content": _user_content(message, where)})
        elif role is Role.ASSISTANT:
            out.append(_assistant(message, where, replay))
        else:
            for part_index, part in enumerate(message.parts):
                result = part.tool_result
                assert result is not None
                text = result.output.text()
                if text is None:
                    raise UnsupportedOptionError(
                        f"{where}.parts[{part_index}]: tool result {result.id!r} carries "
                        "media, which an OpenAI Chat Completions tool message cannot carry"
                    )
                out.append({"role": "tool", "tool_call_id": result.id, "content": text})
    return out


def _user_content(message: Message, where: str) -> str | list[dict[str, Any]]:
    parts = message.parts
    if len(parts) == 1 and parts[0].kind is PartKind.TEXT:
        return parts[0].text
    return text_and_media_blocks(parts, f"{where}.parts", _media)


def data_url(media: Media) -> str:
    """``media``'s bytes as a ``data:`` URL (its bare media type, base64)."""
    encoded = base64.b64encode(media.source.data).decode("ascii")
    return f"data:{_bare_mime(media.mime)};base64,{encoded}"


def _media(media: Media, where: str) -> dict[str, Any]:
    source = media.source
    mime = _bare_mime(media.mime)
    if source.kind is SourceKind.REFERENCE:
        return {"type": "file", "file": {"file_id": source.ref}}
    if mime.startswith("image/"):
        url = source.uri if source.kind is SourceKind.URI else data_url(media)
        image: dict[str, Any] = {"url": url}
        detail = media.metadata.get("openai/detail")
        if detail is not None:
            image["detail"] = orjson.Fragment(detail.bytes)
        return {"type": "image_url", "image_url": image}
    if source.kind is SourceKind.URI:
        raise UnsupportedOptionError(
            f"{where}: {mime} media by URI cannot be sent over OpenAI Chat Completions "
            "(only images may be URIs); send the bytes or a file reference"
        )
    if mime.startswith("audio/"):
        fmt = _AUDIO_FORMATS.get(mime)
        if fmt is None:
            raise UnsupportedOptionError(
                f"{where}: audio input must be wav or mp3 for OpenAI Chat Completions, got {mime}"
            )
        data = base64.b64encode(source.data).decode("ascii")
        return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}
    filename = media.name or "file" + (mimetypes.guess_extension(mime) or "")
    return {"type": "file", "file": {"filename": filename, "file_data": data_url(media)}}


def _assistant(message: Message, where: str, replay: Replay) -> dict[str, Any]:
    own = replay.owns(message)
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []  # where each reasoning part is
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, part in enumerate(message.parts):
        kind = part.kind
        if kind is PartKind.TEXT:
            if part.metadata.get(REFUSAL_KEY) == _REFUSAL_META[REFUSAL_KEY]:
                refusals.append(part.text)
            else:
                texts.append(part.text)
        elif kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            spec: dict[str, Any]
            if own and part.metadata.get(FREEFORM_KEY) == _FREEFORM_META[FREEFORM_KEY]:
                # A custom tool's call goes back as it came, its input the text; to
                # another model it is a function call whose arguments are that text.
                spec = {
                    "id": call.id,
                    "type": "custom",
                    "custom": {"name": call.name, "input": call.arguments},
                }
            else:
                spec = {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            extra = part.metadata.get(EXTRA_CONTENT_KEY) if own else None
            if extra is not None:
                spec["extra_content"] = orjson.Fragment(extra.bytes)
            calls.append(spec)
        elif kind is PartKind.MEDIA:
            raise UnsupportedOptionError(
                f"{where}.parts[{index}]: an assistant message cannot carry media over "
                "OpenAI Chat Completions"
            )
        elif kind is PartKind.NATIVE:
            # Chat Completions has no item of a provider's own to send back: what a
            # compatible server attaches is kept in part metadata (DESIGN §6k).
            replay.native(part, False, f"{where}.parts[{index}]")
        else:
            reasoning.append(f"{where}.parts[{index}]")
            if part.text:
                thoughts.append(part.text)
    out: dict[str, Any] = {"role": "assistant"}
    if texts or not (calls or refusals):
        out["content"] = "".join(texts)
    if refusals:
        out["refusal"] = "".join(refusals)
    if calls:
        out["tool_calls"] = calls
    details = message.metadata.get(REASONING_DETAILS_KEY) if own else None
    if details is not None:
        out["reasoning_details"] = orjson.Fragment(details.bytes)
    elif reasoning:
        if not own:
            why = "reasoning of another model"
        elif calls and thoughts:
            # Inside a tool loop, servers that think (DeepSeek, Kimi) need the reasoning
            # of each tool-calling message back (a 400 "Missing reasoning_content field"
            # otherwise). Answers without calls keep it to themselves: those servers
            # ignore it there, and older ones refuse it.
            out["reasoning_content"] = "".join(thoughts)
            why = ""
        else:
            why = "reasoning of an answer without tool calls"
        for here in reasoning if why else ():
            replay.leave_out(here, why)
    return out


# -------------------------------------------------------------------------- response


def finish_reason(value: object, where: str) -> FinishReason | None:
    """Map a wire finish reason; unknown strings become ``FinishReason.OTHER``.

    ``""`` is "not finished", like ``null``: Snowflake Cortex fills every absent field
    with an empty placeholder, on every chunk of a stream.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidResponseError(f"{where} must be a string or null, got {_kind(value)}")
    return _FINISH.get(value, FinishReason.OTHER)


def _opt_str(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise InvalidResponseError(f"{where}.{key} must be a string or null, got {_kind(value)}")


def _str(value: object, where: str, key: str) -> str:
    if type(value) is str:
        return value
    raise InvalidResponseError(f"{where}.{key} must be a string or null, got {_kind(value)}")


def _block_text(value: object, where: str) -> str:
    """The text of a thinking block's ``thinking``: a string, or a list of text chunks."""
    if value is None or type(value) is str:
        return value or ""
    if type(value) is not list:
        raise InvalidResponseError(
            f"{where} must be a string or an array of text chunks, got {_kind(value)}"
        )
    texts: list[str] = []
    for index, raw in enumerate(value):
        chunk = _obj(raw, f"{where}[{index}]")
        if chunk.get("type", "text") != "text":
            raise InvalidResponseError(
                f"{where}[{index}].type must be 'text', got {chunk.get('type')!r}"
            )
        text = chunk.get("text")
        if text:
            texts.append(_str(text, f"{where}[{index}]", "text"))
    return "".join(texts)


def content_blocks(value: list[Any], where: str) -> tuple[str, str]:
    """``(reasoning, text)`` of a ``content`` that is an array of blocks (Mistral's
    reasoning models): text blocks joined in order, thinking blocks joined in order.

    A block of another type is refused (``InvalidResponseError``) rather than dropped.
    """
    reasoning: list[str] = []
    texts: list[str] = []
    for index, raw in enumerate(value):
        here = f"{where}[{index}]"
        block = _obj(raw, here)
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if text:
                texts.append(_str(text, here, "text"))
        elif kind == "thinking":
            reasoning.append(_block_text(block.get("thinking"), f"{here}.thinking"))
        else:
            raise InvalidResponseError(
                f"{here}.type must be 'text' or 'thinking' (the content blocks this adapter "
                f"reads), got {kind!r}"
            )
    return "".join(reasoning), "".join(texts)


def _content(value: object, where: str) -> tuple[str, str]:
    """``(reasoning, text)`` of a message's or delta's ``content``: a string, null or an
    array of content blocks."""
    if not value:
        return "", ""
    if type(value) is str:
        return "", value
    if type(value) is list:
        return content_blocks(value, f"{where}.content")
    raise InvalidResponseError(
        f"{where}.content must be a string, an array of content blocks or null, got {_kind(value)}"
    )


def _placeholder_call(value: object) -> bool:
    """A ``function_call`` that carries nothing: ``{"name": "", "arguments": ""}`` (the
    empty placeholder Snowflake Cortex sends next to real ``tool_calls``)."""
    return isinstance(value, dict) and not value.get("name") and not value.get("arguments")


def _opt_list(obj: dict[str, Any], key: str, where: str) -> list[Any] | None:
    value = obj.get(key)
    if value is None or isinstance(value, list):
        return value
    raise InvalidResponseError(f"{where}.{key} must be an array or null, got {_kind(value)}")


def _usage(value: object, where: str) -> Usage:
    obj = _obj(value, where)
    prompt = _count(obj, "prompt_tokens", where) or 0
    completion = _count(obj, "completion_tokens", where) or 0
    cached = _nested_count(obj, "prompt_tokens_details", "cached_tokens", where)
    if cached is None:
        # DeepSeek reports cache hits at the top level.
        cached = _count(obj, "prompt_cache_hit_tokens", where)
    reasoning = _nested_count(obj, "completion_tokens_details", "reasoning_tokens", where)
    if reasoning and (
        reasoning > completion
        or _count(obj, "total_tokens", where) == prompt + completion + reasoning
    ):
        # Gemini's compatible endpoint counts thinking outside completion_tokens (its
        # total_tokens is prompt + completion + reasoning); scope's output includes it.
        completion += reasoning
    with as_invalid_response(where):
        return Usage(prompt, completion, reasoning, cached)


def _extra(body: dict[str, Any], where: str) -> Metadata:
    entries: dict[str, str] = {}
    for key in ("system_fingerprint", "service_tier"):
        value = _opt_str(body, key, where)
        if value:
            entries[f"openai/{key}"] = value
    return Metadata(entries) if entries else _EMPTY_META


def _error_message(error: object) -> str:
    # Some compatible servers send the error as a bare string.
    return error if isinstance(error, str) and error else error_message(error)


def _tool_call_part(raw: object, where: str, fallback_id: str) -> Part:
    call = _obj(raw, where)
    kind = call.get("type") or "function"  # "" is a placeholder, as null
    call_id = _opt_str(call, "id", where) or fallback_id
    if kind == "custom":
        # A custom tool's call: its input is the text the model wrote, as it is.
        spec = _obj(call.get("custom"), f"{where}.custom")
        name = _opt_str(spec, "name", f"{where}.custom") or ""
        arguments = _opt_str(spec, "input", f"{where}.custom") or ""
    else:
        spec = _obj(call.get("function"), f"{where}.function")
        name = _opt_str(spec, "name", f"{where}.function") or ""
        arguments = _opt_str(spec, "arguments", f"{where}.function") or ""
    with as_invalid_response(where):
        metadata = _extra_content(call)
        if kind == "custom":
            metadata = metadata.merge(_FREEFORM_META)
        return Part(
            PartKind.TOOL_CALL,
            tool_call=ToolCall(call_id, name, arguments),
            metadata=metadata,
        )


def _extra_content(call: dict[str, Any]) -> Metadata:
    """The part metadata keeping a tool call's ``extra_content`` verbatim (none without)."""
    extra = call.get("extra_content")
    if extra is None:
        return _EMPTY_META
    return Metadata({EXTRA_CONTENT_KEY: RawJSON.from_value(extra)})


def _details_text(details: list[Any], where: str) -> str:
    """The reasoning text of a ``reasoning_details`` array: its ``reasoning.text`` texts
    and ``reasoning.summary`` summaries, in order (encrypted entries have none)."""
    texts: list[str] = []
    for index, raw in enumerate(details):
        entry = _obj(raw, f"{where}[{index}]")
        for key in ("text", "summary"):
            value = entry.get(key)
            if value:
                texts.append(_str(value, f"{where}[{index}]", key))
    return "".join(texts)


def _default_finish(parts: list[Part]) -> FinishReason:
    """The finish reason of a complete answer whose server sent none (``""`` or absent:
    Snowflake Cortex): ``tool_calls`` when it calls tools, else ``stop`` (DESIGN §7e)."""
    calls = any(part.kind is PartKind.TOOL_CALL for part in parts)
    return FinishReason.TOOL_CALLS if calls else FinishReason.STOP


def parse_completion(data: bytes) -> Response:
    """Map a ``chat.completion`` JSON body to a ``Response``.

    Only choice 0 is read (the adapter never asks for more). Text becomes a text part,
    ``refusal`` a text part marked ``{"openai/refusal": true}``, ``reasoning_content`` /
    ``reasoning`` (compatible servers) a reasoning part ahead of the text, tool calls
    ``tool_call`` parts with their arguments verbatim. Raises ``InvalidResponseError``
    naming the path of anything malformed, and ``ProviderError`` for an error body.
    """
    body = _load(data, "response body")
    if body.get("error") is not None:
        raise embedded_error(
            f"the server answered with an error: {_error_message(body['error'])}",
            body,
            body["error"],
        )
    choices = _opt_list(body, "choices", "response")
    if not choices:
        raise InvalidResponseError("response.choices must hold at least one choice")
    choice = _obj(choices[0], "response.choices[0]")
    where = "response.choices[0].message"
    message = _obj(choice.get("message"), where)
    parts: list[Part] = []
    details = _opt_list(message, "reasoning_details", where)
    with as_invalid_response(where):
        reasoning = _opt_str(message, "reasoning_content", where) or _opt_str(
            message, "reasoning", where
        )
        if not reasoning and details:
            reasoning = _details_text(details, f"{where}.reasoning_details")
        block_reasoning, content = _content(message.get("content"), where)
        reasoning = (reasoning or "") + block_reasoning
        if reasoning:
            parts.append(Part(PartKind.REASONING, text=reasoning))
        if content:
            parts.append(Part(PartKind.TEXT, text=content))
        refusal = _opt_str(message, "refusal", where)
        if refusal:
            parts.append(Part(PartKind.TEXT, text=refusal, metadata=_REFUSAL_META))
    for index, call in enumerate(_opt_list(message, "tool_calls", where) or ()):
        parts.append(_tool_call_part(call, f"{where}.tool_calls[{index}]", f"call_{index}"))
    legacy = message.get("function_call")
    if legacy is not None and not _placeholder_call(legacy):
        # The pre-tools protocol: one call without an id.
        parts.append(
            _tool_call_part(
                {"type": "function", "function": legacy},
                f"{where}.function_call",
                "function_call",
            )
        )
    annotations = _opt_list(message, "annotations", where)
    reason = finish_reason(choice.get("finish_reason"), "response.choices[0].finish_reason")
    if reason is None:
        reason = _default_finish(parts)  # a whole body is a finished answer
    with as_invalid_response("response"):
        entries: dict[str, Any] = {}
        if annotations:
            entries[ANNOTATIONS_KEY] = annotations
        if details:
            entries[REASONING_DETAILS_KEY] = details
        message_meta = Metadata(entries) if entries else _EMPTY_META
        output = Output(Message(Role.ASSISTANT, parts, message_meta) if parts else None, reason)
        usage_raw = body.get("usage")
        metadata = ResponseMetadata(
            _meta_text("response.id", _opt_str(body, "id", "response") or ""),
            _meta_text("response.model", _opt_str(body, "model", "response") or ""),
            Usage() if usage_raw is None else _usage(usage_raw, "response.usage"),
            _extra(body, "response"),
        )
        return Response(output, metadata)


@final
class ChunkMapper:
    """Turns the events of one Chat Completions stream into ``Response`` deltas.

    Every delta it returns is valid for ``ResponseAccumulator``: tool-call fragments
    carry the call id and name of their ``index`` on every fragment (remembered per
    index), id and model are sent when they change, usage is the server's cumulative
    snapshot. ``map`` returns ``None`` for an event that adds nothing, and for
    ``[DONE]`` unless calls were still held back. ``end_marker_seen`` is true once
    ``[DONE]`` arrived, ``finish_reason_seen`` once a finish reason did.

    A call's fragments are held back until its id and its name have both arrived, as
    some servers send the id only after the first fragment (which then has only its
    ``index``); a call still without an id at the finish reason (or ``[DONE]``) gets
    ``call_<index>``, and one without a name is an ``InvalidResponseError``.

    A malformed event raises ``InvalidResponseError``; an error event a ``ProviderError``
    whose class follows the status or error type it states (``embedded_error``).
    """

    __slots__ = (
        "_annotations",
        "_annotations_dirty",
        "_calls",
        "_details",
        "_details_dirty",
        "_extra",
        "_id",
        "_model",
        "_pending",
        "_raw",
        "end_marker_seen",
        "finish_reason_seen",
    )

    def __init__(self) -> None:
        self._calls: dict[int, tuple[str, str]] = {}  # index -> (id, name)
        # index -> (id, name, argument fragments, extra_content metadata) of a call whose
        # id or name is missing
        self._pending: dict[int, tuple[str, str, list[str], Metadata]] = {}
        # reasoning_details entries by their index: (the entry's other members, the
        # fragments of its text members)
        self._details: dict[int, tuple[dict[str, Any], dict[str, list[str]]]] = {}
        self._details_dirty = False
        self._annotations: list[Any] = []  # every delta's annotations, in order
        self._annotations_dirty = False
        self._id = ""
        self._model = ""
        self._extra = _EMPTY_META
        self._raw: tuple[object, ...] = (None, None, None, None)
        self.end_marker_seen = False
        self.finish_reason_seen = False

    def map(self, event: str, data: bytes) -> Response | None:
        """Map one event; see the class docstring."""
        if data == b"[DONE]":
            self.end_marker_seen = True
            held = self._flush()
            reason = None
            if not self.finish_reason_seen:
                # Every chunk said "" (Snowflake Cortex) or nothing: the answer is
                # complete all the same (DESIGN §7e).
                self.finish_reason_seen = True
                reason = FinishReason.TOOL_CALLS if self._calls else FinishReason.STOP
            with as_invalid_response("stream event"):
                output = self._output(held, reason)
            return None if output is None else Response(output)
        if self.end_marker_seen:
            raise InvalidResponseError("stream event after [DONE]")
        chunk = _load(data, "stream event")
        error = chunk.get("error")
        if error is not None or event == "error":
            # Groq: "event: error" with a status_code; OpenRouter: a chunk with an error
            # object whose code is the status. The class follows what it states.
            raise embedded_error(
                f"the server reported an error mid-stream: {_error_message(error)}",
                chunk,
                error,
            )
        # What ``as_invalid_response("stream event")`` does, without a context manager
        # per event (a try costs nothing in CPython 3.11 until something raises).
        try:
            return self._map(chunk)
        except InvalidResponseError:
            raise
        except ScopeError as exc:
            raise InvalidResponseError(f"stream event: {exc}") from exc

    def _map(self, chunk: dict[str, Any]) -> Response | None:
        get = chunk.get
        usage_raw = get("usage")
        metadata = None
        raw = (get("id"), get("model"), get("system_fingerprint"), get("service_tier"))
        if usage_raw is not None or raw != self._raw:
            # Only when something changed: most chunks repeat id, model and fingerprint.
            metadata = self._metadata(chunk, usage_raw)
            self._raw = raw
        output = None
        choices = get("choices")
        if choices:
            if type(choices) is not list:
                raise InvalidResponseError(
                    f"chunk.choices must be an array or null, got {_kind(choices)}"
                )
            # The hot path: choice 0 whose delta is only content text (almost every
            # chunk of an answer). Exactly the chunks for which ``_choice`` would return
            # ``Output(Message(ASSISTANT, [Part(TEXT, text=content)]))``: no other member
            # carries anything (falsy values carry nothing, as there), no finish reason,
            # no content after one, no reasoning details waiting for the message.
            choice = choices[0]
            if (
                type(choice) is dict
                and choice.get("finish_reason") is None
                and choice.get("index", 0) == 0
                and not self.finish_reason_seen
                and not self._details_dirty
            ):
                delta = choice.get("delta")
                if type(delta) is dict:
                    content = delta.get("content")
                    if (
                        type(content) is str
                        and content
                        and not delta.get("reasoning_content")
                        and not delta.get("reasoning")
                        and not delta.get("reasoning_details")
                        and not delta.get("refusal")
                        and not delta.get("tool_calls")
                        and delta.get("function_call") is None
                        and not delta.get("annotations")
                    ):
                        return text_delta(_TEXT, content, EMPTY_METADATA, metadata)
            output = self._choice(choices)
        if output is None and metadata is None:
            return None
        return Response(output, metadata)

    def _metadata(self, chunk: dict[str, Any], usage_raw: object) -> ResponseMetadata | None:
        where = "chunk"
        chunk_id = _opt_str(chunk, "id", where) or ""
        model = _opt_str(chunk, "model", where) or ""
        extra = _extra(chunk, where)
        new_id = chunk_id if chunk_id and chunk_id != self._id else ""
        new_model = model if model and model != self._model else ""
        new_extra = extra if extra and extra != self._extra else _EMPTY_META
        if not (new_id or new_model or usage_raw is not None or new_extra):
            return None
        metadata = ResponseMetadata(
            _meta_text("chunk.id", new_id),
            _meta_text("chunk.model", new_model),
            Usage() if usage_raw is None else _usage(usage_raw, "chunk.usage"),
            new_extra,
        )
        if new_id:
            self._id = new_id
        if new_model:
            self._model = new_model
        if new_extra:
            self._extra = extra
        return metadata

    def _choice(self, choices: list[Any]) -> Output | None:
        choice = choices[0]
        if type(choice) is not dict or choice.get("index", 0) != 0:
            choice = None
            for index, raw in enumerate(choices):
                candidate = _obj(raw, f"chunk.choices[{index}]")
                if candidate.get("index", 0) == 0:
                    choice = candidate
                    break
            if choice is None:
                return None  # only choice 0 is ever asked for
        where = "chunk.choices[0].delta"
        delta = choice.get("delta")
        parts: list[Part] = []
        if delta:
            if type(delta) is not dict:
                raise InvalidResponseError(f"{where} must be an object, got {_kind(delta)}")
            get = delta.get
            # Falsy values ("" or null) carry nothing; anything else must be a string.
            reasoning = get("reasoning_content") or get("reasoning")
            details = get("reasoning_details")
            if details:
                if type(details) is not list:
                    raise InvalidResponseError(
                        f"{where}.reasoning_details must be an array or null, got {_kind(details)}"
                    )
                detail_text = self._add_details(details, f"{where}.reasoning_details")
                reasoning = reasoning or detail_text
            if reasoning:
                parts.append(Part(PartKind.REASONING, text=_str(reasoning, where, "reasoning")))
            content = get("content")
            if content:
                if type(content) is str:
                    parts.append(Part(PartKind.TEXT, text=content))
                else:
                    block_reasoning, text = _content(content, where)
                    if block_reasoning:
                        parts.append(Part(PartKind.REASONING, text=block_reasoning))
                    if text:
                        parts.append(Part(PartKind.TEXT, text=text))
            refusal = get("refusal")
            if refusal:
                parts.append(
                    Part(
                        PartKind.TEXT,
                        text=_str(refusal, where, "refusal"),
                        metadata=_REFUSAL_META,
                    )
                )
            fragments = get("tool_calls")
            if fragments:
                if type(fragments) is not list:
                    raise InvalidResponseError(
                        f"{where}.tool_calls must be an array or null, got {_kind(fragments)}"
                    )
                for position, fragment in enumerate(fragments):
                    part = self._fragment(fragment, position, where)
                    if part is not None:
                        parts.append(part)
            annotations = get("annotations")
            if annotations:
                # Citations (OpenAI search models, OpenRouter's web plugin: one per
                # delta): kept as the call keeps them, sent with the finish.
                if type(annotations) is not list:
                    raise InvalidResponseError(
                        f"{where}.annotations must be an array or null, got {_kind(annotations)}"
                    )
                self._annotations.extend(annotations)
                self._annotations_dirty = True
            legacy = get("function_call")
            if legacy is not None and not (_placeholder_call(legacy) and -1 not in self._calls):
                part = self._fragment(
                    {"index": -1, "id": "function_call", "function": legacy}, 0, where
                )
                if part is not None:
                    parts.append(part)
        reason = finish_reason(choice.get("finish_reason"), "chunk.choices[0].finish_reason")
        if parts and self.finish_reason_seen:
            raise InvalidResponseError("stream event carries content after the finish_reason")
        if reason is not None:
            self.finish_reason_seen = True
            parts.extend(self._flush())
        return self._output(parts, reason)

    def _output(self, parts: list[Part], reason: FinishReason | None) -> Output | None:
        """The output of one event, carrying the assembled ``reasoning_details`` when they
        changed and this is the first event with more than reasoning (they come before
        the answer: assembling them once, not per fragment, keeps a stream linear) or the
        finish, and the ``annotations`` so far at the finish (or after it, when more
        come). What no part carries goes to ``message_metadata``."""
        finished = reason is not None or self.finish_reason_seen
        annotate = self._annotations_dirty and finished
        if not parts and reason is None and not annotate:
            return None
        entries: dict[str, Any] = {}
        if self._details_dirty and (
            reason is not None or any(part.kind is not PartKind.REASONING for part in parts)
        ):
            self._details_dirty = False
            entries[REASONING_DETAILS_KEY] = self._assembled_details()
        if annotate:
            self._annotations_dirty = False
            entries[ANNOTATIONS_KEY] = self._annotations
        message_meta = Metadata(entries) if entries else _EMPTY_META
        if parts:
            return Output(Message(Role.ASSISTANT, parts, message_meta), reason)
        return Output(None, reason, message_metadata=message_meta)

    def _add_details(self, fragments: list[Any], where: str) -> str:
        """Merge ``reasoning_details`` fragments into the entries of their ``index``
        (text, summary and data fragments concatenate; other members: the latest
        non-null value); return the reasoning text they carry."""
        texts: list[str] = []
        for position, raw in enumerate(fragments):
            here = f"{where}[{position}]"
            fragment = _obj(raw, here)
            index = fragment.get("index", position)
            if type(index) is not int:
                raise InvalidResponseError(f"{here}.index must be an integer, got {index!r}")
            entry = self._details.get(index)
            if entry is None:
                entry = self._details[index] = ({}, {})
            members, pieces = entry
            for key, value in fragment.items():
                if key in _DETAIL_TEXTS and value is not None:
                    pieces.setdefault(key, []).append(_str(value, here, key))
                    if key != "data" and value:
                        texts.append(value)
                elif value is not None or key not in members:
                    members[key] = value
            self._details_dirty = True
        return "".join(texts)

    def _assembled_details(self) -> list[dict[str, Any]]:
        """The ``reasoning_details`` array assembled so far, entries in index order."""
        details: list[dict[str, Any]] = []
        for index in sorted(self._details):
            members, pieces = self._details[index]
            entry = dict(members)
            for key, fragments in pieces.items():
                entry[key] = "".join(fragments)
            details.append(entry)
        return details

    def _fragment(self, raw: object, position: int, where: str) -> Part | None:
        where = f"{where}.tool_calls[{position}]"
        fragment = _obj(raw, where)
        index = fragment.get("index", position)
        if type(index) is not int:
            raise InvalidResponseError(f"{where}.index must be an integer, got {index!r}")
        if fragment.get("type") == "custom" or fragment.get("custom") is not None:
            # The stream's tool-call delta is documented for function calls only (its
            # type is "function", it has no custom member): a custom call is read by
            # call, never guessed at here.
            raise InvalidResponseError(
                f"{where}: a streamed custom tool call, which the Chat Completions stream "
                "does not document; ask by call(), or use OpenAIResponsesModel"
            )
        function = fragment.get("function")
        function = {} if function is None else _obj(function, f"{where}.function")
        call_id = _opt_str(fragment, "id", where) or ""  # "" is a placeholder, as null
        name = _opt_str(function, "name", f"{where}.function") or ""
        arguments = _opt_str(function, "arguments", f"{where}.function") or ""
        with as_invalid_response(where):
            extra = _extra_content(fragment)
        pending = self._pending.get(index)
        known = self._calls.get(index)
        if pending is None and known is not None and not (call_id and call_id != known[0]):
            if name and name != known[1]:
                raise InvalidResponseError(
                    f"{where}: tool call index {index} changed its name from {known[1]!r} "
                    f"to {name!r}"
                )
            return _delta_part(known[0], known[1], arguments, where, extra)
        # The first fragment of this index (or of a new call reusing the index, as some
        # servers do for parallel calls), or a later one of a call still held back.
        if pending is None:
            pending = (call_id, name, [arguments], extra)
        else:
            held_id, held_name, held_arguments, held_extra = pending
            if call_id and held_id and call_id != held_id:
                raise InvalidResponseError(
                    f"{where}: tool call index {index} changed its id from {held_id!r} to "
                    f"{call_id!r} before its name arrived"
                )
            if name and held_name and name != held_name:
                raise InvalidResponseError(
                    f"{where}: tool call index {index} changed its name from {held_name!r} "
                    f"to {name!r}"
                )
            held_arguments.append(arguments)
            pending = (call_id or held_id, name or held_name, held_arguments, extra or held_extra)
        if not (pending[0] and pending[1]):
            self._pending[index] = pending
            return None
        self._pending.pop(index, None)
        self._calls[index] = (pending[0], pending[1])
        return _delta_part(pending[0], pending[1], "".join(pending[2]), where, pending[3])

    def _flush(self) -> list[Part]:
        """The calls still held back, in index order; a missing id becomes
        ``call_<index>``."""
        if not self._pending:
            return []
        parts: list[Part] = []
        for index in sorted(self._pending):
            call_id, name, arguments, extra = self._pending[index]
            where = f"chunk: tool call index {index}"
            if not name:
                raise InvalidResponseError(f"{where} never got a name")
            call_id = call_id or f"call_{index}"
            self._calls[index] = (call_id, name)
            parts.append(_delta_part(call_id, name, "".join(arguments), where, extra))
        self._pending.clear()
        return parts


def _delta_part(
    call_id: str, name: str, arguments: str, where: str, metadata: Metadata = _EMPTY_META
) -> Part:
    with as_invalid_response(where):
        delta = ToolCallDelta(call_id, name, arguments)
        return Part(PartKind.TOOL_CALL_DELTA, tool_call_delta=delta, metadata=metadata)
