"""Input validation at the enqueue boundary, before anything touches the database.

The SQL function ``pgqueue.validate_job`` applies the same rules to SQL callers; checking here
first keeps the caller's transaction usable (a failed SQL statement would abort it). Both sides
raise the same error classes (see :mod:`pgqueue.errors`), and a property test holds them equal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
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
from pgqueue.jsonb_size import jsonb_size, jsonb_text_size, to_json_text
from pgqueue.models import DEFAULT_KIND, Origin, Tier

MAX_TENANT_ID_CHARS = 128
MAX_KIND_CHARS = 128
MAX_ATTEMPTS_LIMIT = 1000
MAX_DEDUPE_KEY_CHARS = 256
#: The longest SLA accepted, seconds (ten years of 365.25 days). Any SLA of a day or more already
#: means the batch tier; beyond this it is a mistake (2**64 and 2**64 + 1 were both accepted,
#: and stored as the same double), and ``None`` is the way to say "no SLA".
MAX_SLA_SECONDS = 315_576_000
#: Payloads nested this many levels deep (a value at this level below the top object) are
#: refused: the worker decodes payloads with ``json.loads``, bounded by Python's recursion
#: limit (found by a fault run: a deeper payload enqueued through SQL crashed every worker
#: that claimed it). The SQL function ``pgqueue.payload_problem`` refuses the same.
MAX_PAYLOAD_LEVELS = 512
#: Control characters (Unicode category Cc: C0, DEL, C1) but U+0000, and the characters that
#: break a line or reorder text on a terminal: U+2028 LINE SEPARATOR, U+2029 PARAGRAPH
#: SEPARATOR and the bidi controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069), as
#: a regular-expression class that Python's ``re`` and Postgres read alike. Refused anywhere in
#: a tenant id (found by a tester: ``esc\x1b[31mRED`` and ``\x1b]0;pwned\x07`` were taken, and
#: the command line's tables sent them to the terminal; ``a\nb`` showed as two rows; later
#: U+2028 and U+202E were taken, and broke or reversed the rows), a name a person reads and
#: compares. The SQL function ``pgqueue.has_control`` (010_tables.sql) holds this text;
#: tests/unit/test_invisible_tenant.py compares them. U+0000 is :class:`NulCharacter`'s, before.
CONTROL_CLASS = r"\u0001-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
#: One character of :data:`CONTROL_CLASS`, or U+0000 (:func:`has_control`, and
#: :func:`pgqueue.display.printable`, which escapes them).
CONTROL = re.compile(f"[\x00{CONTROL_CLASS}]")
#: Category Cc only (U+0000-U+001F, U+007F-U+009F): refused in a dedupe key, as
#: ``pgqueue.try_enqueue`` (040_enqueue.sql) refuses it.
_CC = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: The characters that show nothing on their own, as a regular-expression class that Python's
#: ``re`` and Postgres read alike: white space (``str.isspace``), controls (Cc; not U+0000),
#: format characters (Cf: U+200B ZERO WIDTH SPACE, U+FEFF, the bidi marks), separators (Zs, Zl,
#: Zp), Unicode's Default_Ignorable_Code_Point (the Hangul fillers U+115F, U+1160, U+3164 and
#: U+FFA0, variation selectors, tags), as of Unicode 14 (Python 3.11), and U+2800 BRAILLE
#: PATTERN BLANK, a symbol (So) drawn as an empty cell (it was taken as a tenant id). A tenant
#: id made of these only is refused (found by a tester: U+200B was queued). The SQL function
#: ``pgqueue.is_invisible`` (010_tables.sql) holds this text, its one copy in SQL;
#: tests/unit/test_invisible_tenant.py compares them.
INVISIBLE_CLASS = (
    r"\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891"
    r"\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f\u2000-\u200f\u2028-\u202f"
    r"\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U000110bd"
    r"\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0000-\U000e0fff"
)
_INVISIBLE_ONLY = re.compile(f"[{INVISIBLE_CLASS}]+")
#: The ``run_at`` range the CHECK constraint ``jobs_run_at_range`` holds (UTC; a day's margin
#: inside years 0001-9999, for time zones): ``RUN_AT_MIN <= run_at < RUN_AT_MAX``.
RUN_AT_MIN = datetime(1, 1, 2, tzinfo=UTC)
RUN_AT_MAX = datetime(9999, 12, 30, tzinfo=UTC)
_INT32_MAX = 2_147_483_647
# An escaped U+0000 that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


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


#: How many characters of a too-long string an error message shows (then "…").
SHOWN_CHARS = 40


def _shown(value: object, width: int = 80) -> str:
    """``repr(value)`` for an error message, at most ``width`` characters: a longer one is cut
    and ends in "…", so the cut is plain to see; never raises (an int of more than 4,300 digits
    has no repr, by default)."""
    try:
        text = repr(value)
    except Exception:  # whatever a broken __repr__ raises
        return f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 1] + "…"


def shown_text(value: str) -> str:
    """A string for an error message: its repr, or for one longer than :data:`SHOWN_CHARS`
    the repr of its first :data:`SHOWN_CHARS` characters followed by "…" (a tenant id of
    thousands of characters would bury the message, and a repr cut in the middle reads as the
    whole value)."""
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    return f"{value[:SHOWN_CHARS]!r}…"


def code_point(char: str) -> str:
    """One character written as ``<U+XXXX>`` (four hex digits or more, as the SQL function
    ``pgqueue.shown_invisible`` writes it): how refused ids and stored control characters are
    shown."""
    return f"<U+{ord(char):04X}>"


def shown_invisible(value: str) -> str:
    """A refused tenant id (one that shows nothing, or holds a control character), for an error
    message: quoted, each character of :data:`INVISIBLE_CLASS` (which holds
    :data:`CONTROL_CLASS`) but the space written as ``<U+XXXX>``, and of one longer than
    :data:`SHOWN_CHARS` characters the first :data:`SHOWN_CHARS`, then "…". ``repr`` prints
    U+3164 or U+2800 as they are, blank, and SQL printed U+200B as ``''``. The SQL function
    ``pgqueue.shown_invisible`` writes the same, so Python and SQL raise one message."""
    shown = "".join(
        c if c == " " or _INVISIBLE_ONLY.fullmatch(c) is None else code_point(c)
        for c in value[:SHOWN_CHARS]
    )
    return f"'{shown}'" + ("…" if len(value) > SHOWN_CHARS else "")


def _check_text(value: object, what: str, limit: int, error: type[Exception]) -> str:
    if isinstance(value, str) and len(value) > limit:
        raise error(
            f"{what} must be a string of 1 to {limit} characters, got one of {len(value):,} "
            f"characters: {shown_text(value)}"
        )
    if not isinstance(value, str) or value == "":
        raise error(f"{what} must be a string of 1 to {limit} characters, got {_shown(value)}")
    if "\x00" in value:
        raise NulCharacter(f"{what} contains a NUL character (U+0000)")
    if not is_utf8_encodable(value):
        raise error(
            f"{what} holds a lone surrogate (U+D800..U+DFFF), which is not valid Unicode text "
            f"and cannot be sent to the database, got {_shown(value)}"
        )
    return value


def check_tenant_id(tenant_id: object) -> str:
    """``tenant_id`` if it is a valid tenant id: a string of 1 to :data:`MAX_TENANT_ID_CHARS`
    characters, without NUL, valid Unicode, holding a visible character (not only white space
    or the other characters of :data:`INVISIBLE_CLASS`, such as U+200B), and no control
    character (:data:`CONTROL_CLASS`: ESC, a tab, a line break) anywhere. Every boundary that
    takes a tenant id applies it: enqueue (:func:`check_job`), and the lookups and settings
    (`tenants set`, `jobs list --tenant`, `retry`, `cancel`, the dashboard), so a blank tenant
    id is refused alike everywhere (found by a tester: `tenants set "  "` stored a tenant that
    no job can have). ``pgqueue.validate_job`` refuses the same for SQL callers.

    Raises:
        InvalidTenant: not a string, empty, invisible only, too long (the message gives its
            length and shows its first :data:`SHOWN_CHARS` characters, then "…"), a lone
            surrogate or a control character in it (shown as ``<U+XXXX>``, as
            :func:`shown_invisible` shows it).
        NulCharacter: it holds U+0000.
    """
    tid = _check_text(tenant_id, "tenant_id", MAX_TENANT_ID_CHARS, InvalidTenant)
    if tid.isspace():
        raise InvalidTenant(
            f"tenant_id must hold a character other than white space, got {shown_invisible(tid)}"
        )
    if is_invisible(tid):
        raise InvalidTenant(
            "tenant_id must hold a visible character, not only control or format characters "
            f"(such as U+200B), got {shown_invisible(tid)}"
        )
    if has_control(tid):
        raise InvalidTenant(
            "tenant_id must not hold a control character (U+0001-U+001F, U+007F-U+009F, "
            "U+2028, U+2029 or a bidi control, such as ESC or a line break), got "
            f"{shown_invisible(tid)}"
        )
    return tid


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (:data:`CONTROL_CLASS`, or U+0000)
    anywhere."""
    return CONTROL.search(text) is not None


