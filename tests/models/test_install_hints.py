"""Importing an adapter without its extra names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["openai", "anthropic", "gemini"])
def test_an_adapter_without_httpx_names_the_extra(module: str) -> None:
    # A fresh interpreter in which httpx cannot be imported (as in a virtualenv without
    # the extra).
    code = f"import sys; sys.modules['httpx'] = None; import scope.models.{module}"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"ImportError: scope.models.{module} needs httpx: install the extra, "
        f"pip install 'scope-chat[{module}]'"
    )
