"""Provider error classes by status, and the status an error object embedded in a 200
body or stream stands for. Pure: no HTTP library (the wire modules use it too)."""

from __future__ import annotations

from typing import Any, Final

from scope.errors import (
    AuthenticationError,
    BadRequestError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
)

__all__ = [
    "ERROR_TYPE_STATUS",
    "embedded_error",
    "embedded_status",
    "error_for_status",
    "error_message",
]

#: The HTTP status an error ``type`` (or string ``code``) of OpenAI, Anthropic and
#: compatible servers stands for, when the error object names no status of its own.
ERROR_TYPE_STATUS: Final[dict[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "api_error": 500,
    "server_error": 500,
    "internal_server_error": 500,
    "service_unavailable": 503,
    "overloaded_error": 529,
}


def error_for_status(
    status: int | None,
    message: str,
    *,
    body: Any = None,
    request_id: str | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """The provider error class a status stands for: 429 ``RateLimitError``, 401/403
    ``AuthenticationError``, other 4xx ``BadRequestError``, 5xx ``ProviderServerError``,
    anything else (``None`` included) the base ``ProviderError``."""
    kwargs: dict[str, Any] = {"status_code": status, "body": body, "request_id": request_id}
    if status == 429:
        return RateLimitError(message, retry_after=retry_after, **kwargs)
    if status in (401, 403):
        return AuthenticationError(message, **kwargs)
    if status is not None and 400 <= status < 500:
        return BadRequestError(message, **kwargs)
    if status is not None and status >= 500:
        return ProviderServerError(message, **kwargs)
    return ProviderError(message, **kwargs)


def _status(value: object) -> int | None:
    if type(value) is str and value.isascii() and value.isdigit():
        value = int(value)
    if type(value) is int and 100 <= value <= 599:
        return value
    return None


def embedded_status(body: object, error: object) -> tuple[int | None, int | None]:
    """``(stated, implied)`` for an error object inside a 200 body or stream event.

    ``stated``: a status the server wrote down (Groq's top-level ``status_code``, an
    ``error.status_code`` / ``error.status``, OpenRouter's numeric ``error.code``).
    ``implied``: ``stated``, else the status the error's ``type`` or string ``code``
    stands for (``ERROR_TYPE_STATUS``), else ``None``.
    """
    candidates: list[object] = []
    if isinstance(body, dict):
        candidates.append(body.get("status_code"))
    if isinstance(error, dict):
        candidates.extend((error.get("status_code"), error.get("status"), error.get("code")))
    for candidate in candidates:
        stated = _status(candidate)
        if stated is not None:
            return stated, stated
    if isinstance(error, dict):
        for key in ("type", "code"):
            name = error.get(key)
            if isinstance(name, str) and name in ERROR_TYPE_STATUS:
                return None, ERROR_TYPE_STATUS[name]
    return None, None


def embedded_error(message: str, body: object, error: object) -> ProviderError:
    """The provider error for an error object embedded in a 200 body or stream event.

    The class follows the status it states or implies (``embedded_status``); its
    ``status_code`` is the stated status, or ``None`` (the adapter then fills in the
    HTTP status, 200), so a caller can tell a status the server wrote from one the
    adapter inferred.
    """
    stated, implied = embedded_status(body, error)
    exc = error_for_status(implied, message, body=body)
    exc.status_code = stated
    return exc


def error_message(error: object) -> str:
    """The ``message`` of an embedded error object, or ``"no message"``."""
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    return "no message"
