"""``scope chat`` against a loopback server speaking the OpenAI streaming wire format.

The chat runs as a subprocess (``python -m scope chat``) fed on stdin, exactly as a user
runs it; tests/openai_server.py is the server.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import selectors
import signal
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("httpx")

from scope.chat import Role
from scope.cli._stores import sqlite_url
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import subprocess_env
from tests.openai_server import OpenAIServer

_BASE = {"id": "chatcmpl-cli", "object": "chat.completion.chunk", "created": 1, "model": "m-1"}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {**_BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def answer(*pieces: str) -> dict[str, Any]:
    """A streamed answer whose text arrives in ``pieces``."""
    items: list[Any] = [_chunk({"role": "assistant", "content": ""})]
    items.extend(_chunk({"content": piece}) for piece in pieces)
    items.append(_chunk({}, "stop"))
    usage = {"prompt_tokens": 9, "completion_tokens": len(pieces), "total_tokens": 9 + len(pieces)}
    items.append({**_BASE, "choices": [], "usage": usage})
    items.append("[DONE]")
    return {"status": 200, "sse": items}


def _env(tmp_path: pathlib.Path) -> dict[str, str]:
    return subprocess_env(tmp_path, {"OPENAI_API_KEY": "sk-test"})


def chat(
    tmp_path: pathlib.Path, server: OpenAIServer, *args: str, input: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scope", "chat", "--base-url", server.base_url, *args],
        input=input,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=60,
        check=False,
    )


def stored(path: pathlib.Path) -> dict[str, list[tuple[Role, str]]]:
    async def read() -> dict[str, list[tuple[Role, str]]]:
        async with await SQLiteStore.open(path) as store:
            return {
                str(cid): [(m.role, m.text) for m in await store.read(cid)]
                for cid in await store.conversations()
            }

    return asyncio.run(read())


def sent(server: OpenAIServer) -> list[list[tuple[str, Any]]]:
    """(role, content) of every message of every request the server received."""
    return [[(m["role"], m["content"]) for m in body["messages"]] for body in server.bodies()]


def test_chat_streams_answers_and_keeps_history(tmp_path: pathlib.Path) -> None:
    with OpenAIServer() as server:
        server.script(answer("Hel", "lo ", "there!"), answer("Paris", "."))
        proc = chat(tmp_path, server, "--model", "m-1", input="Hi\n\nCapital of France?\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Hello there!\nParis.\n"
    notes = proc.stderr.splitlines()
    assert notes[0].startswith("new conversation: chat-")
    cid = notes[0].split(": ")[1]
    # The default store honours XDG_DATA_HOME.
    path = tmp_path / "xdg" / "scope" / "chat.sqlite3"
    assert notes[1] == f"model: m-1 at {server.base_url}; store: {sqlite_url(path)}"
    assert stored(path) == {
        cid: [
            (Role.USER, "Hi"),
            (Role.ASSISTANT, "Hello there!"),
            (Role.USER, "Capital of France?"),
            (Role.ASSISTANT, "Paris."),
        ]
    }
    # The second request replayed the first turn.
    assert sent(server) == [
        [("user", "Hi")],
        [("user", "Hi"), ("assistant", "Hello there!"), ("user", "Capital of France?")],
    ]
    assert all(body["stream"] is True and body["model"] == "m-1" for body in server.bodies())


def test_chat_escapes_terminal_control_characters_in_answers(tmp_path: pathlib.Path) -> None:
    with OpenAIServer() as server:
        server.script(answer("red: \x1b[31mX\x1b[0m", " bell\x07"))
        proc = chat(tmp_path, server, input="colours?\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "red: \\x1b[31mX\\x1b[0m bell\\x07\n"
    # The stored answer keeps the model's exact text; only the terminal sees escapes.
    (turn,) = stored(tmp_path / "xdg" / "scope" / "chat.sqlite3").values()
    assert turn[1] == (Role.ASSISTANT, "red: \x1b[31mX\x1b[0m bell\x07")


def test_chat_resumes_a_conversation(tmp_path: pathlib.Path) -> None:
    url = sqlite_url(tmp_path / "chat.db")
    with OpenAIServer() as server:
        server.script(answer("One."), answer("Two."))
        first = chat(
            tmp_path, server, "--store", url, "--conversation", "trip", input="first\n/exit\nx\n"
        )
        assert first.returncode == 0, first.stderr
        assert (
            first.stderr.splitlines()[0]
            == "conversation: trip (new: nothing is stored under this id yet)"
        )
        second = chat(
            tmp_path,
            server,
            "--store",
            url,
            "--conversation",
            "trip",
            "--system",
            "Be terse.",
            input="second\n",
        )
    assert second.returncode == 0, second.stderr
    assert second.stdout == "Two.\n"
    assert second.stderr.splitlines()[0] == "conversation: trip (resumed, 2 stored messages)"
    assert sent(server)[1] == [
        ("system", "Be terse."),
        ("user", "first"),
        ("assistant", "One."),
        ("user", "second"),
    ]
    assert [text for _, text in stored(tmp_path / "chat.db")["trip"]] == [
        "first",
        "One.",
        "second",
        "Two.",
    ]


def test_chat_provider_error_keeps_the_session(tmp_path: pathlib.Path) -> None:
    url = sqlite_url(tmp_path / "chat.db")
    refused = {
        "status": 400,
        "json": {"error": {"message": "context too long", "type": "invalid_request_error"}},
    }
    with OpenAIServer() as server:
        server.script(refused, answer("Fine."))
        proc = chat(tmp_path, server, "--store", url, input="too long\nshort\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Fine.\n"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("scope: error:")]
    assert len(errors) == 1
    assert errors[0].startswith("scope: error: BadRequestError (HTTP 400): ")
    assert errors[0].endswith("(message not saved; send it again)")
    (history,) = stored(tmp_path / "chat.db").values()
    assert history == [(Role.USER, "short"), (Role.ASSISTANT, "Fine.")]


def test_chat_errors_with_a_multi_line_message_are_one_line(tmp_path: pathlib.Path) -> None:
    # Provider messages (and HTML error pages) hold newlines; the chat's error is one line.
    refused = {
        "status": 400,
        "json": {"error": {"message": "bad request\n  details here", "type": "x"}},
    }
    with OpenAIServer() as server:
        server.script(refused)
        proc = chat(tmp_path, server, "--store", sqlite_url(tmp_path / "chat.db"), input="hi\n")
    assert proc.returncode == 1, proc.stderr  # its only message failed
    (error,) = [line for line in proc.stderr.splitlines() if "bad request" in line]
    assert error.startswith("scope: error: BadRequestError (HTTP 400): ")
    assert "bad request details here" in error
    assert error.endswith("(message not saved; send it again)")


def test_chat_on_a_cleared_conversation_stops_with_one_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "chat.db"

    async def close() -> None:
        async with await SQLiteStore.open(path) as store:
            await store.clear("old")

    asyncio.run(close())
    with OpenAIServer() as server:
        server.script(answer("Lost."))
        proc = chat(
            tmp_path, server, "--store", sqlite_url(path), "--conversation", "old", input="hi\n"
        )
        # Refused at start, before any model call (DESIGN §6b): nothing is generated.
        assert server.requests == []
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "scope: error: conversation 'old' is cleared: nothing can be added to it; start a "
        "new one by leaving out --conversation"
    ]


def test_chat_prints_each_chunk_as_it_arrives(tmp_path: pathlib.Path) -> None:
    # The server sends one chunk and then holds the stream open: the chunk must already
    # be on stdout while the answer is still unfinished.
    first = _chunk({"role": "assistant", "content": "Thinking"})
    with OpenAIServer() as server:
        server.script({"status": 200, "sse": [first, {"$hold": True}]})
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "scope", "chat", "--base-url", server.base_url),
                *("--store", sqlite_url(tmp_path / "chat.db")),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(tmp_path),
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"hello\n")
            proc.stdin.flush()
            seen = b""
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                while b"Thinking" not in seen:
                    if not selector.select(timeout=30):
                        break  # a hang guard, not a timing assertion
                    data = os.read(proc.stdout.fileno(), 4096)
                    if not data:
                        break
                    seen += data
            assert seen == b"Thinking"
            assert proc.poll() is None  # still streaming
        finally:
            proc.kill()
            proc.wait(30)
            proc.stdin.close()
            proc.stdout.close()


def test_chat_without_the_adapter_dependencies_is_one_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scope.cli import main

    monkeypatch.setitem(sys.modules, "scope.models.openai", None)  # import fails
    status = main(["chat", "--store", sqlite_url(tmp_path / "c.db")])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("scope: error: scope chat needs the OpenAI adapter's dependencies")
    assert err.endswith("install them with: pip install 'scope-chat[openai]'\n")


def test_chat_session_reports_a_turn_lost_to_another_session_and_a_clear(
    tmp_path: pathlib.Path,
) -> None:
    """In process: another writer appends between the read and the commit (the answer is
    not saved, nothing is pending, the session goes on), then the conversation is cleared
    (the next message is refused before the model is called)."""
    import io

    from scope.chat import FinishReason, Output, Request, Response, assistant_message
    from scope.chat import user_message as user
    from scope.cli._chat import _Session
    from scope.cli._errors import CLIError
    from scope.history import Batch, ConversationID

    async def run() -> None:
        async with await SQLiteStore.open(tmp_path / "s.db") as store:

            class Interloper:
                calls = 0

                def stream(self, request: Request) -> Any:
                    Interloper.calls += 1
                    return self._stream()

                async def _stream(self) -> Any:
                    # Another session's turn lands while this answer is being generated.
                    other = Batch("c", "other", [user("elsewhere"), assistant_message("x")])
                    await store.append(other)
                    yield Response(Output(assistant_message("late"), FinishReason.STOP))

            out, err = io.StringIO(), io.StringIO()
            model: Any = Interloper()
            session = _Session(store, model, ConversationID("c"), None, out, err)
            await session.turn("hello")
            assert session.pending is None
            assert "another session added to this conversation" in err.getvalue()
            assert [m.text for m in await store.read("c")] == ["elsewhere", "x"]
            await store.clear("c")
            with pytest.raises(
                CLIError, match=r"^conversation .c. is cleared; the message was not sent; "
            ):
                await session.turn("again")
            assert Interloper.calls == 1

    asyncio.run(run())


def anthropic_answer(*pieces: str) -> dict[str, Any]:
    """A streamed Anthropic Messages answer whose text arrives in ``pieces``."""
    usage = {"input_tokens": 9, "output_tokens": 1}
    message = {
        "id": "msg_cli",
        "type": "message",
        "role": "assistant",
        "model": "claude-cli-1",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    items: list[Any] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    items.extend(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
        for p in pieces
    )
    items.append({"type": "content_block_stop", "index": 0})
    items.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": len(pieces)},
        }
    )
    items.append({"type": "message_stop"})
    return {"status": 200, "sse": items}


def test_chat_with_the_anthropic_provider(tmp_path: pathlib.Path) -> None:
    from tests.anthropic_server import AnthropicServer

    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith("ANTHROPIC_")}
    env["ANTHROPIC_API_KEY"] = "sk-ant-cli"
    with AnthropicServer() as server:
        server.script(anthropic_answer("Bon", "jour!"), anthropic_answer("Paris."))
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "scope", "chat", "--provider", "anthropic"),
                *("--base-url", server.base_url, "--model", "claude-cli-1"),
                *("--system", "Be terse."),
            ],
            input="Hi\nCapital of France?\n",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Bonjour!\nParis.\n"
    notes = proc.stderr.splitlines()
    cid = notes[0].split(": ")[1]
    assert notes[1].startswith(f"model: claude-cli-1 at {server.base_url}; store: ")
    path = tmp_path / "xdg" / "scope" / "chat.sqlite3"
    assert stored(path) == {
        cid: [
            (Role.USER, "Hi"),
            (Role.ASSISTANT, "Bonjour!"),
            (Role.USER, "Capital of France?"),
            (Role.ASSISTANT, "Paris."),
        ]
    }
    first, second = server.requests
    assert first.path == "/v1/messages" and first.headers["x-api-key"] == "sk-ant-cli"
    assert second.body["system"] == [{"type": "text", "text": "Be terse."}]
    assert [(m["role"], m["content"][0]["text"]) for m in second.body["messages"]] == [
        ("user", "Hi"),
        ("assistant", "Bonjour!"),
        ("user", "Capital of France?"),
    ]
    server.check_requests()


def gemini_answer(*pieces: str) -> dict[str, Any]:
    """A streamed Gemini answer whose text arrives in ``pieces`` (the last chunk an empty
    text part with the answer's signature, as Gemini 3 streams end)."""
    chunks: list[Any] = []
    for index, piece in enumerate([*pieces, ""]):
        part: dict[str, Any] = {"text": piece}
        candidate: dict[str, Any] = {"content": {"parts": [part], "role": "model"}, "index": 0}
        if index == len(pieces):
            part["thoughtSignature"] = "c2lnbmF0dXJl"
            candidate["finishReason"] = "STOP"
        chunks.append(
            {
                "candidates": [candidate],
                "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": index + 1},
                "modelVersion": "gemini-cli-1",
                "responseId": "cli",
            }
        )
    return {"status": 200, "sse": chunks}


