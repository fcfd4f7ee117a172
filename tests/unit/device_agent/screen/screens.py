"""A screen drawn in memory for the screen package's unit tests: each frame differs from the last,
and the input it is sent is kept in order (what a real display would have received)."""

from __future__ import annotations

import io
import os

from device_agent.screen.frames import Frame, SourceKind, fit
from device_agent.screen.source import Action


class DrawnScreen:
    kind: SourceKind = "x11"

    def __init__(self, width: int = 640, height: int = 400, noise: bool = False) -> None:
        self.width, self.height = width, height
        self.noise = noise  # random pixels: frames that do not compress (for the size cap)
        self.grabs = 0
        self.received: list[Action] = []

    async def grab(self, max_side: int, quality: int, marks: bool = False) -> Frame:
        from PIL import Image, ImageDraw

        self.grabs += 1
        if self.noise:
            image = Image.frombytes("RGB", (self.width, self.height), os.urandom(3 * self.width * self.height))
        else:
            image = Image.new("RGB", (self.width, self.height), (20, 20, 60))
            ImageDraw.Draw(image).rectangle((self.grabs * 7 % self.width, 50, self.grabs * 7 % self.width + 40, 90))
        w, h = fit(self.width, self.height, max_side)
        image = image.resize((w, h))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=quality)
        return Frame(out.getvalue(), w, h, self.width, self.height, self.kind)

    async def send(self, action: Action) -> None:
        self.received.append(action)

    async def close(self) -> None:
        return None
