"""Handlers for the multi-process worker tests: ``pgqueue work --app tests.apps.noop_app:registry``.

Every kind records ``f"{job.id}\\n"`` to ``$PGQUEUE_TEST_RECORD_FILE.<pid>`` (one file per worker
process, append mode, flushed) when it runs, so a test can see which process ran which job and
how many times.

- ``test.record``: records the job and returns ``{"ok": True}``.
- ``test.slow``: records, sleeps ``payload["seconds"]`` (asyncio), returns ``{"ok": True}``.
- ``test.crash_once``: the first time (no file at ``payload["marker"]``) creates the marker and
  SIGKILLs its own process mid-job; afterwards records and returns ``{"ok": True, "pid": pid}``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pgqueue
from pgqueue.models import Job

registry = pgqueue.Registry()

RECORD_FILE_ENV = "PGQUEUE_TEST_RECORD_FILE"


def record_path() -> Path | None:
    """This process's record file, or None when the environment names none."""
    base = os.environ.get(RECORD_FILE_ENV)
    return None if not base else Path(f"{base}.{os.getpid()}")


def _record(job: Job) -> None:
    path = record_path()
    if path is None:
        return
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"{job.id}\n")
        fh.flush()


@registry.handler("test.record")
async def record(job: Job) -> dict[str, Any]:
    _record(job)
    return {"ok": True}


@registry.handler("test.slow")
async def slow(job: Job) -> dict[str, Any]:
    _record(job)
    await asyncio.sleep(float(job.payload.get("seconds", 1.0)))
    return {"ok": True}


def _crash_the_first_time(marker: Path) -> None:
    if not marker.exists():
        marker.write_text(f"{os.getpid()}\n", encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)


@registry.handler("test.crash_once")
async def crash_once(job: Job) -> dict[str, Any]:
    _crash_the_first_time(Path(job.payload["marker"]))
    _record(job)
    return {"ok": True, "pid": os.getpid()}
