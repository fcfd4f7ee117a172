"""Which bytes of a blob a GET asks for: one `Range` of RFC 9110 section 14, or all of them.

A single `bytes=` range is served as 206 with `Content-Range`; a range that starts past the end
is 416; anything this server does not serve (several ranges, another unit, a malformed value, an
`If-Range` naming another version) gets the whole content with 200, which the RFC allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.artifacts.errors import RangeNotSatisfiable

_ONE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # exclusive
    partial: bool  # 206 and Content-Range, else 200

    @property
    def length(self) -> int:
        return self.end - self.start

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end - 1}/{size}"


def etag(sha256: str) -> str:
    """The strong validator of a blob: its content address never changes."""
    return f'"{sha256}"'


def byte_range(header: str | None, size: int, if_range: str | None = None, tag: str | None = None) -> ByteRange:
    """The bytes to send for a `Range` header (and `If-Range`) on content of `size` bytes."""
    whole = ByteRange(0, size, False)
    if not header or (if_range is not None and if_range.strip() != tag):
        return whole
    match = _ONE.fullmatch(header.strip().replace(" ", ""))
    if match is None:
        return whole
    first, last = match.groups()
    if not first and not last:
        return whole
    if not first:  # a suffix: the last N bytes
        count = int(last)
        if count == 0 or size == 0:
            raise _unsatisfiable(header, size)
        return ByteRange(max(0, size - count), size, True)
    start = int(first)
    end = size if not last else int(last) + 1
    if last and end <= start:
        return whole  # "5-3" is not a valid range: ignored
    if start >= size:
        raise _unsatisfiable(header, size)
    return ByteRange(start, min(end, size), True)


def _unsatisfiable(header: str, size: int) -> RangeNotSatisfiable:
    return RangeNotSatisfiable(
        f"Range {header[:80]!r} asks for bytes this {size}-byte content does not have", content_range=f"bytes */{size}"
    )
