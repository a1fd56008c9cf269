"""What a browser is shown of a provider's own items (DESIGN §6k): the pages a search or a
fetch read, the places a text cites, the images a model generated.

Only what a person reads goes out (a URL, a title, an image): never an item's ids,
signatures or encrypted content. Items and citations of kinds not listed here show
nothing.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any, Final

from scope.chat import Part, PartKind
from scope.media import Media
from scope.metadata import Metadata

__all__ = ["grounded", "images", "sources"]

_CITATIONS: Final = "anthropic/citations"
_GROUNDING: Final = "gemini/grounding"
_ANNOTATIONS: Final = "openai/annotations"


def _pages(value: Any) -> Iterator[tuple[str, str]]:
    """``(url, title)`` of each object in ``value`` that names a page by its ``url``."""
    for item in value if isinstance(value, list) else ():
        if isinstance(item, dict):
            url = item.get("url")
            if isinstance(url, str) and url:
                title = item.get("title")
                yield url, title if isinstance(title, str) else ""


def sources(part: Part) -> list[tuple[str, str]]:
    """``(url, title)`` of every page ``part`` shows as read or cited: an OpenAI
    ``web_search_call``'s URL sources, an Anthropic web search's results, a web fetch's
    page, and the pages a text part's Anthropic citations point at."""
    if part.kind is PartKind.TEXT:
        cited = part.metadata.get(_CITATIONS)
        return [] if cited is None else list(_pages(cited.value()))
    native = part.native
    if native is None:
        return []
    data = native.data.value()
    kind = native.type
    if kind == "web_search_call":
        action = data.get("action")
        found = action.get("sources") if isinstance(action, dict) else None
        return [page for page in _pages(found) if page[0].startswith(("http://", "https://"))]
    if kind == "web_search_tool_result":
        return list(_pages(data.get("content")))
    if kind == "web_fetch_tool_result":
        return list(_pages([data.get("content")]))
    return []


def grounded(metadata: Metadata) -> list[tuple[str, str]]:
    """``(url, title)`` of the web pages an answer's message metadata cites: a Gemini
    answer's grounding (``gemini/grounding``: its ``groundingChunks``' ``web``
    members) and the ``url_citation`` annotations of an OpenAI answer
    (``openai/annotations``: a Chat Completions array, or a Responses object of one
    array per text of each message item)."""
    pages: list[tuple[str, str]] = []
    grounding = metadata.get(_GROUNDING)
    if grounding is not None:
        chunks = grounding.value().get("groundingChunks")
        webs = (
            [c.get("web") for c in chunks if isinstance(c, dict)]
            if isinstance(chunks, list)
            else []
        )
        pages.extend(
            _pages(
                [
                    {"url": w.get("uri"), "title": w.get("title")}
                    for w in webs
                    if isinstance(w, dict)
                ]
            )
        )
    annotations = metadata.get(_ANNOTATIONS)
    if annotations is not None:
        value = annotations.value()
        if isinstance(value, dict):  # Responses: item id -> one array per text
            found = [
                a
                for texts in value.values()
                if isinstance(texts, list)
                for t in texts
                if isinstance(t, list)
                for a in t
            ]
        else:
            found = value if isinstance(value, list) else []
        cited = []
        for annotation in found:
            if isinstance(annotation, dict) and annotation.get("type") == "url_citation":
                # Chat Completions nests the page in "url_citation"; Responses does not.
                inner = annotation.get("url_citation")
                cited.append(inner if isinstance(inner, dict) else annotation)
        pages.extend(page for page in _pages(cited) if page[0].startswith(("http://", "https://")))
    return pages


def images(part: Part) -> list[Media]:
    """The image an OpenAI ``image_generation_call`` made (its base64 ``result``)."""
    native = part.native
    if native is None or native.type != "image_generation_call":
        return []
    data = native.data.value()
    result = data.get("result")
    if not isinstance(result, str) or not result:
        return []
    try:
        image = base64.b64decode(result, validate=True)
    except (binascii.Error, ValueError):
        return []
    output_format = data.get("output_format")
    subtype = output_format if output_format in ("png", "jpeg", "webp") else "png"
    return [Media.from_bytes(f"image/{subtype}", image)]
