"""The pytest plumbing of ``StoreConformance``: its async tests and the subclass's async
``store`` fixture run on anyio's test runner, whatever other async plugin is installed."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.pytest_plugin
import pytest


def _fixture_parts(definition: Any) -> tuple[Callable[..., Any], Any] | None:
    """The function and the ``pytest.fixture`` settings behind a fixture definition."""
    get_wrapped = getattr(definition, "_get_wrapped_function", None)  # pytest >= 8.4
    if get_wrapped is not None:
        return get_wrapped(), definition._fixture_function_marker
    marker = getattr(definition, "_pytestfixturefunction", None)  # pytest < 8.4
    wrapped = getattr(definition, "__pytest_wrapped__", None)
    if marker is None or wrapped is None:
        return None
    return wrapped.obj, marker


def _with_backend(func: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
    """Give ``wrapper`` the signature of ``func`` plus ``anyio_backend``, so pytest passes
    it ``func``'s fixtures and the backend."""
    signature = inspect.signature(func)
    parameters = list(signature.parameters.values())
    if "anyio_backend" not in signature.parameters:
        parameters.append(inspect.Parameter("anyio_backend", inspect.Parameter.KEYWORD_ONLY))
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=inspect.Signature.empty
    )
    del wrapper.__wrapped__  # type: ignore[attr-defined]  # pytest reads the signature above


def _runner(anyio_backend: object) -> contextlib.AbstractContextManager[Any]:
    """anyio's test runner for ``anyio_backend``: the one already running, if any."""
    backend, options = anyio.pytest_plugin.extract_backend_and_options(anyio_backend)
    return anyio.pytest_plugin.get_runner(backend, options)


def _test_on_anyio_runner(test: Callable[..., Any]) -> Callable[..., None]:
    """An async test method as a sync one that runs it on anyio's test runner (the one
    its ``store`` fixture runs on). pytest-asyncio, which in auto mode claims every async
    test and runs it on its own asyncio loop, leaves a sync test alone."""

    @functools.wraps(test)
    def run(self: Any, **kwargs: Any) -> None:
        arguments = {name: kwargs[name] for name in names}
        with _runner(kwargs["anyio_backend"]) as runner:
            runner.run_test(functools.partial(test, self), arguments)

    names = list(inspect.signature(test).parameters)[1:]  # after self
    _with_backend(test, run)
    return run


def on_anyio_runner(definition: Any) -> Any:
    """An async fixture method as a sync fixture that runs it on anyio's test runner.

    That is what anyio's pytest plugin does for an async fixture, done before any plugin
    sees it: pytest-asyncio (in auto mode it claims every async fixture and runs it on
    its own asyncio loop) leaves a sync fixture alone, and the fixture then shares the
    runner, so the loop, of the test under every ``anyio_backend``.
    """
    parts = _fixture_parts(definition)
    if parts is None:
        return definition
    func, marker = parts
    is_generator = inspect.isasyncgenfunction(func)
    if not (is_generator or inspect.iscoroutinefunction(func)):
        return definition
    names = list(inspect.signature(func).parameters)[1:]  # after self

    # Not func's __dict__: a @pytest_asyncio.fixture mark on it would hand this sync
    # fixture back to pytest-asyncio.
    @functools.wraps(func, updated=())
    def fixture(self: Any, **kwargs: Any) -> Iterator[Any]:
        arguments = {name: kwargs[name] for name in names}
        bound = functools.partial(func, self)
        with _runner(kwargs["anyio_backend"]) as runner:
            if is_generator:
                yield from runner.run_asyncgen_fixture(bound, arguments)
            else:
                yield runner.run_fixture(bound, arguments)

    _with_backend(func, fixture)
    return pytest.fixture(
        fixture,
        scope=marker.scope,
        params=marker.params,
        autouse=marker.autouse,
        ids=marker.ids,
        name=marker.name,
    )


def tests_on_anyio_runner(cls: type) -> type:
    """``cls`` with each of its own async ``test_*`` methods run on anyio's test runner
    (``_test_on_anyio_runner``); a subclass's own async tests are its plugins' business."""
    for name, test in list(vars(cls).items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(test):
            setattr(cls, name, _test_on_anyio_runner(test))
    return cls
