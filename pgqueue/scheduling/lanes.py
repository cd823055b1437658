"""Lanes: one per rate-limit pool, each with its own DRR per tier and its own capacity shares.

The pure reference of a claim in scheduler v2. A *lane* is a rate-limit pool (:func:`lane_of`:
for the Messages API the model, for any other kind the kind). Each lane holds one
:class:`~pgqueue.scheduling.keys.KeyedDrr` per tier (its own keys and cursor) and, when the
provider limits it, a :class:`~pgqueue.scheduling.capacity.TierShares` (its input-token bucket
shared by the tiers), a requests bucket and a cooldown. A claim takes, one job at a time, from
the lanes whose pool has room now; a lane in cooldown or out of tokens holds back nothing
outside itself. Pure: the clock is injected (seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pgqueue.models import Tier
from pgqueue.scheduling.capacity import TierShares
from pgqueue.scheduling.keys import DrrKey, KeyedDrr
from pgqueue.scheduling.ratelimit import TokenBucket

__all__ = ["MESSAGES_KIND", "Lane", "LaneDispatch", "LaneScheduler", "lane_of"]

#: The kind of the built-in Messages API handler (its lane is the model).
MESSAGES_KIND = "anthropic.messages"

_ORDER: tuple[Tier, ...] = tuple(Tier)


def lane_of(kind: str, model: str | None) -> str:
    """The lane of a job: its model for a Messages API job that names one, else its kind."""
    if kind == MESSAGES_KIND and model:
        return model
    return kind


@dataclass(frozen=True, slots=True)
class LaneDispatch:
    """One dispatched job: lane, tier, tenant, id, DRR key and tokens charged to the pool."""

    lane: str
    tier: Tier
    tenant_id: str
    job_id: int
    key: DrrKey
    tokens: int


@dataclass(slots=True)
class Lane:
    """One rate-limit pool: a DRR per tier, and the pool's limits (``None``: unlimited).

    ``shares``: the input-token bucket and the tiers' guarantees. ``requests``: the
    requests-per-minute bucket. ``cooldown_until``: no job is sent before it (seconds).
    """

    drr: dict[Tier, KeyedDrr]
    shares: TierShares | None = None
    requests: TokenBucket | None = None
    cooldown_until: float = float("-inf")
    tokens: dict[int, int] = field(default_factory=dict)

    def pick(self, now: float) -> tuple[Tier, int] | None:
        """The tier and job this lane would send now, or ``None`` (nothing due, or no room)."""
        if now < self.cooldown_until:
            return None
        if self.requests is not None and self.requests.refilled(now).available < 1:
            return None
        heads = {tier: head for tier in _ORDER if (head := self.drr[tier].head()) is not None}
        if not heads:
            return None
        if self.shares is None:
            tier = next(iter(heads))
        else:
            needs = {tier: float(self.tokens[head.job_id]) for tier, head in heads.items()}
            self.shares.advance(now, needs)
            picked = self.shares.pick(needs)
            if picked is None:
                return None
            tier = picked
        return tier, heads[tier].job_id


class LaneScheduler:
    """Every lane of a queue. :meth:`claim` takes up to ``limit`` jobs that can be sent now.

    Across lanes, each pick takes the highest tier any lane can send, then the job that
    arrived first (the lanes are independent pools, so the choice only orders one claim's
    jobs). ``quantum_of`` is a tenant's quantum in integer units (as for
    :class:`~pgqueue.scheduling.keys.KeyedDrr`), ``horizon_rounds`` bounds each fold.
    """

    def __init__(self, quantum_of: Callable[[str], int], horizon_rounds: int | None = None) -> None:
        self._quantum_of = quantum_of
        self._horizon = horizon_rounds
        self.lanes: dict[str, Lane] = {}
        self._arrival: dict[int, int] = {}
        self._count = 0

    def lane(self, name: str) -> Lane:
        """The lane ``name``, created unlimited on first use."""
        found = self.lanes.get(name)
        if found is None:
            drr = {t: KeyedDrr(self._quantum_of, horizon_rounds=self._horizon) for t in Tier}
            found = self.lanes[name] = Lane(drr)
        return found

    def enqueue(
        self, lane: str, tier: Tier, tenant_id: str, job_id: int, cost: int, *, tokens: int = 0
    ) -> None:
        """Queue a job of ``cost`` integer units (DRR) needing ``tokens`` input tokens from its
        lane's bucket. Raises ``ValueError`` for a cost that is not an int > 0."""
        target = self.lane(lane)
        target.drr[tier].enqueue(tenant_id, job_id, cost)
        target.tokens[job_id] = tokens
        self._count += 1
        self._arrival[job_id] = self._count

    def claim(self, limit: int, now: float) -> list[LaneDispatch]:
        """Up to ``limit`` jobs that can be sent at ``now``, charged to their lanes' buckets."""
        out: list[LaneDispatch] = []
        while len(out) < limit:
            best: tuple[int, int, str, Tier] | None = None
            for name, lane in self.lanes.items():
                picked = lane.pick(now)
                if picked is None:
                    continue
                tier, job_id = picked
                rank = (_ORDER.index(tier), self._arrival[job_id], name, tier)
                if best is None or rank < best:
                    best = rank
            if best is None:
                return out
            _, _, name, tier = best
            lane = self.lanes[name]
            stamped = lane.drr[tier].next()
            assert stamped is not None
            tokens = lane.tokens.pop(stamped.job_id)
            if lane.shares is not None:
                lane.shares.take(tier, float(tokens))
            if lane.requests is not None:
                taken, lane.requests = lane.requests.try_take(1, now)
                assert taken
            del self._arrival[stamped.job_id]
            out.append(
                LaneDispatch(name, tier, stamped.tenant_id, stamped.job_id, stamped.key, tokens)
            )
        return out

    def __len__(self) -> int:
        """Queued jobs over every lane and tier."""
        return sum(len(d) for lane in self.lanes.values() for d in lane.drr.values())
