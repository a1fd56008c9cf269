"""Resident memory while many conversations with media pass through the Middleware.

2,000 conversations, each two turns through the history Middleware over one
``SQLiteStore`` (default options): the first turn's user message carries 256 KiB of
image bytes, the second turn replays it. What stays resident between turns is the
store handle's one ``HistoryCache`` (decoded batches and checked replays), bounded by
``cache_bytes`` (default 32 MiB, each entry counted at twice its canonical encoding).
Reported: the growth of resident memory (VmRSS, Linux) over the run, sampled every 100
conversations, against the bound, and what the cache holds at the end. With
``--unbounded`` the bound is lifted, for comparison; ``--cache-bytes N`` sets it. With
``--window`` the Middleware reads through a ``WindowReader(store, max_tokens=100_000)``
built per conversation, whose projections live in the same cache.

Run: ``python benchmarks/bench_memory.py [--unbounded | --cache-bytes N] [--window]``
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scope.chat import (
    FinishReason,
    Output,
    Request,
    Response,
    assistant_message,
    media_part,
    text_part,
    user_message,
)
from scope.history import Middleware, WindowReader
from scope.historystores.sqlite import SQLiteStore
from scope.media import Media

CONVERSATIONS, MEDIA = 2000, 256 * 1024
ANSWER = Response(Output(assistant_message("seen"), FinishReason.STOP))


class Model:
    async def call(self, request: Request) -> Response:
        return ANSWER


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def main(unbounded: bool, cache_bytes: int | None, windowed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        options = {"cache_bytes": 2**62} if unbounded else {}
        if cache_bytes is not None:
            options = {"cache_bytes": cache_bytes}
        async with await SQLiteStore.open(os.path.join(tmp, "h.db"), **options) as store:
            gc.collect()
            start = peak = rss()
            for i in range(CONVERSATIONS):
                cid = f"conversation-{i:05d}"
                reader = WindowReader(store, max_tokens=100_000) if windowed else store
                model = Middleware(reader, store, cid).call(Model())
                image = Media.from_bytes("image/png", os.urandom(MEDIA))
                first = user_message(text_part("what is this?"), media_part(image))
                await model.call(Request([first]))
                await model.call(Request([user_message("and now?")]))
                if i % 100 == 99:
                    peak = max(peak, rss())
            gc.collect()
            end = rss()
            cached = store.history_cache.size
            bound = store.history_cache.max_bytes
    mib = 2**20
    label = "unbounded" if unbounded else "bounded (defaults)" if not options else "bounded"
    label += ", window" if windowed else ""
    limit = "none" if unbounded else f"{bound / mib:.0f} MiB"
    print(
        f"{label:19} {CONVERSATIONS:,} conversations x {MEDIA // 1024} KiB media: resident "
        f"growth peak {(peak - start) / mib:6.1f} MiB, at the end {(end - start) / mib:6.1f} "
        f"MiB (bound {limit}); the cache holds {cached[0]:,} entries, "
        f"{cached[1] / mib:.1f} MiB"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    chosen = int(args[args.index("--cache-bytes") + 1]) if "--cache-bytes" in args else None
    anyio.run(main, "--unbounded" in args, chosen, "--window" in args)
