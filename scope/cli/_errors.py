"""The command line's own error: a message for the user and an exit status."""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """Printed as one ``scope: error: <message>`` line; the command exits ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
