"""Metadata, Extensions, Media and Source: every rule with its exact error."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from scope.errors import InvalidMediaError, InvalidMetadataError
from scope.jsonvalue import RawJSON
from scope.media import Media, Source, SourceKind
from scope.metadata import Extensions, Metadata
from tests.helpers import nested

# ------------------------------------------------------------------ Metadata


def test_metadata_mapping() -> None:
    meta = Metadata({"k": 1, "r": RawJSON.parse("1.0"), "n": None, "l": [1, "x"]})
    assert meta["k"] == RawJSON.parse("1")
    assert meta["r"].bytes == b"1.0"
    assert meta.decode("r") == 1.0
    assert meta.decode("n") is None
    assert meta.values_dict() == {"k": 1, "r": 1.0, "n": None, "l": [1, "x"]}
    assert len(meta) == 4 and "k" in meta and "z" not in meta
    assert set(meta) == {"k", "r", "n", "l"}
    with pytest.raises(KeyError):
        meta.decode("missing")
    assert not Metadata() and meta
    assert Metadata([("a", 1)]) == Metadata({"a": 1})
    assert Metadata(meta) == meta
    assert hash(meta) == hash(Metadata(dict(meta)))
    assert pickle.loads(pickle.dumps(meta)) == meta
    assert repr(Metadata({"a": 1})) == "Metadata({'a': 1})"


def test_metadata_merge() -> None:
    base = Metadata({"a": 1, "b": 2})
    merged = base.merge({"b": 3, "c": 4})
    assert merged == Metadata({"a": 1, "b": 3, "c": 4})
    assert base == Metadata({"a": 1, "b": 2})  # unchanged
    assert base.merge(Metadata()) is base
    assert Metadata().merge(base) == base
    assert type(Extensions({"p/a": 1}).merge({"p/b": 2})) is Extensions


def test_metadata_immutable() -> None:
    meta = Metadata({"a": 1})
    with pytest.raises(AttributeError):
        meta._data = {}  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del meta._data
    with pytest.raises(TypeError):
        meta["b"] = RawJSON.parse("1")  # type: ignore[index]


def test_metadata_not_equal_to_extensions() -> None:
    assert Metadata({"p/a": 1}) != Extensions({"p/a": 1})


BAD_METADATA: list[tuple[str, Callable[[], Any]]] = [
    ("empty key", lambda: Metadata({"": 1})),
    ("int key", lambda: Metadata({1: 1})),
    ("lone surrogate key", lambda: Metadata({"a\ud800": 1})),
    ("NaN value", lambda: Metadata({"k": float("nan")})),
    ("inf value", lambda: Metadata({"k": [float("inf")]})),
    ("object value", lambda: Metadata({"k": object()})),
    ("lone surrogate value", lambda: Metadata({"k": "\udc00"})),
    ("too deep value", lambda: Metadata({"k": nested(513)})),
    ("duplicate pair", lambda: Metadata([("a", 1), ("a", 2)])),
    ("not pairs", lambda: Metadata([("a", 1, 2)])),
    ("a str", lambda: Metadata("ab")),
    ("an int", lambda: Metadata(5)),  # type: ignore[arg-type]
    ("coerce a list", lambda: Metadata.coerce([("a", 1)])),
    ("merge a list", lambda: Metadata().merge([1])),  # type: ignore[list-item]
    ("extensions no slash", lambda: Extensions({"temperature": 1})),
    ("extensions two slashes", lambda: Extensions({"a/b/c": 1})),
    ("extensions empty namespace", lambda: Extensions({"/name": 1})),
    ("extensions empty name", lambda: Extensions({"ns/": 1})),
    ("extensions space", lambda: Extensions({"ns/a b": 1})),
    ("extensions colon", lambda: Extensions({"ns:x/a": 1})),
    ("extensions vulgar fraction", lambda: Extensions({"ns/\u00bd": 1})),
    ("extensions superscript", lambda: Extensions({"ns/x\u00b2": 1})),
    ("extensions roman numeral", lambda: Extensions({"ns/\u216b": 1})),
    ("extensions empty", lambda: Extensions({"": 1})),
]


@pytest.mark.parametrize("build", [b[1] for b in BAD_METADATA], ids=[b[0] for b in BAD_METADATA])
def test_metadata_refuses(build: Callable[[], Any]) -> None:
    with pytest.raises(InvalidMetadataError) as info:
        build()
    assert type(info.value) is InvalidMetadataError


@pytest.mark.parametrize(
    "key",
    ["openai/seed", "a.b-c_d/e.f", "x/1", "über/größe", "日本/設定", "ns/٣", "Ω/ß"],
)
def test_extensions_keys_accepted(key: str) -> None:
    assert key in Extensions({key: 1})


def test_extensions_namespace() -> None:
    ext = Extensions({"openai/seed": 1, "openai/user": "u", "anthropic/top": 2})
    assert ext.namespace("openai") == {"seed": RawJSON.parse("1"), "user": RawJSON.parse('"u"')}
    assert ext.namespace("none") == {}


def test_metadata_depth_512_value_accepted() -> None:
    assert Metadata({"k": nested(512)})["k"].bytes.count(b"[") == 512


# ------------------------------------------------------------------ Media and Source

PNG = b"\x89PNG\r\n"


def test_media_factories() -> None:
    by_value = Media.from_bytes("image/png", bytearray(PNG))
    assert by_value.source == Source(SourceKind.BYTES, data=PNG)
    assert type(by_value.source.data) is bytes
    assert Media.from_bytes("image/png", memoryview(PNG)).source.data == PNG
    assert Media.from_uri("image/png", "https://x.example/a.png").source.uri.endswith(".png")
    assert Media.from_reference("application/pdf", "file-123").source.ref == "file-123"
    media = Media("image/png", Source("bytes", data=PNG), id="i", name="n", metadata={"a": 1})
    assert media.source.kind is SourceKind.BYTES
    assert media.metadata == Metadata({"a": 1})


@pytest.mark.parametrize(
    "mime",
    [
        "image/png",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "text/plain; charset=utf-8",
        'text/plain;charset="utf-8"',
        "audio/L16;rate=16000;channels=1",
        "image/svg+xml",
    ],
)
def test_mime_accepted(mime: str) -> None:
    assert Media.from_uri(mime, "https://x.example/a").mime == mime


@pytest.mark.parametrize(
    "uri",
    [
        "https://x.example/a.png",
        "s3://bucket/key",
        "file:///tmp/a.png",
        "data:image/png;base64,iVBORw0KGgo=",
        "urn:isbn:0451450523",
        "gs://b/ü.png",
    ],
)
def test_uri_accepted(uri: str) -> None:
    assert Media.from_uri("image/png", uri).source.uri == uri


BAD_MEDIA: list[tuple[str, Callable[[], Any]]] = [
    ("empty mime", lambda: Media.from_uri("", "https://x.example")),
    ("mime without subtype", lambda: Media.from_uri("image", "https://x.example")),
    ("mime with space", lambda: Media.from_uri("image/ png", "https://x.example")),
    ("mime two slashes", lambda: Media.from_uri("image/png/x", "https://x.example")),
    ("mime bad parameter", lambda: Media.from_uri("text/plain; charset", "https://x.example")),
    ("mime trailing semicolon", lambda: Media.from_uri("text/plain;", "https://x.example")),
    ("mime not str", lambda: Media(b"image/png", Source(SourceKind.REFERENCE, ref="r"))),
    ("mime lone surrogate", lambda: Media("image/\ud800", Source(SourceKind.REFERENCE, ref="r"))),
    ("source wrong type", lambda: Media("image/png", "https://x.example")),
    ("id lone surrogate", lambda: Media("image/png", Source("reference", ref="r"), id="\ud800")),
    ("name not str", lambda: Media("image/png", Source("reference", ref="r"), name=1)),
    (
        "metadata bad",
        lambda: Media("image/png", Source("reference", ref="r"), metadata={"": 1}),
    ),
    ("unknown source kind", lambda: Source("file", ref="r")),
    ("bytes empty", lambda: Media.from_bytes("image/png", b"")),
    ("bytes not bytes", lambda: Source(SourceKind.BYTES, data="abc")),
    ("bytes with uri", lambda: Source(SourceKind.BYTES, data=PNG, uri="https://x.example")),
    ("bytes with ref", lambda: Source(SourceKind.BYTES, data=PNG, ref="r")),
    ("uri empty", lambda: Media.from_uri("image/png", "")),
    ("uri relative", lambda: Media.from_uri("image/png", "/a/b.png")),
    ("uri no scheme", lambda: Media.from_uri("image/png", "x.example/a.png")),
    ("uri scheme only", lambda: Media.from_uri("image/png", "https://")),
    ("uri with space", lambda: Media.from_uri("image/png", "https://x.example/a b")),
    ("uri padded", lambda: Media.from_uri("image/png", " https://x.example")),
    ("uri newline", lambda: Media.from_uri("image/png", "https://x.example/\n")),
    ("uri control char", lambda: Media.from_uri("image/png", "https://x.example/\x00")),
    ("uri bad ipv6", lambda: Media.from_uri("image/png", "http://[::1/x")),
    ("uri with data", lambda: Source(SourceKind.URI, data=PNG, uri="https://x.example")),
    ("uri with ref", lambda: Source(SourceKind.URI, uri="https://x.example", ref="r")),
    ("uri lone surrogate", lambda: Media.from_uri("image/png", "https://x.example/\ud800")),
    ("reference empty", lambda: Media.from_reference("image/png", "")),
    ("reference blank", lambda: Media.from_reference("image/png", " \t")),
    ("reference with data", lambda: Source(SourceKind.REFERENCE, data=PNG, ref="r")),
    ("reference with uri", lambda: Source(SourceKind.REFERENCE, uri="https://x.example", ref="r")),
    ("reference lone surrogate", lambda: Media.from_reference("image/png", "\ud800")),
]


@pytest.mark.parametrize("build", [b[1] for b in BAD_MEDIA], ids=[b[0] for b in BAD_MEDIA])
def test_media_refuses(build: Callable[[], Any]) -> None:
    with pytest.raises(InvalidMediaError) as info:
        build()
    assert type(info.value) is InvalidMediaError


def test_media_metadata_error_chains_cause() -> None:
    with pytest.raises(InvalidMediaError) as info:
        Media("image/png", Source("reference", ref="r"), metadata={"k": float("nan")})
    assert type(info.value.__cause__) is InvalidMetadataError


def test_media_is_frozen_and_evolve_revalidates() -> None:
    media = Media.from_uri("image/png", "https://x.example")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        media.mime = "x"  # type: ignore[misc]
    with pytest.raises(InvalidMediaError):
        attrs.evolve(media, mime="png")
    assert hash(media) == hash(Media.from_uri("image/png", "https://x.example"))
    assert repr(media).startswith("Media(")
    assert Media.__module__ == "scope.media"


class _Key(str):
    __slots__ = ()


def test_metadata_keys_of_str_subclasses_become_plain_str() -> None:
    from scope.codec import from_json, to_json

    for cls in (Metadata, Extensions):
        data = cls({_Key("ns/k"): 1})
        (key,) = data
        assert type(key) is str
        assert data == cls({"ns/k": 1})
        assert from_json(to_json(data), cls) == data
    merged = Metadata({"a": 1}).merge({_Key("b"): 2})
    assert all(type(key) is str for key in merged)
    assert to_json(merged) == b'{"a":1,"b":2}'


def test_metadata_values_of_str_subclasses_encode_as_strings() -> None:
    assert Metadata({"c": _Key("abc")})["c"] == RawJSON.parse('"abc"')
