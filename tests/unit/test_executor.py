"""The executor turns every handler behaviour into exactly one Outcome."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

import pytest
import typer

from pgqueue import Registry
from pgqueue.errors import Defer, Discard, InvalidArgument, RateLimited, RetryLater
from pgqueue.models import Deferred, Failed, HandlerResult, Job, Succeeded, Throttled, Tier
from pgqueue.settings import Settings
from pgqueue.worker.executor import SharedDeadline, execute


def job(kind: str, attempts: int = 1) -> Job:
    return Job(
        id=7,
        tenant_id="t",
        kind=kind,
        priority=Tier.BATCH,
        payload={},
        cost=1.0,
        attempts=attempts,
        max_attempts=5,
        throttle_retries=0,
        enqueued_at=datetime.now(UTC),
        lease_token="x",
    )


def registry() -> Registry:
    r = Registry()

    @r.handler("ok.dict")
    async def ok_dict(j):
        return {"a": 1}

    @r.handler("ok.none")
    def ok_none(j):  # a plain function runs in a thread
        return None

    @r.handler("ok.result")
    async def ok_result(j):
        return HandlerResult({"b": 2}, input_tokens=3, output_tokens=4)

    @r.handler("bad.return")
    async def bad_return(j):
        return 42

    @r.handler("raise.boom")
    async def boom(j):
        raise RuntimeError("boom")

    @r.handler("raise.retry")
    async def retry(j):
        raise RetryLater("later", delay_seconds=7)

    @r.handler("raise.discard")
    async def discard(j):
        raise Discard("nope")

    @r.handler("raise.ratelimited")
    async def limited(j):
        raise RateLimited("429", retry_after_seconds=10, status_code=429)

    @r.handler("slow")
    async def slow(j):
        await asyncio.sleep(5)

    return r


SETTINGS = Settings(provider_timeout_seconds=0.2, lease_seconds=1, heartbeat_seconds=0.5)


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("ok.dict", lambda o: isinstance(o, Succeeded) and o.result == {"a": 1}),
        ("ok.none", lambda o: isinstance(o, Succeeded) and o.result is None),
        (
            "ok.result",
            lambda o: isinstance(o, Succeeded) and (o.input_tokens, o.output_tokens) == (3, 4),
        ),
        ("bad.return", lambda o: isinstance(o, Failed) and o.permanent),
        ("raise.boom", lambda o: isinstance(o, Failed) and not o.permanent and "boom" in o.error),
        ("raise.retry", lambda o: isinstance(o, Failed) and o.retry_in_seconds == 7),
        ("raise.discard", lambda o: isinstance(o, Failed) and o.permanent),
        ("raise.ratelimited", lambda o: isinstance(o, Throttled) and 9.6 <= o.wait_seconds <= 14.4),
        ("slow", lambda o: isinstance(o, Failed) and "timed out" in o.error),
        ("unregistered", lambda o: isinstance(o, Deferred) and o.delay_seconds > 0),
    ],
)
async def test_outcome(kind, check):
    outcome = await execute(job(kind), registry(), SETTINGS, random.Random(0))
    assert check(outcome), outcome


async def test_backoff_grows_with_attempts_and_is_capped():
    settings = Settings(backoff_base_seconds=1, backoff_cap_seconds=60)
    delays = []
    for attempt in range(1, 12):
        outcome = await execute(job("raise.boom", attempt), registry(), settings, random.Random(0))
        assert isinstance(outcome, Failed)
        delays.append(outcome.retry_in_seconds)
    assert all(0 < d <= 60 for d in delays)
    assert delays[-1] > delays[0]


def test_settings_refuse_a_timeout_that_outlives_the_lease():
    with pytest.raises(ValueError, match="shorter than"):
        Settings(lease_seconds=30, provider_timeout_seconds=30)
    with pytest.raises(ValueError, match="heartbeat"):
        Settings(lease_seconds=30, provider_timeout_seconds=10, heartbeat_seconds=30)


def test_settings_refuse_a_heartbeat_over_half_the_lease(monkeypatch):
    """Found by a tester: PGQUEUE_HEARTBEAT_SECONDS=119 with a 120 s lease was taken, so one
    failed heartbeat let the lease expire under a running job. A heartbeat must leave room for
    a second try: at most half the lease, refused at start-up with the settings' typed error
    (the CLI prints it as "invalid settings", exit 2)."""
    import pydantic

    from pgqueue.cli import _settings

    with pytest.raises(pydantic.ValidationError, match="at most half of lease_seconds"):
        Settings(lease_seconds=120, heartbeat_seconds=119)
    assert Settings(lease_seconds=120, heartbeat_seconds=60).heartbeat_seconds == 60
    monkeypatch.setenv("PGQUEUE_HEARTBEAT_SECONDS", "119")
    with pytest.raises(typer.Exit) as info:
        _settings()
    assert info.value.exit_code == 2


def _set(exc: Exception, **attributes: object) -> Exception:
    """``exc`` with ``attributes`` set after construction (which refuses such values): the
    executor still copes with them."""
    for name, value in attributes.items():
        setattr(exc, name, value)
    return exc


@pytest.mark.parametrize(
    ("raised", "check"),
    [
        (RetryLater("x", delay_seconds=float("inf")), lambda o: 0 < o.retry_in_seconds < 1e6),
        (_set(RetryLater("x"), delay_seconds=float("nan")), lambda o: 0 < o.retry_in_seconds < 1e6),
        (RetryLater("x", delay_seconds=1e11), lambda o: o.retry_in_seconds == 90 * 86_400),
        (_set(RetryLater("x"), delay_seconds=-3), lambda o: o.retry_in_seconds == 0),
        (_set(RetryLater("x"), delay_seconds="5"), lambda o: 0 < o.retry_in_seconds < 1e6),
        (Defer("x", delay_seconds=float("inf")), lambda o: o.delay_seconds == 60),
        (Defer("x", delay_seconds=1e15), lambda o: o.delay_seconds == 90 * 86_400),
        (
            RateLimited("429", retry_after_seconds=float("inf")),
            lambda o: isinstance(o, Throttled) and o.retry_after_seconds is None,
        ),
        (
            _set(RateLimited("429", None), retry_after_seconds=float("nan")),
            lambda o: isinstance(o, Throttled) and 0 < o.wait_seconds < 60,
        ),
    ],
)
async def test_a_handler_delay_is_made_storable(raised, check):
    """Found by a tester: `RetryLater(delay_seconds=inf)` or nan made the outcome unstorable
    (`make_interval` refuses them), so the job stayed `running` until its lease expired;
    `1e11` stored a `run_at` in the year 5195; `RateLimited(retry_after=inf)` escaped
    `execute` as a ValueError."""
    r = Registry()

    @r.handler("raise.it")
    async def raise_it(j):
        raise raised

    outcome = await execute(job("raise.it"), r, SETTINGS, random.Random(0))
    assert check(outcome), outcome


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        (HandlerResult([1, 2]), "a list result"),  # type: ignore[arg-type]
        (HandlerResult("text"), "a str result"),  # type: ignore[arg-type]
        (HandlerResult({}, input_tokens=-5), "input_tokens=-5"),
        (HandlerResult({}, output_tokens=1.5), "output_tokens=1.5"),  # type: ignore[arg-type]
        (HandlerResult({}, input_tokens=True), "input_tokens=True"),
        (HandlerResult({}, output_tokens=2**40), f"output_tokens={2**40}"),
    ],
)
def test_a_handler_result_that_cannot_be_stored_fails_for_good(
    returned: HandlerResult, reason: str
) -> None:
    """Found by a tester: these were stored as they came (a list result, a negative count
    charged to the tenant, 1.5 tokens rounded) or failed the job after it had succeeded."""
    r = Registry()

    @r.handler("odd.result")
    async def odd(j: Job) -> HandlerResult:
        return returned

    outcome = asyncio.run(execute(job("odd.result"), r, Settings(), random.Random(0)))
    assert isinstance(outcome, Failed) and outcome.permanent
    assert reason in outcome.error


def test_a_handler_result_at_the_limits_succeeds() -> None:
    r = Registry()

    @r.handler("edge.result")
    async def edge(j: Job) -> HandlerResult:
        return HandlerResult(None, input_tokens=0, output_tokens=2_147_483_647)

    outcome = asyncio.run(execute(job("edge.result"), r, Settings(), random.Random(0)))
    assert outcome == Succeeded(None, 0, 2_147_483_647)


# --------------------------------------------------------------- one deadline for a claim's jobs


async def test_jobs_of_one_claim_share_a_deadline_and_only_the_slow_ones_time_out() -> None:
    """The worker gives the jobs of one claim one timer (SharedDeadline) instead of one
    asyncio.timeout each: a job still in its handler at the deadline fails as timed out, the
    others keep their outcomes, and the task is left with no cancellation pending."""
    deadline = SharedDeadline(0.2, jobs=3)
    reg = registry()
    rng = random.Random(0)

    async def one(kind: str) -> tuple[object, int]:
        outcome = await execute(job(kind), reg, SETTINGS, rng, deadline)
        deadline.finish()
        task = asyncio.current_task()
        assert task is not None
        return outcome, task.cancelling()

    results = await asyncio.gather(one("slow"), one("ok.dict"), one("slow"))
    assert [type(o) for o, _ in results] == [Failed, Succeeded, Failed]
    assert all("timed out" in o.error for o, _ in results if isinstance(o, Failed))
    assert [pending for _, pending in results] == [0, 0, 0]


async def test_a_shutdown_cancel_is_not_turned_into_a_timeout() -> None:
    deadline = SharedDeadline(0.1, jobs=1)
    task = asyncio.create_task(
        execute(job("slow"), registry(), SETTINGS, random.Random(0), deadline)
    )
    await asyncio.sleep(0.02)
    task.cancel()  # the worker's hard stop, before the deadline
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_shutdown_cancel_during_the_timeout_still_cancels() -> None:
    """Both at once (the deadline fired and, while the handler cleaned up, a stop cancelled the
    task): the stop wins, as with asyncio.timeout; the job goes back to the queue rather than
    failing as timed out."""
    deadline = SharedDeadline(0.05, jobs=1)
    cleaning_up = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cleaning_up.set()
            await asyncio.sleep(5)
            raise

    task = asyncio.create_task(deadline.run(slow_cleanup()))
    await cleaning_up.wait()  # the deadline fired
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_handler_that_swallows_the_deadline_keeps_its_result() -> None:
    deadline = SharedDeadline(0.05, jobs=1)

    async def swallowing() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "kept"
        return "slept"

    async def run() -> tuple[str, int]:
        value = await deadline.run(swallowing())
        task = asyncio.current_task()
        assert task is not None
        return value, task.cancelling()

    assert await asyncio.create_task(run()) == ("kept", 0)


def _spy_on_timers(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.TimerHandle]:
    """The timers the running loop schedules from now on."""
    loop = asyncio.get_running_loop()
    handles: list[asyncio.TimerHandle] = []
    call_at = loop.call_at

    def spy(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        handle = call_at(when, callback, *args, **kwargs)
        handles.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_at", spy)
    return handles


async def test_one_timer_serves_a_claim_and_goes_when_its_jobs_are_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handles = _spy_on_timers(monkeypatch)
    deadline = SharedDeadline(30.0, jobs=3)
    reg = registry()

    async def one() -> object:
        outcome = await execute(job("ok.dict"), reg, SETTINGS, random.Random(0), deadline)
        deadline.finish()
        return outcome

    outcomes = await asyncio.gather(one(), one(), one())
    assert all(isinstance(o, Succeeded) for o in outcomes)
    assert len(handles) == 1  # not one per job
    assert handles[0].cancelled()  # dropped with the last job, not left for 30 s


async def test_a_claim_that_took_nothing_sets_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a tester: every empty claim left a timer of provider_timeout_seconds (90 s)
    behind, thousands of them on a worker woken often."""
    handles = _spy_on_timers(monkeypatch)
    SharedDeadline(90.0, jobs=0)
    assert handles == []


