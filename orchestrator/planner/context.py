"""What an agent node's model is shown of tool results, and how its screen coordinates reach the
device.

- Only the newest `kept` screenshots stay in the conversation as images; each older one becomes a
  one-line note of what it showed (the observation, its size, the focused window) and what the
  model did next. The context, and so the tokens of every call, stays bounded however many
  observations a node makes.
- A screenshot is downscaled to `Limits` and compressed instead of dropped (`screens.prepare`).
  The model is told the size it sees, and coordinates it gives for that observation are mapped to
  the screenshot's own pixels (what the device's `gui` tools take) before the command is sent.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from orchestrator.planner import calls as calls_
from orchestrator.planner.screens import Frame, Limits, Shown, Unreadable, prepare

RESULT_CHARS = 6_000  # of one tool result shown back to the model
# Argument pairs that are a point in an observation's screenshot (the gui toolset's, and common
# spellings of other servers' that also take an `observation_id`).
POINTS = (("x", "y"), ("to_x", "to_y"), ("from_x", "from_y"), ("start_x", "start_y"), ("end_x", "end_y"))
SHOWN_NOTE = "screenshot (shown separately)"


@dataclass
class _Screenshot:
    index: int  # of its message in the conversation
    label: str  # what it showed, for the note that replaces it


@dataclass(frozen=True)
class _Image:
    shown: Shown | None
    note: str  # why it is not shown, when `shown` is None


class Context:
    """The screenshot side of one agent node's conversation."""

    def __init__(self, vision: bool, kept: int, limits: Limits) -> None:
        self.vision = vision
        self.kept = kept
        self.limits = limits
        self.frames: dict[str, Frame] = {}  # observation_id -> what the model saw of it
        self._screenshots: list[_Screenshot] = []

    # ------------------------------------------------------------------ model -> device

    def map_calls(self, calls: list[calls_.Call]) -> tuple[list[calls_.Call], list[calls_.CallError]]:
        """Calls with points in shown pixels mapped to the screenshot's; a point outside the image
        the model saw is an error it reads (in its own pixels), and that call is not sent."""
        mapped: list[calls_.Call] = []
        errors: list[calls_.CallError] = []
        for call in calls:
            frame = self.frames.get(str(call.arguments.get("observation_id")))
            if frame is None or not frame.scaled:
                mapped.append(call)
                continue
            arguments = dict(call.arguments)
            problem = ""
            for kx, ky in POINTS:
                x, y = arguments.get(kx), arguments.get(ky)
                if not (isinstance(x, int) and isinstance(y, int)) or isinstance(x, bool) or isinstance(y, bool):
                    continue
                if not frame.inside(x, y):
                    w, h = frame.shown
                    problem = (
                        f"({kx}, {ky}) = ({x}, {y}) is outside the screenshot you were shown, which is {w}x{h} "
                        f"pixels: use 0 <= {kx} <= {w - 1} and 0 <= {ky} <= {h - 1}, in the pixels of that image"
                    )
                    break
                arguments[kx], arguments[ky] = frame.to_source(x, y)
            if problem:
                errors.append(calls_.CallError(call.call_id, call.tool, f"{call.tool}: {problem}"))
            else:
                mapped.append(calls_.Call(call.call_id, call.tool, arguments))
        return mapped, errors

    # ------------------------------------------------------------------ device -> model

    async def add_results(
        self, messages: list[dict[str, Any]], actions: list[calls_.Call], results: list[dict[str, Any]]
    ) -> None:
        """Append the tool messages of one step, then its newest screenshot (vision models), and
        turn screenshots older than the newest `kept` into notes."""
        parts = [_image_parts(r.get("result")) if self.vision else [] for r in results]
        # Only the step's last image is shown (and prepared); its observation maps coordinates.
        newest = max((k for k, p in enumerate(parts) if p), default=None)
        later = _Image(None, "a newer image of this step is shown instead")
        observation: dict[str, Any] | None = None
        image: _Image | None = None
        for k, (call, result) in enumerate(zip(actions, results, strict=False)):
            value = result.get("result")
            images = [later] * len(parts[k])
            if k == newest:
                images[-1] = image = await self._prepare(parts[k][-1])
                observation = _observation(value)
                if image.shown is not None and observation is not None:
                    source = (int(observation["width"]), int(observation["height"]))
                    self.frames[str(observation["observation_id"])] = Frame(source, image.shown.size)
            shown = {
                "status": result.get("status"),
                "result": self._shown(value, iter(images)),
                "error": result.get("error"),
            }
            messages.append(tool_message(call.call_id, shown))
        if image is None:
            return
        label = _label(image, observation)
        if image.shown is None:
            messages.append({"role": "user", "content": f"The latest screenshot could not be shown: {image.note}."})
            return
        hint = "Coordinates are in its pixels." if observation is not None else _scale_hint(image.shown)
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"The latest screenshot: {label}. {hint}"},
                    {"type": "image_url", "image_url": {"url": image.shown.url}},
                ],
            }
        )
        self._screenshots.append(_Screenshot(len(messages) - 1, label))
        self._prune(messages)

    async def _prepare(self, part: dict[str, Any]) -> _Image:
        if not part.get("data"):
            why = str(part.get("omitted") or "the device sent no image data")
            return _Image(None, f"the device left it out ({why})")
        try:
            # Decoding and resizing a large screenshot takes tens of milliseconds: not on the loop.
            shown = await asyncio.to_thread(prepare, str(part["data"]), str(part.get("mime_type")), self.limits)
        except Unreadable as exc:
            return _Image(None, exc.message)
        return _Image(shown, "")

    def _prune(self, messages: list[dict[str, Any]]) -> None:
        old = self._screenshots[: max(0, len(self._screenshots) - self.kept)]
        self._screenshots = self._screenshots[len(old) :]
        for shot in old:
            after = _next_action(messages, shot.index)
            messages[shot.index] = {
                "role": "user",
                "content": f"[An earlier screenshot, no longer shown: {shot.label}. {after}]",
            }

    def _shown(self, value: Any, images: Any) -> Any:
        """A tool result as the model reads it: images replaced by notes (they are shown separately),
        an observation's size the size of the image the model sees."""
        if isinstance(value, list):
            return [self._shown(v, images) for v in value]
        if not isinstance(value, dict):
            return value
        if value.get("type") == "image":
            image: _Image | None = next(images, None)
            out = {"type": "image", "mime_type": value.get("mime_type")}
            if image is None:  # not a vision model
                return {**out, "note": "screenshot (not shown: this model does not take images)"}
            if image.shown is None:
                return {**out, "note": f"screenshot not shown: {image.note}"}
            w, h = image.shown.size
            return {**out, "mime_type": image.shown.mime_type, "note": f"{SHOWN_NOTE}, {w}x{h} pixels"}
        out = {k: self._shown(v, images) for k, v in value.items()}
        frame = self.frames.get(str(value.get("observation_id")))
        if frame is not None and frame.scaled and "width" in value and "height" in value:
            out["width"], out["height"] = frame.shown
            out["coordinate_space"] = "shown_image_pixels"
            out["coordinate_note"] = (
                f"the screenshot you see is {frame.shown[0]}x{frame.shown[1]} (scaled down from "
                f"{frame.source[0]}x{frame.source[1]}); give coordinates in the pixels you see, "
                "Orrery maps them to the device"
            )
        return out


