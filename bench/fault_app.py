"""Handlers for ``bench/fault_run.py``: ``pgqueue work --app bench.fault_app:registry``.

Every run writes ``start <job> <pid> <time>`` when it begins and ``end <job> <pid> <time>`` when
it returns, one line each, flushed, to ``$PGQUEUE_FAULT_RECORD.<pid>`` (times from
``time.time()``), so that the run can count runs, completions and overlaps per job.

- ``fault.async``: ``asyncio.sleep(payload["seconds"])``;
- ``fault.sync``: a plain function, ``time.sleep(payload["seconds"])`` in a thread.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pgqueue
from pgqueue.models import Job

registry = pgqueue.Registry()


def _note(what: str, job: Job) -> None:
    base = os.environ.get("PGQUEUE_FAULT_RECORD")
    if not base:
        return
    with open(f"{base}.{os.getpid()}", "a", encoding="utf-8") as fh:
        fh.write(f"{what} {job.id} {os.getpid()} {time.time():.6f}\n")
        fh.flush()


@registry.handler("fault.async")
async def run_async(job: Job) -> dict[str, Any]:
    _note("start", job)
    await asyncio.sleep(float(job.payload.get("seconds", 0.1)))
    _note("end", job)
    return {"ok": True}


@registry.handler("fault.sync")
def run_sync(job: Job) -> dict[str, Any]:
    _note("start", job)
    time.sleep(float(job.payload.get("seconds", 0.1)))
    _note("end", job)
    return {"ok": True}
