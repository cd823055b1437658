"""The batch form of the enqueue checks: :class:`JobSpec`, and :func:`check_batch`, which
validates many jobs at once and encodes their payloads as one JSON array text for
``pgqueue.try_enqueue_batch``. A bad job raises exactly what a single enqueue raises for it
(:func:`pgqueue.validation.check_job`), prefixed with its index."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgqueue.errors import InvalidArgument, InvalidPayload, InvalidTenant, UnknownOrigin, UsageError
from pgqueue.jsonb_size import jsonb_size, to_json_text
from pgqueue.models import DEFAULT_KIND, Origin
from pgqueue.validation import (
    MAX_KIND_CHARS,
    MAX_TENANT_ID_CHARS,
    check_job,
    has_control,
    has_nul_escape,
    is_invisible,
    is_utf8_encodable,
    messages_payload_ok,
)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for :func:`enqueue_many`; the fields mean what :func:`enqueue`'s arguments do.

    A batch takes the defaults of the rest: ``max_attempts`` 5, due now, no ``dedupe_key``
    (use :func:`enqueue` for a job that needs one of those)."""

    tenant_id: str
    origin: Origin | str
    payload: Mapping[str, Any]
    sla_seconds: float | None = None
    kind: str = DEFAULT_KIND


@dataclass(frozen=True, slots=True)
class Batch:
    """Validated jobs for ``pgqueue.try_enqueue_batch``: one list per column, in input order,
    and every payload in ONE JSON array text (the server parses it once, as jsonb)."""

    tenant_ids: list[str]
    origins: list[str]
    payloads_json: str
    sla_seconds: list[float | None]
    kinds: list[str]

    def params(self) -> dict[str, Any]:
        """The named query ``job_try_enqueue_batch``'s parameters."""
        return {
            "tenant_ids": self.tenant_ids,
            "origins": self.origins,
            "payloads": self.payloads_json,
            "sla_seconds": self.sla_seconds,
            "kinds": self.kinds,
        }


_JOB_FIELDS = frozenset({"tenant_id", "origin", "payload", "sla_seconds", "kind"})
#: The fields a job's mapping must have, and the error each one's absence raises.
_REQUIRED_FIELDS: dict[str, type[UsageError]] = {
    "tenant_id": InvalidTenant,
    "origin": UnknownOrigin,
    "payload": InvalidPayload,
}
_ORIGIN_VALUES = frozenset(o.value for o in Origin)
_INF = float("inf")
_MAX_FLOAT_INT = int(sys.float_info.max)  # larger ints may not convert to float


def check_batch(jobs: Sequence[JobSpec | Mapping[str, Any]], max_payload_bytes: int) -> Batch:
    """Validate a batch; raises the first bad job's typed error, prefixed ``job <index>:``.

    ``max_payload_bytes`` is the payload cap (as Postgres measures ``payload::text``).
    Returns the batch as :class:`Batch`. Raises :class:`~pgqueue.errors.UsageError`
    subclasses (``InvalidArgument`` for a value that is not a sequence of jobs).

    Fast path: all payloads are encoded by one ``json`` call into one array text, and each job
    gets only cheap field checks. Anything that fails them (or a batch whose text is over the
    payload cap, or that may hold a NUL) goes through :func:`check_job`, job by job, which
    raises exactly what a single enqueue raises for the same input.
    """
    if isinstance(jobs, str | bytes) or not isinstance(jobs, Sequence):
        raise InvalidArgument("enqueue_many takes a sequence of JobSpec or mappings")
    tenant_ids: list[Any] = []
    origins: list[Any] = []
    payloads: list[Any] = []
    slas: list[Any] = []
    kinds: list[Any] = []
    for index, spec in enumerate(jobs):
        if isinstance(spec, JobSpec):
            tenant_ids.append(spec.tenant_id)
            origins.append(spec.origin)
            payloads.append(spec.payload)
            slas.append(spec.sla_seconds)
            kinds.append(spec.kind)
        elif isinstance(spec, Mapping):
            if not _JOB_FIELDS.issuperset(spec):
                unknown = set(spec) - _JOB_FIELDS
                raise InvalidArgument(f"job {index}: unknown fields {sorted(unknown)}")
            for field, error in _REQUIRED_FIELDS.items():
                if field not in spec:  # found by a tester: no origin said "unknown origin None"
                    raise error(f"job {index}: the field {field!r} is missing")
            tenant_ids.append(spec.get("tenant_id"))
            origins.append(spec.get("origin"))
            payloads.append(spec.get("payload"))
            slas.append(spec.get("sla_seconds"))
            kinds.append(spec.get("kind", DEFAULT_KIND))
        else:
            raise InvalidArgument(f"job {index}: expected a JobSpec or a mapping")
    text = _encode_all(payloads, max_payload_bytes)
    texts: list[str] | None = None
    if text is None:
        texts = []
    for index in range(len(payloads)):
        tenant, origin, payload, sla, kind = (
            tenant_ids[index],
            origins[index],
            payloads[index],
            slas[index],
            kinds[index],
        )
        if (
            texts is None
            and isinstance(tenant, str)
            and 0 < len(tenant) <= MAX_TENANT_ID_CHARS
            and "\x00" not in tenant
            and is_utf8_encodable(tenant)
            and not is_invisible(tenant)
            and not has_control(tenant)
            and isinstance(origin, str)
            and origin in _ORIGIN_VALUES
            and (
                sla is None
                or (type(sla) is float and 0.0 <= sla < _INF)
                or (type(sla) is int and 0 <= sla <= _MAX_FLOAT_INT)
            )
            and isinstance(kind, str)
            and 0 < len(kind) <= MAX_KIND_CHARS
            and "\x00" not in kind
            and is_utf8_encodable(kind)
            and isinstance(payload, Mapping)
            and (kind != DEFAULT_KIND or messages_payload_ok(payload))
        ):
            if type(origin) is not str:
                origins[index] = str(origin)
            if type(sla) is int:
                slas[index] = float(sla)
            continue
        try:  # the slow path raises this job's error, or normalises its fields
            job = check_job(
                tenant_id=tenant,
                origin=origin,
                payload=payload,
                sla_seconds=sla,
                kind=kind,
                max_payload_bytes=max_payload_bytes,
            )
        except UsageError as exc:
            raise type(exc)(f"job {index}: {exc}") from None
        origins[index] = job.origin.value
        slas[index] = job.sla_seconds
        if texts is not None:
            texts.append(job.payload_json)
    if texts is not None:
        text = "[" + ", ".join(texts) + "]"
    assert text is not None
    return Batch(tenant_ids, origins, text, slas, kinds)


def _encode_all(payloads: list[Any], max_payload_bytes: int) -> str | None:
    """All payloads as one JSON array text, or None when one of them must be checked alone
    (not encodable, may hold a NUL, or the whole text is over the cap of one payload as
    Postgres measures it: no payload in the array can then be over it)."""
    try:
        text = to_json_text(payloads)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        return None
    if has_nul_escape(text) or jsonb_size(payloads, text, size) > max_payload_bytes:
        return None
    return text