async def test_each_job_gets_its_full_time_from_its_own_start() -> None:
    """Found by a tester: the shared timer counted from the claim, so a job whose handler
    started late (thousands of slots) got less than provider_timeout_seconds."""
    deadline = SharedDeadline(0.4, jobs=2)

    async def early() -> None:
        await deadline.run(asyncio.sleep(5))

    async def late() -> str:
        await asyncio.sleep(0.3)  # starts its handler 0.3 s after the first
        result: str = await deadline.run(asyncio.sleep(0.25, result="done"))
        return result

    first = asyncio.create_task(early())
    second = asyncio.create_task(late())
    with pytest.raises(TimeoutError):
        await first  # 0.4 s after its start
    assert await second == "done"  # 0.55 s after the first started, 0.25 s after its own start


def _raiser(exc: BaseException, *, in_thread: bool) -> Registry:
    r = Registry()
    if in_thread:

        @r.handler("raise.base")
        def plain(j: Job) -> None:
            raise exc

    else:

        @r.handler("raise.base")
        async def coro(j: Job) -> None:
            raise exc

    return r


@pytest.mark.parametrize("in_thread", [False, True])
@pytest.mark.parametrize(
    ("raised", "text"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt: "),
        (GeneratorExit("misused"), "GeneratorExit: misused"),
    ],
)
async def test_a_base_exception_from_a_handler_fails_its_job(
    raised: BaseException, text: str, in_thread: bool
) -> None:
    """Found by a tester: a handler's `raise SystemExit(3)` ended the whole worker (exit 3)
    and stranded the other jobs it held. Now it fails that job, retried like any error."""
    outcome = await execute(
        job("raise.base"), _raiser(raised, in_thread=in_thread), SETTINGS, random.Random(0)
    )
    assert isinstance(outcome, Failed) and not outcome.permanent, outcome
    assert outcome.error == text and outcome.retry_in_seconds > 0


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


