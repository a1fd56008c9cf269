"""The loopback server of tests/openai_server.py, speaking the Gemini Interactions API
(``POST /v1beta/interactions``, revision ``2026-05-20``: the steps shape).

Transcripts live in tests/gemini_interactions_transcripts/ (the openai_server format,
plus ``provenance``: the repository, path and commit a recording comes from, or
``invented`` saying what was made up and why). A recorded stream is kept byte for byte:
one ``{"$raw": "event: ...\\ndata: ...\\n\\n"}`` item per event.

``assembled(events)`` folds a recorded stream into the ``Interaction`` a non-streamed
request gets, by the documented rule ("each element in ``steps`` is the fully assembled
version of one ``step.start`` -> ``step.delta``\\(s) -> ``step.stop`` cycle"), so one
recording serves both modes.

``check_request_body`` validates a request body against the API reference as the
official ``google-genai`` package types it (``CreateModelInteraction``, a test-only
dependency), strictly: those pydantic models accept unknown members and unknown union
variants, so every model in the parsed tree is also checked to have no extra members
and to be no ``Unknown*`` variant. By hand: ``store`` is sent, every ``thought`` step
carries a non-empty signature, every ``function_result`` answers a ``function_call``
sent before it (unless the request continues a stored interaction), and the
``Api-Revision`` header is the steps revision (``check_requests``).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import orjson

from tests.gemini_server import GeminiServer
from tests.openai_server import Recorded

__all__ = [
    "TRANSCRIPTS",
    "InteractionsServer",
    "Recorded",
    "assembled",
    "check_interaction",
    "check_request_body",
    "disassembled",
    "events_of",
    "load",
]

TRANSCRIPTS = Path(__file__).parent / "gemini_interactions_transcripts"
_B64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}\Z")
_PLACEHOLDERS = {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}


def load(name: str) -> dict[str, Any]:
    """The whole transcript ``tests/gemini_interactions_transcripts/<name>.json``."""
    data: dict[str, Any] = json.loads((TRANSCRIPTS / f"{name}.json").read_text("utf-8"))
    assert "provenance" in data or "invented" in data, f"{name}: no provenance"
    return data


def events_of(exchange: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON payloads of a recorded stream exchange, in order (``[DONE]`` left out)."""
    out = []
    for item in exchange["sse"]:
        for line in item["$raw"].splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def assembled(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``Interaction`` of a non-streamed request with the answer ``events`` stream."""
    interaction: dict[str, Any] = {}
    steps: dict[int, dict[str, Any]] = {}
    arguments: dict[int, str] = {}
    for event in events:
        kind = event["event_type"]
        if kind in ("interaction.created", "interaction.completed"):
            interaction.update(event["interaction"])
        elif kind == "step.start":
            steps[event["index"]] = json.loads(json.dumps(event["step"]))
        elif kind == "step.delta":
            step, delta = steps[event["index"]], event["delta"]
            if delta["type"] == "text":
                content = step.setdefault("content", [])
                if content and content[-1]["type"] == "text":
                    content[-1]["text"] += delta["text"]
                else:
                    content.append({"type": "text", "text": delta["text"]})
            elif delta["type"] == "thought_signature":
                step["signature"] = delta["signature"]
            elif delta["type"] == "thought_summary":
                step.setdefault("summary", []).append(delta["content"])
            elif delta["type"] == "arguments_delta":
                arguments[event["index"]] = arguments.get(event["index"], "") + delta["arguments"]
            else:
                raise AssertionError(f"no rule for a {delta['type']} delta")
    for index, text in arguments.items():
        steps[index]["arguments"] = json.loads(text)
    interaction["steps"] = [steps[index] for index in sorted(steps)]
    return interaction


def disassembled(interaction: dict[str, Any]) -> list[Any]:
    """The ``sse`` items of the stream that stands for ``interaction`` (the inverse of
    ``assembled``: one delta per summary item, text, annotation list, image or
    signature; a function call's arguments in one ``arguments_delta``, as recorded;
    any other step whole on its ``step.start``; the echoed input left out)."""
    head = {k: v for k, v in interaction.items() if k not in ("steps", "usage")}
    events: list[dict[str, Any]] = [
        {"event_type": "interaction.created", "interaction": {**head, "status": "in_progress"}}
    ]
    steps = [s for s in interaction.get("steps", []) if s["type"] != "user_input"]
    for index, step in enumerate(steps):
        kind = step["type"]
        deltas: list[dict[str, Any]] = []
        start = dict(step)
        if kind == "thought":
            start = {"type": "thought"}
            deltas = [{"type": "thought_summary", "content": c} for c in step.get("summary", [])]
            if "signature" in step:
                deltas.append({"type": "thought_signature", "signature": step["signature"]})
        elif kind == "model_output":
            start = {"type": "model_output"}
            for item in step.get("content", []):
                if item["type"] == "text":
                    deltas.append({"type": "text", "text": item["text"]})
                    if item.get("annotations"):
                        deltas.append(
                            {"type": "text_annotation_delta", "annotations": item["annotations"]}
                        )
                else:
                    deltas.append(item)
        elif kind == "function_call":
            start = {**step, "arguments": {}}
            arguments = json.dumps(step["arguments"], separators=(",", ":"))
            deltas = [{"type": "arguments_delta", "arguments": arguments}]
        events.append({"event_type": "step.start", "index": index, "step": start})
        events.extend({"event_type": "step.delta", "index": index, "delta": d} for d in deltas)
        events.append({"event_type": "step.stop", "index": index})
    events.append(
        {
            "event_type": "interaction.completed",
            "interaction": {k: v for k, v in interaction.items() if k != "steps"},
        }
    )
    items: list[Any] = [
        {"$raw": f"event: {e['event_type']}\ndata: {json.dumps(e, separators=(',', ':'))}\n\n"}
        for e in events
    ]
    items.append({"$raw": "event: done\ndata: [DONE]\n\n"})
    return items


class InteractionsServer(GeminiServer):
    """``with InteractionsServer() as s``: ``s.base_url`` is the host root."""

    def check_requests(self) -> None:
        """Validate every request received: path, revision header and body."""
        for recorded in self.requests:
            assert recorded.path == "/v1beta/interactions", recorded.path
            assert recorded.headers.get("api-revision") == "2026-05-20", recorded.headers
            check_request_body(recorded.body)


#: Members recorded answers carry that google-genai's types lack.
_ANSWER_EXTRAS = frozenset({"object", "raw_prompt_token"})


def _strict(value: Any, path: str, allowed: frozenset[str] = frozenset()) -> None:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        assert not getattr(value, "is_unknown", False), f"{path}: unknown {type(value).__name__}"
        # A model that declares no field (a function result's object) is free-form.
        free = not type(value).model_fields
        extra = set() if free else set(value.model_extra or ()) - allowed
        assert not extra, f"{path}: unknown members {sorted(extra)}"
        for name, field in type(value).model_fields.items():
            if field.deprecated:
                assert name not in value.model_fields_set, f"{path}.{name} is deprecated"
                continue
            _strict(getattr(value, name), f"{path}.{name}", allowed)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _strict(item, f"{path}[{index}]", allowed)


def check_request_body(body: Any) -> None:
    """Validate a request body (see the module docstring); ``AssertionError`` or
    pydantic's ``ValidationError`` for an invalid one."""
    import warnings

    from google.genai._gaos.types.interactions import CreateModelInteraction

    assert isinstance(body, dict), f"request body is not a JSON object: {body!r}"
    assert isinstance(body.get("store"), bool), "store must be sent"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        parsed = CreateModelInteraction.model_validate_json(orjson.dumps(body))
        _strict(parsed, "$")
    steps = body["input"]
    assert isinstance(steps, list), "input must be an array of steps"
    calls: set[str] = set()
    for index, step in enumerate(steps):
        kind = step["type"]
        if kind == "thought":
            signature = step.get("signature")
            assert isinstance(signature, str) and signature, f"input[{index}]: unsigned thought"
            if signature not in _PLACEHOLDERS:
                assert _B64.match(signature), signature
                base64.b64decode(signature + "=" * (-len(signature) % 4))
        elif kind == "function_call":
            calls.add(step["id"])
        elif kind == "function_result" and "previous_interaction_id" not in body:
            assert step["call_id"] in calls, f"input[{index}]: answers no call sent"


def check_interaction(body: Any) -> None:
    """Validate an ``Interaction`` (a non-streamed answer) with the SDK's model, as
    strictly as a request body but for the members real answers carry beyond it
    (``object``, ``usage.raw_prompt_token``)."""
    import warnings

    from google.genai._gaos.types.interactions import Interaction

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _strict(Interaction.model_validate_json(orjson.dumps(body)), "$", _ANSWER_EXTRAS)
