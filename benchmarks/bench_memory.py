"""Resident memory while many conversations with media pass through the Middleware.

2,000 conversations, each two turns through the history Middleware over one
``SQLiteStore`` (default options): the first turn's user message carries 256 KiB of
image bytes, the second turn replays it. What stays resident between turns is the
Middleware's process-wide replay cache and the store's decoded-batch cache, both
bounded by bytes (defaults 128 MiB and 64 MiB of the messages' canonical encoding).
Reported: the growth of resident memory (VmRSS, Linux) over the run, sampled every 100
conversations, against the sum of the two bounds, and what each cache holds at the end.
With ``--unbounded`` the byte bounds are lifted (the caches as they were before: 1,024
conversations, 10,000 messages), for comparison.

Run: ``python benchmarks/bench_memory.py [--unbounded]``
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
from scope.history import Middleware
from scope.history._replay import replays
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


async def main(unbounded: bool) -> None:
    if unbounded:
        replays.max_bytes = 2**62
    bound = replays.max_bytes + (2**62 if unbounded else 64 * 2**20)
    with tempfile.TemporaryDirectory() as tmp:
        options = {"decoded_cache_bytes": 2**62} if unbounded else {}
        async with await SQLiteStore.open(os.path.join(tmp, "h.db"), **options) as store:
            gc.collect()
            start = peak = rss()
            for i in range(CONVERSATIONS):
                cid = f"conversation-{i:05d}"
                model = Middleware(store, store, cid).call(Model())
                image = Media.from_bytes("image/png", os.urandom(MEDIA))
                first = user_message(text_part("what is this?"), media_part(image))
                await model.call(Request([first]))
                await model.call(Request([user_message("and now?")]))
                if i % 100 == 99:
                    peak = max(peak, rss())
            gc.collect()
            end = rss()
            cached = store._cache.size
    mib = 2**20
    label = "unbounded" if unbounded else "bounded (defaults)"
    limit = "none" if unbounded else f"{bound / mib:.0f} MiB"
    print(
        f"{label:19} {CONVERSATIONS:,} conversations x {MEDIA // 1024} KiB media: resident "
        f"growth peak {(peak - start) / mib:6.1f} MiB, at the end {(end - start) / mib:6.1f} "
        f"MiB (bound {limit}); replay cache {replays.size[0]:,} conversations "
        f"{replays.size[1] / mib:.1f} MiB, decoded cache {cached[0]:,} messages "
        f"{cached[1] / mib:.1f} MiB"
    )


if __name__ == "__main__":
    anyio.run(main, "--unbounded" in sys.argv[1:])
