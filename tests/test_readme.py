"""The README's runnable examples run as written (marked ``<!-- runnable -->``)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.S)
BLOCKS = _BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_has_runnable_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: pathlib.Path) -> None:
    # A fresh interpreter, as a reader pasting the example into a file would run it.
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
