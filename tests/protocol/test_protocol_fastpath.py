"""The generated fast validators accept every valid message on their own.

Decoding falls back to the precise field-by-field walk whenever the fast path
refuses or raises, so a bug in the fast path would only make decoding slow
again; these tests make that visible.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from artemis.protocol import messages as m
from protocol_helpers import every_message, progress, telemetry, window


def wire(x: Any) -> Any:
    """As the coordinator sees it: through msgpack (tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(x), raw=False)


@pytest.mark.parametrize("msg", every_message(), ids=lambda x: type(x).__name__)
def test_fast_message_validator_accepts_every_valid_message(msg: m.Message) -> None:
    body = wire(m.message_to_map(msg))
    fast = m._FAST_MESSAGES[body["t"]]
    built = fast(body, body["seq"], tuple(body["v"]))
    assert built == m.message_from_map(body)


def test_fast_record_validators_accept_valid_records() -> None:
    w = window(3, 7)
    assert m.rank_window_check.fast(wire(m.rank_window_to_map(w))) == w
    p = progress(2)
    assert m.rank_progress_check.fast(wire(m.rank_progress_to_map(p))) == p
    t = telemetry(1)
    assert m.telemetry_check.fast(wire(m.telemetry_to_map(t))) == t
