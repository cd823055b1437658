"""Handlers by name (``kind``): the built-in ones and those an application registers.

A handler is a callable taking the claimed :class:`~pgqueue.models.Job` and returning a dict
(stored as the job's result), a :class:`~pgqueue.models.HandlerResult` (result plus token
usage), or ``None``; async callables are awaited, plain ones run in a thread. To choose an
outcome explicitly a handler raises :class:`~pgqueue.errors.RetryLater`,
:class:`~pgqueue.errors.RateLimited` or :class:`~pgqueue.errors.Discard`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, overload

from pgqueue.errors import InvalidArgument, InvalidKind
from pgqueue.models import HandlerResult, Job

HandlerReturn = dict[str, Any] | HandlerResult | None
Handler = Callable[[Job], Awaitable[HandlerReturn]] | Callable[[Job], HandlerReturn]

#: Kind of the built-in no-op handler (benchmarks, smoke tests): returns ``{"ok": true}``.
NOOP_KIND = "pgqueue.noop"


class Registry:
    """A mapping of job kinds to handlers.

    Example::

        registry = pgqueue.Registry()

        @registry.handler("thumbnails.render")
        async def render(job: Job) -> dict[str, Any]:
            ...

    and run ``pgqueue work --app myapp.jobs:registry``.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, kind: str, fn: Handler) -> Handler:
        """Register ``fn`` for ``kind``; raises :class:`InvalidKind` for an empty or taken kind."""
        if not isinstance(kind, str) or not kind or len(kind) > 128:
            raise InvalidKind(f"kind must be a string of 1 to 128 characters, got {kind!r}")
        if kind in self._handlers:
            raise InvalidKind(f"a handler for kind {kind!r} is already registered")
        self._handlers[kind] = fn
        return fn

    @overload
    def handler(self, kind: str) -> Callable[[Handler], Handler]: ...
    @overload
    def handler(self, kind: str, fn: Handler) -> Handler: ...
    def handler(
        self, kind: str, fn: Handler | None = None
    ) -> Handler | Callable[[Handler], Handler]:
        """Register ``fn`` for ``kind``, or use as a decorator ``@registry.handler("kind")``."""
        if fn is not None:
            return self.register(kind, fn)

        def decorate(f: Handler) -> Handler:
            return self.register(kind, f)

        return decorate

    def get(self, kind: str) -> Handler:
        """The handler for ``kind``; raises :class:`InvalidKind` when none is registered."""
        try:
            return self._handlers[kind]
        except KeyError:
            raise InvalidKind(f"no handler registered for kind {kind!r}") from None

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._handlers))

    def merged(self, other: Registry) -> Registry:
        """A new registry with this one's handlers and ``other``'s (``other`` wins on a clash)."""
        out = Registry()
        out._handlers = {**self._handlers, **other._handlers}
        return out


async def noop(job: Job) -> dict[str, Any]:
    """The built-in no-op handler: does nothing, succeeds."""
    return {"ok": True}


def _one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: first line of its message``."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def load_app(spec: str) -> Registry:
    """Import ``module:attribute`` and return the :class:`Registry` found there.

    The current directory is searched first, as ``python -m``, uvicorn, celery and rq do: the
    ``pgqueue`` console script's own folder is on the path, the user's is not (found by a
    tester: ``--app myapp.jobs:registry`` from the folder holding ``myapp/`` failed).

    Raises:
        InvalidArgument: the spec is malformed, the module cannot be imported, or the
            attribute is not a Registry, nor a function that takes no arguments and returns
            one (one line naming what was expected; found by a tester: ``--app json:dumps``
            gave a raw traceback).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"--app expects 'module:attribute', got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # the module itself failed: its error, in one line
        raise InvalidArgument(f"cannot import {module_name!r}: {_one_line(exc)}") from exc
    expected = "expected a pgqueue.Registry, or a function that takes no arguments and returns one"
    if not hasattr(module, attr):
        raise InvalidArgument(f"--app {spec}: module {module_name!r} has no {attr!r}; {expected}")
    target = getattr(module, attr)
    if callable(target) and not isinstance(target, Registry):
        try:
            target = target()
        except Exception as exc:
            raise InvalidArgument(
                f"--app {spec}: calling {attr}() failed ({_one_line(exc)}); {expected}"
            ) from exc
        if not isinstance(target, Registry):
            raise InvalidArgument(
                f"--app {spec}: {attr}() returned {type(target).__name__}; {expected}"
            )
    if not isinstance(target, Registry):
        raise InvalidArgument(f"--app {spec} is {type(target).__name__}; {expected}")
    return target
