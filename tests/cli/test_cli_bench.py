"""``scope bench``: the built-in turn, an export of the demo's store and a store URL on
every backend produce the table and a result file whose fields are the documented ones;
the floors are measured in the same run (rfc8785 reported as skipped when missing);
``--compare`` exits 1 past the threshold and 2 for a baseline it cannot use.

Tiny repeat counts everywhere (``--repeats 1 --warmup 0 --min-time 0``): nothing here
asserts a duration, only the shape of what is measured and reported.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from scope.cli import _stores, main
from scope.cli._bench import Settings, measure, run_bench
from scope.cli._turn import standard_turn
from scope.codec import encode_messages
from tests.helpers import batch, subprocess_env
from tests.servers import Backend, fresh_backend, over_backends

FAST = ["--repeats", "1", "--warmup", "0", "--min-time", "0"]
ROWS = [
    ("scope.encode.first", "scope", "encode"),
    ("scope.encode.cached", "scope", "encode"),
    ("scope.digest", "scope", "digest"),
    ("scope.decode", "scope", "decode"),
    ("floor.orjson.dumps", "floor", "encode"),
    ("floor.json.dumps", "floor", "encode"),
    ("floor.rfc8785", "floor", "encode"),
    ("floor.orjson.loads", "floor", "decode"),
]
ENCODE_FLOORS = {"floor.orjson.dumps", "floor.json.dumps", "floor.rfc8785"}
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def scope(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "scope", *args],
        input=b"",
        capture_output=True,
        cwd=tmp_path,
        env=subprocess_env(tmp_path),
        timeout=120,
        check=False,
    )


def one_error(proc: subprocess.CompletedProcess[bytes], status: int) -> str:
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == status, (proc.returncode, lines)
    assert len(lines) == 1 and lines[0].startswith("scope: error: "), lines
    return lines[0]


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_document(doc: dict[str, Any], *, rfc8785: bool = True) -> None:
    """Every field of a result file, as docs/cli.md describes it."""
    assert set(doc) == {"format", "version", "created", "environment", "source", "settings", "rows"}
    assert doc["format"] == "scope-bench" and doc["version"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", doc["created"])
    env = doc["environment"]
    assert set(env) == {
        "scope",
        "python",
        "implementation",
        "platform",
        "machine",
        "cpus",
        "orjson",
        "rfc8785",
    }
    import scope as scope_package

    assert env["scope"] == scope_package.__version__
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(env["rfc8785"], str) if rfc8785 else env["rfc8785"] is None
    source = doc["source"]
    assert set(source) == {"kind", "description", "conversations", "batches", "messages", "bytes"}
    assert source["kind"] in ("builtin", "file", "store")
    counts = ("conversations", "batches", "messages", "bytes")
    assert all(isinstance(source[k], int) and source[k] > 0 for k in counts)
    assert set(doc["settings"]) == {"repeats", "warmup", "min_time"}
    assert [(r["name"], r["kind"], r["operation"]) for r in doc["rows"]] == ROWS
    for row in doc["rows"]:
        assert set(row) == {
            "name",
            "kind",
            "operation",
            "unit",
            "min",
            "median",
            "per_message",
            "per_batch",
            "repeats",
            "number",
            "bytes",
            "ratios",
            "skipped",
        }
        assert row["unit"] == "s"
        if row["skipped"] is not None:
            assert row["name"] == "floor.rfc8785" and not rfc8785
            assert row["min"] is None and row["median"] is None and row["bytes"] is None
            assert row["ratios"] == {} and row["repeats"] == 0
            continue
        assert number(row["min"]) and number(row["median"]) and 0 < row["min"] <= row["median"]
        assert row["repeats"] == doc["settings"]["repeats"] and row["number"] >= 1
        assert row["per_message"]["median"] == pytest.approx(row["median"] / source["messages"])
        assert row["per_batch"]["min"] == pytest.approx(row["min"] / source["batches"])
        assert isinstance(row["bytes"], int) and row["bytes"] > 0
        if row["kind"] == "floor":
            assert row["ratios"] == {}
        elif row["operation"] == "decode":
            assert set(row["ratios"]) == {"floor.orjson.loads"}
        else:
            expected = ENCODE_FLOORS if rfc8785 else ENCODE_FLOORS - {"floor.rfc8785"}
            assert set(row["ratios"]) == expected
        if row["kind"] == "scope" or row["name"] == "floor.orjson.loads":
            assert row["bytes"] == source["bytes"]  # the canonical bytes written or read


def test_every_result_field_is_documented() -> None:
    docs = DOCS.read_text()
    section = docs[docs.index("### `scope bench") :]
    for field in (
        "format",
        "version",
        "created",
        "environment",
        "scope",
        "python",
        "implementation",
        "platform",
        "machine",
        "cpus",
        "orjson",
        "rfc8785",
        "source",
        "kind",
        "description",
        "conversations",
        "batches",
        "messages",
        "bytes",
        "settings",
        "repeats",
        "warmup",
        "min_time",
        "rows",
        "name",
        "operation",
        "unit",
        "min",
        "median",
        "per_message",
        "per_batch",
        "number",
        "ratios",
        "skipped",
    ):
        assert f"`{field}`" in section, field


# -- workloads --------------------------------------------------------------------------


def test_bench_builtin_turn_prints_the_table_and_writes_the_result(
    tmp_path: pathlib.Path,
) -> None:
    proc = scope(tmp_path, "bench", *FAST, "--json", "out.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""  # no progress counter: stderr is not a terminal
    lines = proc.stdout.decode().splitlines()
    size = len(encode_messages(standard_turn()))
    assert lines[0] == (
        f"built-in standard turn: 1 conversation(s), 1 batch(es), 8 message(s), "
        f"{size} bytes canonical"
    )
    assert lines[1] == "1 repeat(s) after 0 warm-up(s), each at least 0 s; times in µs"
    assert [line.split()[0] for line in lines[3:]] == [name for name, _, _ in ROWS]
    assert "x orjson.dumps" in lines[3] and "x rfc8785" in lines[3]
    doc = json.loads((tmp_path / "out.json").read_text())
    check_document(doc)
    assert doc["source"] == {
        "kind": "builtin",
        "description": "built-in standard turn",
        "conversations": 1,
        "batches": 1,
        "messages": 8,
        "bytes": size,
    }
    assert doc["settings"] == {"repeats": 1, "warmup": 0, "min_time": 0.0}


def test_bench_without_rfc8785_reports_that_floor_skipped(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rfc8785", None)  # import rfc8785 raises ImportError
    out = tmp_path / "out.json"
    assert main(["bench", *FAST, "--repeats", "2", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "floor.rfc8785         skipped: rfc8785 is not installed (pip install rfc8785)" in table
    doc = json.loads(out.read_text())
    check_document(doc, rfc8785=False)
    [row] = [r for r in doc["rows"] if r["name"] == "floor.rfc8785"]
    assert row["skipped"] == "rfc8785 is not installed (pip install rfc8785)"


def test_bench_reports_rfc8785_skipped_when_it_refuses_the_workload(
    tmp_path: pathlib.Path,
) -> None:
    # RFC 8785 (I-JSON) has no integers beyond 2**53; scope keeps them exactly.
    line = b'{"conversation_id": "big", "messages": [{"metadata": {"n": 1152921504606846976}, '
    line += b'"parts": [{"kind": "text", "text": "hi"}], "role": "user"}]}\n'
    (tmp_path / "big.jsonl").write_bytes(line)
    proc = scope(tmp_path, "bench", *FAST, "--file", "big.jsonl", "--json", "big.json")
    assert proc.returncode == 0, proc.stderr
    [row] = [
        r
        for r in json.loads((tmp_path / "big.json").read_text())["rows"]
        if r["name"] == "floor.rfc8785"
    ]
    assert row["skipped"].startswith("rfc8785 refuses this workload: IntegerDomainError: ")
    assert "floor.rfc8785         skipped: rfc8785 refuses this workload" in proc.stdout.decode()


def test_bench_on_an_export_of_the_demo_store(tmp_path: pathlib.Path) -> None:
    url = "sqlite:///demo.db"
    assert scope(tmp_path, "demo", "--store", url).returncode == 0
    assert scope(tmp_path, "demo", "--store", url).returncode == 0  # two conversations
    assert scope(tmp_path, "history", "export", "--store", url, "-o", "demo.jsonl").returncode == 0
    header, *exported = (tmp_path / "demo.jsonl").read_bytes().splitlines()
    assert json.loads(header) == {"format": "scope-history-export", "version": 3}
    messages = sum(len(b["messages"]) for line in exported for b in json.loads(line)["batches"])
    assert len(exported) == 2
    proc = scope(tmp_path, "bench", *FAST, "--file", "demo.jsonl", "--json", "file.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "file.json").read_text())
    check_document(doc)
    assert doc["source"]["kind"] == "file"
    assert doc["source"]["description"] == "export file demo.jsonl"
    # The demo never branches: every batch is on the head path, each measured as stored.
    counts = [len(json.loads(line)["batches"]) for line in exported]
    assert (doc["source"]["conversations"], doc["source"]["batches"]) == (2, sum(counts))
    assert doc["source"]["messages"] == messages
    one = scope(tmp_path, "bench", *FAST, "--file", "demo.jsonl", "--conversations", "1")
    assert one.stdout.decode().startswith(
        f"export file demo.jsonl: 1 conversation(s), {counts[0]} batch(es)"
    )
    # The demo's store itself, by URL: every stored batch.
    store = scope(tmp_path, "bench", *FAST, "--store", url, "--json", "store.json")
    assert store.returncode == 0, store.stderr
    doc = json.loads((tmp_path / "store.json").read_text())
    check_document(doc)
    assert doc["source"]["description"] == f"store {url}"
    assert doc["source"]["conversations"] == 2 and doc["source"]["messages"] == messages
    # A file of the old format (no header, one conversation a line) is measured too.
    old = b"".join(
        json.dumps(
            {
                "conversation_id": json.loads(line)["conversation_id"],
                "messages": [m for b in json.loads(line)["batches"] for m in b["messages"]],
            }
        ).encode()
        + b"\n"
        for line in exported
    )
    (tmp_path / "old.jsonl").write_bytes(old)
    proc = scope(tmp_path, "bench", *FAST, "--file", "old.jsonl", "--json", "old.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "old.json").read_text())
    assert (doc["source"]["conversations"], doc["source"]["batches"]) == (2, 2)
    assert doc["source"]["messages"] == messages


def test_bench_refuses_a_bad_export_line_and_a_missing_source(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.jsonl").write_bytes(b'\n{"conversation_id": "x", "messages": []}\n')
    line = one_error(scope(tmp_path, "bench", *FAST, "--file", "bad.jsonl"), 1)
    assert line == "scope: error: bad.jsonl:2: a batch needs at least one message"
    line = one_error(scope(tmp_path, "bench", *FAST, "--file", "none.jsonl"), 1)
    assert line == "scope: error: cannot read none.jsonl: No such file or directory"
    (tmp_path / "empty.jsonl").write_bytes(b"\n")
    line = one_error(scope(tmp_path, "bench", *FAST, "--file", "empty.jsonl"), 1)
    assert line == "scope: error: empty.jsonl holds no conversations to measure"
    line = one_error(scope(tmp_path, "bench", *FAST, "--store", "sqlite:///none.db"), 1)
    assert "no SQLite store at" in line and not (tmp_path / "none.db").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store", "sqlite:///a.db", "--file", "x"], "not allowed with argument"),
        (["--conversations", "0"], "must be at least 1, got 0"),
        (["--repeats", "many"], "expected an integer, got 'many'"),
        (["--warmup", "-1"], "must be at least 0, got -1"),
        (["--min-time", "-1"], "must be a finite number >= 0, got '-1'"),
        (["--min-time", "nan"], "must be a finite number >= 0, got 'nan'"),
        (["--threshold", "0"], "must be a finite number > 0, got '0'"),
    ],
)
def test_bench_usage_errors_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scope: error: argument") and message in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_measurements_on_a_terminal() -> None:
    from scope.cli._bench import builtin_workload

    err = _Terminal()
    rows = measure(builtin_workload(), Settings(1, 0, 0.0), err)
    assert len(rows) == len(ROWS)
    assert err.getvalue().endswith(f"\rmeasured {len(ROWS)}/{len(ROWS)}\n")


# -- a store on every backend -----------------------------------------------------------


@pytest.fixture
async def backend(kind: str, tmp_path: pathlib.Path) -> AsyncIterator[Backend]:
    async with fresh_backend(kind, tmp_path) as backend:
        yield backend


@pytest.fixture
def cli_opens(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The command line's stores open on ``backend``'s place whatever the URL."""

    async def open_backend(url: str, *, create: bool = True) -> Any:
        # Redis has no schema to create: its open takes no ``create``.
        return await backend.open(**({} if backend.kind == "redis" else {"create": create}))

    monkeypatch.setattr(_stores, "open_cli_store", open_backend)
    yield