def is_invisible(text: str) -> bool:
    """Whether ``text`` is one or more characters of :data:`INVISIBLE_CLASS` only (white space,
    controls, format characters such as U+200B, default-ignorable code points): it shows
    nothing. Cheap for an ordinary id: the match fails at its first visible character."""
    return _INVISIBLE_ONLY.fullmatch(text) is not None


def check_plan(plan: object) -> str:
    """The name of a known plan (one of :data:`pgqueue.scheduling.drr.KNOWN_PLANS`), matched
    case-insensitively and without surrounding blanks, as it is stored: lower case.

    Raises:
        InvalidArgument: not a string, or not a known plan (the message lists the known ones);
            an unknown plan name would silently mean quantum ×1.
    """
    from pgqueue.scheduling.drr import KNOWN_PLANS

    name = plan.strip().lower() if isinstance(plan, str) else None
    if name is None or name not in KNOWN_PLANS:
        shown = shown_text(plan) if isinstance(plan, str) else _shown(plan)
        raise InvalidArgument(f"unknown plan {shown}; known plans: {', '.join(KNOWN_PLANS)}")
    return name


def check_tier(tier: object) -> str:
    """The name of a tier (``critical``, ``standard`` or ``batch``), matched case-insensitively
    and without surrounding blanks, as :func:`check_plan` matches plans: ``BATCH`` is
    ``batch``.

    Raises:
        InvalidArgument: not a string, or not a tier (the message lists the three).
    """
    name = tier.strip().lower() if isinstance(tier, str) else None
    if name is None or name not in {t.value for t in Tier}:
        shown = shown_text(tier) if isinstance(tier, str) else _shown(tier)
        raise InvalidArgument(f"unknown tier {shown}; expected critical, standard or batch")
    return name


