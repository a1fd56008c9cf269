"""Shared test configuration.

Async tests use anyio's pytest plugin: ``@pytest.mark.anyio`` runs a test under every
backend of the ``anyio_backend`` fixture, asyncio and trio by default. A module that
must run under asyncio alone overrides ``anyio_backend``.

Hypothesis runs under the ``scope`` profile, loaded here before any test module is
imported, so every ``@settings(...)`` inherits it: no wall-clock limit on an example
(``deadline=None``: a 2-core CI box running four workers beside other jobs took 200 ms
for one codec round trip) and no ``too_slow`` health check (it times data generation on
the same clock). A failure prints its reproduction blob. ``HYPOTHESIS_PROFILE`` picks
another registered profile (``dev`` keeps hypothesis' default deadline, to find slow
properties locally).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "scope",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "scope"))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
