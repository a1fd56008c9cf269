"""The provider-neutral chat protocol: values, accumulation, models and middleware."""

from scope.chat._accumulator import ResponseAccumulator as ResponseAccumulator
from scope.chat._deltas import response_metadata as response_metadata
from scope.chat._deltas import text_delta as text_delta
from scope.chat._deltas import token_usage as token_usage
from scope.chat._fallback import DEFAULT_FALLBACK_ERRORS as DEFAULT_FALLBACK_ERRORS
from scope.chat._fallback import Fallback as Fallback
from scope.chat._fallback import fallback as fallback
from scope.chat._message import Message as Message
from scope.chat._message import NativeItem as NativeItem
from scope.chat._message import Part as Part
from scope.chat._message import ToolCall as ToolCall
from scope.chat._message import ToolCallDelta as ToolCallDelta
from scope.chat._message import ToolOutput as ToolOutput
from scope.chat._message import ToolResult as ToolResult
from scope.chat._message import assistant_message as assistant_message
from scope.chat._message import media_part as media_part
from scope.chat._message import native_part as native_part
from scope.chat._message import reasoning_part as reasoning_part
from scope.chat._message import system_message as system_message
from scope.chat._message import text_part as text_part
from scope.chat._message import tool_call_delta_part as tool_call_delta_part
from scope.chat._message import tool_call_part as tool_call_part
from scope.chat._message import tool_message as tool_message
from scope.chat._message import tool_result_part as tool_result_part
from scope.chat._message import user_message as user_message
from scope.chat._model import CallMiddleware as CallMiddleware
from scope.chat._model import Model as Model
from scope.chat._model import ModelFunc as ModelFunc
from scope.chat._model import Streamer as Streamer
from scope.chat._model import StreamerFunc as StreamerFunc
from scope.chat._model import StreamMiddleware as StreamMiddleware
from scope.chat._model import collect as collect
from scope.chat._model import wrap as wrap
from scope.chat._model import wrap_stream as wrap_stream
from scope.chat._options import Options as Options
from scope.chat._options import OutputFormat as OutputFormat
from scope.chat._options import ToolDefinition as ToolDefinition
from scope.chat._request import Request as Request
from scope.chat._request import check_sequence as check_sequence
from scope.chat._response import Output as Output
from scope.chat._response import OutputMetadata as OutputMetadata
from scope.chat._response import Response as Response
from scope.chat._response import ResponseMetadata as ResponseMetadata
from scope.chat._response import Usage as Usage
from scope.chat._types import FinishReason as FinishReason
from scope.chat._types import OutputFormatType as OutputFormatType
from scope.chat._types import PartKind as PartKind
from scope.chat._types import Role as Role

__all__ = [
    "CallMiddleware",
    "DEFAULT_FALLBACK_ERRORS",
    "Fallback",
    "FinishReason",
    "Message",
    "Model",
    "ModelFunc",
    "NativeItem",
    "Options",
    "Output",
    "OutputFormat",
    "OutputFormatType",
    "OutputMetadata",
    "Part",
    "PartKind",
    "Request",
    "Response",
    "ResponseAccumulator",
    "ResponseMetadata",
    "Role",
    "StreamMiddleware",
    "Streamer",
    "StreamerFunc",
    "ToolCall",
    "ToolCallDelta",
    "ToolDefinition",
    "ToolOutput",
    "ToolResult",
    "Usage",
    "assistant_message",
    "check_sequence",
    "collect",
    "fallback",
    "media_part",
    "native_part",
    "reasoning_part",
    "response_metadata",
    "system_message",
    "text_delta",
    "text_part",
    "token_usage",
    "tool_call_delta_part",
    "tool_call_part",
    "tool_message",
    "tool_result_part",
    "user_message",
    "wrap",
    "wrap_stream",
]

from scope._validate import publish as _publish

_publish(__name__, __all__, globals())
