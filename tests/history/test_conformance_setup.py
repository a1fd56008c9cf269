"""StoreConformance works in the set-ups users have: pytest-asyncio in auto mode or strict
mode, anyio's default backends (every installed one, trio included), and a store bound to
the event loop it was opened on (as a driver's connection pool is).

Each case runs a subclass written as the docs show (a plain ``@pytest.fixture async def
store``) in a fresh pytest session.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

_MODULE = textwrap.dedent(
    '''
    import asyncio

    import pytest
    import pytest_asyncio

    from scope.history.inmemory import InMemoryStore
    from scope.history.storetest import StoreConformance


    class TestPlainFixture(StoreConformance):
        """The docs' subclass: runs under anyio's default backends, asyncio and trio."""

        @pytest.fixture
        async def store(self):
            yield InMemoryStore()

        async def reopen(self, store):
            return store


    class TestPytestAsyncioFixture(StoreConformance):
        """A fixture marked for pytest-asyncio runs on the test's loop all the same."""

        @pytest_asyncio.fixture
        async def store(self):
            yield InMemoryStore()


    class LoopBoundStore:
        """Usable only on the asyncio loop that opened it, like an asyncpg pool."""

        def __init__(self):
            self.loop = asyncio.get_running_loop()
            self.inner = InMemoryStore()

        def __getattr__(self, name):
            method = getattr(self.inner, name)

            def on_my_loop(*args, **kwargs):
                assert asyncio.get_running_loop() is self.loop, "used on another event loop"
                return method(*args, **kwargs)

            return on_my_loop


    class TestAsyncioOnlyStore(StoreConformance):
        @pytest.fixture
        def anyio_backend(self):
            return "asyncio"

        @pytest.fixture
        async def store(self, tmp_path):
            assert tmp_path.is_dir()  # the fixture's own fixtures are passed
            yield LoopBoundStore()
    '''
)


@pytest.mark.parametrize("mode", ["auto", "strict"])
def test_a_plain_async_store_fixture_passes_under_every_backend(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makeini(
        f"""
        [pytest]
        asyncio_mode = {mode}
        asyncio_default_fixture_loop_scope = function
        filterwarnings = error
        """
    )
    pytester.makepyfile(test_mystore=_MODULE)
    result = pytester.runpytest_inprocess("-v", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes and "errors" not in outcomes, result.stdout.str()
    passed = result.stdout.lines
    for backend in ("asyncio", "trio"):
        assert any(
            "TestPytestAsyncioFixture::test_" in line and f"[{backend}" in line and "PASSED" in line
            for line in passed
        )
        assert any(
            "TestPlainFixture::test_" in line and f"[{backend}" in line and "PASSED" in line
            for line in passed
        )
    # The pinned class runs under asyncio alone, fixture and test on one loop.
    assert not [line for line in passed if "TestAsyncioOnlyStore" in line and "trio" in line]
    assert any("TestAsyncioOnlyStore::test_" in line and "PASSED" in line for line in passed)
