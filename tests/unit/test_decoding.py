"""The worker's jsonb decoding (:func:`pgqueue.worker.decoding.safe_loads`): what ``json.loads``
reads, as text or UTF-8 bytes, and an :class:`Undecodable` for what Python cannot read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgqueue.worker.decoding import Undecodable, safe_loads

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_it_reads_what_json_reads(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert safe_loads(text) == json.loads(text)
    assert safe_loads(text.encode()) == json.loads(text.encode())


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"d": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
        (b'{"n": 1' + b"0" * 5000 + b"}", "ValueError"),
        (b'{"s": "\xff"}', "UnicodeDecodeError"),
        (b'{"s": ', "JSONDecodeError"),
    ],
)
def test_what_python_cannot_read_is_named(data: bytes, reason: str) -> None:
    decoded = safe_loads(data)
    assert isinstance(decoded, Undecodable)
    assert reason in decoded.reason
