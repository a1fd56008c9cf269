"""The streaming fast paths of scope.chat agree with the checked constructors.

``scope.chat.text_delta`` builds a one-fragment chunk without the four
validating ``__init__`` calls, ``token_usage`` and ``response_metadata`` their value without
``__init__``'s per-field lookups; ``Usage.validate`` and ``ResponseMetadata.validate`` accept
the usual values before running their full checks (``_check``). Each is proved here to
accept exactly what the checked path accepts, build equal values, and raise the same
error (type and message) for everything else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from scope._validate import MAX_INT
from scope.chat import (
    Message,
    Output,
    Part,
    PartKind,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    Role,
    Usage,
    response_metadata,
    text_delta,
    token_usage,
)
from scope.errors import InvalidPartError, InvalidResponseError, InvalidUsageError
from scope.metadata import EMPTY_METADATA, Metadata


def outcome(build: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", (type, message))``."""
    try:
        return "ok", build()
    except Exception as exc:
        return "error", (type(exc), str(exc))


def checked(kind: Any, text: Any, metadata: Any, response_metadata: Any) -> Response:
    part = Part(kind, text=text, metadata=metadata)
    return Response(Output(Message(Role.ASSISTANT, (part,))), response_metadata)


# Any character, lone surrogates included (hypothesis leaves them out by default).
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
kinds = st.one_of(st.sampled_from(list(PartKind)), st.sampled_from(["text", "reasoning", "x", 1]))
part_metadata = st.sampled_from(
    [EMPTY_METADATA, Metadata(), Metadata({"k": 1}), {"k": "v"}, {1: 2}, None, "meta"]
)
response_metadatas = st.sampled_from(
    [None, ResponseMetadata(), ResponseMetadata("id", "m", Usage(1, 2)), Usage(), "x", {}]
)


@settings(max_examples=500)
@given(
    kind=kinds,
    text=st.one_of(texts, st.sampled_from(["", " tok1", "é", "\ud800", None, 3, b"b"])),
    metadata=part_metadata,
    meta=response_metadatas,
)
def test_text_delta_builds_what_the_constructors_build(
    kind: Any, text: Any, metadata: Any, meta: Any
) -> None:
    fast = outcome(lambda: text_delta(kind, text, metadata, meta))
    slow = outcome(lambda: checked(kind, text, metadata, meta))
    assert fast == slow
    if fast[0] == "ok":
        chunk = fast[1]
        message = chunk.message
        assert message.metadata is EMPTY_METADATA  # what the accumulator's fast path wants
        assert message._json is None
        for value in (message.parts[0], message, chunk.output, chunk):
            value.validate()
            assert attrs.asdict(value, recurse=False) == attrs.asdict(
                attrs.evolve(value), recurse=False
            )


def test_text_delta_refuses_what_a_part_refuses() -> None:
    for text, message in [
        ("", "a text part needs non-empty text"),
        ("\ud800", "part text is not valid Unicode (lone surrogate)"),
    ]:
        kind, value = outcome(lambda text=text: text_delta(PartKind.TEXT, text))
        assert (kind, value) == ("error", (InvalidPartError, message))
    kind, value = outcome(lambda: text_delta(PartKind.REASONING, ""))
    assert value == (InvalidPartError, "a reasoning part needs text or a signature")
    kind, value = outcome(lambda: text_delta(PartKind.TEXT, "x", EMPTY_METADATA, "x"))  # type: ignore[arg-type]
    assert value == (InvalidResponseError, "metadata must be ResponseMetadata, got str")


def test_text_delta_chunks_take_the_accumulators_fast_path() -> None:
    accumulator = ResponseAccumulator()
    accumulator.add(text_delta(PartKind.TEXT, "a"))
    accumulator.add(text_delta(PartKind.TEXT, "b"))
    accumulator.add(text_delta(PartKind.REASONING, "r"))
    response = accumulator.response()
    assert response is not None
    assert [(p.kind, p.text) for p in response.message.parts] == [
        (PartKind.TEXT, "ab"),
        (PartKind.REASONING, "r"),
    ]


def unchecked(cls: type, **fields: Any) -> Any:
    """An instance of ``cls`` with ``fields`` as they are (no converter, no check)."""
    value = object.__new__(cls)
    for name, field in fields.items():
        object.__setattr__(value, name, field)
    return value


counts = st.one_of(
    st.none(),
    st.integers(min_value=-2, max_value=40),
    st.sampled_from([MAX_INT - 1, MAX_INT, MAX_INT + 1, 2**64, True, False, 1.0, "1"]),
)


