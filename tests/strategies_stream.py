"""Hypothesis strategies for streaming: complete responses and ways to chunk them."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
from hypothesis import strategies as st

from scope.chat import (
    FinishReason,
    Message,
    Output,
    OutputMetadata,
    Part,
    PartKind,
    Response,
    ResponseMetadata,
    Role,
    Usage,
    media_part,
    text_part,
    tool_call_delta_part,
    tool_call_part,
)
from scope.media import Media
from scope.metadata import Metadata

__all__ = ["complete_responses", "normalise", "split_response"]

_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
_maybe_text = st.text(st.characters(codec="utf-8"), max_size=12)
_part_meta = st.sampled_from([Metadata(), Metadata({"a": 1}), Metadata({"b": "x", "c": [1]})])
_meta_dict = st.dictionaries(
    st.sampled_from(["k1", "k2", "k3"]), st.integers(-5, 5) | st.text(max_size=3), max_size=3
)
_media = st.sampled_from(
    [
        media_part(Media.from_uri("image/png", "https://example.com/a.png")),
        media_part(Media.from_bytes("audio/wav", b"RIFF")),
    ]
)


@st.composite
def _reasoning(draw: st.DrawFn) -> Part:
    text = draw(_maybe_text)
    signature = draw(st.binary(min_size=0 if text else 1, max_size=6))
    return Part(PartKind.REASONING, text=text, signature=signature, metadata=draw(_part_meta))


_call_shape = st.tuples(st.sampled_from(["get_weather", "search", "calc"]), _maybe_text, _part_meta)


def normalise(parts: list[Part]) -> list[Part]:
    """Merge adjacent text/reasoning parts of equal kind and metadata, as streaming does."""
    out: list[Part] = []
    for part in parts:
        last = out[-1] if out else None
        if (
            last is not None
            and part.kind in (PartKind.TEXT, PartKind.REASONING)
            and last.kind is part.kind
            and last.metadata == part.metadata
        ):
            out[-1] = attrs.evolve(
                last, text=last.text + part.text, signature=last.signature + part.signature
            )
        else:
            out.append(part)
    return out


@st.composite
def _usage(draw: st.DrawFn) -> Usage:
    if draw(st.booleans()):
        return Usage()
    input_tokens = draw(st.integers(0, 1000))
    output_tokens = draw(st.integers(0, 1000))
    reasoning = draw(st.none() | st.integers(0, output_tokens))
    cache_read = draw(st.none() | st.integers(0, input_tokens))
    return Usage(input_tokens, output_tokens, reasoning, cache_read)


@st.composite
def complete_responses(draw: st.DrawFn) -> Response:
    """A valid complete response whose parts are already normalised."""
    kinds = draw(
        st.lists(st.sampled_from(["text", "reasoning", "media", "call"]), min_size=0, max_size=8)
    )
    parts: list[Part] = []
    for n, kind in enumerate(kinds):
        if kind == "text":
            parts.append(text_part(draw(_text), draw(_part_meta)))
        elif kind == "reasoning":
            parts.append(draw(_reasoning()))
        elif kind == "media":
            parts.append(draw(_media))
        else:
            name, args, meta = draw(_call_shape)
            parts.append(tool_call_part(f"call_{n}", name, args, meta))
    parts = normalise(parts)
    has_call = any(p.kind is PartKind.TOOL_CALL for p in parts)
    reasons = list(FinishReason) if has_call else [r for r in FinishReason if r != "tool_calls"]
    message = None
    message_meta = draw(_meta_dict)
    if parts:
        message = Message(Role.ASSISTANT, parts, message_meta)
    output_meta = draw(st.none() | st.builds(OutputMetadata, _meta_dict))
    response_meta = draw(
        st.none()
        | st.builds(
            ResponseMetadata,
            st.sampled_from(["", "resp_1", "chatcmpl-9"]),
            st.sampled_from(["", "gpt-x", "claude-y"]),
            _usage(),
            _meta_dict,
        )
    )
    # metadata for a message that never came (sent after no part): kept in the output
    kept = message_meta if message is None else {}
    output = Output(message, draw(st.sampled_from(reasons)), output_meta, kept)
    response = Response(output, response_meta)
    response.validate_complete()
    return response


@attrs.define
class _Chunk:
    parts: list[Part] = attrs.Factory(list)
    message_meta: dict[str, Any] = attrs.Factory(dict)
    output: bool = False
    output_extra: dict[str, Any] | None = None
    finish: FinishReason | None = None
    meta: bool = False
    id: str = ""
    model: str = ""
    usage: Usage = attrs.Factory(Usage)
    extra: dict[str, Any] = attrs.Factory(dict)

    def build(self) -> Response:
        output = None
        if (
            self.output
            or self.parts
            or self.message_meta
            or self.finish is not None
            or self.output_extra is not None
        ):
            message = None
            late = {}  # message metadata in a chunk without parts: after them (or none came)
            if self.parts:
                message = Message(Role.ASSISTANT, self.parts, self.message_meta)
            else:
                late = self.message_meta
            output_meta = None if self.output_extra is None else OutputMetadata(self.output_extra)
            output = Output(message, self.finish, output_meta, late)
        meta = None
        if self.meta:
            meta = ResponseMetadata(self.id, self.model, self.usage, self.extra)
        return Response(output, meta)


def _cuts(draw: st.DrawFn, length: int) -> list[int]:
    """Sorted distinct cut points in (0, length)."""
    if length < 2:
        return []
    return sorted(draw(st.sets(st.integers(1, length - 1), max_size=4)))


def _pieces(draw: st.DrawFn, value: Any) -> list[Any]:
    bounds = [0, *_cuts(draw, len(value)), len(value)]
    return [value[a:b] for a, b in itertools.pairwise(bounds)]


def _scatter(
    draw: st.DrawFn, chunks: list[_Chunk], items: dict[str, Any], field: str, decoy: Any
) -> None:
    """Put each key in one random chunk; maybe a decoy value in an earlier chunk."""
    for key, value in items.items():
        at = draw(st.integers(0, len(chunks) - 1))
        targets = [(at, value)]
        if at and draw(st.booleans()):
            targets.append((draw(st.integers(0, at - 1)), decoy))
        for index, item in targets:
            getattr(chunks[index], field)[key] = item
            if field == "extra":
                chunks[index].meta = True


@st.composite
def split_response(draw: st.DrawFn, response: Response) -> list[Response]:
    """Chunk ``response`` at arbitrary points, interleaving its tool-call fragments.

    Text and reasoning are cut anywhere; each tool call's first fragment stays at the
    call's position and its later fragments are deferred to arbitrary later points,
    interleaved with other calls and parts; fragments are grouped into chunks at
    arbitrary boundaries; every metadata key lands in an arbitrary chunk (with decoy
    values earlier, which last-write-wins must overwrite); usage has earlier non-zero
    snapshots and zero ones anywhere; empty chunks and metadata-only chunks after the
    finish reason are sprinkled in.
    """
    output = response.output
    assert output is not None
    message = output.message
    fragments: list[Part] = []
    pending: list[list[Part]] = []  # deferred fragments per started tool call
    for part in () if message is None else message.parts:
        while pending:
            if not draw(st.booleans()):
                break
            queue = pending[draw(st.integers(0, len(pending) - 1))]
            fragments.append(queue.pop(0))
            pending = [q for q in pending if q]
        if part.kind is PartKind.TEXT:
            fragments.extend(text_part(t, part.metadata) for t in _pieces(draw, part.text))
        elif part.kind is PartKind.REASONING:
            texts = _pieces(draw, part.text) if part.text else []
            sigs = _pieces(draw, part.signature) if part.signature else []
            fragments.extend(
                Part(PartKind.REASONING, text=t, metadata=part.metadata) for t in texts
            )
            fragments.extend(
                Part(PartKind.REASONING, signature=s, metadata=part.metadata) for s in sigs
            )
        elif part.kind is PartKind.TOOL_CALL:
            call = part.tool_call
            assert call is not None
            args = _pieces(draw, call.arguments) if call.arguments else [""]
            # part metadata may ride on any fragment: it merges last-write-wins
            meta_at = draw(st.integers(0, len(args) - 1))
            deltas = [
                tool_call_delta_part(
                    call.id, call.name, a, part.metadata if i == meta_at else Metadata()
                )
                for i, a in enumerate(args)
            ]
            fragments.append(deltas[0])
            if len(deltas) > 1:
                pending.append(deltas[1:])
        else:
            fragments.append(part)
    while pending:
        queue = pending[draw(st.integers(0, len(pending) - 1))]
        fragments.append(queue.pop(0))
        pending = [q for q in pending if q]

    chunks: list[_Chunk] = []
    for fragment in fragments:
        if not chunks or draw(st.booleans()):
            chunks.append(_Chunk(output=True))
        chunks[-1].parts.append(fragment)
    content = len(chunks)
    trailing = draw(st.integers(0 if content else 1, 3))
    chunks.extend(_Chunk() for _ in range(trailing))
    # the finish reason: on the last content chunk or on a trailing one
    finish_at = draw(st.integers(max(content - 1, 0), len(chunks) - 1))
    chunks[finish_at].finish = output.finish_reason
    chunks[finish_at].output = True

    # message metadata in any chunk: with parts, or alone (output.message_metadata, what
    # a provider sends after the last part)
    message_meta = output.message_metadata if message is None else message.metadata
    _scatter(draw, chunks, dict(message_meta), "message_meta", {"decoy": True})
    if output.metadata is not None:
        at = draw(st.integers(0, len(chunks) - 1))
        chunks[at].output_extra = {}
        chunks[at].output = True
        for key, value in output.metadata.extra.items():
            at = draw(st.integers(0, len(chunks) - 1))
            if chunks[at].output_extra is None:
                chunks[at].output_extra = {}
            chunks[at].output_extra[key] = value  # type: ignore[index]
            chunks[at].output = True
    meta = response.metadata
    if meta is not None:
        chunks[draw(st.integers(0, len(chunks) - 1))].meta = True
        for field in ("id", "model"):
            value = getattr(meta, field)
            if value:
                at = draw(st.integers(0, len(chunks) - 1))
                setattr(chunks[at], field, value)
                chunks[at].meta = True
                if at and draw(st.booleans()):
                    decoy_at = draw(st.integers(0, at - 1))
                    setattr(chunks[decoy_at], field, "decoy")
                    chunks[decoy_at].meta = True
        usage_at = draw(st.integers(0, len(chunks) - 1))
        if not meta.usage.is_zero():
            chunks[usage_at].usage = meta.usage
            chunks[usage_at].meta = True
            if usage_at and draw(st.booleans()):
                early = draw(st.integers(0, usage_at - 1))
                chunks[early].usage = Usage(1, 1)
                chunks[early].meta = True
        # zero usage anywhere never overwrites
        zero_at = draw(st.integers(0, len(chunks) - 1))
        chunks[zero_at].meta = True
        _scatter(draw, chunks, dict(meta.extra), "extra", "decoy")
    built = [c.build() for c in chunks]
    for _ in range(draw(st.integers(0, 2))):
        built.insert(draw(st.integers(0, len(built))), Response())
    return built
