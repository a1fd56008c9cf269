"""Retention and erasure (DESIGN §6i): ``ErasureReceipt`` and the checks and hashes every
store shares (owners, expiry times, the store secret and tombstones)."""

from __future__ import annotations

import builtins
import datetime as _dt
import hashlib
import hmac
import re
import secrets
import unicodedata
from collections.abc import Iterable
from typing import Any, Final, final

import attrs
import orjson

from scope.errors import InvalidReceiptError
from scope.history._ids import ConversationID

__all__ = [
    "EMPTY_DIGEST",
    "MAX_OWNER_CHARS",
    "STORE_KINDS",
    "ErasureReceipt",
    "check_erase_limit",
    "check_now",
    "check_owner",
    "check_retention",
    "check_secret",
    "check_tombstone",
    "check_until",
    "erasure_digest",
    "new_secret",
    "tombstone",
]

#: The longest owner (a principal string), in characters.
MAX_OWNER_CHARS: Final = 256
#: The ``store`` of an ``ErasureReceipt``: which kind of store issued it.
STORE_KINDS: Final = ("memory", "sqlite", "postgres", "redis")
#: How many bytes a store secret has.
SECRET_BYTES: Final = 32

_TOMBSTONE = re.compile(r"hmac-sha256:[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_FIELDS: Final = frozenset({"tombstone", "digest", "batches", "bytes", "erased_at", "store"})


def erasure_digest(digests: Iterable[str]) -> str:
    """The digest of an erased conversation: ``"sha256:" + hex(sha256("\\n".join(the
    batch digests in stored order)))``; ``EMPTY_DIGEST`` for no batch."""
    return "sha256:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()


#: ``erasure_digest(())``: the digest of a receipt that erased no batch.
EMPTY_DIGEST: Final = erasure_digest(())


def new_secret() -> bytes:
    """A new store secret: 32 random bytes (``secrets.token_bytes``)."""
    return secrets.token_bytes(SECRET_BYTES)


def tombstone(secret: bytes, conversation_id: str) -> str:
    """The tombstone key of an erased conversation: ``"hmac-sha256:" +
    hex(HMAC-SHA256(secret, conversation_id.encode()))``. It keeps the id out of the
    store; anyone holding the secret and a candidate id can test the candidate."""
    return "hmac-sha256:" + hmac.new(secret, conversation_id.encode(), hashlib.sha256).hexdigest()


def check_owner(owner: object) -> str:
    """An owner (a principal string): a ``str`` of 1 to 256 characters without control
    characters or lone surrogates, else ``ValueError`` (``TypeError`` for a non-string),
    raised before any I/O."""
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a string, got {type(owner).__name__}")
    if not 1 <= len(owner) <= MAX_OWNER_CHARS:
        raise ValueError(f"owner must be 1 to {MAX_OWNER_CHARS} characters, got {len(owner)}")
    if not owner.isprintable():
        for ch in owner:
            if unicodedata.category(ch) in ("Cc", "Cs"):
                raise ValueError(
                    f"owner {owner!r} must not contain control characters or lone surrogates"
                )
    return owner


def check_until(until: object, what: str = "until") -> _dt.datetime | None:
    """An expiry time: an aware ``datetime`` (returned in UTC) or None; a naive one
    raises ``ValueError``, anything else ``TypeError``."""
    if until is None:
        return None
    return _aware(until, what)


def check_now(now: object) -> _dt.datetime | None:
    """``expire``'s ``now``: as ``check_until``."""
    return check_until(now, "now")


def _aware(value: object, what: str) -> _dt.datetime:
    if not isinstance(value, _dt.datetime):
        raise TypeError(f"{what} must be a datetime or None, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime (with a time zone), got {value!r}")
    return value.astimezone(_dt.UTC)


def check_retention(retention: object) -> _dt.timedelta | None:
    """A store-wide retention: a ``timedelta`` > 0 or None (``TypeError`` /
    ``ValueError`` otherwise)."""
    if retention is None:
        return None
    if not isinstance(retention, _dt.timedelta):
        raise TypeError(f"retention must be a timedelta or None, got {type(retention).__name__}")
    if retention <= _dt.timedelta(0):
        raise ValueError(f"retention must be longer than zero, got {retention!r}")
    return retention


def check_erase_limit(limit: object, what: str = "limit") -> int:
    """``expire``'s and ``erase_owned``'s page size: an int >= 1 (``ValueError``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {limit!r}")
    return limit


def _tombstone_field(value: object) -> str:
    if type(value) is not str or _TOMBSTONE.fullmatch(value) is None:
        raise InvalidReceiptError(f"tombstone must be 'hmac-sha256:<64 hex>', got {value!r}")
    return value


def check_tombstone(value: object) -> str:
    """A tombstone as a store keeps it: ``"hmac-sha256:<64 lowercase hex>"``, else
    ``InvalidReceiptError``."""
    return _tombstone_field(value)


def check_secret(value: object) -> bytes:
    """A store secret: ``bytes`` of ``SECRET_BYTES``, else ``ValueError`` (``TypeError``
    for anything but bytes)."""
    if type(value) is not bytes:
        raise TypeError(f"a store secret must be bytes, got {type(value).__name__}")
    if len(value) != SECRET_BYTES:
        raise ValueError(f"a store secret must be {SECRET_BYTES} bytes, got {len(value)}")
    return value


def _digest_field(value: object) -> str:
    if type(value) is not str or _DIGEST.fullmatch(value) is None:
        raise InvalidReceiptError(f"digest must be 'sha256:<64 hex>', got {value!r}")
    return value


def _count_field(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value < 2**63:
        raise InvalidReceiptError(
            f"{what} must be an integer between 0 and 2**63 - 1, got {value!r}"
        )
    return value


def _batches_field(value: object) -> int:
    return _count_field(value, "batches")


def _bytes_field(value: object) -> int:
    return _count_field(value, "bytes")


def _erased_at_field(value: object) -> _dt.datetime:
    if not isinstance(value, _dt.datetime) or value.utcoffset() is None:
        raise InvalidReceiptError(f"erased_at must be an aware datetime, got {value!r}")
    return value.astimezone(_dt.UTC)


def _conversation_id_field(value: object) -> ConversationID | None:
    if value is None:
        return None
    try:
        return ConversationID(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise InvalidReceiptError(f"conversation_id: {exc}") from exc


def _store_field(value: object) -> str:
    if type(value) is not str or value not in STORE_KINDS:
        raise InvalidReceiptError(f"store must be one of {', '.join(STORE_KINDS)}, got {value!r}")
    return value


@final
@attrs.frozen
class ErasureReceipt:
    """What ``erase`` returns: the proof of one conversation's erasure (DESIGN §6i).

    - ``tombstone``: ``"hmac-sha256:" + hex(HMAC-SHA256(store secret, id))``, the key
      the store keeps instead of the id (so the conversation stays closed for ever);
    - ``digest``: ``"sha256:" + hex(sha256("\\n".join(the erased batches' digests in
      stored order)))`` (every branch; ``EMPTY_DIGEST`` when no batch was erased);
    - ``batches`` and ``bytes``: how many batches and encoded message bytes were removed
      (0 and 0 for an unknown, cleared or already erased conversation);
    - ``erased_at``: when (UTC, by the store's clock); ``store``: the kind of store,
      one of ``STORE_KINDS``.

    ``to_json()`` is canonical (sorted keys, no spaces, ``erased_at`` as RFC 3339 UTC
    with microseconds and ``Z``); ``from_json`` reads it back. Any invalid field, here
    or in JSON, raises ``InvalidReceiptError`` naming it. ``scope history verify
    --erased`` and ``Store.check_erased`` check a receipt against a store.

    ``conversation_id`` (DESIGN §6n) is the erased conversation's id, in memory only:
    set on the receipt an erase returns (every bundled store's ``erase`` and
    ``erase_owned``, so ``erase_owner``'s receipts name what they erased), so that the
    service erases its own copies (``ResumableTurns.erased(receipts)``, its caches).
    It is in no ``to_json()``, ``repr`` or ``==`` (a receipt read back equals the one
    returned), and None on a receipt ``from_json`` read: keeping the receipt keeps
    the proof, not the id. Drop the returned receipts (or the ids) once the copies are
    erased.
    """

    tombstone: str = attrs.field(converter=_tombstone_field)
    digest: str = attrs.field(converter=_digest_field)
    batches: int = attrs.field(converter=_batches_field)
    bytes: int = attrs.field(converter=_bytes_field)
    erased_at: _dt.datetime = attrs.field(converter=_erased_at_field)
    store: str = attrs.field(converter=_store_field)
    conversation_id: ConversationID | None = attrs.field(
        default=None, kw_only=True, eq=False, repr=False, converter=_conversation_id_field
    )

    def __attrs_post_init__(self) -> None:
        if self.batches == 0 and (self.digest != EMPTY_DIGEST or self.bytes != 0):
            raise InvalidReceiptError(
                "a receipt that erased no batch has bytes 0 and the empty digest "
                f"{EMPTY_DIGEST}, got bytes {self.bytes} and digest {self.digest}"
            )

    @classmethod
    def of(
        cls,
        *,
        tombstone: str,
        digests: Iterable[str],
        bytes: int,
        erased_at: _dt.datetime,
        store: str,
        conversation_id: str | None = None,
    ) -> ErasureReceipt:
        """The receipt of an erasure that removed batches with these ``digests`` (stored
        order) holding ``bytes`` encoded message bytes; ``conversation_id`` as the class
        docstring says (in memory only)."""
        listed = list(digests)
        return cls(
            tombstone,
            erasure_digest(listed),
            len(listed),
            bytes,
            erased_at,
            store,
            conversation_id=conversation_id,
        )

    def to_json(self) -> builtins.bytes:
        """The canonical JSON form (see the class docstring)."""
        document = {
            "batches": self.batches,
            "bytes": self.bytes,
            "digest": self.digest,
            "erased_at": self.erased_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "store": self.store,
            "tombstone": self.tombstone,
        }
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: str | builtins.bytes | bytearray | memoryview) -> ErasureReceipt:
        """Read a receipt (any JSON spelling of the canonical fields); invalid JSON,
        missing or unknown fields and invalid values raise ``InvalidReceiptError``."""
        try:
            tree: Any = orjson.loads(data)
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise InvalidReceiptError(f"an erasure receipt must be JSON: {exc}") from None
        if type(tree) is not dict:
            raise InvalidReceiptError("an erasure receipt must be a JSON object")
        keys = set(tree)
        if keys != _FIELDS:
            missing = sorted(_FIELDS - keys)
            unknown = sorted(keys - _FIELDS)
            raise InvalidReceiptError(
                f"erasure receipt fields: missing {missing or 'none'}, unknown {unknown or 'none'}"
            )
        erased_at = tree["erased_at"]
        if type(erased_at) is not str:
            raise InvalidReceiptError(f"erased_at must be a string, got {erased_at!r}")
        try:
            when = _dt.datetime.fromisoformat(erased_at)
        except ValueError:
            raise InvalidReceiptError(
                f"erased_at must be an RFC 3339 time, got {erased_at!r}"
            ) from None
        return cls(
            tree["tombstone"], tree["digest"], tree["batches"], tree["bytes"], when, tree["store"]
        )
