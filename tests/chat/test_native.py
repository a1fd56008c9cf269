"""Native parts (DESIGN §6k): a provider's own item kept whole, in its position.

The value's rules (each with its bad input and exact error), the codec (number spellings
inside the item survive, canonical bytes), the accumulator (native parts keep their
order and never merge), ``.text`` (never text) and a history ``Batch`` (its digest
covers the item's bytes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from scope.chat import (
    Message,
    NativeItem,
    Output,
    Part,
    PartKind,
    Response,
    ResponseAccumulator,
    Role,
    assistant_message,
    native_part,
    text_part,
    user_message,
)
from scope.codec import from_json, to_json
from scope.errors import InvalidMessageError, InvalidPartError
from scope.history import Batch
from scope.jsonvalue import RawJSON
from tests.strategies import messages, parts

SEARCH = '{"type":"web_search_call","id":"ws_1","status":"completed","score":0.50}'


def test_native_part_keeps_the_item_and_is_never_text() -> None:
    part = native_part("openai.responses", "web_search_call", RawJSON.parse(SEARCH))
    assert part.kind is PartKind.NATIVE
    assert part.native == NativeItem("openai.responses", "web_search_call", RawJSON(SEARCH))
    assert part.native is not None and b'"score":0.50' in part.native.data.bytes
    message = assistant_message("before", part, "after")
    assert message.text == "beforeafter"
    assert [p.kind for p in message.parts] == [PartKind.TEXT, PartKind.NATIVE, PartKind.TEXT]


def test_native_data_from_a_dict_or_text() -> None:
    from_dict = native_part("anthropic.messages", "server_tool_use", {"type": "x", "id": "a"})
    from_text = native_part("anthropic.messages", "server_tool_use", '{"id": "a", "type": "x"}')
    assert from_dict == from_text


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("", "t", {}), "native item provider must not be empty"),
        ((" openai", "t", {}), "native item provider must not have surrounding whitespace"),
        (("p", "", {}), "native item type must not be empty"),
        (("p", "t\n", {}), "native item type must not have surrounding whitespace"),
        (("p", "t", [1]), "native item data must be a JSON object, got [1]"),
        (("p", "t", '"text"'), "native item data must be a JSON object"),
        (("p", "t", "{"), "native item data"),
        ((1, "t", {}), "native item provider must be a string, got int"),
    ],
)
def test_invalid_native_items_are_refused(args: tuple[Any, ...], problem: str) -> None:
    with pytest.raises(InvalidPartError, match="native item") as caught:
        NativeItem(*args)
    assert problem in str(caught.value)
    with pytest.raises(InvalidPartError, match=r"^part native: "):
        native_part(*args)


def test_a_native_part_carries_only_its_item() -> None:
    item = NativeItem("p", "t", {})
    with pytest.raises(InvalidPartError, match="a native part needs its native"):
        Part(PartKind.NATIVE)
    with pytest.raises(InvalidPartError, match="a native part must not set text"):
        Part(PartKind.NATIVE, text="x", native=item)
    with pytest.raises(InvalidPartError, match="a native part must not set a signature"):
        Part(PartKind.NATIVE, signature=b"s", native=item)
    with pytest.raises(InvalidPartError, match="a text part must not set native"):
        Part(PartKind.TEXT, text="x", native=item)
    with pytest.raises(InvalidPartError, match="part native must be a NativeItem, got dict"):
        Part(PartKind.NATIVE, native={"provider": "p"})  # type: ignore[arg-type]


def test_only_assistant_messages_carry_native_parts() -> None:
    part = native_part("p", "t", {})
    for role in (Role.SYSTEM, Role.USER, Role.TOOL):
        with pytest.raises(InvalidMessageError, match=f"a {role} message cannot carry a native"):
            Message(role, (part,))


def test_codec_keeps_the_item_verbatim_and_canonical() -> None:
    wire = (
        b'{"role":"assistant","parts":[{"kind":"native","native":{"provider":'
        b'"openai.responses","type":"web_search_call","data":' + SEARCH.encode() + b"}}]}"
    )
    message = from_json(wire, Message)
    native = message.parts[0].native
    assert native is not None
    assert native.data.bytes == (
        b'{"id":"ws_1","score":0.50,"status":"completed","type":"web_search_call"}'
    )
    assert to_json(message) == (
        b'{"parts":[{"kind":"native","native":{"data":{"id":"ws_1","score":0.50,'
        b'"status":"completed","type":"web_search_call"},"provider":"openai.responses",'
        b'"type":"web_search_call"}}],"role":"assistant"}'
    )


@pytest.mark.parametrize(
    ("native", "problem"),
    [
        ('{"provider":"p","type":"t","data":[]}', "parts[0].native: native item data must be"),
        ('{"provider":"p","type":"t"}', "parts[0].native"),
        ('{"provider":"p","type":"t","data":{},"x":1}', "parts[0].native"),
        ('{"provider":"","type":"t","data":{}}', "native item provider must not be empty"),
        ('{"provider":"p","type":1,"data":{}}', "parts[0].native.type"),
    ],
)
def test_codec_refuses_a_bad_native_item(native: str, problem: str) -> None:
    wire = '{"role":"assistant","parts":[{"kind":"native","native":' + native + "}]}"
    with pytest.raises(InvalidMessageError) as caught:
        from_json(wire, Message)
    assert problem in str(caught.value)


def test_codec_refuses_a_native_part_in_a_user_message() -> None:
    wire = (
        '{"role":"user","parts":[{"kind":"native","native":{"provider":"p","type":"t","data":{}}}]}'
    )
    with pytest.raises(InvalidMessageError, match="a user message cannot carry a native part"):
        from_json(wire, Message)


@given(parts(PartKind.NATIVE))
def test_native_parts_round_trip(part: Part) -> None:
    message = assistant_message(part)
    encoded = to_json(message)
    decoded = from_json(encoded, Message)
    assert decoded == message
    assert to_json(decoded) == encoded


def _chunk(*chunk_parts: Part) -> Response:
    return Response(Output(Message(Role.ASSISTANT, chunk_parts)))


def test_the_accumulator_keeps_native_parts_in_order() -> None:
    first = native_part("anthropic.messages", "server_tool_use", {"id": "srvtoolu_1"})
    second = native_part("anthropic.messages", "web_search_tool_result", {"id": "r"})
    accumulator = ResponseAccumulator()
    for chunk in (
        _chunk(text_part("Let me ")),
        _chunk(text_part("search.")),
        _chunk(first),
        _chunk(second),
        _chunk(text_part("Found.")),
    ):
        accumulator.add(chunk)
    response = accumulator.response()
    assert response is not None and response.output is not None
    assert response.output.message == assistant_message("Let me search.", first, second, "Found.")
    assert accumulator.text == "Let me search.Found."


def test_an_answer_of_native_items_only_is_a_message() -> None:
    image = native_part(
        "openai.responses", "image_generation_call", {"id": "ig_1", "result": "Zm9v"}
    )
    accumulator = ResponseAccumulator()
    accumulator.add(_chunk(image))
    response = accumulator.response()
    assert response is not None and response.output is not None
    assert response.output.message == assistant_message(image)
    assert response.text == ""


def test_a_batch_digest_covers_the_native_bytes() -> None:
    one = assistant_message(native_part("p", "t", '{"n":1.0}'))
    other = assistant_message(native_part("p", "t", '{"n":1.00}'))
    assert one != other  # number spellings count
    first = Batch("c", "a1", (user_message("hi"), one))
    second = Batch("c", "a1", (user_message("hi"), other))
    assert first.digest != second.digest
    assert from_json(first.to_json(), Batch) == first


@given(messages(Role.ASSISTANT))
def test_assistant_messages_with_native_parts_batch_and_decode(message: Message) -> None:
    batch = Batch("c", "a1", (message,))
    assert from_json(batch.to_json(), Batch) == batch


def test_the_other_readers_of_a_message_see_a_native_part() -> None:
    # Token windows count its bytes; the compaction transcript, the CLI and the
    # OpenTelemetry conventions name it (never its data, which may be encrypted).
    from scope.cli._render import render_message
    from scope.history import DefaultTokenCounter
    from scope.history._compact import transcript
    from scope.otel._conventions import message as otel_message

    data = '{"encrypted_content":"' + "x" * 400 + '","type":"compaction"}'
    native = assistant_message("ok", native_part("openai.responses", "compaction", data))
    plain = assistant_message("ok")
    counter = DefaultTokenCounter()
    assert counter.count([native]) - counter.count([plain]) == -(-len(data) // 4)
    assert "[openai.responses compaction]" in transcript([native])
    assert any("(native openai.responses compaction)" in line for line in render_message(1, native))
    rendered = str(otel_message(native))
    assert "compaction" in rendered and "x" * 40 not in rendered
