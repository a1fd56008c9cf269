"""Replay bindings in the Anthropic adapter (DESIGN §6g): ``scope/prefix`` digests and
prefix-aware replay, ``drop_mismatched_thinking`` and the response's
``input_transformations``, empty-text thinking, ``prompt_cache`` breakpoints.

The wire tests build bodies with ``build_body`` (each validated with the official
``anthropic`` package's request types); the HTTP tests run against the loopback server
that enforces preserved thinking (``tests.anthropic_server.PreservedThinkingServer``)
under asyncio and trio, by ``call`` and by ``stream``.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.chat import (
    FinishReason,
    Message,
    Options,
    Request,
    Response,
    ResponseAccumulator,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    assistant_message,
    reasoning_part,
    system_message,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.codec import from_json, to_json
from scope.errors import BadRequestError, InvalidResponseError
from scope.models._anthropic_wire import API, PROVIDER, EventMapper, build_body, parse_message
from scope.models._prefix import PREFIX_KEY, PrefixChain
from scope.models._provenance import DROPPED_KEY, MODEL_KEY, Replay, stamp
from scope.models.anthropic import AnthropicModel
from tests.anthropic_server import (
    BINDING_BETA,
    BOUND_ELSEWHERE,
    AnthropicServer,
    PreservedThinkingServer,
    check_message,
    check_request_body,
)
from tests.helpers import TIME, WEATHER, answer

MODEL = "claude-sonnet-4-5"
SIG = base64.b64encode(b"\x02a signature\xfe").decode()
SIG2 = base64.b64encode(b"another one").decode()
MODES = ["call", "stream"]


def build(request: Request, **settings: Any) -> tuple[Any, Replay]:
    """The JSON body the adapter sends for ``request`` (checked with the SDK's types),
    and the replay that decided it."""
    replay = Replay(API, PROVIDER)
    built = build_body(
        request, default_options=Options(), model=MODEL, stream=False, replay=replay, **settings
    )
    body = orjson.loads(orjson.dumps(built))
    check_request_body(body)
    return body, replay


def answered(request: Request, message: Message) -> Message:
    """``message`` stamped as the adapter's answer to ``request``: provenance and the
    digest of what the request sent (``scope/prefix``)."""
    _, replay = build(request)
    return stamp(message, API, PROVIDER, MODEL, prefix=replay.prefix)


def thinking(text: str = "Hmm.", signature: str = SIG) -> Any:
    return reasoning_part(text, base64.b64decode(signature))


def first_turn(system: str = "Be brief.", tools: list[ToolDefinition] | None = None) -> list[Any]:
    """A system prompt, a question and the adapter's stamped answer (with thinking)."""
    tools = tools if tools is not None else [WEATHER]
    opening = [system_message(system), user_message("Hi")]
    reply = answered(Request(opening, tools=tools), assistant_message(thinking(), "Hello."))
    return [*opening, reply]


# ------------------------------------------------------------------------ the chain


def test_the_chain_is_sha256_over_the_head_and_each_message() -> None:
    chain = PrefixChain(b'[{"type":"text","text":"s"}]', b"null")
    head = hashlib.sha256(b"scope/prefix v1\x00")
    head.update((28).to_bytes(8, "big") + b'[{"type":"text","text":"s"}]null')
    assert chain.digest() == "sha256:" + head.hexdigest()
    saved = chain.copy()
    chain.add(b'{"role":"user"}')
    head.update(b'{"role":"user"}')
    assert chain.digest() == "sha256:" + head.hexdigest()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", chain.digest())
    assert saved.digest() != chain.digest()  # a copy goes its own way
    saved.add(b'{"role":"user"}')
    assert saved.digest() == chain.digest()


#: Messages as the chain gets them: self-delimiting JSON objects (the chain relies on
#: that: raw bytes ``[b"a", b"b"]`` and ``[b"ab"]``, or ``[]`` and ``[b""]``, are the
#: same stream).
_WIRE_MESSAGE = st.binary(max_size=8).map(lambda b: orjson.dumps({"content": b.hex()}))


@given(
    st.binary(max_size=12),
    st.binary(max_size=12),
    st.lists(_WIRE_MESSAGE, max_size=4),
    st.binary(max_size=12),
    st.binary(max_size=12),
    st.lists(_WIRE_MESSAGE, max_size=4),
)
def test_different_requests_have_different_digests(
    s1: bytes, t1: bytes, m1: list[bytes], s2: bytes, t2: bytes, m2: list[bytes]
) -> None:
    def digest(system: bytes, tools: bytes, messages: list[bytes]) -> str:
        chain = PrefixChain(system, tools)
        for message in messages:
            chain.add(message)
        return chain.digest()

    same = (s1, t1, m1) == (s2, t2, m2)
    assert (digest(s1, t1, m1) == digest(s2, t2, m2)) is same


def test_the_answer_is_stamped_with_the_digest_of_the_whole_request() -> None:
    request = Request([system_message("Be brief."), user_message("Hi")], tools=[WEATHER])
    body, replay = build(request)
    raw = orjson.dumps
    chain = PrefixChain(raw(body["system"]), raw(body["tools"]))
    for message in body["messages"]:
        chain.add(raw(message))
    assert replay.prefix == chain.digest()
    # Another request (one word more) is another prefix.
    _, other = build(Request([system_message("Be brief!"), user_message("Hi")], tools=[WEATHER]))
    assert other.prefix != replay.prefix


# ---------------------------------------------------------------- prefix-aware replay


def test_own_thinking_goes_back_under_the_prefix_it_was_produced_under() -> None:
    history = first_turn()
    body, replay = build(Request([*history, user_message("And?")], tools=[WEATHER]))
    assert body["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "Hmm.",
        "signature": SIG,
    }
    assert replay.left_out == []


CHANGES: list[tuple[str, Any, list[ToolDefinition]]] = [
    ("system prompt rebuilt", "Be brief. Today is Monday.", [WEATHER]),
    ("system prompt removed", None, [WEATHER]),
    ("tool added", "Be brief.", [WEATHER, TIME]),
    ("tools removed", "Be brief.", []),
]


@pytest.mark.parametrize(("change", "system", "tools"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_system_or_tools_leaves_the_thinking_out(
    change: str, system: str | None, tools: list[ToolDefinition]
) -> None:
    history = first_turn()[1:]
    opening = [system_message(system)] if system is not None else []
    body, replay = build(Request([*opening, *history, user_message("And?")], tools=tools))
    assert body["messages"][1]["content"] == [{"type": "text", "text": "Hello."}]
    index = len(opening) + 1
    assert replay.left_out == [
        f"messages[{index}].parts[0] (reasoning produced under another prefix)"
    ]


def test_reordered_tools_and_an_edited_earlier_message_are_other_prefixes() -> None:
    tools = [WEATHER, TIME]
    history = first_turn(tools=tools)
    _, replay = build(Request([*history, user_message("And?")], tools=[TIME, WEATHER]))
    assert len(replay.left_out) == 1
    edited = [history[0], user_message("Hi!"), history[2], user_message("And?")]
    _, replay = build(Request(edited, tools=tools))
    assert replay.left_out == ["messages[2].parts[0] (reasoning produced under another prefix)"]


def test_a_window_that_drops_the_oldest_turn_invalidates_every_older_answer() -> None:
    # Two stamped turns; the window then starts at the second one: the second answer's
    # prefix lost the first turn, so its thinking stays here.
    turn1 = first_turn()
    second = [user_message("More")]
    reply2 = answered(
        Request([*turn1, *second], tools=[WEATHER]),
        assistant_message(thinking(signature=SIG2), "More."),
    )
    full, replay = build(Request([*turn1, *second, reply2, user_message("Next")], tools=[WEATHER]))
    assert replay.left_out == [] and full["messages"][3]["content"][0]["signature"] == SIG2
    window = [turn1[0], *second, reply2, user_message("Next")]
    body, replay = build(Request(window, tools=[WEATHER]))
    assert replay.left_out == ["messages[2].parts[0] (reasoning produced under another prefix)"]
    assert body["messages"][1]["content"] == [{"type": "text", "text": "More."}]


def test_a_drop_changes_the_prefix_after_it_and_state_made_after_the_change_goes_back() -> None:
    # The first answer was made under another system prompt: its thinking stays here.
    # The second was made with the first one's thinking in its prefix (sent then as a
    # v0.3 message would be), so it falls too; the third was made after the change,
    # under the prefix as it is sent now, and goes back.
    old = first_turn(system="Old prompt.")
    history = [system_message("New prompt."), *old[1:]]
    as_sent_then = [*history[:2], _unstamped(history[2]), user_message("Two")]
    reply2 = answered(
        Request(as_sent_then, tools=[WEATHER]), assistant_message(thinking(signature=SIG2), "Two.")
    )
    third_request = [*history, user_message("Two"), reply2, user_message("Three")]
    body_now, replay_now = build(Request(third_request, tools=[WEATHER]))
    assert len(replay_now.left_out) == 2
    reply3 = answered(
        Request(third_request, tools=[WEATHER]),
        assistant_message(thinking(signature=base64.b64encode(b"3").decode()), "Three."),
    )
    body, replay = build(Request([*third_request, reply3, user_message("Four")], tools=[WEATHER]))
    assert replay.left_out == [
        "messages[2].parts[0] (reasoning produced under another prefix)",
        "messages[4].parts[0] (reasoning produced under another prefix)",
    ]
    assert [block["type"] for block in body["messages"][5]["content"]] == ["thinking", "text"]
    assert body["messages"][:5] == body_now["messages"]


def test_messages_without_a_stamp_keep_the_v03_rule() -> None:
    # Stored before v0.4 (no scope/prefix): own thinking goes back, whatever the prefix;
    # drop_mismatched_thinking is what lets the API drop the blocks it then refuses.
    v03 = stamp(assistant_message(thinking(), "Hello."), API, PROVIDER, MODEL)
    body, replay = build(
        Request([system_message("Changed."), user_message("Hi"), v03, user_message("?")])
    )
    assert body["messages"][1]["content"][0]["type"] == "thinking"
    assert replay.left_out == []


def test_a_message_without_state_is_sent_as_it_is() -> None:
    reply = answered(Request([user_message("Hi")]), assistant_message("Hello."))
    body, replay = build(
        Request([system_message("New"), user_message("Hi"), reply, user_message("?")])
    )
    assert body["messages"][1]["content"] == [{"type": "text", "text": "Hello."}]
    assert replay.left_out == []


def test_a_tool_loop_replays_its_own_steps() -> None:
    # The current turn's tool loop: each step's thinking was made under the prefix the
    # next step sends (tool results merged into one user turn).
    opening = [system_message("S"), user_message("Weather?")]
    step1 = answered(
        Request(opening, tools=[WEATHER]),
        assistant_message(thinking(), tool_call_part("t1", "get_weather", '{"city":"Paris"}')),
    )
    results = tool_message(ToolResult("t1", "get_weather", ToolOutput.of_text("18C")))
    body, replay = build(Request([*opening, step1, results], tools=[WEATHER]))
    assert body["messages"][1]["content"][0]["type"] == "thinking"
    assert replay.left_out == []


def test_a_user_turn_that_grows_after_a_left_out_message_is_encoded_once_complete() -> None:
    # tool results, an assistant message left out whole (only thinking made under
    # another prefix: checking it encoded the tool results' turn), then the user's
    # words: one user turn, encoded again; the answer after it is stamped over it.
    call = stamp(assistant_message(tool_call_part("t1", "get_weather", "{}")), API, PROVIDER, MODEL)
    result = tool_message(ToolResult("t1", "get_weather", ToolOutput.of_text("18C")))
    stale = stamp(assistant_message(thinking()), API, PROVIDER, MODEL, prefix="sha256:" + "0" * 64)
    messages = [user_message("Hi"), call, result, stale, user_message("Thanks")]
    body, replay = build(Request(messages, tools=[WEATHER]))
    assert replay.left_out == ["messages[3].parts[0] (reasoning produced under another prefix)"]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "text"]
    chain = PrefixChain(b"null", orjson.dumps(body["tools"]))
    for message in body["messages"]:
        chain.add(orjson.dumps(message))
    assert replay.prefix == chain.digest()


# ----------------------------------------------------------------- empty-text thinking


OMITTED = {"type": "thinking", "thinking": "", "signature": SIG}


def test_empty_text_thinking_is_kept_stored_and_sent_back() -> None:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-fable-5-1-20260801",
        "content": [OMITTED, {"type": "text", "text": "Done."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    check_message(body)
    response = parse_message(orjson.dumps(body))
    assert response.output is not None and response.output.message is not None
    part = response.output.message.parts[0]
    assert (part.kind, part.text, part.signature) == ("reasoning", "", base64.b64decode(SIG))
    events = [
        ("message_start", {"type": "message_start", "message": {**body, "content": []}}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": SIG},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]
    mapper = EventMapper()
    accumulator = ResponseAccumulator()
    for event, data in events:
        chunk = mapper.map(event, orjson.dumps(data))
        if chunk is not None:
            accumulator.add(chunk)
    streamed = accumulator.response()
    assert streamed is not None and streamed.output is not None and streamed.output.message
    assert streamed.output.message.parts[0] == part
    message = stamp(response.output.message, API, PROVIDER, MODEL)
    stored = from_json(to_json(message), Message)  # through the codec, as a store keeps it
    assert stored == message
    sent, replay = build(Request([user_message("Go"), stored, user_message("Again")]))
    assert sent["messages"][1]["content"][0] == OMITTED
    assert replay.left_out == []


# ------------------------------------------------------------------ prompt caching


def test_prompt_cache_puts_breakpoints_on_tools_system_and_the_last_message() -> None:
    history = first_turn(tools=[WEATHER, TIME])
    request = Request([*history, user_message("And?")], tools=[WEATHER, TIME])
    body, replay = build(request, prompt_cache=True)
    ephemeral = {"type": "ephemeral"}
    assert [tool.get("cache_control") for tool in body["tools"]] == [None, ephemeral]
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}]
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "And?", "cache_control": ephemeral}
    ]
    marks = orjson.dumps(body).count(b'"cache_control"')
    assert marks == 3  # at most 4 in all
    # The breakpoints are not part of the prefix: the same digest, the same replay.
    plain, plain_replay = build(request)
    assert plain_replay.prefix == replay.prefix
    assert body["messages"][1] == plain["messages"][1]
    assert orjson.dumps(plain).count(b"cache_control") == 0


def test_prompt_cache_skips_blocks_that_cannot_carry_a_breakpoint() -> None:
    # A last assistant message (a prefill) ending in thinking: the breakpoint goes on
    # the block before it.
    prefill = stamp(assistant_message("So", thinking()), API, PROVIDER, MODEL)
    body, _ = build(Request([user_message("Hi"), prefill]), prompt_cache=True)
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "So", "cache_control": {"type": "ephemeral"}},
        {"type": "thinking", "thinking": "Hmm.", "signature": SIG},
    ]


