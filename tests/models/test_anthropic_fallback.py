"""An Anthropic server-side fallback: one answer from two models (DESIGN §6k).

The ``fallback`` block marks where the requested model's output ends and the fallback
model's begins (its shape per the ``anthropic`` package's ``BetaFallbackBlock``; no
public recording was found, so the answer, its models and signatures are INVENTED). The
block is a native part in place; every part after it carries part metadata
``scope/model`` = the fallback model, by call and by stream; each part's provider state
goes back only to the model that made it."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from scope.chat import Options, PartKind, Request, user_message
from scope.models._anthropic_wire import API, PROVIDER, EventMapper, build_body, parse_message
from scope.models._provenance import MODEL_KEY, Replay
from tests.helpers import merged

ASKED = "claude-opus-5"
FALLBACK = "claude-sonnet-5-20260601"
SIG_A = base64.b64encode(b"signature-of-opus").decode()  # INVENTED
SIG_B = base64.b64encode(b"signature-of-sonnet").decode()  # INVENTED
CONTENT: list[dict[str, Any]] = [
    {"type": "thinking", "thinking": "Hmm.", "signature": SIG_A},
    {
        "type": "fallback",
        "from": {"model": ASKED},
        "to": {"model": FALLBACK},
        "trigger": {"type": "refusal"},
    },
    {"type": "thinking", "thinking": "Let me answer.", "signature": SIG_B},
    {"type": "text", "text": "Here it is."},
]
BODY = {
    "id": "msg_fallback_01",
    "type": "message",
    "role": "assistant",
    "model": ASKED,
    "content": CONTENT,
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20},
}


def _events() -> list[bytes]:
    start = {**BODY, "content": [], "stop_reason": None}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(CONTENT):
        if block["type"] == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            events.append({"type": "content_block_start", "index": index, "content_block": opened})
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        elif block["type"] == "text":
            opened = {"type": "text", "text": ""}
            events.append({"type": "content_block_start", "index": index, "content_block": opened})
            delta = {"type": "text_delta", "text": block["text"]}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 20},
        }
    )
    events.append({"type": "message_stop"})
    return [orjson.dumps(event) for event in events]


def _streamed() -> Any:
    mapper = EventMapper()
    chunks = [mapper.map("", data) for data in _events()]
    return merged(chunk for chunk in chunks if chunk is not None)


@pytest.mark.parametrize("mode", ["call", "stream"])
def test_parts_after_a_fallback_carry_the_fallback_model(mode: str) -> None:
    response = parse_message(orjson.dumps(BODY)) if mode == "call" else _streamed()
    assert response.output is not None and response.output.message is not None
    parts = response.output.message.parts
    assert [p.kind for p in parts] == [
        PartKind.REASONING,
        PartKind.NATIVE,
        PartKind.REASONING,
        PartKind.TEXT,
    ]
    assert MODEL_KEY not in parts[0].metadata and MODEL_KEY not in parts[1].metadata
    assert [p.metadata[MODEL_KEY].value() for p in parts[2:]] == [FALLBACK, FALLBACK]
    native = parts[1].native
    assert native is not None and native.data.value() == CONTENT[1]


def _sent(model: str) -> tuple[list[dict[str, Any]], Replay]:
    answer = parse_message(orjson.dumps(BODY))
    assert answer.output is not None and answer.output.message is not None
    message = Replay(API, PROVIDER, ASKED).stamp(answer.output.message, ASKED)
    request = Request([user_message("Q?"), message, user_message("And?")])
    replay = Replay(API, PROVIDER)
    body = build_body(request, default_options=Options(), model=model, stream=False, replay=replay)
    blocks: list[dict[str, Any]] = orjson.loads(orjson.dumps(body))["messages"][1]["content"]
    return blocks, replay


def test_each_part_goes_back_to_the_model_that_made_it() -> None:
    to_asked, replay = _sent(ASKED)
    # The requested model gets its own thinking and the fallback block, not the other's.
    assert [b["type"] for b in to_asked] == ["thinking", "fallback", "text"]
    assert to_asked[0]["signature"] == SIG_A
    assert replay.left_out == ["messages[1].parts[2] (reasoning of another model)"]
    to_fallback, replay = _sent(FALLBACK)
    # The fallback model gets its thinking; the other model's and the block are left out.
    assert [b["type"] for b in to_fallback] == ["thinking", "text"]
    assert to_fallback[0]["signature"] == SIG_B
    assert len(replay.left_out) == 2
