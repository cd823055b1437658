"""Deficit Round Robin's order as sort keys on the jobs: the pure reference of scheduler v2.

:class:`KeyedDrr` gives every queued job a key ``(round, place, seq)`` when it is *stamped*;
dispatching the smallest key gives exactly the order of the classic
:class:`~pgqueue.scheduling.drr.DrrScheduler` (tested with hypothesis on random cases). The SQL
scheduler stores the same keys on ``pgqueue.jobs`` and claims ``ORDER BY key``; this module is
its oracle. Costs and quanta are integer *cost units* (:func:`to_units`: one unit = one
estimated input token, a job at least 1,000), so both sides compute the same sums.

The arithmetic (M. Shreedhar and G. Varghese, "Efficient Fair Queuing using Deficit Round
Robin", SIGCOMM 1995, read as a virtual-time scheduler in the manner of P. Goyal, H. Vin and
H. Cheng, "Start-time Fair Queueing", SIGCOMM 1996): a tenant backlogged since it joined with
deficit 0 in round ``R`` serves its k-th job in round ``R + ceil(cumcost_k / quantum) - 1``,
and within a round the backlogged tenants take their turns in a fixed cycle, by *place*. A
tenant that (re)joins takes its place at the tail of the active list, which in the cycle is
just before the *cursor* (the round and place of the last dispatched job): its place lies
between the cursor's place and the active place before it, and its first round is the
cursor's round + 1. Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from pgqueue.scheduling.drr import TOKENS_PER_COST_UNIT, stable_offset

__all__ = ["UNITS_PER_COST", "DrrKey", "KeyedDrr", "Stamped", "to_units"]

#: Integer cost units per cost unit of :func:`~pgqueue.scheduling.drr.job_cost`: one unit is
#: one estimated input token, so a job costs at least 1,000 units and the default quantum of
#: 5 is 5,000 units.
UNITS_PER_COST = TOKENS_PER_COST_UNIT


def to_units(cost: float) -> int:
    """``cost`` (cost units, as ``pgqueue.jobs.cost`` or a quantum) in integer units,
    rounded to the nearest unit; at least 1.

    Raises ``ValueError`` if ``cost`` is not finite and > 0.
    """
    if not (math.isfinite(cost) and cost > 0):
        raise ValueError(f"cost must be finite and > 0, got {cost!r}")
    return max(1, round(cost * UNITS_PER_COST))


@dataclass(frozen=True, order=True, slots=True)
class DrrKey:
    """A job's place in the DRR order; keys compare as tuples.

    ``round``: the DRR round of the job's turn (an integer, counted per lane and tier).
    ``place``: its tenant's place in the cycle (an exact rational; SQL ``numeric``).
    ``seq``: the stamping sequence, which orders a tenant's jobs within one turn (FIFO).
    """

    round: int
    place: Fraction
    seq: int


@dataclass(frozen=True, slots=True)
class Stamped:
    """A stamped job: its key, tenant, id and cost in integer units."""

    key: DrrKey
    tenant_id: str
    job_id: int
    cost: int


@dataclass(slots=True)
class _Flow:
    """One backlogged tenant: its place, the round and credit after its last stamped job."""

    place: Fraction
    last_round: int
    credit: int
    stamped: deque[Stamped] = field(default_factory=deque)


class KeyedDrr:
    """DRR over tenants as keys: :meth:`fold` stamps, :meth:`next` dispatches the smallest key.

    - :meth:`enqueue` appends a job to its tenant's FIFO, unstamped.
    - :meth:`fold` (called by :meth:`next` and :meth:`head`) first lets the tenants with
      unstamped jobs and no flow *join*: sorted by ``(offset_of(tenant), tenant)``, they take
      places, in that order, between the last active place before the cursor's place and the
      cursor's place (below it when no active place is), with round = cursor round, credit 0.
      Then it stamps each flow's unstamped jobs in FIFO order: a job of cost ``c`` gets round
      ``r`` if ``c <= credit``, else ``r + ceil((c - credit) / quantum)`` (a turn per round,
      each adding a quantum), and ``credit`` becomes what is left. With ``horizon_rounds``, a
      flow that already holds a stamped job stops at the first job past ``cursor round +
      horizon_rounds`` (it stays backlogged; a later fold goes on), so one fold's work per
      tenant is bounded however many jobs it queued.
    - :meth:`next` dispatches the smallest stamped key and moves the cursor to it; a tenant
      with nothing left, stamped or not, leaves (its credit is dropped: idle tenants bank
      nothing).

    ``quantum_of`` returns a tenant's quantum in integer units (read when its jobs are
    stamped); it must be an ``int`` > 0, else ``ValueError``. Costs must be ``int`` > 0.
    """

    def __init__(
        self,
        quantum_of: Callable[[str], int],
        offset_of: Callable[[str], int] | None = None,
        horizon_rounds: int | None = None,
    ) -> None:
        if horizon_rounds is not None and horizon_rounds < 0:
            raise ValueError(f"horizon_rounds must be >= 0 or None, got {horizon_rounds!r}")
        self._quantum_of = quantum_of
        self._offset_of: Callable[[str], int] = (
            offset_of if offset_of is not None else stable_offset
        )
        self.horizon_rounds = horizon_rounds
        self._unstamped: dict[str, deque[tuple[int, int]]] = {}
        self._flows: dict[str, _Flow] = {}
        self._seq = 0
        self.cursor: tuple[int, Fraction] = (0, Fraction(0))

    def enqueue(self, tenant_id: str, job_id: int, cost: int) -> None:
        """Append job ``job_id`` of ``cost`` integer units to ``tenant_id``'s FIFO, unstamped.

        Raises ``ValueError`` if ``cost`` is not an ``int`` > 0.
        """
        if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
            raise ValueError(f"cost must be an int > 0, got {cost!r}")
        self._unstamped.setdefault(tenant_id, deque()).append((job_id, cost))

    def _quantum(self, tenant_id: str) -> int:
        quantum = self._quantum_of(tenant_id)
        if isinstance(quantum, bool) or not isinstance(quantum, int) or quantum <= 0:
            raise ValueError(f"quantum of tenant {tenant_id!r} must be an int > 0, got {quantum!r}")
        return quantum

    def _join(self) -> None:
        joiners = sorted(
            (tenant for tenant in self._unstamped if tenant not in self._flows),
            key=lambda tenant: (self._offset_of(tenant), tenant),
        )
        if not joiners:
            return
        cursor_round, cursor_place = self.cursor
        below = [flow.place for flow in self._flows.values() if flow.place < cursor_place]
        count = len(joiners)
        for i, tenant in enumerate(joiners, start=1):
            if below:
                low = max(below)
                place = low + (cursor_place - low) * Fraction(i, count + 1)
            else:
                place = cursor_place - (count + 1 - i)
            self._flows[tenant] = _Flow(place, cursor_round, 0)

    def fold(self) -> None:
        """Let new tenants join, then stamp the unstamped jobs (up to the horizon)."""
        self._join()
        limit = None if self.horizon_rounds is None else self.cursor[0] + self.horizon_rounds
        for tenant, jobs in list(self._unstamped.items()):
            flow = self._flows[tenant]
            quantum = self._quantum(tenant)
            while jobs:
                job_id, cost = jobs[0]
                turns = 0 if cost <= flow.credit else -(-(cost - flow.credit) // quantum)
                round_ = flow.last_round + turns
                if limit is not None and round_ > limit and flow.stamped:
                    break
                jobs.popleft()
                self._seq += 1
                flow.credit += turns * quantum - cost
                flow.last_round = round_
                key = DrrKey(round_, flow.place, self._seq)
                flow.stamped.append(Stamped(key, tenant, job_id, cost))
            if not jobs:
                del self._unstamped[tenant]

    def head(self) -> Stamped | None:
        """Fold, then the job :meth:`next` would dispatch (``None`` when nothing is queued)."""
        self.fold()
        heads = [flow.stamped[0] for flow in self._flows.values()]
        return min(heads, key=lambda stamped: stamped.key) if heads else None

    def next(self) -> Stamped | None:
        """Fold, then dispatch the job with the smallest key (``None`` when nothing is queued)."""
        best = self.head()
        if best is None:
            return None
        flow = self._flows[best.tenant_id]
        flow.stamped.popleft()
        if not flow.stamped and best.tenant_id not in self._unstamped:
            del self._flows[best.tenant_id]  # its queue emptied: it leaves the cycle
        self.cursor = (best.key.round, best.key.place)
        return best

    def stamped(self) -> list[Stamped]:
        """Every stamped, undispatched job in key order (what the SQL claim index holds)."""
        return sorted(
            (s for flow in self._flows.values() for s in flow.stamped), key=lambda s: s.key
        )

    def unstamped_count(self) -> int:
        """Jobs queued but not stamped yet."""
        return sum(len(jobs) for jobs in self._unstamped.values())

    def __len__(self) -> int:
        """Queued jobs, stamped or not."""
        return self.unstamped_count() + sum(len(f.stamped) for f in self._flows.values())
