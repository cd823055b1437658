"""Bounds found by testers outside the CLI's own checks: settings from the environment take no
NaN or infinity, and the demo's scaled limits stay whole positive numbers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pgqueue.demo import scaled_limits
from pgqueue.sandbox.state import SandboxConfig
from pgqueue.settings import Settings


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_settings_refuse_nan_and_infinities_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PGQUEUE_POLL_INTERVAL_SECONDS", value)
    with pytest.raises(ValidationError):
        Settings()
    monkeypatch.delenv("PGQUEUE_POLL_INTERVAL_SECONDS")
    monkeypatch.setenv("PGQUEUE_RETENTION_SECONDS", value)
    with pytest.raises(ValidationError):
        Settings()


def test_the_demos_limits_are_whole_and_positive_at_any_documented_scale() -> None:
    assert scaled_limits(10.0) == (500, 400_000, 80_000)
    assert scaled_limits(0.01) == (1, 400, 80)  # 0.5 requests per minute used to round to 0
    for scale in (0.01, 0.015, 0.02, 1.0, 2e7):
        rpm, itpm, otpm = scaled_limits(scale)
        SandboxConfig(
            requests_per_minute=rpm, input_tokens_per_minute=itpm, output_tokens_per_minute=otpm
        )


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_a_blank_dsn_means_the_embedded_server_not_libpqs_defaults(
    monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """Found by a fresh-machine tester: PGQUEUE_DSN=' ' was taken as a DSN, and libpq read it
    as "all defaults" (the local socket's server) instead of the embedded one."""
    monkeypatch.setenv("PGQUEUE_DSN", blank)
    assert Settings().dsn is None
