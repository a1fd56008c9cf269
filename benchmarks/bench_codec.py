"""Encode and decode of the standard 8-message turn, next to the orjson floor.

Run: ``python benchmarks/bench_codec.py``. Prints best-of-N microseconds per turn and the
ratio to the floor:

- encode floor: the same content as plain dicts through
  ``orjson.dumps(..., option=OPT_SORT_KEYS)``;
- decode floor: ``orjson.loads`` of the same bytes.

scope's rows: ``to_json`` on messages never encoded before ("first encode", every cache
cold: each round encodes fresh decoded copies), ``to_json`` again on the same messages
("cached": a Message keeps its canonical bytes after the first encode), and ``from_json``
of the canonical bytes (the fast path) and of a re-indented, key-reversed copy (the exact
reader), with a breakdown: parsing alone, building and validating the values from a parsed
tree alone, and the same turn with every number in orjson's spelling (where the orjson
fast path of the exact reader applies). Decoding always validates every value.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _turn import standard_turn

from scope._json import loads_exact
from scope.chat import Message
from scope.codec import from_builtins, from_json, parse, to_builtins, to_json

ROUNDS = 7
NUMBER = 500


def best(fn: Callable[[], Any], number: int = NUMBER, rounds: int = ROUNDS) -> float:
    """Best-of-``rounds`` mean seconds per call over ``number`` calls."""
    result = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        result = min(result, (time.perf_counter() - start) / number)
    return result


def best_fresh(make: Callable[[], Any], fn: Callable[[Any], Any]) -> float:
    """Like ``best``, but every call gets a fresh argument built outside the timing."""
    result = float("inf")
    for _ in range(ROUNDS):
        args = [make() for _ in range(NUMBER)]
        start = time.perf_counter()
        for arg in args:
            fn(arg)
        result = min(result, (time.perf_counter() - start) / NUMBER)
    return result


def _reindent(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reindent(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reindent(v) for v in value]
    return value


def main() -> None:
    turn = standard_turn()
    data = to_json(turn)
    plain = to_builtins(turn)
    messy = orjson.dumps(
        _reindent(loads_exact(data)),
        default=lambda num: orjson.Fragment(num.encode()),
        option=orjson.OPT_INDENT_2 | orjson.OPT_PASSTHROUGH_SUBCLASS,
    )
    assert from_json(data, list[Message]) == turn
    assert from_json(messy, list[Message]) == turn
    # The floor is not exact: plain dicts lose number spellings ("2.50" becomes 2.5).
    floor_bytes = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    assert len(floor_bytes) < len(data)

    enc_floor = best(lambda: orjson.dumps(plain, option=orjson.OPT_SORT_KEYS))
    dec_floor = best(lambda: orjson.loads(data))
    enc_first = best_fresh(lambda: from_json(data, list[Message]), to_json)
    to_json(turn)
    enc_cached = best(lambda: to_json(turn))
    dec = best(lambda: from_json(data, list[Message]))
    dec_messy = best(lambda: from_json(messy, list[Message]))
    tree = parse(data)
    dec_parse = best(lambda: parse(data))
    dec_build = best(lambda: from_builtins(tree, list[Message]))
    plain_data = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    dec_plain = best(lambda: from_json(plain_data, list[Message]))

    print(f"standard turn: {len(turn)} messages, {len(data)} bytes canonical")
    print(f"{'operation':<44}{'µs':>10}{'ratio':>10}")
    rows = [
        ("encode floor: orjson.dumps(dicts, SORT_KEYS)", enc_floor, enc_floor),
        ("to_json, first encode (caches cold)", enc_first, enc_floor),
        ("to_json, cached (Message bytes kept)", enc_cached, enc_floor),
        ("decode floor: orjson.loads", dec_floor, dec_floor),
        ("from_json, canonical input (validated)", dec, dec_floor),
        (f"from_json, indented input ({len(messy)} B)", dec_messy, dec_floor),
        ("  of which parse (exact reader)", dec_parse, dec_floor),
        ("  of which building + validating values", dec_build, dec_floor),
        ("from_json, all numbers orjson-spelled", dec_plain, dec_floor),
    ]
    for name, seconds, floor in rows:
        print(f"{name:<44}{seconds * 1e6:>10.1f}{seconds / floor:>9.1f}x")
    print("targets: encode within 3x of its floor, decode within 5x of orjson.loads")


if __name__ == "__main__":
    main()
