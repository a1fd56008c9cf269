"""Provenance and ownership of provider state (DESIGN §6c, §6g), shared by every adapter.

Every assistant message an adapter produces is stamped with who produced it: message
metadata ``scope/provider`` (the adapter's ``provider_name``), ``scope/model`` (the
model that answered, else the one asked for), ``scope/asked`` (the model the request
asked for, after the options resolved), ``scope/api`` (the wire protocol:
``openai.chat``, ``anthropic.messages``, ...) and, when the adapter has a
``provider_account``, ``scope/account``. When a request is built, a ``Replay`` decides
which assistant messages are the adapter's own: only their provider state (signatures,
encrypted reasoning, item ids, ``extra_content``...) is sent back. A message without
provenance (stored before v0.3, or built by hand) is foreign.

The rule (``Replay.owns``): the same ``scope/api`` and ``scope/provider``; not another
account (a message stamped with a ``scope/account`` other than the adapter's
``provider_account``, when both are set); and the same model:

- stamped with ``scope/asked`` (v0.4): the model asked then is the model asked now, or
  the model that answered (``scope/model``) is the model asked now or a dated snapshot
  of it (``snapshot_of``). Asking ``claude-sonnet-4-0`` again owns what it answered as
  ``claude-sonnet-4-20250514``; asking ``claude-sonnet-4-20250514`` owns it too.
- without ``scope/asked`` (stamped by v0.3): the two model names are equal or one is a
  dated snapshot of the other (``same_model``), Anthropic's alias forms included.

"A dated snapshot" of a model is its name plus ``-YYYYMMDD`` or ``-YYYY-MM-DD``
(``claude-sonnet-4-5`` -> ``claude-sonnet-4-5-20250929``, ``gpt-4o-mini`` ->
``gpt-4o-mini-2024-07-18``), or, for a name in one of Anthropic's alias forms, what is
left without ``-0`` or ``-latest`` plus a date (``claude-sonnet-4-0`` ->
``claude-sonnet-4-20250514``, ``claude-3-7-sonnet-latest`` ->
``claude-3-7-sonnet-20250219``). Any other suffix (``gpt-4o`` against ``gpt-4o-mini``)
is another model.

Pure: no I/O.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Final, final

import attrs
import orjson

from scope.chat import Message, Part, Response, ResponseMetadata, Role
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata
from scope.models._prefix import PREFIX_KEY

__all__ = [
    "ACCOUNT_KEY",
    "API_KEY",
    "ASKED_KEY",
    "DROPPED_KEY",
    "MODEL_KEY",
    "PROVIDER_KEY",
    "Replay",
    "same_model",
    "snapshot_of",
    "stamp",
    "with_dropped",
]

#: Message metadata: the ``provider_name`` of the adapter that produced the message.
PROVIDER_KEY: Final = "scope/provider"
#: Message metadata: the model that produced it (the response's, else the one asked for).
MODEL_KEY: Final = "scope/model"
#: Message metadata: the wire protocol it came over (``openai.chat``, ...).
API_KEY: Final = "scope/api"
#: Message metadata: the model the request asked for (after the options resolved).
ASKED_KEY: Final = "scope/asked"
#: Message metadata: the adapter's ``provider_account``, when it has one.
ACCOUNT_KEY: Final = "scope/account"
#: Response extra metadata: how many parts of the request the adapter left out.
DROPPED_KEY: Final = "scope/dropped_parts"

_logger: Final = logging.getLogger("scope.models")

# A dated snapshot suffix: -20250929, -2024-07-18.
_SNAPSHOT: Final = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})")
# Anthropic's alias forms: claude-sonnet-4-0, claude-3-7-sonnet-latest.
_ALIAS_SUFFIXES: Final = ("-0", "-latest")


def _dated(name: str, base: str) -> bool:
    """Whether ``name`` is ``base`` (non-empty) plus a dated snapshot suffix."""
    return bool(base) and name.startswith(base) and _SNAPSHOT.fullmatch(name, len(base)) is not None


def snapshot_of(model: str, asked: str) -> bool:
    """Whether ``model`` is ``asked`` or a dated snapshot of it: ``asked`` plus a date,
    or, when ``asked`` is in an Anthropic alias form (``-0``, ``-latest``), the rest of
    it plus a date (``claude-sonnet-4-0`` -> ``claude-sonnet-4-20250514``)."""
    if model == asked or _dated(model, asked):
        return True
    for suffix in _ALIAS_SUFFIXES:
        if asked.endswith(suffix) and _dated(model, asked[: -len(suffix)]):
            return True
    return False


def same_model(stamped: str, asked: str) -> bool:
    """The rule for messages stamped without ``scope/asked`` (v0.3): whether a message
    stamped ``stamped`` came from the model ``asked`` (equal, or either one a dated
    snapshot of the other, ``snapshot_of``)."""
    return snapshot_of(stamped, asked) or snapshot_of(asked, stamped)


def stamp(
    message: Message,
    api: str,
    provider: str,
    model: str,
    *,
    asked: str | None = None,
    account: str | None = None,
    prefix: str = "",
) -> Message:
    """``message`` with its provenance in its metadata (the other keys kept):
    ``scope/api``, ``scope/provider``, ``scope/model``, and ``scope/asked`` and
    ``scope/account`` when given, and the digest of its prefix (``scope/prefix``,
    DESIGN §6g) when ``prefix`` is given."""
    stamps: dict[str, str] = {API_KEY: api, PROVIDER_KEY: provider, MODEL_KEY: model}
    if asked is not None:
        stamps[ASKED_KEY] = asked
    if account is not None:
        stamps[ACCOUNT_KEY] = account
    if prefix:
        stamps[PREFIX_KEY] = prefix
    return attrs.evolve(message, metadata=message.metadata.merge(Metadata(stamps)))


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
    """Who is about to send one request: the adapter's ``api``, ``provider`` and
    ``account`` (its ``provider_account``, or None) and the model asked for (``model``,
    set by the wire mapping once it is chosen). Decides which assistant messages are the
    adapter's own (``owns``), stamps its answers (``stamp``) and collects what the
    mapping leaves out (``leave_out``), which the adapter reports on the response
    (``scope/dropped_parts``) and in a DEBUG record of the ``scope.models`` logger."""

    __slots__ = (
        "_account",
        "_api",
        "_provider",
        "account",
        "api",
        "left_out",
        "model",
        "prefix",
        "provider",
    )

    def __init__(
        self, api: str, provider: str, model: str = "", account: str | None = None
    ) -> None:
        self.api = api
        self.provider = provider
        self.account = account
        self._api = RawJSON.from_value(api)
        self._provider = RawJSON.from_value(provider)
        self._account = None if account is None else RawJSON.from_value(account)
        self.model = model
        #: The digest of what the request sends before the answer (``scope/prefix``,
        #: DESIGN §6g), set by a wire mapping whose provider binds state to the
        #: prefix; ``""`` otherwise (no stamp).
        self.prefix = ""
        #: ``"<where> (<why>)"`` for each part left out, in request order.
        self.left_out: list[str] = []

    def owns(self, message: Message) -> bool:
        """Whether ``message`` was produced by this adapter: its API, provider, account
        and model (the module docstring's rule)."""
        metadata = message.metadata
        if not self._same_source(metadata):
            return False
        stamped = _text(metadata.get(MODEL_KEY))
        if ASKED_KEY in metadata:
            asked = _text(metadata[ASKED_KEY])
            return (asked is not None and asked == self.model) or (
                stamped is not None and snapshot_of(stamped, self.model)
            )
        return stamped is not None and same_model(stamped, self.model)

    def owns_part(self, message: Message, part: Part, own: bool) -> bool:
        """Whether the state of ``part`` of ``message`` (``own``: ``owns(message)``) goes
        back: a part stamped with a model of its own (``scope/model`` in its metadata:
        what an Anthropic server-side fallback answered after its ``fallback`` block,
        DESIGN §6k) belongs to that model, asked now by name or as a dated snapshot;
        any other part is the message's."""
        model = part.metadata.get(MODEL_KEY)
        if model is None:
            return own
        stamped = _text(model)
        return (
            stamped is not None
            and snapshot_of(stamped, self.model)
            and self._same_source(message.metadata)
        )

    def _same_source(self, metadata: Metadata) -> bool:
        """Stamped with this adapter's API and provider, and not another account."""
        if metadata.get(API_KEY) != self._api or metadata.get(PROVIDER_KEY) != self._provider:
            return False
        if self._account is not None:
            account = metadata.get(ACCOUNT_KEY)
            if account is not None and account != self._account:
                return False  # both stamped, and not the same organisation
        return True

    def stamp(self, message: Message, answered: str) -> Message:
        """``message`` stamped as this adapter's answer from the model ``answered`` (the
        response's model; the one asked for when the response names none)."""
        return stamp(
            message,
            self.api,
            self.provider,
            answered or self.model,
            asked=self.model,
            account=self.account,
            prefix=self.prefix,
        )

    def native(self, part: Part, own: bool, where: str) -> orjson.Fragment | None:
        """The wire JSON of a native part (DESIGN §6k) to send in its position, verbatim,
        or None (recorded as left out) unless the message is ``own`` and the item is in
        this adapter's wire form (``NativeItem.provider`` is its ``api``)."""
        native = part.native
        assert native is not None
        if not own:
            self.leave_out(where, "a native item of another model")
            return None
        if native.provider != self.api:
            self.leave_out(where, f"a native item of {native.provider}")
            return None
        return orjson.Fragment(native.data.bytes)

    def window_start(self, messages: Sequence[Message], item_type: str) -> tuple[int, int] | None:
        """Where the window of a request to this adapter starts (DESIGN §6k): the
        message and part index of the last native ``item_type`` part (a provider's
        compaction) of a message this adapter owns, in its wire form; None without one.
        What comes before it is what it stands for: the adapter does not send it."""
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.role is not Role.ASSISTANT:
                continue
            found = None
            for position, part in enumerate(message.parts):
                native = part.native
                if native is not None and native.type == item_type and native.provider == self.api:
                    found = position
            if found is not None and self.owns(message):
                return index, found
        return None

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


def _text(value: RawJSON | None) -> str | None:
    """A stamp's string, or None when it is absent or not a string (a stamp of another
    type was not written by an adapter: it matches no model)."""
    if value is None:
        return None
    decoded = value.value()
    return decoded if isinstance(decoded, str) else None
