"""Which tier a job belongs to, and which tier the next claim serves.

:func:`classify` is the one place the tier rule lives in Python (the SQL ``enqueue`` mirrors it
and is tested against it). The tier-pick policies choose among the tiers that have eligible work
*now*; all of them are work-conserving: they return ``None`` only when nothing is eligible.
They drive ``pgqueue simulate``; the SQL claim (``pgqueue.claim_lanes``, 071_claim.sql) applies
the same three policies to the slots of each lane, with no shared row: ``weighted`` there is a
random draw by weight per slot (the same shares in expectation). How the tiers of a
rate-limited lane share its tokens is :mod:`~pgqueue.scheduling.capacity` (docs/drr.md).
Pure: no I/O; randomness comes from an injected ``random.Random``; policy state is a plain
``dict[str, float]``, which a caller can save and restore.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Protocol, assert_never, runtime_checkable

from pgqueue.models import BATCH_SLA_SECONDS, Origin, Tier

__all__ = [
    "DEFAULT_PROBABILISTIC_REST_WEIGHTS",
    "DEFAULT_TIER_WEIGHTS",
    "POLICY_NAMES",
    "ProbabilisticPolicy",
    "StrictPolicy",
    "TierPolicy",
    "WeightedPolicy",
    "classify",
    "policy_from_name",
]

#: Tiers in priority order (the enum's declaration order).
_ORDER: tuple[Tier, ...] = tuple(Tier)

#: Guaranteed share of dispatches of each tier while it has eligible work (the article's 70/25/5).
DEFAULT_TIER_WEIGHTS: Mapping[Tier, float] = {
    Tier.CRITICAL: 70.0,
    Tier.STANDARD: 25.0,
    Tier.BATCH: 5.0,
}

#: Standard:batch odds of the probabilistic policy when critical is not taken (the article's 25:5).
DEFAULT_PROBABILISTIC_REST_WEIGHTS: Mapping[Tier, float] = {Tier.STANDARD: 25.0, Tier.BATCH: 5.0}

#: Names accepted by :func:`policy_from_name`.
POLICY_NAMES: tuple[str, ...] = ("weighted", "probabilistic", "strict")


def classify(origin: Origin, sla_seconds: float | None, *, demoted: bool) -> Tier:
    """The tier of a new job. Callers never choose a tier; this rule does, in this order:

    1. the tenant is demoted → ``batch`` (demotion wins over everything, ``user_action`` too:
       the design demotes "a demoted tenant's new jobs" to batch, as congestion control);
    2. ``origin`` is ``user_action`` → ``critical`` (whatever ``sla_seconds`` says);
    3. ``sla_seconds`` is ``None`` or ≥ :data:`~pgqueue.models.BATCH_SLA_SECONDS` (86,400 s)
       → ``batch``;
    4. otherwise → ``standard`` (also for origin ``batch_job`` with an SLA under a day: the SLA
       decides, not the origin's name).

    ``sla_seconds`` is in seconds; ``math.inf`` counts as "no deadline" (batch).

    Raises ``ValueError`` if ``sla_seconds`` is negative or NaN (the SQL side must reject the
    same values rather than classify them).
    """
    if sla_seconds is not None and (math.isnan(sla_seconds) or sla_seconds < 0):
        raise ValueError(f"sla_seconds must be >= 0 or None, got {sla_seconds!r}")
    if demoted:
        return Tier.BATCH
    match origin:
        case Origin.USER_ACTION:
            return Tier.CRITICAL
        case Origin.SCHEDULED | Origin.BATCH_JOB:
            if sla_seconds is None or sla_seconds >= BATCH_SLA_SECONDS:
                return Tier.BATCH
            return Tier.STANDARD
        case _:
            assert_never(origin)


@runtime_checkable
class TierPolicy(Protocol):
    """Chooses the tier the next claim serves, among the tiers that have eligible work.

    Contract: ``pick`` returns a member of ``eligible``, and ``None`` only when ``eligible`` is
    empty (work-conserving). ``state()`` exports whatever the policy remembers between picks as
    a plain ``{name: float}`` dict, and ``load_state()`` restores it, so a caller can save the
    state and go on from it later.
    """

    name: str

    def pick(self, eligible: frozenset[Tier]) -> Tier | None:
        """The tier to serve next, or ``None`` when ``eligible`` is empty."""
        ...

    def state(self) -> dict[str, float]:
        """The policy's memory as a plain dict (empty for a stateless policy)."""
        ...

    def load_state(self, state: Mapping[str, float]) -> None:
        """Replace the policy's memory with ``state`` (as produced by :meth:`state`)."""
        ...


def _check_weights(weights: Mapping[Tier, float], tiers: tuple[Tier, ...]) -> dict[Tier, float]:
    """Every tier in ``tiers`` has a finite weight > 0, and no other tier has one."""
    extra = set(weights) - set(tiers)
    if extra:
        raise ValueError(f"unexpected tiers in weights: {sorted(extra)}")
    checked: dict[Tier, float] = {}
    for tier in tiers:
        if tier not in weights:
            raise ValueError(f"missing weight for tier {tier.value!r}")
        weight = float(weights[tier])
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight of {tier.value!r} must be finite and > 0, got {weight!r}")
        checked[tier] = weight
    return checked


class WeightedPolicy:
    """Deterministic smooth weighted round robin (SWRR) over the eligible tiers.

    The algorithm of nginx's upstream round robin (Maxim Dounin, "Upstream: smooth weighted
    round-robin balancing", nginx commit 52327e0627f4, 2012). Each pick:

    1. every *eligible* tier's ``current += weight``;
    2. the eligible tier with the largest ``current`` is picked (ties → the higher-priority tier);
    3. the picked tier's ``current -= W``, where ``W`` is the sum of the eligible tiers' weights.

    Ineligible tiers take no part and their ``current`` stays as it was (as nginx skips a down
    peer), so an empty tier's share flows to the others and nothing is banked or lost. With a
    fixed eligible set, tier ``i`` gets exactly ``weight_i / W`` of every ``W`` consecutive picks
    (for integer weights) and its count never strays more than about one pick from
    ``n · weight_i / W`` in any prefix — the tighter bounds that make it preferable to random
    draws. Weights are dimensionless shares (default 70/25/5); every tier needs one > 0, so no
    tier can be starved while it has work.

    Raises ``ValueError`` for missing, extra, non-finite or non-positive weights.
    """

    name = "weighted"

    def __init__(self, weights: Mapping[Tier, float] | None = None) -> None:
        self.weights: dict[Tier, float] = _check_weights(
            DEFAULT_TIER_WEIGHTS if weights is None else weights, _ORDER
        )
        self._current: dict[Tier, float] = dict.fromkeys(_ORDER, 0.0)

    def pick(self, eligible: frozenset[Tier]) -> Tier | None:
        """The next tier by SWRR among ``eligible``; ``None`` only if ``eligible`` is empty."""
        total = 0.0
        best: Tier | None = None
        for tier in _ORDER:  # priority order, so ">" keeps the higher-priority tier on ties
            if tier not in eligible:
                continue
            weight = self.weights[tier]
            self._current[tier] += weight
            total += weight
            if best is None or self._current[tier] > self._current[best]:
                best = tier
        if best is not None:
            self._current[best] -= total
        return best

    def state(self) -> dict[str, float]:
        """The SWRR ``current`` value of every tier, keyed by tier name."""
        return {tier.value: self._current[tier] for tier in _ORDER}

    def load_state(self, state: Mapping[str, float]) -> None:
        """Restore ``current`` values; missing tiers start at 0.

        Raises ``ValueError`` for a key that is not a tier name or a non-finite value.
        """
        loaded = dict.fromkeys(_ORDER, 0.0)
        for key, value in state.items():
            try:
                tier = Tier(key)
            except ValueError:
                raise ValueError(f"unknown tier in weighted policy state: {key!r}") from None
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"state of {key!r} must be finite, got {value!r}")
            loaded[tier] = number
        self._current = loaded


