"""Per-tenant fair sharing within a tier: the pure reference of Deficit Round Robin.

:class:`DrrScheduler` is DRR (M. Shreedhar and G. Varghese, "Efficient Fair Queuing using
Deficit Round Robin", ACM SIGCOMM 1995) dispensing one job per call, the way a claim takes one
job. It is the oracle of the order: the SQL scheduler (``070_scheduler.sql``) stores DRR's
order as keys on the jobs, whose pure reference :class:`~pgqueue.scheduling.keys.KeyedDrr` is
tested to dispatch exactly as this class does. Also here: the cost model (:func:`job_cost`,
:func:`estimate_input_tokens`), plan quanta (:func:`quantum_for_plan`), the stable refill-order
offset (:func:`stable_offset`) and Jain's fairness index (:func:`jain_index`).
Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_PLAN",
    "DEFAULT_QUANTUM",
    "KNOWN_PLANS",
    "PLAN_QUANTUM_MULTIPLIERS",
    "TOKENS_PER_COST_UNIT",
    "DrrScheduler",
    "DrrSnapshot",
    "estimate_input_tokens",
    "jain_index",
    "job_cost",
    "quantum_for_plan",
    "stable_offset",
]

#: Default DRR quantum per round, in cost units (5 ≈ 5,000 estimated input tokens per round).
DEFAULT_QUANTUM = 5.0

#: Quantum multiplier per plan name; plans not listed get ×1. The SQL function
#: ``pgqueue.plan_quantum`` (revision 0002) holds the same table.
PLAN_QUANTUM_MULTIPLIERS: Mapping[str, float] = {"pro": 3.0}

#: The plan of a tenant registered without one (the column's default, revision 0001).
DEFAULT_PLAN = "free"

#: Every plan pgqueue knows: the default (×1) and those with a multiplier. ``pgqueue tenants
#: set --plan`` accepts only these (:func:`pgqueue.validation.check_plan`): any other name
#: would silently mean ×1.
KNOWN_PLANS: tuple[str, ...] = (DEFAULT_PLAN, *PLAN_QUANTUM_MULTIPLIERS)

#: Input tokens per cost unit.
TOKENS_PER_COST_UNIT = 1000

#: Anthropic's rule of thumb for English text: about 4 characters per token.
CHARS_PER_TOKEN = 4


def quantum_for_plan(
    plan: str, base: float = DEFAULT_QUANTUM, override: float | None = None
) -> float:
    """A tenant's DRR quantum in cost units per round.

    ``override`` (a per-tenant setting) wins when given; else ``base`` × the plan's multiplier
    from :data:`PLAN_QUANTUM_MULTIPLIERS` (``"pro"`` → ×3, matched case-insensitively; any other
    plan, ``"free"`` included, → ×1).

    Raises ``ValueError`` if ``base`` or ``override`` is not finite and > 0.
    """
    if override is not None:
        if not (math.isfinite(override) and override > 0):
            raise ValueError(f"quantum override must be finite and > 0, got {override!r}")
        return float(override)
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base quantum must be finite and > 0, got {base!r}")
    return base * PLAN_QUANTUM_MULTIPLIERS.get(plan.strip().lower(), 1.0)


def job_cost(estimated_input_tokens: int) -> float:
    """Cost of a job in cost units: ``max(1, estimated_input_tokens / 1000)``.

    The floor of 1 keeps tiny jobs from being free (every request also spends one unit of the
    provider's requests-per-minute budget). Raises ``ValueError`` for a negative token count.
    """
    if estimated_input_tokens < 0:
        raise ValueError(f"estimated_input_tokens must be >= 0, got {estimated_input_tokens!r}")
    return max(1.0, estimated_input_tokens / TOKENS_PER_COST_UNIT)


def _text_chars(content: Any) -> int:
    """Characters of text in a Messages API content value: a string, or a list of blocks."""
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        if isinstance(block, str):
            total += len(block)
        elif isinstance(block, Mapping):
            text = block.get("text")
            if isinstance(text, str):
                total += len(text)
            # A tool_result block nests its own content (a string or text blocks).
            if block.get("type") == "tool_result":
                total += _text_chars(block.get("content"))
    return total


def estimate_input_tokens(payload: Mapping[str, Any]) -> int:
    """Estimated input tokens of a Messages API request, before sending it.

    ``ceil(characters / 4)`` — Anthropic's rule of thumb of about 4 characters per token — where
    characters (Unicode code points, as SQL ``char_length``) are counted over ``system`` (a
    string or a list of text blocks) and every message's ``content`` (a string, or blocks whose
    ``"text"`` counts, including text nested in ``tool_result`` blocks). Images, documents, tool
    definitions and tool inputs are not counted: this is an estimate, corrected by the usage the
    provider reports.

    Never raises for unexpected shapes: parts it does not recognise count as zero characters.
    """
    chars = _text_chars(payload.get("system"))
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, Mapping):
                chars += _text_chars(message.get("content"))
    return -(-chars // CHARS_PER_TOKEN)


def stable_offset(tenant_id: str) -> int:
    """A tenant's refill-order offset in ``[0, 2**32)``: the first 4 bytes, big-endian, of the
    SHA-256 of its UTF-8 id.

    SHA-256 rather than BLAKE2 because Postgres (≥ 11) has ``sha256()`` built in, so SQL can
    compute the same number without an extension::

        ('x' || left(encode(sha256(convert_to(tenant_id, 'UTF8')), 'hex'), 8))::bit(32)::bigint
    """
    return int.from_bytes(hashlib.sha256(tenant_id.encode("utf-8")).digest()[:4], "big")


def jain_index(xs: Sequence[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n · Σx²)`` (R. Jain, D. Chiu, W. Hawe, "A Quantitative
    Measure of Fairness and Discrimination for Resource Allocation in Shared Computer Systems",
    DEC-TR-301, 1984).

    1.0 when all ``xs`` are equal, ``1/n`` when one gets everything. An empty sequence or all
    zeros is 1.0 by convention: nobody received more than anybody else.

    Raises ``ValueError`` for a negative or non-finite value.
    """
    for x in xs:
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"jain_index needs finite values >= 0, got {x!r}")
    square_sum = math.fsum(x * x for x in xs)
    if square_sum == 0:
        return 1.0
    total = math.fsum(xs)
    return min(1.0, total * total / (len(xs) * square_sum))


