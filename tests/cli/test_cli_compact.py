"""``scope history compact`` against a loopback OpenAI-compatible server (DESIGN §6d).

The command runs as a subprocess (``python -m scope history compact``), exactly as a user
runs it; tests/openai_server.py is the summarizer.
"""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("httpx")

from scope.chat import Message, Role, assistant_message, user_message
from scope.cli._stores import sqlite_url
from scope.history import Batch, WindowReader
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import subprocess_env
from tests.openai_server import OpenAIServer


def _completion(text: str) -> dict[str, Any]:
    return {
        "status": 200,
        "json": {
            "id": "chatcmpl-sum",
            "object": "chat.completion",
            "created": 1,
            "model": "m-1",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
        },
    }


def _seed(path: pathlib.Path, turns: int) -> None:
    async def run() -> None:
        async with await SQLiteStore.open(path) as store:
            for i in range(turns):
                await store.append(
                    Batch("conv", f"t{i}", [user_message(f"q{i}"), assistant_message(f"a{i}")])
                )

    asyncio.run(run())


def _read(path: pathlib.Path) -> tuple[list[Message], list[Message]]:
    async def run() -> tuple[list[Message], list[Message]]:
        async with await SQLiteStore.open(path) as store:
            return await store.read("conv"), await WindowReader(store).read("conv")

    return asyncio.run(run())


def _compact(
    tmp_path: pathlib.Path, server: OpenAIServer, db: pathlib.Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "scope",
            "history",
            "compact",
            "conv",
            "--store",
            sqlite_url(db),
            "--base-url",
            server.base_url,
            "--model",
            "summ-1",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(tmp_path, {"OPENAI_API_KEY": "sk-test"}),
        timeout=60,
        check=False,
    )


def test_compact_appends_a_summary_and_a_second_run_has_nothing_to_do(
    tmp_path: pathlib.Path,
) -> None:
    db = tmp_path / "h.db"
    _seed(db, 4)
    with OpenAIServer() as server:
        server.script(_completion("They talked about q0 and q1."))
        done = _compact(tmp_path, server, db, "--keep-turns", "2")
        assert done.returncode == 0, done.stderr
        assert "a summary of its first 4 messages was appended" in done.stdout
        body = server.bodies()[0]
        assert body["model"] == "summ-1"
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        assert "q1" in body["messages"][1]["content"]
        assert "q2" not in body["messages"][1]["content"]
        again = _compact(tmp_path, server, db, "--keep-turns", "2")
        assert again.returncode == 0, again.stderr
        assert "nothing to compact" in again.stdout
        assert len(server.bodies()) == 1  # the model was not asked again
    stored, window = _read(db)
    assert len(stored) == 9  # nothing removed
    assert stored[-1].role is Role.SYSTEM
    assert stored[-1].metadata.decode("scope/compaction") == {"covers": 4}
    assert [m.text for m in window] == ["They talked about q0 and q1.", "q2", "a2", "q3", "a3"]


def test_compact_of_a_cleared_conversation_fails(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "h.db"
    _seed(db, 3)

    async def clear() -> None:
        async with await SQLiteStore.open(db) as store:
            await store.clear("conv")

    asyncio.run(clear())
    with OpenAIServer() as server:
        done = _compact(tmp_path, server, db)
        assert done.returncode == 1
        assert done.stderr == "scope: error: conversation 'conv' is cleared: nothing to compact\n"
        assert server.bodies() == []


def test_keep_turns_must_be_a_non_negative_integer(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "h.db"
    _seed(db, 1)
    with OpenAIServer() as server:
        done = _compact(tmp_path, server, db, "--keep-turns", "-1")
        assert done.returncode == 2
        assert "--keep-turns: must be at least 0, got -1" in done.stderr


def _compact_offline(
    tmp_path: pathlib.Path, db: pathlib.Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "scope",
            "history",
            "compact",
            "conv",
            "--store",
            sqlite_url(db),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(tmp_path, {}),  # no API key, no server: nothing to reach
        timeout=60,
        check=False,
    )


def test_compact_with_the_offline_summarizer_needs_no_network(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "h.db"
    _seed(db, 4)
    spec = "scope.testing:offline_summarizer"
    done = _compact_offline(tmp_path, db, "--summarizer", spec, "--keep-turns", "1")
    assert done.returncode == 0, done.stderr
    assert "a summary of its first 6 messages was appended" in done.stdout
    stored, window = _read(db)
    assert len(stored) == 9
    assert window[0].text == (
        "Earlier in this conversation (an extractive summary, made offline):\n"
        "- user: q0\n- assistant: a0\n- user: q1\n- assistant: a1\n- user: q2\n- assistant: a2"
    )
    assert [m.text for m in window[1:]] == ["q3", "a3"]
    both = _compact_offline(tmp_path, db, "--summarizer", spec, "--provider", "anthropic")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    url = _compact_offline(tmp_path, db, "--summarizer", spec, "--base-url", "http://x")
    assert url.returncode == 1
    assert "--summarizer replaces the provider: drop --base-url" in url.stderr


class NoArguments:
    """A Model class made without arguments."""

    async def call(self, request: Any) -> Any:
        raise AssertionError("not called here")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("scope.testing", "must be module:attribute"),
        (":offline_summarizer", "must be module:attribute"),
        ("scope.nowhere:x", "cannot import scope.nowhere"),
        ("scope.testing:nothing", "scope.testing has no nothing"),
        ("scope.testing:FunctionModel", r"FunctionModel\(\) failed: TypeError"),
        ("json:dumps", "is a function, not a scope.chat Model"),
        ("scope.testing:ScriptedModel.chunks", "not a scope.chat Model"),
    ],
)
def test_a_summarizer_spec_that_names_no_model_is_refused(spec: str, problem: str) -> None:
    from scope.cli._errors import CLIError
    from scope.cli._history import load_summarizer

    with pytest.raises(CLIError, match=problem):
        load_summarizer(spec)


def test_a_summarizer_spec_may_name_a_model_or_its_class() -> None:
    from scope.cli._history import load_summarizer
    from scope.testing import offline_summarizer

    assert load_summarizer("scope.testing:offline_summarizer") is offline_summarizer
    made = load_summarizer(f"{__name__}:NoArguments")
    assert type(made).__name__ == "NoArguments"