# ----------------------------------------------------------- drop_mismatched_thinking


BINDING = {"prefix_mismatch_behavior": "drop_block"}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            Options(reasoning_effort="low"),
            {"type": "enabled", "budget_tokens": 4096, "block_binding": BINDING},
        ),
        (Options(), {"type": "adaptive", "block_binding": BINDING}),
        (Options(reasoning_effort="none"), {"type": "disabled"}),
        (
            Options(extensions={"anthropic/thinking": {"type": "adaptive", "display": "omitted"}}),
            {"type": "adaptive", "display": "omitted", "block_binding": BINDING},
        ),
        (
            Options(
                extensions={
                    "anthropic/thinking": {
                        "type": "adaptive",
                        "block_binding": {"prefix_mismatch_behavior": "error"},
                    }
                }
            ),
            {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}},
        ),
    ],
    ids=["effort", "absent", "disabled", "extension", "extension's own binding"],
)
def test_drop_mismatched_thinking_binds_the_thinking_config(
    options: Options, expected: dict[str, Any]
) -> None:
    body, _ = build(Request([user_message("Hi")], options=options), drop_mismatched_thinking=True)
    assert body["thinking"] == expected
    plain, _ = build(Request([user_message("Hi")], options=options))
    assert plain.get("thinking", {}).get("block_binding") != BINDING


