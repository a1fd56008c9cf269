"""The loopback server of tests/openai_server.py, speaking the Anthropic Messages API.

Transcripts live in tests/anthropic_transcripts/ (same format; every ``sse`` object goes
out with an ``event: <its "type">`` line, as the API frames them). The base URL has no
``/v1``, as the official SDK's does. The checkers validate request bodies and responses
with the official ``anthropic`` package's types (a test-only dependency).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import attrs

from tests.openai_server import OpenAIServer, Recorded, validate_body

__all__ = [
    "ALIASES",
    "BINDING_BETA",
    "BOUND_ELSEWHERE",
    "TRANSCRIPTS",
    "AnthropicServer",
    "PreservedThinkingServer",
    "Recorded",
    "Served",
    "check_error",
    "check_event",
    "check_message",
    "check_request_body",
    "load_transcript",
]

TRANSCRIPTS = Path(__file__).parent / "anthropic_transcripts"


def load_transcript(name: str) -> list[dict[str, Any]]:
    """The exchanges of ``tests/anthropic_transcripts/<name>.json``."""
    data = json.loads((TRANSCRIPTS / f"{name}.json").read_text(encoding="utf-8"))
    exchanges: list[dict[str, Any]] = data["exchanges"]
    return exchanges


def _named(exchange: dict[str, Any]) -> dict[str, Any]:
    return {"named_events": True, **exchange} if "sse" in exchange else exchange


class AnthropicServer(OpenAIServer):
    """``with AnthropicServer() as s``: ``s.base_url`` is ``http://127.0.0.1:<port>``."""

    @property
    def base_url(self) -> str:
        return super().base_url.removesuffix("/v1")

    def script(self, *exchanges: dict[str, Any]) -> None:
        super().script(*(_named(exchange) for exchange in exchanges))

    def serve_repeatedly(self, exchange: dict[str, Any]) -> None:
        super().serve_repeatedly(_named(exchange))

    def check_requests(self) -> None:
        """Validate every request body received with the ``anthropic`` package's types."""
        for recorded in self.requests:
            check_request_body(recorded.body)


#: Sampling fields the installed ``anthropic`` package (2.x) no longer lists in its
#: request types, which the API has long accepted and the adapter maps (Options
#: temperature, top_p and top_k): checked here by hand, then removed before the SDK
#: types see the body.
_SAMPLING = {"temperature": float, "top_p": float, "top_k": int}


def check_request_body(body: Any) -> None:
    """Validate a request body with the official ``anthropic`` package's request types
    (``validate_body``: unknown fields refused at every level); the beta types for a
    body that uses a beta field (``thinking.block_binding``) or block (MCP's). Raises pydantic's
    ``ValidationError`` (or ``AssertionError``) for an invalid body.
    """
    assert isinstance(body, dict), f"request body is not a JSON object: {body!r}"
    body = dict(body)
    for name, kind in _SAMPLING.items():
        if name in body:
            value = body.pop(name)
            assert isinstance(value, kind | int) and not isinstance(value, bool), (name, value)
            assert value >= 0 and (kind is int or value <= 1), (name, value)
    thinking = body.get("thinking")
    if (isinstance(thinking, dict) and "block_binding" in thinking) or _beta_blocks(body):
        from pydantic.warnings import TypedDictExtraConfigWarning

        with warnings.catch_warnings():
            # A beta TypedDict (BetaFallbackParam) allows extra items: pydantic says
            # extra="forbid" does not reach it, which is so; everything else it checks.
            warnings.simplefilter("ignore", TypedDictExtraConfigWarning)
            validate_body(body, _beta_params)
    else:
        validate_body(body, _anthropic_params)


#: Block types only the beta types have (besides a remote MCP server's ``mcp_*`` blocks).
_BETA_BLOCKS = frozenset({"compaction", "advisor_tool_result"})


