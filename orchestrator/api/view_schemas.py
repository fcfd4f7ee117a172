"""Bodies of the live view routes (`/v1/devices/{device}/views`, `/input`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.api.schemas import NO_NUL

InputKind = Literal["click", "double_click", "scroll", "key", "type"]


class ViewCreate(BaseModel):
    """What the stream should be like; every field has a default, so the body may be omitted."""

    model_config = ConfigDict(extra="forbid")

    fps: float = Field(default=2.0, gt=0, le=15, description="frames per second at most")
    max_side: int = Field(default=1280, ge=64, le=4096, description="the longer side of a frame, in pixels, at most")
    quality: int = Field(default=70, ge=10, le=95, description="JPEG quality")
    marks: bool = Field(default=False, description="send the element marks of the device's last GUI observation")


class ViewOut(BaseModel):
    view_id: str = Field(description="bound to this device and to the API key that made it")
    device_id: str
    expires_at: datetime = Field(description="the frames URL can be opened (again) until then")
    frames_url: str = Field(description="`GET` it with the same API key: a stream of Server-Sent Events")
    fps: float
    max_side: int
    quality: int
    marks: bool


class ViewInputIn(BaseModel):
    """One pointer or key input, aimed at a frame of the live view (its pixels)."""

    model_config = ConfigDict(extra="forbid")

    kind: InputKind
    x: int | None = Field(default=None, ge=0, description="click, double_click (and optionally scroll)")
    y: int | None = Field(default=None, ge=0)
    frame_width: int | None = Field(default=None, ge=1, description="the size of the frame `x, y` are pixels of")
    frame_height: int | None = Field(default=None, ge=1)
    button: Literal["left", "middle", "right"] = "left"
    direction: Literal["up", "down", "left", "right"] | None = Field(default=None, description="scroll")
    keys: (
        Annotated[str, Field(min_length=1, max_length=100, description="key: e.g. `ctrl+c`, `Return`"), NO_NUL] | None
    ) = None
    text: Annotated[str, Field(min_length=1, max_length=2000, description="type"), NO_NUL] | None = None

    @model_validator(mode="after")
    def _fields_of_kind(self) -> Self:
        needed: tuple[str, ...] = {
            "click": ("x", "y", "frame_width", "frame_height"),
            "double_click": ("x", "y", "frame_width", "frame_height"),
            "scroll": ("direction",),
            "key": ("keys",),
            "type": ("text",),
        }[self.kind]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a '{self.kind}' input needs {', '.join(missing)}")
        if self.x is not None and self.frame_width is not None and self.x >= self.frame_width:
            raise ValueError("x must be less than frame_width")
        if self.y is not None and self.frame_height is not None and self.y >= self.frame_height:
            raise ValueError("y must be less than frame_height")
        return self


class ViewInputOut(BaseModel):
    ok: bool = Field(description="always true: a refusal is a 409 with the device's code")
    input_id: str
