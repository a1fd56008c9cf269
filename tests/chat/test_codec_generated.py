"""The codec's generated functions: readable tracebacks, no registration order, and the
invariants that let the structurers assemble values without ``__init__``."""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope import codec
from scope._codec import _structure
from scope._codec._errors import Fail, decode_error_for, raise_as
from scope._codec._generated import NAMESPACE
from scope._json import parse_exact_fast
from scope.chat import Message, Request, Response, ToolCall, ToolResult
from scope.codec import from_builtins, from_json, to_json
from scope.errors import InvalidMetadataError, InvalidToolCallError
from scope.jsonvalue import RawJSON
from scope.metadata import Extensions, Metadata
from tests.strategies import json_texts, messages, requests, responses

GOLDEN = Path(__file__).parents[1] / "golden"
GOLDEN_CASES = [("request", Request), ("response", Response), ("chunk", Response)]
GOLDEN_CASES += [("tool_result", ToolResult)]


def test_a_traceback_through_generated_code_shows_its_source_line() -> None:
    structure = NAMESPACE["structure_ToolCall"]
    with pytest.raises(Fail) as caught:
        structure({"id": 1, "name": "f"})
    frames = [
        frame
        for frame in traceback.extract_tb(caught.value.__traceback__)
        if frame.filename.startswith("<scope.codec structure ")
    ]
    # Through the generic structurer, or (once this key layout was learned) through it
    # to the layout's own: each frame shows its generated line.
    raised = "raise expected('a string', v, _structure_ToolCall_error).at('id')"
    assert [frame.line for frame in frames] in ([raised], ["return shaped(value)", raised])
    assert "structure_ToolCall" in "".join(traceback.format_exception(caught.value))


def test_generated_source_is_readable_with_inspect() -> None:
    source = inspect.getsource(NAMESPACE["fields_Message"])
    assert source.startswith("def fields_Message(value):\n")
    assert "encode_Part(e) for e in v" in source
    # Messages nested in a request are written from their cached bytes, by name.
    assert "encode_Message(e) for e in v" in inspect.getsource(NAMESPACE["fields_Request"])
    assert NAMESPACE["encode_Message"] is not NAMESPACE["fields_Message"]


def test_registration_order_does_not_matter() -> None:
    # A fresh interpreter registers every class in reverse order, without scope.codec
    # (which registers them in its own order), and decodes and encodes the golden
    # documents: the same bytes.
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        import orjson
        from scope._codec import _errors, _structure, _unstructure
        from scope._json import parse_exact_fast
        from scope.chat import Request, Response, ToolResult
        assert "scope.codec" not in sys.modules
        for cls in reversed(list(_errors.VALUE_ERRORS)):
            _structure.register(cls)
            _unstructure.register(cls)
        golden = Path(sys.argv[1])
        for name, cls in [("request", Request), ("response", Response),
                          ("chunk", Response), ("tool_result", ToolResult)]:
            tree = parse_exact_fast((golden / f"{name}.json").read_bytes())
            value = _structure.top_in(cls)(tree)
            out = orjson.dumps(value, default=_unstructure.encode_default,
                               option=orjson.OPT_SORT_KEYS)
            sys.stdout.buffer.write(out + b"\\n")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(GOLDEN)], capture_output=True, check=True
    )
    expected = [to_json(from_json((GOLDEN / f"{n}.json").read_bytes(), c)) for n, c in GOLDEN_CASES]
    assert result.stdout.splitlines() == expected


# ---------------------------------------------------------------- the invariants