def _beta_blocks(body: dict[str, Any]) -> bool:
    """Whether ``body`` sends back blocks only the beta types have (a remote MCP
    server's ``mcp_tool_use`` / ``mcp_tool_result``, server-side compaction, the
    advisor tool's call and result)."""
    return any(
        isinstance(block, dict)
        and (
            str(block.get("type", "")).startswith("mcp_")
            or block.get("type") in _BETA_BLOCKS
            or (block.get("type") == "server_tool_use" and block.get("name") == "advisor")
        )
        for message in body.get("messages") or ()
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for block in message["content"]
    )


def _anthropic_params(streaming: bool) -> Any:
    from anthropic.types import message_create_params as params

    if streaming:
        return params.MessageCreateParamsStreaming
    return params.MessageCreateParamsNonStreaming


def _beta_params(streaming: bool) -> Any:
    from anthropic.types.beta import message_create_params as params

    if streaming:
        return params.MessageCreateParamsStreaming
    return params.MessageCreateParamsNonStreaming


def check_message(body: Any) -> None:
    """Parse a ``message`` body with the official ``anthropic`` package's model."""
    from anthropic.types import Message

    Message.model_validate(body)


def check_event(body: Any) -> None:
    """Parse one stream event with the official ``anthropic`` package's event union
    (``error`` events with its ``ErrorResponse``; the SDK handles ``ping``, which has no
    model, by name: it must be exactly ``{"type": "ping"}``)."""
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    if body.get("type") == "ping":
        assert body == {"type": "ping"}, body
    elif body.get("type") == "error":
        check_error(body)
    else:
        TypeAdapter(RawMessageStreamEvent).validate_python(body)


def check_error(body: Any) -> None:
    """Parse an error body (or ``error`` event) with the ``anthropic`` package's model."""
    from anthropic.types import ErrorResponse

    ErrorResponse.model_validate(body)


# ------------------------------------------------------------- preserved thinking

#: Model aliases the simulated API answers with a dated snapshot (the ``model`` of
#: its answers), as the real one does.
ALIASES: dict[str, str] = {
    "claude-sonnet-4-0": "claude-sonnet-4-20250514",
    "claude-opus-4-0": "claude-opus-4-20250514",
    "claude-3-7-sonnet-latest": "claude-3-7-sonnet-20250219",
    "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
    "claude-fable-5-1": "claude-fable-5-1-20260801",
}

#: The ``anthropic-beta`` value the API reads ``thinking.block_binding`` with.
BINDING_BETA = "thinking-binding-controls-2026-08-01"

#: What the 400 of a block that fails the prefix check says after its path.
BOUND_ELSEWHERE = (
    "Invalid `signature` in `thinking` block. The block is bound to a different "
    "conversation. Remove the block, or set "
    '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
)

_STATE_BLOCKS = ("thinking", "redacted_thinking")


@attrs.frozen
class Served:
    """What ``PreservedThinkingServer`` did with one request."""

    #: The model asked for and the snapshot that answered.
    asked: str
    model: str
    #: 200, or 400 (``error``: the message).
    status: int
    error: str
    #: Thinking and redacted-thinking blocks the request sent back.
    state_sent: int
    #: Blocks the server dropped (``input_transformations``), by path.
    dropped: tuple[str, ...]
    #: The request began with everything the previous request sent (its system, tools
    #: and messages, byte for byte but for cache_control): an unchanged prefix.
    extends_previous: bool
    #: What the answer holds: ``"tool_use"`` or ``"text"``; thinking blocks minted.
    answer: str
    minted: int
    #: Input tokens: read from and written to the simulated prompt cache, and the rest.
    cache_read: int
    cache_write: int
    uncached: int


