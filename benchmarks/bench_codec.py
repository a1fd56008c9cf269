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

Beside the generated structurers, the reason they exist, measured: the same parsed tree
structured by a strict ``cattrs.gen`` converter (``make_dict_structure_fn`` per class with
``forbid_extra_keys`` and detailed validation, the codec's own strict leaf hooks, the
same field names; each value built through its ``__init__``, so validated). It must
decode to the same turn.

Beside them, pydantic-ai (when installed; ``nox -s bench`` installs ``pydantic-ai-slim``):
``ModelMessagesTypeAdapter.validate_json`` of the same turn in its own message classes
(a system prompt request, a user prompt with text and the 4 KiB image as
``BinaryContent``, a response with a signed ``ThinkingPart`` and two ``ToolCallPart``s,
a request with two ``ToolReturnPart``s, one holding the nested details, then the text
answers and prompts: eight messages), validated values of the same shape from the JSON
pydantic-ai writes for them; shown against the same floor, and scope's canonical-input
row against it.

The last row is a lower bound for any decoder that builds scope's values (frozen, slotted
attrs classes, as DESIGN §2 requires): ``orjson.loads`` of the bytes, the base64 decode of
the image and signature, and allocating every value and filling each of its slots with
values that are already final, with no key lookup, no check and no validation at all.
"""

from __future__ import annotations

import base64
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import cattrs
import orjson
from cattrs.gen import make_dict_structure_fn, override

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _turn import standard_turn

from scope._codec._errors import VALUE_ERRORS, Fail
from scope._codec._structure import WIRE_NAMES, structurer_for
from scope._json import parse_exact, parse_exact_fast
from scope.chat import Message
from scope.codec import from_builtins, from_json, to_builtins, to_json
from scope.jsonvalue import RawJSON
from scope.metadata import EMPTY_METADATA, Metadata

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


def best_alternating(
    *fns: Callable[[], Any], number: int = NUMBER, rounds: int = 3 * ROUNDS
) -> list[float]:
    """``best`` of each function, their rounds taken in turn, so a busy spell of the
    machine weighs on all of them alike (for rows compared with each other)."""
    results = [float("inf")] * len(fns)
    for _ in range(rounds):
        for index, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            results[index] = min(results[index], (time.perf_counter() - start) / number)
    return results


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


#: A construction plan: (kind, leaves, nested). For a value to allocate, ``kind`` is its
#: class, ``leaves`` the (slot setter, final value) pairs and ``nested`` the (slot setter,
#: plan) pairs; ``kind`` ``tuple`` or ``dict`` rebuilds a container of nested plans.
Plan = tuple[Any, list[tuple[Any, Any]], Any]


def _plan(value: Any) -> Plan | None:
    """The plan that rebuilds ``value`` the cheapest way Python allows (``object.__new__``
    and one slot write per field), or None when a decoder would reuse the value as it is
    (strings, bytes, numbers, enum members, shared singletons such as the empty metadata
    and the empty tuple)."""
    kind = type(value)
    if kind is tuple:
        items = [_plan(item) for item in value]
        if not any(items):
            return None
        if not all(items):
            raise TypeError("mixed tuples do not occur in protocol values")
        return (tuple, [], items)
    if kind is Metadata and value is not EMPTY_METADATA:
        data = {key: _plan(raw) for key, raw in value._data.items()}
        leaves = [(kind.__dict__[name].__set__, None) for name in ("_hash", "_json")]
        return (kind, leaves, [(kind.__dict__["_data"].__set__, (dict, [], data))])
    if kind is RawJSON:
        return (kind, [(kind.__dict__["_raw_json_bytes"].__set__, value._raw_json_bytes)], [])
    if not attrs.has(kind):
        return None
    leaves, nested = [], []
    for field in attrs.fields(kind):
        write = kind.__dict__[field.name].__set__
        item = getattr(value, field.name)
        sub = _plan(item)
        if sub is None:
            leaves.append((write, item))
        else:
            nested.append((write, sub))
    return (kind, leaves, nested)


def _build(plan: Plan) -> Any:
    kind, leaves, nested = plan
    if kind is tuple:
        return tuple([_build(item) for item in nested])
    if kind is dict:
        return {key: _build(item) for key, item in nested.items()}
    obj = object.__new__(kind)
    for write, value in leaves:
        write(obj, value)
    for write, item in nested:
        write(obj, _build(item))
    return obj


def _count(plan: Plan) -> int:
    """How many values a plan allocates (containers not counted)."""
    kind, _, nested = plan
    if kind is tuple:
        return sum(_count(item) for item in nested)
    if kind is dict:
        return sum(_count(item) for item in nested.values())
    return 1 + sum(_count(item) for _, item in nested)


def _base64_strings(tree: Any) -> list[str]:
    """The base64 fields of a parsed turn (Source "bytes", Part "signature")."""
    found: list[str] = []
    if isinstance(tree, dict):
        for key, item in tree.items():
            if key in ("bytes", "signature") and isinstance(item, str):
                found.append(item)
            else:
                found.extend(_base64_strings(item))
    elif isinstance(tree, list):
        for item in tree:
            found.extend(_base64_strings(item))
    return found


def strict_cattrs_converter() -> cattrs.Converter:
    """A strict ``cattrs.gen`` converter of the protocol value classes: ``forbid_extra_keys``
    and detailed validation per class, the codec's leaf hooks (no coercion) for every
    other field type, the codec's JSON names. Fields left out take their defaults."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    leaves: set[Any] = set()
    for cls in VALUE_ERRORS:
        for field in attrs.fields(cls):
            hint = field.type
            if not attrs.has(hint):
                leaves.add(hint)
    for hint in leaves:
        if any(attrs.has(arg) for arg in typing.get_args(hint)):
            continue  # tuple[Part, ...], Message | None: cattrs composes these itself
        leaf = structurer_for(hint, ValueError)
        conv.register_structure_hook(hint, lambda value, _type, leaf=leaf: _leaf(leaf, value))
    for cls in VALUE_ERRORS:
        renames = {
            field.name: override(rename=WIRE_NAMES[(cls, field.name)])
            for field in attrs.fields(cls)
            if (cls, field.name) in WIRE_NAMES
        }
        conv.register_structure_hook(
            cls, make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **renames)
        )
    return conv


