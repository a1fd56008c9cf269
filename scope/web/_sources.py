"""What a browser is shown of a provider's own items (DESIGN §6k): the pages a search or a
fetch read, the pages and documents a text cites, the images a model generated.

Only what a person reads goes out (a URL, a title, a file name, an image): never an
item's ids, signatures or encrypted content (a document's file id only tells two
citations of one document apart, here). Items and citations of kinds not listed here
show nothing.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from collections.abc import Iterator
from typing import Any, Final, NamedTuple

from scope.chat import Part, PartKind
from scope.media import Media
from scope.metadata import Metadata

__all__ = ["Document", "Page", "Source", "cited", "images", "sources"]

_CITATIONS: Final = "anthropic/citations"
_GROUNDING: Final = "gemini/grounding"
_ANNOTATIONS: Final = "openai/annotations"

#: Anthropic's citations of a document the request carried, by location kind, and the
#: kind of document each locates into (plain text, a PDF's pages, custom content).
_DOCUMENT_CITATIONS: Final = {
    "char_location": "text/plain",
    "page_location": "application/pdf",
    "content_block_location": "text/plain",
}
#: OpenAI annotations that cite a file (a file search's, a container's).
_FILE_CITATIONS: Final = frozenset({"file_citation", "container_file_citation"})


class Page(NamedTuple):
    """A web page read or cited: an AI SDK ``source-url`` part."""

    url: str
    title: str


class Document(NamedTuple):
    """A document cited (a file, a document the request carried): an AI SDK
    ``source-document`` part. ``key`` tells two citations of one document apart and
    never goes out."""

    key: str
    media_type: str
    title: str
    filename: str


Source = Page | Document


def _pages(value: Any) -> Iterator[Page]:
    """The pages of the objects in ``value`` that name one by its ``url``."""
    for item in value if isinstance(value, list) else ():
        if isinstance(item, dict):
            url = item.get("url")
            if isinstance(url, str) and url:
                title = item.get("title")
                yield Page(url, title if isinstance(title, str) else "")


def _web(pages: Iterator[Page]) -> list[Page]:
    return [page for page in pages if page.url.startswith(("http://", "https://"))]


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _file(key: str, name: str) -> Document:
    """A cited file, its media type guessed from its name."""
    media_type = mimetypes.guess_type(name)[0] if name else None
    return Document(key, media_type or "application/octet-stream", name or key, name)


def _anthropic_citations(value: Any) -> list[Source]:
    found: list[Source] = list(_pages(value))  # web search results, search results
    for citation in value if isinstance(value, list) else ():
        if not isinstance(citation, dict):
            continue
        media_type = _DOCUMENT_CITATIONS.get(_str(citation.get("type")))
        index = citation.get("document_index")
        if media_type is None or type(index) is not int:
            continue
        title = _str(citation.get("document_title")) or f"Document {index + 1}"
        found.append(Document(f"anthropic:{index}", media_type, title, ""))
    return found


def sources(part: Part) -> list[Source]:
    """What ``part`` shows as read or cited: an OpenAI ``web_search_call``'s URL
    sources, an Anthropic web search's results, a web fetch's page, and what a text
    part's Anthropic citations point at (pages, the documents of the request)."""
    if part.kind is PartKind.TEXT:
        cited_by = part.metadata.get(_CITATIONS)
        return [] if cited_by is None else _anthropic_citations(cited_by.value())
    native = part.native
    if native is None:
        return []
    data = native.data.value()
    kind = native.type
    if kind == "web_search_call":
        action = data.get("action")
        return list(_web(_pages(action.get("sources") if isinstance(action, dict) else None)))
    if kind == "web_search_tool_result":
        return list(_pages(data.get("content")))
    if kind == "web_fetch_tool_result":
        return list(_pages([data.get("content")]))
    return []


def _annotations(value: Any) -> list[Any]:
    """The annotations of ``openai/annotations``: a Chat Completions array, or a
    Responses object of one array per text of each message item."""
    if isinstance(value, list):
        return value
    if not isinstance(value, dict):
        return []
    return [
        annotation
        for texts in value.values()
        if isinstance(texts, list)
        for text in texts
        if isinstance(text, list)
        for annotation in text
    ]


def cited(metadata: Metadata) -> list[Source]:
    """What an answer's message metadata cites: a Gemini answer's grounding
    (``gemini/grounding``: its ``groundingChunks``' ``web`` pages and
    ``retrievedContext`` documents) and an OpenAI answer's annotations
    (``openai/annotations``: ``url_citation`` pages, ``file_citation`` and
    ``container_file_citation`` files)."""
    found: list[Source] = []
    grounding = metadata.get(_GROUNDING)
    if grounding is not None:
        chunks = grounding.value().get("groundingChunks")
        for chunk in chunks if isinstance(chunks, list) else ():
            if not isinstance(chunk, dict):
                continue
            web, retrieved = chunk.get("web"), chunk.get("retrievedContext")
            if isinstance(web, dict):
                found.extend(_pages([{"url": web.get("uri"), "title": web.get("title")}]))
            elif isinstance(retrieved, dict):
                uri, title = _str(retrieved.get("uri")), _str(retrieved.get("title"))
                if uri.startswith(("http://", "https://")):
                    found.append(Page(uri, title))
                elif uri or title:
                    found.append(_file(uri or title, title))
    annotations = metadata.get(_ANNOTATIONS)
    for annotation in _annotations(None if annotations is None else annotations.value()):
        if not isinstance(annotation, dict):
            continue
        kind = annotation.get("type")
        if kind == "url_citation":
            # Chat Completions nests the page in "url_citation"; Responses does not.
            inner = annotation.get("url_citation")
            found.extend(_web(_pages([inner if isinstance(inner, dict) else annotation])))
        elif kind in _FILE_CITATIONS:
            key = _str(annotation.get("file_id"))
            if key:
                found.append(_file(key, _str(annotation.get("filename"))))
    return found


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
