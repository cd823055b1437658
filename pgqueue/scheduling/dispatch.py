"""The whole dispatch rule of a claim, pure: tier pick, then Deficit Round Robin within the tier.

:class:`TieredDrr` composes a :class:`~pgqueue.scheduling.tiers.TierPolicy` with one
:class:`~pgqueue.scheduling.drr.DrrScheduler` per tier. The SQL claim (``pgqueue.claim`` in
migration 0002) implements the same rule against rows and is tested against this class on the
same inputs. Pure: no I/O, no clock; randomness only through the policy's injected RNG.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pgqueue.models import Tier
from pgqueue.scheduling.drr import DrrScheduler
from pgqueue.scheduling.tiers import TierPolicy

__all__ = ["Dispatch", "TieredDrr"]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One dispatched job: its tier, tenant, id and cost in cost units."""

    tier: Tier
    tenant_id: str
    job_id: int
    cost: float


class TieredDrr:
    """One dispatch per :meth:`next`: the policy picks a tier among those with queued work,
    then that tier's DRR scheduler picks the tenant and job.

    A tier is eligible when its scheduler holds at least one job, so the composition is
    work-conserving whenever the policy is. Newly backlogged tenants of a tier join that
    tier's round at its next dispatch (``DrrScheduler``'s staggered order), which is also when
    the SQL claim folds them in.
    """

    def __init__(
        self,
        policy: TierPolicy,
        quantum_of: Callable[[str], float],
        offset_of: Callable[[str], int] | None = None,
    ) -> None:
        self.policy = policy
        self.tiers: dict[Tier, DrrScheduler] = {
            tier: DrrScheduler(quantum_of, offset_of) for tier in Tier
        }

    def enqueue(self, tier: Tier, tenant_id: str, job_id: int, cost: float) -> None:
        """Queue a job at the tail of ``tenant_id``'s FIFO in ``tier``.

        Raises ``ValueError`` if ``cost`` is not finite and > 0.
        """
        self.tiers[tier].enqueue(tenant_id, job_id, cost)

    def eligible(self) -> frozenset[Tier]:
        """Tiers with at least one queued job."""
        return frozenset(tier for tier, sched in self.tiers.items() if len(sched) > 0)

    def next(self) -> Dispatch | None:
        """The next dispatch, or ``None`` only when nothing is queued."""
        tier = self.policy.pick(self.eligible())
        if tier is None:
            return None
        item = self.tiers[tier].next()
        assert item is not None  # an eligible tier has a job
        tenant_id, job_id, cost = item
        return Dispatch(tier, tenant_id, job_id, cost)

    def __len__(self) -> int:
        """Queued jobs over all tiers."""
        return sum(len(sched) for sched in self.tiers.values())
