"""A fix to typer's help output, applied once when :mod:`pgqueue.cli` is imported."""

from __future__ import annotations

from typing import Any


def flags_show_no_type() -> None:
    """Make typer's rich help show no type after a flag (issue 28).

    typer 0.29 (with its own click) prints every option's type in its help panel, flags
    included: ``--burst --no-burst <bool>``, ``--help <bool>``, as if they took a value. Its
    plain help (``TyperOption.get_help_record``) already skips flags and counts; the rich
    panel calls ``display_type_rich`` without that check. This gives that method the same
    check. Older typers (no ``display_type_rich``) print no type for flags: nothing to do.
    tests/acceptance/test_cli_help.py checks the help of every command.
    """
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_pgqueue_flags", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag or self.count else shown(self, ctx)

    display_type_rich._pgqueue_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
