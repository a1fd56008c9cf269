"""``python -m scope``: the ``scope`` command line (see ``scope.cli``)."""

from __future__ import annotations

from scope.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
