"""Screenshots as a model sees them: downscaled to a bounded size, compressed instead of dropped,
and a coordinate mapping between the image the model sees and the screenshot the device took.

The mapping is the device's own rule (`device_agent/toolsets/gui/rules.py` `to_device`) applied
once more: pixel x of an image w wide covers [x, x+1); its centre (x + 0.5) scales to
(2x + 1) * W / (2w) in an image W wide, and integer floor division keeps that exact. Mapping a
shown pixel to the source and back gives the same pixel whenever the shown image is not larger
than the source (tests/unit/planner/test_screens.py checks every pixel of odd sizes).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from dataclasses import dataclass

from PIL import Image

JPEG_QUALITIES = (85, 70, 55, 40)
SHRINK = 0.75  # when even the lowest JPEG quality is over the byte limit, shrink by this and retry
# A device cannot send more than a frame holds, but a tiny PNG can claim a huge size: refuse
# anything above this many pixels rather than decode it.
MAX_DECODE_PIXELS = 64_000_000


@dataclass(frozen=True)
class Limits:
    max_side: int = 1280
    max_pixels: int = 1280 * 800
    max_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class Frame:
    """The pixels the model sees (`shown`) and the pixels the device's inputs take (`source`)."""

    source: tuple[int, int]
    shown: tuple[int, int]

    @property
    def scaled(self) -> bool:
        return self.source != self.shown

    def to_source(self, x: int, y: int) -> tuple[int, int]:
        return scale(x, self.shown[0], self.source[0]), scale(y, self.shown[1], self.source[1])

    def to_shown(self, x: int, y: int) -> tuple[int, int]:
        return scale(x, self.source[0], self.shown[0]), scale(y, self.source[1], self.shown[1])

    def inside(self, x: int, y: int) -> bool:
        return 0 <= x < self.shown[0] and 0 <= y < self.shown[1]


def scale(x: int, length: int, to_length: int) -> int:
    """Pixel `x` of a line `length` long -> the pixel under its centre on one `to_length` long."""
    return (2 * x + 1) * to_length // (2 * length)


def fit(width: int, height: int, limits: Limits) -> tuple[int, int]:
    """The largest size with the same aspect ratio within the longest side and the pixel budget."""
    ratio = min(1.0, limits.max_side / max(width, height), math.sqrt(limits.max_pixels / (width * height)))
    if ratio >= 1.0:
        return width, height
    return max(1, math.floor(width * ratio)), max(1, math.floor(height * ratio))


@dataclass(frozen=True)
class Shown:
    """One screenshot prepared for the model."""

    mime_type: str
    data: str  # base64
    size: tuple[int, int]  # of the image the model sees
    original: tuple[int, int]  # of the image the device sent
    bytes_in: int  # decoded bytes, as sent by the device
    bytes_out: int  # decoded bytes, as sent to the model

    @property
    def url(self) -> str:
        return f"data:{self.mime_type};base64,{self.data}"


class Unreadable(Exception):
    """The image cannot be decoded; `message` says why (for a note to the model)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def prepare(data: str, mime_type: str, limits: Limits) -> Shown:
    """A base64 image from a device, made fit for a model: the original when it is within the
    limits, else downscaled (Lanczos), as PNG when that is small enough, else as JPEG."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Unreadable(f"the image is not valid base64 ({exc})") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            original = image.size
            if original[0] * original[1] > MAX_DECODE_PIXELS or min(original) < 1:
                raise Unreadable(f"the image is {original[0]}x{original[1]} pixels, too large to decode")
            image.load()
    except Unreadable:
        raise
    except Exception as exc:  # Pillow raises many types for a broken file
        raise Unreadable(f"the image cannot be decoded ({type(exc).__name__})") from None
    size = fit(*original, limits)
    if size == original and len(raw) <= limits.max_bytes:
        return Shown(mime_type, data, original, original, len(raw), len(raw))
    while True:
        small = (
            image if size == original else image.convert("RGB").resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0)
        )
        encoded = _encode(small, limits.max_bytes)
        if encoded is not None or min(size) <= 16:
            mime, body = encoded or ("image/jpeg", _jpeg(small, JPEG_QUALITIES[-1]))
            return Shown(mime, base64.b64encode(body).decode("ascii"), size, original, len(raw), len(body))
        size = (max(1, math.floor(size[0] * SHRINK)), max(1, math.floor(size[1] * SHRINK)))


def _encode(image: Image.Image, max_bytes: int) -> tuple[str, bytes] | None:
    """PNG if that fits (sharp text), else the best JPEG quality that fits; None if none does."""
    out = io.BytesIO()
    png_ready = image if image.mode in ("RGB", "RGBA", "L", "P") else image.convert("RGB")
    png_ready.save(out, "PNG", optimize=False, compress_level=4)
    if out.tell() <= max_bytes:
        return "image/png", out.getvalue()
    for quality in JPEG_QUALITIES:
        body = _jpeg(image, quality)
        if len(body) <= max_bytes:
            return "image/jpeg", body
    return None


def _jpeg(image: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=quality, optimize=True)
    return out.getvalue()
