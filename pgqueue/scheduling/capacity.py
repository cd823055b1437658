"""How the tiers of one lane share its provider's capacity: the pure reference of the rule.

A lane's provider limits are token buckets (input and output tokens, each a limit of
``capacity`` tokens per minute, refilled continuously). :class:`TierShares` splits one of them
between the tiers; :func:`pick_across` applies the rule to every bucket at once (the binding
one may be either):

- **Guarantees.** While a tier is backlogged, its *guarantee* ``g`` grows at its weight's
  share of the refill rate (critical 70, standard 25, batch 5, among the backlogged tiers).
  The guaranteed tokens stay in the bucket for that tier: nobody else may take them. What a
  tier holds beyond its head job's need, when it had no slot to send it, goes back to the
  free tokens; a tier that empties loses its guarantee (no banking, as DRR drops an idle
  tenant's deficit). Σ g never exceeds the bucket's level.
- **Admission.** A tier's head job needing ``n`` tokens may be sent now if ``g ≥ n`` (paid
  from its guarantee), or if its guarantee plus the unreserved tokens (``free`` = level − Σ g)
  cover ``n`` and leave the *trunk reserve* in place: ``g + free − n ≥ reserve``. The
  reserve is kept only by tiers below an idle higher tier (a backlogged higher tier has its own
  guarantee growing), and never more than ``capacity − n``, so any job that fits the bucket
  is eventually admitted. It is counted in requests, as trunk reservation counts circuits:
  room for ``reserve_jobs`` (20) requests of the lane's running mean size, at most
  ``reserve`` (1/4 of the capacity). A reserve of 1/4 of the capacity alone is 15 s of
  refill: after every drain (a restart mid-way through a busy hour, a header from another
  client of the same key) the lower tiers stood still for 15 s while it filled, at any limit;
  with small requests against a large limit it now fills in about a second.
- **Pick.** Among the tiers whose head is admissible, the highest goes first: a higher tier's
  job that fits never waits behind a lower tier's job that does not, and the guarantees keep
  each backlogged tier's share from being taken by those above it.

Why this rule. Shares counted in dispatches (the SWRR of :mod:`~pgqueue.scheduling.tiers`)
let a 7,000-token standard job at the head of the order hold a 500-token critical job until
the bucket refills; guarantees are weighted fair queuing in the resource itself (A. Demers,
S. Keshav and S. Shenker, SIGCOMM 1989; for LLM serving in tokens, Y. Sheng et al., "Fairness
in Serving Large Language Models", OSDI 2024), and the reserve is trunk reservation (as in
telephone networks: a lower class is admitted only while the trunk keeps a margin of free
circuits; F. P. Kelly, "Loss Networks", Ann. Appl. Probab. 1991): work-conserving tiers would
otherwise drain the bucket to zero whenever critical is idle, and the next critical job would
wait for the refill. In steady state the reserve costs no throughput: the refill rate is the
same. Pure: every time is a float of seconds on a clock injected by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pgqueue.models import Tier
from pgqueue.scheduling.tiers import DEFAULT_TIER_WEIGHTS

__all__ = [
    "DEFAULT_RESERVE_FRACTION",
    "DEFAULT_RESERVE_JOBS",
    "MEAN_WEIGHT",
    "TierShares",
    "pick_across",
]

#: Default trunk reserve, as a fraction of the bucket's capacity (1/4: 10,000 of 40,000).
#: A burst of critical jobs larger than the reserve waits for critical's share (70 %) of the
#: refill, so the reserve must hold a burst. At Tier-1 limits (tests/unit/test_tier_capacity.py,
#: 6 seeds each) 1/8 was too little: critical's p99 wait was 2.6-17 s in all runs at 60 % demand
#: in 1,500-token jobs, and 6-18 s in 6 of 18 runs with sizes from the Azure trace at 42-60 %;
#: with 1/4 it is at most 0.75 s in all 36 runs, batch keeping 5.3-15.7 % of the tokens.
DEFAULT_RESERVE_FRACTION = 0.25
#: Default trunk reserve in requests of the lane's mean size (its cap is the fraction above).
#: At Tier-1 limits the cap binds (20 requests of 500 tokens are 10,000); in the demo's scaled
#: limits (about 1M tokens a minute, requests of about 900) the reserve is 18,000 tokens, one
#: second of refill, where the fraction alone held standard and batch for 15 s after the drain.
DEFAULT_RESERVE_JOBS = 20.0
#: Weight of a new request in the running mean of the sizes (an exponential moving average).
MEAN_WEIGHT = 1 / 16

_ORDER: tuple[Tier, ...] = tuple(Tier)


@dataclass(slots=True)
class TierShares:
    """One lane's token bucket and its tiers' guarantees (tokens).

    ``capacity``: tokens per minute (the bucket's size; refill ``capacity / 60`` per second).
    ``level``: tokens in the bucket at time ``at`` (seconds). ``reserve``: the most the trunk
    reserve holds, in tokens (default :data:`DEFAULT_RESERVE_FRACTION` of the capacity);
    ``reserve_jobs``: the reserve in requests of ``mean_need`` (tokens, the running mean of the
    sizes taken, 0 before the first take: no reserve until a request was sent). ``weights``:
    each tier's share, > 0. Raises ``ValueError`` for a capacity, level or reserve out of range
    or a missing or non-positive weight.
    """

    capacity: float
    level: float
    at: float
    reserve: float | None = None
    reserve_jobs: float = DEFAULT_RESERVE_JOBS
    mean_need: float = 0.0
    weights: Mapping[Tier, float] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    guarantee: dict[Tier, float] = field(default_factory=lambda: dict.fromkeys(_ORDER, 0.0))

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            raise ValueError(f"capacity must be finite and > 0, got {self.capacity!r}")
        if not (0 <= self.level <= self.capacity):
            raise ValueError(f"level must be in [0, capacity], got {self.level!r}")
        if self.reserve is None:
            self.reserve = DEFAULT_RESERVE_FRACTION * self.capacity
        if not (0 <= self.reserve < self.capacity):
            raise ValueError(f"reserve must be in [0, capacity), got {self.reserve!r}")
        if not (math.isfinite(self.reserve_jobs) and self.reserve_jobs >= 0):
            raise ValueError(f"reserve_jobs must be finite and >= 0, got {self.reserve_jobs!r}")
        for tier in _ORDER:
            weight = self.weights.get(tier, 0.0)
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"weight of {tier.value!r} must be finite and > 0")

    @classmethod
    def full(cls, per_minute: float, now: float, reserve: float | None = None) -> TierShares:
        """A full bucket of ``per_minute`` tokens at ``now``, no guarantees."""
        return cls(per_minute, per_minute, now, reserve)

    @property
    def free(self) -> float:
        """Tokens in the bucket that no tier's guarantee holds."""
        return self.level - math.fsum(self.guarantee.values())

    def _reserve_for(self, tier: Tier, need: float, backlogged: Mapping[Tier, float]) -> float:
        """The reserve ``tier`` must leave: kept for an idle higher tier, room for
        ``reserve_jobs`` requests of the mean size, at most ``reserve``, capped so that a job
        that fits the bucket can still be admitted."""
        higher = _ORDER[: _ORDER.index(tier)]
        if all(t in backlogged for t in higher):
            return 0.0
        assert self.reserve is not None
        held = min(self.reserve, self.reserve_jobs * self.mean_need)
        return max(0.0, min(held, self.capacity - need))

    def advance(self, now: float, backlogged: Mapping[Tier, float]) -> None:
        """Refill the bucket up to ``now`` and grow the guarantees.

        ``backlogged`` maps each tier with queued work to its head job's need in tokens; the
        guarantees of the other tiers are dropped, and those above the head's need are cut
        back to it. Guarantees grow by ``weight / Σ backlogged weights × rate × elapsed``
        each, highest tier first, from the free tokens (a lower tier leaves its reserve). A
        clock that went back adds nothing.
        """
        elapsed = max(0.0, now - self.at)
        rate = self.capacity / 60.0
        self.level = min(self.capacity, self.level + rate * elapsed)
        self.at = max(self.at, now)
        for tier in _ORDER:
            if tier not in backlogged:
                self.guarantee[tier] = 0.0
            else:  # a guarantee above the head's need was not used: its tier had no slot
                self.guarantee[tier] = min(self.guarantee[tier], backlogged[tier])
        total_weight = math.fsum(self.weights[t] for t in backlogged)
        for tier in _ORDER:
            if tier not in backlogged:
                continue
            grow = min(
                self.weights[tier] / total_weight * rate * elapsed,
                self.free - self._reserve_for(tier, backlogged[tier], backlogged),
            )
            if grow > 0:
                self.guarantee[tier] += grow

    def admissible(self, tier: Tier, need: float, backlogged: Mapping[Tier, float]) -> bool:
        """Whether ``tier``'s head job needing ``need`` tokens may be sent now (see the module
        docstring); ``backlogged`` as for :meth:`advance`."""
        if need > self.level:
            return False
        held = self.guarantee[tier]
        if held >= need:
            return True
        return held + self.free - need >= self._reserve_for(tier, need, backlogged)

    def take(self, tier: Tier, need: float) -> None:
        """Charge an admitted job: the bucket loses ``need`` tokens, paid first from the tier's
        guarantee, and the running mean of the sizes moves toward ``need`` by
        :data:`MEAN_WEIGHT` (the first take sets it). Raises ``ValueError`` if the bucket holds
        fewer than ``need`` tokens."""
        if need > self.level:
            raise ValueError(f"cannot take {need!r} tokens from a bucket at {self.level!r}")
        self.level -= need
        self.mean_need = (
            need if self.mean_need == 0 else self.mean_need + MEAN_WEIGHT * (need - self.mean_need)
        )
        self.guarantee[tier] = max(0.0, self.guarantee[tier] - need)

    def pick(self, heads: Mapping[Tier, float]) -> Tier | None:
        """The tier to send next among ``heads`` (tier → its head job's need, the backlogged
        tiers): the highest whose head is admissible, or ``None`` when none is."""
        return pick_across([(self, heads)])


def pick_across(
    buckets: Sequence[tuple[TierShares, Mapping[Tier, float]]],
    room: Callable[[Tier], bool] | None = None,
) -> Tier | None:
    """The tier a lane sends next when the rule shares several token buckets (input and
    output tokens): the highest tier backlogged in the first bucket whose head is admissible
    in every bucket (each :class:`TierShares` with its heads' needs in its own tokens) and for
    which ``room`` holds (the requests bucket, say; ``None``: always), or ``None``. Sharing one
    bucket only let the lower tiers' smaller requests take the other's tokens as they came,
    and a higher head needing more never found them."""
    first = buckets[0][1]
    for tier in _ORDER:
        if tier not in first:
            continue
        if all(shares.admissible(tier, heads[tier], heads) for shares, heads in buckets) and (
            room is None or room(tier)
        ):
            return tier
    return None
