"""Native parts go back to their own model only (DESIGN §6k), on every adapter's wire.

A native part of an adapter's own message, in that adapter's wire form, is sent byte for
byte in its position; to another model, another API or over Chat Completions (which has
no items of its own) it is left out and counted. The items here are shaped like the
providers' (their recorded answers are exercised per adapter elsewhere); the opaque
strings in them are invented, marked ``INVENTED``."""

from __future__ import annotations

import orjson
import pytest

from scope.chat import (
    Options,
    Request,
    assistant_message,
    native_part,
    reasoning_part,
    text_part,
    user_message,
)
from scope.jsonvalue import RawJSON
from scope.models import (
    _anthropic_wire,
    _gemini_wire,
    _interactions_wire,
    _openai_wire,
    _responses_wire,
)
from scope.models._provenance import Replay, stamp
from scope.models._responses_wire import ITEM_ID_KEY
from tests.helpers import WIRES

MODEL = "test-model"
# INVENTED: an item with opaque fields and a number spelling a re-encoding would change.
ITEM = b'{"type":"x_item","id":"x_1","encrypted_content":"gAAAAB+/x==","score":2.50,"z":[1.0]}'
#: What goes back: the item's canonical bytes (key order and whitespace don't count;
#: strings and number tokens are the provider's own).
SENT = RawJSON.parse(ITEM).bytes

SENDING = [_anthropic_wire.API, _gemini_wire.API, _responses_wire.API, _interactions_wire.API]


def _body(api: str, *, item_api: str, answered_by: str, model: str = MODEL) -> tuple[bytes, Replay]:
    module, provider = WIRES[api]
    answer_api, answer_provider = answered_by, WIRES[answered_by][1]
    before = text_part("Searching first.", {ITEM_ID_KEY: "msg_1"})
    after = text_part("Found it.", {ITEM_ID_KEY: "msg_2"})
    answer = assistant_message(before, native_part(item_api, "x_item", ITEM), after)
    answer = stamp(answer, answer_api, answer_provider, model, asked=model)
    request = Request((user_message("Find it."), answer, user_message("And then?")))
    replay = Replay(api, provider)
    built = module.build_body(
        request, default_options=Options(), model=MODEL, stream=False, replay=replay
    )
    return orjson.dumps(built), replay


@pytest.mark.parametrize("api", SENDING)
def test_own_native_item_goes_back_byte_exact_in_position(api: str) -> None:
    body, replay = _body(api, item_api=api, answered_by=api)
    assert replay.left_out == []
    assert body.count(SENT) == 1 and b'"score":2.50' in SENT and b'"z":[1.0]' in SENT
    assert body.index(b"Searching first.") < body.index(SENT) < body.index(b"Found it.")


@pytest.mark.parametrize("api", list(WIRES))
def test_native_item_of_another_model_is_left_out(api: str) -> None:
    body, replay = _body(api, item_api=api, answered_by=api, model="another-model")
    assert b"gAAAAB" not in body and b"x_item" not in body
    assert replay.left_out == ["messages[1].parts[1] (a native item of another model)"]
    assert b"Searching first." in body and b"Found it." in body


@pytest.mark.parametrize("api", list(WIRES))
@pytest.mark.parametrize("answered_by", list(WIRES))
def test_native_item_of_another_api_never_crosses(api: str, answered_by: str) -> None:
    item_api = answered_by
    if api == answered_by:
        item_api = "x.custom"  # stamped as its own answer, but not in its wire form
    body, replay = _body(api, item_api=item_api, answered_by=answered_by)
    assert b"gAAAAB" not in body and b"x_item" not in body
    assert len(replay.left_out) == 1 and "native item" in replay.left_out[0]


def test_chat_completions_sends_no_native_items() -> None:
    body, replay = _body(_openai_wire.API, item_api=_openai_wire.API, answered_by=_openai_wire.API)
    assert b"gAAAAB" not in body
    assert replay.left_out == ["messages[1].parts[1] (a native item of another model)"]


def test_responses_reasoning_before_a_native_item_goes_back_with_it() -> None:
    # A reasoning item is sent only with the item that follows it: a native item counts.
    api = _responses_wire.API
    reasoning = reasoning_part("", b"gAAAAB-encrypted", {ITEM_ID_KEY: "rs_1"})  # INVENTED
    answer = assistant_message(reasoning, native_part(api, "x_item", ITEM))
    answer = stamp(answer, api, _responses_wire.PROVIDER, MODEL, asked=MODEL)
    replay = Replay(api, _responses_wire.PROVIDER)
    request = Request((user_message("Find it."), answer, user_message("And then?")))
    built = _responses_wire.build_body(
        request, default_options=Options(), model=MODEL, stream=False, replay=replay
    )
    body = orjson.dumps(built)
    assert replay.left_out == []
    items = orjson.loads(body)["input"]
    assert [item["type"] for item in items] == ["message", "reasoning", "x_item", "message"]
    assert body.index(b'"rs_1"') < body.index(SENT)


def test_a_kept_item_with_a_duplicate_member_is_an_invalid_response() -> None:
    # orjson keeps the last of two equal member names; an item kept verbatim must not
    # silently lose one, so the answer is refused.
    from scope.errors import InvalidResponseError
    from scope.models._responses_wire import parse_response

    body = b'{"status":"completed","output":[{"type":"web_search_call","id":"ws_1","id":"ws_2"}]}'
    with pytest.raises(InvalidResponseError, match="a kept item is not exact JSON"):
        parse_response(body)