def test_constructor_switches_are_checked() -> None:
    with pytest.raises(TypeError, match="AnthropicModel drop_mismatched_thinking must be a bool"):
        AnthropicModel("m", api_key="", drop_mismatched_thinking=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AnthropicModel prompt_cache must be a bool"):
        AnthropicModel("m", api_key="", prompt_cache="yes")  # type: ignore[arg-type]
    model = AnthropicModel("m", api_key="", drop_mismatched_thinking=True, prompt_cache=True)
    assert model.drop_mismatched_thinking and model.prompt_cache
    assert not AnthropicModel("m", api_key="").drop_mismatched_thinking


@pytest.mark.anyio
async def test_the_beta_header_joins_the_callers_betas() -> None:
    with AnthropicServer() as server:
        server.serve_repeatedly(_text_exchange())
        for headers, expected in [
            (None, BINDING_BETA),
            ({"Anthropic-Beta": "context-1m-2025-08-07"}, f"context-1m-2025-08-07,{BINDING_BETA}"),
            ({"anthropic-beta": BINDING_BETA}, BINDING_BETA),
        ]:
            async with AnthropicModel(
                MODEL,
                api_key="k",
                base_url=server.base_url,
                headers=headers,
                drop_mismatched_thinking=True,
            ) as model:
                await model.call(Request([user_message("Hi")]))
            assert server.requests[-1].headers["anthropic-beta"] == expected
        async with AnthropicModel(MODEL, api_key="k", base_url=server.base_url) as model:
            await model.call(Request([user_message("Hi")]))
        assert "anthropic-beta" not in server.requests[-1].headers


def _text_exchange(**extra: Any) -> dict[str, Any]:
    return {
        "status": 200,
        "json": {
            "id": "msg_t",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "Hi."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 2},
            **extra,
        },
    }