async def test_an_exception_whose_str_fails_still_fails_its_job() -> None:
    outcome = await execute(
        job("raise.base"), _raiser(_Unprintable(), in_thread=False), SETTINGS, random.Random(0)
    )
    assert isinstance(outcome, Failed)
    assert outcome.error == "_Unprintable: <_Unprintable whose str() failed>"


@pytest.mark.parametrize(
    ("raised", "check"),
    [
        (RetryLater(123), lambda o: isinstance(o, Failed) and o.error == "123"),
        (RetryLater(None, 5), lambda o: isinstance(o, Failed) and o.retry_in_seconds == 5),
        (Defer(["no", "key"]), lambda o: isinstance(o, Deferred) and o.reason == "['no', 'key']"),
        (Discard(404), lambda o: isinstance(o, Failed) and o.permanent and o.error == "404"),
        (RateLimited(429, 2), lambda o: isinstance(o, Throttled) and o.error == "429"),
        (RetryLater(10**400, 10**400), lambda o: isinstance(o, Failed) and o.error[:4] == "1000"),
        # a reason changed after construction is still made text
        (_set(Discard("x"), reason=7), lambda o: isinstance(o, Failed) and o.error == "7"),
        (_set(RateLimited("x", 1), status_code="429"), lambda o: o.status_code == 429),
    ],
)
async def test_a_handler_control_reason_that_is_not_text_is_recorded(raised, check) -> None:
    """Found by a tester: `RetryLater(123)` crashed the executor (`reason[:2000]` on an int),
    so the job stayed `running` until its lease expired, and each rescue used an attempt."""
    outcome = await execute(
        job("raise.base"), _raiser(raised, in_thread=False), SETTINGS, random.Random(0)
    )
    assert check(outcome), outcome


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RetryLater("x", -1), "delay_seconds must be >= 0 seconds, got -1"),
        (lambda: RetryLater("x", float("nan")), "delay_seconds must be >= 0 seconds, got nan"),
        (lambda: RetryLater("x", "5"), "delay_seconds must be a number of seconds or None"),
        (lambda: RetryLater("x", True), "delay_seconds must be a number of seconds or None"),
        (lambda: Defer("x", None), "delay_seconds must be a number of seconds, got None"),
        (lambda: Defer("x", -0.5), "delay_seconds must be >= 0 seconds"),
        (lambda: RateLimited("x", -2), "retry_after_seconds must be >= 0 seconds"),
        (lambda: RateLimited("x", 1, "429"), "status_code must be an int, got '429'"),
    ],
)
def test_handler_control_exceptions_refuse_nonsense_when_made(make, message) -> None:
    with pytest.raises(InvalidArgument) as raised:
        make()
    assert message in str(raised.value)
