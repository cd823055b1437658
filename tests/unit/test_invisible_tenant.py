"""Tenant ids that show nothing (found by a tester: a tenant id of one U+200B ZERO WIDTH SPACE
was queued from Python, the command line and SQL): refused as InvalidTenant, with the class
of characters shared, text for text, by pgqueue/validation.py and pgqueue.is_invisible
(010_tables.sql)."""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import pytest

import pgqueue
from pgqueue.errors import InvalidTenant
from pgqueue.validation import (
    CONTROL_CLASS,
    INVISIBLE_CLASS,
    check_job,
    check_tenant_id,
    has_control,
    is_invisible,
)

GOOD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = Path(pgqueue.__file__).parent / "sql" / "schema" / "030_validation.sql"
#: Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties.txt), which Python does not
#: expose: the rest of INVISIBLE_CLASS is white space and categories Cc, Cf, Zs, Zl, Zp.
DEFAULT_IGNORABLE = [
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
]  # fmt: skip
#: Characters of other categories that are drawn blank: U+2800 BRAILLE PATTERN BLANK (So), an
#: empty cell (it was taken as a tenant id). The Hangul fillers (Lo) are default-ignorable.
BLANK_SYMBOLS = {0x2800}


@pytest.mark.parametrize(
    "tenant", ["\u200b", "\u200b\u200b", "\ufeff", "\u2060", "\x01", "\x1b", "\u202e", "\u3164",
               "\U000e0041", " \u200b", "\u200d\t", "\xad", "\u2800", "\u2800\u2800", "\u115f",
               "\u1160", "\uffa0", "\u115f\u1160\u3164\uffa0\u2800"],
)  # fmt: skip
def test_a_tenant_id_that_shows_nothing_is_refused(tenant):
    for check in (check_tenant_id, lambda t: check_job(tenant_id=t, origin="scheduled",
                                                       payload=GOOD)):  # fmt: skip
        with pytest.raises(InvalidTenant, match="tenant_id must hold a"):
            check(tenant)


@pytest.mark.parametrize(
    ("tenant", "shown"),
    [("esc\x1b[31mRED\x1b[0m", "'esc<U+001B>[31mRED<U+001B>[0m'"),
     ("\x1b]0;pwned\x07", "'<U+001B>]0;pwned<U+0007>'"), ("a\nb", "'a<U+000A>b'"),
     ("a\tb", "'a<U+0009>b'"), ("x\x7f", "'x<U+007F>'"), ("\x9b31m", "'<U+009B>31m'"),
     ("a\x85", "'a<U+0085>'"), ("a\u2028b", "'a<U+2028>b'"), ("a\u2029", "'a<U+2029>'"),
     ("\u202egnp.exe", "'<U+202E>gnp.exe'"), ("x\u2066y\u2069", "'x<U+2066>y<U+2069>'"),
     ("a\u200fb", "'a<U+200F>b'"), ("a\u061cb", "'a<U+061C>b'")],
)  # fmt: skip
def test_a_tenant_id_with_a_control_character_is_refused(tenant, shown):
    """Found by a tester: `pgqueue enqueue $'esc\\e[31mRED\\e[0m'` and an OSC title sequence
    were taken, and the command line's tables sent them to the terminal; 'a\\nb' showed as two
    rows; U+2028 broke a row and U+202E reversed one. A control character (Cc: C0, DEL, C1),
    a line or paragraph separator or a bidi control anywhere is refused, shown escaped."""
    assert has_control(tenant)
    for check in (check_tenant_id, lambda t: check_job(tenant_id=t, origin="scheduled",
                                                       payload=GOOD)):  # fmt: skip
        with pytest.raises(InvalidTenant, match="must not hold a control character") as info:
            check(tenant)
        assert str(info.value).endswith(f", got {shown}")


@pytest.mark.parametrize("tenant", ["a\u200b", "\u200ba", "\u00e9", "\U0001f600", "\u0301", "-"])
def test_a_tenant_id_with_a_visible_character_is_taken(tenant):
    assert check_tenant_id(tenant) == tenant
    assert check_job(tenant_id=tenant, origin="scheduled", payload=GOOD).tenant_id == tenant


