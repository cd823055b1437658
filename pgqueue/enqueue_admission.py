"""What one enqueue call does with admission control's verdicts: jobs stored or dropped stand,
a refusal raises :class:`~pgqueue.errors.QueueFull`, and policy ``block`` waits for room with
backoff, up to a timeout (never inside the caller's open transaction), and says so once, at
INFO on this module's logger (the `enqueue` command prints it). Split out of
:mod:`pgqueue.enqueue`, which runs the statements; the rule itself is SQL
(``pgqueue.admission_check``, ``docs/admission.md``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from pgqueue.errors import CannotBlockInTransaction, QueueFull
from pgqueue.models import AdmissionPolicy
from pgqueue.observability import metrics

logger = logging.getLogger(__name__)

#: First and longest pause between two tries of a blocked enqueue, seconds.
_BLOCK_FIRST_PAUSE_SECONDS = 0.01
_BLOCK_MAX_PAUSE_SECONDS = 0.25


class EnqueueAdmission:
    """One enqueue call's way through admission control, shared by the sync and async paths.

    :meth:`step` reads the rows a ``try_enqueue`` call returned and decides: done (the rows
    stand: jobs stored or dropped), wait this long and try again (policy ``block``, room may
    come), or raise :class:`QueueFull`. It also feeds the admission metrics.
    """

    def __init__(
        self, tenant_ids: Sequence[str], timeout_seconds: float, *, in_transaction: bool
    ) -> None:
        self.tenant_ids = tenant_ids
        self.timeout_seconds = timeout_seconds
        self.in_transaction = in_transaction
        self.started: float | None = None
        self.pause = _BLOCK_FIRST_PAUSE_SECONDS
        self.blocked_tier: str | None = None

    def step(self, rows: Sequence[Mapping[str, Any]], now: float, *, many: bool) -> float | None:
        """None when the rows stand; else seconds to wait before the next try.

        Raises:
            QueueFull: a refused row whose tier's policy is reject, or block after the timeout.
            CannotBlockInTransaction: policy block while the caller's transaction is open.
        """
        refused = next((r for r in rows if r["outcome"] == "full"), None)
        if refused is None:
            for r in rows:
                if r["outcome"] == "dropped":
                    metrics.ADMISSION_DROPPED.labels(r["tier"], r["scope"] or "tier").inc()
            if self.started is not None and self.blocked_tier is not None:
                metrics.ADMISSION_BLOCK_SECONDS.labels(self.blocked_tier).observe(
                    now - self.started
                )
            return None
        tier, policy = refused["tier"], refused["policy"]
        index = int(refused["ord"]) - 1 if many else 0
        tenant = self.tenant_ids[index]
        where = f"job {index}: " if many else ""
        subject = (
            f"tier {tier}" if refused["scope"] == "tier" else f"tenant {tenant!r} in tier {tier}"
        )
        # depth is None for a full tier told to a producer (pgqueue.admission_check: it
        # counts every tenant's jobs)
        held = (
            "is at its cap of queued jobs"
            if refused["depth"] is None
            else f"holds {refused['depth']} queued jobs"
        )
        message = f"{where}queue full: {subject} {held} (cap {refused['cap']}, policy {policy})"
        fields: dict[str, Any] = {
            "tier": tier,
            "tenant_id": tenant,
            "depth": refused["depth"],
            "cap": refused["cap"],
            "scope": refused["scope"],
            "policy": policy,
        }
        if policy != AdmissionPolicy.BLOCK:
            metrics.ADMISSION_REJECTED.labels(tier, policy, refused["scope"]).inc()
            raise QueueFull(message, **fields)
        if self.in_transaction:
            metrics.ADMISSION_REJECTED.labels(tier, policy, refused["scope"]).inc()
            raise CannotBlockInTransaction(
                f"{message}; the block policy cannot wait inside the caller's open transaction "
                "(waiting would hold its locks): enqueue outside a transaction to wait for "
                "room, or handle QueueFull",
                **fields,
            )
        if self.started is None:
            self.started = now
            self.blocked_tier = tier
            metrics.ADMISSION_BLOCKED.labels(tier).inc()
            # once per call: a silent wait of up to the timeout read as a hang (found by a
            # tester, `pgqueue enqueue` into a full tier of policy block)
            logger.info(
                "waiting for room: %s%s %s (cap %s, policy block); giving up after %g s",
                where,
                subject,
                held,
                refused["cap"],
                self.timeout_seconds,
            )
        waited = now - self.started
        if waited >= self.timeout_seconds:
            metrics.ADMISSION_REJECTED.labels(tier, policy, refused["scope"]).inc()
            metrics.ADMISSION_BLOCK_SECONDS.labels(tier).observe(waited)
            raise QueueFull(f"{message}; no room after waiting {waited:.2f} s", **fields)
        pause = min(self.pause, self.timeout_seconds - waited) * random.uniform(0.8, 1.2)
        self.pause = min(self.pause * 1.5, _BLOCK_MAX_PAUSE_SECONDS)
        return max(pause, 0.0)
