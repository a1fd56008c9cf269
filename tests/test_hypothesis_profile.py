"""The hypothesis profile of tests/conftest.py: no wall-clock limits a busy CI can miss."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(
    os.environ.get("HYPOTHESIS_PROFILE", "scope") != "scope",
    reason="HYPOTHESIS_PROFILE chose another profile",
)


def test_settings_of_a_test_inherit_the_profile() -> None:
    # What a test's @settings(max_examples=...) builds, as the decorator builds it.
    derived = settings(max_examples=7)
    assert derived.deadline is None
    assert HealthCheck.too_slow in derived.suppress_health_check
    assert settings.default.deadline is None


@settings(max_examples=2, database=None)
@given(st.integers())
def test_an_example_slower_than_the_default_deadline_passes(_: int) -> None:
    # 250 ms is past hypothesis' default 200 ms deadline on any machine: under the default
    # profile this raises DeadlineExceeded (or Flaky); under the scope profile it passes.
    time.sleep(0.25)
