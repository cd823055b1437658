"""``--help`` of every command: docstrings flow as paragraphs (markdown markup), and nothing
written in a help text is eaten by the markup (``<reason>``, ``[bench]``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from pgqueue.cli import app

runner = CliRunner()
_WIDE = {"COLUMNS": "400"}


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group of a click-like tree (typer's groups), with its path."""
    yield path, group
    if hasattr(group, "commands"):
        for name, command in group.commands.items():
            yield from _commands(command, (*path, name))


def _flat(text: str) -> str:
    """The help as one line of words, without the boxes rich draws."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_every_help_text_is_shown_whole() -> None:
    """Each option's help, and each command's first line, appears in ``--help`` word for word
    (markdown markup turned ``'cancelled: <reason>'`` into ``'cancelled: '``: found when the
    markup mode changed)."""
    root = typer.main.get_command(app)
    checked = 0
    for path, command in _commands(root):
        result = runner.invoke(app, [*path, "--help"], env=_WIDE)
        assert result.exit_code == 0, (path, result.output)
        shown = _flat(result.output)
        for param in command.params:
            help_text = getattr(param, "help", None)
            if help_text:
                plain = _flat(help_text.replace("`", "").replace("\\[", "[").replace("\\<", "<"))
                assert plain in shown, (path, param.name, plain)
                checked += 1
    assert checked > 50


def test_a_docstring_flows_as_one_paragraph() -> None:
    """``pgqueue demo --help`` kept the docstring's line break mid-sentence and showed its
    double backticks."""
    result = runner.invoke(app, ["demo", "--help"], env=_WIDE)
    assert result.exit_code == 0
    line = next(x for x in result.output.splitlines() if "a database of its own" in x)
    assert "one a runaway, into two queues" in line  # the source breaks after "one a"
    assert "``" not in result.output and "`" not in line
    assert "(pgqueue_demo_<run>_fifo and" in line


def test_flags_show_no_type() -> None:
    """typer 0.29's rich help printed ``<bool>`` after every flag (``--burst --no-burst
    <bool>``, even ``--help``), as if it took a value; its plain help shows none. Flags show
    no type; options that take a value keep theirs."""
    root = typer.main.get_command(app)
    flags = 0
    for path, command in _commands(root):
        result = runner.invoke(app, [*path, "--help"], env=_WIDE)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        for param in command.params:
            if getattr(param, "is_flag", False) and not param.hidden:
                line = next(x for x in result.output.splitlines() if param.opts[0] in x)
                assert not re.search(r"<\w+>", line.split(param.opts[0], 1)[1][:40]), line
                flags += 1
    assert flags > 10
    work = _flat(runner.invoke(app, ["work", "--help"], env=_WIDE).output)
    assert "--concurrency <int>" in work and "--burst --no-burst Exit when" in work
