"""The checkout itself: no file that git tracks keeps the markers of an unresolved merge."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_MARKER = re.compile(rb"^(<{7} |>{7} |={7}$)", re.MULTILINE)


def _tracked_files() -> list[Path]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name.decode() for name in listing.split(b"\0") if name]


def test_no_tracked_file_keeps_merge_conflict_markers():
    found = [
        str(path.relative_to(ROOT))
        for path in _tracked_files()
        if path.is_file()
        and path.suffix not in {".png", ".csv"}
        and _MARKER.search(path.read_bytes())
    ]
    assert found == []
