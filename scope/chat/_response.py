"""``Usage``, ``Response`` and their metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

import attrs

from scope._validate import MAX_INT, check_int, check_text, nested
from scope.chat._message import Message, ToolCall
from scope.chat._types import FinishReason, FinishReasonLike, PartKind, Role
from scope.errors import InvalidResponseError, InvalidUsageError
from scope.metadata import EMPTY_METADATA, Metadata

__all__ = ["Output", "OutputMetadata", "Response", "ResponseMetadata", "Usage"]


def _check_breakdown(value: int | None, what: str, total: int, total_name: str) -> None:
    if value is None:
        return
    check_int(value, what, InvalidUsageError)
    if value > total:
        raise InvalidUsageError(f"{what} ({value}) must not exceed {total_name} ({total})")


@final
@attrs.frozen
class Usage:
    """Token counts. ``None`` breakdowns were not reported; a reported zero is ``0``.

    ``input_tokens`` includes cache reads and writes; ``output_tokens`` includes
    reasoning tokens.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the counts (construction already did)."""
        # Fast path (every chunk of a stream may carry usage): exactly the conditions
        # ``_check`` tests, all true; anything else takes it, to raise the right error.
        # (Two non-negative counts whose sum fits 64 bits each fit 64 bits.)
        inputs = self.input_tokens
        outputs = self.output_tokens
        reasoning = self.reasoning_tokens
        cache_read = self.cache_read_input_tokens
        cache_write = self.cache_write_input_tokens
        if (
            type(inputs) is int
            and type(outputs) is int
            and inputs >= 0
            and outputs >= 0
            and inputs + outputs <= MAX_INT
            and (reasoning is None or (type(reasoning) is int and 0 <= reasoning <= outputs))
            and (cache_read is None or (type(cache_read) is int and 0 <= cache_read <= inputs))
            and (cache_write is None or (type(cache_write) is int and 0 <= cache_write <= inputs))
        ):
            return
        self._check()

    def _check(self) -> None:
        """The checks ``validate`` runs when its fast path does not accept the counts:
        they raise the error naming what is wrong (tests/chat/test_deltas.py proves that the
        fast path accepts exactly what they accept)."""
        check_int(self.input_tokens, "input_tokens", InvalidUsageError)
        check_int(self.output_tokens, "output_tokens", InvalidUsageError)
        if self.input_tokens + self.output_tokens > MAX_INT:
            raise InvalidUsageError("input_tokens + output_tokens must be below 2**63")
        _check_breakdown(
            self.reasoning_tokens, "reasoning_tokens", self.output_tokens, "output_tokens"
        )
        _check_breakdown(
            self.cache_read_input_tokens,
            "cache_read_input_tokens",
            self.input_tokens,
            "input_tokens",
        )
        _check_breakdown(
            self.cache_write_input_tokens,
            "cache_write_input_tokens",
            self.input_tokens,
            "input_tokens",
        )

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens (breakdowns are already inside them)."""
        return self.input_tokens + self.output_tokens

    def is_zero(self) -> bool:
        """True when nothing at all was reported."""
        return self == _ZERO_USAGE


_ZERO_USAGE = Usage()


def _usage(value: Usage | None) -> Usage:
    """``None`` means zero usage; a wrong type (only possible past the type checker) is
    left for ``validate()``."""
    return _ZERO_USAGE if value is None else value


def _to_response_extra(value: Mapping[str, Any]) -> Metadata:
    if type(value) is Metadata:
        return value
    return nested(Metadata.coerce, value, InvalidResponseError, "response metadata extra")


