"""``scope bench``: what canonical encoding, digests and validated decoding cost on a
workload (the built-in standard turn, an export file or a store), next to the plain JSON
floors measured in the same process and run; a versioned result file and a comparison
with an earlier one.

Every measurement is one *pass* over the workload: the operation applied to each of its
batches once. A measurement calibrates how many passes one repeat runs (doubling until a
repeat takes ``min_time``; those runs warm up too), runs ``warmup`` more untimed repeats,
then ``repeats`` timed ones (the garbage collector paused, as ``timeit`` does);
``min`` and ``median`` are seconds per pass.
"""

from __future__ import annotations

import datetime
import gc
import importlib
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TextIO, final

import attrs
import orjson

from scope import __version__, codec
from scope.chat import Message
from scope.cli._errors import CLIError
from scope.cli._export import ConversationRecord, export_version, parse_export_line
from scope.cli._history import ConversationLine
from scope.cli._render import Progress
from scope.cli._stores import opened_store, redact_url
from scope.cli._turn import standard_turn
from scope.codec import encode_messages, from_json, to_builtins
from scope.errors import InvalidBatchError
from scope.history import Batch

__all__ = [
    "FORMAT",
    "VERSION",
    "Measurement",
    "Settings",
    "Workload",
    "builtin_workload",
    "compare",
    "load_baseline",
    "load_file",
    "load_store",
    "measure",
    "render_table",
    "result_document",
    "run_bench",
]

#: The result file's ``format`` and ``version``: a reader checks both.
FORMAT: Final = "scope-bench"
VERSION: Final = 1

#: Defaults of the command's options (documented in docs/cli.md).
DEFAULT_CONVERSATIONS: Final = 100
DEFAULT_REPEATS: Final = 7
DEFAULT_WARMUP: Final = 1
DEFAULT_MIN_TIME: Final = 0.05
DEFAULT_THRESHOLD: Final = 10.0

#: Which floors each scope operation is compared with.
_ENCODE_FLOORS: Final = ("floor.orjson.dumps", "floor.json.dumps", "floor.rfc8785")
_DECODE_FLOORS: Final = ("floor.orjson.loads",)


@final
@attrs.frozen
class Workload:
    """What a run measures: ``batches`` as ``(conversation id, append id, messages)``,
    and where they came from (``kind``: ``builtin``, ``file`` or ``store``)."""

    kind: str
    description: str
    batches: tuple[tuple[str, str, tuple[Message, ...]], ...]

    @property
    def conversations(self) -> int:
        return len({cid for cid, _, _ in self.batches})

    @property
    def messages(self) -> int:
        return sum(len(messages) for _, _, messages in self.batches)


@final
@attrs.frozen
class Settings:
    """How each measurement repeats (see the module docstring)."""

    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    min_time: float = DEFAULT_MIN_TIME


@final
@attrs.frozen
class Measurement:
    """One row of the result: seconds per pass (None when ``skipped`` says why not)."""

    name: str
    kind: str  # "scope" or "floor"
    operation: str  # "encode", "digest" or "decode"
    min: float | None
    median: float | None
    repeats: int
    number: int
    bytes: int | None
    skipped: str | None = None


# ------------------------------------------------------------------ workloads


def builtin_workload() -> Workload:
    """The standard 8-message turn as one batch."""
    return Workload(
        "builtin",
        "built-in standard turn",
        (("bench", "standard-turn", tuple(standard_turn())),),
    )


def load_file(path: str, limit: int) -> Workload:
    """The first ``limit`` conversations of an export file, read line by line: of a
    version 3 or 2 file (``scope history export``'s, its header first) each open
    conversation's head path batches, of an old one each line as one batch. A bad line raises
    ``CLIError`` naming ``path:line``."""
    batches: list[tuple[str, str, tuple[Message, ...]]] = []
    conversations = 0
    versioned: bool | None = None
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                if conversations >= limit:
                    break
                line = raw.rstrip(b"\r\n")
                if not line.strip():
                    continue
                if versioned is None:
                    versioned = export_version(line) is not None
                    if versioned:
                        continue
                try:
                    if versioned:
                        record = parse_export_line(line)
                        if not isinstance(record, ConversationRecord):
                            continue  # a closed conversation, a tombstone, the secret
                        cid = str(record.conversation_id)
                        batches += [(cid, str(b.id), b.messages) for b in record.tree.head_path()]
                    else:
                        parsed = codec.from_json(line, ConversationLine)
                        cid = str(parsed.conversation_id)
                        batches.append((cid, f"line-{number}", parsed.messages))
                except InvalidBatchError as exc:
                    raise CLIError(f"{path}:{number}: {exc}") from None
                conversations += 1
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not batches:
        raise CLIError(f"{path} holds no conversations to measure")
    return Workload("file", f"export file {path}", tuple(batches))