# ------------------------------------------------------------ input_transformations


TRANSFORMATIONS = [
    {
        "type": "thinking_dropped",
        "path": "messages.1.content.0",
        "reason": "prefix_binding_mismatch",
    },
    {
        "type": "thinking_mismatch_allowed",
        "path": "messages.3.content.0",
        "reason": "prefix_binding_mismatch",
    },
    {
        "type": "thinking_dropped",
        "path": "messages.3.content.1",
        "reason": "model_binding_mismatch",
    },
    {"type": "something_new", "path": "messages.5.content.0"},
]


def test_input_transformations_count_the_dropped_blocks(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="scope.models"):
        response = parse_message(
            orjson.dumps(_text_exchange(input_transformations=TRANSFORMATIONS)["json"])
        )
    assert response.metadata is not None
    assert response.metadata.extra.decode(DROPPED_KEY) == 2
    (record,) = [r for r in caplog.records if "the API dropped" in r.getMessage()]
    assert record.getMessage() == (
        "AnthropicModel: the API dropped 2 block(s) of the request: messages.1.content.0 "
        "(prefix_binding_mismatch); messages.3.content.1 (model_binding_mismatch)"
    )
    empty = parse_message(orjson.dumps(_text_exchange(input_transformations=[])["json"]))
    assert empty.metadata is not None and DROPPED_KEY not in empty.metadata.extra


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"type": "thinking_dropped"},
            "response.input_transformations must be an array, got an object",
        ),
        (["x"], r"response.input_transformations\[0\] must be an object"),
        (
            [{"type": "thinking_dropped", "path": 3}],
            r"input_transformations\[0\].path must be a string",
        ),
    ],
)
def test_malformed_input_transformations_are_refused(value: Any, message: str) -> None:
    with pytest.raises(InvalidResponseError, match=message):
        parse_message(orjson.dumps(_text_exchange(input_transformations=value)["json"]))


