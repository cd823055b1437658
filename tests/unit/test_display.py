"""Stored text on a terminal (pgqueue/display.py): control characters escaped as <U+XXXX>
(found by a tester: ESC and OSC sequences in tenant ids reached the terminal)."""

from __future__ import annotations

import io
import unicodedata

from rich.console import Console
from rich.table import Table

from pgqueue.display import cell, printable, printable_data
from pgqueue.validation import shown_invisible

#: Line and paragraph separators and the bidi controls, escaped as Cc is (found by a tester:
#: a stored tenant id with U+2028 broke a row, one with U+202E reversed the rest of the line).
BREAKING = {0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
            *range(0x2066, 0x206A)}  # fmt: skip


def test_every_control_character_is_escaped_and_nothing_else():
    for c in range(0x3000):
        text = printable(f"a{chr(c)}b")
        if unicodedata.category(chr(c)) == "Cc" or c in BREAKING:
            assert text == f"a<U+{c:04X}>b"
        else:
            assert text == f"a{chr(c)}b"
    # as the error messages show a refused tenant id
    for shown in ("esc\x1b[31m", "a\u2028b", "\u202egnp.exe"):
        assert shown_invisible(shown) == f"'{printable(shown)}'"


def test_a_cell_is_one_line_of_plain_text():
    table = Table()
    table.add_column("tenant")
    for name in ("a\nb", "esc\x1b[31mRED\x1b[0m", "\x1b]0;pwned\x07x", "[/oops]", "c\u2028d",
                 "\u202eevil", None):  # fmt: skip
        table.add_row(cell(name))
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(table)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\u2028" not in text and "\u202e" not in text
    assert "c<U+2028>d" in text and "<U+202E>evil" in text
    assert "a<U+000A>b" in text and "esc<U+001B>[31mRED<U+001B>[0m" in text and "[/oops]" in text


def test_payloads_are_escaped_at_every_level():
    data = {"k\x9b": ["\x7f", {"x": "\x1b"}], "n": 1, "t": None}
    assert printable_data(data) == {
        "k<U+009B>": ["<U+007F>", {"x": "<U+001B>"}],
        "n": 1,
        "t": None,
    }
