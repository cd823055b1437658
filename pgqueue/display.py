"""Stored text shown on a terminal, control characters escaped.

Tenant ids, kinds, models, dedupe keys, error texts and the like come from users and
providers. A control character in one (ESC, BEL, a line break, C1's CSI) went to the terminal
as it was: found by a tester, ``esc\\x1b[31mRED`` coloured the rest of `pgqueue status`, an
OSC sequence (``\\x1b]0;pwned\\x07``) set the window's title, and a tenant ``a\\nb`` showed as
two rows of `tenants list`. rich escapes its own markup (:class:`~rich.text.Text`) but not
control characters. New tenant ids may not hold them (:func:`pgqueue.validation.check_tenant_id`);
rows stored before, and the other texts, are shown through :func:`printable` or :func:`cell`.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from pgqueue.validation import CONTROL, code_point


def printable(text: str) -> str:
    """``text`` with each control character (:data:`pgqueue.validation.CONTROL_CLASS`: Unicode
    category Cc (C0, DEL, C1), U+2028, U+2029 and the bidi controls, such as U+202E) written as
    ``<U+XXXX>``, as :func:`pgqueue.validation.shown_invisible` writes it in error messages
    (ESC is ``<U+001B>``, a line break ``<U+000A>``); other text unchanged. One line stays one
    line, in its order (found by a tester: a stored tenant id with U+2028 broke a row, one with
    U+202E reversed the rest of the line)."""
    if CONTROL.search(text) is None:  # the usual case: no copy
        return text
    return CONTROL.sub(lambda m: code_point(m.group()), text)


def cell(value: object) -> Text:
    """A table cell (or a line) of stored text: ``str(value)`` through :func:`printable`, as a
    :class:`~rich.text.Text`, so that it is never read as rich markup (a tenant named
    ``[/x]`` raised MarkupError). ``None`` is an empty cell."""
    return Text("" if value is None else printable(str(value)))


def printable_data(value: Any) -> Any:
    """A JSON value (a payload, a result) with :func:`printable` applied to every string and
    key in it, for ``rich.json.JSON``: ``json.dumps`` escapes C0 characters but writes DEL and
    C1 (U+0080-U+009F, among them CSI) as they are."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_data(v) for v in value]
    return value
