"""``scope history branches|rewind|inspect|show|verify`` as a user runs them
(``python -m scope``) on a SQLite store with branches (DESIGN §6h).

Needs SQLiteStore.read_tree/move_head (h-brsql): add as tests/cli/test_cli_branches_sqlite.py
once that is merged. (Checked by h-brfront against a temporary merge of h-brsql e059295.)
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import anyio

from scope.chat import assistant_message, user_message
from scope.history import Batch, rewind
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import subprocess_env


def scope(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scope", *args],
        input="",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(tmp_path, None),
        timeout=60,
        check=False,
    )


def seed(path: pathlib.Path) -> None:
    async def main() -> None:
        async with await SQLiteStore.open(str(path)) as store:
            for append_id, text in (("a1", "q1"), ("a2", "q2")):
                await store.append(
                    Batch("c", append_id, (user_message(text), assistant_message("re " + text)))
                )
            await rewind(store, "c", to=1)
            await store.append(Batch("c", "a3", (user_message("q2b"), assistant_message("re"))))

    anyio.run(main)


def test_branches_inspect_rewind_show_verify_on_sqlite(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "h.db"
    seed(db)
    url = f"sqlite:///{db}"
    listed = scope(tmp_path, "history", "branches", "--store", url, "c")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "conversation c: 2 branches"
    assert re.match(r"  a2  2 turns  diverges at turn 2  \S+Z  sha256:[0-9a-f]{64}$", lines[1])
    assert re.match(r"\* a3  2 turns  current  \S+Z  sha256:[0-9a-f]{64}$", lines[2])

    tree = scope(tmp_path, "history", "inspect", "--store", url, "c")
    assert tree.returncode == 0, tree.stderr
    drawn = tree.stdout.splitlines()
    assert drawn[0] == "conversation c: 3 batches, 2 paths; head a3 (2 turns, 4 messages)"
    assert drawn[2].startswith("└── a1  2 messages  ")
    assert drawn[3].startswith("    ├── a2  2 messages  ")
    assert drawn[4].startswith("    └── a3  2 messages  ") and drawn[4].endswith("  <- head")

    verified = scope(tmp_path, "history", "verify", "--store", url)
    assert (verified.returncode, verified.stdout) == (
        0,
        "verified 3 batches in 1 conversation: all sound\n",
    )

    moved = scope(tmp_path, "history", "rewind", "--store", url, "c", "--to", "0",
                  "--expected-head", "a3")  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.startswith("rewound conversation c to turn 0: head (start), 0 messages")
    again = scope(tmp_path, "history", "rewind", "--store", url, "c", "--to", "0",
                  "--expected-head", "a3")  # fmt: skip
    assert again.returncode == 1
    assert again.stderr.strip().endswith("; nothing was moved")
    shown = scope(tmp_path, "history", "show", "--store", url, "c")
    assert shown.returncode == 1
    assert "no messages on its head path (rewound to its start)" in shown.stderr
    assert scope(tmp_path, "history", "rewind", "--store", url, "c", "--to", "5").returncode == 1
    back = scope(tmp_path, "history", "switch", "--store", url, "c", "--to", "a2")
    assert back.returncode == 0, back.stderr
    assert back.stdout.startswith("switched conversation c to the branch ending at a2: 2 turns")
    shown = scope(tmp_path, "history", "show", "--store", url, "c")
    assert shown.returncode == 0, shown.stderr
    missing = scope(tmp_path, "history", "switch", "--store", url, "c", "--to", "a9")
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith("; nothing was moved")