def is_utf8_encodable(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (holds no lone surrogate); ASCII is cheap."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(text: str, limit: int) -> str:
    """``text`` made storable in a ``text`` column, at most ``limit`` characters: U+0000 becomes
    the four characters ``\\x00`` and a lone surrogate its ``\\udXXX`` escape (Postgres refuses
    both). Used for error text from handlers and providers, which may hold anything (found by a
    fault run: ``RuntimeError("boom \\x00")`` failed the outcome write, and the job stayed
    ``running`` until its lease expired)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not is_utf8_encodable(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:limit]


def check_dedupe_key(dedupe_key: object) -> str:
    """``dedupe_key`` if it is a string of 1 to :data:`MAX_DEDUPE_KEY_CHARS` characters, valid
    Unicode, without control characters (U+0000-U+001F, U+007F-U+009F).

    Raises:
        InvalidArgument: anything else (a NUL: :class:`NulCharacter`).
    """
    key = _check_text(dedupe_key, "dedupe_key", MAX_DEDUPE_KEY_CHARS, InvalidArgument)
    found = _CC.search(key)
    if found:
        raise InvalidArgument(
            f"dedupe_key holds a control character (U+{ord(found.group()):04X}) at index "
            f"{found.start()}, got {_shown(key)}"
        )
    return key


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
    raise UnknownOrigin(f"unknown origin {_shown(origin)}; expected one of {allowed}")


def check_sla(sla_seconds: object) -> float | None:
    """``None`` or a number of seconds from 0 to :data:`MAX_SLA_SECONDS` (``-0.0`` is taken as
    0.0); raises :class:`InvalidSla` otherwise."""
    if sla_seconds is None:
        return None
    if isinstance(sla_seconds, bool) or not isinstance(sla_seconds, int | float):
        raise InvalidSla(
            f"sla_seconds must be a number of seconds or None, got {_shown(sla_seconds)}"
        )
    try:
        value = float(sla_seconds)
    except OverflowError:  # an int beyond the largest double (either sign)
        raise InvalidSla(
            f"sla_seconds is out of the range of double precision, got {_shown(sla_seconds, 40)}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidSla(f"sla_seconds must be finite and >= 0, got {_shown(sla_seconds)}")
    if value > MAX_SLA_SECONDS:
        raise InvalidSla(
            f"sla_seconds must be at most {MAX_SLA_SECONDS:,} (ten years; None for no SLA), "
            f"got {_shown(sla_seconds, 40)}"
        )
    return value + 0.0  # -0.0 is 0: stored as 0, never as "-0"


def encode_payload(payload: object) -> str:
    """Encode ``payload`` as JSON text the way Postgres prints jsonb.

    Raises:
        InvalidPayload: not serialisable, or holds NaN/Infinity or a lone surrogate.
        NulCharacter: a string (or key) holds U+0000, which jsonb cannot store.
    """
    return _encode(payload)[0]


def _encode(payload: object) -> tuple[str, int]:
    """:func:`encode_payload`, plus the size Postgres measures (:func:`jsonb_size`)."""
    try:
        text = to_json_text(payload)
        # ASCII text is its own UTF-8 (and cannot hold a lone surrogate): no copy needed.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidPayload(f"payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidPayload("payload is nested too deeply to encode as JSON") from None
    if has_nul_escape(text):
        raise NulCharacter("payload contains a NUL character (U+0000), which Postgres cannot store")
    # only a text with that many opening brackets can be that deep: counted at C speed
    if text.count("[") + text.count("{") >= MAX_PAYLOAD_LEVELS and _nested_at_least(
        payload, MAX_PAYLOAD_LEVELS
    ):
        raise InvalidPayload(f"payload is nested {MAX_PAYLOAD_LEVELS} levels deep or more")
    return text, jsonb_size(payload, text, size)


def _nested_at_least(payload: object, levels: int) -> bool:
    """Whether some value of ``payload`` sits ``levels`` levels below it (its members and
    elements are one level down), as jsonpath's ``strict $.**{levels}`` finds in SQL."""
    stack: list[tuple[object, int]] = [(payload, 0)]
    while stack:
        value, level = stack.pop()
        if level >= levels:
            return True
        if isinstance(value, Mapping):
            stack.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list | tuple):
            stack.extend((v, level + 1) for v in value)
    return False


