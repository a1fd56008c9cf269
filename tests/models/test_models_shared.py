"""What the provider adapters share: the helpers of ``scope.models._wire`` and
``_json_shape``, the one constructor of ``HTTPAdapter`` and the stream mappers' flags."""

from __future__ import annotations

import inspect

import pytest

from scope.chat import Options, ToolCall
from scope.errors import (
    InvalidResponseError,
    InvalidToolCallError,
    UnsupportedOptionError,
)
from scope.models._anthropic_wire import EventMapper
from scope.models._json_shape import nested_count
from scope.models._openai_wire import ChunkMapper
from scope.models._responses_wire import EventMapper as ResponsesEventMapper
from scope.models._wire import as_invalid_response, extension_fields, put_options
from scope.models.anthropic import AnthropicModel
from scope.models.openai import OpenAIChatModel, OpenAIResponsesModel


def test_a_value_refusing_server_data_becomes_invalid_response() -> None:
    with (
        pytest.raises(InvalidResponseError, match=r"^chunk\.tool_calls\[0\]: ") as caught,
        as_invalid_response("chunk.tool_calls[0]"),
    ):
        ToolCall("", "f")
    assert type(caught.value.__cause__) is InvalidToolCallError


def test_invalid_response_and_other_errors_pass_unchanged() -> None:
    original = InvalidResponseError("response.id must be a string")
    with pytest.raises(InvalidResponseError) as caught, as_invalid_response("response"):
        raise original
    assert caught.value is original
    with pytest.raises(KeyError), as_invalid_response("response"):
        raise KeyError("not a scope error")


def test_extension_fields_yield_in_order_and_refuse_a_reserved_one_when_reached() -> None:
    options = Options(extensions={"acme/a": 1, "acme/model": "x", "acme/z": 2, "other/model": "y"})
    fields = extension_fields(options, "acme", frozenset({"model"}), "AcmeModel")
    assert next(fields)[0] == "a"
    with pytest.raises(
        UnsupportedOptionError,
        match=r"^extension 'acme/model' would overwrite the 'model' field, which AcmeModel ",
    ):
        next(fields)
    other = extension_fields(options, "other", frozenset(), "OtherModel")
    assert [(name, raw.value()) for name, raw in other] == [("model", "y")]


def test_put_options_writes_only_set_options_in_table_order() -> None:
    body: dict[str, object] = {}
    options = Options(top_p=0.5, max_tokens=10)
    put_options(options, body, (("max_tokens", "limit"), ("temperature", "t"), ("top_p", "p")))
    assert list(body.items()) == [("limit", 10), ("p", 0.5)]


def test_nested_count_reads_a_details_object() -> None:
    usage = {"details": {"cached": 3}, "empty": None}
    assert nested_count(usage, "details", "cached", "usage") == 3
    assert nested_count(usage, "empty", "cached", "usage") is None
    assert nested_count(usage, "missing", "cached", "usage") is None
    with pytest.raises(InvalidResponseError, match=r"^usage\.details must be an object"):
        nested_count({"details": [1]}, "details", "cached", "usage")
    with pytest.raises(InvalidResponseError, match=r"^usage\.details\.cached must be a non-neg"):
        nested_count({"details": {"cached": -1}}, "details", "cached", "usage")


def test_both_adapters_take_the_same_settings() -> None:
    anthropic = dict(inspect.signature(AnthropicModel).parameters)
    openai = dict(inspect.signature(OpenAIChatModel).parameters)
    # provider_name: the adapter's own name unless given ("anthropic" for None).
    assert openai.pop("provider_name").default == "openai"
    assert anthropic.pop("provider_name").default is None
    # The Anthropic adapter's own switches (DESIGN §6g), both off by default.
    assert anthropic.pop("drop_mismatched_thinking").default is False
    assert anthropic.pop("prompt_cache").default is False
    assert AnthropicModel("m", api_key="").provider_name == "anthropic"
    assert AnthropicModel("m", api_key="", provider_name="bedrock").provider_name == "bedrock"
    # prompt_cache_key: the OpenAI adapters' own (DESIGN §6g).
    assert openai.pop("prompt_cache_key").default is None
    assert list(anthropic) == list(openai)
    for name, parameter in anthropic.items():
        assert (parameter.kind, parameter.default) == (openai[name].kind, openai[name].default)
    # The Responses adapter: the Chat adapter's settings, and its switch.
    chat = inspect.signature(OpenAIChatModel).parameters
    responses = dict(inspect.signature(OpenAIResponsesModel).parameters)
    assert responses.pop("encrypted_reasoning").default is True
    assert list(responses) == list(chat)
    for name, parameter in responses.items():
        assert (parameter.kind, parameter.default) == (chat[name].kind, chat[name].default)


@pytest.mark.parametrize("adapter", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
def test_repr_names_the_adapter(
    adapter: type[AnthropicModel | OpenAIChatModel | OpenAIResponsesModel],
) -> None:
    model = adapter("m", api_key="", base_url="http://localhost:1/")
    assert repr(model) == f"{adapter.__name__}(model='m', base_url='http://localhost:1')"


@pytest.mark.parametrize("mapper", [ChunkMapper, EventMapper, ResponsesEventMapper])
def test_a_new_mapper_has_seen_neither_end_nor_finish_reason(
    mapper: type[ChunkMapper | EventMapper | ResponsesEventMapper],
) -> None:
    fresh = mapper()
    assert (fresh.end_marker_seen, fresh.finish_reason_seen) == (False, False)
