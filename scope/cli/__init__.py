"""The ``scope`` command line: ``scope demo``, ``scope chat`` and ``scope history``.

``main(argv=None) -> int`` parses ``argv`` (``sys.argv[1:]`` when None), runs the
command and returns the exit status: 0 on success, 1 for a runtime failure (one
``scope: error: ...`` line on stderr), 2 for a usage error, 130 when interrupted.
Nothing here is imported by ``import scope``.
"""

from scope.cli._app import main as main

__all__ = ["main"]