@settings(max_examples=1000)
@given(a=counts, b=counts, c=counts, d=counts, e=counts)
def test_the_usage_fast_path_accepts_exactly_what_its_checks_accept(
    a: Any, b: Any, c: Any, d: Any, e: Any
) -> None:
    usage = unchecked(
        Usage,
        input_tokens=a,
        output_tokens=b,
        reasoning_tokens=c,
        cache_read_input_tokens=d,
        cache_write_input_tokens=e,
    )
    fast = outcome(usage.validate)
    assert fast == outcome(usage._check)
    if fast[0] == "error":
        assert fast[1][0] is InvalidUsageError


names = st.one_of(
    texts,
    st.sampled_from(["", "id", " id", "id\n", "gemini-2.5-flash", "\u00a0x", "\ud800", None, 1]),
)


@settings(max_examples=1000)
@given(
    response_id=names,
    model=names,
    usage=st.sampled_from([Usage(), Usage(3, 4), None, "usage", 1]),
)
def test_the_response_metadata_fast_path_accepts_exactly_what_its_checks_accept(
    response_id: Any, model: Any, usage: Any
) -> None:
    metadata = unchecked(
        ResponseMetadata, id=response_id, model=model, usage=usage, extra=EMPTY_METADATA
    )
    fast = outcome(metadata.validate)
    assert fast == outcome(metadata._check)
    if fast[0] == "error":
        assert fast[1][0] is InvalidResponseError


def test_usage_and_response_metadata_need_no_converters() -> None:
    """What ``token_usage`` and ``response_metadata`` rely on: construction is writing the
    fields and ``validate()``; Usage has no converters, ResponseMetadata's keep a Usage
    and a Metadata as they are."""
    assert all(field.converter is None for field in attrs.fields(Usage))
    assert Usage.__attrs_post_init__.__code__.co_names == ("validate",)
    assert ResponseMetadata.__attrs_post_init__.__code__.co_names == ("validate",)
    some = Usage(1, 2)
    extra = Metadata({"k": 1})
    fields = attrs.fields(ResponseMetadata)
    assert fields.usage.converter(some) is some  # type: ignore[misc]
    assert fields.extra.converter(extra) is extra  # type: ignore[misc]


@settings(max_examples=1000)
@given(a=counts, b=counts, c=counts, d=counts, e=counts)
def test_token_usage_builds_what_the_constructor_builds(
    a: Any, b: Any, c: Any, d: Any, e: Any
) -> None:
    assert outcome(lambda: token_usage(a, b, c, d, e)) == outcome(lambda: Usage(a, b, c, d, e))


@settings(max_examples=1000)
@given(
    response_id=names,
    model=names,
    usage_=st.sampled_from([Usage(), Usage(3, 4), None, "usage", 1]),
    extra=st.sampled_from([EMPTY_METADATA, Metadata({"k": 1}), {"k": 1}, {1: 1}, None]),
)
def test_response_metadata_builds_what_the_constructor_builds(
    response_id: Any, model: Any, usage_: Any, extra: Any
) -> None:
    assert outcome(lambda: response_metadata(response_id, model, usage_, extra)) == outcome(
        lambda: ResponseMetadata(response_id, model, usage_, extra)
    )


fragments = st.lists(
    st.tuples(
        st.sampled_from([PartKind.TEXT, PartKind.REASONING]),
        st.text(min_size=1, max_size=4),
        st.sampled_from([EMPTY_METADATA, Metadata({"k": 1})]),
    ),
    max_size=8,
)


@settings(max_examples=300)
@given(chunks=fragments)
def test_a_stream_of_text_deltas_accumulates_like_the_checked_chunks(
    chunks: list[tuple[PartKind, str, Metadata]],
) -> None:
    fast, slow = ResponseAccumulator(), ResponseAccumulator()
    meta = response_metadata("r", "m", token_usage(1, 1))
    for kind, text, metadata in chunks:
        fast.add(text_delta(kind, text, metadata, response_metadata=meta))
        slow.add(checked(kind, text, metadata, ResponseMetadata("r", "m", Usage(1, 1))))
    assert fast.response() == slow.response()


def test_the_fast_constructors_are_public_in_scope_chat() -> None:
    # Other packages (scope.models, anyone's adapter) import them from scope.chat.
    import scope.chat

    for function in (text_delta, token_usage, response_metadata):
        assert function.__module__ == "scope.chat"
        assert getattr(scope.chat, function.__name__) is function
        assert (function.__doc__ or "").strip()