@pytest.mark.anyio
@over_backends()
async def test_bench_on_a_store(backend: Backend, cli_opens: None, tmp_path: pathlib.Path) -> None:
    async with await backend.open() as store:
        for cid in ("a", "b", "c"):
            await store.append(batch(cid, "a1"))
            await store.append(batch(cid, "a2", "more"))
    out, err = io.StringIO(), io.StringIO()
    result = tmp_path / "store.json"
    status = await run_bench(
        store="test://store",
        file=None,
        conversations=2,
        settings=Settings(1, 0, 0.0),
        json_out=str(result),
        baseline_path=None,
        threshold=10.0,
        stdout=out,
        stderr=err,
    )
    assert status == 0 and err.getvalue() == ""
    assert out.getvalue().startswith(
        "store test://store: 2 conversation(s), 4 batch(es), 8 message(s)"
    )
    doc = json.loads(result.read_text())
    check_document(doc)
    assert doc["source"]["kind"] == "store"
    assert doc["source"]["bytes"] == 2 * sum(
        len(batch("a", aid, text).encoded_messages)
        for aid, text in (("a1", "hello"), ("a2", "more"))
    )


# -- --compare --------------------------------------------------------------------------


@pytest.fixture
def baseline(tmp_path: pathlib.Path) -> dict[str, Any]:
    proc = scope(tmp_path, "bench", *FAST, "--json", "base.json")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads((tmp_path / "base.json").read_text())
    return doc


