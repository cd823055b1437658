"""Admission control settings: caps of queued jobs per tier and per tenant, and tier policies.

The rule itself runs in SQL (``pgqueue.admission_check``, revision 0006) at every enqueue; this
module only reads and writes its settings. ``docs/admission.md`` explains the design.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue.db import queries
from pgqueue.errors import InvalidArgument, InvalidTenant, from_sqlstate
from pgqueue.models import AdmissionPolicy, Tier
from pgqueue.validation import _shown, check_tenant_id

#: The largest cap: the columns are bigint (a larger int would be sent as numeric, which
#: pgqueue.admission_set does not take: "function ... does not exist").
MAX_CAP = 2**63 - 1


def _check_cap(name: str, value: int | None) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CAP
    ):
        raise InvalidArgument(
            f"{name} must be an integer from 0 to 2^63-1 or None (no cap), got {_shown(value, 40)}"
        )


def set_admission(
    conn: psycopg.Connection[Any],
    tier: Tier | str,
    *,
    max_queued: int | None = None,
    tenant_max_queued: int | None = None,
    policy: AdmissionPolicy | str = AdmissionPolicy.REJECT,
) -> None:
    """Set one tier's caps (``None``: no cap) and policy, in the caller's transaction.

    ``max_queued`` caps the tier's queued jobs over all tenants; ``tenant_max_queued`` caps
    one tenant's queued jobs in the tier (a tenant's ``max_queued`` overrides it).

    Raises:
        InvalidArgument: unknown tier or policy, a cap below 0 or above 2^63-1, or ``drop``
            for the critical tier (critical work is never dropped: use ``reject`` or
            ``block``).
    """
    try:
        tier_value = Tier(tier)
    except ValueError:
        raise InvalidArgument(
            f"unknown tier {tier!r}; expected critical, standard or batch"
        ) from None
    try:
        policy_value = AdmissionPolicy(policy)
    except ValueError:
        raise InvalidArgument(
            f"unknown admission policy {policy!r}; expected reject, block or drop"
        ) from None
    if tier_value is Tier.CRITICAL and policy_value is AdmissionPolicy.DROP:
        raise InvalidArgument(
            "critical work is never dropped: use reject or block for the critical tier"
        )
    _check_cap("max_queued", max_queued)
    _check_cap("tenant_max_queued", tenant_max_queued)
    params = {
        "tier": tier_value.value,
        "max_queued": max_queued,
        "tenant_max_queued": tenant_max_queued,
        "policy": policy_value.value,
    }
    try:
        queries.run(conn, "admission_set", params)
    except psycopg.Error as exc:
        mapped = from_sqlstate(exc.sqlstate, exc.diag.message_primary or str(exc))
        raise (mapped or exc) from exc


def set_tenant_max_queued(
    conn: psycopg.Connection[Any], tenant_id: str, max_queued: int | None
) -> None:
    """Give one tenant its own cap of queued jobs per tier (``None``: the tier's default).

    Raises:
        InvalidArgument: a negative cap. InvalidTenant: no such tenant, or a tenant id no
            tenant can have (:func:`~pgqueue.validation.check_tenant_id`).
    """
    check_tenant_id(tenant_id)
    _check_cap("max_queued", max_queued)
    updated = queries.run(
        conn, "tenant_set_max_queued", {"tenant_id": tenant_id, "max_queued": max_queued}
    )
    if updated == 0:
        raise InvalidTenant(f"unknown tenant {tenant_id!r}")


def admission_status(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Per tier: ``queued`` (exact counters), ``max_queued``, ``tenant_max_queued``,
    ``policy`` and ``dropped`` (jobs dropped by admission so far)."""
    rows: list[dict[str, Any]] = queries.run(conn, "admission_status")
    return rows
