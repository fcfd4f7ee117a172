"""Which bytes a GET gets: one Range of RFC 9110 section 14, or all of them."""

from __future__ import annotations

import pytest

from orchestrator.artifacts.errors import RangeNotSatisfiable
from orchestrator.artifacts.ranges import ByteRange, byte_range, etag

TAG = etag("ab" * 32)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, ByteRange(0, 100, False)),
        ("bytes=0-", ByteRange(0, 100, True)),
        ("bytes=10-19", ByteRange(10, 20, True)),
        ("bytes=90-1000", ByteRange(90, 100, True)),  # the end is clipped to the content
        ("bytes=-30", ByteRange(70, 100, True)),  # the last 30 bytes
        ("bytes=-500", ByteRange(0, 100, True)),
        ("bytes=0-0, 5-9", ByteRange(0, 100, False)),  # several ranges: the whole content
        ("items=0-5", ByteRange(0, 100, False)),  # another unit
        ("bytes=9-3", ByteRange(0, 100, False)),  # not a range
        ("bytes=abc", ByteRange(0, 100, False)),
        ("bytes=-", ByteRange(0, 100, False)),
    ],
)
def test_a_range_header_picks_the_bytes_to_send(header: str | None, expected: ByteRange) -> None:
    assert byte_range(header, 100) == expected


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=250-300", "bytes=-0"])
def test_a_range_that_starts_past_the_end_is_not_satisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable) as refused:
        byte_range(header, 100)
    assert refused.value.extra == {"content_range": "bytes */100"}


def test_if_range_with_another_etag_sends_the_whole_content() -> None:
    assert byte_range("bytes=10-", 100, if_range=TAG, tag=TAG) == ByteRange(10, 100, True)
    assert byte_range("bytes=10-", 100, if_range='"other"', tag=TAG) == ByteRange(0, 100, False)


def test_a_partial_answer_names_its_range() -> None:
    span = byte_range("bytes=10-19", 100)
    assert (span.length, span.content_range(100)) == (10, "bytes 10-19/100")
