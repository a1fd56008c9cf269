"""Strict tool definitions and strict output formats on the wire (issue 46): each adapter
sends the provider's strict flag where the provider has one (OpenAI Chat Completions
``function.strict`` and ``response_format.json_schema.strict``, Responses ``strict`` on
the tool and the text format, Anthropic ``strict`` on the tool) and nothing extra where
it has none (Gemini, Gemini Interactions). Every body is checked with the provider's
own request types, as the loopback servers check them.
"""

from __future__ import annotations

from typing import Any

import pytest

from scope.chat import Options as ChatOptions
from scope.chat import OutputFormat, Request, ToolDefinition, user_message
from scope.tools import tool
from tests import (
    anthropic_server,
    gemini_interactions_server,
    gemini_server,
    openai_server,
    responses_server,
)
from tests.helpers import (
    ANTHROPIC,
    GEMINI,
    INTERACTIONS,
    OPENAI,
    PROVIDERS,
    RESPONSES,
    Provider,
    body_of,
)


@tool(strict=True)
def lookup(city: str, unit: str = "C") -> str:
    """Look a city up."""
    return city + unit


PLAIN = ToolDefinition("plain", {"type": "object", "properties": {}}, "Not strict.")
STRICT = lookup.definition

CHECKS = {
    OPENAI.name: openai_server.check_request_body,
    ANTHROPIC.name: anthropic_server.check_request_body,
    GEMINI.name: gemini_server.check_request_body,
    RESPONSES.name: responses_server.check_request_body,
    INTERACTIONS.name: gemini_interactions_server.check_request_body,
}


def _tools_of(provider: Provider, body: Any) -> list[dict[str, Any]]:
    """The tool entries of ``body``, each as the object that carries name and schema."""
    if provider is OPENAI:
        return [entry["function"] for entry in body["tools"]]
    if provider is GEMINI:
        return list(body["tools"][0]["functionDeclarations"])
    return list(body["tools"])


def _body(provider: Provider, request: Request) -> Any:
    body = body_of(provider, request)
    CHECKS[provider.name](body)
    return body


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_the_strict_flag_goes_where_the_provider_has_one(provider: Provider) -> None:
    body = _body(provider, Request([user_message("Hi")], tools=[PLAIN, STRICT]))
    plain, strict = _tools_of(provider, body)
    if provider in (OPENAI, ANTHROPIC):
        assert "strict" not in plain  # absent: the protocol's default, not strict
        assert strict["strict"] is True
    elif provider is RESPONSES:
        assert plain["strict"] is False  # the Responses API defaults to strict
        assert strict["strict"] is True
    else:  # Gemini has no strict flag: the same schema, nothing extra
        assert "strict" not in plain and "strict" not in strict
    assert set(strict) - {"strict"} == set(plain) - {"strict"}  # the same fields besides
    schema_field = {GEMINI.name: "parametersJsonSchema", ANTHROPIC.name: "input_schema"}.get(
        provider.name, "parameters"
    )
    assert strict[schema_field] == STRICT.input_schema.value()


def _format_of(provider: Provider, body: Any) -> dict[str, Any]:
    if provider is OPENAI:
        spec: dict[str, Any] = body["response_format"]["json_schema"]
        return spec
    if provider is RESPONSES:
        spec = body["text"]["format"]
        return spec
    if provider is GEMINI:
        return {"schema": body["generationConfig"]["responseJsonSchema"]}
    if provider is INTERACTIONS:
        spec = body["response_format"]
        return spec
    return {}  # Anthropic: the fallback instruction in the system prompt


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
@pytest.mark.parametrize("strict", [False, True])
def test_a_strict_output_format_is_marked_where_the_provider_has_a_flag(
    provider: Provider, strict: bool
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    fmt = OutputFormat.json_schema("answer", schema, strict=strict)
    body = _body(provider, Request([user_message("Hi")], options=ChatOptions(output_format=fmt)))
    sent = _format_of(provider, body)
    if provider in (OPENAI, RESPONSES) and strict:
        assert sent["strict"] is True
    else:
        assert "strict" not in sent
    if provider is ANTHROPIC:
        assert "strict" not in str(body["system"])


def test_the_body_of_a_strict_tool_is_the_exact_wire_form() -> None:
    body = body_of(OPENAI, Request([user_message("Hi")], tools=[STRICT]))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a city up.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "unit": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    },
                    "required": ["city", "unit"],
                    "additionalProperties": False,
                },
                "strict": True,
            },
        }
    ]