@final
@attrs.frozen
class ResponseMetadata:
    """Response-level facts: provider response id, model, usage, and extra metadata."""

    id: str = ""
    model: str = ""
    usage: Usage = attrs.field(default=_ZERO_USAGE, converter=_usage)
    extra: Metadata = attrs.field(default=EMPTY_METADATA, converter=_to_response_extra)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the metadata (construction already did)."""
        # Fast path: ASCII id and model without surrounding whitespace (what check_text
        # accepts without looking further) and a Usage; anything else takes the checks.
        response_id = self.id
        model = self.model
        if (
            type(response_id) is str
            and type(model) is str
            and response_id.isascii()
            and model.isascii()
            and response_id.strip() == response_id
            and model.strip() == model
            and type(self.usage) is Usage
        ):
            return
        self._check()

    def _check(self) -> None:
        """The checks ``validate`` runs when its fast path does not accept the values
        (tests/chat/test_deltas.py proves that it accepts only what they accept)."""
        check_text(self.id, "response id", InvalidResponseError, strip=True)
        check_text(self.model, "response model", InvalidResponseError, strip=True)
        if not isinstance(self.usage, Usage):
            raise InvalidResponseError(f"usage must be Usage, got {type(self.usage).__name__}")


def _to_output_extra(value: Mapping[str, Any]) -> Metadata:
    if type(value) is Metadata:
        return value
    return nested(Metadata.coerce, value, InvalidResponseError, "output metadata extra")


@final
@attrs.frozen
class OutputMetadata:
    """Output-level extra metadata."""

    extra: Metadata = attrs.field(default=EMPTY_METADATA, converter=_to_output_extra)

    def validate(self) -> None:
        """Nothing beyond construction: metadata is valid by construction."""


def _finish(value: FinishReasonLike | None) -> FinishReason | None:
    if value is None or type(value) is FinishReason:
        return value
    try:
        return FinishReason(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in FinishReason)
        raise InvalidResponseError(
            f"finish_reason must be one of {allowed} or None, got {value!r}"
        ) from None


def _to_message_metadata(value: Mapping[str, Any]) -> Metadata:
    if type(value) is Metadata:
        return value
    return nested(Metadata.coerce, value, InvalidResponseError, "output message_metadata")


@final
@attrs.frozen
class Output:
    """The generated message (role assistant), why generation stopped, and metadata.

    ``message_metadata`` is for a stream chunk that has metadata for the message but no
    part to carry it: what a provider sends after the answer's last part (Anthropic's
    ``container``, a Responses text's annotations). It is allowed only without a
    ``message`` (a message carries its own metadata); ``ResponseAccumulator`` merges it
    into the message's metadata like a chunk message's, and keeps it here only when no
    part ever came.
    """

    message: Message | None = None
    finish_reason: FinishReason | None = attrs.field(default=None, converter=_finish)
    metadata: OutputMetadata | None = None
    message_metadata: Metadata = attrs.field(default=EMPTY_METADATA, converter=_to_message_metadata)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the output (construction already did)."""
        if self.message is not None:
            if not isinstance(self.message, Message):
                raise InvalidResponseError(
                    f"output message must be a Message, got {type(self.message).__name__}"
                )
            if self.message.role is not Role.ASSISTANT:
                raise InvalidResponseError(
                    f"output message must have role assistant, got {self.message.role}"
                )
            if self.message_metadata:
                raise InvalidResponseError(
                    "output message_metadata is only for a chunk without a message "
                    "(put it in output.message.metadata)"
                )
        if self.metadata is not None and not isinstance(self.metadata, OutputMetadata):
            raise InvalidResponseError(
                f"output metadata must be OutputMetadata, got {type(self.metadata).__name__}"
            )

    @property
    def text(self) -> str:
        """The message's text, or ``""`` without a message."""
        return "" if self.message is None else self.message.text


@final
@attrs.frozen
class Response:
    """A model's answer, or one streamed delta of it. The empty Response is a valid chunk."""

    output: Output | None = None
    metadata: ResponseMetadata | None = None

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the response as a value (construction already did)."""
        if self.output is not None and not isinstance(self.output, Output):
            raise InvalidResponseError(
                f"output must be an Output, got {type(self.output).__name__}"
            )
        if self.metadata is not None and not isinstance(self.metadata, ResponseMetadata):
            raise InvalidResponseError(
                f"metadata must be ResponseMetadata, got {type(self.metadata).__name__}"
            )

    @property
    def text(self) -> str:
        """The output text, or ``""`` without a message."""
        return "" if self.output is None else self.output.text

    @property
    def usage(self) -> Usage:
        """The reported usage (zero when none was)."""
        return _ZERO_USAGE if self.metadata is None else self.metadata.usage

    @property
    def message(self) -> Message:
        """The answer message: ``output.message`` without the two ``None`` checks.

        Raises ``InvalidResponseError`` when the response has no output or its output no
        message (a stream chunk without parts, or a final response that carries none,
        such as a ``content_filter`` stop).
        """
        output = self.output
        if output is None:
            raise InvalidResponseError("the response has no output, so no message")
        if output.message is None:
            raise InvalidResponseError("the response output has no message")
        return output.message

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The complete tool calls of the answer message, in order; ``()`` when there are
        none or there is no message. (A stream chunk's ``tool_call_delta`` fragments are
        not calls: accumulate the stream first.)"""
        output = self.output
        if output is None or output.message is None:
            return ()
        return output.message.tool_calls

    def validate_complete(self) -> None:
        """Raise ``InvalidResponseError`` unless this is a complete final response:

        output present, finish_reason set, no tool_call_delta parts, and finish_reason
        ``tool_calls`` only with at least one tool_call part.
        """
        self.validate()
        output = self.output
        if output is None:
            raise InvalidResponseError("a complete response needs an output")
        if output.finish_reason is None:
            raise InvalidResponseError("a complete response needs a finish_reason")
        has_call = False
        if output.message is not None:
            for index, part in enumerate(output.message.parts):
                if part.kind is PartKind.TOOL_CALL_DELTA:
                    raise InvalidResponseError(
                        f"output.message.parts[{index}]: a complete response must not carry "
                        "tool_call_delta parts"
                    )
                if part.kind is PartKind.TOOL_CALL:
                    has_call = True
        if output.finish_reason is FinishReason.TOOL_CALLS and not has_call:
            raise InvalidResponseError("finish_reason tool_calls needs at least one tool_call part")