def test_a_stream_counts_them_and_a_later_list_replaces_the_first() -> None:
    start = {
        "type": "message_start",
        "message": {
            **_text_exchange()["json"],
            "content": [],
            "input_transformations": TRANSFORMATIONS,
        },
    }
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 2},
        "input_transformations": TRANSFORMATIONS[:1],
    }
    mapper = EventMapper()
    first = mapper.map("message_start", orjson.dumps(start))
    assert first is not None and first.metadata is not None
    assert first.metadata.extra.decode(DROPPED_KEY) == 2
    last = mapper.map("message_delta", orjson.dumps(delta))
    assert last is not None and last.metadata is not None
    assert last.metadata.extra.decode(DROPPED_KEY) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_the_adapter_adds_its_own_count_to_the_apis(mode: str) -> None:
    # One part left out here (another model's thinking), two dropped by the API.
    foreign = stamp(assistant_message(thinking(), "Hello."), API, PROVIDER, "claude-opus-4-1")
    request = Request([user_message("Hi"), foreign, user_message("Again")])
    message = _text_exchange(input_transformations=TRANSFORMATIONS)["json"]
    with AnthropicServer() as server:
        if mode == "call":
            server.script(_text_exchange(input_transformations=TRANSFORMATIONS))
        else:
            server.script({"status": 200, "sse": _stream_of(message)})
        async with AnthropicModel(MODEL, api_key="k", base_url=server.base_url) as model:
            response = await answer(model, request, mode)
    assert response.metadata is not None
    assert response.metadata.extra.decode(DROPPED_KEY) == 3