def test_chat_with_the_gemini_provider(tmp_path: pathlib.Path) -> None:
    from tests.gemini_server import GeminiServer

    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith("GEMINI_")}
    env["GEMINI_API_KEY"] = "AIza-cli"
    with GeminiServer() as server:
        server.script(gemini_answer("Bon", "jour!"), gemini_answer("Paris."))
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "scope", "chat", "--provider", "gemini"),
                *("--base-url", server.base_url, "--model", "gemini-cli-1"),
                *("--system", "Be terse."),
            ],
            input="Hi\nCapital of France?\n",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Bonjour!\nParis.\n"
    cid = proc.stderr.splitlines()[0].split(": ")[1]
    path = tmp_path / "xdg" / "scope" / "chat.sqlite3"
    assert stored(path) == {
        cid: [
            (Role.USER, "Hi"),
            (Role.ASSISTANT, "Bonjour!"),
            (Role.USER, "Capital of France?"),
            (Role.ASSISTANT, "Paris."),
        ]
    }
    first, second = server.requests
    assert first.path == "/v1beta/models/gemini-cli-1:streamGenerateContent?alt=sse"
    assert first.headers["x-goog-api-key"] == "AIza-cli"
    assert second.body["systemInstruction"] == {"parts": [{"text": "Be terse."}]}
    assert second.body["contents"] == [
        {"role": "user", "parts": [{"text": "Hi"}]},
        {
            "role": "model",
            "parts": [{"text": "Bonjour!"}, {"text": "", "thoughtSignature": "c2lnbmF0dXJl"}],
        },
        {"role": "user", "parts": [{"text": "Capital of France?"}]},
    ]
    server.check_requests()


