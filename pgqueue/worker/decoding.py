"""Decoding the jsonb the worker reads, so that no row can crash a worker.

Postgres stores JSON that Python's ``json`` cannot read back: nesting deeper than Python's
recursion limit (``RecursionError``), integers of more than 4,300 digits (``ValueError``, the
interpreter's int-to-text limit). Found by a fault run: a payload of either kind, enqueued
through SQL, made the claim itself raise while its rows were decoded; the worker died, and its
claim's other jobs stayed ``running`` until their leases expired, never run. The worker's
connections decode jsonb with :func:`safe_loads`: a value that cannot be decoded becomes an
:class:`Undecodable` naming why, and the worker fails that job alone
(:func:`pgqueue.worker.runtime.Worker`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads

#: The errors ``json.loads`` raises for JSON that Postgres accepted (bytes are valid UTF-8
#: JSON there): too deep, or a number Python will not convert.
_DECODE_ERRORS = (RecursionError, ValueError, MemoryError)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A jsonb value the worker could not decode; ``reason`` says why (one line)."""

    reason: str


#: ``json.loads`` without its checks for other encodings than UTF-8 and for a byte order mark,
#: which Postgres never sends: a third fewer instructions for the bench's payload (callgrind).
_decode = json.JSONDecoder().decode


def safe_loads(data: str | bytes) -> Any:
    """``json.loads(data)`` (``data`` as Postgres sends it: UTF-8), or an :class:`Undecodable`
    when Python cannot decode it."""
    try:
        return _decode(data if isinstance(data, str) else data.decode())
    except RecursionError:
        return Undecodable("JSON nested too deeply for Python to decode")
    except _DECODE_ERRORS as exc:
        return Undecodable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


async def configure_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's ``configure`` hook: this connection decodes json and jsonb with
    :func:`safe_loads`."""
    set_json_loads(safe_loads, conn)
