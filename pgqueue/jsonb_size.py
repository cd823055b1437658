"""The size Postgres gives a JSON payload (``octet_length(payload::text)`` of its jsonb), from
Python, without a round trip: the payload cap is checked before anything is sent, and must
never measure less than Postgres does (tests/db/test_validation.py holds the two equal).
"""

from __future__ import annotations

import json
import re
from typing import Any

#: JSON text as Postgres prints jsonb (", " and ": " separators, UTF-8 kept) but for numbers in
#: exponent form (see :func:`jsonb_size`); raises ValueError for NaN/Infinity, TypeError for
#: what JSON cannot hold and RecursionError for a payload nested too deeply.
to_json_text = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": ")).encode
# A JSON string (skipped whole) or a number in exponent form (the groups: mantissa, exponent).
_STRING_OR_EXPONENT = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"|(?<![\d.])(-?\d+(?:\.\d+)?)[eE]([-+]?\d+)'
)


def jsonb_size(payload: object, text: str, size: int) -> int:
    """The size Postgres gives the payload, ``octet_length(payload::text)``, from ``text`` (its
    :data:`to_json_text`, ``size`` bytes in UTF-8): never less than Postgres measures.

    jsonb keeps numbers as ``numeric`` and prints them without exponent: Python writes a float
    below 1e-4 or from 1e16 up in exponent form (``1e+16``, ``1e-07``), Postgres prints
    ``10000000000000000`` and ``0.0000001`` (up to 309 digits for 1.7976931348623157e+308).
    Such floats always put ``e+`` or ``e-`` in the text; only then (a ``+`` or an ``e-`` found,
    both cheap to look for) the payload is walked and each of them counted at its printed
    length, so the size is exact. Everything else in the text is as jsonb prints it. Postgres
    can print less in two rare cases, so the size is then larger than its own: ``-0.0``, which
    numeric prints ``0.0`` (one byte less each), and an object with two keys that are equal
    once Python made them strings (``{1: .., "1": ..}``), of which jsonb keeps the last.
    """
    if "+" in text or "e-" in text:
        size += _exponent_excess(payload)
    return size


def _exponent_excess(payload: object) -> int:
    """Bytes Postgres adds to the JSON text of ``payload`` by printing numbers in full.

    Walks what ``json`` encodes (dict values, list and tuple items; keys are strings), with a
    stack rather than recursion, and reads each float as ``json`` writes it (``float.__repr__``).
    """
    excess = 0
    stack: list[Any] = [payload]
    pop, extend = stack.pop, stack.extend
    while stack:
        value = pop()
        kind = type(value)
        if kind is str or kind is int or kind is bool or value is None:
            continue
        if kind is dict:
            extend(value.values())
        elif kind is list:
            extend(value)
        elif isinstance(value, float):
            # repr writes an exponent from 1e16 up and below 1e-4 (only then: cheap to test)
            if value and not 1e-4 <= abs(value) < 1e16:
                token = float.__repr__(value)
                if "e" in token:
                    excess += numeric_text_length(token) - len(token)
        elif isinstance(value, dict):  # a subclass: json reads its items()
            extend([v for _, v in value.items()])
        elif isinstance(value, list | tuple):
            extend(value)
    return excess


def numeric_text_length(token: str) -> int:
    """Length of the JSON number ``token`` once read and printed by Postgres (``numeric_in``,
    then ``numeric_out``): no exponent, ``max(0, fraction digits - exponent)`` decimals, and
    no sign on zero. ``1e+16`` → 17, ``1.5e-07`` → 10 (``0.00000015``), ``1.50e3`` → 4."""
    mantissa, _, exponent_text = token.lower().partition("e")
    exponent = int(exponent_text) if exponent_text else 0
    negative = mantissa.startswith("-")
    whole, _, fraction = mantissa.lstrip("-").partition(".")
    digits = (whole + fraction).lstrip("0")
    dscale = max(0, len(fraction) - exponent)
    decimals = 1 + dscale if dscale else 0
    if not digits:  # zero: numeric has no negative zero
        return 1 + decimals
    return negative + max(1, len(digits) + exponent - len(fraction)) + decimals


def jsonb_text_size(text: str) -> int:
    """``octet_length(text::jsonb::text)`` for JSON ``text`` as :data:`to_json_text` writes it
    (the separators jsonb prints): its UTF-8 size, each number in exponent form counted at the
    length Postgres prints it (:func:`numeric_text_length`). Scans the text, so it is slower
    than :func:`jsonb_size`, which walks the payload instead."""
    size = len(text.encode("utf-8"))
    if "e" not in text and "E" not in text:
        return size
    for match in _STRING_OR_EXPONENT.finditer(text):
        if match.group(1) is not None:
            size += numeric_text_length(match.group(0)) - len(match.group(0))
    return size