def test_chat_without_the_anthropic_adapter_is_one_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scope.cli import main

    monkeypatch.setitem(sys.modules, "scope.models.anthropic", None)  # import fails
    status = main(["chat", "--provider", "anthropic", "--store", sqlite_url(tmp_path / "c.db")])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("scope: error: scope chat needs the Anthropic adapter's dependencies")
    assert err.endswith("install them with: pip install 'scope-chat[anthropic]'\n")


def test_chat_refuses_an_unknown_provider(capsys: pytest.CaptureFixture[str]) -> None:
    from scope.cli import main

    assert main(["chat", "--provider", "cohere"]) == 2
    assert "invalid choice: 'cohere'" in capsys.readouterr().err


def test_piped_chat_whose_every_message_failed_exits_1(tmp_path: pathlib.Path) -> None:
    refused = {"status": 400, "json": {"error": {"message": "no", "type": "x"}}}
    with OpenAIServer() as server:
        server.script(refused, refused)
        url = sqlite_url(tmp_path / "chat.db")
        proc = chat(tmp_path, server, "--store", url, input="one\ntwo\n")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == (
        "scope: error: no message was answered (2 sent); see the errors above"
    )


def test_piped_chat_with_nothing_sent_exits_0(tmp_path: pathlib.Path) -> None:
    with OpenAIServer() as server:
        proc = chat(tmp_path, server, "--store", sqlite_url(tmp_path / "chat.db"), input="\n")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("provider", "suffix", "hint"),
    [
        ("openai", "", "; did you mean --base-url {root}/v1?"),
        ("anthropic", "/v1", "; did you mean --base-url {root}? (without /v1 for Anthropic)"),
        ("openai-responses", "", "; did you mean --base-url {root}/v1?"),
    ],
)
def test_a_404_names_the_base_url_it_most_likely_meant(
    tmp_path: pathlib.Path, provider: str, suffix: str, hint: str
) -> None:
    missing = {"status": 404, "json": {"error": {"message": "Not Found", "type": "x"}}}
    with OpenAIServer() as server:
        server.script(missing)
        root = server.base_url.removesuffix("/v1")
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "scope", "chat", "--provider", provider),
                *("--base-url", root + suffix, "--store", sqlite_url(tmp_path / "chat.db")),
            ],
            input="hi\n",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**_env(tmp_path), "ANTHROPIC_API_KEY": "sk-test"},
            timeout=60,
            check=False,
        )
    (error,) = [line for line in proc.stderr.splitlines() if "HTTP 404" in line]
    assert error.endswith(hint.format(root=root) + " (message not saved; send it again)")