def _stream_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    from tests.anthropic_server import _events

    return _events(message)


# ------------------------------------------------------- against the enforcing server


@pytest.fixture
def enforcing() -> Iterator[PreservedThinkingServer]:
    with PreservedThinkingServer() as server:
        yield server
        server.check_requests()


async def _turns(
    model: AnthropicModel, mode: str, history: list[Message], system: str, text: str
) -> tuple[Response, list[Message]]:
    """One turn (a tool loop when the server asks for one): the final response and the
    history with the turn appended."""
    messages = [*history, user_message(text)]
    while True:
        request = Request(
            [system_message(system), *messages],
            tools=[WEATHER],
            options=Options(reasoning_effort="low"),
        )
        response = await answer(model, request, mode)
        assert response.output is not None and response.output.message is not None
        messages.append(response.output.message)
        if response.output.finish_reason is not FinishReason.TOOL_CALLS:
            return response, messages
        calls = response.output.message.tool_calls
        messages.append(
            tool_message(*[ToolResult(c.id, c.name, ToolOutput.of_text("18C")) for c in calls])
        )


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_answers_are_stamped_and_a_changed_prompt_is_never_a_400(
    enforcing: PreservedThinkingServer, mode: str
) -> None:
    async with AnthropicModel(MODEL, api_key="k", base_url=enforcing.base_url) as model:
        _, history = await _turns(model, mode, [], "Be brief.", "Hi (tools: 1)")
        assert all(PREFIX_KEY in m.metadata for m in history if m.role == "assistant")
        # The same prompt: both thinking blocks go back.
        _, history = await _turns(model, mode, history, "Be brief.", "More")
        assert enforcing.served[-1].state_sent == 2
        # Another prompt: every block made under the old one stays here, counted.
        third, history = await _turns(model, mode, history, "Be terse.", "Again")
    assert enforcing.served[-1].state_sent == 0
    assert third.metadata is not None and third.metadata.extra.decode(DROPPED_KEY) == 3
    assert [s.status for s in enforcing.served] == [200] * 4


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_an_unstamped_history_is_refused_unless_the_api_may_drop_blocks(
    enforcing: PreservedThinkingServer, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A history stored without scope/prefix (v0.3) keeps the v0.3 rule: its thinking goes
    # back, and under a changed prompt the API refuses it ...
    async with AnthropicModel(MODEL, api_key="k", base_url=enforcing.base_url) as model:
        _, history = await _turns(model, mode, [], "Be brief.", "Hi")
    v03 = [_unstamped(m) for m in history]
    async with AnthropicModel(
        MODEL, api_key="k", base_url=enforcing.base_url, max_retries=0
    ) as model:
        with pytest.raises(
            BadRequestError, match="messages.1.content.0: " + re.escape(BOUND_ELSEWHERE)
        ):
            await _turns(model, mode, v03, "Be terse.", "Again")
    # ... unless drop_mismatched_thinking lets it drop them: then they are counted.
    async with AnthropicModel(
        MODEL, api_key="k", base_url=enforcing.base_url, drop_mismatched_thinking=True
    ) as model:
        with caplog.at_level(logging.DEBUG, logger="scope.models"):
            response, _ = await _turns(model, mode, v03, "Be terse.", "Again")
    assert response.metadata is not None and response.metadata.extra.decode(DROPPED_KEY) == 1
    assert enforcing.served[-1].dropped == ("messages.1.content.0",)
    assert any(
        "the API dropped 1 block(s) of the request: messages.1.content.0 (prefix_binding_mismatch)"
        in r.getMessage()
        for r in caplog.records
    )


def _unstamped(message: Message) -> Message:
    if message.role != "assistant":
        return message
    kept = {k: v for k, v in message.metadata.items() if k != PREFIX_KEY}
    assert MODEL_KEY in kept
    return Message(message.role, message.parts, metadata=kept)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_prompt_cache_reads_what_the_last_turn_wrote(
    enforcing: PreservedThinkingServer, mode: str
) -> None:
    async with AnthropicModel(
        MODEL, api_key="k", base_url=enforcing.base_url, prompt_cache=True
    ) as model:
        _, history = await _turns(model, mode, [], "Be brief.", "Hi")
        second, _ = await _turns(model, mode, history, "Be brief.", "More")
    served = enforcing.served
    assert served[0].cache_read == 0 and served[0].cache_write > 0
    assert served[1].cache_read > 0
    usage = second.usage
    assert usage.cache_read_input_tokens == served[1].cache_read
    assert usage.cache_write_input_tokens == served[1].cache_write
    # scope's input count holds both cache counts (DESIGN §7b).
    assert usage.input_tokens == served[1].uncached + served[1].cache_read + served[1].cache_write


# ------------------------------------------------------------ the server's own rules


def _post(server: PreservedThinkingServer, body: dict[str, Any], beta: str = "") -> Any:
    import httpx

    headers = {"anthropic-beta": beta} if beta else {}
    response = httpx.post(server.base_url + "/v1/messages", json=body, headers=headers)
    return response.status_code, response.json()


THINK = {"type": "enabled", "budget_tokens": 1024}


def test_the_server_binds_each_block_to_its_prefix_and_its_place(
    enforcing: PreservedThinkingServer,
) -> None:
    question = {"role": "user", "content": [{"type": "text", "text": "Hi (redacted)"}]}
    base = {"model": "claude-sonnet-4-0", "max_tokens": 2048, "thinking": THINK}
    status, first = _post(enforcing, {**base, "system": "S", "messages": [question]})
    assert status == 200 and first["model"] == "claude-sonnet-4-20250514"  # an alias
    think, redacted, text = first["content"]
    assert (think["type"], redacted["type"], text["type"]) == (
        "thinking",
        "redacted_thinking",
        "text",
    )
    again = {"role": "user", "content": [{"type": "text", "text": "Again"}]}

    def replay(content: list[Any], system: str = "S", beta: str = "", **extra: Any) -> Any:
        answer = {"role": "assistant", "content": content}
        body = {**base, "system": system, "messages": [question, answer, again], **extra}
        return _post(enforcing, body, beta)

    assert replay([think, redacted, text])[0] == 200  # as it came: valid
    assert replay([text])[0] == 200  # all thinking left out: nothing to check
    assert replay([think, text])[0] == 200  # the last one left out: the rest still match
    # Left out between others, or moved: the block after the gap fails.
    status, error = replay([redacted, text])
    assert status == 400
    assert error["error"]["message"] == f"messages.1.content.0: {BOUND_ELSEWHERE}"
    assert replay([redacted, think, text])[0] == 400
    # Another system prompt: the first block fails, and with it the rest of the turn.
    status, error = replay([think, redacted, text], system="T")
    assert (status, error["error"]["type"]) == (400, "invalid_request_error")
    binding = {**THINK, "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    status, error = replay([think, redacted, text], system="T", thinking=binding)
    assert status == 400 and BINDING_BETA in error["error"]["message"]  # the header is missing
    status, body = replay([think, redacted, text], system="T", thinking=binding, beta=BINDING_BETA)
    assert status == 200
    assert body["input_transformations"] == [
        {
            "type": "thinking_dropped",
            "path": "messages.1.content.0",
            "reason": "prefix_binding_mismatch",
        },
        {
            "type": "thinking_dropped",
            "path": "messages.1.content.1",
            "reason": "prefix_binding_mismatch",
        },
    ]
    # A signature it never issued.
    forged = {**think, "signature": SIG}
    status, error = replay([forged, text])
    assert (status, error["error"]["message"]) == (
        400,
        "messages.1.content.0: Invalid `signature` in `thinking` block.",
    )
    # cache_control markers are not part of the prefix.
    marked = {
        **question,
        "content": [{**question["content"][0], "cache_control": {"type": "ephemeral"}}],
    }
    answer = {"role": "assistant", "content": [think, redacted, text]}
    status, _ = _post(enforcing, {**base, "system": "S", "messages": [marked, answer, again]})
    assert status == 200
    assert [s.status for s in enforcing.served].count(400) == 5


def test_the_server_wants_the_final_tool_use_turn_to_start_with_thinking(
    enforcing: PreservedThinkingServer,
) -> None:
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    question = {"role": "user", "content": [{"type": "text", "text": "Weather? (tools: 1)"}]}
    base = {"model": MODEL, "max_tokens": 2048, "thinking": THINK, "tools": tools}
    status, first = _post(enforcing, {**base, "messages": [question]})
    assert status == 200 and first["stop_reason"] == "tool_use"
    think, call = first["content"]
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18C"}],
    }

    def follow_up(content: list[Any], **extra: Any) -> Any:
        answer = {"role": "assistant", "content": content}
        return _post(enforcing, {**base, "messages": [question, answer, result], **extra})

    status, error = follow_up([call])
    assert status == 400 and error["error"]["message"].startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`tool_use`. When `thinking` is enabled, a final `assistant` message must start "
        "with a thinking block"
    )
    assert follow_up([call], thinking={"type": "disabled"})[0] == 200
    status, final = follow_up([think, call])
    assert status == 200 and final["stop_reason"] == "end_turn"