def has_nul_escape(text: str) -> bool:
    """Whether JSON ``text`` encodes a U+0000 (``\\u0000`` that is not an escaped backslash)."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


def check_payload_size(text: str, max_payload_bytes: int) -> None:
    """Raises :class:`PayloadTooLarge` when JSON ``text`` is over ``max_payload_bytes`` as
    Postgres measures it (:func:`jsonb_text_size`)."""
    _check_size(jsonb_text_size(text), max_payload_bytes)


def _check_run_at(run_at: object) -> datetime:
    """``run_at``, checked: a timezone-aware datetime in [:data:`RUN_AT_MIN`,
    :data:`RUN_AT_MAX`), else :class:`InvalidArgument`. Found by a tester: 0001-01-01 and
    9999-12-31 UTC reached the CHECK constraint, whose untyped error aborted the caller's
    transaction."""
    if not (isinstance(run_at, datetime) and run_at.utcoffset() is not None):
        raise InvalidArgument("run_at must be a timezone-aware datetime or None")
    try:
        utc = run_at.astimezone(UTC)
    except OverflowError:  # before year 1 or after 9999 once in UTC
        utc = None
    if utc is None or not RUN_AT_MIN <= utc < RUN_AT_MAX:
        raise InvalidArgument(
            f"run_at must be from {RUN_AT_MIN.isoformat()} to before {RUN_AT_MAX.isoformat()}"
            f", got {run_at.isoformat()}"
        )
    return run_at


def _check_size(size: int, max_payload_bytes: int) -> None:
    if size > max_payload_bytes:
        raise PayloadTooLarge(f"payload is {size} bytes, over the cap of {max_payload_bytes} bytes")


def check_messages_payload(payload: Mapping[str, Any]) -> None:
    """Minimal Messages API parameters: ``model``, ``max_tokens`` > 0, non-empty ``messages``
    without empty text (:func:`empty_text_message`).

    Raises:
        InvalidPayload: naming the first field that is wrong.
    """
    model = payload.get("model")
    if not isinstance(model, str) or model == "":
        raise InvalidPayload("payload.model must be a non-empty string")
    max_tokens = payload.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | float):
        valid = False
    elif isinstance(max_tokens, int):  # compared as an int: no float conversion to overflow
        valid = 0 < max_tokens <= _INT32_MAX
    else:
        valid = math.isfinite(max_tokens) and max_tokens.is_integer()
        valid = valid and 0 < max_tokens <= _INT32_MAX
    if not valid:
        raise InvalidPayload("payload.max_tokens must be a positive integer")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidPayload("payload.messages must be a non-empty array")
    index = empty_text_message(messages)
    if index is not None:
        raise InvalidPayload(
            f"payload.messages[{index}]: text content must not be empty or white space"
        )


def _blank(text: object) -> bool:
    return isinstance(text, str) and (text == "" or text.isspace())


def empty_text_message(messages: list[Any]) -> int | None:
    """The index of the first message whose text is empty or white space (Python's
    ``str.isspace``), or None. Found by a tester: content ``""`` was queued from Python and
    SQL, and the provider answered 400. A message's content may be a string or a list of
    blocks: a blank string, an empty list, or a ``text`` block with blank text is refused;
    other blocks and shapes are left to the provider. An empty (``""`` or ``[]``) final
    ``assistant`` message is a prefill, and allowed. The sandbox (pgqueue/sandbox/messages.py)
    and the SQL function ``pgqueue.empty_text_message`` apply the same rule."""
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, str | list) and not content:
            if i == last and message.get("role") == "assistant":
                continue
            return i
        if _blank(content):
            return i
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "text" and _blank(b.get("text"))
            for b in content
        ):
            return i
    return None


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
        and empty_text_message(messages) is None
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
    tid = check_tenant_id(tenant_id)
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
    when = None if run_at is None else _check_run_at(run_at)
    key = None
    if dedupe_key is not None:
        key = check_dedupe_key(dedupe_key)
    return CheckedJob(tid, parsed_origin, payload, text, sla, kind_text, max_attempts, when, key)