def test_a_404_with_a_v1_base_url_gives_no_hint(tmp_path: pathlib.Path) -> None:
    missing = {"status": 404, "json": {"error": {"message": "no such model", "type": "x"}}}
    with OpenAIServer() as server:
        server.script(missing)
        proc = chat(tmp_path, server, "--store", sqlite_url(tmp_path / "chat.db"), input="hi\n")
    (error,) = [line for line in proc.stderr.splitlines() if "HTTP 404" in line]
    assert "did you mean" not in error


def test_ctrl_c_at_the_prompt_exits_130(tmp_path: pathlib.Path) -> None:
    with OpenAIServer() as server:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "scope", "chat", "--base-url", server.base_url),
                *("--store", sqlite_url(tmp_path / "chat.db")),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_env(tmp_path),
        )
        assert proc.stdin is not None and proc.stderr is not None
        try:
            seen = b""
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stderr, selectors.EVENT_READ)
                while b"quits\n" not in seen:  # the last start-up note: now at the prompt
                    if not selector.select(timeout=30):
                        break  # a hang guard, not a timing assertion
                    data = os.read(proc.stderr.fileno(), 4096)
                    if not data:
                        break
                    seen += data
            assert b"quits\n" in seen, seen
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
            assert server.requests == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            proc.stdin.close()
            proc.stderr.close()