@pytest.mark.anyio
async def test_a_later_list_in_a_stream_still_gets_the_adapters_count() -> None:
    # message_start reports two blocks dropped, message_delta (after a mid-stream
    # fallback) one: the stream ends with that one plus the adapter's own.
    foreign = stamp(assistant_message(thinking(), "Hello."), API, PROVIDER, "claude-opus-4-1")
    request = Request([user_message("Hi"), foreign, user_message("Again")])
    events = _stream_of(_text_exchange(input_transformations=TRANSFORMATIONS)["json"])
    delta = next(e for e in events if e["type"] == "message_delta")
    delta["input_transformations"] = TRANSFORMATIONS[:1]
    with AnthropicServer() as server:
        server.script({"status": 200, "sse": events})
        async with AnthropicModel(MODEL, api_key="k", base_url=server.base_url) as model:
            chunks = [chunk async for chunk in model.stream(request)]
    counts = [
        c.metadata.extra.decode(DROPPED_KEY)
        for c in chunks
        if c.metadata is not None and DROPPED_KEY in c.metadata.extra
    ]
    assert counts == [3, 2]
    merged = ResponseAccumulator()
    for chunk in chunks:
        merged.add(chunk)
    response = merged.response()
    assert response is not None and response.metadata is not None
    assert response.metadata.extra.decode(DROPPED_KEY) == 2