def _body(function: Any) -> list[str]:
    """The statements of a function, docstring left out, as AST dumps."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef)
    statements = definition.body
    first = statements[0] if statements else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        statements = statements[1:]
    return [ast.dump(statement) for statement in statements]


CALLS_VALIDATE = [ast.dump(ast.parse("self.validate()").body[0])]


@pytest.mark.parametrize("cls", codec._VALUE_CLASSES, ids=lambda cls: cls.__name__)
def test_every_post_init_is_exactly_validate(cls: type) -> None:
    # The structurers assemble values without __init__ and then call validate(): the
    # same checks only if construction checks exactly what validate() does.
    post_init = cls.__dict__.get("__attrs_post_init__")
    validate = cls.__dict__["validate"]
    if post_init is None:
        assert _body(validate) == []  # nothing to check beyond the fields' converters
    else:
        assert _body(post_init) in (CALLS_VALIDATE, _body(validate))


def _values(value: Any) -> Iterator[Any]:
    """Every attrs value inside ``value``, itself included."""
    if isinstance(value, tuple):
        for item in value:
            yield from _values(item)
    elif attrs.has(type(value)):
        yield value
        for field in attrs.fields(type(value)):
            yield from _values(getattr(value, field.name))


def _check_converters(value: Any) -> set[type]:
    """Assert every converter returns a decoded field value unchanged; the classes seen."""
    seen: set[type] = set()
    for item in _values(value):
        cls = type(item)
        seen.add(cls)
        for field in attrs.fields(cls):
            if field.converter is not None:
                decoded = getattr(item, field.name)
                assert field.converter(decoded) is decoded, (cls.__name__, field.name)
    return seen


def test_every_converter_is_a_no_op_on_decoded_values() -> None:
    # The structurers skip the converters: what they produce must be what the
    # converters would make of it (the same object).
    seen: set[type] = set()
    for name, cls in GOLDEN_CASES:
        seen |= _check_converters(from_json((GOLDEN / f"{name}.json").read_bytes(), cls))
    assert seen == set(codec._VALUE_CLASSES)  # the golden documents hold every class


def test_a_builder_only_assembles_a_slotted_attrs_value() -> None:
    # The structurers assemble each value in a builder subclass that adds nothing to
    # its layout, then set its class (the test above sees only the classes themselves).
    @attrs.frozen(slots=False)
    class Loose:
        x: int

    with pytest.raises(TypeError, match="must be a slotted attrs class"):
        _structure._builder(Loose)
    builder = _structure._builder(ToolCall)
    assert builder.__mro__[1] is ToolCall and builder.__basicsize__ == ToolCall.__basicsize__
    value: Any = object.__new__(builder)
    value.id, value.name, value.arguments = "c1", "f", ""
    value.__class__ = ToolCall
    assert type(value) is ToolCall and value == ToolCall("c1", "f")


@settings(max_examples=50, deadline=None)
@given(requests(), responses())
def test_every_converter_is_a_no_op_on_decoded_generated_values(
    request: Request, response: Response
) -> None:
    _check_converters(from_json(to_json(request), Request))
    _check_converters(from_json(to_json(response), Response))


# -- key-layout structurers ------------------------------------------------------------


@contextlib.contextmanager
def generic_structurers() -> Iterator[None]:
    """Every class decodes through its generic structurer meanwhile (no layout is
    known, none is learned)."""
    shapes = {k: v for k, v in NAMESPACE.items() if k.endswith("_shapes")}
    learns = {k: v for k, v in NAMESPACE.items() if k.endswith("_learn")}
    kept = {k: dict(v) for k, v in shapes.items()}
    for name, table in shapes.items():
        table.clear()
        NAMESPACE[name.removesuffix("_shapes") + "_learn"] = lambda keys: None
    try:
        yield
    finally:
        for name, table in shapes.items():
            table.update(kept[name])
        NAMESPACE.update(learns)


def _outcome(data: bytes, cls: Any) -> Any:
    try:
        return from_json(data, cls)
    except ValueError as exc:
        return (type(exc), str(exc), type(exc.__cause__))


#: Values put in place of a member; each use is a copy (the test goes on to change the
#: objects of the tree, and one of these put there twice would change itself).
MUTATIONS: list[Any] = ["", 0, False, [], {}, None, 1.5, "x", {"kind": "text"}, [{}]]


@settings(max_examples=200, deadline=None)
@given(requests(), st.data())
def test_a_layout_structurer_decodes_as_the_generic_one(request: Request, data: Any) -> None:
    """The structurer generated for one key layout returns and raises exactly what the
    generic structurer does, for valid input and for input with members changed."""
    tree = orjson.loads(to_json(request))
    objects = _objects(tree)
    for _ in range(data.draw(st.integers(0, 2))):
        target = data.draw(st.sampled_from(objects))
        keys = sorted(target) or ["text"]
        target[data.draw(st.sampled_from(keys))] = copy.deepcopy(
            data.draw(st.sampled_from(MUTATIONS))
        )
    raw = orjson.dumps(tree)
    learned = _outcome(raw, Request)  # first through the generic path, learning layouts
    again = _outcome(raw, Request)  # now through the learned ones
    with generic_structurers():
        generic = _outcome(raw, Request)
    assert again == learned == generic


def _objects(tree: Any) -> list[dict[str, Any]]:
    if isinstance(tree, dict):
        return [tree, *(d for v in tree.values() for d in _objects(v))]
    if isinstance(tree, list):
        return [d for v in tree for d in _objects(v)]
    return []


def test_a_traceback_through_a_layout_structurer_shows_both_lines() -> None:
    from_builtins({"id": "a", "name": "f"}, ToolCall)  # this layout is learned now
    with pytest.raises(Fail) as caught:
        NAMESPACE["structure_ToolCall"]({"id": 1, "name": "f"})
    frames = traceback.extract_tb(caught.value.__traceback__)
    shown = [(f.filename, f.line) for f in frames if f.filename.startswith("<scope.codec")]
    assert shown[0] == ("<scope.codec structure scope.chat.ToolCall>", "return shaped(value)")
    assert shown[1][0].startswith("<scope.codec structure scope.chat.ToolCall shape")
    assert shown[1][1] == "raise expected('a string', v, _structure_ToolCall_error).at('id')"


def test_layouts_are_learned_once_each_and_bounded() -> None:
    from scope._codec._structure import _SHAPES

    table = NAMESPACE["_structure_ToolCall_shapes"]
    for index in range(_SHAPES + 5):
        # Members in another order each time: another layout, until the bound.
        names = ["id", "name", "arguments"][index % 3 :] + ["id", "name", "arguments"][: index % 3]
        from_builtins({n: f"v{index}" for n in names}, ToolCall)
    assert 1 <= len(table) <= _SHAPES
    with pytest.raises(InvalidToolCallError, match="unknown field 'extra'"):
        from_builtins({"id": "a", "name": "b", "extra": 1}, ToolCall)


def _element_loop(raw: bytes, container: type) -> Any:
    """What ``from_json(raw, list[Message])`` (or ``tuple[...]``) gave before the
    top-level comprehension: each element through ``structure_Message`` in a loop that
    names the index of the first bad one."""
    loop = _structure._tuple_in(_structure._class_in(Message), decode_error_for(Message))
    try:
        try:
            return container(loop(parse_exact_fast(raw)))
        except Fail as fail:
            raise_as(list[Message], fail)
    except ValueError as exc:
        return (type(exc), str(exc), type(exc.__cause__))


@settings(max_examples=200, deadline=None)
@given(st.lists(messages(), max_size=4), st.data())
def test_a_top_level_array_decodes_as_the_element_loop(drawn: list[Message], data: Any) -> None:
    """``list[Message]`` and ``tuple[Message, ...]`` (one comprehension calling the
    learned layouts directly) return and raise exactly what the element loop does, for
    valid arrays and for arrays with elements or members changed, learned or not."""
    tree = orjson.loads(to_json(drawn))
    for _ in range(data.draw(st.integers(0, 2))):
        objects = _objects(tree)
        if objects and data.draw(st.booleans()):
            target = data.draw(st.sampled_from(objects))
            keys = sorted(target) or ["text"]
            target[data.draw(st.sampled_from(keys))] = copy.deepcopy(
                data.draw(st.sampled_from(MUTATIONS))
            )
        elif tree:
            tree[data.draw(st.integers(0, len(tree) - 1))] = copy.deepcopy(
                data.draw(st.sampled_from(MUTATIONS))
            )
    raw = orjson.dumps(tree)
    for container, cls in ((list, list[Message]), (tuple, tuple[Message, ...])):
        expected = _element_loop(raw, container)
        assert _outcome(raw, cls) == expected
        with generic_structurers():
            assert _outcome(raw, cls) == expected


def _metadata_outcome(data: bytes, cls: type[Metadata]) -> Any:
    try:
        return from_json(data, cls)
    except ValueError as exc:
        return (type(exc), str(exc))


def _metadata_constructed(entries: list[tuple[str, str]], cls: type[Metadata]) -> Any:
    """The outcome of building the same entries through ``cls(...)`` (keys checked by
    ``cls._check_key``, each value its exact JSON text), as ``from_json`` reports it."""
    try:
        return cls({key: RawJSON.parse(text) for key, text in entries})
    except ValueError as exc:
        # from_json names the bad key first in the path: ["key"]: message.
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.sampled_from(["", "a", "x/y", "vendor.io/k", "é", "a b"]), st.text()),
            json_texts(max_leaves=4),
        ),
        max_size=3,
        unique_by=lambda entry: entry[0],
    ),
    st.sampled_from([Metadata, Extensions]),
)
def test_metadata_entries_decode_as_the_constructor_checks_them(
    entries: list[tuple[str, str]], cls: type[Metadata]
) -> None:
    """Metadata decoding (its ASCII-key and ``Num`` shortcuts) accepts exactly what the
    class's constructor accepts, keeps every number's spelling, and refuses the rest
    with the same error type; a class with its own key rule (Extensions) applies it."""
    raw = b"{" + b",".join(orjson.dumps(key) + b":" + text.encode() for key, text in entries) + b"}"
    decoded = _metadata_outcome(raw, cls)
    constructed = _metadata_constructed(entries, cls)
    if isinstance(constructed, Metadata):
        assert decoded == constructed
        assert type(decoded) is cls
        assert [bytes(decoded[key].bytes) for key, _ in entries] == [
            RawJSON.parse(text).bytes for _, text in entries
        ]
    else:
        assert isinstance(decoded, tuple) and decoded[0] is constructed


def test_a_metadata_subclass_keeps_the_key_rule_it_inherits() -> None:
    """The ASCII-key shortcut is Metadata's own rule only: a subclass of Extensions
    that does not restate ``_check_key`` still has Extensions' rule applied."""

    class Vendor(Extensions):
        __slots__ = ()

    with pytest.raises(ValueError, match=r"\['nons'\]: extensions key 'nons' must be") as info:
        from_json(b'{"nons":1}', Vendor)
    assert type(info.value.__cause__) is InvalidMetadataError
    with pytest.raises(InvalidMetadataError):
        Vendor({"nons": 1})
    decoded = from_json(b'{"vendor.io/k":1.50}', Vendor)
    assert type(decoded) is Vendor and bytes(decoded["vendor.io/k"].bytes) == b"1.50"
    assert decoded == Vendor({"vendor.io/k": RawJSON.parse("1.50")})
