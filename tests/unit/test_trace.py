"""Unit tests for pgqueue.trace: loading the bundled Azure trace and planning replays."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pgqueue.errors import InvalidArgument
from pgqueue.models import Origin
from pgqueue.trace import (
    CHARS_PER_TOKEN,
    MAX_TRACE_TOKENS,
    SCHEDULED_SLAS_SECONDS,
    PlannedJob,
    TraceRequest,
    load_trace,
    plan_replay,
    summarize_plan,
)

BUNDLED_ROWS = 19_366


@pytest.fixture(scope="module")
def bundled() -> list[TraceRequest]:
    return load_trace()


@pytest.fixture(scope="module")
def sample(bundled: list[TraceRequest]) -> list[TraceRequest]:
    return bundled[:2000]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text, encoding="utf-8")
    return path


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


# ---------------------------------------------------------------------------- load_trace
def test_bundled_trace_loads_sorted_with_positive_tokens(bundled: list[TraceRequest]) -> None:
    assert len(bundled) == BUNDLED_ROWS
    assert bundled[0].offset_seconds == 0.0
    offsets = [r.offset_seconds for r in bundled]
    assert offsets == sorted(offsets)
    assert all(r.input_tokens > 0 and r.output_tokens > 0 for r in bundled)
    # about one hour of traffic (18:15:46 → 19:14:08)
    assert 3400 < bundled[-1].offset_seconds < 3600
    first = bundled[1]
    assert first.input_tokens == 396 and first.output_tokens == 109
    assert first.offset_seconds == pytest.approx(50.995169 - 46.68059, abs=1e-6)


def test_bundled_file_is_inside_the_package() -> None:
    import pgqueue.trace

    data = Path(pgqueue.trace.__file__).parent / "data"
    assert (data / "azure_llm_conv_2023.csv").stat().st_size < 1_000_000
    assert "CC-BY 4.0" in (data / "README.md").read_text(encoding="utf-8")


def test_explicit_path_matches_bundled(tmp_path: Path, bundled: list[TraceRequest]) -> None:
    path = _write(
        tmp_path,
        HEADER + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n",
    )
    assert load_trace(path) == bundled[:2]
    assert load_trace(str(path)) == bundled[:2]


def test_limit(bundled: list[TraceRequest]) -> None:
    assert load_trace(limit=10) == bundled[:10]
    assert load_trace(limit=0) == []


def test_start_offset_skips_and_rebases(bundled: list[TraceRequest]) -> None:
    start = 600.0
    later = load_trace(start_offset_seconds=start, limit=50)
    skipped = [r for r in bundled if r.offset_seconds >= start][:50]
    assert len(later) == 50
    assert later[0].offset_seconds == 0.0
    base = skipped[0].offset_seconds
    for got, want in zip(later, skipped, strict=True):
        assert got.input_tokens == want.input_tokens
        assert got.output_tokens == want.output_tokens
        assert got.offset_seconds == pytest.approx(want.offset_seconds - base, abs=1e-6)
    assert load_trace(start_offset_seconds=1e9) == []


def test_unsorted_file_is_sorted_by_arrival(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        HEADER
        + "2023-11-16 18:00:10.5,30,3\n"
        + "2023-11-16 18:00:00,10,1\n"
        + "\n"
        + "2023-11-16 18:00:05.25,20,2\n",
    )
    trace = load_trace(path)
    assert [r.input_tokens for r in trace] == [10, 20, 30]
    assert [r.offset_seconds for r in trace] == [0.0, 5.25, 10.5]


def test_extra_and_reordered_columns_are_accepted(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "GeneratedTokens,Extra,TIMESTAMP,ContextTokens\n7,x,2023-11-16 18:00:00,5\n",
    )
    assert load_trace(path) == [TraceRequest(0.0, 5, 7)]


def test_header_only_file_is_empty(tmp_path: Path) -> None:
    assert load_trace(_write(tmp_path, HEADER)) == []


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "line 1"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n", "GeneratedTokens"),
        (HEADER + "2023-11-16 18:00:00,5,7\nnot-a-time,5,7\n", "line 3"),
        (HEADER + "2023-11-16 18:00:00,5,7\n2023-11-16 18:00:01,-5,7\n", "line 3"),
        (HEADER + "2023-11-16 18:00:00,5,7\n2023-11-16 18:00:01,5,1.5\n", "line 3"),
        (HEADER + "2023-11-16 18:00:00,5,7\n\n2023-11-16 18:00:01,5,seven\n", "line 4"),
        (HEADER + "2023-11-16 18:00:00,5\n", "line 2"),
        (HEADER + "2023-11-16 18:00:00,5,7,9\n", "line 2"),
    ],
)
def test_bad_csv_raises_naming_the_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InvalidArgument, match=fragment) as info:
        load_trace(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": -1},
        {"start_offset_seconds": -1.0},
        {"start_offset_seconds": math.nan},
        {"start_offset_seconds": math.inf},
    ],
)
def test_load_trace_invalid_args(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        load_trace(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- plan_replay
def test_plan_is_deterministic_for_a_seed(sample: list[TraceRequest]) -> None:
    short = sample[:300]
    assert plan_replay(short, seed=7) == plan_replay(short, seed=7)
    assert plan_replay(short, seed=7) != plan_replay(short, seed=8)


def test_plan_has_one_job_per_request_in_order(sample: list[TraceRequest]) -> None:
    plan = plan_replay(sample)
    assert len(plan) == len(sample)
    assert [j.at_seconds for j in plan] == [r.offset_seconds for r in sample]


@pytest.mark.parametrize(("share", "seed"), [(0.4, 0), (0.4, 1), (0.7, 3), (0.0, 5)])
def test_runaway_share_within_5pp(sample: list[TraceRequest], share: float, seed: int) -> None:
    plan = plan_replay(sample, runaway_share=share, seed=seed)
    runaway = sum(j.tenant_id == "t00" for j in plan) / len(plan)
    assert abs(runaway - share) <= 0.05


def test_tenants_are_named_and_zipf_skewed(sample: list[TraceRequest]) -> None:
    plan = plan_replay(sample, tenants=8)
    counts = summarize_plan(plan)["tenants"]
    assert set(counts) == {f"t{k:02d}" for k in range(8)}
    others = [counts[f"t{k:02d}"]["jobs"] for k in range(1, 8)]
    assert others[0] > 2 * others[-1]  # Zipf: t01 far busier than t07
    wide = plan_replay(sample[:50], tenants=120)
    assert {j.tenant_id for j in wide} <= {f"t{k:03d}" for k in range(120)}
    single = plan_replay(sample[:50], tenants=1)
    assert {j.tenant_id for j in single} == {"t00"}


def test_origin_mix_and_slas(sample: list[TraceRequest]) -> None:
    plan = plan_replay(sample, runaway_share=0.4)
    normal = [j for j in plan if j.tenant_id != "t00"]
    runaway = [j for j in plan if j.tenant_id == "t00"]

    def share(jobs: list[PlannedJob], origin: Origin) -> float:
        return sum(j.origin is origin for j in jobs) / len(jobs)

    assert abs(share(normal, Origin.USER_ACTION) - 0.20) < 0.05
    assert abs(share(normal, Origin.SCHEDULED) - 0.50) < 0.05
    assert abs(share(normal, Origin.BATCH_JOB) - 0.30) < 0.05
    assert share(runaway, Origin.BATCH_JOB) > 0.5
    assert share(runaway, Origin.USER_ACTION) < 0.1
    for job in plan:
        if job.origin is Origin.SCHEDULED:
            assert job.sla_seconds in SCHEDULED_SLAS_SECONDS
        else:
            assert job.sla_seconds is None
    assert {j.sla_seconds for j in plan if j.origin is Origin.SCHEDULED} == set(
        SCHEDULED_SLAS_SECONDS
    )


def test_every_payload_is_valid_messages_params(sample: list[TraceRequest]) -> None:
    for job in plan_replay(sample, model="claude-test"):
        payload = job.payload
        assert set(payload) == {"model", "max_tokens", "messages"}
        assert payload["model"] == "claude-test"
        assert isinstance(payload["max_tokens"], int) and payload["max_tokens"] >= 1
        assert payload["max_tokens"] == job.output_tokens
        (message,) = payload["messages"]
        assert message["role"] == "user"
        assert isinstance(message["content"], str) and message["content"].strip()
        assert message["content"] == message["content"].rstrip()
        assert "\x00" not in message["content"]


def test_prompt_length_matches_input_tokens(sample: list[TraceRequest]) -> None:
    for request, job in zip(sample, plan_replay(sample), strict=True):
        assert job.input_tokens == request.input_tokens
        assert job.output_tokens == request.output_tokens
        length = len(job.payload["messages"][0]["content"])
        assert abs(length - CHARS_PER_TOKEN * request.input_tokens) <= 0.05 * (
            CHARS_PER_TOKEN * request.input_tokens
        )


def test_max_input_tokens_caps_prompt(sample: list[TraceRequest]) -> None:
    plan = plan_replay(sample, max_input_tokens=100)
    for request, job in zip(sample, plan, strict=True):
        assert job.input_tokens == min(request.input_tokens, 100)
    assert max(len(j.payload["messages"][0]["content"]) for j in plan) <= 400


def test_zero_token_requests_still_give_valid_payloads() -> None:
    (job,) = plan_replay([TraceRequest(0.0, 0, 0)])
    assert job.payload["max_tokens"] == 1
    assert job.payload["messages"][0]["content"]
    assert job.input_tokens == 1 and job.output_tokens == 1


def test_speedup_divides_times(sample: list[TraceRequest]) -> None:
    base = plan_replay(sample[:200], seed=3)
    fast = plan_replay(sample[:200], seed=3, speedup=60.0)
    for slow_job, fast_job in zip(base, fast, strict=True):
        assert fast_job.at_seconds == pytest.approx(slow_job.at_seconds / 60.0)
        assert (fast_job.tenant_id, fast_job.origin) == (slow_job.tenant_id, slow_job.origin)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"speedup": 0.0},
        {"speedup": -2.0},
        {"speedup": math.inf},
        {"speedup": math.nan},
        {"tenants": 0},
        {"tenants": -3},
        {"runaway_share": 1.0},
        {"runaway_share": -0.1},
        {"runaway_share": math.nan},
        {"max_input_tokens": 0},
        {"model": ""},
    ],
)
def test_plan_replay_invalid_args(sample: list[TraceRequest], kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        plan_replay(sample[:10], **kwargs)  # type: ignore[arg-type]


def test_plan_replay_rejects_bad_trace_entries() -> None:
    with pytest.raises(InvalidArgument):
        plan_replay([TraceRequest(-1.0, 5, 5)])
    with pytest.raises(InvalidArgument):
        plan_replay([TraceRequest(0.0, -5, 5)])


def test_empty_trace_gives_empty_plan() -> None:
    assert plan_replay([]) == []
    summary = summarize_plan([])
    assert summary["jobs"] == 0 and summary["tenants"] == {}


# -------------------------------------------------------------------------- summarize_plan
def test_summarize_plan_totals(sample: list[TraceRequest]) -> None:
    plan = plan_replay(sample, speedup=10.0)
    summary = summarize_plan(plan)
    assert summary["jobs"] == len(plan)
    assert sum(t["jobs"] for t in summary["tenants"].values()) == len(plan)
    assert sum(summary["origins"].values()) == len(plan)
    assert set(summary["origins"]) == {o.value for o in Origin}
    assert summary["input_tokens"] == sum(j.input_tokens for j in plan)
    assert summary["output_tokens"] == sum(t["output_tokens"] for t in summary["tenants"].values())
    assert summary["duration_seconds"] == pytest.approx(sample[-1].offset_seconds / 10.0)
    assert sum(t["share"] for t in summary["tenants"].values()) == pytest.approx(1.0)


def test_an_unreadable_or_outsized_trace_is_an_invalid_argument(tmp_path: Path) -> None:
    """Found by a tester: `pgqueue replay` on a file that is not UTF-8 printed a
    UnicodeDecodeError traceback; a token count of 99,999,999,999 made it build a prompt of
    400 GB (it ran until killed); a missing file was a raw FileNotFoundError."""
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe{}")
    huge = tmp_path / "huge.csv"
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    huge.write_text(header + "2023-11-16 18:15:46,1,1\n2023-11-16 18:15:47,99999999999,1\n")
    edge = tmp_path / "edge.csv"
    edge.write_text(header + f"2023-11-16 18:15:46,{MAX_TRACE_TOKENS},{MAX_TRACE_TOKENS}\n")
    for path, fragment in (
        (binary, "not UTF-8 text"),
        (huge, "line 3: ContextTokens 99999999999 is over 10,000,000"),
        (tmp_path / "missing.csv", "cannot read trace file .*: No such file or directory"),
        (tmp_path, "cannot read trace file .*: Is a directory"),
        (Path("/dev/zero"), "line 1 is longer than 65,536 characters"),  # read, not whole
    ):
        with pytest.raises(InvalidArgument, match=fragment):
            load_trace(path)
    assert [r.input_tokens for r in load_trace(edge)] == [MAX_TRACE_TOKENS]
