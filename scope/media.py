"""``Media``: a piece of media by value (bytes), by URI, or by provider reference."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias, final
from urllib.parse import urlsplit

import attrs

from scope._validate import check_text, nested, to_bytes, to_enum
from scope.errors import InvalidMediaError
from scope.metadata import EMPTY_METADATA, Metadata

__all__ = ["Media", "Source", "SourceKind"]


class SourceKind(enum.StrEnum):
    """Where media content lives."""

    BYTES = "bytes"
    URI = "uri"
    REFERENCE = "reference"


#: What ``Source`` accepts as its kind: a member or its value (see ``scope.chat._types``).
SourceKindLike: TypeAlias = SourceKind | Literal["bytes", "uri", "reference"]


def _to_source_kind(value: SourceKindLike) -> SourceKind:
    return to_enum(SourceKind, value, InvalidMediaError, "source kind")


def _to_data(value: bytes | bytearray | memoryview) -> bytes:
    return to_bytes(value)


@final
@attrs.frozen
class Source:
    """Media content: ``bytes`` (non-empty data), ``uri`` (an absolute URI) or
    ``reference`` (a provider's non-blank file id). Exactly the kind's field is set."""

    kind: SourceKind = attrs.field(converter=_to_source_kind)
    data: bytes = attrs.field(default=b"", converter=_to_data)
    uri: str = ""
    ref: str = ""

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the source (construction already did)."""
        if type(self.data) is not bytes:
            raise InvalidMediaError(f"source data must be bytes, got {type(self.data).__name__}")
        check_text(self.uri, "source uri", InvalidMediaError)
        check_text(self.ref, "source ref", InvalidMediaError)
        if self.kind is SourceKind.BYTES:
            if not self.data:
                raise InvalidMediaError("a bytes source needs non-empty data")
            if self.uri or self.ref:
                raise InvalidMediaError("a bytes source must not set uri or ref")
        elif self.kind is SourceKind.URI:
            if self.data or self.ref:
                raise InvalidMediaError("a uri source must not set data or ref")
            _check_uri(self.uri)
        else:
            if self.data or self.uri:
                raise InvalidMediaError("a reference source must not set data or uri")
            if not self.ref.strip():
                raise InvalidMediaError("a reference source needs a non-blank ref")


def _check_uri(uri: str) -> None:
    if not uri:
        raise InvalidMediaError("a uri source needs a uri")
    # str.isprintable() is False for control characters and every whitespace but " ".
    if not uri.isprintable() or " " in uri:
        raise InvalidMediaError(
            f"source uri must not contain whitespace or control characters, got {uri!r}"
        )
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise InvalidMediaError(f"source uri {uri!r} is not a URI: {exc}") from None
    if not parts.scheme or not (parts.netloc or parts.path):
        raise InvalidMediaError(
            f"source uri must be absolute (scheme and host or path), got {uri!r}"
        )


_TOKEN: Final = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MIME: Final = re.compile(
    rf"({_TOKEN})/({_TOKEN})"
    rf"(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|\"(?:[^\"\\\x00-\x1f]|\\.)*\"))*"
)


def _check_mime(mime: object) -> str:
    check_text(mime, "media mime", InvalidMediaError, required=True)
    assert isinstance(mime, str)
    if _MIME.fullmatch(mime) is None:
        raise InvalidMediaError(
            f"media mime must be type/subtype with optional ;name=value parameters, got {mime!r}"
        )
    return mime


def _to_media_metadata(value: Mapping[str, Any]) -> Metadata:
    if type(value) is Metadata:
        return value
    return nested(Metadata.coerce, value, InvalidMediaError, "media metadata")


@final
@attrs.frozen
class Media:
    """A piece of media: its MIME type, where its content lives, and optional labels."""

    mime: str
    source: Source
    id: str = ""
    name: str = ""
    metadata: Metadata = attrs.field(default=EMPTY_METADATA, converter=_to_media_metadata)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the media (construction already did)."""
        _check_mime(self.mime)
        if not isinstance(self.source, Source):
            raise InvalidMediaError(
                f"media source must be a Source, got {type(self.source).__name__}"
            )
        check_text(self.id, "media id", InvalidMediaError)
        check_text(self.name, "media name", InvalidMediaError)

    @classmethod
    def from_bytes(cls, mime: str, data: bytes | bytearray | memoryview) -> Media:
        """Media carried by value."""
        return cls(mime, Source(SourceKind.BYTES, data=data))

    @classmethod
    def from_uri(cls, mime: str, uri: str) -> Media:
        """Media at an absolute URI."""
        return cls(mime, Source(SourceKind.URI, uri=uri))

    @classmethod
    def from_reference(cls, mime: str, ref: str) -> Media:
        """Media a provider already holds, by its reference (a file id)."""
        return cls(mime, Source(SourceKind.REFERENCE, ref=ref))


from scope._validate import publish as _publish  # noqa: E402

_publish(__name__, __all__, globals())
