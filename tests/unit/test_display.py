"""Stored text on a terminal (pgqueue/display.py): control characters escaped as <U+XXXX>
(found by a tester: ESC and OSC sequences in tenant ids reached the terminal)."""

from __future__ import annotations

import io
import unicodedata

from rich.console import Console
from rich.table import Table

from pgqueue.display import cell, printable, printable_data
from pgqueue.validation import shown_invisible


def test_every_control_character_is_escaped_and_nothing_else():
    for c in range(0x3000):
        text = printable(f"a{chr(c)}b")
        if unicodedata.category(chr(c)) == "Cc":
            assert text == f"a<U+{c:04X}>b"
        else:
            assert text == f"a{chr(c)}b"
    # as the error messages show a refused tenant id
    esc = "esc\x1b[31m"
    assert shown_invisible(esc) == f"'{printable(esc)}'"


def test_a_cell_is_one_line_of_plain_text():
    table = Table()
    table.add_column("tenant")
    for name in ("a\nb", "esc\x1b[31mRED\x1b[0m", "\x1b]0;pwned\x07x", "[/oops]", None):
        table.add_row(cell(name))
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(table)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "a<U+000A>b" in text and "esc<U+001B>[31mRED<U+001B>[0m" in text and "[/oops]" in text


def test_payloads_are_escaped_at_every_level():
    data = {"k\x9b": ["\x7f", {"x": "\x1b"}], "n": 1, "t": None}
    assert printable_data(data) == {
        "k<U+009B>": ["<U+007F>", {"x": "<U+001B>"}],
        "n": 1,
        "t": None,
    }
