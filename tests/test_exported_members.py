"""Pin the public surface: a name appears or disappears only on purpose.

To extend: add the new name to the expected list of its module (keep the lists sorted).
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import scope

EXPECTED: dict[str, list[str]] = {
    "scope": ["__version__"],
    "scope.errors": [
        "AppendConflictError",
        "ApprovalPendingError",
        "AuthenticationError",
        "BadRequestError",
        "CommitError",
        "ConversationClosedError",
        "HistoryChangedError",
        "HistoryDivergedError",
        "HistoryError",
        "InvalidAppendIDError",
        "InvalidBatchError",
        "InvalidConversationIDError",
        "InvalidJSONError",
        "InvalidMediaError",
        "InvalidMessageError",
        "InvalidMetadataError",
        "InvalidOptionsError",
        "InvalidOutputFormatError",
        "InvalidPartError",
        "InvalidReceiptError",
        "InvalidRequestError",
        "InvalidResponseError",
        "InvalidToolCallError",
        "InvalidToolDefinitionError",
        "InvalidToolResultError",
        "InvalidUsageError",
        "InvalidViewError",
        "InvalidWindowError",
        "MaxStepsError",
        "NoOutputError",
        "NotPendingError",
        "ProviderConnectionError",
        "ProviderError",
        "ProviderServerError",
        "ProviderTimeoutError",
        "RateLimitError",
        "RestoreConflictError",
        "ScopeError",
        "ScopeWarning",
        "StoreError",
        "TurnInProgressError",
        "TurnInterruptedError",
        "TurnLogError",
        "UnknownHeadError",
        "UnsupportedOptionError",
        "WindowTooSmallError",
    ],
    "scope.chat": [
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
    ],
    "scope.history": [
        "AppendConflictError",
        "AppendID",
        "Batch",
        "Branch",
        "COMPACTION_KEY",
        "Clearer",
        "ClosedConversation",
        "CommitError",
        "ConversationClosedError",
        "ConversationID",
        "ConversationMeta",
        "DefaultTokenCounter",
        "ErasureReceipt",
        "Fence",
        "HistoryCache",
        "HistoryChangedError",
        "HistoryError",
        "HistoryTree",
        "HistoryView",
        "IncompleteReason",
        "IncompleteTurn",
        "Interrupt",
        "KeepInterrupted",
        "Layers",
        "Lister",
        "Middleware",
        "MoveHead",
        "ReadWriter",
        "Reader",
        "Receipt",
        "Reject",
        "RestoreConflictError",
        "Restorer",
        "Store",
        "StoreAdapter",
        "StoreError",
        "TokenCounter",
        "TurnInProgressError",
        "TurnInterruptedError",
        "TurnLeaser",
        "Unfenced",
        "UnknownHeadError",
        "ViewReader",
        "Wait",
        "WindowReader",
        "WindowTooSmallError",
        "Writer",
        "branches",
        "compact",
        "erase",
        "erase_owner",
        "fork",
        "keyword_layers",
        "retain",
        "rewind",
        "switch",
    ],
    "scope.historystores": [
        "OpeningStore",
        "PersistentStore",
        "SCHEMA_VERSION",
        "StoredRecord",
        "open_store",
    ],
    "scope.historystores.postgres": ["PostgresStore"],
    "scope.historystores.redis": ["RedisStore"],
    "scope.historystores.sqlite": ["SQLiteStore"],
    "scope.cli": ["main"],
    "scope.models": [],
    "scope.testing": [
        "Fail",
        "FunctionModel",
        "Hang",
        "ScriptExhaustedError",
        "ScriptedModel",
        "StreamLog",
        "Turn",
        "offline_summarizer",
    ],
    "scope.history.inmemory": [
        "InMemoryStore",
    ],
    "scope.history.storekit": [
        "CLOSURES",
        "Closure",
        "MAX_OWNER_CHARS",
        "SECRET_BYTES",
        "STORE_KINDS",
        "check_created",
        "check_erase_limit",
        "check_head",
        "check_move_id",
        "check_now",
        "check_owner",
        "check_retention",
        "check_secret",
        "check_tombstone",
        "check_until",
        "erasure_digest",
        "new_secret",
        "tombstone",
    ],
    "scope.history.storetest": [
        "HOSTILE_IDS",
        "StoreConformance",
        "rich_messages",
    ],
    "scope.jsonvalue": ["JSONDocument", "RawJSON", "coerce_raw_json"],
    "scope.metadata": ["Extensions", "Metadata"],
    "scope.media": ["Media", "Source", "SourceKind"],
    "scope.models.openai": [
        "DEFAULT_BASE_URL",
        "DEFAULT_TIMEOUT",
        "OpenAIChatModel",
        "OpenAIResponsesModel",
    ],
    "scope.models.anthropic": [
        "API_VERSION",
        "AnthropicModel",
        "DEFAULT_BASE_URL",
        "DEFAULT_MAX_TOKENS",
        "DEFAULT_TIMEOUT",
        "REASONING_BUDGETS",
    ],
    "scope.models.gemini": [
        "API_REVISION",
        "DEFAULT_BASE_URL",
        "DEFAULT_TIMEOUT",
        "GeminiInteractionsModel",
        "GeminiModel",
        "REASONING_LEVELS",
    ],
    "scope.otel": ["SEMCONV_VERSION", "Tracing", "tracing"],
    "scope.web": [
        "AGUIRunInput",
        "AGUI_HEADERS",
        "CLIENT_MESSAGE_ID_KEY",
        "EncodedStream",
        "HistoryDivergedError",
        "InMemoryTurnLog",
        "RedisTurnLog",
        "ResumableTurns",
        "SHUTDOWN_GRACE",
        "SHUTDOWN_TEXT",
        "ToolApproval",
        "TurnLog",
        "TurnLogError",
        "UIChatRequest",
        "UI_MESSAGE_STREAM_HEADERS",
        "agui_events",
        "agui_turn",
        "chat_request_from_ui",
        "default_error_text",
        "run_input_from_agui",
        "ui_message_stream",
        "ui_turn",
        "user_message_from_agui",
        "user_message_from_ui",
    ],
    "scope.tools": ["FREEFORM_KEY", "Tool", "ToolContext", "to_output", "tool"],
    "scope.tools.mcp": ["load_tools", "mcp_tool", "result_output"],
    "scope.conversation": [
        "Conversation",
        "ModelMiddleware",
        "TurnEvent",
        "TurnEventKind",
        "TurnResult",
    ],
    "scope.codec": [
        "converter",
        "decode_canonical",
        "decode_error_for",
        "encode_messages",
        "from_builtins",
        "from_json",
        "register_own",
        "to_builtins",
        "to_json",
    ],
}


def test_every_public_module_is_pinned() -> None:
    # A module is public when no part of its dotted name starts with an underscore.
    found = {"scope"}
    for info in pkgutil.walk_packages(scope.__path__, "scope."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.add(info.name)
    assert sorted(found) == sorted(EXPECTED)


@pytest.mark.parametrize("module_name", sorted(EXPECTED))
def test_exported_members(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = list(module.__all__)
    assert exported == sorted(exported), "keep __all__ sorted"
    for name in exported:
        assert hasattr(module, name), name
    assert exported == EXPECTED[module_name]


@pytest.mark.parametrize(
    "module_name",
    [
        "scope.chat",
        "scope.conversation",
        "scope.history",
        "scope.media",
        "scope.metadata",
        "scope.tools",
        "scope.web",
    ],
)
def test_public_classes_show_their_public_module(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in EXPECTED[module_name]:
        obj = getattr(module, name)
        if isinstance(obj, type) and not issubclass(obj, Exception):
            # Errors live in scope.errors and are only re-exported elsewhere.
            assert obj.__module__ == module_name, name


def test_errors_are_value_errors_where_documented() -> None:
    errors = importlib.import_module("scope.errors")
    for name in errors.__all__:
        cls = getattr(errors, name)
        if name == "ScopeWarning":  # the one warning: a UserWarning, not an error
            assert issubclass(cls, UserWarning) and not issubclass(cls, errors.ScopeError)
            continue
        assert issubclass(cls, errors.ScopeError)
        assert issubclass(cls, ValueError) == (
            name.startswith("Invalid") or name == "UnsupportedOptionError"
        ), name
