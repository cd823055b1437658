"""The demo's figures from jobs' times: Jain's index over backlogged tenants, the waits, and
how they are shown. Pure: synthetic schedules with known answers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pgqueue.demo_compare import provider_limits
from pgqueue.demo_figures import (
    JobTimes,
    arm_figures,
    figures_json,
    headline,
    jain_index,
    render,
    terminal_chart,
    write_chart,
)
from pgqueue.models import Origin
from pgqueue.trace import PlannedJob


def test_jain_index():
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([]) is None
    assert jain_index([0.0, 0.0]) is None  # nothing served: no data, not 1.0


def _schedule(shares: dict[str, int], seconds: int = 20) -> list[JobTimes]:
    """Three tenants, each with a job waiting at every instant (backlogged throughout); per
    second the scheduler starts ``shares[t]`` jobs of cost 1 for tenant t."""
    jobs: list[JobTimes] = []
    for second in range(seconds):
        for tenant, per_second in shares.items():
            for k in range(per_second):
                start = 100.0 + second + k / (per_second + 1)
                jobs.append(
                    JobTimes(tenant, "standard", "standard", 1.0, "succeeded", 99.0, start, start)
                )
    for tenant in shares:  # still waiting at the end: backlogged to the last window
        jobs.append(JobTimes(tenant, "standard", "standard", 1.0, "queued", 99.0, None, None))
    return jobs


def test_jain_separates_a_fifo_share_from_an_equal_one():
    """FIFO serves backlogged tenants in proportion to what they send (t00 8 : 2 : 2); DRR
    serves them equally (4 : 4 : 4); same throughput."""
    fifo = arm_figures("plain FIFO", _schedule({"t00": 8, "t01": 2, "t02": 2}), end=120.0)
    fair = arm_figures("pgqueue", _schedule({"t00": 4, "t01": 4, "t02": 4}), end=120.0)
    assert fair.jain == pytest.approx(1.0, abs=0.02)
    assert fifo.jain == pytest.approx(144 / (3 * 72), abs=0.03)  # (8+2+2)² / (3·(64+4+4))
    assert fifo.jain_windows > 10 and fair.jain_windows > 10
    assert fifo.succeeded == fair.succeeded == 240


def test_windows_below_one_drr_round_are_left_out():
    """A tier that served its backlogged tenants less than a quantum each in a window (one
    tenant's turn) gives no index for it, not a low one."""
    trickle = _schedule({"t00": 1, "t01": 0, "t02": 0})
    assert arm_figures("pgqueue", trickle, end=120.0).jain is None


def test_waits_split_small_runaway_batch_and_mark_lower_bounds():
    jobs = [
        JobTimes("t00", "standard", "standard", 1, "succeeded", 0.0, 5.0, 6.0),
        JobTimes("t01", "standard", "standard", 1, "succeeded", 0.0, 1.0, 2.0),
        JobTimes("t02", "critical", "critical", 1, "succeeded", 0.0, 0.5, 1.5),
        JobTimes("t03", "batch", "batch", 1, "queued", 0.0, None, None),
    ]
    figures = arm_figures("pgqueue", jobs, end=30.0)
    assert figures.small_wait_p99 == 1.0 and not figures.small_wait_censored
    assert figures.runaway_wait_p99 == 5.0
    assert figures.batch_wait_p99 == 30.0 and figures.batch_wait_censored
    assert figures.critical_p99 == 1.5 and not figures.critical_censored
    assert figures.unfinished == 1
    assert figures.wait_p99_by_tenant == {"t00": 5.0, "t01": 1.0, "t02": 0.5}


def test_the_report_says_what_to_look_at():
    fifo = arm_figures("plain FIFO", _schedule({"t00": 8, "t01": 2, "t02": 2}), end=120.0)
    fair = arm_figures("pgqueue", _schedule({"t00": 4, "t01": 4, "t02": 4}), end=120.0)
    fair.http_429 = 3
    out = io.StringIO()
    console = Console(file=out, width=200)
    render(fifo, fair, console)
    terminal_chart(fifo, fair, console)
    text = out.getvalue()
    assert headline(fifo, fair) in text
    assert "3 × 429" in text and "retry-after × 1.2" in text
    assert "Jain's index" in text and "critical p99 (SLO 2 s)" in text
    document = figures_json(fifo, fair)
    assert document["pgqueue"]["http_429"] == 3
    assert document["fifo"]["jain_backlogged"] == fifo.jain


def test_the_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    fifo = arm_figures("plain FIFO", _schedule({"t00": 8, "t01": 2, "t02": 2}), end=120.0)
    fair = arm_figures("pgqueue", _schedule({"t00": 4, "t01": 4, "t02": 4}), end=120.0)
    path = tmp_path / "demo.png"
    write_chart(fifo, fair, path, "caption")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chart_legends_cover_no_bar(tmp_path, monkeypatch):
    """Found by a tester: the waits panel's legend sat over the last tenants' bars when every
    tenant waited about as long under FIFO (the usual demo: 8.4 s for all eight)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    overlaps: list[str] = []

    def keep(figure: Figure, *args: object, **kwargs: object) -> None:
        save(figure, *args, **kwargs)  # drawn: the extents are the saved ones
        renderer = figure.canvas.get_renderer()
        for axes in figure.axes[:2]:
            legend = axes.get_legend().get_window_extent(renderer)
            assert axes.patches
            overlaps.extend(
                axes.get_title()
                for bar in axes.patches
                if legend.overlaps(bar.get_window_extent(renderer))
            )
        checked.append(figure)

    save = Figure.savefig
    checked: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", keep)
    fifo = arm_figures("plain FIFO", _schedule({f"t0{i}": 3 for i in range(8)}), end=120.0)
    fair = arm_figures("pgqueue", _schedule({f"t0{i}": 3 for i in range(8)}), end=120.0)
    fifo.wait_p99_by_tenant.update({f"t0{i}": 8.4 for i in range(8)})
    fair.wait_p99_by_tenant.update({f"t0{i}": 1.0 + i / 3 for i in range(8)})
    fifo.critical_p99, fair.critical_p99 = 9.4, 1.1
    write_chart(fifo, fair, tmp_path / "demo.png", "caption")
    assert len(checked) == 1
    assert overlaps == []


def test_provider_limits_serve_one_over_load_of_the_binding_demand():
    payload = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    plan = [
        PlannedJob(float(i), "t00", Origin.SCHEDULED, 60.0, payload, 1000, 800) for i in range(61)
    ]  # 61 requests, 61k input and 48.8k output tokens in 60 s: output binds (6.1× 8k)
    rpm, itpm, otpm = provider_limits(plan, load=2.0)
    assert otpm == pytest.approx(48_800 / 2, rel=0.01)
    assert itpm == pytest.approx(40_000 * otpm / 8_000, rel=0.01)
    assert rpm >= 1


def test_a_chart_without_jain_windows_draws_quietly(tmp_path, caplog):
    """Found by a tester (issue 29): `pgqueue demo --requests 150` printed matplotlib's "No
    artists with labels found to put in legend" when no 3 s window had two tenants backlogged
    (no Jain series in either arm). The panel says "no data" instead; nothing is warned."""
    import logging
    import warnings

    pytest.importorskip("matplotlib")
    fifo = arm_figures("plain FIFO", _schedule({"t00": 8}), end=120.0)
    fair = arm_figures("pgqueue", _schedule({"t00": 4}), end=120.0)
    assert fifo.jain_series == [] and fair.jain_series == []
    path = tmp_path / "demo.png"
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        write_chart(fifo, fair, path, "caption")
    assert [r for r in caplog.records if r.name.startswith("matplotlib")] == []
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratios_within_ten_percent_read_about_the_same():
    """Found by a tester: 4.0 s against 4.1 s read "1.0× longer"."""
    from pgqueue.demo_figures import _ratio

    assert _ratio(4.0, 4.1) == "about the same"
    assert _ratio(4.4, 4.0) == "about the same"
    assert _ratio(10.0, 2.0) == "5.0× shorter"
    assert _ratio(2.0, 3.0) == "1.5× longer"
    assert _ratio(0.0, 3.0) == ""  # no ratio to a zero wait (it divided by zero)


def test_the_headline_counts_jobs_in_the_order_it_names_the_queues():
    """Found by a tester: it named FIFO first and listed pgqueue's count first."""
    fifo = arm_figures("plain FIFO", _schedule({"t00": 8, "t01": 2}), end=120.0)
    fair = arm_figures("pgqueue", _schedule({"t00": 4, "t01": 4}), end=120.0)
    fifo.succeeded, fair.succeeded = 11, 22
    text = headline(fifo, fair)
    assert text.index("plain FIFO") < text.index("pgqueue")
    assert text.endswith("(11 and 22 jobs done).")
