"""Pure mapping between scope chat values and the OpenAI Responses API wire format.

No I/O and no HTTP library here: ``build_body`` turns a ``Request`` into the JSON body
of ``POST /responses``, ``parse_response`` turns a ``response`` object into a
``Response``, and ``EventMapper`` turns the typed stream events into accumulator deltas.
``sent_item_id`` is the one place that decides which provider state of a stored
assistant message (reasoning items, item ids) goes back to the server.
"""

from __future__ import annotations

import functools
import mimetypes
from collections.abc import Callable
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
    ToolResult,
    Usage,
    text_delta,
)
from scope.errors import InvalidResponseError, ProviderError, UnsupportedOptionError
from scope.jsonvalue import RawJSON
from scope.media import Media, SourceKind
from scope.metadata import Metadata
from scope.models._errors import embedded_error, error_message
from scope.models._json_shape import (
    Verbatim,
    bare_mime,
    count,
    kind,
    load,
    meta_text,
    nested_count,
    obj,
)
from scope.models._openai_wire import FREEFORM_KEY, REFUSAL_KEY, data_url
from scope.models._provenance import Replay
from scope.models._wire import (
    as_invalid_response,
    extension_fields,
    prepare,
    put_options,
    tool_spec,
)

__all__ = [
    "ADAPTER",
    "API",
    "PROVIDER",
    "ENCRYPTED_REASONING",
    "CLIENT_CALLS",
    "ITEM_ID_KEY",
    "ITEM_KEY",
    "PHASE_KEY",
    "RESERVED_FIELDS",
    "EventMapper",
    "build_body",
    "parse_response",
    "sent_item_id",
]

#: The adapter's name, for messages.
ADAPTER: Final = "OpenAIResponsesModel"

#: The wire protocol and the default provider, as the answers' provenance names them.
API: Final = "openai.responses"
PROVIDER: Final = "openai"

#: Part metadata key holding the id of the output item a part came from (``msg_…``,
#: ``rs_…``, ``fc_…``): what goes back as the input item's ``id``.
ITEM_ID_KEY: Final = "openai/item_id"

#: Part metadata key holding a message item's ``phase`` (``commentary`` or
#: ``final_answer``, sent by newer models), sent back with the item: the API documents
#: that dropping it can degrade performance.
PHASE_KEY: Final = "openai/phase"

#: Message metadata key holding the ``annotations`` of the answer's text (a web or file
#: search's citations) as received: a JSON object from each ``message`` item's id to one
#: array per content of that item that has text, in order (only items with any
#: annotation). A stream
#: has them whole at ``response.output_item.done``, after the item's text (DESIGN §6k: a
#: stream keeps what a call keeps). They go back with their text to the same model.
ANNOTATIONS_KEY: Final = "openai/annotations"

#: What the body's ``include`` asks for unless the adapter is told not to.
ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"

#: Body fields the adapter owns: an ``openai/<field>`` extension may not set them. The
#: adapter is stateless (``store: false``, no ``previous_response_id`` or
#: ``conversation``): scope's history is the source of truth.
RESERVED_FIELDS: Final = frozenset(
    {"input", "model", "stream", "store", "include", "previous_response_id", "conversation"}
)

