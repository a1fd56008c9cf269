"""``scope chat``: an interactive terminal chat over an OpenAI-compatible server, the
Anthropic Messages API with ``--provider anthropic``, the Gemini API with ``--provider
gemini`` or the OpenAI Responses API with ``--provider openai-responses``.

Lines are read from stdin (``/exit`` or end of input quits). Each line is one turn of a
``scope.conversation.Conversation`` (through the history ``Middleware``), so the
conversation is replayed from the store and every completed turn is appended once.
Answers stream to stdout as they arrive; everything else (the conversation id, hints,
errors) goes to stderr, so stdout holds only the answers. The chat has no tools: a model
that calls one gets an error result saying so and answers on.

Failures keep the session alive: a ``ProviderError`` or an invalid response is one line
on stderr and nothing is stored (send the message again). A ``CommitError`` (the model
answered, the store did not take the turn) is retried at once by the ``Conversation``
(``append_retries=1``: ``writer.append(err.batch)``, never the model); if that fails too,
the turn is kept and retried before the next message is sent, so the replayed history
never skips it. Ctrl-C during an answer
abandons that answer (nothing stored); a message sent while another session's turn runs
on the same conversation is refused before the model is called (``on_overlap="reject"``)
and says so; at the prompt it quits with exit status 130. A
session in which messages were sent and none was answered exits with status 1, so a
script piping messages in sees the failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Final, TextIO, final

from scope.cli._errors import CLIError
from scope.cli._render import safe
from scope.cli._stores import CLIStore, closed_as, open_cli_store, prepare_sqlite_parent
from scope.conversation import Conversation, TurnEvent
from scope.errors import (
    CommitError,
    ConversationClosedError,
    InvalidResponseError,
    MaxStepsError,
    ProviderError,
    StoreError,
    TurnInProgressError,
)
from scope.history import Batch, ConversationID

if TYPE_CHECKING:
    from scope.models.anthropic import AnthropicModel
    from scope.models.gemini import GeminiModel
    from scope.models.openai import OpenAIChatModel, OpenAIResponsesModel

__all__ = ["DEFAULT_MODEL", "DEFAULT_MODELS", "PROVIDERS", "make_model", "run_chat"]

#: The providers ``scope chat --provider`` knows.
PROVIDERS: Final = ("openai", "anthropic", "gemini", "openai-responses")

#: The model ``scope chat`` asks for unless ``--model`` or ``$SCOPE_MODEL`` names one.
DEFAULT_MODELS: Final[dict[str, str]] = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-5",
    "gemini": "gemini-2.5-flash",
    "openai-responses": "gpt-5-mini",
}
DEFAULT_MODEL: Final = DEFAULT_MODELS["openai"]

_NAMES: Final = {
    "openai": "OpenAI",
    "anthropic": "Anthropic",
    "gemini": "Gemini",
    "openai-responses": "OpenAI",
}

#: The extra that installs each provider's adapter.
_EXTRAS: Final = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
    "openai-responses": "openai",
}


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@final
class _Session:
    """One chat session: the store, the model and the conversation, on one event loop."""

    def __init__(
        self,
        store: CLIStore,
        model: OpenAIChatModel | OpenAIResponsesModel | AnthropicModel | GeminiModel,
        conversation_id: ConversationID,
        system: str | None,
        out: TextIO,
        err: TextIO,
        provider: str = "openai",
    ) -> None:
        self.store = store
        self.provider = provider
        self.model = model
        self.sent = 0  # messages the user sent
        self.answered = 0  # of those, the ones the model answered
        self.conversation_id = conversation_id
        # Every store leases turns: a message sent while another session's turn runs on
        # this conversation is refused before the model is called.
        self.conversation = Conversation(
            model,
            store,
            conversation_id,
            on_overlap="reject",
            system=system or None,
            append_retries=1,
        )
        self.middleware = self.conversation.middleware
        self.out = out
        self.err = err
        self.pending: Batch | None = None  # a committed-by-the-model turn not yet stored

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    async def save_pending(self) -> bool:
        """Append the pending turn; True when nothing is pending any more."""
        batch = self.pending
        if batch is None:
            return True
        try:
            receipt = await self.store.append(batch)
            receipt.validate_for(batch)
        except ConversationClosedError:
            state = await closed_as(self.store, self.conversation_id)
            raise CLIError(
                f"conversation {str(self.conversation_id)!r} is {state}; its last answer "
                "cannot be saved; start a new conversation with `scope chat`"
            ) from None
        except StoreError as exc:
            self.note(
                f"scope: warning: the last answer is still not saved ({_one_line(exc)}); it "
                "will be retried before your next message; /exit now loses it"
            )
            return False
        self.pending = None
        self.note("(the last answer is now saved)")
        return True

    async def turn(self, text: str) -> None:
        """Send one user message and print the streamed answer."""
        self.sent += 1
        if not await self.save_pending():
            self.note("(message not sent: the previous answer must be saved first)")
            return
        try:
            await _print_turn(
                self.conversation.stream(text),
                self.out,
                "assistant> " if _isatty(self.out) else "",
            )
        except ConversationClosedError:
            state = await closed_as(self.store, self.conversation_id)
            raise CLIError(
                f"conversation {str(self.conversation_id)!r} is {state}; the message was "
                "not sent; start a new conversation with `scope chat`"
            ) from None
        except TurnInProgressError:
            self.note(
                f"scope: error: another session holds conversation "
                f"{str(self.conversation_id)!r} (its answer is being generated); the "
                "message was not sent: send it again once that answer is done"
            )
            return
        except CommitError as exc:
            if isinstance(exc.__cause__, ConversationClosedError):
                state = await closed_as(self.store, self.conversation_id)
                raise CLIError(
                    f"conversation {str(self.conversation_id)!r} is {state}; this answer "
                    "was not saved; start a new conversation with `scope chat`"
                ) from None
            if not exc.retryable:
                self.note(
                    f"scope: error: the answer was not saved ({_one_line(exc.__cause__)}); "
                    "another session added to this conversation meanwhile: send the "
                    "message again to answer it on the current history"
                )
                return
            self.note(
                f"scope: warning: the answer is not saved ({_one_line(exc.__cause__)}); it "
                "will be retried before your next message; /exit now loses it"
            )
            self.answered += 1  # answered, and kept until the store takes it
            self.pending = exc.batch
            return
        except MaxStepsError:
            self.note(
                "scope: error: the model kept asking for tools and scope chat has none "
                "(message not saved; send it again)"
            )
            return
        except ProviderError as exc:
            self.note(
                f"scope: error: {_provider_line(exc)}{self._hint(exc)} "
                "(message not saved; send it again)"
            )
            return
        except InvalidResponseError as exc:
            self.note(
                f"scope: error: invalid response from the server: {_one_line(exc)} (not saved)"
            )
            return
        except StoreError as exc:
            self.note(f"scope: error: cannot read the history: {_one_line(exc)} (message not sent)")
            return
        self.answered += 1

    def _hint(self, exc: ProviderError) -> str:
        """For a 404, a base URL that most likely lacks (or has an extra) ``/v1``."""
        if exc.status_code != 404:
            return ""
        base = self.model.base_url.rstrip("/")
        if self.provider.startswith("openai") and not base.endswith("/v1"):
            return f"; did you mean --base-url {base}/v1?"
        if self.provider == "anthropic" and base.endswith("/v1"):
            return f"; did you mean --base-url {base[:-3]}? (without /v1 for Anthropic)"
        return ""


async def _print_turn(
    events: AsyncGenerator[TurnEvent[Any], None], out: TextIO, prefix: str
) -> None:
    """Write the text of a turn's answer chunks to ``out`` as they arrive (control
    characters escaped: model text is untrusted), after ``prefix`` and ending with a
    newline once any text came. The events are closed on every path before this
    returns. (Not ``print_stream``: a turn with tool calls is several answers, which
    one accumulator cannot merge.)"""
    started = False
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                text = event.chunk.text if event.chunk is not None else ""
                if text:
                    if not started:
                        out.write(prefix)
                        started = True
                    out.write(safe(text))
                    out.flush()
    finally:
        if started:
            out.write("\n")
            out.flush()


def _provider_line(exc: ProviderError) -> str:
    status = f" (HTTP {exc.status_code})" if exc.status_code is not None else ""
    return f"{type(exc).__name__}{status}: {_one_line(exc)}"


def _one_line(exc: BaseException | None) -> str:
    """``str(exc)`` with its whitespace runs (newlines of an HTML error page, say) as one
    space: every error the chat reports is one line."""
    return " ".join(str(exc).split())


def make_model(
    provider: str, model_name: str, base_url: str | None
) -> OpenAIChatModel | OpenAIResponsesModel | AnthropicModel | GeminiModel:
    """The adapter for ``provider``; its API key comes from ``$OPENAI_API_KEY`` or
    ``$ANTHROPIC_API_KEY`` or ``$GEMINI_API_KEY``."""
    try:
        if provider == "gemini":
            from scope.models.gemini import GeminiModel

            return GeminiModel(model_name, base_url=base_url)
        if provider == "anthropic":
            from scope.models.anthropic import AnthropicModel

            return AnthropicModel(model_name, base_url=base_url)
        if provider == "openai-responses":
            from scope.models.openai import OpenAIResponsesModel

            return OpenAIResponsesModel(model_name, base_url=base_url)
        from scope.models.openai import OpenAIChatModel

        return OpenAIChatModel(model_name, base_url=base_url)
    except ImportError as exc:
        raise CLIError(
            f"scope chat needs the {_NAMES[provider]} adapter's dependencies "
            f"({exc.name or exc}); "
            f"install them with: pip install 'scope-chat[{_EXTRAS[provider]}]'"
        ) from None


def run_chat(
    *,
    provider: str = "openai",
    model_name: str,
    base_url: str | None,
    store_url: str,
    conversation_id: str | None,
    system: str | None,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Run the chat loop until ``/exit``, end of input, or Ctrl-C at the prompt.

    The store and the model are opened once and live on one event loop
    (``asyncio.Runner``) for the whole session; stdin is read between turns on the main
    thread, so Ctrl-C always reaches the session.
    """
    if provider not in PROVIDERS:
        raise CLIError(f"unknown provider {provider!r} (known: {', '.join(PROVIDERS)})", 2)
    cid = ConversationID(conversation_id or f"chat-{uuid.uuid4().hex[:12]}")
    model = make_model(provider, model_name, base_url)
    prepare_sqlite_parent(store_url)
    with asyncio.Runner() as runner:
        store = runner.run(open_cli_store(store_url))
        try:
            session = _Session(store, model, cid, system, stdout, stderr, provider)
            view = runner.run(store.read_view(cid))
            if view.closed:
                state = runner.run(closed_as(store, cid))
                raise CLIError(
                    f"conversation {str(cid)!r} is {state}: nothing can be added to it; "
                    "start a new one by leaving out --conversation"
                )
            stored = list(view.messages)
            if conversation_id is None:
                session.note(f"new conversation: {cid}")
            else:
                count = len(stored)
                state = (
                    "new: nothing is stored under this id yet"
                    if count == 0
                    else f"resumed, {count} stored message{'s' if count != 1 else ''}"
                )
                session.note(f"conversation: {cid} ({state})")
            session.note(f"model: {model.model} at {model.base_url}; store: {store_url}")
            session.note("type a message; /exit or end of input quits")
            return _loop(runner, session, stdin)
        finally:
            try:
                runner.run(model.aclose())
            finally:
                runner.run(store.aclose())


def _loop(runner: asyncio.Runner, session: _Session, stdin: TextIO) -> int:
    interactive = _isatty(stdin)
    status = 0
    while True:
        if interactive:
            session.out.write("you> ")
            session.out.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the prompt quits, as an interrupt
            session.note("")
            status = 130
            break
        if not line:  # end of input
            break
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            break
        try:
            runner.run(session.turn(text))
        except KeyboardInterrupt:
            session.note("\n(interrupted: this answer was not saved)")
    if session.pending is not None and not runner.run(session.save_pending()):
        raise CLIError(
            "the last answer could not be saved; it is lost "
            f"(conversation {str(session.conversation_id)!r})"
        )
    if status == 0 and session.sent and not session.answered:
        session.note(
            f"scope: error: no message was answered ({session.sent} sent); see the errors above"
        )
        return 1
    return status
