"""ResponseAccumulator: every merge rule of DESIGN section 5."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_stream import complete_responses, normalise, split_response

from scope.chat import (
    FinishReason,
    Message,
    Output,
    OutputMetadata,
    Part,
    PartKind,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    Role,
    Usage,
    media_part,
    reasoning_part,
    text_part,
    tool_call_delta_part,
    tool_call_part,
)
from scope.errors import InvalidResponseError
from scope.media import Media

IMAGE = media_part(Media.from_uri("image/png", "https://example.com/a.png"))


def chunk(
    *parts: Part | str,
    finish: FinishReason | None = None,
    message_meta: dict[str, Any] | None = None,
    output_extra: dict[str, Any] | None = None,
    meta: ResponseMetadata | None = None,
) -> Response:
    message = None
    if parts:
        converted = [text_part(p) if isinstance(p, str) else p for p in parts]
        message = Message(Role.ASSISTANT, converted, message_meta or {})
    output_meta = None if output_extra is None else OutputMetadata(output_extra)
    return Response(Output(message, finish, output_meta), meta)


def accumulate(*chunks: Response) -> ResponseAccumulator:
    acc = ResponseAccumulator()
    for c in chunks:
        acc.add(c)
    return acc


def parts_of(acc: ResponseAccumulator) -> tuple[Part, ...]:
    response = acc.response()
    assert response is not None and response.output is not None
    assert response.output.message is not None
    return response.output.message.parts


def assert_rejected_unchanged(acc: ResponseAccumulator, bad: Response, match: str) -> None:
    before = acc.response()
    text_before = acc.text
    with pytest.raises(InvalidResponseError, match=match):
        acc.add(bad)
    assert acc.response() == before
    assert acc.text == text_before


# -- basics -----------------------------------------------------------------------------


def test_response_is_none_before_first_add() -> None:
    acc = ResponseAccumulator()
    assert acc.response() is None
    assert acc.text == ""


def test_empty_chunk_starts_the_response() -> None:
    acc = accumulate(Response())
    assert acc.response() == Response()


def test_a_failed_first_add_leaves_response_none() -> None:
    acc = ResponseAccumulator()
    with pytest.raises(InvalidResponseError):
        acc.add(chunk(tool_call_part("a", "f"), tool_call_part("a", "f")))
    assert acc.response() is None


@pytest.mark.parametrize("bad", [None, "text", Output(), {"output": None}])
def test_add_rejects_non_responses(bad: Any) -> None:
    acc = ResponseAccumulator()
    with pytest.raises(InvalidResponseError, match="must be a Response"):
        acc.add(bad)
    assert acc.response() is None


def test_add_validates_the_chunk() -> None:
    bad = Response()
    object.__setattr__(bad, "output", "not an output")  # a value that came from elsewhere
    acc = accumulate(chunk("ok"))
    assert_rejected_unchanged(acc, bad, "output must be an Output")


def test_add_validates_nested_values_as_response_errors() -> None:
    message = Message(Role.ASSISTANT, [text_part("x")])
    object.__setattr__(message, "parts", ())
    bad = Response(Output())
    object.__setattr__(bad.output, "message", message)
    acc = accumulate(chunk("ok"))
    with pytest.raises(InvalidResponseError, match="at least one part") as info:
        acc.add(bad)
    assert info.value.__cause__ is not None
    assert acc.text == "ok"


def test_response_is_an_independent_value() -> None:
    acc = accumulate(chunk("Hel"))
    first = acc.response()
    acc.add(chunk("lo", finish=FinishReason.STOP))
    assert first == chunk("Hel")
    assert acc.response() == chunk("Hello", finish=FinishReason.STOP)


def test_response_is_cached_until_the_next_add() -> None:
    acc = accumulate(chunk("a"), chunk("b"))
    assert acc.response() is acc.response()
    before = acc.response()
    acc.add(chunk("c"))
    assert acc.response() is not before
    assert acc.text == "abc"


def test_text_is_the_text_so_far_without_reasoning() -> None:
    acc = accumulate(chunk("He"), chunk(reasoning_part("think")), chunk("llo"))
    assert acc.text == "Hello"


# -- adjacency ---------------------------------------------------------------------------


def test_adjacent_text_merges() -> None:
    acc = accumulate(chunk("Hel"), chunk("lo", ", "), chunk("world"))
    assert parts_of(acc) == (text_part("Hello, world"),)


def test_text_with_other_metadata_starts_a_new_part() -> None:
    acc = accumulate(
        chunk(text_part("a", {"lang": "en"})),
        chunk(text_part("b", {"lang": "en"})),
        chunk(text_part("c", {"lang": "fr"})),
        chunk(text_part("d")),
    )
    assert parts_of(acc) == (
        text_part("ab", {"lang": "en"}),
        text_part("c", {"lang": "fr"}),
        text_part("d"),
    )


def test_only_the_last_part_is_adjacent() -> None:
    acc = accumulate(
        chunk("a"),
        chunk(reasoning_part("r1")),
        chunk("b"),
        chunk(IMAGE),
        chunk("c"),
        chunk(reasoning_part("r2")),
        chunk(reasoning_part("r3")),
    )
    assert parts_of(acc) == (
        text_part("a"),
        reasoning_part("r1"),
        text_part("b"),
        IMAGE,
        text_part("c"),
        reasoning_part("r2r3"),
    )


def test_media_parts_never_merge() -> None:
    acc = accumulate(chunk(IMAGE), chunk(IMAGE))
    assert parts_of(acc) == (IMAGE, IMAGE)


def test_reasoning_merges_and_signatures_concatenate() -> None:
    acc = accumulate(
        chunk(reasoning_part("Let me ")),
        chunk(reasoning_part("think", b"\x01\x02")),
        chunk(reasoning_part(signature=bytearray(b"\x03"))),
    )
    assert parts_of(acc) == (reasoning_part("Let me think", b"\x01\x02\x03"),)


def test_reasoning_with_other_metadata_starts_a_new_part() -> None:
    acc = accumulate(
        chunk(reasoning_part("a", metadata={"block": 1})),
        chunk(reasoning_part("b", metadata={"block": 2})),
    )
    assert [p.text for p in parts_of(acc)] == ["a", "b"]


def test_parts_within_one_chunk_merge_too() -> None:
    acc = accumulate(chunk("a", "b", reasoning_part("x"), reasoning_part("y")))
    assert parts_of(acc) == (text_part("ab"), reasoning_part("xy"))


# -- tool calls --------------------------------------------------------------------------


def test_tool_call_deltas_become_tool_call_parts() -> None:
    acc = accumulate(
        chunk(tool_call_delta_part("a", "get", '{"ci')),
        chunk(tool_call_delta_part("a", "get", 'ty":"Oslo"}')),
        chunk(finish=FinishReason.TOOL_CALLS),
    )
    assert parts_of(acc) == (tool_call_part("a", "get", '{"city":"Oslo"}'),)
    response = acc.response()
    assert response is not None
    response.validate_complete()


def test_a_partial_tool_call_is_reported_as_it_stands() -> None:
    acc = accumulate(chunk(tool_call_delta_part("a", "get", '{"ci')))
    assert parts_of(acc) == (tool_call_part("a", "get", '{"ci'),)


def test_interleaved_parallel_tool_call_deltas_merge_by_id() -> None:
    acc = accumulate(
        chunk("Checking."),
        chunk(tool_call_delta_part("a", "weather", '{"c":')),
        chunk(tool_call_delta_part("b", "time", '{"tz":')),
        chunk(tool_call_delta_part("a", "weather", '"Oslo"}')),
        chunk(" More"),  # a new text part: the last part is call b
        chunk(tool_call_delta_part("b", "time", '"CET"}'), " text"),
        chunk(finish=FinishReason.TOOL_CALLS),
    )
    assert parts_of(acc) == (
        text_part("Checking."),
        tool_call_part("a", "weather", '{"c":"Oslo"}'),
        tool_call_part("b", "time", '{"tz":"CET"}'),
        text_part(" More text"),
    )


def test_tool_call_delta_metadata_merges_last_write_wins() -> None:
    acc = accumulate(
        chunk(tool_call_delta_part("a", "f", "{", {"x": 1, "y": 1})),
        chunk(tool_call_delta_part("a", "f", "}", {"y": 2})),
    )
    assert parts_of(acc) == (tool_call_part("a", "f", "{}", {"x": 1, "y": 2}),)


def test_changed_name_for_the_same_id_is_rejected_and_state_unchanged() -> None:
    acc = accumulate(chunk(tool_call_delta_part("a", "get", "{")))
    assert_rejected_unchanged(
        acc, chunk(tool_call_delta_part("a", "put", "}")), "changed its name from 'get' to 'put'"
    )
    acc.add(chunk(tool_call_delta_part("a", "get", "}")))
    assert parts_of(acc) == (tool_call_part("a", "get", "{}"),)


def test_changed_name_within_one_chunk_is_rejected() -> None:
    acc = accumulate(chunk("x"))
    assert_rejected_unchanged(
        acc,
        chunk(tool_call_delta_part("a", "get"), tool_call_delta_part("a", "put")),
        "changed its name",
    )


@pytest.mark.parametrize(
    "first",
    [
        chunk(tool_call_part("a", "f", "{}")),
        chunk(tool_call_delta_part("a", "f", "{")),
    ],
    ids=["after-complete", "after-delta"],
)
def test_complete_tool_call_repeating_an_id_is_rejected(first: Response) -> None:
    acc = accumulate(first)
    assert_rejected_unchanged(acc, chunk(tool_call_part("a", "f", "{}")), "already seen")


def test_complete_tool_call_repeating_an_id_within_one_chunk_is_rejected() -> None:
    acc = ResponseAccumulator()
    for bad in (
        chunk(tool_call_part("a", "f"), tool_call_part("a", "f")),
        chunk(tool_call_delta_part("a", "f"), tool_call_part("a", "f")),
    ):
        with pytest.raises(InvalidResponseError, match="already seen"):
            acc.add(bad)
    assert acc.response() is None


def test_delta_for_an_id_that_arrived_complete_is_rejected() -> None:
    acc = accumulate(chunk(tool_call_part("a", "f", "{}")))
    assert_rejected_unchanged(
        acc, chunk(tool_call_delta_part("a", "f", "x")), "already arrived as a complete"
    )
    assert_rejected_unchanged(
        ResponseAccumulator(),
        chunk(tool_call_part("b", "f"), tool_call_delta_part("b", "f")),
        "already arrived as a complete",
    )


def test_distinct_complete_tool_calls_are_kept_in_order() -> None:
    acc = accumulate(
        chunk(tool_call_part("a", "f", "1")),
        chunk(tool_call_delta_part("b", "g", "2")),
        chunk(tool_call_part("c", "h", "3")),
    )
    assert parts_of(acc) == (
        tool_call_part("a", "f", "1"),
        tool_call_part("b", "g", "2"),
        tool_call_part("c", "h", "3"),
    )


# -- atomicity ---------------------------------------------------------------------------


def test_a_chunk_failing_half_way_changes_nothing() -> None:
    acc = accumulate(
        chunk(tool_call_delta_part("a", "get", "{"), message_meta={"m": 1}),
        Response(metadata=ResponseMetadata("r1", "m1", Usage(1, 1), {"e": 1})),
    )
    bad = Response(
        Output(
            Message(
                Role.ASSISTANT,
                [
                    text_part("text that must not land"),
                    tool_call_delta_part("new", "f", "{"),
                    tool_call_delta_part("a", "get", "1"),
                    tool_call_delta_part("a", "other", "}"),  # fails here
                ],
                {"m": 2},
            ),
            FinishReason.STOP,
            OutputMetadata({"o": 1}),
        ),
        ResponseMetadata("r2", "m2", Usage(5, 5), {"e": 2}),
    )
    assert_rejected_unchanged(acc, bad, "changed its name")
    # the id first seen in the failed chunk is not remembered
    acc.add(chunk(tool_call_delta_part("new", "g", "x")))
    assert acc.response() == Response(
        Output(
            Message(
                Role.ASSISTANT,
                [tool_call_part("a", "get", "{"), tool_call_part("new", "g", "x")],
                {"m": 1},
            )
        ),
        ResponseMetadata("r1", "m1", Usage(1, 1), {"e": 1}),
    )


# -- scalars, metadata, usage -----------------------------------------------------------


def test_id_model_and_finish_reason_take_the_latest_non_empty_value() -> None:
    acc = accumulate(
        Response(metadata=ResponseMetadata("r1", "m1")),
        chunk("x", meta=ResponseMetadata("r2")),
        Response(metadata=ResponseMetadata("", "m2")),
        Response(metadata=ResponseMetadata()),
        chunk(finish=FinishReason.LENGTH),
        Response(Output()),
    )
    response = acc.response()
    assert response is not None and response.metadata is not None
    assert (response.metadata.id, response.metadata.model) == ("r2", "m2")
    assert response.output is not None
    assert response.output.finish_reason is FinishReason.LENGTH


def test_metadata_merges_last_write_wins_per_key() -> None:
    acc = accumulate(
        chunk("a", message_meta={"m1": 1, "m2": 1}, output_extra={"o1": 1, "o2": 1}),
        Response(metadata=ResponseMetadata(extra={"e1": 1, "e2": 1})),
        chunk("b", message_meta={"m2": 2}, output_extra={"o2": 2}),
        Response(metadata=ResponseMetadata(extra={"e2": 2, "e3": 3})),
        chunk("c"),  # no metadata: nothing removed
    )
    response = acc.response()
    assert response is not None and response.output is not None
    assert response.output.message is not None
    assert response.output.message.metadata.values_dict() == {"m1": 1, "m2": 2}
    assert response.output.metadata is not None
    assert response.output.metadata.extra.values_dict() == {"o1": 1, "o2": 2}
    assert response.metadata is not None
    assert response.metadata.extra.values_dict() == {"e1": 1, "e2": 2, "e3": 3}


def test_metadata_objects_are_present_when_any_chunk_had_one() -> None:
    assert accumulate(chunk("a")).response() == chunk("a")
    assert accumulate(chunk("a"), Response(metadata=ResponseMetadata())).response() == Response(
        Output(Message(Role.ASSISTANT, [text_part("a")])), ResponseMetadata()
    )
    assert accumulate(chunk(output_extra={}), chunk("a")).response() == chunk("a", output_extra={})
    assert accumulate(Response(metadata=ResponseMetadata("r"))).response() == Response(
        metadata=ResponseMetadata("r")
    )


def test_message_metadata_sent_after_the_parts_merges_into_the_message() -> None:
    # What a provider sends after the last part (Anthropic's container in message_delta,
    # a Responses text's annotations) rides on a chunk without a message.
    late = Response(Output(message_metadata={"p/container": {"id": "c1"}, "m": 2}))
    acc = accumulate(chunk("a", message_meta={"m": 1, "k": 1}), chunk("b"), late)
    acc.add(chunk(finish=FinishReason.STOP))
    acc.add(Response(Output(message_metadata={"p/late": True})))  # after the finish reason
    assert acc.response() == Response(
        Output(
            Message(
                Role.ASSISTANT,
                [text_part("ab")],
                {"m": 2, "k": 1, "p/container": {"id": "c1"}, "p/late": True},
            ),
            FinishReason.STOP,
        )
    )


def test_message_metadata_without_any_part_stays_in_the_output() -> None:
    acc = accumulate(Response(Output(message_metadata={"m": 1})))
    assert acc.response() == Response(Output(message_metadata={"m": 1}))
    acc.add(chunk("a"))  # a part after the metadata: the message takes it
    assert acc.response() == chunk("a", message_meta={"m": 1})
    only = accumulate(chunk(finish="stop"), Response(Output(message_metadata={"m": 1})))
    assert only.response() == Response(Output(None, FinishReason.STOP, message_metadata={"m": 1}))


def test_message_metadata_beside_a_message_is_rejected() -> None:
    message = Message(Role.ASSISTANT, [text_part("a")])
    with pytest.raises(InvalidResponseError, match=r"^output message_metadata is only for a chunk"):
        Output(message, message_metadata={"m": 1})
    with pytest.raises(InvalidResponseError, match="output message_metadata"):
        Output(message_metadata={"": 1})  # an empty key, named by where it is
    assert not Output(message, message_metadata={}).message_metadata


def usage_after(*usages: Usage) -> Usage:
    acc = accumulate(*(Response(metadata=ResponseMetadata(usage=u)) for u in usages))
    response = acc.response()
    assert response is not None
    return response.usage


def test_usage_is_a_snapshot_the_latest_non_zero_wins() -> None:
    assert usage_after(Usage(10, 1), Usage(10, 5)) == Usage(10, 5)
    # a snapshot replaces, it is not added up and not merged field by field
    assert usage_after(Usage(10, 5, 2), Usage(3, 1)) == Usage(3, 1)


def test_zero_usage_never_overwrites() -> None:
    assert usage_after(Usage(10, 5), Usage()) == Usage(10, 5)
    assert usage_after(Usage(10, 5), Usage(), Usage(0, 0)) == Usage(10, 5)
    assert usage_after(Usage()) == Usage()
    # a reported zero breakdown is a report, not "nothing"
    assert usage_after(Usage(10, 5), Usage(0, 0, 0)) == Usage(0, 0, 0)


# -- after the finish reason ------------------------------------------------------------


def finished() -> ResponseAccumulator:
    return accumulate(chunk("done"), chunk(finish=FinishReason.STOP))


def test_content_after_the_finish_reason_is_rejected() -> None:
    for late in (
        chunk("more"),
        chunk(tool_call_delta_part("a", "f")),
        chunk(reasoning_part("r")),
        chunk("x", finish=FinishReason.STOP),
    ):
        assert_rejected_unchanged(finished(), late, "after the finish reason")


def test_usage_and_metadata_after_the_finish_reason_are_accepted() -> None:
    acc = finished()
    acc.add(Response(metadata=ResponseMetadata("r", usage=Usage(7, 3))))
    acc.add(Response(Output(metadata=OutputMetadata({"k": 1}))))
    acc.add(Response())
    assert acc.response() == Response(
        Output(
            Message(Role.ASSISTANT, [text_part("done")]),
            FinishReason.STOP,
            OutputMetadata({"k": 1}),
        ),
        ResponseMetadata("r", usage=Usage(7, 3)),
    )


def test_a_later_finish_reason_replaces_the_earlier_one() -> None:
    acc = finished()
    acc.add(chunk(finish=FinishReason.CONTENT_FILTER))
    response = acc.response()
    assert response is not None and response.output is not None
    assert response.output.finish_reason is FinishReason.CONTENT_FILTER


def test_content_in_the_same_chunk_as_the_finish_reason_is_accepted() -> None:
    acc = accumulate(chunk("a"), chunk("b", finish=FinishReason.STOP))
    assert acc.response() == chunk("ab", finish=FinishReason.STOP)


# -- properties --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(data=st.data(), response=complete_responses())
def test_any_chunking_accumulates_back_to_the_response(
    data: st.DataObject, response: Response
) -> None:
    chunks = data.draw(split_response(response))
    acc = accumulate(*chunks)
    assert acc.response() == response
    assert acc.text == response.text


@settings(max_examples=50, deadline=None)
@given(parts=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=10))
def test_text_deltas_equal_the_normalised_parts(parts: list[str]) -> None:
    metas = {"a": {}, "b": {}, "c": {"k": 1}}
    as_parts = [text_part(p, metas[p]) for p in parts]
    acc = accumulate(*(chunk(p) for p in as_parts))
    assert list(parts_of(acc)) == normalise(as_parts)
    assert all(p.kind is PartKind.TEXT for p in parts_of(acc))


class _GeneralOnly:
    """The accumulator with its text hot path bypassed: every chunk takes ``_add``."""

    def __init__(self) -> None:
        self.acc = ResponseAccumulator()

    def add(self, chunk: Response) -> None:
        self.acc._add(chunk)


@settings(max_examples=200)
@given(st.data())
def test_the_text_hot_path_merges_exactly_like_the_general_path(data: st.DataObject) -> None:
    response = data.draw(complete_responses())
    chunks = data.draw(split_response(response))
    # Text chunks with metadata, after the finish reason, and invalid ones too.
    extra = data.draw(
        st.lists(
            st.sampled_from(
                [
                    chunk("more"),
                    chunk(text_part("m", metadata={"k": 1})),
                    chunk(reasoning_part("r")),
                    Response(Output(finish_reason=FinishReason.STOP)),
                ]
            ),
            max_size=4,
        )
    )
    fast, general = ResponseAccumulator(), _GeneralOnly()
    for piece in [*chunks, *extra]:
        outcomes = []
        for acc in (fast, general):
            try:
                acc.add(piece)
                outcomes.append(None)
            except InvalidResponseError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        assert fast.response() == general.acc.response()
