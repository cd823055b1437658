"""Request traces on disk: read a trace CSV (arrival time, input tokens, output tokens).

:func:`load_trace` reads the bundled trace or a file of the same shape; :mod:`pgqueue.trace`
plans a replay of what it reads. Nothing here touches a database or the network.

The bundled trace is the Azure LLM inference trace 2023, conversation service (19,366 requests
over about one hour on 2023-11-16), from the Azure Public Dataset
``AzureLLMInferenceDataset2023``, licensed CC-BY 4.0. Cite: Patel, Choukse, Zhang, Shah, Goiri,
Maleki, Bianchini, "Splitwise: Efficient generative LLM inference using phase splitting",
ISCA 2024. See ``pgqueue/data/README.md``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import IO

from pgqueue.errors import InvalidArgument

__all__ = ["BUNDLED_TRACE", "MAX_TRACE_TOKENS", "TraceRequest", "is_real", "load_trace"]

#: File name of the bundled trace inside the ``pgqueue.data`` package.
BUNDLED_TRACE = "azure_llm_conv_2023.csv"

#: The largest token count a trace row may give (either column): ten times the longest
#: context window of today's models; a prompt of it is 40 MB of filler, which the payload cap
#: then refuses at enqueue.
MAX_TRACE_TOKENS = 10_000_000

_TIMESTAMP = "TIMESTAMP"
_INPUT = "ContextTokens"
_OUTPUT = "GeneratedTokens"
_COLUMNS = (_TIMESTAMP, _INPUT, _OUTPUT)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One recorded request.

    ``offset_seconds`` is the arrival time in seconds since the first request of the loaded
    trace (so the first request is at 0.0); ``input_tokens`` and ``output_tokens`` are the
    recorded prompt and generated token counts (non-negative).
    """

    offset_seconds: float
    input_tokens: int
    output_tokens: int