def tool_message(call_id: str, body: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(body, default=str)[:RESULT_CHARS]}


def _image_parts(value: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(value, list):
        for v in value:
            found += _image_parts(v)
    elif isinstance(value, dict):
        if value.get("type") == "image":
            found.append(value)
        else:
            for v in value.values():
                found += _image_parts(v)
    return found


def _observation(value: Any) -> dict[str, Any] | None:
    """The (first) observation in a result: a dict with an observation_id and its image size."""
    if isinstance(value, list):
        return next((o for o in (_observation(v) for v in value) if o is not None), None)
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("observation_id"), str) and _is_size(value.get("width"), value.get("height")):
        return value
    return next((o for o in (_observation(v) for v in value.values()) if o is not None), None)


def _is_size(width: Any, height: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (width, height))


def _label(image: _Image, observation: dict[str, Any] | None) -> str:
    parts = [f"observation {observation['observation_id']}" if observation else "a tool's image"]
    if image.shown is not None:
        w, h = image.shown.size
        ow, oh = (observation["width"], observation["height"]) if observation else image.shown.original
        parts.append(f"{w}x{h} pixels" + (f" (scaled from {ow}x{oh})" if (w, h) != (ow, oh) else ""))
    window = (observation or {}).get("focused_window")
    if isinstance(window, dict) and window.get("title"):
        parts.append(f"focused window {str(window['title'])[:80]!r}")
    return ", ".join(parts)


def _scale_hint(shown: Shown) -> str:
    """For an image no observation names: Orrery cannot map coordinates given for it, so say how."""
    (w, h), (ow, oh) = shown.size, shown.original
    if (w, h) == (ow, oh):
        return "Coordinates are in its pixels."
    return (
        f"It is shown scaled down from {ow}x{oh}: a tool that takes this image's pixels needs "
        f"x times {ow / w:.4g} and y times {oh / h:.4g}."
    )


def _next_action(messages: list[dict[str, Any]], index: int) -> str:
    """What the model did after it saw the message at `index`, in a few words."""
    for message in messages[index + 1 :]:
        if message.get("role") != "assistant":
            continue
        done = []
        for tc in message.get("tool_calls") or []:
            name = str(tc["function"]["name"]).replace("__", ".")
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                args = {}
            point = [f"{k}={args[k]}" for k in ("x", "y") if isinstance(args, dict) and k in args]
            done.append(f"{name}({', '.join(point)})" if point else name)
        return "Next you called " + ", ".join(done) + "." if done else "Next you answered in text."
    return ""