@dataclass(frozen=True, slots=True)
class DrrSnapshot:
    """The scheduler's state at one moment.

    ``round_order``: backlogged tenants in the order they will be visited, starting with the one
    whose turn is in progress or next (newly active tenants at the tail, by offset).
    ``current``: the tenant whose turn is in progress, if any. ``deficits``: cost units of credit
    per backlogged tenant. ``backlog``: queued job ids per tenant, FIFO. ``queued_cost``: cost
    units queued per tenant.
    """

    round_order: tuple[str, ...]
    current: str | None
    deficits: Mapping[str, float]
    backlog: Mapping[str, tuple[int, ...]]
    queued_cost: Mapping[str, float]


def _check_positive(value: float, what: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be finite and > 0, got {value!r}")
    return value


class DrrScheduler:
    """Deficit Round Robin over tenants, one job per :meth:`next` call.

    Semantics (Shreedhar & Varghese 1995, with tenants as flows and jobs as packets):

    - Backlogged tenants form a round-robin *active list*. A tenant with an empty queue is not
      in it.
    - When a tenant reaches the head of the round, its turn begins: ``deficit += quantum``
      (``quantum_of(tenant)``, in cost units, read at every turn so plan changes apply).
    - During its turn, each :meth:`next` serves its FIFO head while ``head cost ≤ deficit``,
      ``deficit -= cost``. Consecutive calls continue the same turn (the *current* tenant).
    - When the head costs more than the deficit, the turn ends: the tenant moves to the tail of
      the round *keeping* its deficit, so a job costlier than the quantum is served after
      ``ceil(cost / quantum)`` turns at most — never stuck.
    - When a tenant's queue empties, its deficit resets to 0 and it leaves the round: idle
      tenants bank no credit. When it has work again, it joins at the tail as a new tenant.

    Staggered refill order. Tenants that become active "at once" — between two dispatch
    decisions, i.e. all those enqueued since the last :meth:`next` call — join the tail of the
    round sorted by ``(offset_of(tenant), tenant)`` instead of by insertion order, where
    ``offset_of`` defaults to :func:`stable_offset` (a stable hash). After a burst of new
    tenants, their first refills are spread across the round in an order unrelated to who
    enqueued first or to how ids sort, and the order is the same in every process and in SQL
    (a fold, ``pgqueue.stamp``, sees the newcomers as a set, not a sequence). Refills are not
    a time event here: a tenant is credited exactly when its turn comes, and a claim happens
    only when the provider's limiter has room, so refills cannot produce a microburst.

    Bounds (tested): two backlogged tenants with equal quanta never differ in served cost by
    more than ``quantum + max job cost`` at any prefix of the dispatch sequence; a new tenant
    waits at most one round: one turn of each tenant already in it, and a turn serves at most
    that tenant's quantum plus its carried deficit (always less than its head job's cost).

    ``quantum_of`` must return finite values > 0 (else ``ValueError`` from :meth:`next`).
    """

    def __init__(
        self,
        quantum_of: Callable[[str], float],
        offset_of: Callable[[str], int] | None = None,
    ) -> None:
        self._quantum_of = quantum_of
        self._offset_of: Callable[[str], int] = (
            offset_of if offset_of is not None else stable_offset
        )
        self._queues: dict[str, deque[tuple[int, float]]] = {}
        self._deficit: dict[str, float] = {}
        self._active: deque[str] = deque()  # round order; head is current or next
        self._pending: set[str] = set()  # newly backlogged since the last next()
        self._current: str | None = None

    def enqueue(self, tenant_id: str, job_id: int, cost: float) -> None:
        """Append job ``job_id`` of ``cost`` cost units to the tail of ``tenant_id``'s FIFO.

        A tenant that was not backlogged becomes active (see staggered refill order above).
        Job ids are not checked for uniqueness. Raises ``ValueError`` if ``cost`` is not finite
        and > 0.
        """
        _check_positive(cost, "cost")
        queue = self._queues.get(tenant_id)
        if queue is None:
            queue = self._queues[tenant_id] = deque()
            self._deficit[tenant_id] = 0.0
            self._pending.add(tenant_id)
        queue.append((job_id, float(cost)))

    def _pending_in_order(self) -> list[str]:
        return sorted(self._pending, key=lambda tenant: (self._offset_of(tenant), tenant))

    def next(self) -> tuple[str, int, float] | None:
        """Dispatch one job: ``(tenant_id, job_id, cost)``, or ``None`` when nothing is queued.

        Raises ``ValueError`` if ``quantum_of`` returns a value that is not finite and > 0.
        """
        if self._pending:
            self._active.extend(self._pending_in_order())
            self._pending.clear()
        while self._active:
            tenant = self._active[0]
            if self._current != tenant:  # its turn begins: one quantum of credit
                quantum = _check_positive(self._quantum_of(tenant), f"quantum of tenant {tenant!r}")
                self._current = tenant
                self._deficit[tenant] += quantum
            queue = self._queues[tenant]
            job_id, cost = queue[0]
            if cost <= self._deficit[tenant]:
                queue.popleft()
                self._deficit[tenant] -= cost
                if not queue:  # idle tenants bank no credit
                    del self._queues[tenant]
                    del self._deficit[tenant]
                    self._active.popleft()
                    self._current = None
                return tenant, job_id, cost
            # Head costs more than the credit left: the turn ends, the deficit carries over.
            self._active.rotate(-1)
            self._current = None
        return None

    def deficit(self, tenant_id: str) -> float:
        """``tenant_id``'s credit in cost units; 0.0 for a tenant with nothing queued."""
        return self._deficit.get(tenant_id, 0.0)

    def active_tenants(self) -> list[str]:
        """Backlogged tenants in round order: the current (or next) one first, then the order in
        which turns will come, newly active tenants last by offset. Does not change state."""
        return [*self._active, *self._pending_in_order()]

    def snapshot(self) -> DrrSnapshot:
        """A copy of the state, for assertions, debugging and comparison with SQL."""
        order = tuple(self.active_tenants())
        return DrrSnapshot(
            round_order=order,
            current=self._current,
            deficits={tenant: self._deficit[tenant] for tenant in order},
            backlog={tenant: tuple(job for job, _ in self._queues[tenant]) for tenant in order},
            queued_cost={
                tenant: math.fsum(cost for _, cost in self._queues[tenant]) for tenant in order
            },
        )

    def preview(self, limit: int) -> list[tuple[str, int, float]]:
        """The next ``limit`` dispatches if nothing else were enqueued (what
        ``pgqueue.claim_order`` shows for one lane and tier), without changing this scheduler.

        Raises ``ValueError`` if ``limit`` is negative.
        """
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit!r}")
        probe = copy.deepcopy(self)
        out: list[tuple[str, int, float]] = []
        while len(out) < limit and (item := probe.next()) is not None:
            out.append(item)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> DrrScheduler:
        clone = DrrScheduler(self._quantum_of, self._offset_of)
        clone._queues = {tenant: deque(queue) for tenant, queue in self._queues.items()}
        clone._deficit = dict(self._deficit)
        clone._active = deque(self._active)
        clone._pending = set(self._pending)
        clone._current = self._current
        return clone

    def __len__(self) -> int:
        """Number of queued jobs, all tenants together."""
        return sum(len(queue) for queue in self._queues.values())

    def drain(self) -> Iterator[tuple[str, int, float]]:
        """Dispatch until nothing is queued, yielding each ``(tenant_id, job_id, cost)``."""
        while (item := self.next()) is not None:
            yield item
