"""scope._context: the one cancellation check and the current conversation, shared by
scope.history and scope.otel."""

from __future__ import annotations

import ast
import asyncio
import pathlib

import anyio
import pytest
import trio

from scope._context import conversation, current_conversation, is_cancellation

SCOPE = pathlib.Path(__file__).resolve().parent.parent / "scope"


async def real_cancellation() -> BaseException:
    """The running backend's own cancellation exception, as a cancelled await raises it."""
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(exc)
            raise
    return caught[0]


@pytest.mark.anyio
async def test_the_backends_cancellation_is_a_cancellation(anyio_backend: str) -> None:
    exc = await real_cancellation()
    expected = {"asyncio": asyncio.CancelledError, "trio": trio.Cancelled}[anyio_backend]
    assert type(exc) is expected
    assert is_cancellation(exc)


@pytest.mark.anyio
async def test_groups_of_cancellations_are_a_cancellation() -> None:
    cancel = await real_cancellation()
    assert is_cancellation(BaseExceptionGroup("one", [cancel]))
    assert is_cancellation(BaseExceptionGroup("two", [cancel, asyncio.CancelledError()]))
    nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [cancel]), cancel])
    assert is_cancellation(nested)


@pytest.mark.anyio
async def test_a_group_holding_anything_else_is_not_a_cancellation() -> None:
    cancel = await real_cancellation()
    assert not is_cancellation(BaseExceptionGroup("mixed", [cancel, ValueError("lost")]))
    deep = BaseExceptionGroup(
        "outer", [cancel, BaseExceptionGroup("inner", [cancel, KeyboardInterrupt()])]
    )
    assert not is_cancellation(deep)
    assert not is_cancellation(ExceptionGroup("errors", [ValueError("a"), OSError("b")]))
    assert not is_cancellation(BaseExceptionGroup("interrupt", [KeyboardInterrupt()]))


@pytest.mark.parametrize(
    "exc",
    [ValueError("x"), GeneratorExit(), KeyboardInterrupt(), SystemExit(0), RuntimeError("y")],
)
def test_errors_and_the_interpreters_base_exceptions_are_not_cancellations(
    exc: BaseException,
) -> None:
    assert not is_cancellation(exc)


def test_conversation_is_current_inside_the_block_only() -> None:
    assert current_conversation() is None
    with conversation("outer"):
        assert current_conversation() == "outer"
        with conversation("inner"):
            assert current_conversation() == "inner"
        assert current_conversation() == "outer"
    assert current_conversation() is None


def test_the_cancellation_check_is_written_once() -> None:
    # A cancellation check is an isinstance() against the interpreter's own
    # non-cancellation BaseExceptions; only scope/_context.py may hold one.
    interpreter = {"GeneratorExit", "KeyboardInterrupt", "SystemExit"}
    offenders = []
    for path in sorted(SCOPE.rglob("*.py")):
        if path == SCOPE / "_context.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and len(node.args) == 2
                and interpreter & {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            ):
                offenders.append(f"{path.relative_to(SCOPE.parent)}:{node.lineno}")
    assert offenders == []


def test_otel_reaches_no_private_history_module() -> None:
    otel = SCOPE / "otel"
    for path in sorted(otel.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("scope.history"), path
                if node.module == "scope.history":
                    pytest.fail(f"{path}: imports scope.history")