def scaled(doc: dict[str, Any], kind: str, factor: float) -> dict[str, Any]:
    """``doc`` with the per-message medians of ``kind`` rows multiplied by ``factor``."""
    copy = json.loads(json.dumps(doc))
    for row in copy["rows"]:
        if row["kind"] == kind and row["per_message"]["median"] is not None:
            row["per_message"]["median"] *= factor
    return copy


def compare(tmp_path: pathlib.Path, doc: Any, *args: str) -> subprocess.CompletedProcess[bytes]:
    path = tmp_path / "baseline.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return scope(tmp_path, "bench", *FAST, "--compare", "baseline.json", *args)


def test_compare_exits_1_when_scope_got_slower(
    tmp_path: pathlib.Path, baseline: dict[str, Any]
) -> None:
    # The baseline claims scope was a thousand times faster: this run is slower.
    proc = compare(tmp_path, scaled(baseline, "scope", 1e-3))
    line = one_error(proc, 1)
    assert line.startswith("scope: error: slower than the baseline by more than 10%: ")
    for name in ("scope.encode.first", "scope.encode.cached", "scope.digest", "scope.decode"):
        assert name in line
    out = proc.stdout.decode()
    assert "against baseline.json (threshold 10%):" in out
    assert re.search(r"^scope\.decode .*\+\d+\.\d%  slower$", out, re.MULTILINE)
    # A threshold past the change passes.
    assert compare(tmp_path, scaled(baseline, "scope", 1e-3), "--threshold", "1e9").returncode == 0