#: Options sent as they are: (option, body field).
_OPTION_FIELDS: Final = (
    ("max_tokens", "max_output_tokens"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
)

#: Options the Responses API has no field for (``openai/<option>`` passes one to a server
#: that accepts it).
_REFUSED: Final = ("top_k", "frequency_penalty", "presence_penalty")

_EMPTY_META: Final = Metadata()
_REFUSAL_TRUE: Final = Metadata({REFUSAL_KEY: True})[REFUSAL_KEY]

_ASSISTANT: Final = Role.ASSISTANT
_TEXT: Final = PartKind.TEXT

#: Marks a native item among the input items being built: ``{_NATIVE: Fragment}``.
_NATIVE: Final = "scope/native"

#: Joins the summary texts of one reasoning item into a reasoning part's text.
SUMMARY_SEPARATOR: Final = "\n\n"


# --------------------------------------------------------------------------- request


def build_body(
    request: Request,
    *,
    default_options: Options,
    model: str,
    stream: bool,
    replay: Replay | None = None,
    encrypted_reasoning: bool = True,
    prompt_cache_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body (a dict; RawJSON values as ``orjson.Fragment``) for ``request``.

    Stateless: ``store: false``, and with ``encrypted_reasoning`` the ``include`` that
    asks for the reasoning's ``encrypted_content`` (without it no reasoning is sent
    back). Validates the request and refuses (``UnsupportedOptionError``) anything
    populated the protocol cannot carry. Raises before any I/O. Reasoning and item ids go
    back only from the adapter's own messages (``replay``, default: provider
    ``"openai"``); every part left out is recorded in ``replay.left_out``.
    ``prompt_cache_key``, when given, is sent as itself (before the extensions, so
    ``openai/prompt_cache_key`` wins).
    """
    options, chosen = prepare(request, default_options, model, ADAPTER)
    if replay is None:
        replay = Replay(API, PROVIDER)
    replay.model = chosen
    body: dict[str, Any] = {
        "model": chosen,
        "input": _input(request.messages, encrypted_reasoning, replay),
        "store": False,
    }
    if encrypted_reasoning:
        body["include"] = [ENCRYPTED_REASONING]
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    if prompt_cache_key is not None:
        body["prompt_cache_key"] = prompt_cache_key
    _options(options, body)
    if stream:
        body["stream"] = True
    return body


def _options(options: Options, body: dict[str, Any]) -> None:
    for option in _REFUSED:
        if getattr(options, option) is not None:
            raise UnsupportedOptionError(
                f"{option} is not part of the OpenAI Responses API; for a compatible server "
                f"that accepts it, pass the extension 'openai/{option}' instead"
            )
    if options.stop:  # stop=() (an explicit empty list) asks for nothing
        raise UnsupportedOptionError(
            "stop is not part of the OpenAI Responses API (it has no stop sequences); "
            "use OpenAIChatModel, or the extension 'openai/stop' for a server that accepts it"
        )
    put_options(options, body, _OPTION_FIELDS)
    if options.reasoning_effort:
        body["reasoning"] = {"effort": options.reasoning_effort}
    fmt = options.output_format
    if fmt is not None:
        if fmt.type is OutputFormatType.JSON:
            body["text"] = {"format": {"type": "json_object"}}
        elif fmt.type is OutputFormatType.JSON_SCHEMA:
            assert fmt.schema is not None
            spec: dict[str, Any] = {"type": "json_schema", "name": fmt.name}
            if fmt.description:
                spec["description"] = fmt.description
            spec["schema"] = orjson.Fragment(fmt.schema.bytes)
            if fmt.strict:
                spec["strict"] = True
            body["text"] = {"format": spec}
        # OutputFormat.text() is the protocol's default: nothing to send.
    # Extensions of other namespaces are meant for other providers and are ignored.
    for name, raw in extension_fields(options, "openai", RESERVED_FIELDS, ADAPTER):
        body[name] = orjson.Fragment(raw.bytes)


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    if tool.freeform:
        # The model writes the tool's text itself: a custom tool (its calls come as
        # custom_tool_call items, the text as their input).
        custom: dict[str, Any] = {"type": "custom", "name": tool.name}
        if tool.description:
            custom["description"] = tool.description
        return custom
    # "strict" defaults to true in the Responses API, which accepts only a subset of
    # JSON Schema: the schema is sent verbatim, so strict only when the definition says
    # so (its schema is then in that subset: @tool(strict=True) makes one).
    return {"type": "function", **tool_spec(tool, "parameters"), "strict": tool.strict}


def _input(
    messages: tuple[Message, ...], send_reasoning: bool, replay: Replay
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    # call id -> the item a client-answered call went back as (its answer's shape)
    answered: dict[str, dict[str, Any]] = {}
    # A compaction item of this model's stands for everything before it (DESIGN §6k):
    # it and what follows go; the system messages stay.
    start = replay.window_start(messages, "compaction")
    for index, message in enumerate(messages):
        role = message.role
        where = f"messages[{index}]"
        if start is not None and index <= start[0] and role is not Role.SYSTEM:
            if index < start[0]:
                continue
            message = attrs.evolve(message, parts=message.parts[start[1] :])
        if role is Role.SYSTEM:
            items.append({"type": "message", "role": "system", "content": message.text})
        elif role is Role.USER:
            items.append({"type": "message", "role": "user", "content": _user(message, where)})
        elif role is Role.ASSISTANT:
            items.extend(_assistant(message, where, send_reasoning, replay, answered))
        else:
            for part_index, part in enumerate(message.parts):
                result = part.tool_result
                assert result is not None
                here = f"{where}.parts[{part_index}]"
                call_item = answered.get(result.id)
                if call_item is not None:
                    items.append(_answer(result, call_item, here))
                    continue
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": result.id,
                        "output": _tool_output(result, here),
                    }
                )
    return items


def _answer(result: ToolResult, item: dict[str, Any], where: str) -> dict[str, Any]:
    """The output item answering a client-answered call (``CLIENT_CALLS``) that went
    back as the item ``item``: its text as the output; an error result is a failed
    patch, a non-zero exit, a denied approval. A shell call's or a computer call's
    output may also be given whole as the result's JSON details."""
    item_type = item["type"]
    call_id = result.id
    text = result.output.text() or ""
    details = result.output.details
    if item_type == "mcp_approval_request":
        answer: dict[str, Any] = {
            "type": "mcp_approval_response",
            "approval_request_id": call_id,
            "approve": not result.is_error,
        }
        if result.is_error and text:
            answer["reason"] = text
        return answer
    if item_type == "local_shell_call":
        return {"type": "local_shell_call_output", "id": item.get("id", call_id), "output": text}
    if item_type == "shell_call":
        output: Any
        if details is not None and not result.output.content:
            output = orjson.Fragment(details.bytes)
        else:
            outcome = {"type": "exit", "exit_code": 1 if result.is_error else 0}
            output = [{"stdout": text, "stderr": "", "outcome": outcome}]
        return {"type": "shell_call_output", "call_id": call_id, "output": output}
    if item_type == "apply_patch_call":
        status = "failed" if result.is_error else "completed"
        return {
            "type": "apply_patch_call_output",
            "call_id": call_id,
            "status": status,
            "output": text,
        }
    if item_type == "computer_call":
        screenshot: Any
        if details is not None and not result.output.content:
            screenshot = orjson.Fragment(details.bytes)
        else:
            images = [p.media for p in result.output.content if p.media is not None]
            if len(images) != 1 or not bare_mime(images[0].mime).startswith("image/"):
                raise UnsupportedOptionError(
                    f"{where}: a computer call's result must be one screenshot (an image) or "
                    "its output object as JSON details"
                )
            image = _media(images[0], where)
            screenshot = {"type": "computer_screenshot", "image_url": image["image_url"]}
        return {"type": "computer_call_output", "call_id": call_id, "output": screenshot}
    return {"type": "custom_tool_call_output", "call_id": call_id, "output": text}