def test_chat_session_says_when_another_session_holds_the_conversation(
    tmp_path: pathlib.Path,
) -> None:
    """Another session's turn holds the lease: the message is refused before the model
    is called, the session says why and goes on; once the lease is free it is answered."""
    import io

    from scope.chat import FinishReason, Output, Request, Response, assistant_message
    from scope.cli._chat import _Session
    from scope.history import ConversationID

    async def run() -> None:
        async with (
            await SQLiteStore.open(tmp_path / "s.db") as store,
            await SQLiteStore.open(tmp_path / "s.db") as other_session,
        ):

            class Model:
                calls = 0

                def stream(self, request: Request) -> Any:
                    Model.calls += 1
                    return self._stream()

                async def _stream(self) -> Any:
                    yield Response(Output(assistant_message("hi"), FinishReason.STOP))

            out, err = io.StringIO(), io.StringIO()
            model: Any = Model()
            session = _Session(store, model, ConversationID("c"), None, out, err)
            assert session.middleware.on_overlap == "reject"
            assert await other_session.acquire_turn("c", "other session", 30)
            await session.turn("hello")
            assert Model.calls == 0
            assert (
                "scope: error: another session holds conversation 'c' (its answer is being "
                "generated); the message was not sent"
            ) in err.getvalue()
            assert await other_session.release_turn("c", "other session")
            await session.turn("hello")
            assert Model.calls == 1
            assert [m.text for m in await store.read("c")] == ["hello", "hi"]

    asyncio.run(run())


