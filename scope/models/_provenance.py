"""Provenance and ownership of provider state (DESIGN §6c), shared by every adapter.

Every assistant message an adapter produces is stamped with who produced it: message
metadata ``scope/provider`` (the adapter's ``provider_name``), ``scope/model`` (the
model that answered, else the one asked for) and ``scope/api`` (the wire protocol:
``openai.chat``, ``anthropic.messages``, ...). When a request is built, a ``Replay``
decides which assistant messages are the adapter's own: only their provider state
(signatures, encrypted reasoning, item ids, ``extra_content``...) is sent back. A
message without provenance (stored before v0.3, or built by hand) is foreign.

"The same model" is the model asked for, or a dated snapshot of it: a provider that
answers ``claude-sonnet-4-5`` with ``claude-sonnet-4-5-20250929`` (or ``gpt-4o-mini``
with ``gpt-4o-mini-2024-07-18``) stamps the snapshot, and the alias owns it; another
suffix (``gpt-4o`` against ``gpt-4o-mini``) is another model.

Pure: no I/O.
"""

from __future__ import annotations

import logging
import re
from typing import Final, final

import attrs

from scope.chat import Message, Response, ResponseMetadata
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata
from scope.models._prefix import PREFIX_KEY

__all__ = [
    "API_KEY",
    "DROPPED_KEY",
    "MODEL_KEY",
    "PROVIDER_KEY",
    "Replay",
    "same_model",
    "stamp",
    "with_dropped",
]

#: Message metadata: the ``provider_name`` of the adapter that produced the message.
PROVIDER_KEY: Final = "scope/provider"
#: Message metadata: the model that produced it (the response's, else the one asked for).
MODEL_KEY: Final = "scope/model"
#: Message metadata: the wire protocol it came over (``openai.chat``, ...).
API_KEY: Final = "scope/api"
#: Response extra metadata: how many parts of the request the adapter left out.
DROPPED_KEY: Final = "scope/dropped_parts"

_logger: Final = logging.getLogger("scope.models")

# A dated snapshot suffix: -20250929, -2024-07-18.
_SNAPSHOT: Final = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})")


def same_model(stamped: str, asked: str) -> bool:
    """Whether a message stamped ``stamped`` came from the model ``asked`` (equal, or
    either one a dated snapshot of the other)."""
    if stamped == asked:
        return True
    longer, shorter = (stamped, asked) if len(stamped) > len(asked) else (asked, stamped)
    return (
        bool(shorter)
        and longer.startswith(shorter)
        and _SNAPSHOT.fullmatch(longer, len(shorter)) is not None
    )


def stamp(message: Message, api: str, provider: str, model: str, prefix: str = "") -> Message:
    """``message`` with its provenance in its metadata (the other keys kept), and the
    digest of its prefix (``scope/prefix``, DESIGN §6g) when ``prefix`` is given."""
    values = {API_KEY: api, PROVIDER_KEY: provider, MODEL_KEY: model}
    if prefix:
        values[PREFIX_KEY] = prefix
    return attrs.evolve(message, metadata=message.metadata.merge(Metadata(values)))


def with_dropped(response: Response, dropped: int) -> Response:
    """``response`` with ``dropped`` more parts counted in its extra metadata under
    ``scope/dropped_parts`` (added to a count already there: the parts the provider
    reports it dropped, say)."""
    metadata = response.metadata
    if metadata is None:
        extra = Metadata({DROPPED_KEY: dropped})
        return attrs.evolve(response, metadata=ResponseMetadata(extra=extra))
    there = metadata.extra.get(DROPPED_KEY)
    value = there.value() if there is not None else None
    if type(value) is int:
        dropped += value
    extra = Metadata({DROPPED_KEY: dropped})
    return attrs.evolve(
        response, metadata=attrs.evolve(metadata, extra=metadata.extra.merge(extra))
    )


@final
class Replay:
    """Who is about to send one request: the adapter's ``api`` and ``provider`` and the
    model asked for (``model``, set by the wire mapping once it is chosen). Decides
    which assistant messages are the adapter's own (``owns``) and collects what the
    mapping leaves out (``leave_out``), which the adapter reports on the response
    (``scope/dropped_parts``) and in a DEBUG record of the ``scope.models`` logger."""

    __slots__ = ("_api", "_provider", "left_out", "model", "prefix")

    def __init__(self, api: str, provider: str, model: str = "") -> None:
        self._api = RawJSON.from_value(api)
        self._provider = RawJSON.from_value(provider)
        self.model = model
        #: The digest of what the request sends before the answer (``scope/prefix``,
        #: DESIGN §6g), set by a wire mapping whose provider binds state to the
        #: prefix; ``""`` otherwise (no stamp).
        self.prefix = ""
        #: ``"<where> (<why>)"`` for each part left out, in request order.
        self.left_out: list[str] = []

    def owns(self, message: Message) -> bool:
        """Whether ``message`` was produced by this adapter's API, provider and model."""
        metadata = message.metadata
        if metadata.get(API_KEY) != self._api or metadata.get(PROVIDER_KEY) != self._provider:
            return False
        stamped = metadata.get(MODEL_KEY)
        return stamped is not None and same_model(str(stamped.value()), self.model)

    def leave_out(self, where: str, why: str) -> None:
        """Record that the part at ``where`` is not sent, and why."""
        self.left_out.append(f"{where} ({why})")

    def report(self, adapter: str) -> int:
        """Log what was left out (DEBUG, ``scope.models``); return how many parts."""
        count = len(self.left_out)
        if count and _logger.isEnabledFor(logging.DEBUG):
            _logger.debug(
                "%s left out %d part(s) of the request: %s",
                adapter,
                count,
                "; ".join(self.left_out),
            )
        return count
