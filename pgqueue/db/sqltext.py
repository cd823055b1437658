"""Statements read out of the migrations' SQL files, so that a downgrade restores an older
function from the revision that defined it instead of a copy of its text."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

_END = "\n$$;\n"


def function_definition(sql_file: Path, name: str) -> str:
    """The ``CREATE [OR REPLACE] FUNCTION pgqueue.<name>(…)`` statement of ``sql_file``, verbatim
    up to its closing ``$$;``, turned into ``CREATE OR REPLACE FUNCTION``.

    Raises:
        ValueError: ``sql_file`` defines ``pgqueue.<name>`` not exactly once.
    """
    text = sql_file.read_text(encoding="utf-8")
    pattern = rf"^CREATE (?:OR REPLACE )?FUNCTION pgqueue\.{re.escape(name)}\("
    starts = [m.start() for m in re.finditer(pattern, text, flags=re.MULTILINE)]
    if len(starts) != 1:
        raise ValueError(f"{sql_file.name} defines pgqueue.{name} {len(starts)} times, not once")
    statement = text[starts[0] : text.index(_END, starts[0]) + len(_END)]
    return re.sub(r"^CREATE (?:OR REPLACE )?FUNCTION", "CREATE OR REPLACE FUNCTION", statement)


def revision_module(path: Path) -> ModuleType:
    """The alembic revision file at ``path``, imported (its name starts with a digit, so it
    cannot be imported by name), so that a later revision reuses how it builds a statement.

    Raises:
        RuntimeError: the file cannot be loaded.
    """
    spec = importlib.util.spec_from_file_location(f"pgqueue_revision_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replace_anchor(body: str, anchor: str, replacement: str, *, what: str, times: int = 1) -> str:
    """``body`` with ``anchor`` replaced by ``replacement``: how a revision edits an older
    revision's statement instead of copying it. ``what`` names the revision and the statement
    in the error.

    Raises:
        RuntimeError: ``anchor`` occurs in ``body`` other than ``times`` times (the older text
            is not the one the edit was written for).
    """
    found = body.count(anchor)
    if found != times:
        raise RuntimeError(f"{what}: {found} of {anchor.strip()[:48]!r}, not {times}")
    return body.replace(anchor, replacement)