def _strip(value: Any) -> Any:
    """``value`` without ``cache_control`` anywhere (the prefix check ignores it)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _canon(value: Any) -> bytes:
    # The server's own canonical form, independent of the client's encoding: sorted
    # keys, no whitespace, cache_control left out.
    return json.dumps(_strip(value), sort_keys=True, separators=(",", ":")).encode()


def _step(state: bytes, data: bytes) -> bytes:
    return hashlib.sha256(state + hashlib.sha256(data).digest()).digest()


class PreservedThinkingServer(AnthropicServer):
    """A loopback Messages API that makes its own answers and enforces preserved
    thinking as Anthropic documents it (platform.claude.com, "Preserved thinking" and
    "Prefix checks on thinking blocks"):

    - every ``thinking`` / ``redacted_thinking`` block it answers with gets a fresh
      signature (or data) that remembers the digest of its prefix: the ``system``,
      the ``tools`` and every earlier message, and the blocks before it in its own
      message (so a thinking block left out or moved between others fails too), all
      compared without ``cache_control``; and the snapshot that made it;
    - a request that sends a block back under another prefix is a 400 ``"messages.{i}
      .content.{j}: " + BOUND_ELSEWHERE`` (``invalid_request_error``), unless it sets
      ``thinking.block_binding.prefix_mismatch_behavior: "drop_block"`` with the
      ``anthropic-beta: thinking-binding-controls-2026-08-01`` header: then the block,
      and the rest of that message's consecutive thinking blocks, are dropped and
      listed in the answer's ``input_transformations`` (``thinking_dropped``,
      ``prefix_binding_mismatch``). ``block_binding`` without the header is a 400. A
      block it never issued is a 400 (``Invalid `signature` in `thinking` block``); a
      block another snapshot made is dropped without an error (``model_binding_mismatch``);
    - with thinking on (``enabled`` or ``adaptive``), a request whose last message holds
      tool results must send back the assistant tool-use message before it starting
      with a thinking block (the API's 400 otherwise);
    - aliases (``ALIASES``: ``claude-sonnet-4-0``, ``-latest`` names) are answered by
      their dated snapshot.

    Answers: with thinking on, a thinking block first (empty text when ``thinking
    .display`` is ``"omitted"``; a ``redacted_thinking`` block after it when the user's
    text contains ``"(redacted)"``); then, when the last user text contains ``"(tools:
    N)"`` and fewer than N tool-result turns followed it, a ``tool_use`` of the first
    tool (``stop_reason: tool_use``); otherwise the text ``"Answer: <user text>"``.
    JSON or a stream, as asked. A prompt cache is simulated from the ``cache_control``
    breakpoints (``_cache_use``). ``served`` records what happened with each request
    (``Served``): ``unchanged_prefix()`` counts the requests that replayed the whole of
    the request before them unchanged.
    """

    def __init__(self) -> None:
        super().__init__()
        #: signature or data -> (prefix digest, snapshot)
        self.minted: dict[str, tuple[bytes, str]] = {}
        self.served: list[Served] = []
        self._previous: bytes | None = None
        self._cache: set[bytes] = set()
        self._count = 0

    def unchanged_prefix(self) -> int:
        """How many requests began with everything the request before them sent."""
        return sum(served.extends_previous for served in self.served)

    def next_exchange(self, recorded: Recorded) -> dict[str, Any] | None:
        if self.queue:
            return self.queue.popleft()
        return self._answer(recorded)

    # ------------------------------------------------------------------ the check

    def _answer(self, recorded: Recorded) -> dict[str, Any]:
        body = recorded.body
        self._count += 1
        asked = str(body.get("model", ""))
        model = ALIASES.get(asked, asked)
        thinking = body.get("thinking") or {}
        thinking_on = thinking.get("type") in ("enabled", "adaptive")
        binding = thinking.get("block_binding") or {}
        drop = binding.get("prefix_mismatch_behavior") == "drop_block"
        betas = [b.strip() for b in recorded.headers.get("anthropic-beta", "").split(",")]
        system = body.get("system")
        if isinstance(system, str):
            system = [{"type": "text", "text": system}]
        messages: list[dict[str, Any]] = list(body.get("messages") or [])
        head = _step(_step(b"", _canon(system)), _canon(body.get("tools")))
        # before[i]: the digest of the prefix of messages[i] (system, tools, messages[:i]).
        before = [head]
        for message in messages:
            before.append(_step(before[-1], _canon(message)))
        extends = self._previous is not None and self._previous in before
        self._previous = before[-1]
        state_sent = sum(
            1
            for m in messages
            if m.get("role") == "assistant"
            for b in m.get("content") or []
            if isinstance(b, dict) and b.get("type") in _STATE_BLOCKS
        )

        def refuse(message: str) -> dict[str, Any]:
            self.served.append(
                Served(asked, model, 400, message, state_sent, (), extends, "", 0, 0, 0, 0)
            )
            return _error(400, message, self._count)

        if binding and BINDING_BETA not in betas:
            return refuse(
                "thinking.block_binding: This setting requires the "
                f"`{BINDING_BETA}` value in the `anthropic-beta` header."
            )
        dropped: list[dict[str, str]] = []
        kept: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") != "assistant" or not isinstance(content, list):
                kept.append(message)
                continue
            blocks: list[dict[str, Any]] = []
            failing = False  # the rest of the consecutive thinking blocks go with it
            for j, block in enumerate(content):
                kind = block.get("type")
                if kind not in _STATE_BLOCKS:
                    failing = False
                    blocks.append(block)
                    continue
                token = block.get("signature" if kind == "thinking" else "data", "")
                minted = self.minted.get(token)
                path = f"messages.{i}.content.{j}"
                if minted is None:
                    return refuse(f"{path}: Invalid `signature` in `{kind}` block.")
                prefix, maker = minted
                if maker != model:
                    dropped.append(_dropped(path, "model_binding_mismatch"))
                    continue
                if failing or prefix != _step(before[i], _canon(content[:j])):
                    if not drop:
                        return refuse(f"{path}: {BOUND_ELSEWHERE}")
                    failing = True
                    dropped.append(_dropped(path, "prefix_binding_mismatch"))
                    continue
                blocks.append(block)
            kept.append({**message, "content": blocks})
        if thinking_on and len(kept) >= 2 and _has_tool_results(kept[-1]):
            final = kept[-2]
            first = (final.get("content") or [{}])[0]
            if final.get("role") == "assistant" and first.get("type") not in _STATE_BLOCKS:
                index = len(messages) - 2
                return refuse(
                    f"messages.{index}.content.0.type: Expected `thinking` or "
                    f"`redacted_thinking`, but found `{first.get('type')}`. When `thinking` "
                    "is enabled, a final `assistant` message must start with a thinking "
                    "block (preceeding the lastmost set of `tool_use` and `tool_result` "
                    "blocks). We recommend you include thinking blocks from previous turns. "
                    "To avoid this requirement, disable `thinking`. Please consult our "
                    "documentation at https://docs.claude.com/en/docs/build-with-claude/"
                    "extended-thinking"
                )
        return self._respond(
            body, asked, model, before[-1], messages, thinking, thinking_on,
            dropped, state_sent, extends,
        )  # fmt: skip

    # ----------------------------------------------------------------- the answer

    def _respond(
        self,
        body: dict[str, Any],
        asked: str,
        model: str,
        prefix: bytes,
        messages: list[dict[str, Any]],
        thinking: dict[str, Any],
        thinking_on: bool,
        dropped: list[dict[str, str]],
        state_sent: int,
        extends: bool,
    ) -> dict[str, Any]:
        question, steps_done = _last_question(messages)
        content: list[dict[str, Any]] = []
        minted = 0

        def mint(block: dict[str, Any], key: str) -> None:
            nonlocal minted
            token = base64.b64encode(os.urandom(24)).decode()
            block[key] = token
            self.minted[token] = (_step(prefix, _canon(content)), model)
            content.append(block)
            minted += 1

        if thinking_on:
            omitted = thinking.get("display") == "omitted"
            text = "" if omitted else f"Thinking about {question!r}."
            mint({"type": "thinking", "thinking": text}, "signature")
            if "(redacted)" in question:
                mint({"type": "redacted_thinking"}, "data")
        wanted = _wanted_steps(question)
        tools = body.get("tools") or []
        if tools and steps_done < wanted:
            tool = tools[0]["name"]
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{self._count:06d}",
                    "name": tool,
                    "input": {"step": steps_done + 1},
                }
            )
            stop, answer = "tool_use", "tool_use"
        else:
            content.append({"type": "text", "text": f"Answer: {question}"})
            stop, answer = "end_turn", "text"
        read, write, total = self._cache_use(body, messages)
        usage = {
            "input_tokens": total - read - write,
            "cache_creation_input_tokens": write,
            "cache_read_input_tokens": read,
            "output_tokens": 5 + len(content),
        }
        message: dict[str, Any] = {
            "id": f"msg_{self._count:06d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if dropped or thinking.get("block_binding"):
            message["input_transformations"] = dropped
        self.served.append(
            Served(
                asked,
                model,
                200,
                "",
                state_sent,
                tuple(d["path"] for d in dropped),
                extends,
                answer,
                minted,
                read,
                write,
                total - read - write,
            )
        )
        headers = {"request-id": f"req_{self._count:06d}"}
        if body.get("stream"):
            return {
                "status": 200,
                "headers": headers,
                "sse": _events(message),
                "named_events": True,
            }
        return {"status": 200, "headers": headers, "json": message}

    def _cache_use(
        self, body: dict[str, Any], messages: list[dict[str, Any]]
    ) -> tuple[int, int, int]:
        """(read, written, total) tokens of the simulated prompt cache: a token is 4
        bytes of the canonical request; each ``cache_control`` breakpoint (on the last
        tool, a system block, a message's block) caches the prefix up to it; a request
        reads the longest cached prefix that ends at one of its breakpoints and writes
        from there to its last breakpoint."""
        parts: list[tuple[bytes, bool]] = []  # (canonical piece, breakpoint after it)
        for tool in body.get("tools") or []:
            parts.append((_canon(tool), "cache_control" in tool))
        system = body.get("system")
        for block in system if isinstance(system, list) else []:
            parts.append((_canon(block), "cache_control" in block))
        for message in messages:
            parts.append((message.get("role", "").encode(), False))
            content = message.get("content")
            for block in content if isinstance(content, list) else [content]:
                parts.append((_canon(block), isinstance(block, dict) and "cache_control" in block))
        state = b""
        size = 0
        read = 0
        last = 0
        for piece, mark in parts:
            state = _step(state, piece)
            size += len(piece)
            if mark:
                if state in self._cache:
                    read = size
                self._cache.add(state)
                last = size
        total = size // 4
        read //= 4
        write = max(0, last // 4 - read)
        return read, write, total


def _dropped(path: str, reason: str) -> dict[str, str]:
    return {"type": "thinking_dropped", "path": path, "reason": reason}


def _has_tool_results(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and any(b.get("type") == "tool_result" for b in content)
    )


def _last_question(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The text of the last user message that has text, and how many tool-result turns
    followed it."""
    steps = 0
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content, steps
        texts = [b["text"] for b in content if b.get("type") == "text"]
        if texts:
            return " ".join(texts), steps
        steps += 1
    return "", steps


def _wanted_steps(question: str) -> int:
    marker = question.find("(tools: ")
    if marker < 0:
        return 0
    end = question.find(")", marker)
    return int(question[marker + len("(tools: ") : end])


def _error(status: int, message: str, count: int) -> dict[str, Any]:
    return {
        "status": status,
        "headers": {"request-id": f"req_{count:06d}"},
        "json": {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": message},
            "request_id": f"req_{count:06d}",
        },
    }


def _events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream of ``message`` as the Messages API sends it: ``message_start`` (with
    ``input_transformations``), each block as start, deltas and stop (a thinking
    block's text, then its signature; a tool's input as JSON), ``message_delta`` and
    ``message_stop``."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "thinking":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                }
            )
            if block["thinking"]:
                delta = {"type": "thinking_delta", "thinking": block["thinking"]}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        elif kind == "redacted_thinking":
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        elif kind == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            delta = {"type": "text_delta", "text": block["text"]}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:  # tool_use
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                }
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events
