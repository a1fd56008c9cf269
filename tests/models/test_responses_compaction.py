"""A provider's compaction item is a window start for its own model only (DESIGN §6k).

The compaction item is the one the API returned in a recorded answer (pydantic-ai's
``test_openai_responses_compact_messages.yaml``, interaction 2: ``POST
/responses/compact``), kept as a native part of an answer of the same model. To that
model a request sends the system prompt, the compaction item and what follows it, not
the turns it stands for; to any other model the stored transcript, the item left out."""

from __future__ import annotations

import orjson

from scope.chat import (
    Options,
    Request,
    assistant_message,
    native_part,
    system_message,
    user_message,
)
from scope.models import _anthropic_wire
from scope.models._provenance import Replay
from scope.models._responses_wire import API, PROVIDER, build_body

# The recorded compaction item (its encrypted_content cut to its first 120 characters,
# which keeps it a string the API produced the start of; the adapter never reads it).
COMPACTION = {
    "type": "compaction",
    "encrypted_content": (
        "gAAAAABpzfWE_k5OtOa3sTEbupueyuGGrezu8qQwIs0tBzhGnuGHf4CETdD8c1lm0sAkbJey8wy5X"
        "gwDOJhNoDcyGcXkfl5p7bG4ymtzAr7JRl8ChuTJ2HuFN"
    ),
}
MODEL = "gpt-5-mini"


def _conversation() -> Request:
    compacted = Replay(API, PROVIDER, MODEL).stamp(
        assistant_message(native_part(API, "compaction", COMPACTION), "Noted."), MODEL
    )
    return Request(
        [
            system_message("Be brief."),
            user_message("What is 2+2?"),
            Replay(API, PROVIDER, MODEL).stamp(assistant_message("4"), MODEL),
            user_message("And 3+3?"),
            compacted,
            user_message("And 5+5?"),
        ]
    )


def test_the_compaction_item_starts_the_window_of_its_own_model() -> None:
    replay = Replay(API, PROVIDER)
    body = build_body(
        _conversation(), default_options=Options(), model=MODEL, stream=False, replay=replay
    )
    sent = orjson.loads(orjson.dumps(body))["input"]
    assert sent[0] == {"type": "message", "role": "system", "content": "Be brief."}
    assert sent[1] == COMPACTION
    assert [item.get("content") for item in sent[2:]] == ["Noted.", "And 5+5?"]
    assert b"2+2" not in orjson.dumps(body) and replay.left_out == []


def test_any_other_model_gets_the_stored_transcript() -> None:
    replay = Replay(API, PROVIDER)
    body = build_body(
        _conversation(), default_options=Options(), model="gpt-other", stream=False, replay=replay
    )
    sent = orjson.dumps(body)
    assert b"What is 2+2?" in sent and b"And 3+3?" in sent and b"And 5+5?" in sent
    assert b"gAAAAB" not in sent
    assert replay.left_out == ["messages[4].parts[0] (a native item of another model)"]
    other = Replay(_anthropic_wire.API, _anthropic_wire.PROVIDER)
    body = _anthropic_wire.build_body(
        _conversation(), default_options=Options(), model="claude-x", stream=False, replay=other
    )
    assert b"What is 2+2?" in orjson.dumps(body) and b"gAAAAB" not in orjson.dumps(body)