# --------------------------------------------------------------------------------- loading
def load_trace(
    path: str | Path | None = None,
    *,
    limit: int | None = None,
    start_offset_seconds: float = 0.0,
) -> list[TraceRequest]:
    """Read a trace CSV (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``), sorted by arrival.

    ``path=None`` reads the bundled Azure conversation trace from the installed package.
    Requests arriving earlier than ``start_offset_seconds`` (seconds after the first request
    of the file) are skipped; then at most ``limit`` requests are kept. Offsets are rebased so
    the first returned request is at 0.0 seconds. Extra columns are ignored; blank lines are
    skipped. Timestamps are ISO 8601 (``2023-11-16 18:15:46.6805900``; digits past the
    microsecond are dropped); zone-aware timestamps are converted to UTC.

    Raises :class:`~pgqueue.errors.InvalidArgument` when a required column is missing, when a
    row (named by its line number, the header being line 1) has a bad timestamp, a token count
    that is not an integer from 0 to :data:`MAX_TRACE_TOKENS` or the wrong number of fields,
    when the file cannot be read or is not UTF-8, when ``limit`` is negative, or when
    ``start_offset_seconds`` is negative or not finite.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidArgument(f"limit must be a non-negative integer or None, got {limit!r}")
    if not is_real(start_offset_seconds) or not (
        math.isfinite(start_offset_seconds) and start_offset_seconds >= 0
    ):
        raise InvalidArgument(
            f"start_offset_seconds must be a finite number >= 0, got {start_offset_seconds!r}"
        )

    if path is None:
        source = resources.files("pgqueue.data").joinpath(BUNDLED_TRACE)
        name = f"bundled {BUNDLED_TRACE}"
        rows = _parse_rows(io.StringIO(source.read_text(encoding="utf-8-sig"), newline=""), name)
    else:
        name = str(path)
        try:
            # read as it is parsed (found by a tester: /dev/zero was read whole, 8 GB and on)
            with open(path, encoding="utf-8-sig", newline="") as stream:
                rows = _parse_rows(_bounded_lines(stream, name), name)
        except UnicodeDecodeError as exc:  # found by a tester: a traceback
            raise InvalidArgument(
                f"{name}: not UTF-8 text ({exc.reason} at offset {exc.start})"
            ) from None
        except csv.Error as exc:  # a NUL byte, a field over csv's size limit
            raise InvalidArgument(f"{name}: not a trace CSV: {exc}") from None
        except OSError as exc:  # missing, a directory, no permission
            raise InvalidArgument(
                f"cannot read trace file {name!r}: {exc.strerror or exc}"
            ) from None

    if not rows:
        return []
    rows.sort(key=lambda row: row[0])  # stable: ties keep file order
    first = rows[0][0]
    selected: list[TraceRequest] = []
    base: datetime | None = None
    for arrival, input_tokens, output_tokens in rows:
        if limit is not None and len(selected) >= limit:
            break
        if (arrival - first).total_seconds() < start_offset_seconds:
            continue
        if base is None:
            base = arrival
        selected.append(
            TraceRequest(
                offset_seconds=(arrival - base).total_seconds(),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        )
    return selected


#: The longest line a trace file may have, characters (a row of three columns is ~60).
MAX_TRACE_LINE_CHARS = 65_536


def _bounded_lines(stream: IO[str], name: str) -> Iterator[str]:
    """The lines of ``stream``, each read with a bound (a file without line breaks, such as
    /dev/zero, is refused instead of read whole).

    Raises:
        InvalidArgument: a line longer than :data:`MAX_TRACE_LINE_CHARS`.
    """
    number = 0
    while line := stream.readline(MAX_TRACE_LINE_CHARS + 1):
        number += 1
        if len(line) > MAX_TRACE_LINE_CHARS:
            raise InvalidArgument(
                f"{name}: line {number} is longer than {MAX_TRACE_LINE_CHARS:,} characters"
            )
        yield line


def _parse_rows(stream: Iterable[str], name: str) -> list[tuple[datetime, int, int]]:
    reader = csv.reader(stream)
    header = next(reader, None)
    if header is None:
        raise InvalidArgument(f"{name}: line 1: empty file, expected a header {list(_COLUMNS)}")
    columns = [column.strip() for column in header]
    missing = [column for column in _COLUMNS if column not in columns]
    if missing:
        raise InvalidArgument(
            f"{name}: line 1: missing column(s) {missing}; header is {columns}, "
            f"expected {list(_COLUMNS)}"
        )
    i_ts, i_in, i_out = (columns.index(column) for column in _COLUMNS)

    rows: list[tuple[datetime, int, int]] = []
    for fields in reader:
        line = reader.line_num
        if not fields or all(not field.strip() for field in fields):
            continue
        if len(fields) != len(columns):
            raise InvalidArgument(
                f"{name}: line {line}: expected {len(columns)} fields, got {len(fields)}"
            )
        rows.append(
            (
                _parse_timestamp(fields[i_ts], name, line),
                _parse_tokens(fields[i_in], _INPUT, name, line),
                _parse_tokens(fields[i_out], _OUTPUT, name, line),
            )
        )
    return rows


def _parse_timestamp(value: str, name: str, line: int) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidArgument(
            f"{name}: line {line}: {_TIMESTAMP} {value!r} is not an ISO 8601 timestamp"
        ) from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


def _parse_tokens(value: str, column: str, name: str, line: int) -> int:
    try:
        tokens = int(value.strip())
    except ValueError:
        tokens = -1
    if tokens < 0:
        raise InvalidArgument(
            f"{name}: line {line}: {column} {value!r} is not a non-negative integer"
        )
    if tokens > MAX_TRACE_TOKENS:
        # found by a tester: 99,999,999,999 made the replay build a prompt of 400 GB
        raise InvalidArgument(
            f"{name}: line {line}: {column} {value.strip()} is over {MAX_TRACE_TOKENS:,}"
        )
    return tokens


def is_real(value: object) -> bool:
    """A real number: an int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)
