"""The figures of ``pgqueue demo`` from its jobs' times, and how they are shown.

Pure: every figure is a function of the jobs' rows (times in seconds) of one arm of the demo,
the plain FIFO queue or pgqueue; no database, no clock. :func:`render` prints the side-by-side
table, :func:`write_chart` draws the PNG (matplotlib, the ``plot`` extra) and
:func:`terminal_chart` the bars a terminal shows when matplotlib is absent.

Definitions (one each):

* wait: from enqueue to the start of the job's last request (a 429 puts a job back in the
  queue, and its wait goes on); a job never started by the end counts its wait until then,
  so a p99 over it is a lower bound (shown with "≥"). The small tenants' and the runaway's
  waits are over their critical and standard jobs (those with an SLA); the batch tier's
  (no SLA) is shown apart, since yielding to the others is what pgqueue makes it do;
* latency: from enqueue to finish; the critical tier's p99 is set against its 2 s SLO;
* Jain's index, (Σx)² / (n·Σx²) (Jain, Chiu & Hawe, 1984), over the tenants backlogged in the
  tier they queued in through a whole window of ``window_seconds`` (at every instant of it one
  of their jobs was waiting), x = the cost served to each (cost units of the jobs started in
  the window; all tenants have the same weight here); the mean over the windows, sliding by
  ``step_seconds``, that had two or more such tenants in a tier and served them at least one
  DRR round (``quantum``, 5 cost units, each). 1.0 is an equal share; 1/n is one tenant served
  alone. A window holding less than a round reads unfair even for DRR (one tenant's turn), as
  when the batch tier gets a trickle of capacity under load: such windows are left out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

#: The critical tier's p99 SLO, seconds (the default of the GUC pgqueue.slo_p99_critical_seconds).
CRITICAL_SLO_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class JobTimes:
    """One job of a demo arm: its tenant in the trace (the FIFO arm enqueues every job under
    one tenant; this is the tenant it stands for), the tier its origin and SLA give it (the
    same in both arms), the tier it queued in (``priority``: always standard in the FIFO arm,
    batch for a demoted tenant's jobs in pgqueue's), its cost units, its state, its times
    (epoch seconds; None when it never got there) and how often a 429/529 put it back."""

    tenant_id: str
    tier: str
    queue_tier: str
    cost: float
    state: str
    enqueued: float
    started: float | None
    finished: float | None
    throttle_retries: int = 0


@dataclass(slots=True)
class ArmFigures:
    """What one arm did (see the module's definitions). Seconds, except ``jain`` (0..1) and
    counts; a ``*_censored`` flag says the figure is a lower bound (jobs still waiting)."""

    name: str
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    unfinished: int = 0
    span_seconds: float = 0.0
    small_wait_p99: float | None = None
    small_wait_censored: bool = False
    runaway_wait_p99: float | None = None
    batch_wait_p99: float | None = None
    batch_wait_censored: bool = False
    critical_p99: float | None = None
    critical_censored: bool = False
    jain: float | None = None
    jain_windows: int = 0
    jain_series: list[tuple[float, float]] = field(default_factory=list)
    wait_p99_by_tenant: dict[str, float] = field(default_factory=dict)
    http_429: int = 0
    http_529: int = 0
    requeued_jobs: int = 0

    @property
    def jobs_per_second(self) -> float | None:
        """Jobs succeeded per second of the run (first enqueue to last finish)."""
        return self.succeeded / self.span_seconds if self.span_seconds > 0 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def jain_index(shares: Sequence[float]) -> float | None:
    """Jain's index (Σx)² / (n·Σx²) of ``shares``; None for no tenant or nothing served."""
    total_sq = sum(x * x for x in shares)
    if not shares or total_sq == 0:
        return None
    return sum(shares) ** 2 / (len(shares) * total_sq)


def _covers(intervals: list[tuple[float, float]], a: float, b: float) -> bool:
    """Whether the union of the half-open ``intervals`` covers ``[a, b)``."""
    reached = a
    for start, end in sorted(intervals):
        if start > reached:
            break
        reached = max(reached, end)
    return reached >= b


def _jain_windows(
    jobs: Sequence[JobTimes],
    start: float,
    end: float,
    *,
    window_seconds: float,
    step: float,
    quantum: float,
) -> list[tuple[float, float]]:
    """(window start, seconds from ``start``; mean index over its tiers) per window, sliding
    by ``step``, in which a tier had two or more tenants backlogged throughout and served them
    at least a DRR round (``quantum`` cost units each)."""
    waiting: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for job in jobs:
        waiting[(job.queue_tier, job.tenant_id)].append(
            (job.enqueued, job.started if job.started is not None else end)
        )
    series: list[tuple[float, float]] = []
    a = start
    while a + window_seconds <= end:
        b = a + window_seconds
        backlogged: dict[str, list[str]] = defaultdict(list)
        for (tier, tenant), intervals in waiting.items():
            if _covers(intervals, a, b):
                backlogged[tier].append(tenant)
        served: dict[tuple[str, str], float] = defaultdict(float)
        for job in jobs:
            if job.started is not None and a <= job.started < b:
                served[(job.queue_tier, job.tenant_id)] += job.cost
        indexes = [
            index
            for tier, tenants in backlogged.items()
            if len(tenants) >= 2
            and sum(served[(tier, t)] for t in tenants) >= quantum * len(tenants)
            and (index := jain_index([served[(tier, t)] for t in tenants])) is not None
        ]
        if indexes:
            series.append((a - start, sum(indexes) / len(indexes)))
        a += step
    return series


def arm_figures(
    name: str,
    jobs: Sequence[JobTimes],
    end: float,
    *,
    runaway: str = "t00",
    window_seconds: float = 3.0,
    step_seconds: float = 0.5,
    quantum: float = 5.0,
) -> ArmFigures:
    """The figures of one arm from its jobs; ``end`` is when the run stopped (epoch seconds)."""
    figures = ArmFigures(name, jobs=len(jobs))
    if not jobs:
        return figures
    figures.succeeded = sum(j.state == "succeeded" for j in jobs)
    figures.failed = sum(j.state == "failed" for j in jobs)
    figures.unfinished = sum(j.finished is None for j in jobs)
    figures.requeued_jobs = sum(j.throttle_retries > 0 for j in jobs)
    start = min(j.enqueued for j in jobs)
    last = max((j.finished for j in jobs if j.finished is not None), default=end)
    figures.span_seconds = last - start

    def wait(job: JobTimes) -> float:
        return (job.started if job.started is not None else end) - job.enqueued

    timely = [j for j in jobs if j.tier != "batch"]
    small = [j for j in timely if j.tenant_id != runaway]
    figures.small_wait_p99 = percentile([wait(j) for j in small], 0.99)
    figures.small_wait_censored = any(j.started is None for j in small)
    figures.runaway_wait_p99 = percentile([wait(j) for j in timely if j.tenant_id == runaway], 0.99)
    batch = [j for j in jobs if j.tier == "batch"]
    figures.batch_wait_p99 = percentile([wait(j) for j in batch], 0.99)
    figures.batch_wait_censored = any(j.started is None for j in batch)
    by_tenant: dict[str, list[float]] = defaultdict(list)
    for job in timely:
        by_tenant[job.tenant_id].append(wait(job))
    figures.wait_p99_by_tenant = {
        t: p for t, waits in sorted(by_tenant.items()) if (p := percentile(waits, 0.99)) is not None
    }
    critical = [j for j in jobs if j.tier == "critical"]
    figures.critical_p99 = percentile(
        [(j.finished if j.finished is not None else end) - j.enqueued for j in critical], 0.99
    )
    figures.critical_censored = any(j.finished is None for j in critical)
    figures.jain_series = _jain_windows(
        jobs, start, end, window_seconds=window_seconds, step=step_seconds, quantum=quantum
    )
    figures.jain_windows = len(figures.jain_series)
    if figures.jain_series:
        figures.jain = sum(j for _t, j in figures.jain_series) / len(figures.jain_series)
    return figures


# ------------------------------------------------------------------------------- showing


def _s(value: float | None, censored: bool = False) -> str:
    return "-" if value is None else f"{'≥ ' if censored else ''}{value:.2f} s"


def _ratio(fifo: float | None, fair: float | None) -> str:
    """pgqueue's figure against FIFO's; within 10 % "about the same" (found by a tester:
    "1.0× longer")."""
    if fifo is None or fair is None or fair <= 0 or fifo <= 0:
        return ""
    if max(fifo, fair) <= 1.1 * min(fifo, fair):
        return "about the same"
    return f"{fifo / fair:.1f}× shorter" if fifo > fair else f"{fair / fifo:.1f}× longer"


def headline(fifo: ArmFigures, fair: ArmFigures) -> str:
    """The one sentence that says what to look at, with this run's numbers."""
    return (
        f"Look at the small tenants' p99 wait: {_s(fifo.small_wait_p99, fifo.small_wait_censored)}"
        f" behind the runaway tenant in the plain FIFO queue, "
        f"{_s(fair.small_wait_p99, fair.small_wait_censored)} with pgqueue, from the same "
        f"arrivals and the same provider limits ({fifo.succeeded} and {fair.succeeded} jobs "
        "done)."
    )


def render(fifo: ArmFigures, fair: ArmFigures, console: Console) -> None:
    """Print the side-by-side table, the 429 line and the headline."""
    table = Table(title="Same arrivals, same provider limits: a plain FIFO queue vs pgqueue")
    for column in ("", "plain FIFO", "pgqueue", ""):
        table.add_column(column, justify="left" if not column else "right")
    rows: list[tuple[str, str, str, str]] = [
        (
            "small tenants' wait p99 (t01-t07)",
            _s(fifo.small_wait_p99, fifo.small_wait_censored),
            _s(fair.small_wait_p99, fair.small_wait_censored),
            _ratio(fifo.small_wait_p99, fair.small_wait_p99),
        ),
        (
            "runaway's wait p99 (t00)",
            _s(fifo.runaway_wait_p99),
            _s(fair.runaway_wait_p99),
            _runaway_note(fair),
        ),
        (
            "batch tier's wait p99 (no SLA)",
            _s(fifo.batch_wait_p99, fifo.batch_wait_censored),
            _s(fair.batch_wait_p99, fair.batch_wait_censored),
            "batch yields, by design",
        ),
        (
            f"critical p99 (SLO {CRITICAL_SLO_SECONDS:g} s)",
            _s(fifo.critical_p99, fifo.critical_censored),
            _s(fair.critical_p99, fair.critical_censored),
            _slo(fair.critical_p99, fair.critical_censored),
        ),
        (
            "Jain's index, backlogged tenants",
            _jain(fifo),
            _jain(fair),
            "1.0 = equal shares",
        ),
        (
            "jobs done / failed / left",
            f"{fifo.succeeded} / {fifo.failed} / {fifo.unfinished}",
            f"{fair.succeeded} / {fair.failed} / {fair.unfinished}",
            "",
        ),
        ("jobs per second", _rate(fifo), _rate(fair), "fairness costs no throughput"),
        (
            "429 / 529 met",
            f"{fifo.http_429} / {fifo.http_529}",
            f"{fair.http_429} / {fair.http_529}",
            "",
        ),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(_absorbed(fair), markup=False, highlight=False)
    console.print(headline(fifo, fair), markup=False, highlight=False)


def _runaway_note(fair: ArmFigures) -> str:
    """Where the runaway's backlog waits: in its own jobs with an SLA (DRR serves the others
    first), or, as in the bundled trace where 60 % of its jobs are batch, in the batch tier."""
    small, runaway = fair.small_wait_p99, fair.runaway_wait_p99
    if small is not None and runaway is not None and runaway > 1.5 * small:
        return "it pays for its own backlog"
    return "its backlog waits in batch"


def _slo(p99: float | None, censored: bool) -> str:
    if p99 is None:
        return ""
    return "pgqueue meets it" if p99 <= CRITICAL_SLO_SECONDS and not censored else "missed"


def _jain(arm: ArmFigures) -> str:
    return "-" if arm.jain is None else f"{arm.jain:.3f} ({arm.jain_windows} windows)"


def _rate(arm: ArmFigures) -> str:
    rate = arm.jobs_per_second
    return "-" if rate is None else f"{rate:.1f}"


def _absorbed(fair: ArmFigures) -> str:
    met = fair.http_429 + fair.http_529
    if met == 0:
        return (
            "429s: none met. The shared limiter sends a request only when the provider's "
            "buckets (kept in Postgres, corrected from its anthropic-ratelimit-* headers) have "
            "room for it, so the backlog waits in the queue, not in 429s."
        )
    return (
        f"429s: {fair.http_429} × 429 and {fair.http_529} × 529 met by pgqueue; each put its job "
        f"back at retry-after × 1.2 ± 20 % without using an attempt ({fair.requeued_jobs} jobs "
        f"requeued, {fair.failed} failed) and closed the model to every worker until the reset."
    )


def terminal_chart(fifo: ArmFigures, fair: ArmFigures, console: Console, width: int = 40) -> None:
    """Bars of the three figures, for a terminal without matplotlib."""
    pairs = [
        ("small tenants' wait p99, s", fifo.small_wait_p99, fair.small_wait_p99),
        ("critical p99, s", fifo.critical_p99, fair.critical_p99),
        ("Jain's index", fifo.jain, fair.jain),
    ]
    for title, a, b in pairs:
        top = max(v for v in (a, b, 1e-9) if v is not None)
        console.print(title, markup=False, highlight=False)
        for label, value in (("FIFO   ", a), ("pgqueue", b)):
            bar = "█" * round(width * (value or 0.0) / top)
            shown = "-" if value is None else f"{value:.2f}"
            console.print(f"  {label} {bar} {shown}", markup=False, highlight=False)


def write_chart(fifo: ArmFigures, fair: ArmFigures, path: Path, caption: str) -> None:
    """Draw the demo's PNG: wait p99 per tenant, critical p99 against the SLO, and Jain's
    index over time, FIFO beside pgqueue.

    Raises:
        ImportError: matplotlib is not installed (the ``plot`` extra).
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grey, blue = "#9e9e9e", "#1f6fb4"
    figure, (waits, critical, jain) = plt.subplots(1, 3, figsize=(14, 4.6))
    tenants = sorted(set(fifo.wait_p99_by_tenant) | set(fair.wait_p99_by_tenant))
    xs = range(len(tenants))
    waits.bar([x - 0.2 for x in xs], [fifo.wait_p99_by_tenant.get(t, 0) for t in tenants], 0.4,
              color=grey, label="plain FIFO")  # fmt: skip
    waits.bar([x + 0.2 for x in xs], [fair.wait_p99_by_tenant.get(t, 0) for t in tenants], 0.4,
              color=blue, label="pgqueue")  # fmt: skip
    waits.set_xticks(list(xs), [t + (" (runaway)" if t == "t00" else "") for t in tenants],
                     rotation=30, fontsize=8)  # fmt: skip
    waits.set_title("Wait p99 per tenant, jobs with an SLA (s)")
    # room above the tallest bar for a one-row legend (it covered the last bars: a tester)
    waits.margins(y=0.25)
    waits.legend(loc="upper right", ncols=2)
    critical.bar(["plain FIFO", "pgqueue"], [fifo.critical_p99 or 0, fair.critical_p99 or 0],
                 color=[grey, blue])  # fmt: skip
    critical.axhline(CRITICAL_SLO_SECONDS, color="#c62828", linestyle="--", label="SLO 2 s")
    critical.set_title("Critical tier: p99 enqueue → finish (s)")
    critical.margins(y=0.25)
    critical.legend(loc="upper right")
    for arm, colour in ((fifo, grey), (fair, blue)):
        if arm.jain_series:
            times, values = zip(*arm.jain_series, strict=True)
            mean = "" if arm.jain is None else f" (mean {arm.jain:.2f})"
            jain.plot(times, values, "o-", color=colour, markersize=3, label=arm.name + mean)
    jain.set_ylim(0, 1.05)
    jain.set_xlabel("seconds into the run")
    jain.set_title("Jain's index over backlogged tenants, 3 s windows")
    if jain.get_lines():
        jain.legend()
    else:  # a short run (`demo --requests 150`): legend() of nothing warned on stderr
        jain.text(0.5, 0.5, "no data: no 3 s window had two or more\ntenants backlogged throughout",
                  ha="center", va="center", transform=jain.transAxes, color=grey)  # fmt: skip
    figure.suptitle(caption, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def figures_json(fifo: ArmFigures, fair: ArmFigures) -> dict[str, Any]:
    """Both arms' figures as plain JSON (the per-window series left out)."""

    def one(arm: ArmFigures) -> dict[str, Any]:
        return {
            "jobs": arm.jobs,
            "succeeded": arm.succeeded,
            "failed": arm.failed,
            "unfinished": arm.unfinished,
            "span_seconds": arm.span_seconds,
            "jobs_per_second": arm.jobs_per_second,
            "small_tenants_wait_p99_seconds": arm.small_wait_p99,
            "small_tenants_wait_p99_is_lower_bound": arm.small_wait_censored,
            "runaway_wait_p99_seconds": arm.runaway_wait_p99,
            "batch_wait_p99_seconds": arm.batch_wait_p99,
            "batch_wait_p99_is_lower_bound": arm.batch_wait_censored,
            "wait_p99_seconds_by_tenant": arm.wait_p99_by_tenant,
            "critical_p99_seconds": arm.critical_p99,
            "critical_p99_is_lower_bound": arm.critical_censored,
            "critical_slo_seconds": CRITICAL_SLO_SECONDS,
            "jain_backlogged": arm.jain,
            "jain_windows": arm.jain_windows,
            "http_429": arm.http_429,
            "http_529": arm.http_529,
            "requeued_jobs": arm.requeued_jobs,
        }

    return {"fifo": one(fifo), "pgqueue": one(fair), "headline": headline(fifo, fair)}