def _leaf(structure: Callable[[Any], Any], value: Any) -> Any:
    try:
        return structure(value)
    except Fail as fail:
        raise ValueError(str(fail)) from None


def pydantic_ai_turn() -> tuple[Any, bytes] | None:
    """pydantic-ai's ``ModelMessagesTypeAdapter`` and its JSON of the standard turn's
    content (see the module docstring), or None without pydantic-ai."""
    try:
        from pydantic_ai.messages import (
            BinaryContent,
            ModelMessagesTypeAdapter,
            ModelRequest,
            ModelResponse,
            SystemPromptPart,
            TextPart,
            ThinkingPart,
            ToolCallPart,
            ToolReturnPart,
            UserPromptPart,
        )
    except ImportError:
        return None
    turn = standard_turn()
    image = turn[1].parts[1].media
    assert image is not None and image.source.data is not None
    details = orjson.loads(str(turn[3].parts[0].tool_result.output.details))  # type: ignore[union-attr]
    reasoning = turn[2].parts[0]
    messages = [
        ModelRequest(parts=[SystemPromptPart(turn[0].text)]),
        ModelRequest(
            parts=[
                UserPromptPart(
                    [turn[1].text, BinaryContent(image.source.data, media_type="image/png")]
                )
            ],
            metadata={"client": "web", "request_score": 0.75},
        ),
        ModelResponse(
            parts=[
                ThinkingPart(
                    reasoning.text, signature=base64.b64encode(reasoning.signature).decode()
                ),
                ToolCallPart("get_weather", '{"city": "Lisbon", "days": 7}', "call_1"),
                ToolCallPart("identify_landmark", '{"image": "img_0"}', "call_2"),
            ]
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("get_weather", details, "call_1"),
                ToolReturnPart(
                    "identify_landmark", "Belém Tower, Lisbon (confidence 0.93)", "call_2"
                ),
            ]
        ),
        ModelResponse(parts=[TextPart(turn[4].text)], model_name="gpt-test"),
        ModelRequest(parts=[UserPromptPart(turn[5].text)]),
        ModelResponse(parts=[TextPart(turn[6].text)]),
        ModelRequest(parts=[UserPromptPart(turn[7].text)]),
    ]
    data = ModelMessagesTypeAdapter.dump_json(messages)
    # Decodes to the values written (compared by their JSON: fields such as timestamps
    # are filled at construction).
    assert ModelMessagesTypeAdapter.dump_json(ModelMessagesTypeAdapter.validate_json(data)) == data
    return ModelMessagesTypeAdapter, data


def main() -> None:
    turn = standard_turn()
    data = to_json(turn)
    plain = to_builtins(turn)
    messy = orjson.dumps(
        _reindent(parse_exact(data)),
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
    tree = parse_exact_fast(data)
    dec_parse = best(lambda: parse_exact_fast(data))
    strict = strict_cattrs_converter()
    assert strict.structure(tree, list[Message]) == turn
    dec_build, dec_cattrs = best_alternating(
        lambda: from_builtins(tree, list[Message]),
        lambda: strict.structure(tree, list[Message]),
    )
    plain_data = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    dec_plain = best(lambda: from_json(plain_data, list[Message]))
    plan = _plan(tuple(turn))
    assert plan is not None and list(_build(plan)) == turn
    encoded = _base64_strings(orjson.loads(data))
    assert len(encoded) == 2

    def bound() -> None:
        orjson.loads(data)
        for text in encoded:
            base64.b64decode(text, validate=True)
        _build(plan)

    dec_bound = best(bound)
    peer = pydantic_ai_turn()
    dec_peer = None
    if peer is not None:
        adapter, peer_data = peer
        dec, dec_peer = best_alternating(
            lambda: from_json(data, list[Message]), lambda: adapter.validate_json(peer_data)
        )

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
        ("  the same with a strict cattrs.gen converter", dec_cattrs, dec_floor),
        ("from_json, all numbers orjson-spelled", dec_plain, dec_floor),
        (f"lower bound: loads+base64+{_count(plan)} bare values", dec_bound, dec_floor),
    ]
    if dec_peer is not None:
        rows.append(("pydantic-ai validate_json, the same turn", dec_peer, dec_floor))
    for name, seconds, floor in rows:
        print(f"{name:<44}{seconds * 1e6:>10.1f}{seconds / floor:>9.1f}x")
    if dec_peer is not None:
        print(f"from_json (canonical) / pydantic-ai validate_json: {dec / dec_peer:.2f}x")
    else:
        print("pydantic-ai: not installed, its row is skipped")
    print("targets: encode within 3x of its floor, decode within 5x of orjson.loads")


if __name__ == "__main__":
    main()
