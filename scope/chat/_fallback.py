"""``fallback``: one Model and Streamer that tries several models in order."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Iterable
from typing import Final, final

from scope.chat._model import Model, Streamer
from scope.chat._request import Request
from scope.chat._response import Response
from scope.errors import (
    InvalidRequestError,
    ProviderConnectionError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)

__all__ = ["DEFAULT_FALLBACK_ERRORS", "Fallback", "fallback"]

_log: Final = logging.getLogger("scope.chat")

#: The errors ``fallback`` moves on after by default: the provider is down, overloaded,
#: unreachable or too slow. A bad request, an authentication failure and cancellation are
#: not among them: the next model would fail the same way (or the caller stopped).
DEFAULT_FALLBACK_ERRORS: Final[tuple[type[Exception], ...]] = (
    ProviderServerError,
    RateLimitError,
    ProviderConnectionError,
    ProviderTimeoutError,
)


def _check_on(on: object) -> tuple[type[Exception], ...]:
    if not isinstance(on, tuple):
        raise TypeError(
            f"fallback on= must be a tuple of exception classes, got {type(on).__name__}"
        )
    if not on:
        raise ValueError("fallback on= must name at least one exception class, got ()")
    for index, cls in enumerate(on):
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            # Cancellation (asyncio.CancelledError, trio.Cancelled) is a BaseException:
            # refusing BaseException subclasses keeps it from ever being a reason.
            raise TypeError(
                f"fallback on[{index}] must be a subclass of Exception, got {cls!r}"
                + (
                    " (cancellation and other BaseExceptions never cause a fallback)"
                    if isinstance(cls, type) and issubclass(cls, BaseException)
                    else ""
                )
            )
    return on


def _check_models(models: tuple[object, ...]) -> None:
    if not models:
        raise TypeError("fallback needs at least one model")
    calls = streams = True
    for index, model in enumerate(models):
        is_model = isinstance(model, Model)
        is_streamer = isinstance(model, Streamer)
        if not (is_model or is_streamer):
            raise TypeError(
                f"fallback model {index} must be a scope.chat.Model or Streamer (an object "
                f"with an async call(request) or a stream(request)), got {type(model).__name__}"
            )
        calls = calls and is_model
        streams = streams and is_streamer
    if not (calls or streams):
        raise TypeError(
            "fallback models must all be Models (for call) or all be Streamers (for stream): "
            + ", ".join(
                f"model {i} is only a {'Model' if isinstance(m, Model) else 'Streamer'}"
                for i, m in enumerate(models)
                if not (isinstance(m, Model) and isinstance(m, Streamer))
            )
        )


def _missing(models: tuple[object, ...], protocol: type, what: str) -> str | None:
    missing = [_name(i, m) for i, m in enumerate(models) if not isinstance(m, protocol)]
    if not missing:
        return None
    return f"this fallback cannot {what}: {', '.join(missing)} has no {what}(request)"


def _check_request(request: object) -> None:
    if not isinstance(request, Request):
        raise InvalidRequestError(f"expected a Request, got {type(request).__name__}")
    request.validate()


def _name(index: int, model: object) -> str:
    return f"model {index} ({type(model).__name__})"


def _give_up(error: Exception, earlier: list[Exception]) -> None:
    """Attach the errors of the models given up on before ``error`` (see ``Fallback``)."""
    if not earlier:
        return
    error.fallback_errors = tuple(earlier)  # type: ignore[attr-defined]
    error.add_note(
        "fallback: the models tried before failed with "
        + "; ".join(f"{type(e).__name__}: {e}" for e in earlier)
        + " (see .fallback_errors)"
    )


@final
class Fallback:
    """A ``Model`` and ``Streamer`` that tries its models in order (see ``fallback``).

    Use ``fallback(*models, on=...)`` to build one.
    """

    __slots__ = ("_cannot_call", "_cannot_stream", "_models", "_on")

    def __init__(
        self,
        models: Iterable[Model | Streamer],
        on: tuple[type[Exception], ...] = DEFAULT_FALLBACK_ERRORS,
    ) -> None:
        self._models: tuple[Model | Streamer, ...] = tuple(models)
        _check_models(self._models)
        self._on = _check_on(on)
        # What call/stream say when a model lacks the half they need (None: nothing).
        self._cannot_call = _missing(self._models, Model, "call")
        self._cannot_stream = _missing(self._models, Streamer, "stream")

    @property
    def models(self) -> tuple[Model | Streamer, ...]:
        """The models, in the order they are tried."""
        return self._models

    @property
    def on(self) -> tuple[type[Exception], ...]:
        """The errors after which the next model is tried."""
        return self._on

    def __repr__(self) -> str:
        names = ", ".join(type(model).__name__ for model in self._models)
        return f"Fallback({names}, on=({', '.join(cls.__name__ for cls in self._on)}))"

    async def call(self, request: Request) -> Response:
        """Answer with the first model that does not fail with one of ``on``."""
        if self._cannot_call is not None:
            raise TypeError(self._cannot_call)
        _check_request(request)
        earlier: list[Exception] = []
        last = len(self._models) - 1
        for index, model in enumerate(self._models):
            try:
                return await model.call(request)  # type: ignore[union-attr]
            except self._on as exc:
                if index == last:
                    _give_up(exc, earlier)
                    raise
                _moving_on(index, model, exc)
                earlier.append(exc)
            except Exception as exc:
                _give_up(exc, earlier)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        """A lazy stream from the first model whose stream does not fail with one of
        ``on`` before its first chunk."""
        return self._stream(request)

    async def _stream(self, request: Request) -> AsyncGenerator[Response, None]:
        if self._cannot_stream is not None:
            raise TypeError(self._cannot_stream)
        _check_request(request)
        earlier: list[Exception] = []
        last = len(self._models) - 1
        for index, model in enumerate(self._models):
            inner = model.stream(request)  # type: ignore[union-attr]
            async with contextlib.aclosing(inner):
                try:
                    try:
                        first = await inner.__anext__()
                    except StopAsyncIteration:
                        return  # an empty stream is an answer, not a failure
                    except self._on as exc:
                        if index == last:
                            raise
                        _moving_on(index, model, exc)
                        earlier.append(exc)
                        continue
                    yield first
                    async for chunk in inner:
                        yield chunk
                    return
                except Exception as exc:
                    # After the first chunk nothing falls back: the error ends the stream.
                    _give_up(exc, earlier)
                    raise
        raise AssertionError("unreachable")  # pragma: no cover


def _moving_on(index: int, model: object, exc: Exception) -> None:
    _log.warning(
        "fallback: %s failed with %s: %s; trying the next model",
        _name(index, model),
        type(exc).__name__,
        exc,
    )


def fallback(
    *models: Model | Streamer,
    on: tuple[type[Exception], ...] = DEFAULT_FALLBACK_ERRORS,
) -> Fallback:
    """One ``Model`` and ``Streamer`` that tries ``models`` in order.

    - ``models``: at least one; each a ``Model`` and/or a ``Streamer``. ``call`` needs
      every model to be a ``Model``, ``stream`` every model to be a ``Streamer``; models
      that could do neither together (a mix of call-only and stream-only models) are a
      ``TypeError`` at construction, and the missing half a ``TypeError`` when used.
    - ``on``: the exception classes after which the next model is tried, a non-empty
      tuple of ``Exception`` subclasses (``TypeError`` otherwise; ``ValueError`` for
      an empty one). Default
      ``DEFAULT_FALLBACK_ERRORS``: ``ProviderServerError``, ``RateLimitError``,
      ``ProviderConnectionError``, ``ProviderTimeoutError``.

    The request is checked once, before any model is tried (``InvalidRequestError``).
    Any other error — a ``BadRequestError``, an ``AuthenticationError``, an
    ``InvalidRequestError`` — propagates at once, and cancellation (a
    ``BaseException``, never listable in ``on``) always propagates untouched. Each
    fallback is logged (WARNING on the ``scope.chat`` logger).

    A stream falls back only before its first chunk: once a chunk has reached the
    caller, an error ends the stream (a second model would answer from the start). Each
    model's stream is closed (``aclose()``) before the next is tried and on every path
    out, early stop and cancellation included; no background task is started. An empty
    stream counts as an answer.

    When every model fails, the last model's error is raised. An error that ends the
    fallback after earlier models were given up on (the last one's, or one not in
    ``on``) carries those earlier errors, in order, as its ``fallback_errors``
    attribute (read it with ``getattr(err, "fallback_errors", ())``), and a note
    (``add_note``) naming them; its ``__cause__`` is left as the
    model set it. No ``ExceptionGroup``: ``except RateLimitError`` still works.

    The object has no ``provider_name``: which provider answers is only known per
    attempt. To trace, wrap each model (``fallback(wrap(a, tracing.call), wrap(b,
    tracing.call))``): each attempt gets its own span naming its provider. With the
    history ``Middleware`` outside the fallback, the stored answer's provenance
    (``scope/provider``, ``scope/model``) is the model that answered.
    """
    return Fallback(models, on)
