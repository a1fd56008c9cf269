"""The standard 8-message turn: the one ``scope bench`` measures by default
(``scope/cli/_turn.py``), so the benchmarks and the installed command share it."""

from __future__ import annotations

from scope.cli._turn import standard_turn

__all__ = ["standard_turn"]