def _user(message: Message, where: str) -> str | list[dict[str, Any]]:
    parts = message.parts
    if len(parts) == 1 and parts[0].kind is PartKind.TEXT:
        return parts[0].text
    return _content(parts, f"{where}.parts")


def _content(parts: tuple[Part, ...], where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        if part.kind is PartKind.TEXT:
            blocks.append({"type": "input_text", "text": part.text})
        else:
            assert part.media is not None
            blocks.append(_media(part.media, f"{where}[{index}]"))
    return blocks


def _media(media: Media, where: str) -> dict[str, Any]:
    """An ``input_image`` (images: bytes as a ``data:`` URL, a URI, a file id) or an
    ``input_file`` (anything else: ``file_data``, ``file_url`` or ``file_id``)."""
    source = media.source
    mime = bare_mime(media.mime)
    if mime.startswith("image/"):
        detail = media.metadata.get("openai/detail")
        image: dict[str, Any] = {
            "type": "input_image",
            "detail": "auto" if detail is None else orjson.Fragment(detail.bytes),
        }
        if source.kind is SourceKind.REFERENCE:
            image["file_id"] = source.ref
        else:
            image["image_url"] = source.uri if source.kind is SourceKind.URI else data_url(media)
        return image
    if source.kind is SourceKind.REFERENCE:
        return {"type": "input_file", "file_id": source.ref}
    if source.kind is SourceKind.URI:
        return {"type": "input_file", "file_url": source.uri}
    filename = media.name or "file" + (mimetypes.guess_extension(mime) or "")
    return {"type": "input_file", "filename": filename, "file_data": data_url(media)}


def _tool_output(result: ToolResult, where: str) -> str | list[dict[str, Any]]:
    """The output text, or the content as input items when it carries media."""
    text = result.output.text()
    if text is not None:
        return text
    return _content(result.output.content, f"{where}.tool_result.output.content")


def sent_item_id(part: Part, *, own: bool, send_reasoning: bool) -> str | None:
    """The item id to send back with ``part`` of an assistant message, or None.

    The one place that decides which provider state of a stored assistant message goes
    back to the server: only an ``own`` message's (this adapter's API, provider and
    model: DESIGN §6c). A reasoning part goes back (as a ``reasoning`` item) only when
    this returns its id: it has an ``openai/item_id``, a signature (the encrypted
    content, UTF-8) and ``send_reasoning`` is on; otherwise it is omitted, never turned
    into text. A text or tool-call part goes back in any case, with its id only when
    this returns one.
    """
    if not own:
        return None
    raw = part.metadata.get(ITEM_ID_KEY)
    if raw is None:
        return None
    item_id = raw.value()
    if type(item_id) is not str or not item_id:
        return None
    if part.kind is PartKind.REASONING:
        if not (send_reasoning and part.signature):
            return None
        try:
            part.signature.decode("utf-8")
        except UnicodeDecodeError:
            return None  # not an encrypted_content string this adapter received
    return item_id


def _assistant(
    message: Message,
    where: str,
    send_reasoning: bool,
    replay: Replay,
    answered: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The input items of an assistant message, in part order: consecutive text parts
    of one item form one ``message`` item; each reasoning part that goes back is kept
    only when the item right after it carries an id (the API refuses a reasoning item
    without its following item)."""
    items: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None  # the message item text parts join
    current_id: str | None = None
    own = replay.owns(message)
    reasoning_at: dict[int, str] = {}  # id(reasoning item) -> where its part is
    annotations = _annotations_by_part(message) if own else {}
    for index, part in enumerate(message.parts):
        part_kind = part.kind
        item_id = sent_item_id(part, own=own, send_reasoning=send_reasoning)
        if part_kind is PartKind.TEXT:
            refusal = part.metadata.get(REFUSAL_KEY) == _REFUSAL_TRUE
            if current is None or current_id != item_id:
                current_id = item_id
                if item_id is None:
                    current = {"type": "message", "role": "assistant", "content": ""}
                else:
                    current = {
                        "type": "message",
                        "role": "assistant",
                        "id": item_id,
                        "status": "completed",
                        "content": [],
                    }
                    phase = part.metadata.get(PHASE_KEY)
                    if phase is not None:
                        current["phase"] = orjson.Fragment(phase.bytes)
                items.append(current)
            if item_id is None:
                # A message without its id goes back as plain assistant text.
                current["content"] += part.text
            elif refusal:
                current["content"].append({"type": "refusal", "refusal": part.text})
            else:
                found = annotations.get(index)
                current["content"].append(
                    {
                        "type": "output_text",
                        "text": part.text,
                        "annotations": [] if found is None else orjson.Fragment(found.bytes),
                    }
                )
            continue
        current = None
        if part_kind is PartKind.REASONING:
            here = f"{where}.parts[{index}]"
            if item_id is None:
                why = "reasoning of another model" if not own else "reasoning it cannot send"
                replay.leave_out(here, why)
            else:
                reasoning: dict[str, Any] = {
                    "type": "reasoning",
                    "id": item_id,
                    "summary": ([{"type": "summary_text", "text": part.text}] if part.text else []),
                    "encrypted_content": part.signature.decode("utf-8"),
                }
                reasoning_at[id(reasoning)] = here
                items.append(reasoning)
        elif part_kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            received = part.metadata.get(ITEM_KEY) if item_id is not None else None
            if received is not None:
                # A call the client answers, back as the item it came as (DESIGN §6k),
                # less the members the API documents as output only.
                value = received.value()
                answered[call.id] = value
                strip = _OUTPUT_ONLY.get(value.get("type"), ())
                if any(name in value for name in strip):
                    tree = Verbatim(received.bytes).tree()
                    for name in strip:
                        tree.pop(name, None)
                    received = RawJSON.from_value(tree)
                items.append({_NATIVE: orjson.Fragment(received.bytes)})
                continue
            item: dict[str, Any] = {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            }
            if item_id is not None:
                item["id"] = item_id
            items.append(item)
        elif part_kind is PartKind.NATIVE:
            # The provider's own item, byte for byte in its position (DESIGN §6k); its
            # stored JSON always has its id, so reasoning before it may go back.
            native = replay.native(part, own, f"{where}.parts[{index}]")
            if native is not None:
                items.append({_NATIVE: native})
        else:
            raise UnsupportedOptionError(
                f"{where}.parts[{index}]: an assistant message cannot carry media over the "
                "OpenAI Responses API"
            )
    # A reasoning item must be followed by the message or call it belongs to, id and all.
    kept: list[dict[str, Any]] = []
    for item in reversed(items):
        if item.get("type") == "reasoning":
            following = kept[-1] if kept else None
            if (
                following is None
                or following.get("type") == "reasoning"
                or not ("id" in following or _NATIVE in following)
            ):
                replay.leave_out(reasoning_at[id(item)], "reasoning without its following item")
                continue
        kept.append(item)
    kept.reverse()
    return [item.get(_NATIVE, item) for item in kept]


# -------------------------------------------------------------------------- response


def _str(source: dict[str, Any], key: str, where: str) -> str:
    """A string member; absent or null is ``""``."""
    value = source.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        raise InvalidResponseError(f"{where}.{key} must be a string, got {kind(value)}")
    return value


def _list(source: dict[str, Any], key: str, where: str) -> list[Any]:
    value = source.get(key)
    if value is None:
        return []
    if type(value) is not list:
        raise InvalidResponseError(f"{where}.{key} must be an array, got {kind(value)}")
    return value


def _usage(value: object, where: str) -> Usage:
    usage = obj(value, where)
    with as_invalid_response(where):
        return Usage(
            count(usage, "input_tokens", where) or 0,
            count(usage, "output_tokens", where) or 0,
            nested_count(usage, "output_tokens_details", "reasoning_tokens", where),
            nested_count(usage, "input_tokens_details", "cached_tokens", where),
        )


def _finish(body: dict[str, Any], has_calls: bool, where: str) -> FinishReason:
    status = _str(body, "status", where)
    if status == "completed":
        return FinishReason.TOOL_CALLS if has_calls else FinishReason.STOP
    if status == "incomplete":
        details = body.get("incomplete_details")
        reason = (
            ""
            if details is None
            else _str(
                obj(details, f"{where}.incomplete_details"), "reason", f"{where}.incomplete_details"
            )
        )
        if reason == "max_output_tokens":
            return FinishReason.LENGTH
        if reason == "content_filter":
            return FinishReason.CONTENT_FILTER
    return FinishReason.OTHER


def _failure(body: dict[str, Any], error: object, what: str) -> ProviderError:
    """The provider error for a failed response or an error event: the class follows
    the status or the error code it states (``embedded_error``)."""
    return embedded_error(f"{what}: {error_message(error)}", body, error)


def _meta(item_id: str, refusal: bool = False, phase: str = "") -> Metadata:
    entries: dict[str, Any] = {ITEM_ID_KEY: item_id}
    if refusal:
        entries[REFUSAL_KEY] = True
    if phase:
        entries[PHASE_KEY] = phase
    return Metadata(entries)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    texts = []
    for index, raw in enumerate(_list(item, "summary", where)):
        texts.append(
            _str(obj(raw, f"{where}.summary[{index}]"), "text", f"{where}.summary[{index}]")
        )
    return SUMMARY_SEPARATOR.join(texts)


#: Part metadata of a tool call made from an item the client answers (DESIGN §6k): the
#: item as received (verbatim), sent back as it is to the same model.
ITEM_KEY: Final = "openai/item"

#: Items the client must answer: each a tool call, (tool name, the member holding its
#: arguments; a string member is the arguments as they are, an object member its JSON).
#: The tool message answering one goes back as the matching output item (``_answer``).
CLIENT_CALLS: Final[dict[str, tuple[str | None, str]]] = {
    "custom_tool_call": (None, "input"),
    "mcp_approval_request": (None, "arguments"),
    "local_shell_call": ("local_shell", "action"),
    "shell_call": ("shell", "action"),
    "apply_patch_call": ("apply_patch", "operation"),
    "computer_call": ("computer", "action"),
}

#: The output items scope models with parts of its own; every other one is kept whole.
_MODELLED: Final = frozenset({"message", "reasoning", "function_call", *CLIENT_CALLS})
_CALL_TYPES: Final = frozenset({"function_call", *CLIENT_CALLS})


def _hosted(item: dict[str, Any]) -> bool:
    """Whether ``item`` is a shell call the API ran itself (the hosted shell: its
    environment a container, its ``shell_call_output`` in the same answer): a native
    item like any hosted tool's, not a call for the client to answer."""
    environment = item.get("environment")
    return (
        item.get("type") == "shell_call"
        and isinstance(environment, dict)
        and environment.get("type") not in (None, "local")
    )


def _is_call(item: dict[str, Any]) -> bool:
    """Whether ``item`` is a call the client answers (``function_call``, ``CLIENT_CALLS``)."""
    return item.get("type") in _CALL_TYPES and not _hosted(item)


#: Members of a client-answered item the API documents as output only: an input item of
#: that type has no such member, so it is not sent back.
_OUTPUT_ONLY: Final[dict[str, tuple[str, ...]]] = {"custom_tool_call": ("status",)}


def _item_parts(item: dict[str, Any], where: str, verbatim: Callable[[], RawJSON]) -> list[Part]:
    """The parts of one output item (``message``, ``reasoning``, ``function_call``). An
    item of any other type (a hosted tool's call, a compaction, an image generation ...)
    is one native part (DESIGN §6k) holding the item as the provider wrote it
    (``verbatim()``)."""
    item_type = item.get("type")
    if item_type not in _MODELLED or _hosted(item):
        if type(item_type) is not str or not item_type or item_type != item_type.strip():
            raise InvalidResponseError(f"{where}.type must be an item type, got {item_type!r}")
        with as_invalid_response(where):
            native = NativeItem(API, item_type, verbatim())
        return [Part(PartKind.NATIVE, native=native)]
    item_id = _str(item, "id", where)
    if not item_id:
        raise InvalidResponseError(f"{where}.id must be a non-empty string")
    parts: list[Part] = []
    with as_invalid_response(where):
        if item_type == "message":
            phase = _str(item, "phase", where)
            for index, raw in enumerate(_list(item, "content", where)):
                here = f"{where}.content[{index}]"
                content = obj(raw, here)
                content_type = content.get("type")
                if content_type == "output_text":
                    text, refusal = _str(content, "text", here), False
                elif content_type == "refusal":
                    text, refusal = _str(content, "refusal", here), True
                else:
                    raise InvalidResponseError(
                        f"{here}.type must be 'output_text' or 'refusal', got {content_type!r}"
                    )
                if not text:
                    continue
                meta = _meta(item_id, refusal, phase)
                last = parts[-1] if parts else None
                if last is not None and last.metadata == meta:  # as the accumulator merges
                    parts[-1] = Part(PartKind.TEXT, text=last.text + text, metadata=meta)
                else:
                    parts.append(Part(PartKind.TEXT, text=text, metadata=meta))
        elif item_type == "reasoning":
            text = _reasoning_text(item, where)
            signature = _str(item, "encrypted_content", where).encode("utf-8")
            if text or signature:
                parts.append(
                    Part(
                        PartKind.REASONING, text=text, signature=signature, metadata=_meta(item_id)
                    )
                )
        elif item_type == "function_call":
            call = ToolCall(
                _str(item, "call_id", where),
                _str(item, "name", where),
                _str(item, "arguments", where),
            )
            parts.append(Part(PartKind.TOOL_CALL, tool_call=call, metadata=_meta(item_id)))
        else:
            parts.append(_client_call(item, item_type, item_id, where, verbatim))
    return parts


def _annotations_by_part(message: Message) -> dict[int, RawJSON]:
    """The stored annotations (``ANNOTATIONS_KEY``) of each text part of ``message``
    that has any, by part index. An item's arrays go to its text parts in order when
    there are as many: contents that merged into one part (equal metadata, as the
    accumulator merges them) cannot be told apart, and their annotations are not sent
    (the text is)."""
    stored = message.metadata.get(ANNOTATIONS_KEY)
    if stored is None:
        return {}
    tree = Verbatim(stored.bytes)
    by_item = stored.value()
    if type(by_item) is not dict:
        return {}
    texts: dict[str, list[int]] = {}
    for index, part in enumerate(message.parts):
        item_id = part.metadata.get(ITEM_ID_KEY) if part.kind is PartKind.TEXT else None
        if item_id is not None and type(item_id.value()) is str:
            texts.setdefault(item_id.value(), []).append(index)
    found: dict[int, RawJSON] = {}
    for item_id, arrays in by_item.items():
        indexes = texts.get(item_id, [])
        if type(arrays) is not list or len(arrays) != len(indexes):
            continue
        for ordinal, index in enumerate(indexes):
            if type(arrays[ordinal]) is list and arrays[ordinal]:
                found[index] = tree.at(item_id, ordinal)
    return found


def _item_annotations(item: dict[str, Any], where: str) -> list[Any] | None:
    """The annotations of a ``message`` item, one array per content with text (one
    without makes no part), or None when none has any."""
    found: list[Any] = []
    for index, raw in enumerate(_list(item, "content", where)):
        here = f"{where}.content[{index}]"
        content = obj(raw, here)
        if not content.get("text") and not content.get("refusal"):
            continue
        annotations = content.get("annotations")
        if annotations is None:
            annotations = []
        elif type(annotations) is not list:
            raise InvalidResponseError(
                f"{here}.annotations must be an array, got {kind(annotations)}"
            )
        found.append(annotations)
    return found if any(found) else None


def _annotated(annotations: dict[str, list[Any]]) -> Metadata:
    """The message metadata holding ``annotations`` (empty: none)."""
    if not annotations:
        return Metadata()
    return Metadata({ANNOTATIONS_KEY: RawJSON.from_value(annotations)})


def _client_call(
    item: dict[str, Any], item_type: str, item_id: str, where: str, verbatim: Callable[[], RawJSON]
) -> Part:
    """A tool call for an item the client answers (``CLIENT_CALLS``): id = its
    ``call_id`` (an approval request: its ``id``), name = the item's ``name`` or the
    tool's, arguments = the item's input text as it is, or its action's JSON; the item
    itself, verbatim, in metadata ``openai/item``."""
    fixed, member = CLIENT_CALLS[item_type]
    call_id = _str(item, "call_id", where) or item_id
    name = fixed if fixed is not None else _str(item, "name", where)
    value = item.get(member)
    if type(value) is str:
        arguments = value
    elif value is None:
        arguments = "{}"
    else:
        arguments = RawJSON.from_value(obj(value, f"{where}.{member}")).bytes.decode("utf-8")
    call = ToolCall(call_id, name, arguments)
    entries: dict[str, Any] = {ITEM_ID_KEY: item_id, ITEM_KEY: verbatim()}
    if item_type == "custom_tool_call":  # its arguments are the text the model wrote
        entries[FREEFORM_KEY] = True
    return Part(PartKind.TOOL_CALL, tool_call=call, metadata=Metadata(entries))


def _metadata(body: dict[str, Any], where: str, *, usage: bool = True) -> ResponseMetadata:
    usage_raw = body.get("usage") if usage else None
    with as_invalid_response(where):
        return ResponseMetadata(
            meta_text(f"{where}.id", _str(body, "id", where)),
            meta_text(f"{where}.model", _str(body, "model", where)),
            Usage() if usage_raw is None else _usage(usage_raw, f"{where}.usage"),
        )


def parse_response(data: bytes) -> Response:
    """Map a ``response`` object (the JSON body of ``POST /responses``) to a
    ``Response``; ``ProviderError`` for a failed response or an error body,
    ``InvalidResponseError`` naming the path of anything malformed."""
    return _response(load(data, "response body"), "response", Verbatim(data))


def _response(body: dict[str, Any], where: str, verbatim: Verbatim) -> Response:
    error = body.get("error")
    if error is not None or body.get("status") == "failed":
        raise _failure(body, error, "the response failed")
    parts: list[Part] = []
    has_calls = False
    annotations: dict[str, list[Any]] = {}
    for index, raw in enumerate(_list(body, "output", where)):
        here = f"{where}.output[{index}]"
        item = obj(raw, here)
        has_calls = has_calls or _is_call(item)
        parts.extend(_item_parts(item, here, functools.partial(verbatim.at, "output", index)))
        if item.get("type") == "message":
            found = _item_annotations(item, here)
            if found is not None:
                annotations[_str(item, "id", here)] = found
    reason = _finish(body, has_calls, where)
    with as_invalid_response(where):
        meta = _annotated(annotations)
        if parts:
            return Response(
                Output(Message(Role.ASSISTANT, parts, meta), reason), _metadata(body, where)
            )
        return Response(Output(None, reason, message_metadata=meta), _metadata(body, where))


@final
class EventMapper:
    """Turns the typed events of one Responses stream into ``Response`` deltas.

    Text (``response.output_text.delta``) and refusal deltas become text parts carrying
    their item's id; reasoning summary deltas reasoning parts (summaries after the first
    preceded by the blank line that ``call`` joins them with), completed by the
    ``encrypted_content`` of ``response.output_item.done`` as the signature (the one of
    ``response.output_item.added`` is unfinished); a ``function_call`` item a
    ``ToolCallDelta`` when added, then one per argument delta (keyed by ``item_id``).
    What ``response.output_item.done`` holds beyond the deltas (a server that sent
    none) follows as a last delta of that item. ``response.created`` gives id and
    model; ``response.completed`` / ``response.incomplete`` the finish reason and usage.
    ``response.failed`` and ``error`` events raise the matching ``ProviderError``.
    Other events (the ``.done`` and ``.added`` events that repeat what the deltas said,
    hosted tools' progress) carry nothing.
    """

    __slots__ = (
        "_annotations",
        "_calls",
        "_has_calls",
        "_id",
        "_meta",
        "_model",
        "_phases",
        "_refusals",
        "_streamed",
        "_summary",
        "_texts",
        "end_marker_seen",
        "finish_reason_seen",
    )

    def __init__(self) -> None:
        self._id = ""
        self._model = ""
        self._meta: dict[tuple[str, bool], Metadata] = {}
        self._phases: dict[str, str] = {}  # message item id -> its phase
        self._texts: dict[str, Metadata] = {}  # item id -> metadata of its text parts
        self._refusals: dict[str, Metadata] = {}  # item id -> metadata of its refusals
        self._calls: dict[str, tuple[str, str, list[str]]] = {}  # item id -> call
        self._summary: dict[str, int] = {}  # reasoning item id -> last summary index
        self._streamed: dict[str, list[str]] = {}  # item id -> text streamed
        self._annotations: dict[str, list[Any]] = {}  # message item id -> annotations
        self._has_calls = False
        self.end_marker_seen = False
        self.finish_reason_seen = False

    def map(self, event: str, data: bytes) -> Response | None:
        """Map one event; see the class docstring."""
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            if data == b"[DONE]":  # some Open Responses servers end with it
                self.end_marker_seen = True
                return None
            raise InvalidResponseError(f"stream event is not valid JSON: {exc}") from exc
        if type(body) is not dict:
            raise InvalidResponseError(f"stream event must be an object, got {kind(body)}")
        event_type = body.get("type")
        if event_type == "response.output_text.delta":
            # The hot path (one event per text delta), inlined: plain lookups, each
            # item's metadata made once.
            delta = body.get("delta")
            item_id = body.get("item_id")
            meta = self._texts.get(item_id)  # type: ignore[arg-type]
            if meta is None or type(delta) is not str:
                return self._text(body, False)
            if not delta:
                return None
            return text_delta(_TEXT, delta, meta)
        if event_type == "error" or event == "error":
            # Recorded traffic nests the fields under "error"; the SDK's model has them
            # at the top level: read either.
            error = body.get("error")
            raise _failure(body, error if isinstance(error, dict) else body, "stream error")
        if event_type == "response.failed":
            self.end_marker_seen = True
            response = obj(body.get("response"), "stream event.response")
            raise _failure(body, response.get("error"), "the response failed")
        with as_invalid_response(f"stream event {event_type!r}"):
            return self._map(event_type, body, data)

    def _item_meta(self, item_id: str, refusal: bool) -> Metadata:
        meta = self._meta.get((item_id, refusal))
        if meta is None:
            meta = self._meta[item_id, refusal] = _meta(item_id, refusal)
        return meta

    def _text(self, body: dict[str, Any], refusal: bool) -> Response | None:
        # The hot path (one call per text delta): plain lookups, the item's metadata
        # made once.
        delta = body.get("delta")
        item_id = body.get("item_id")
        if type(delta) is not str or type(item_id) is not str or not item_id:
            where = "stream event"
            _str(body, "delta", where)
            raise InvalidResponseError(f"{where}.item_id must be a non-empty string")
        texts = self._texts if not refusal else self._refusals
        meta = texts.get(item_id)
        if meta is None:
            meta = texts[item_id] = _meta(item_id, refusal, self._phases.get(item_id, ""))
            self._streamed.setdefault(item_id, [])
        if not delta:
            return None
        return Response(Output(Message(_ASSISTANT, (Part(_TEXT, text=delta, metadata=meta),))))

    def _map(self, event_type: object, body: dict[str, Any], data: bytes) -> Response | None:
        where = "stream event"
        if event_type in ("response.created", "response.in_progress"):
            return self._started(obj(body.get("response"), f"{where}.response"))
        if event_type == "response.refusal.delta":
            return self._text(body, True)
        if event_type in (
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
        ):
            return self._summary_delta(body, event_type)
        if event_type == "response.function_call_arguments.delta":
            item_id = _str(body, "item_id", where)
            call = self._calls.get(item_id)
            if call is None:
                raise InvalidResponseError(
                    f"{where}: arguments for item {item_id!r}, which is no function call"
                )
            delta = _str(body, "delta", where)
            if not delta:
                return None
            call[2].append(delta)
            return self._call_delta(item_id, call[0], call[1], delta)
        if event_type == "response.output_item.added":
            item = obj(body.get("item"), f"{where}.item")
            if item.get("type") == "message":
                # Its phase goes into the metadata of its parts (made at the first delta).
                phase = _str(item, "phase", f"{where}.item")
                if phase:
                    self._phases[_str(item, "id", f"{where}.item")] = phase
                return None
            if item.get("type") != "function_call":
                return None
            item_id = _str(item, "id", f"{where}.item")
            call_id = _str(item, "call_id", f"{where}.item")
            name = _str(item, "name", f"{where}.item")
            arguments = _str(item, "arguments", f"{where}.item")
            self._calls[item_id] = (call_id, name, [arguments])
            self._has_calls = True
            return self._call_delta(item_id, call_id, name, arguments)
        if event_type == "response.output_item.done":
            item = obj(body.get("item"), f"{where}.item")
            verbatim = functools.partial(Verbatim(data).at, "item")
            return self._item_done(item, f"{where}.item", verbatim)
        if event_type in ("response.completed", "response.incomplete"):
            return self._finished(obj(body.get("response"), f"{where}.response"))
        return None

    def _started(self, response: dict[str, Any]) -> Response | None:
        metadata = _metadata(response, "stream event.response", usage=False)
        new_id = metadata.id if metadata.id != self._id else ""
        new_model = metadata.model if metadata.model != self._model else ""
        if not (new_id or new_model):
            return None
        self._id = metadata.id or self._id
        self._model = metadata.model or self._model
        return Response(metadata=ResponseMetadata(new_id, new_model))

    def _summary_delta(self, body: dict[str, Any], event_type: object) -> Response | None:
        where = "stream event"
        item_id = _str(body, "item_id", where)
        index = body.get("summary_index", 0)
        if type(index) is not int or index < 0:
            raise InvalidResponseError(
                f"{where}.summary_index must be a non-negative integer, got {index!r}"
            )
        previous = self._summary.get(item_id)
        # Summaries after the first are joined by a blank line (as call joins them).
        separators = index if previous is None else index - previous
        if separators < 0:
            raise InvalidResponseError(
                f"{where}: summary_index {index} of item {item_id!r} after {previous}"
            )
        self._summary[item_id] = index
        text = SUMMARY_SEPARATOR * separators
        if event_type == "response.reasoning_summary_text.delta":
            text += _str(body, "delta", where)
        if not text:
            return None
        streamed = self._streamed.get(item_id)
        if streamed is None:
            streamed = self._streamed[item_id] = []
        streamed.append(text)
        part = Part(PartKind.REASONING, text=text, metadata=self._item_meta(item_id, False))
        return Response(Output(Message(Role.ASSISTANT, (part,))))

    def _call_delta(self, item_id: str, call_id: str, name: str, arguments: str) -> Response:
        delta = ToolCallDelta(call_id, name, arguments)
        part = Part(
            PartKind.TOOL_CALL_DELTA,
            tool_call_delta=delta,
            metadata=self._item_meta(item_id, False),
        )
        return Response(Output(Message(Role.ASSISTANT, (part,))))

    def _item_done(
        self, item: dict[str, Any], where: str, verbatim: Callable[[], RawJSON]
    ) -> Response | None:
        item_type = item.get("type")
        item_id = _str(item, "id", where)
        parts: list[Part]
        if item_type == "function_call":
            call = self._calls.get(item_id)
            if call is None:  # never announced: the whole call now
                self._has_calls = True
                parts = _item_parts(item, where, verbatim)
                parts = [_as_delta(part) for part in parts]
            else:
                arguments = _str(item, "arguments", where)
                sent = "".join(call[2])
                rest = arguments[len(sent) :] if arguments.startswith(sent) else ""
                if not rest:
                    return None
                call[2].append(rest)
                return self._call_delta(item_id, call[0], call[1], rest)
        elif item_type == "reasoning":
            text = _reasoning_text(item, where)
            sent = "".join(self._streamed.get(item_id, ()))
            rest = text[len(sent) :] if text.startswith(sent) else ""
            signature = _str(item, "encrypted_content", where).encode("utf-8")
            if not (rest or signature):
                return None
            parts = [
                Part(
                    PartKind.REASONING,
                    text=rest,
                    signature=signature,
                    metadata=self._item_meta(item_id, False),
                )
            ]
        elif item_type == "message":
            found = _item_annotations(item, where)
            if found is not None:
                self._annotations[item_id] = found
            if item_id in self._streamed:
                if found is None:
                    return None  # the deltas said it all
                # Its text has gone out: the annotations (every item's so far, one
                # key) follow as metadata for the message without a part.
                return Response(Output(message_metadata=_annotated(self._annotations)))
            parts = _item_parts(item, where, verbatim)
            if parts:
                message = Message(Role.ASSISTANT, parts, _annotated(self._annotations))
                return Response(Output(message))
        elif item_type in CLIENT_CALLS and not _hosted(item):
            self._has_calls = True  # a call the client answers: whole when it is done
            parts = _item_parts(item, where, verbatim)
        else:
            # Any other item (a hosted tool's call, ...) is complete here: a native part.
            parts = _item_parts(item, where, verbatim)
        if not parts:
            return None
        return Response(Output(Message(Role.ASSISTANT, parts)))

    def _finished(self, response: dict[str, Any]) -> Response:
        where = "stream event.response"
        self.end_marker_seen = True
        self.finish_reason_seen = True
        has_calls = self._has_calls or any(
            isinstance(item, dict) and _is_call(item) for item in _list(response, "output", where)
        )
        reason = _finish(response, has_calls, where)
        metadata = _metadata(response, where)
        new_id = metadata.id if metadata.id != self._id else ""
        new_model = metadata.model if metadata.model != self._model else ""
        return Response(
            Output(finish_reason=reason), ResponseMetadata(new_id, new_model, metadata.usage)
        )


def _as_delta(part: Part) -> Part:
    call = part.tool_call
    assert call is not None
    delta = ToolCallDelta(call.id, call.name, call.arguments)
    return Part(PartKind.TOOL_CALL_DELTA, tool_call_delta=delta, metadata=part.metadata)