def test_chat_with_the_openai_responses_provider(tmp_path: pathlib.Path) -> None:
    from tests.responses_server import ResponsesServer, load_transcript

    env = _env(tmp_path)
    env["OPENAI_API_KEY"] = "sk-cli"
    with ResponsesServer() as server:
        server.script(
            *load_transcript("stream_text"), *load_transcript("stream_reasoning_final_answer")
        )
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "scope", "chat", "--provider", "openai-responses"),
                # The transcripts answer as gpt-5-mini-2025-08-07: a snapshot of the model
                # asked for, so the stored answer's ids go back (DESIGN §6c).
                *("--base-url", server.base_url, "--model", "gpt-5-mini"),
                *("--system", "Be terse."),
            ],
            input="Hi\nWeather?\n",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Hello world!\nIt is 18°C and sunny in Paris.\n"
    notes = proc.stderr.splitlines()
    cid = notes[0].split(": ")[1]
    assert notes[1].startswith(f"model: gpt-5-mini at {server.base_url}; store: ")
    path = tmp_path / "xdg" / "scope" / "chat.sqlite3"
    assert stored(path) == {
        cid: [
            (Role.USER, "Hi"),
            (Role.ASSISTANT, "Hello world!"),
            (Role.USER, "Weather?"),
            (Role.ASSISTANT, "It is 18°C and sunny in Paris."),
        ]
    }
    first, second = server.requests
    assert first.path == "/v1/responses" and first.headers["authorization"] == "Bearer sk-cli"
    assert (first.body["model"], first.body["store"], first.body["stream"]) == (
        "gpt-5-mini",
        False,
        True,
    )
    assert [(item["role"], item.get("id")) for item in second.body["input"]] == [
        ("system", None),
        ("user", None),
        ("assistant", "msg_hello1"),
        ("user", None),
    ]
    server.check_requests()


def test_chat_answers_a_tool_call_with_an_error_result_and_saves_the_answer(
    tmp_path: pathlib.Path,
) -> None:
    """scope chat has no tools: a model that calls one is told so (an error result) and
    its next answer completes the turn, stored once with the call and the result."""
    import io

    from scope.chat import FinishReason, Output, Response, assistant_message, tool_call_part
    from scope.cli._chat import _Session
    from scope.history import ConversationID
    from scope.testing import ScriptedModel

    async def run() -> None:
        async with await SQLiteStore.open(tmp_path / "s.db") as store:
            call = tool_call_part("c1", "search", '{"q": "x"}')
            model: Any = ScriptedModel(
                Response(Output(assistant_message(call), FinishReason.TOOL_CALLS)),
                Response(Output(assistant_message("no tools, then"), FinishReason.STOP)),
            )
            out, err = io.StringIO(), io.StringIO()
            session = _Session(store, model, ConversationID("c"), None, out, err)
            await session.turn("find x")
            assert out.getvalue() == "no tools, then\n"
            assert session.answered == 1
            stored = await store.read("c")
            assert [m.role for m in stored] == [
                Role.USER,
                Role.ASSISTANT,
                Role.TOOL,
                Role.ASSISTANT,
            ]
            result = stored[2].tool_results[0]
            assert result.is_error
            assert result.output.text() == "there is no tool named 'search' (the tools: none)"

    asyncio.run(run())
