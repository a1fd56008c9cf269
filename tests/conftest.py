"""Shared test configuration.

Async tests use anyio's pytest plugin: ``@pytest.mark.anyio`` runs a test under every
backend of the ``anyio_backend`` fixture, asyncio and trio by default. A module that
must run under asyncio alone overrides ``anyio_backend``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