class ProbabilisticPolicy:
    """The article's random tier pick, made work-conserving.

    When ``critical`` is eligible it is taken with probability ``p_critical`` (default 0.9, the
    article's "critical wins with probability 0.9"). Otherwise a weighted draw (default
    standard:batch = 25:5) among the *eligible* non-critical tiers; the draw only ranges over
    eligible tiers, so it always lands on one. If no non-critical tier is eligible, critical is
    taken after all (the article's version could return nothing here while work waited).

    Stateless apart from ``rng``: ``state()`` is ``{}`` and ``load_state`` ignores its argument,
    so a state saved by another policy does not break a switch of policy.

    Raises ``ValueError`` if ``p_critical`` is outside ``[0, 1]`` or a weight is missing, extra
    (critical), non-finite or non-positive.
    """

    name = "probabilistic"

    def __init__(
        self,
        rng: random.Random,
        p_critical: float = 0.9,
        weights_rest: Mapping[Tier, float] | None = None,
    ) -> None:
        if not (0.0 <= p_critical <= 1.0):
            raise ValueError(f"p_critical must be in [0, 1], got {p_critical!r}")
        self.rng = rng
        self.p_critical = p_critical
        self.weights_rest: dict[Tier, float] = _check_weights(
            DEFAULT_PROBABILISTIC_REST_WEIGHTS if weights_rest is None else weights_rest,
            (Tier.STANDARD, Tier.BATCH),
        )

    def pick(self, eligible: frozenset[Tier]) -> Tier | None:
        """A random eligible tier as described above; ``None`` only if ``eligible`` is empty."""
        if not eligible:
            return None
        if Tier.CRITICAL in eligible and self.rng.random() < self.p_critical:
            return Tier.CRITICAL
        rest = [tier for tier in _ORDER if tier in eligible and tier in self.weights_rest]
        if not rest:
            return next(tier for tier in _ORDER if tier in eligible)
        total = sum(self.weights_rest[tier] for tier in rest)
        draw = self.rng.random() * total
        for tier in rest:
            draw -= self.weights_rest[tier]
            if draw < 0:
                return tier
        return rest[-1]  # only reachable through float rounding at the very top of the range

    def state(self) -> dict[str, float]:
        """Always ``{}``: the policy remembers nothing between picks."""
        return {}

    def load_state(self, state: Mapping[str, float]) -> None:
        """Nothing to restore; ``state`` is ignored."""