def test_the_class_is_white_space_controls_format_separators_and_ignorables():
    """Every code point (but U+0000 and surrogates) is in the class exactly when it is white
    space, Cc, Cf, Zs, Zl, Zp, default-ignorable or in :data:`BLANK_SYMBOLS`, as of Unicode 14
    (Python 3.11); a later Unicode may add characters to those categories, which the class
    (and the SQL, by a migration) then lacks, so there only the class's own characters are
    checked. U+0000 is NulCharacter's."""
    ignorable = {c for low, high in DEFAULT_IGNORABLE for c in range(low, high + 1)}
    one = re.compile(f"[{INVISIBLE_CLASS}]")
    complete = unicodedata.unidata_version == "14.0.0"
    wrong = []
    for c in range(1, sys.maxunicode + 1):
        if 0xD800 <= c <= 0xDFFF:
            continue
        expected = (
            chr(c).isspace()
            or unicodedata.category(chr(c)) in {"Cc", "Cf", "Zs", "Zl", "Zp"}
            or c in ignorable
            or c in BLANK_SYMBOLS
        )
        found = one.fullmatch(chr(c)) is not None
        if found != expected and (found or complete):
            wrong.append(hex(c))
    assert wrong == [], wrong[:20]


def test_the_sql_side_holds_the_class_once():
    """pgqueue.is_invisible (010_tables.sql) writes INVISIBLE_CLASS as concatenated literals:
    joined, the same text. No other schema file writes it again: validate_job, job_is_valid
    and the tenants table's CHECK tenants_tenant_id_visible call is_invisible (before, each
    had its own copy). Their behaviour is compared in tests/db/test_validation.py."""
    copies = [
        (path.name, literal)
        for path in sorted(SCHEMA.parent.glob("*.sql"))
        for literal in re.findall(r"~ \((\s*'\^\[\\u0001.*?\]\+\$')\)", path.read_text(), re.S)
    ]
    assert [name for name, _literal in copies] == ["010_tables.sql"]
    joined = "".join(re.findall(r"'([^']*)'", copies[0][1]))
    assert joined == f"^[{INVISIBLE_CLASS}]+$"
    text = SCHEMA.read_text() + (SCHEMA.parent / "010_tables.sql").read_text()
    assert text.count("pgqueue.is_invisible(tenant_id)") == 3
    assert text.count("pgqueue.has_control(tenant_id)") == 3


#: Besides Cc: U+2028 LINE SEPARATOR (Zl), U+2029 PARAGRAPH SEPARATOR (Zp) and the bidi
#: controls (Cf: Unicode's Bidi_Control property), which break or reorder a terminal's line.
BREAKING = {0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
            *range(0x2066, 0x206A)}  # fmt: skip


def test_the_control_class_is_category_cc_and_sql_holds_it_once():
    """CONTROL_CLASS is exactly Unicode's category Cc but U+0000 (NulCharacter's), the line
    and paragraph separators and the bidi controls, and pgqueue.has_control (010_tables.sql)
    writes the same text, in no other schema file; the CHECK
    tenants_tenant_id_without_control, validate_job and job_is_valid call it (counted
    above)."""
    one = re.compile(f"[{CONTROL_CLASS}]")
    found = {c for c in range(sys.maxunicode + 1) if one.fullmatch(chr(c))}
    cc = {c for c in range(1, 0x110000) if unicodedata.category(chr(c)) == "Cc"}
    assert found == cc | BREAKING
    # the marks (U+061C, U+200E, U+200F) and the embeddings, overrides and isolates
    assert all(
        "MARK" in unicodedata.name(chr(c)) or unicodedata.bidirectional(chr(c)) in (
            "LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI")
        for c in BREAKING - {0x2028, 0x2029}
    )  # fmt: skip
    assert all(is_invisible(chr(c)) for c in found)  # shown_invisible escapes them
    copies = [
        (path.name, literal)
        for path in sorted(SCHEMA.parent.glob("*.sql"))
        for literal in re.findall(r"~ '(\[\\u0001-[^']*\])'", path.read_text())
    ]
    assert copies == [("010_tables.sql", f"[{CONTROL_CLASS}]")]


def test_is_invisible():
    assert is_invisible("\u200b") and is_invisible(" ") and not is_invisible("")
    assert not is_invisible("a") and not is_invisible("\u200ba")


@pytest.mark.parametrize(
    ("tenant", "shown"),
    [("\u200b", "'<U+200B>'"), ("\u3164\u2800", "'<U+3164><U+2800>'"), ("\t ", "'<U+0009> '"),
     ("\u2060" * 41, "'" + "<U+2060>" * 40 + "'…")],
)  # fmt: skip
def test_the_message_shows_the_invisible_characters_escaped(tenant, shown):
    """repr printed U+3164 and U+2800 as they are, blank: InvalidTenant shows each character
    that shows nothing (but the space) as <U+XXXX>, as validate_job does."""
    with pytest.raises(InvalidTenant) as info:
        check_tenant_id(tenant)
    assert str(info.value).endswith(f", got {shown}")
