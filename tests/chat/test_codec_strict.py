"""The strict structurers (``scope._codec._structure.strict_in``) that stores read
records with: structuring and the canonical check in one pass over the tree.

Against the checked decoder they must equal: ``from_builtins(item, Message)`` and, when
it accepts, encoding the value again and comparing bytes. For every generated item
(valid messages with members changed, added or removed anywhere in the tree), the
strict structurer returns a value exactly when the checked decoder accepts the item and
its encoding is the item's bytes (the same value then); it raises ``Fail`` of the
checked decoder's error class, message and path when that refuses the item before any
non-canonical member; and ``Fail`` of ``NotCanonical`` otherwise, only for an item the
checked decoder either refuses or accepts with other bytes.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from scope._codec._errors import Fail
from scope._codec._structure import CLASS_IN, NotCanonical, strict_in
from scope.chat import Message
from scope.codec import decode_canonical, encode_messages, from_builtins, to_json
from tests.chat.test_codec_canonical import NAMES, VALUES, _dicts
from tests.strategies import messages

#: Values that break a rule or a JSON type, beside the ones the encoder omits.
BAD: list[Any] = [*VALUES, -1, 1.5, "robot", "text", [1], {"kind": "text"}, "!!", "QQ=="]


def _outcome(structure: Any, item: Any) -> Any:
    try:
        return structure(item)
    except Fail as fail:
        return fail


@st.composite
def _items(draw: st.DrawFn) -> Any:
    """One message's tree (as orjson parses the record), changed 0-3 times."""
    tree = orjson.loads(to_json(draw(messages(deltas=True))))
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(_dicts(tree)))
        if target and draw(st.booleans()) and draw(st.booleans()):
            del target[draw(st.sampled_from(sorted(target)))]  # a member missing
        else:
            value = copy.deepcopy(draw(st.sampled_from(BAD)))  # no shared objects
            target[draw(st.sampled_from([*NAMES, "kind", "role", "parts"]))] = value
    # As a stored record holds it: keys sorted (what decode_canonical requires).
    return orjson.loads(orjson.dumps(tree, option=orjson.OPT_SORT_KEYS))


@settings(max_examples=500, deadline=None)
@given(_items())
def test_the_strict_structurer_equals_the_checked_decoder(item: Any) -> None:
    strict = _outcome(strict_in(Message), item)
    plain = _outcome(CLASS_IN[Message], item)
    if isinstance(strict, Fail) and strict.error is not NotCanonical:
        # Refused before any member that is not canonical: as the checked decoder does.
        assert isinstance(plain, Fail)
        assert (strict.error, strict.message, strict.path) == (
            plain.error,
            plain.message,
            plain.path,
        )
        return
    canonical = not isinstance(plain, Fail) and (
        to_json(plain) == orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
    )
    if isinstance(strict, Fail):  # NotCanonical
        assert not canonical
    else:
        assert canonical and strict == plain
        assert from_builtins(item, Message) == strict


@settings(max_examples=300, deadline=None)
@given(st.lists(_items(), min_size=1, max_size=3))
def test_decode_canonical_equals_the_checked_decoder(items: list[Any]) -> None:
    raw = orjson.dumps(items, option=orjson.OPT_SORT_KEYS)
    try:
        decoded = [from_builtins(item, Message) for item in items]
    except ValueError:
        assert decode_canonical(raw) is None  # the exact reader reports it
        return
    found = decode_canonical(raw)
    assert found is not None
    values, canonical = found
    assert list(values) == decoded
    assert canonical == (encode_messages(decoded) == raw)
