"""The example service (docs/examples/web_chat/app.py) as its own process, for the
shutdown tests (tests/web/test_web_shutdown.py): its ``create_app`` and ``serve``
over a SQLite store the test reads after the process exits.

    python tests/web_drain_service.py DB KEEP_INTERRUPTED GRACE RELEASE

The model streams ``word0 word1 ...`` one word at a time, for as long as the file
``RELEASE`` does not exist (a turn far longer than any test waits); once it exists, the
answer ends with ``done.``. The process prints the port it listens on, then serves
until SIGTERM.
"""

from __future__ import annotations

import importlib.util
import pathlib
import socket
import sys
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from scope.chat import FinishReason, Output, Request, Response, StreamerFunc, assistant_message
from scope.historystores.sqlite import SQLiteStore

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "examples" / "web_chat" / "app.py"
#: Words the model says at most before it is released (a bound, never reached).
WORDS = 100_000


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("web_chat_example_service", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(release: pathlib.Path) -> StreamerFunc:
    async def answer(request: Request) -> AsyncGenerator[Response, None]:
        for number in range(WORDS):
            if await anyio.Path(release).exists():
                break
            yield Response(Output(assistant_message(f"word{number} "), None))
            await anyio.sleep(0.02)
        yield Response(Output(assistant_message("done."), FinishReason.STOP))

    return StreamerFunc(answer)


async def main(db: str, keep_interrupted: bool, grace: float, release: pathlib.Path) -> None:
    module = _example()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    async with await SQLiteStore.open(db) as store:
        app = module.create_app(
            _model(release), store, keep_interrupted=keep_interrupted, shutdown_grace=grace
        )
        await module.serve(app, sockets=[listener])


if __name__ == "__main__":
    db, keep, grace, release = sys.argv[1:5]
    anyio.run(main, db, keep == "1", float(grace), pathlib.Path(release))