class StrictPolicy:
    """Plain priority order: the first eligible tier of critical, standard, batch.

    Starves lower tiers under a steady inflow of higher-tier work; it exists so the simulator
    can show that. Stateless: ``state()`` is ``{}`` and ``load_state`` ignores its argument.
    """

    name = "strict"

    def pick(self, eligible: frozenset[Tier]) -> Tier | None:
        """The highest-priority eligible tier; ``None`` only if ``eligible`` is empty."""
        for tier in _ORDER:
            if tier in eligible:
                return tier
        return None

    def state(self) -> dict[str, float]:
        """Always ``{}``: the policy remembers nothing between picks."""
        return {}

    def load_state(self, state: Mapping[str, float]) -> None:
        """Nothing to restore; ``state`` is ignored."""


def policy_from_name(name: str, rng: random.Random | None = None) -> TierPolicy:
    """Build a policy with default parameters from its name (case and blanks ignored).

    ``"weighted"`` → :class:`WeightedPolicy`, ``"probabilistic"`` → :class:`ProbabilisticPolicy`
    (with ``rng``, or a fresh OS-seeded ``random.Random()`` when ``rng`` is ``None``),
    ``"strict"`` → :class:`StrictPolicy`.

    Raises ``ValueError`` for any other name.
    """
    key = name.strip().lower()
    if key == "weighted":
        return WeightedPolicy()
    if key == "probabilistic":
        return ProbabilisticPolicy(rng if rng is not None else random.Random())
    if key == "strict":
        return StrictPolicy()
    raise ValueError(f"unknown tier policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
