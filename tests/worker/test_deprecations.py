"""The worker's building blocks construct without deprecation warnings (warnings are errors)."""

from __future__ import annotations

import warnings

from pgqueue.worker.transient import transient_retry


def test_transient_retry_policy_has_no_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        transient_retry()
