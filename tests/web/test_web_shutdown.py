"""A bounded drain (DESIGN §9, issue 43): the example service, run as its own uvicorn
process (tests/web_drain_service.py), gets SIGTERM while a turn streams.

- A turn still running after the grace period is stopped: its reader's stream ends
  with the protocol's error event (``SHUTDOWN_TEXT``), the process exits, and the
  store holds what ``keep_interrupted`` says (the partial answer marked
  ``scope/interrupted`` = ``"cancelled"``, or nothing).
- A turn that ends within the grace period ends as usual: its finish, stored whole.

No assertion here is about elapsed time: each wait (the stream, the process) has a
generous timeout that only guards against a hang.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import orjson
import pytest

from scope.historystores.sqlite import SQLiteStore
from scope.web import SHUTDOWN_TEXT
from tests.helpers import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVICE = ROOT / "tests" / "web_drain_service.py"
#: Seconds any one wait may take before the test calls it a hang (a guard, not a bound
#: the service must meet).
GUARD = 120.0
CHAT = "chat-drain"


@contextlib.contextmanager
def _service(tmp_path: pathlib.Path, *, keep: bool, grace: float) -> Iterator[Any]:
    """The service process; yields ``(process, base URL, database, release file)``."""
    db = tmp_path / "chats.db"
    release = tmp_path / "release"
    process = subprocess.Popen(
        [sys.executable, str(SERVICE), str(db), "1" if keep else "0", str(grace), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(tmp_path),
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip():
            process.wait(timeout=GUARD)
            assert process.stderr is not None
            pytest.fail(f"the service did not start: {process.stderr.read().decode()}")
        yield process, f"http://127.0.0.1:{int(line)}", db, release
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=GUARD)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _request(protocol: str) -> tuple[str, bytes]:
    if protocol == "ui":
        message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Talk"}]}
        return "/api/chat", orjson.dumps({"id": CHAT, "messages": [message]})
    run = {
        "threadId": CHAT,
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "Talk"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }
    return "/api/agui", orjson.dumps(run)


def _events(lines: list[str]) -> list[Any]:
    """The SSE ``data:`` payloads, decoded (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def _is_delta(event: Any) -> bool:
    return isinstance(event, dict) and event.get("type") in ("text-delta", "TEXT_MESSAGE_CONTENT")


def _turn_under_sigterm(
    process: Any, base: str, protocol: str, after_signal: Any = None
) -> list[Any]:
    """Post one turn, send SIGTERM once its answer streams, call ``after_signal``, and
    read the stream to its end; the stream's events. A service that never stops is
    killed ``GUARD`` seconds after the signal (its stream then ends without the
    protocol's end, which the callers' assertions catch)."""
    path, body = _request(protocol)
    timeout = httpx.Timeout(GUARD)
    lines: list[str] = []
    signalled = False
    hang = threading.Timer(GUARD, process.kill)
    with (
        contextlib.ExitStack() as stack,
        httpx.Client(base_url=base, timeout=timeout) as client,
        client.stream(
            "POST", path, content=body, headers={"content-type": "application/json"}
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            lines.append(line)
            if not signalled and line.startswith("data: ") and _is_delta(_events([line])[0]):
                signalled = True
                process.send_signal(signal.SIGTERM)
                hang.start()
                stack.callback(hang.cancel)
                if after_signal is not None:
                    after_signal()
    assert signalled, "the answer never streamed"
    return _events(lines)


def _exited(process: Any) -> None:
    process.wait(timeout=GUARD)
    # uvicorn re-raises the signal it handled once it has shut down.
    assert process.returncode in (0, -signal.SIGTERM), process.stderr.read().decode()


def _stored(db: pathlib.Path) -> Any:
    async def read() -> Any:
        async with await SQLiteStore.open(db) as store:
            return await store.read_view(CHAT)

    return anyio.run(read)


def _error_end(protocol: str, events: list[Any]) -> None:
    if protocol == "ui":
        assert events[-2:] == [{"type": "error", "errorText": SHUTDOWN_TEXT}, "[DONE]"]
        assert not any(isinstance(e, dict) and e["type"] == "finish" for e in events)
    else:
        assert events[-1] == {"type": "RUN_ERROR", "message": SHUTDOWN_TEXT}
        assert not any(isinstance(e, dict) and e["type"] == "RUN_FINISHED" for e in events)


@pytest.mark.parametrize(
    ("protocol", "keep"), [("ui", True), ("ui", False), ("agui", True), ("agui", False)]
)
def test_sigterm_stops_a_long_turn_after_the_grace_period(
    tmp_path: pathlib.Path, protocol: str, keep: bool
) -> None:
    with _service(tmp_path, keep=keep, grace=0.5) as (process, base, db, _):
        events = _turn_under_sigterm(process, base, protocol)
        _error_end(protocol, events)
        _exited(process)
    said = "".join(
        e.get("delta", "")
        for e in events
        if _is_delta(e)  # the words the reader got before the turn was stopped
    )
    assert said.startswith("word0 ")
    view = _stored(db)
    if not keep:
        assert view.messages == ()  # a stopped turn stores nothing
        return
    user, answer = view.messages
    assert user.text == "Talk"
    assert answer.metadata.decode("scope/interrupted") == "cancelled"
    # The partial answer: what the model had said when it was stopped (the reader may
    # have got less of it, never more).
    assert answer.text.startswith(said)
    assert "done." not in answer.text


@pytest.mark.parametrize("protocol", ["ui", "agui"])
def test_a_turn_that_ends_within_the_grace_period_is_stored_whole(
    tmp_path: pathlib.Path, protocol: str
) -> None:
    with _service(tmp_path, keep=True, grace=GUARD) as (process, base, db, release):
        port = int(base.rsplit(":", 1)[1])

        def once_shutting_down() -> None:
            # The server stops listening when its shutdown (and the drain) begins; only
            # then may the turn end, so it ends within the grace period, not before.
            for _ in range(int(GUARD * 20)):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        pass
                except OSError:
                    break
                anyio.run(anyio.sleep, 0.05)
            else:
                pytest.fail("the service kept listening after SIGTERM")
            release.touch()

        events = _turn_under_sigterm(process, base, protocol, once_shutting_down)
        _exited(process)
    if protocol == "ui":
        assert events[-1] == "[DONE]"
        assert events[-2]["type"] == "finish"
    else:
        assert events[-1]["type"] == "RUN_FINISHED"
    assert not any(isinstance(e, dict) and e["type"] in ("error", "RUN_ERROR") for e in events)
    user, answer = _stored(db).messages
    assert user.text == "Talk"
    assert answer.text.endswith("done.")
    assert "scope/interrupted" not in answer.metadata
    assert os.path.exists(release)