def test_compare_passes_when_faster_and_ignores_slower_floors(
    tmp_path: pathlib.Path, baseline: dict[str, Any]
) -> None:
    faster = compare(tmp_path, scaled(baseline, "scope", 1e3))
    assert faster.returncode == 0, faster.stderr
    assert "slower" not in faster.stdout.decode()
    # Floors measure the machine: shown, never failing.
    # (scope's rows scaled too: two runs a moment apart can differ by 10% on a busy box.)
    floors = compare(tmp_path, scaled(scaled(baseline, "scope", 1e3), "floor", 1e-3))
    assert floors.returncode == 0, floors.stderr


def test_compare_names_rows_missing_on_either_side(
    tmp_path: pathlib.Path, baseline: dict[str, Any]
) -> None:
    changed = json.loads(json.dumps(baseline))
    changed["rows"] = [r for r in changed["rows"] if r["name"] != "scope.digest"]
    changed["rows"].append(dict(changed["rows"][0], name="scope.retired"))
    changed["source"]["description"] = "another source"
    proc = compare(tmp_path, scaled(changed, "scope", 1e3))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert "scope.digest            not in the baseline" in out
    assert "scope.retired           only in the baseline" in out
    assert proc.stderr.decode() == (
        "note: the baseline measured 'another source', this run 'built-in standard turn': "
        "per-message times compared\n"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read baseline baseline.json: No such file or directory"),
        ("{", "baseline baseline.json is not JSON: "),
        ("[]", "baseline baseline.json is not a scope bench result (format 'scope-bench')"),
        ('{"format": "other"}', "is not a scope bench result"),
        (
            '{"format": "scope-bench", "version": 2, "rows": []}',
            "baseline baseline.json has version 2; this scope reads version 1",
        ),
        ('{"format": "scope-bench", "version": 1}', "has no valid rows list"),
        ('{"format": "scope-bench", "version": 1, "rows": [{"n": 1}]}', "has no valid rows"),
    ],
)
def test_unusable_baseline_exits_2_before_measuring(
    tmp_path: pathlib.Path, content: str | None, message: str
) -> None:
    if content is None:
        proc = scope(tmp_path, "bench", *FAST, "--compare", "baseline.json")
    else:
        proc = compare(tmp_path, content)
    line = one_error(proc, 2)
    assert message in line
    assert proc.stdout == b""  # nothing was measured
