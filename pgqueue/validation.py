"""Input validation at the enqueue boundary, before anything touches the database.

The SQL function ``pgqueue.validate_job`` applies the same rules to SQL callers; checking here
first keeps the caller's transaction usable (a failed SQL statement would abort it). Both sides
raise the same error classes (see :mod:`pgqueue.errors`), and a property test holds them equal.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue.errors import (
    InvalidArgument,
    InvalidKind,
    InvalidPayload,
    InvalidSla,
    InvalidTenant,
    NulCharacter,
    PayloadTooLarge,
    UnknownOrigin,
)
from pgqueue.models import DEFAULT_KIND, Origin

MAX_TENANT_ID_CHARS = 128
MAX_KIND_CHARS = 128
MAX_ATTEMPTS_LIMIT = 1000
MAX_DEDUPE_KEY_CHARS = 256
_INT32_MAX = 2_147_483_647
# An escaped U+0000 that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: JSON text as Postgres prints jsonb (", " and ": " separators, UTF-8 kept); raises
#: ValueError for NaN/Infinity and TypeError for what JSON cannot hold.
to_json_text = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": ")).encode


@dataclass(frozen=True, slots=True)
class CheckedJob:
    """A job that passed validation, with its payload already encoded as JSON text."""

    tenant_id: str
    origin: Origin
    payload: Mapping[str, Any]
    payload_json: str
    sla_seconds: float | None
    kind: str
    max_attempts: int | None
    run_at: datetime | None
    dedupe_key: str | None = None


def _check_text(value: object, what: str, limit: int, error: type[Exception]) -> str:
    if not isinstance(value, str) or value == "" or len(value) > limit:
        raise error(f"{what} must be a string of 1 to {limit} characters, got {value!r:.80}")
    if "\x00" in value:
        raise NulCharacter(f"{what} contains a NUL character (U+0000)")
    return value


def check_origin(origin: object) -> Origin:
    """Parse ``origin``; raises :class:`UnknownOrigin` for anything but the three origins."""
    if isinstance(origin, Origin):
        return origin
    if isinstance(origin, str):
        try:
            return Origin(origin)
        except ValueError:
            pass
    allowed = ", ".join(o.value for o in Origin)
    raise UnknownOrigin(f"unknown origin {origin!r:.80}; expected one of {allowed}")


def check_sla(sla_seconds: object) -> float | None:
    """``None`` or a finite number of seconds ≥ 0; raises :class:`InvalidSla` otherwise."""
    if sla_seconds is None:
        return None
    if isinstance(sla_seconds, bool) or not isinstance(sla_seconds, int | float):
        raise InvalidSla(f"sla_seconds must be a number of seconds or None, got {sla_seconds!r}")
    value = float(sla_seconds)
    if not math.isfinite(value) or value < 0:
        raise InvalidSla(f"sla_seconds must be finite and >= 0, got {sla_seconds!r}")
    return value


def encode_payload(payload: object) -> str:
    """Encode ``payload`` as JSON text the way Postgres prints jsonb.

    Raises:
        InvalidPayload: not serialisable, or holds NaN/Infinity or a lone surrogate.
        NulCharacter: a string (or key) holds U+0000, which jsonb cannot store.
    """
    return _encode(payload)[0]


def _encode(payload: object) -> tuple[str, int]:
    """:func:`encode_payload`, plus the text's size in UTF-8 bytes."""
    try:
        text = to_json_text(payload)
        # ASCII text is its own UTF-8 (and cannot hold a lone surrogate): no copy needed.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidPayload(f"payload is not valid JSON: {exc}") from None
    if has_nul_escape(text):
        raise NulCharacter("payload contains a NUL character (U+0000), which Postgres cannot store")
    return text, size


def has_nul_escape(text: str) -> bool:
    """Whether JSON ``text`` encodes a U+0000 (``\\u0000`` that is not an escaped backslash)."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


def check_payload_size(text: str, max_payload_bytes: int) -> None:
    """Raises :class:`PayloadTooLarge` when ``text`` is over ``max_payload_bytes`` UTF-8 bytes."""
    _check_size(len(text.encode("utf-8")), max_payload_bytes)


def _check_size(size: int, max_payload_bytes: int) -> None:
    if size > max_payload_bytes:
        raise PayloadTooLarge(f"payload is {size} bytes, over the cap of {max_payload_bytes} bytes")


def check_messages_payload(payload: Mapping[str, Any]) -> None:
    """Minimal Messages API parameters: ``model``, ``max_tokens`` > 0, non-empty ``messages``.

    Raises:
        InvalidPayload: naming the first field that is wrong.
    """
    model = payload.get("model")
    if not isinstance(model, str) or model == "":
        raise InvalidPayload("payload.model must be a non-empty string")
    max_tokens = payload.get("max_tokens")
    if (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int | float)
        or not math.isfinite(max_tokens)
        or max_tokens != int(max_tokens)
        or not 0 < max_tokens <= _INT32_MAX
    ):
        raise InvalidPayload("payload.max_tokens must be a positive integer")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidPayload("payload.messages must be a non-empty array")


def messages_payload_ok(payload: Mapping[str, Any]) -> bool:
    """Whether :func:`check_messages_payload` accepts ``payload``; never raises."""
    model = payload.get("model")
    max_tokens = payload.get("max_tokens")
    messages = payload.get("messages")
    if type(max_tokens) is not int:  # floats, bools and the rest: the full rule decides
        try:
            check_messages_payload(payload)
        except InvalidPayload:
            return False
        return True
    return (
        isinstance(model, str)
        and model != ""
        and 0 < max_tokens <= _INT32_MAX
        and isinstance(messages, list)
        and len(messages) > 0
    )


def check_job(
    *,
    tenant_id: object,
    origin: object,
    payload: object,
    sla_seconds: object = None,
    kind: object = DEFAULT_KIND,
    max_attempts: object = None,
    run_at: object = None,
    max_payload_bytes: int = 1_048_576,
    dedupe_key: object = None,
) -> CheckedJob:
    """Validate one job's arguments; raise the first typed :class:`UsageError` found.

    The checks run in the order the SQL function ``pgqueue.validate_job`` applies them (a NUL
    in the payload first: the database rejects it while reading the parameter), so both
    entry points report the same error for the same input.
    """
    text, size = _encode(payload)
    tid = _check_text(tenant_id, "tenant_id", MAX_TENANT_ID_CHARS, InvalidTenant)
    parsed_origin = check_origin(origin)
    sla = check_sla(sla_seconds)
    kind_text = _check_text(kind, "kind", MAX_KIND_CHARS, InvalidKind)
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidArgument(f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}")
    if not isinstance(payload, Mapping):
        raise InvalidPayload(
            f"payload must be a JSON object (a mapping), got {type(payload).__name__}"
        )
    _check_size(size, max_payload_bytes)
    if kind_text == DEFAULT_KIND:
        check_messages_payload(payload)
    if run_at is not None and not (isinstance(run_at, datetime) and run_at.tzinfo is not None):
        raise InvalidArgument("run_at must be a timezone-aware datetime or None")
    key = None
    if dedupe_key is not None:
        key = _check_text(dedupe_key, "dedupe_key", MAX_DEDUPE_KEY_CHARS, InvalidArgument)
    return CheckedJob(tid, parsed_origin, payload, text, sla, kind_text, max_attempts, run_at, key)