async def load_store(url: str, limit: int) -> Workload:
    """The stored batches of the first ``limit`` conversations (in listing order) of
    the store ``url`` names, opened with ``create=False`` and only read; one
    conversation is read at a time."""
    batches: list[tuple[str, str, tuple[Message, ...]]] = []
    async with opened_store(url, create=False) as store:
        for cid in (await store.conversations())[:limit]:
            for batch in await store.read_batches(cid):
                batches.append((str(cid), str(batch.id), batch.messages))
    if not batches:
        raise CLIError(f"the store {redact_url(url)} holds no conversations to measure")
    return Workload("store", f"store {redact_url(url)}", tuple(batches))


# ------------------------------------------------------------------ measuring


def _rfc8785() -> Any:
    """The ``rfc8785`` module, or None when it is not installed."""
    try:
        return importlib.import_module("rfc8785")
    except ImportError:
        return None


def _timed(run: Callable[[Any], Any], args: list[Any]) -> float:
    """Seconds for ``run(arg)`` over ``args``, with the garbage collector paused (as
    ``timeit`` does): a collection scanning the prepared arguments is not the cost of
    the operation."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for arg in args:
            run(arg)
        return time.perf_counter() - start
    finally:
        if collecting:
            gc.enable()


def _measure_one(
    run: Callable[[Any], Any], setup: Callable[[], Any], settings: Settings
) -> tuple[float, float, int]:
    """``(min, median, number)``: seconds per call of ``run(setup())`` (``setup`` runs
    outside the timing)."""
    number = 1
    while True:  # calibration, which also warms up
        elapsed = _timed(run, [setup() for _ in range(number)])
        if elapsed >= settings.min_time or number >= 1 << 20:
            break
        number *= 2
    for _ in range(settings.warmup):
        _timed(run, [setup() for _ in range(number)])
    times = [
        _timed(run, [setup() for _ in range(number)]) / number for _ in range(settings.repeats)
    ]
    return min(times), statistics.median(times), number


@final
class _Operation:
    """A named pass over the workload: ``run(arg)`` with ``arg = setup()``."""

    def __init__(
        self,
        name: str,
        operation: str,
        run: Callable[[Any], Any],
        output: int | None,
        setup: Callable[[], Any] = lambda: None,
        skipped: str | None = None,
    ) -> None:
        self.name = name
        self.kind = name.split(".", 1)[0]
        self.operation = operation
        self.run = run
        self.output = output
        self.setup = setup
        self.skipped = skipped


def _operations(workload: Workload) -> list[_Operation]:
    batches = workload.batches
    messages = [m for _, _, m in batches]
    encoded = [encode_messages(m) for m in messages]  # also fills every message's cache
    plain = [to_builtins(list(m)) for m in messages]
    canonical_size = sum(len(data) for data in encoded)

    def fresh() -> list[list[Message]]:
        # Decoded copies never encoded: every cache is cold.
        return [from_json(data, list[Message]) for data in encoded]

    def encode_each(arg: list[list[Message]]) -> None:
        for item in arg:
            encode_messages(item)

    def encode_cached(_: None) -> None:
        for item in messages:
            encode_messages(item)

    def digest(_: None) -> None:
        for cid, aid, item in batches:
            Batch(cid, aid, item).digest  # noqa: B018 - the digest is the point

    def decode(_: None) -> None:
        for data in encoded:
            from_json(data, list[Message])

    def orjson_dumps(_: None) -> None:
        for tree in plain:
            orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)

    def json_dumps(_: None) -> None:
        for tree in plain:
            json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def orjson_loads(_: None) -> None:
        for data in encoded:
            orjson.loads(data)

    json_size = sum(
        len(json.dumps(t, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        for t in plain
    )
    ops = [
        _Operation("scope.encode.first", "encode", encode_each, canonical_size, setup=fresh),
        _Operation("scope.encode.cached", "encode", encode_cached, canonical_size),
        _Operation("scope.digest", "digest", digest, canonical_size),
        _Operation("scope.decode", "decode", decode, canonical_size),
        _Operation(
            "floor.orjson.dumps",
            "encode",
            orjson_dumps,
            sum(len(orjson.dumps(t, option=orjson.OPT_SORT_KEYS)) for t in plain),
        ),
        _Operation("floor.json.dumps", "encode", json_dumps, json_size),
        _rfc8785_operation(plain),
        _Operation("floor.orjson.loads", "decode", orjson_loads, canonical_size),
    ]
    return ops


def _rfc8785_operation(plain: list[Any]) -> _Operation:
    module = _rfc8785()
    if module is None:
        return _Operation(
            "floor.rfc8785",
            "encode",
            lambda _: None,
            None,
            skipped="rfc8785 is not installed (pip install rfc8785)",
        )
    try:
        size = sum(len(module.dumps(t)) for t in plain)
    except module.CanonicalizationError as exc:  # values outside I-JSON (big integers)
        return _Operation(
            "floor.rfc8785",
            "encode",
            lambda _: None,
            None,
            skipped=f"rfc8785 refuses this workload: {type(exc).__name__}: {exc}",
        )

    def dumps(_: None) -> None:
        for tree in plain:
            module.dumps(tree)

    return _Operation("floor.rfc8785", "encode", dumps, size)


def measure(workload: Workload, settings: Settings, stderr: TextIO) -> list[Measurement]:
    """Measure every operation on ``workload``, scope's and the floors, in this process
    and run; a progress counter on ``stderr`` when it is a terminal."""
    ops = _operations(workload)
    progress = Progress(stderr, "measured", len(ops))
    out: list[Measurement] = []
    for op in ops:
        if op.skipped is not None:
            out.append(
                Measurement(op.name, op.kind, op.operation, None, None, 0, 0, None, op.skipped)
            )
        else:
            low, middle, number = _measure_one(op.run, op.setup, settings)
            out.append(
                Measurement(
                    op.name, op.kind, op.operation, low, middle, settings.repeats, number, op.output
                )
            )
        progress.step()
    progress.done()
    return out


# ------------------------------------------------------------------ results


def _ratios(row: Measurement, rows: Sequence[Measurement]) -> dict[str, float]:
    """``row``'s median over each of its floors' medians (scope rows only)."""
    if row.kind != "scope" or row.median is None:
        return {}
    floors = _DECODE_FLOORS if row.operation == "decode" else _ENCODE_FLOORS
    by_name = {r.name: r for r in rows}
    out: dict[str, float] = {}
    for name in floors:
        floor = by_name.get(name)
        if floor is not None and floor.median:
            out[name] = row.median / floor.median
    return out


def _per(value: float | None, count: int) -> float | None:
    return None if value is None else value / count


def result_document(
    workload: Workload, settings: Settings, rows: Sequence[Measurement]
) -> dict[str, Any]:
    """The result file's content (format ``scope-bench``, version 1; docs/cli.md
    describes every field)."""
    batches = len(workload.batches)
    messages = workload.messages
    rfc = _rfc8785()
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": {
            "scope": __version__,
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "orjson": orjson.__version__,
            "rfc8785": None if rfc is None else importlib.metadata.version("rfc8785"),
        },
        "source": {
            "kind": workload.kind,
            "description": workload.description,
            "conversations": workload.conversations,
            "batches": batches,
            "messages": messages,
            "bytes": sum(len(encode_messages(m)) for _, _, m in workload.batches),
        },
        "settings": {
            "repeats": settings.repeats,
            "warmup": settings.warmup,
            "min_time": settings.min_time,
        },
        "rows": [
            {
                "name": row.name,
                "kind": row.kind,
                "operation": row.operation,
                "unit": "s",
                "min": row.min,
                "median": row.median,
                "per_message": {
                    "min": _per(row.min, messages),
                    "median": _per(row.median, messages),
                },
                "per_batch": {
                    "min": _per(row.min, batches),
                    "median": _per(row.median, batches),
                },
                "repeats": row.repeats,
                "number": row.number,
                "bytes": row.bytes,
                "ratios": _ratios(row, rows),
                "skipped": row.skipped,
            }
            for row in rows
        ],
    }


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e6:.2f}"


def render_table(document: dict[str, Any]) -> list[str]:
    """The result as a table: times per message and per batch in microseconds, the
    bytes each pass writes or reads, and each scope row's ratio to its floors."""
    source = document["source"]
    settings = document["settings"]
    lines = [
        f"{source['description']}: {source['conversations']} conversation(s), "
        f"{source['batches']} batch(es), {source['messages']} message(s), "
        f"{source['bytes']} bytes canonical",
        f"{settings['repeats']} repeat(s) after {settings['warmup']} warm-up(s), each at "
        f"least {settings['min_time']:g} s; times in µs",
        f"{'operation':<22}{'min/msg':>10}{'median/msg':>12}{'median/batch':>14}"
        f"{'bytes':>10}  ratio (median) to floors",
    ]
    for row in document["rows"]:
        if row["skipped"] is not None:
            lines.append(f"{row['name']:<22}skipped: {row['skipped']}")
            continue
        ratios = ", ".join(
            f"{value:.2f}x {name.removeprefix('floor.')}" for name, value in row["ratios"].items()
        )
        lines.append(
            f"{row['name']:<22}{_us(row['per_message']['min']):>10}"
            f"{_us(row['per_message']['median']):>12}{_us(row['per_batch']['median']):>14}"
            f"{row['bytes']:>10}  {ratios}".rstrip()
        )
    return lines


