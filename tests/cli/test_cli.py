"""The ``scope`` command line, driven as a user drives it: ``python -m scope ...``.

Subprocess tests check exit statuses and the lines a user sees; a few in-process tests
cover what a subprocess cannot reach cheaply (a demo check that fails, rendering,
the progress counter).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from scope import codec
from scope.chat import (
    Message,
    Role,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_delta_part,
    tool_call_part,
    tool_message,
    tool_result_part,
    user_message,
)
from scope.cli import _demo as demo_module
from scope.cli import main
from scope.cli._errors import CLIError
from scope.cli._export import HEADER, ConversationRecord
from scope.cli._history import ConversationLine, import_append_id, parse_import
from scope.cli._render import Progress, render_conversation, safe
from scope.cli._stores import chat_store_url, sqlite_url
from scope.codec import encode_messages
from scope.errors import InvalidBatchError
from scope.history import Batch, ConversationID
from scope.historystores.sqlite import SQLiteStore
from scope.jsonvalue import RawJSON
from scope.media import Media
from tests.helpers import subprocess_env

# ---------------------------------------------------------------------- helpers


def scope(
    tmp_path: pathlib.Path,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m scope *args`` in ``tmp_path``."""
    return subprocess.run(
        [sys.executable, "-m", "scope", *args],
        input=input if input is not None else b"",
        capture_output=True,
        cwd=tmp_path,
        env=subprocess_env(tmp_path, env),
        timeout=60,
        check=False,
    )


