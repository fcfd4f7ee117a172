"""Set-of-marks: the observation's screenshot with a numbered box drawn on each listed element.

A model can then say "click 7" and pass `element_id: 7`. No imaging library: the capture is our
own PNG (8-bit RGB, unfiltered rows, as mss writes it), so decoding is zlib plus slicing; any
other PNG is left unmarked (`draw` returns None). Digits come from a 3x5 bitmap font drawn at
3x scale on a filled label at the element's top-left corner.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCALE = 3
FONT = {  # 3x5, rows top to bottom, bit 2 = left column
    "0": (7, 5, 5, 5, 7),
    "1": (2, 6, 2, 2, 7),
    "2": (7, 1, 7, 4, 7),
    "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7),
    "6": (7, 4, 7, 5, 7),
    "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7),
    "9": (7, 5, 7, 1, 7),
}
BOX = bytes((255, 0, 200))  # magenta: rare in user interfaces
LABEL_BG = bytes((255, 0, 200))
LABEL_FG = bytes((255, 255, 255))


def decode(png: bytes) -> tuple[int, int, bytearray] | None:
    """(width, height, rows) of an unfiltered 8-bit RGB PNG; each row starts with its filter byte."""
    if not png.startswith(PNG_MAGIC):
        return None
    pos, width, height, idat = 8, 0, 0, b""
    while pos + 8 <= len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">2I5B", body)
            if (depth, colour, interlace) != (8, 2, 0):
                return None
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    try:
        rows = bytearray(zlib.decompress(idat))
    except zlib.error:
        return None
    stride = 1 + 3 * width
    if width == 0 or len(rows) != stride * height or any(rows[y * stride] for y in range(height)):
        return None
    return width, height, rows


def _encode(width: int, height: int, rows: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">2I5B", width, height, 8, 2, 0, 0, 0)
    return PNG_MAGIC + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")


class _Canvas:
    def __init__(self, width: int, height: int, rows: bytearray) -> None:
        self.width, self.height, self.rows = width, height, rows
        self.stride = 1 + 3 * width

    def fill(self, x: int, y: int, w: int, h: int, colour: bytes) -> None:
        x0, y0 = max(0, x), max(0, y)
        x1, y1 = min(self.width, x + w), min(self.height, y + h)
        if x1 <= x0 or y1 <= y0:
            return
        span = colour * (x1 - x0)
        for row in range(y0, y1):
            start = row * self.stride + 1 + 3 * x0
            self.rows[start : start + len(span)] = span

    def box(self, x: int, y: int, w: int, h: int, colour: bytes, thickness: int = 2) -> None:
        self.fill(x, y, w, thickness, colour)
        self.fill(x, y + h - thickness, w, thickness, colour)
        self.fill(x, y, thickness, h, colour)
        self.fill(x + w - thickness, y, thickness, h, colour)

    def label(self, x: int, y: int, text: str) -> None:
        w = len(text) * 4 * SCALE + SCALE
        h = 7 * SCALE
        x, y = min(max(0, x), self.width - w), min(max(0, y), self.height - h)
        self.fill(x, y, w, h, LABEL_BG)
        for i, char in enumerate(text):
            for r, bits in enumerate(FONT[char]):
                for c in range(3):
                    if bits >> (2 - c) & 1:
                        px, py = x + SCALE + (i * 4 + c) * SCALE, y + SCALE + r * SCALE
                        self.fill(px, py, SCALE, SCALE, LABEL_FG)


def draw(png: bytes, marks: Iterable[tuple[int, tuple[int, int, int, int]]], scale: float = 1.0) -> bytes | None:
    """`png` with a box and a number for each (id, (x, y, w, h) in device pixels); None if it cannot.

    `scale` maps device pixels to screenshot pixels (1.0 when the screenshot is full size).
    """
    decoded = decode(png)
    if decoded is None:
        return None
    canvas = _Canvas(*decoded)
    drawn = False
    for mark_id, bounds in marks:
        x, y, w, h = (round(v * scale) for v in bounds)
        if w <= 0 or h <= 0:
            continue
        canvas.box(x, y, w, h, BOX)
        canvas.label(x, y, str(mark_id))
        drawn = True
    return _encode(canvas.width, canvas.height, bytes(canvas.rows)) if drawn else None