def load_baseline(path: str) -> dict[str, Any]:
    """An earlier result file; ``CLIError`` with status 2 when it cannot be read or is
    not a ``scope-bench`` version 1 file."""
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise CLIError(f"cannot read baseline {path}: {exc.strerror or exc}", 2) from None
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise CLIError(f"baseline {path} is not JSON: {exc}", 2) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CLIError(f"baseline {path} is not a scope bench result (format {FORMAT!r})", 2)
    if document.get("version") != VERSION:
        raise CLIError(
            f"baseline {path} has version {document.get('version')!r}; this scope reads "
            f"version {VERSION}",
            2,
        )
    rows = document.get("rows")
    if not isinstance(rows, list) or not all(
        isinstance(row, dict) and isinstance(row.get("name"), str) for row in rows
    ):
        raise CLIError(f"baseline {path} has no valid rows list", 2)
    return document


def _baseline_median(row: dict[str, Any]) -> float | None:
    per = row.get("per_message")
    value = per.get("median") if isinstance(per, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def compare(
    document: dict[str, Any], baseline: dict[str, Any], threshold: float
) -> tuple[list[str], list[str]]:
    """``(lines, slower)``: the change of each row's median per message against the
    baseline's row of the same name, and the names of the scope rows that got slower by
    more than ``threshold`` percent (floor rows measure the machine: shown, never
    failing)."""
    before = {row["name"]: row for row in baseline["rows"]}
    lines = [f"{'operation':<22}{'baseline/msg':>14}{'now/msg':>12}{'change':>10}"]
    slower: list[str] = []
    for row in document["rows"]:
        name = row["name"]
        now = row["per_message"]["median"]
        old = before.get(name)
        if old is None:
            lines.append(f"{name:<22}  not in the baseline")
            continue
        then = _baseline_median(old)
        if now is None or then is None:
            lines.append(f"{name:<22}  not measured in both runs")
            continue
        change = (now / then - 1) * 100
        flag = ""
        if row["kind"] == "scope" and change > threshold:
            slower.append(f"{name} ({change:+.1f}%)")
            flag = "  slower"
        lines.append(f"{name:<22}{_us(then):>14}{_us(now):>12}{change:>+9.1f}%{flag}")
    for name in before:
        if name not in {row["name"] for row in document["rows"]}:
            lines.append(f"{name:<22}  only in the baseline")
    return lines, slower


# ------------------------------------------------------------------ the command


def _write_json(path: str, document: dict[str, Any]) -> None:
    try:
        pathlib.Path(path).write_bytes(
            orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        )
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None


def _lines(lines: Iterator[str] | list[str], out: TextIO) -> None:
    for line in lines:
        out.write(line + "\n")
    out.flush()


async def run_bench(
    *,
    store: str | None,
    file: str | None,
    conversations: int,
    settings: Settings,
    json_out: str | None,
    baseline_path: str | None,
    threshold: float,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Run ``scope bench``: measure, print the table, write ``json_out``, compare with
    the baseline (exit 1 when a scope row got slower than ``threshold`` percent)."""
    baseline = None if baseline_path is None else load_baseline(baseline_path)
    if store is not None:
        workload = await load_store(store, conversations)
    elif file is not None:
        workload = load_file(file, conversations)
    else:
        workload = builtin_workload()
    rows = measure(workload, settings, stderr)
    document = result_document(workload, settings, rows)
    _lines(render_table(document), stdout)
    if json_out is not None:
        _write_json(json_out, document)
    if baseline is None:
        return 0
    if baseline.get("source", {}).get("description") != workload.description:
        stderr.write(
            f"note: the baseline measured {baseline.get('source', {}).get('description')!r}, "
            f"this run {workload.description!r}: per-message times compared\n"
        )
    lines, slower = compare(document, baseline, threshold)
    stdout.write(f"\nagainst {baseline_path} (threshold {threshold:g}%):\n")
    _lines(lines, stdout)
    if slower:
        raise CLIError(f"slower than the baseline by more than {threshold:g}%: {', '.join(slower)}")
    return 0