def err_lines(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    return proc.stderr.decode().splitlines()


def assert_one_line_error(proc: subprocess.CompletedProcess[bytes], status: int = 1) -> str:
    """The process failed with ``status`` and exactly one ``scope: error:`` line."""
    lines = err_lines(proc)
    assert proc.returncode == status, (proc.returncode, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("scope: error: "), lines
    assert "Traceback" not in proc.stderr.decode()
    return lines[0]


#: The closed line of the ``source`` fixture's cleared conversation.
GONE = b'{"closure":"cleared","conversation_id":"gone","length":2,"owner":null}'


def exported_ids(path: pathlib.Path) -> list[str]:
    """The ids of the open conversations of an export file (its header line first; the
    ``source`` fixture's closed line, which comes before them, checked and left out)."""
    header, *lines = path.read_bytes().splitlines()
    assert header == HEADER
    if lines and lines[0] == GONE:
        lines = lines[1:]
    return [json.loads(line)["conversation_id"] for line in lines]


def old_export(data: bytes) -> bytes:
    """A version 2 export as the old format writes it: one ``ConversationLine`` of the
    head path's messages per conversation (what scope 0.4 exported)."""
    records = [
        ConversationRecord.from_json(line)
        for line in data.splitlines()[1:]
        if b'"closure":' not in line  # a closed conversation: no messages to carry
    ]
    return b"".join(
        ConversationLine(
            r.conversation_id, [m for b in r.tree.head_path() for m in b.messages]
        ).to_json()
        + b"\n"
        for r in records
    )


def store_url(tmp_path: pathlib.Path, name: str) -> str:
    return sqlite_url(tmp_path / f"{name}.sqlite3")


async def _seed(
    path: pathlib.Path,
    conversations: Mapping[str, Sequence[Sequence[Message]]],
    prefix: str = "seed",
) -> None:
    async with await SQLiteStore.open(path) as store:
        for cid, batches in conversations.items():
            for index, messages in enumerate(batches):
                await store.append(Batch(cid, f"{prefix}-{index}", messages))


async def _read_all(path: pathlib.Path) -> dict[str, bytes]:
    async with await SQLiteStore.open(path) as store:
        return {
            str(cid): encode_messages(await store.read(cid)) for cid in await store.conversations()
        }


def seed(
    path: pathlib.Path,
    conversations: Mapping[str, Sequence[Sequence[Message]]],
    prefix: str = "seed",
) -> None:
    asyncio.run(_seed(path, conversations, prefix))


def read_all(path: pathlib.Path) -> dict[str, bytes]:
    """Every open conversation of a SQLite store: id -> canonical encoded messages."""
    return asyncio.run(_read_all(path))


def tricky_conversation() -> list[list[Message]]:
    """Two batches exercising every part kind, metadata number spellings and media."""
    first: list[Message] = [
        system_message("Be brief."),
        user_message(
            text_part("Wie spät ist es? \U0001f570\nzweite Zeile", {"x": RawJSON.parse("2.50")}),
            media_part(Media.from_bytes("image/png", b"\x89PN")),
            media_part(Media.from_uri("image/jpeg", "https://example.com/cat.jpg")),
        ),
        assistant_message(
            reasoning_part("think \x1b[31mred", b"sig"),
            tool_call_part("c1", "clock", '{"tz": "Europe/Berlin"'),  # malformed: kept verbatim
            tool_call_part("c2", "calc", '{"e": "1e3"}'),
        ),
        tool_message(
            ToolResult("c1", "clock", ToolOutput.of_text("bad arguments"), is_error=True),
            ToolResult("c2", "calc", ToolOutput.of_json('{"value": 1.0e3}')),
        ),
        Message(
            Role.ASSISTANT, (text_part("Es ist 12 Uhr."),), metadata={"cost": RawJSON.parse("0.10")}
        ),
    ]
    second: list[Message] = [user_message("Danke"), assistant_message("Bitte.")]
    return [first, second]


# ---------------------------------------------------------------------- demo


def test_demo_runs_offline_and_checks_itself(tmp_path: pathlib.Path) -> None:
    proc = scope(tmp_path, "demo")
    out = proc.stdout.decode()
    assert proc.returncode == 0, (out, proc.stderr.decode())
    assert proc.stderr == b""
    lines = out.splitlines()
    for expected in (
        "assistant: Let me look that up.",
        '  -> tool call get_weather [call_weather] {"city": "Lisbon"}',
        '  -> tool call calculator [call_calc] {"expression": "18.5 * 4"}',
        "  <- get_weather [call_weather] Lisbon: 21 C, sunny",
        "  <- calculator [call_calc] 74",
        "assistant: Lisbon is at 21 C and sunny right now, and 18.5 * 4 = 74.",
        "  ok: the model asked for two tool calls in one message",
        "  ok: the retry returns an equal receipt",
        "  ok: the history is unchanged (6 messages)",
        "  ok: the failed append surfaces as CommitError",
        "  ok: the retry did not call the model again (4 model requests in all)",
        "  ok: turn 3 is stored once, after the retry (8 messages)",
        "all 10 checks passed",
    ):
        assert expected in lines, expected
    # The default store is a fresh SQLite file under the temp dir; it holds the demo.
    store_line = next(line for line in lines if line.startswith("store:"))
    url = store_line.split(maxsplit=1)[1]
    assert url.startswith("sqlite:////") and str(tmp_path) in url
    cid = next(line for line in lines if line.startswith("conversation:")).split()[1]
    shown = scope(tmp_path, "history", "show", "--store", url, cid)
    assert shown.returncode == 0
    assert shown.stdout.decode().splitlines()[0] == f"conversation {cid} (8 messages)"


def test_demo_with_store_url_twice_keeps_two_conversations(tmp_path: pathlib.Path) -> None:
    url = "sqlite:///demo.sqlite3"  # relative to the working directory
    for _ in range(2):
        proc = scope(tmp_path, "demo", "--store", url)
        assert proc.returncode == 0, proc.stderr
        assert f"store:        {url}" in proc.stdout.decode().splitlines()
    stored = read_all(tmp_path / "demo.sqlite3")
    assert len(stored) == 2
    assert all(cid.startswith("demo-") for cid in stored)
    assert all(len(json.loads(data)) == 8 for data in stored.values())


def test_demo_store_in_a_missing_directory_is_one_line(tmp_path: pathlib.Path) -> None:
    proc = scope(tmp_path, "demo", "--store", "sqlite:///no/such/dir/demo.db")
    line = assert_one_line_error(proc)
    assert line.startswith("scope: error: SQLite open of 'no/such/dir/demo.db' failed")
    assert proc.stdout.decode().splitlines()[0].startswith("scope demo:")


def test_demo_failed_check_names_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A writer that never fails: the CommitError step cannot happen, and the demo says so.
    async def never_fails(self: Any, batch: Batch) -> Any:
        receipt = await self.inner.append(batch)
        self.accepted.append((batch, receipt))
        return receipt

    monkeypatch.setattr(demo_module._RecordingWriter, "append", never_fails)
    status = main(["demo", "--store", store_url(tmp_path, "d")])
    captured = capsys.readouterr()
    assert status == 1
    assert (
        captured.err
        == "scope: error: demo check failed: the failed append surfaces as CommitError\n"
    )
    assert "all 10 checks passed" not in captured.out


def test_demo_unexpected_error_fails_the_step(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every turn's batch under one append id: turn 2 conflicts with turn 1.
    from scope.history import Middleware

    def fixed_ids(reader: Any, writer: Any, conversation_id: str) -> Middleware:
        return Middleware(reader, writer, conversation_id, new_append_id=lambda: "same-id")

    monkeypatch.setattr(demo_module, "Middleware", fixed_ids)
    status = main(["demo", "--store", store_url(tmp_path, "d")])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith(
        "scope: error: demo check failed: turn 2 (replay) (unexpected CommitError:"
    )
    assert err.count("\n") == 1


def test_demo_calculator_refuses_anything_but_arithmetic() -> None:
    assert demo_module.calculator({"expression": "(1 + 2) * 3 / 2 - -1"}) == "5.5"
    for bad in ("__import__('os')", "2 ** 1000", "True + 1", "x"):
        with pytest.raises(ValueError):
            demo_module.calculator({"expression": bad})
    result = demo_module._run_tool("c", "calculator", '{"expression": "1/0"}')
    assert result.is_error and result.output.text() == "error: float division by zero"


# ---------------------------------------------------------------------- export / import


@pytest.fixture
def source(tmp_path: pathlib.Path) -> pathlib.Path:
    """A SQLite store with three conversations, one of them cleared, one tricky."""
    path = tmp_path / "source.sqlite3"
    seed(
        path,
        {
            "tricky": tricky_conversation(),
            "plain": [[user_message("hi"), assistant_message("hello")]],
            "gone": [[user_message("bye"), assistant_message("ciao")]],
        },
    )

    async def clear() -> None:
        async with await SQLiteStore.open(path) as store:
            await store.clear("gone")

    asyncio.run(clear())
    return path


def test_export_import_reproduces_every_conversation(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    exported = tmp_path / "export.jsonl"
    proc = scope(tmp_path, "history", "export", "--store", sqlite_url(source), "-o", str(exported))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b""
    assert err_lines(proc) == [f"exported 3 conversations to {exported}"]  # stderr not a tty
    assert exported_ids(exported) == ["plain", "tricky"]
    lines = exported.read_bytes().splitlines()
    assert lines[1] == GONE
    assert b'"text":"Wie sp\xc3\xa4t ist es? \xf0\x9f\x95\xb0\\nzweite Zeile"' in lines[3]
    assert b'"x":2.50' in lines[3] and b'"cost":0.10' in lines[3] and b"1.0e3" in lines[3]

    target = tmp_path / "target.sqlite3"
    proc = scope(tmp_path, "history", "import", "--store", sqlite_url(target), str(exported))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "imported 3, already present 0, failed 0 (of 3 conversations)\n"
    assert read_all(target) == read_all(source)  # byte-equal canonical messages

    # Export of the target equals the export of the source, byte for byte (stdout form),
    # but for the stored times: the target's batches were stored by the import.
    again = scope(tmp_path, "history", "export", "--store", sqlite_url(target))
    assert again.returncode == 0
    assert again.stderr == b""

    def untimed(data: bytes) -> bytes:
        return re.sub(rb'"created":[^,]*,', b"", data)

    assert untimed(again.stdout) == untimed(exported.read_bytes())


def test_export_lines_are_the_canonical_conversation_record(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    """The first line is the header; each other line is, byte for byte, what
    ``ConversationRecord.to_json`` writes of the conversation's tree and meta (sorted
    keys, each batch's stored canonical messages) and reads back."""
    proc = scope(tmp_path, "history", "export", "--store", sqlite_url(source))
    assert proc.returncode == 0, proc.stderr
    header, gone, *lines = proc.stdout.splitlines()
    assert header == b'{"format":"scope-history-export","version":3}'
    assert gone == GONE
    stored = read_all(source)
    assert len(lines) == len(stored) == 2

    async def records() -> list[ConversationRecord]:
        async with await SQLiteStore.open(source) as store:
            return [
                ConversationRecord(cid, await store.read_tree(cid), await store.read_meta(cid))
                for cid in await store.conversations()
            ]

    for line, record in zip(lines, asyncio.run(records()), strict=True):
        assert line == record.to_json()
        decoded = ConversationRecord.from_json(line)
        assert decoded == record and decoded.to_json() == line
        flat = [m for b in record.tree.head_path() for m in b.messages]
        assert encode_messages(flat) == stored[record.conversation_id]
        assert line.startswith(b'{"batches":[{"created":')
        head = record.head_id().encode()
        assert line.endswith(
            b'"expires_at":null,"head":"' + head + b'","moves":[],"owner":null,"retained":false}'
        )


def test_conversation_line_is_a_checked_value() -> None:
    line = ConversationLine("c", [user_message("hi")])
    assert type(line.conversation_id) is ConversationID and line.messages == (user_message("hi"),)
    assert line.batch("a1") == Batch("c", "a1", [user_message("hi")])
    with pytest.raises(InvalidBatchError, match=r"^a batch needs at least one message$"):
        ConversationLine("c", [])
    with pytest.raises(InvalidBatchError, match=r"^conversation_id: conversation id ' c' must"):
        ConversationLine(" c", [user_message("hi")])
    with pytest.raises(InvalidBatchError, match=r"^conversation_id: expected a string$"):
        ConversationLine(7, [user_message("hi")])  # type: ignore[arg-type]
    delta = assistant_message(tool_call_delta_part("t1", "f", "{"))
    with pytest.raises(InvalidBatchError, match=r"^messages\[0\]\.parts\[0\]: a stored"):
        ConversationLine("c", [delta])
    # The exact reader keeps a number token as a str subclass: still not a string.
    with pytest.raises(InvalidBatchError, match=r"^conversation_id: expected a string$"):
        codec.from_json(b'{"messages": [], "conversation_id": 7}', ConversationLine)
    with pytest.raises(InvalidBatchError, match=r"^invalid JSON: "):
        codec.from_json(b"{", ConversationLine)


def test_old_format_import_twice_is_a_no_op(tmp_path: pathlib.Path, source: pathlib.Path) -> None:
    exported = tmp_path / "export.jsonl"
    exported.write_bytes(
        old_export(scope(tmp_path, "history", "export", "--store", sqlite_url(source)).stdout)
    )
    target = tmp_path / "target.sqlite3"
    first = scope(tmp_path, "history", "import", "--store", sqlite_url(target), str(exported))
    assert first.returncode == 0
    after_first = read_all(target)
    second = scope(tmp_path, "history", "import", "--store", sqlite_url(target), str(exported))
    assert second.returncode == 0, second.stderr
    assert (
        second.stdout.decode() == "imported 0, already present 2, failed 0 (of 2 conversations)\n"
    )
    assert read_all(target) == after_first
    # Importing into the store the file came from appends nothing either.
    before = read_all(source)
    back = scope(tmp_path, "history", "import", "--store", sqlite_url(source), str(exported))
    assert back.returncode == 0
    assert read_all(source) == before


def test_old_format_reimport_after_the_conversation_went_on_is_a_no_op(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    exported = tmp_path / "export.jsonl"
    exported.write_bytes(
        old_export(scope(tmp_path, "history", "export", "--store", sqlite_url(source)).stdout)
    )
    target = tmp_path / "target.sqlite3"
    scope(
        tmp_path,
        "history",
        "import",
        "--store",
        sqlite_url(target),
        "-",
        input=exported.read_bytes(),
    )
    seed(target, {"plain": [[user_message("more")], [assistant_message("sure")]]})
    before = read_all(target)
    proc = scope(tmp_path, "history", "import", "--store", sqlite_url(target), str(exported))
    # "plain" now holds more than the line: the import id's batch is found, not re-added.
    assert proc.returncode == 0, proc.stderr
    assert read_all(target) == before


def test_old_format_import_back_into_the_source_after_it_went_on_duplicates_nothing(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    exported = tmp_path / "export.jsonl"
    exported.write_bytes(
        old_export(scope(tmp_path, "history", "export", "--store", sqlite_url(source)).stdout)
    )
    later = [[user_message("and now?"), assistant_message("still here")]]
    seed(source, {"plain": later}, prefix="later")
    before = read_all(source)
    proc = scope(tmp_path, "history", "import", "--store", sqlite_url(source), str(exported))
    # The stored history starts with the exported messages: importing them again would
    # only duplicate them, so both lines count as already present.
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "imported 0, already present 2, failed 0 (of 2 conversations)\n"
    assert read_all(source) == before


def test_old_format_tampered_line_is_a_conflict(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    exported = tmp_path / "export.jsonl"
    exported.write_bytes(
        old_export(scope(tmp_path, "history", "export", "--store", sqlite_url(source)).stdout)
    )
    target = tmp_path / "target.sqlite3"
    assert (
        scope(
            tmp_path, "history", "import", "--store", sqlite_url(target), str(exported)
        ).returncode
        == 0
    )
    before = read_all(target)
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(exported.read_bytes().replace(b'"text":"hello"', b'"text":"HELLO"'))
    proc = scope(tmp_path, "history", "import", "--store", sqlite_url(target), str(tampered))
    line = assert_one_line_error(proc)
    assert line == (
        f"scope: error: {tampered}:1: conversation 'plain' was imported before with other "
        "messages (append conflict); nothing appended"
    )
    assert proc.stdout.decode() == "imported 0, already present 1, failed 1 (of 2 conversations)\n"
    assert read_all(target) == before  # nothing half-written


def test_import_into_a_cleared_conversation_fails(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    line = ConversationLine("gone", [user_message("bye"), assistant_message("ciao")]).to_json()
    proc = scope(tmp_path, "history", "import", "--store", sqlite_url(source), "-", input=line)
    assert assert_one_line_error(proc) == (
        "scope: error: <stdin>:1: conversation 'gone' is cleared; nothing appended"
    )


GOOD = ConversationLine("fresh", [user_message("hi"), assistant_message("hello")]).to_json()


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        (b'{"conversation_id": "x", "messages": [', "invalid JSON: Expecting value at line 1"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"conversation_id": "x"}', "expected the keys conversation_id and messages"),
        (b'{"conversation_id": 7, "messages": []}', "conversation_id: expected a string"),
        (b'{"conversation_id": " x", "messages": []}', "conversation_id: conversation id"),
        (b'{"conversation_id": "x", "messages": []}', "a batch needs at least one message"),
        (
            b'{"conversation_id": "x", "messages": [{"role": "user", '
            b'"parts": [{"kind": "nope"}]}]}',
            "messages[0]: parts[0].kind: ",
        ),
        (
            b'{"conversation_id": "x", "messages": [{"role": "user", '
            b'"parts": [], "a": 1, "a": 2}]}',
            "invalid JSON: duplicate member name 'a'",
        ),
        (GOOD, "conversation 'fresh' already appears on line 1"),
    ],
)
def test_malformed_line_aborts_before_anything_is_appended(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], second: bytes, problem: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(GOOD + b"\n\n" + second + b"\n")
    with pytest.raises(CLIError) as info:
        parse_import(path.read_bytes(), str(path))
    assert str(info.value).startswith(f"{path}:3: {problem}")
    target = tmp_path / "target.sqlite3"
    args = ("history", "import", "--store", sqlite_url(target), str(path))
    if problem.startswith("invalid JSON: Expecting") or problem == "messages[0]: parts[0].kind: ":
        # The cases the issue names run as a user runs them; the rest in-process (fast).
        line = assert_one_line_error(scope(tmp_path, *args))
    else:
        assert main(list(args)) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        (line,) = captured.err.splitlines()
    assert line.startswith(f"scope: error: {path}:3: {problem}")
    assert line.endswith("; nothing was imported")
    assert not target.exists() or read_all(target) == {}


def test_import_append_id_depends_on_the_conversation_alone() -> None:
    a = parse_import(ConversationLine("c", [user_message("one")]).to_json(), "f")[0].batch
    b = parse_import(ConversationLine("c", [user_message("two")]).to_json(), "f")[0].batch
    assert a.id == b.id == import_append_id("c")
    assert a.digest != b.digest
    assert import_append_id("c") != import_append_id("d")


def test_import_missing_file(tmp_path: pathlib.Path) -> None:
    proc = scope(tmp_path, "history", "import", "--store", store_url(tmp_path, "t"), "nope.jsonl")
    assert assert_one_line_error(proc) == (
        "scope: error: cannot read nope.jsonl: No such file or directory"
    )


def test_export_to_a_missing_directory_leaves_nothing(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    proc = scope(
        tmp_path, "history", "export", "--store", sqlite_url(source), "-o", "no/such/file.jsonl"
    )
    assert_one_line_error(proc)
    assert not (tmp_path / "no").exists()


# ---------------------------------------------------------------------- list / show / clear


def test_list_and_show(tmp_path: pathlib.Path, source: pathlib.Path) -> None:
    url = sqlite_url(source)
    listed = scope(tmp_path, "history", "list", "--store", url)
    assert listed.returncode == 0
    assert listed.stdout.decode().splitlines() == ["plain", "tricky"]

    shown = scope(tmp_path, "history", "show", "tricky", "--store", url)
    assert shown.returncode == 0, shown.stderr
    first, second = (
        Batch("tricky", f"seed-{i}", messages) for i, messages in enumerate(tricky_conversation())
    )
    assert shown.stdout.decode().splitlines() == [
        "conversation tricky (7 messages)",
        f"batch seed-0  {first.digest}",
        "[1] system",
        "    Be brief.",
        "[2] user",
        "    Wie spät ist es? \U0001f570",
        "        zweite Zeile",
        '        metadata {"x":2.50}',
        "    media image/png, 3 bytes",
        "    media image/jpeg, uri https://example.com/cat.jpg",
        "[3] assistant",
        "    (reasoning) think \\x1b[31mred [signature 3 bytes]",
        '    -> tool call clock [c1] {"tz": "Europe/Berlin"',
        '    -> tool call calc [c2] {"e": "1e3"}',
        "[4] tool",
        "    <- tool error clock [c1] bad arguments",
        '    <- tool result calc [c2] details {"value":1.0e3}',
        "[5] assistant",
        "    Es ist 12 Uhr.",
        '    metadata {"cost":0.10}',
        f"batch seed-1  {second.digest}",
        "[6] user",
        "    Danke",
        "[7] assistant",
        "    Bitte.",
    ]

    as_json = scope(tmp_path, "history", "show", "--json", "--store", url, "tricky")
    exported = scope(tmp_path, "history", "export", "--store", url).stdout.splitlines()
    # show --json is the old (version 1) line of the head path, which import still reads.
    record = ConversationRecord.from_json(exported[-1])
    flat = [m for b in record.tree.head_path() for m in b.messages]
    assert as_json.stdout.splitlines() == [ConversationLine("tricky", flat).to_json()]
    assert b"seed-0" not in as_json.stdout and first.digest.encode() not in as_json.stdout


def test_show_receipts_match_what_append_returned(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.sqlite3"
    batches = [
        Batch("c", "turn 1", [user_message("one"), assistant_message("1")]),
        Batch("c", "turn 2", [user_message("two"), assistant_message("2"), assistant_message("+")]),
    ]

    async def append() -> list[Any]:
        async with await SQLiteStore.open(path) as store:
            return [await store.append(batch) for batch in batches]

    receipts = asyncio.run(append())
    assert main(["history", "show", "--store", sqlite_url(path), "c"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("batch ")] == [
        f"batch {r.id}  {r.digest}" for r in receipts
    ]
    assert [line for line in lines if line.startswith("[")] == [
        "[1] user",
        "[2] assistant",
        "[3] user",
        "[4] assistant",
        "[5] assistant",
    ]


def test_list_and_export_skip_an_invalid_stored_id_and_exit_1(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    import sqlite3

    conn = sqlite3.connect(source, isolation_level=None)
    try:
        # Listed: open and holding messages (length 1), as a row scope wrote would be.
        conn.execute(
            "INSERT INTO scope_history_conversations (id, closed, length) VALUES ('bad\nid', 0, 1)"
        )
    finally:
        conn.close()
    url = sqlite_url(source)
    error = "scope: error: skipped stored conversation id 'bad\\nid': not a valid conversation id"

    listed = scope(tmp_path, "history", "list", "--store", url)
    assert listed.stdout.decode().splitlines() == ["plain", "tricky"]
    assert assert_one_line_error(listed).startswith(error)

    exported = scope(tmp_path, "history", "export", "--store", url, "-o", "out.jsonl")
    lines = err_lines(exported)
    assert exported.returncode == 1
    assert lines[0] == "exported 3 conversations to out.jsonl" and lines[1].startswith(error)
    assert len(lines) == 2 and "Traceback" not in exported.stderr.decode()
    assert exported_ids(tmp_path / "out.jsonl") == ["plain", "tricky"]


def test_export_goes_on_past_a_corrupt_conversation_and_exits_1(
    tmp_path: pathlib.Path, source: pathlib.Path
) -> None:
    import sqlite3

    conn = sqlite3.connect(source, isolation_level=None)
    try:  # "plain"'s bytes changed outside scope: its digest no longer matches
        conn.execute(
            "UPDATE scope_history_batches SET messages = CAST('[]' AS BLOB) "
            "WHERE conversation_id = 'plain'"
        )
    finally:
        conn.close()
    url = sqlite_url(source)
    exported = scope(tmp_path, "history", "export", "--no-create", "--store", url, "-o", "o.jsonl")
    assert exported.returncode == 1
    lines = err_lines(exported)
    assert lines[0] == "exported 2 conversations to o.jsonl"
    assert lines[1].startswith("scope: error: conversation 'plain' not exported: ")
    assert "is corrupt" in lines[1] and len(lines) == 2
    assert exported_ids(tmp_path / "o.jsonl") == ["tricky"]


def test_list_with_no_create_refuses_a_store_without_the_schema(tmp_path: pathlib.Path) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    proc = scope(
        tmp_path, "history", "list", "--no-create", "--store", sqlite_url(tmp_path / "empty.db")
    )
    assert "scope history migrate" in assert_one_line_error(proc)


def test_show_unknown_or_cleared(tmp_path: pathlib.Path, source: pathlib.Path) -> None:
    proc = scope(tmp_path, "history", "show", "--store", sqlite_url(source), "never")
    assert assert_one_line_error(proc) == (
        "scope: error: conversation 'never' has no messages (unknown)"
    )
    # A cleared conversation is named as cleared, not merely empty.
    proc = scope(tmp_path, "history", "show", "--store", sqlite_url(source), "gone")
    assert (
        assert_one_line_error(proc) == "scope: error: conversation 'gone' is cleared: no messages"
    )


def test_clear_needs_confirmation(tmp_path: pathlib.Path, source: pathlib.Path) -> None:
    url = sqlite_url(source)
    proc = scope(tmp_path, "history", "clear", "--store", url, "plain", input=b"y\n")
    # stdin is not a terminal: the answer is no, whatever it says.
    assert assert_one_line_error(proc) == (
        "scope: error: not confirmed; conversation 'plain' was not cleared "
        "(pass --yes to clear without asking)"
    )
    assert "plain" in read_all(source)
    proc = scope(tmp_path, "history", "clear", "--store", url, "plain", "--yes")
    assert proc.returncode == 0
    assert proc.stdout.decode() == "cleared conversation plain\n"
    assert "plain" not in read_all(source)


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
@pytest.mark.parametrize(("answer", "cleared"), [(b"y\n", True), (b"no\n", False), (b"", False)])
def test_clear_asks_on_a_terminal(
    tmp_path: pathlib.Path, source: pathlib.Path, answer: bytes, cleared: bool
) -> None:
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scope",
                "history",
                "clear",
                "--store",
                sqlite_url(source),
                "plain",
            ],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=subprocess_env(tmp_path),
        )
        os.close(slave)
        slave = -1
        if answer:
            os.write(master, answer)
        else:
            os.write(master, b"\x04")  # Ctrl-D: end of input on a terminal
        _, err = proc.communicate(timeout=60)
    finally:
        if slave != -1:
            os.close(slave)
        os.close(master)
    assert err.decode().startswith(
        "Clear conversation 'plain' (2 messages)? Its messages are deleted and it can never "
        "be written again. [y/N] "
    )
    assert proc.returncode == (0 if cleared else 1)
    assert ("plain" not in read_all(source)) is cleared


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("foo://x", "unsupported store URL scheme 'foo'"),
        ("no-scheme", "store URL has no scheme"),
        ("sqlite://host/x.db", "sqlite URL must have an empty host"),
    ],
)
def test_bad_store_url_is_one_line(tmp_path: pathlib.Path, url: str, message: str) -> None:
    proc = scope(tmp_path, "history", "list", "--store", url)
    assert assert_one_line_error(proc).startswith(f"scope: error: {message}")


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize(
    ("url", "driver"),
    [("redis://127.0.0.1:1/0", "redis"), ("postgresql://scope@127.0.0.1:1/x", "asyncpg")],
)
def test_unreachable_server_is_one_line(tmp_path: pathlib.Path, url: str, driver: str) -> None:
    if not _installed(driver):
        pytest.skip(f"{driver} is not installed")
    proc = scope(tmp_path, "history", "list", "--store", url)
    line = assert_one_line_error(proc)
    assert "(StoreError)" in line


def test_usage_errors_exit_2(tmp_path: pathlib.Path) -> None:
    assert assert_one_line_error(scope(tmp_path), 2) == (
        "scope: error: the following arguments are required: COMMAND (see 'scope --help')"
    )
    assert assert_one_line_error(scope(tmp_path, "history", "list"), 2) == (
        "scope: error: scope history list needs --store URL (or $SCOPE_STORE)"
    )
    line = assert_one_line_error(scope(tmp_path, "history", "show", "--store", "x", " a"), 2)
    assert "surrounding whitespace" in line
    assert_one_line_error(scope(tmp_path, "history", "frob"), 2)


def test_store_from_environment(tmp_path: pathlib.Path, source: pathlib.Path) -> None:
    proc = scope(tmp_path, "history", "list", env={"SCOPE_STORE": sqlite_url(source)})
    assert proc.returncode == 0
    assert proc.stdout.decode().splitlines() == ["plain", "tricky"]


def test_help_and_version(tmp_path: pathlib.Path) -> None:
    top = scope(tmp_path, "--help")
    assert top.returncode == 0
    assert all(word in top.stdout.decode() for word in ("demo", "chat", "history"))
    show = scope(tmp_path, "history", "show", "--help")
    assert "starts with its receipt, a line 'batch <append id> <digest>'" in " ".join(
        show.stdout.decode().split()
    )
    assert scope(tmp_path, "--version").stdout.decode().startswith("scope ")
    chat_help = " ".join(scope(tmp_path, "chat", "--help").stdout.decode().split())
    assert "else sqlite:///$XDG_DATA_HOME/scope/chat.sqlite3, i.e." in chat_help
    assert "sqlite:// " not in chat_help


def test_console_script(tmp_path: pathlib.Path) -> None:
    script = pathlib.Path(sys.executable).with_name("scope")
    if not script.exists():
        pytest.skip("the scope console script is not installed next to this Python")
    proc = subprocess.run(
        [str(script), "--version"], capture_output=True, env=subprocess_env(tmp_path), check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith(b"scope ")


# ---------------------------------------------------------------------- in-process units


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_on_a_terminal_only() -> None:
    tty = _Terminal()
    progress = Progress(tty, "imported", 3)
    for _ in range(3):
        progress.step()
    progress.done()
    assert tty.getvalue() == "\rimported 1/3\rimported 2/3\rimported 3/3\n"
    plain = io.StringIO()
    quiet = Progress(plain, "imported", 3)
    quiet.step()
    quiet.done()
    assert plain.getvalue() == ""


def test_safe_escapes_terminal_controls() -> None:
    assert safe("a\x1b[2Jb\tc\nd\x7f\x9b") == "a\\x1b[2Jb\tc\nd\\x7f\\x9b"


def test_render_tool_output_with_media() -> None:
    output = ToolOutput((text_part("see"), media_part(Media.from_reference("image/png", "f-1"))))
    message = tool_message(ToolResult("t", "snap", output))
    assert render_conversation([message]) == [
        "[1] tool",
        "    <- tool result snap [t] see",
        "        media image/png, ref f-1",
    ]
    empty = Message(Role.TOOL, (tool_result_part(ToolResult("t", "noop")),))
    assert render_conversation([empty], first=5)[1] == "    <- tool result noop [t] (empty output)"


def test_chat_store_default_location(tmp_path: pathlib.Path) -> None:
    assert chat_store_url({"SCOPE_STORE": "redis://h"}) == "redis://h"
    assert chat_store_url({"XDG_DATA_HOME": str(tmp_path)}) == sqlite_url(
        tmp_path / "scope" / "chat.sqlite3"
    )
    home = pathlib.Path.home() / ".local" / "share" / "scope" / "chat.sqlite3"
    assert chat_store_url({"XDG_DATA_HOME": "relative"}) == sqlite_url(home)
    assert chat_store_url({}) == sqlite_url(home)


@pytest.mark.parametrize("action", [["list"], ["show", "c1"], ["export"]])
def test_reading_a_missing_sqlite_file_refuses_and_creates_nothing(
    tmp_path: pathlib.Path, action: list[str]
) -> None:
    proc = scope(tmp_path, "history", *action, "--store", "sqlite:///histroy.db")
    line = assert_one_line_error(proc)
    assert f"no SQLite store at {str(tmp_path / 'histroy.db')!r}" in line
    assert "does not exist" in line
    assert not (tmp_path / "histroy.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_reading_an_existing_sqlite_file_still_works(tmp_path: pathlib.Path) -> None:
    asyncio.run(_seed(tmp_path / "h.db", {"c1": [[user_message("hi"), assistant_message("yo")]]}))
    proc = scope(tmp_path, "history", "list", "--store", "sqlite:///h.db")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"c1\n", b"")


@pytest.mark.parametrize("action", [["list"], ["import", "-"], ["clear", "c1", "--yes"]])
def test_a_missing_directory_is_named(tmp_path: pathlib.Path, action: list[str]) -> None:
    proc = scope(tmp_path, "history", *action, "--store", "sqlite:///no/such/dir/h.db")
    line = assert_one_line_error(proc)
    assert f"directory {str(tmp_path / 'no' / 'such' / 'dir')!r} does not exist" in line
    assert not (tmp_path / "no").exists()


def test_writing_commands_still_create_a_missing_sqlite_file(tmp_path: pathlib.Path) -> None:
    proc = scope(tmp_path, "history", "migrate", "--store", "sqlite:///new.db")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "new.db").exists()
