"""Provenance and ownership (DESIGN §6c): every adapter stamps the messages it produces,
sends provider state back only from its own (same API, provider and model), and counts
what it left out on the response and in a DEBUG record."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scope.chat import (
    Message,
    Request,
    Role,
    ToolOutput,
    ToolResult,
    assistant_message,
    reasoning_part,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.metadata import Metadata
from scope.models._gemini_wire import API as GEMINI_API
from scope.models._gemini_wire import PLACEHOLDER_SIGNATURE
from scope.models._gemini_wire import PROVIDER as GEMINI_PROVIDER
from scope.models._openai_wire import EXTRA_CONTENT_KEY, REASONING_DETAILS_KEY
from scope.models._provenance import (
    ACCOUNT_KEY,
    API_KEY,
    ASKED_KEY,
    DROPPED_KEY,
    MODEL_KEY,
    PROVIDER_KEY,
    Replay,
    same_model,
    snapshot_of,
    stamp,
)
from tests.helpers import ANTHROPIC, GEMINI, OPENAI, PROVIDERS, Provider, accumulate, body_of
from tests.openai_server import OpenAIServer

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("stamped", "asked", "same"),
    [
        ("gpt-4o-mini", "gpt-4o-mini", True),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", True),
        ("gpt-4o-mini", "gpt-4o-mini-2024-07-18", True),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5", True),
        ("gpt-4o-mini-2024-07-18", "gpt-4o", False),
        ("gpt-4o", "gpt-4o-mini", False),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4", False),
        ("claude-sonnet-4-5-2025092", "claude-sonnet-4-5", False),
        ("x-20250929", "", False),
        ("", "", True),
    ],
)
def test_same_model_allows_dated_snapshots_only(stamped: str, asked: str, same: bool) -> None:
    assert same_model(stamped, asked) is same


@pytest.mark.parametrize(
    ("model", "asked", "snapshot"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4-5", True),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5", True),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", True),
        # Anthropic's alias forms: the rest of the name plus a date.
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0", True),
        ("claude-opus-4-20250514", "claude-opus-4-0", True),
        ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet-latest", True),
        ("claude-3-7-sonnet-latest-20250219", "claude-3-7-sonnet-latest", True),
        # One direction only: the alias is no snapshot of its snapshot.
        ("claude-sonnet-4-0", "claude-sonnet-4-20250514", False),
        ("gpt-4o-mini", "gpt-4o-mini-2024-07-18", False),
        # Another model, or no date.
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-0", False),
        ("claude-sonnet-4", "claude-sonnet-4-0", False),
        ("claude-sonnet-4-2025051", "claude-sonnet-4-0", False),
        ("claude-sonnet-4-20250514x", "claude-sonnet-4-0", False),
        ("claude-3-7-sonnet-2025-02-1", "claude-3-7-sonnet-latest", False),
        ("claude-3-5-haiku-20241022", "claude-3-7-sonnet-latest", False),
        ("gpt-4o-mini-2024-07-18", "gpt-4o", False),
        # Edge names: an alias form with nothing before it, empty names.
        ("-20250514", "-0", False),
        ("-20250514", "-latest", False),
        ("-20250514", "", False),
        ("", "", True),
        ("x", "", False),
        ("", "x-0", False),
        ("x-0-20250101", "x-0", True),
        ("x-20250101", "x-0", True),
        ("x-20250101", "x0", False),
        ("x-20250101", "x-00", False),
    ],
)
def test_snapshot_of_knows_dates_and_anthropics_alias_forms(
    model: str, asked: str, snapshot: bool
) -> None:
    assert snapshot_of(model, asked) is snapshot


@pytest.mark.parametrize(
    ("stamped", "asked"),
    [
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0"),
        ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet-latest"),
    ],
)
def test_the_v03_rule_takes_the_alias_forms_both_ways(stamped: str, asked: str) -> None:
    assert same_model(stamped, asked) and same_model(asked, stamped)


ANTHROPIC_API = "anthropic.messages"


def _answer(**stamps: Any) -> Message:
    """An Anthropic answer stamped with ``stamps`` (``model``, ``asked``, ``account``,
    ``api``, ``provider``; a value of ``None`` leaves that key out)."""
    keys = {
        "api": API_KEY,
        "provider": PROVIDER_KEY,
        "model": MODEL_KEY,
        "asked": ASKED_KEY,
        "account": ACCOUNT_KEY,
    }
    values = {"api": ANTHROPIC_API, "provider": "anthropic", **stamps}
    metadata = {keys[name]: value for name, value in values.items() if value is not None}
    return Message(Role.ASSISTANT, [text_part("x")], metadata)


@pytest.mark.parametrize(
    ("stamps", "now", "owned"),
    [
        # scope/asked is the model asked now: own, whatever answered.
        (
            {"asked": "claude-sonnet-4-0", "model": "claude-sonnet-4-20250514"},
            "claude-sonnet-4-0",
            True,
        ),
        ({"asked": "my-alias", "model": "any-other-name"}, "my-alias", True),
        ({"asked": "my-alias"}, "my-alias", True),  # no scope/model: the asked stamp decides
        # Another model asked now: own when what answered is it or a snapshot of it.
        (
            {"asked": "claude-sonnet-4-0", "model": "claude-sonnet-4-20250514"},
            "claude-sonnet-4-20250514",
            True,
        ),
        ({"asked": "my-alias", "model": "claude-sonnet-4-20250514"}, "claude-sonnet-4-0", True),
        ({"asked": "my-alias", "model": "claude-sonnet-4-5-20250929"}, "claude-sonnet-4-5", True),
        ({"asked": "my-alias", "model": "claude-sonnet-4-5-20250929"}, "claude-opus-4-1", False),
        (
            {"asked": "claude-sonnet-4-0", "model": "claude-sonnet-4-20250514"},
            "claude-sonnet-4-5",
            False,
        ),
        ({"asked": "claude-sonnet-4-0"}, "claude-sonnet-4-5", False),
        # With scope/asked the snapshot rule has one direction: an answer named by the
        # alias is not owned by a request for a dated name.
        ({"asked": "x", "model": "claude-sonnet-4-0"}, "claude-sonnet-4-20250514", False),
        # A stamp that is not a string was not written by an adapter.
        ({"asked": 7, "model": "claude-sonnet-4-5"}, "claude-sonnet-4-5", True),
        ({"asked": 7, "model": "other"}, "claude-sonnet-4-5", False),
        ({"asked": ["claude-sonnet-4-5"]}, "claude-sonnet-4-5", False),
        ({"model": 7}, "claude-sonnet-4-5", False),
        ({"asked": "", "model": ""}, "claude-sonnet-4-5", False),
        # Without scope/asked (v0.3): names equal, a snapshot either way, alias forms.
        ({"model": "claude-sonnet-4-5"}, "claude-sonnet-4-5", True),
        ({"model": "claude-sonnet-4-5-20250929"}, "claude-sonnet-4-5", True),
        ({"model": "claude-sonnet-4-5"}, "claude-sonnet-4-5-20250929", True),
        ({"model": "claude-sonnet-4-20250514"}, "claude-sonnet-4-0", True),
        ({"model": "claude-sonnet-4-0"}, "claude-sonnet-4-20250514", True),
        ({"model": "claude-3-7-sonnet-20250219"}, "claude-3-7-sonnet-latest", True),
        ({"model": "claude-sonnet-4-20250514"}, "claude-sonnet-4-5", False),
        ({"model": None}, "claude-sonnet-4-5", False),
        # The API and the provider come first.
        ({"asked": "m", "model": "m", "api": "openai.chat"}, "m", False),
        ({"asked": "m", "model": "m", "provider": "bedrock"}, "m", False),
        ({"asked": "m", "model": "m", "api": None}, "m", False),
        ({"asked": "m", "model": "m", "provider": None}, "m", False),
    ],
)
def test_the_ownership_rule(stamps: dict[str, Any], now: str, owned: bool) -> None:
    replay = Replay(ANTHROPIC_API, "anthropic", now)
    assert replay.owns(_answer(**stamps)) is owned


@pytest.mark.parametrize(
    ("adapter", "stamped", "owned"),
    [
        ("org-a", "org-a", True),
        ("org-a", "org-b", False),  # another organisation's signatures never go there
        ("org-a", None, True),  # stamped without an account (v0.3, or none was set)
        (None, "org-b", True),  # the adapter names no account: nothing to compare
        (None, None, True),
        ("org-a", 7, False),  # not a string: not the account
        ("org-a", "Org-A", False),  # compared exactly
    ],
)
def test_an_account_mismatch_needs_both_accounts(
    adapter: str | None, stamped: object, owned: bool
) -> None:
    replay = Replay(ANTHROPIC_API, "anthropic", "claude-sonnet-4-5", account=adapter)
    message = _answer(asked="claude-sonnet-4-5", model="claude-sonnet-4-5", account=stamped)
    assert replay.owns(message) is owned


def test_a_replay_stamps_what_it_owns() -> None:
    replay = Replay(ANTHROPIC_API, "anthropic", "claude-sonnet-4-0", account="org-a")
    answered = replay.stamp(assistant_message("x"), "claude-sonnet-4-20250514")
    assert answered.metadata == Metadata(
        {
            API_KEY: ANTHROPIC_API,
            PROVIDER_KEY: "anthropic",
            MODEL_KEY: "claude-sonnet-4-20250514",
            ASKED_KEY: "claude-sonnet-4-0",
            ACCOUNT_KEY: "org-a",
        }
    )
    assert replay.owns(answered)
    # No model in the response: the one asked for; no account: no stamp.
    plain = Replay(ANTHROPIC_API, "anthropic", "claude-sonnet-4-5").stamp(
        assistant_message("x"), ""
    )
    assert plain.metadata.decode(MODEL_KEY) == "claude-sonnet-4-5"
    assert ACCOUNT_KEY not in plain.metadata
    assert not Replay(ANTHROPIC_API, "anthropic", "claude-sonnet-4-5", account="o").owns(answered)


def test_stamp_keeps_the_other_metadata() -> None:
    message = Message(Role.ASSISTANT, [text_part("Hi")], {"k": 1})
    stamped = stamp(message, "openai.chat", "openai", "gpt-4o")
    assert stamped.metadata == Metadata(
        {"k": 1, API_KEY: "openai.chat", PROVIDER_KEY: "openai", MODEL_KEY: "gpt-4o"}
    )
    assert stamped.parts == message.parts


@pytest.mark.parametrize(
    ("api", "provider", "model", "owned"),
    [
        ("openai.chat", "openai", "gpt-4o", True),
        ("openai.chat", "openai", "gpt-4o-2024-08-06", True),
        ("openai.responses", "openai", "gpt-4o", False),  # same provider, other API
        ("openai.chat", "deepseek", "gpt-4o", False),
        ("openai.chat", "openai", "gpt-4o-mini", False),
    ],
)
def test_a_replay_owns_its_own_api_provider_and_model(
    api: str, provider: str, model: str, owned: bool
) -> None:
    replay = Replay("openai.chat", "openai", "gpt-4o")
    assert replay.owns(stamp(assistant_message("x"), api, provider, model)) is owned


def test_a_message_without_provenance_is_foreign() -> None:
    replay = Replay("openai.chat", "openai", "gpt-4o")
    assert not replay.owns(assistant_message("x"))
    half = Message(Role.ASSISTANT, [text_part("x")], {API_KEY: "openai.chat"})
    assert not replay.owns(half)


# ----------------------------------------------------------------- stamps by adapters


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_every_answer_is_stamped_with_its_provenance(provider: Provider, mode: str) -> None:
    name = provider.text if mode == "call" else "stream_text"
    with provider.serve() as server:
        server.script(*provider.load_transcript(name))
        model, _ = provider.recorded(server)
        async with model:
            if mode == "call":
                response = await model.call(Request([user_message("Hi")]))
            else:
                chunks, response = await accumulate(model.stream(Request([user_message("Hi")])))
                stamped = [
                    c for c in chunks if c.output is not None and c.output.message is not None
                ]
                # Once: the accumulator merges message metadata per key.
                assert PROVIDER_KEY in stamped[0].output.message.metadata  # type: ignore[union-attr]
                assert all(PROVIDER_KEY not in c.output.message.metadata for c in stamped[1:])  # type: ignore[union-attr]
    assert response.output is not None and response.output.message is not None
    metadata = response.output.message.metadata
    assert response.metadata is not None and response.metadata.model
    assert metadata.decode(MODEL_KEY) == response.metadata.model  # the model that answered
    assert metadata.decode(ASKED_KEY) == provider.model  # the model asked for (§6g)
    assert ACCOUNT_KEY not in metadata  # no provider_account given
    assert metadata.decode(PROVIDER_KEY) == provider.model_class._WIRE.provider
    assert metadata.decode(API_KEY) == provider.model_class._WIRE.api
    assert DROPPED_KEY not in response.metadata.extra  # nothing was left out


async def test_the_provider_name_given_is_the_stamp() -> None:
    with OPENAI.serve() as server:
        server.script(*OPENAI.load_transcript("plain_answer"))
        model, _ = OPENAI.recorded(server, provider_name="deepseek")
        async with model:
            response = await model.call(Request([user_message("Hi")]))
    assert response.output is not None and response.output.message is not None
    assert response.output.message.metadata.decode(PROVIDER_KEY) == "deepseek"


# ------------------------------------------------------------- ownership by adapters


def _loop(assistant: Message) -> Request:
    return Request(
        [
            user_message("Weather?"),
            assistant,
            tool_message(ToolResult("c1", "get_weather", ToolOutput.of_text("18C"))),
        ]
    )


def _openai_state() -> Message:
    return Message(
        Role.ASSISTANT,
        [
            reasoning_part("Let me look.", b"sig"),
            tool_call_part(
                "c1",
                "get_weather",
                "{}",
                metadata={EXTRA_CONTENT_KEY: {"google": {"thought_signature": "c2ln"}}},
            ),
        ],
        {REASONING_DETAILS_KEY: [{"type": "reasoning.text", "text": "Let me look."}]},
    )


@pytest.mark.parametrize(
    "foreign",
    [
        pytest.param(lambda m: m, id="unstamped"),
        pytest.param(lambda m: stamp(m, "openai.chat", "openrouter", OPENAI.model), id="provider"),
        pytest.param(lambda m: stamp(m, "openai.chat", "openai", "gpt-4.1"), id="model"),
        pytest.param(lambda m: stamp(m, "openai.responses", "openai", OPENAI.model), id="api"),
    ],
)
def test_openai_chat_sends_no_foreign_state(foreign: Any) -> None:
    replay = Replay("openai.chat", "openai")
    built = OPENAI.build_body(
        _loop(foreign(_openai_state())),
        default_options=Request([user_message("x")]).options,
        model=OPENAI.model,
        stream=False,
        replay=replay,
    )
    sent = built["messages"][1]
    assert set(sent) == {"role", "tool_calls"}
    assert "extra_content" not in sent["tool_calls"][0]
    assert replay.left_out == ["messages[1].parts[0] (reasoning of another model)"]


def test_openai_chat_sends_its_own_state_back() -> None:
    body = body_of(OPENAI, _loop(OPENAI.own(_openai_state())))
    sent = body["messages"][1]
    assert sent["reasoning_details"] == [{"type": "reasoning.text", "text": "Let me look."}]
    assert sent["tool_calls"][0]["extra_content"] == {"google": {"thought_signature": "c2ln"}}


def test_anthropic_sends_no_foreign_thinking() -> None:
    thinking = assistant_message(
        reasoning_part("Let me look.", b"sig"), tool_call_part("c1", "get_weather", "{}")
    )
    for message in (
        thinking,
        stamp(thinking, "anthropic.messages", "anthropic", "claude-opus-4-1"),
        stamp(thinking, "openai.chat", "deepseek", ANTHROPIC.model),
    ):
        body = body_of(ANTHROPIC, _loop(message))
        assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]
    own = body_of(ANTHROPIC, _loop(ANTHROPIC.own(thinking, "claude-sonnet-4-5-20250929")))
    assert [b["type"] for b in own["messages"][1]["content"]] == ["thinking", "tool_use"]


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_what_was_left_out_is_counted_and_logged(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An Anthropic request replaying an OpenAI-compatible turn with reasoning.
    foreign = stamp(
        assistant_message(
            reasoning_part("deepseek thoughts"), tool_call_part("c1", "get_weather", "{}")
        ),
        "openai.chat",
        "deepseek",
        "deepseek-reasoner",
    )
    with ANTHROPIC.serve() as server:
        server.script(*ANTHROPIC.load_transcript("text" if mode == "call" else "stream_text"))
        model, _ = ANTHROPIC.recorded(server)
        caplog.set_level(logging.DEBUG, logger="scope.models")
        async with model:
            if mode == "call":
                response = await model.call(_loop(foreign))
            else:
                chunks, response = await accumulate(model.stream(_loop(foreign)))
                assert chunks[0].metadata is not None
                assert chunks[0].metadata.extra.decode(DROPPED_KEY) == 1
                assert all(
                    c.metadata is None or DROPPED_KEY not in c.metadata.extra for c in chunks[1:]
                )
        sent = _sent(server)
    assert response.metadata is not None
    assert response.metadata.extra.decode(DROPPED_KEY) == 1
    assert [b["type"] for b in sent["messages"][1]["content"]] == ["tool_use"]
    (record,) = [r for r in caplog.records if r.name == "scope.models"]
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == (
        "AnthropicModel left out 1 part(s) of the request: "
        "messages[1].parts[0] (reasoning of another model)"
    )


def _sent(server: OpenAIServer) -> Any:
    (body,) = server.bodies()
    return body


def test_gemini_sends_signatures_of_its_own_only_and_a_placeholder_for_foreign_calls() -> None:
    signed = Message(
        Role.ASSISTANT,
        [
            reasoning_part("Let me look.", b"thought-sig"),
            tool_call_part(
                "c1", "get_weather", "{}", metadata={"gemini/thought_signature": "Y2FsbC1zaWc="}
            ),
        ],
    )
    own = body_of(GEMINI, _loop(GEMINI.own(signed)))["contents"][1]["parts"]
    assert own[0]["thoughtSignature"] == "dGhvdWdodC1zaWc="
    assert own[1]["thoughtSignature"] == "Y2FsbC1zaWc="
    replay = Replay(GEMINI_API, GEMINI_PROVIDER)
    foreign = stamp(signed, "anthropic.messages", "anthropic", "claude-sonnet-4-5")
    built = GEMINI.build_body(
        _loop(foreign),
        default_options=Request([user_message("x")]).options,
        model=GEMINI.model,
        stream=False,
        replay=replay,
    )
    # The call of the current turn carries Google's placeholder, not the foreign value.
    (call,) = built["contents"][1]["parts"]
    assert call["thoughtSignature"] == PLACEHOLDER_SIGNATURE
    assert replay.left_out == ["messages[1].parts[0] (reasoning of another model)"]
    # In an earlier turn a foreign call needs none.
    earlier = Request([*_loop(foreign).messages, assistant_message("18C."), user_message("And?")])
    (call,) = body_of(GEMINI, earlier)["contents"][1]["parts"]
    assert "thoughtSignature" not in call
