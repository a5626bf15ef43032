"""What a stopped restore reports when ``produce()`` itself raises part-way through a chunk
(no broker needed: a producer that refuses its fifth record)."""

from __future__ import annotations

from typing import Any

import pytest

from fsspec_kbs.kafka.produce import _Chunk, _Sender


class _Refusing:
    def __init__(self, at: int) -> None:
        self.calls, self.at = 0, at

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("KafkaException: MSG_SIZE_TOO_LARGE")

    def poll(self, timeout: float) -> int:
        return 0


@pytest.mark.parametrize("at,reached", [(5, 3), (2, 0), (1, None)])
def test_report_names_exactly_what_was_handed_to_the_producer(at: int, reached: int | None) -> None:
    sender = _Sender(_Refusing(at), {}, False, "kbs")
    chunks = [_Chunk(("t", 0), [0, 1, 2], [0, 0, 0], [b"k"] * 3, [b"v"] * 3, None, 6),
              _Chunk(("t", 0), [3, 4, 5], [0, 0, 0], [b"k"] * 3, [b"v"] * 3, None, 6)]
    with pytest.raises(RuntimeError) as err:
        for c in chunks:
            sender.send(c, {})
    report = sender.incomplete(str(err.value), 0)
    assert report.reached == ({} if reached is None else {("t", 0): reached})
    assert sender.records == at - 1
