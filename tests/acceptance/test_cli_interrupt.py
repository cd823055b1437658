"""Ctrl-C while the ``pgqueue`` command is starting: one line, exit 130, no traceback (found by
a tester: a KeyboardInterrupt traceback from the middle of the imports)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pgqueue

ROOT = Path(pgqueue.__file__).resolve().parents[1]

#: Runs the entry point with a Ctrl-C delivered while typer (which pgqueue.cli imports) is
#: being imported, or when the app is about to parse the command line: deterministic, where a
#: SIGINT sent "early" lands wherever the start-up happens to be.
_INTERRUPTED_AT = """
import sys

where = sys.argv.pop(1)


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == where:
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, Interrupt())
if where == "app":
    import typer.main

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    typer.main.Typer.__call__ = interrupted
sys.argv[0] = "pgqueue"
from pgqueue.__main__ import main

main()
"""


@pytest.mark.parametrize("where", ["typer", "rich.console", "app"])
def test_ctrl_c_during_start_up_is_one_line(where):
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AT, where, "status", "--dsn", "postgresql://x@/y"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted\n"
    assert done.stdout == ""


def test_the_command_and_python_m_run_the_entry_point():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pgqueue"] == "pgqueue.__main__:main"
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout
