"""The controller of one display: observations, receipts, the stop latch and exclusivity.

Every input is bound to an observation: the caller must show the `observation_id` of the latest
screenshot, at most 60 s old and not yet used, and the screen must still have the size and the
focused window it had then; otherwise `stale_observation`. An input consumes its observation
and answers with a new one, so an agent always acts on what it has just seen.

Order of checks for an input, and why:
1. arguments (pure) -> `invalid_arguments`;
2. the in-process gate -> `busy` (a second call is refused at once, never queued: by the time
   it ran, its observation would describe a screen the first call changed);
3. the receipt for `action_id` -> the stored answer or `id_conflict` (before the observation
   check, so a retry after the observation was used still gets its original answer);
4. the stop latch -> `stopped`; receipt room -> `action_limit`; the display lock -> `busy`;
5. the observation: current, fresh, coordinates inside it; then it is consumed; the screen is
   read again and compared (`stale_observation`), and the age re-checked after that read;
6. the receipt is reserved as uncertain, the latch re-checked, and only then the input is sent.
An input on an element (`element_id`) resolves the id in step 5 (unknown -> `invalid_arguments`,
another name -> `element_mismatch`), then reads the element again before reserving the receipt:
renamed or gone -> `stale_observation`, disabled or hidden -> `element_not_actionable`. After it
the element is read once more, and the receipt says what was verified (see `grounding`).
Any failure or cancel during the input releases buttons and modifiers and leaves the receipt
uncertain, so it is never replayed.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from device_agent.toolsets.gui.atspi import Element, Tree
from device_agent.toolsets.gui.display import DisplayLock
from device_agent.toolsets.gui.grounding import Accessibility, ElementAct, pick, verify
from device_agent.toolsets.gui.marks import draw
from device_agent.toolsets.gui.receipts import Outcome, Receipts, uncertain
from device_agent.toolsets.gui.rules import OBSERVATION_TTL_S, Gesture, GuiError, check_point, digest, to_device
from device_agent.toolsets.gui.screens import ScreenshotStore
from device_agent.toolsets.gui.x11 import RELEASE_TIMEOUT_S, Backend, Screen

# Arguments are never logged: typed text may be a password.
log = logging.getLogger("orrery.agent.gui")

SETTLE_S = 0.25  # after an input, let the application redraw before the new screenshot
OBSERVE_AGAIN = "call gui.observe and retry with the new observation_id"


@dataclass(frozen=True)
class Observation:
    id: str
    taken_at: float
    screen: Screen
    width: int  # of the screenshot: the coordinate space of inputs
    height: int
    sha256: str = ""
    elements: dict[int, Element] = field(default_factory=dict)  # valid for this observation only

    def point(self, x: int, y: int, name: str = "x, y") -> tuple[int, int]:
        """Bounds-check a screenshot pixel and map it to the device pixel under its centre."""
        check_point(x, y, self.width, self.height, name)
        return to_device(x, y, (self.width, self.height), (self.screen.width, self.screen.height))

    def element(self, element_id: int, name: str | None) -> Element:
        """Element `element_id` of this observation, refused if `name` is given and differs."""
        return pick(self.elements, element_id, name, self.id)


class Controller:
    """State shared by the tools of one `gui` toolset instance."""

    def __init__(
        self,
        backend: Backend,
        store: ScreenshotStore,
        lock: DisplayLock,
        clock: Callable[[], float] = time.monotonic,
        settle_s: float = SETTLE_S,
        accessibility: Accessibility | None = None,
    ) -> None:
        self.backend = backend
        self.accessibility = accessibility
        self.store = store
        self.lock = lock
        self.clock = clock
        self.settle_s = settle_s
        self.receipts = Receipts(clock)
        self.stopped = False
        self._stop_event = anyio.Event()
        self._busy = False
        self._sending = False
        self._current: Observation | None = None

    @contextmanager
    def _gate(self) -> Iterator[None]:
        if self._busy:
            raise GuiError(
                "busy",
                "another gui call is still running on this device; wait for its result, then call "
                "gui.observe and act on the new observation",
            )
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    async def observe(self) -> tuple[dict[str, Any], list[bytes]]:
        """Take a screenshot; it becomes the one current observation."""
        with self._gate():
            self.lock.acquire()
            return await self._observe()

    async def _observe(self) -> tuple[dict[str, Any], list[bytes]]:
        self._current = None  # a failed refresh must not leave the previous frame actionable
        before = await self.backend.status()
        png, width, height = await self.backend.capture()
        after = await self.backend.status()
        if not before.same_world(after):
            raise GuiError("tool_error", "the focused window or screen size changed while capturing; observe again")
        if self.accessibility is not None:
            tree = await self.accessibility.snapshot(after.title)
        else:
            tree = Tree(available=False, reason="this display has no accessibility layer")
        oid = secrets.token_hex(16)
        path = self.store.save(f"screen-{oid}.png", png)
        sha = hashlib.sha256(png).hexdigest()
        elements = {e.id: e for e in tree.elements}
        observation = Observation(oid, self.clock(), after, width, height, sha, elements)
        described = _describe(observation, path, png)
        described["accessibility"] = tree.describe()
        images = [png]
        boxes = [(e.id, e.bounds) for e in tree.elements if e.depth > 0 and e.visible]
        marked = await anyio.to_thread.run_sync(draw, png, boxes, width / after.width) if boxes else None
        if marked is not None:
            images.append(marked)
        described["marked_screenshot"] = marked is not None
        self._current = observation
        return described, images

    async def act(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        gesture_for: Callable[[Observation], Gesture | ElementAct | None],
    ) -> tuple[Outcome, list[bytes]]:
        """Run one input (or, when `gesture_for` returns None, a wait) under all the rules above."""
        action_id = str(arguments["action_id"])
        key = digest(tool, arguments)
        with self._gate():
            stored = self.receipts.lookup(action_id, key)
            if stored is not None:
                return _replayed(stored), []
            self._check_running()
            self.receipts.ensure_room()
            self.lock.acquire()
            observation = self._fresh(str(arguments["observation_id"]))
            gesture = gesture_for(observation)  # may refuse coordinates; the frame is still usable then
            self._current = None  # single use, whatever happens next
            now = await self.backend.status()
            self._fresh(observation.id, observation)  # a slow read must not extend the frame's life
            if not observation.screen.same_world(now):
                raise GuiError(
                    "stale_observation",
                    f"the screen changed since observation {observation.id}: focused window was "
                    f"{_window(observation.screen)}, now {_window(now)}; {OBSERVE_AGAIN}",
                )
            self._check_running()
            if gesture is None:
                return await self._wait(tool, action_id, key, arguments)
            if isinstance(gesture, ElementAct):
                return await self._act_on_element(tool, action_id, key, gesture, observation)
            self.receipts.reserve(action_id, key)
            if not await self._send(gesture):
                return uncertain(action_id), []
            receipt = dispatched(action_id, tool)
            # Recorded at once: from here a retry must get "sent", even if the call is cancelled.
            self.receipts.finish(action_id, Outcome(True, receipt))
            await anyio.sleep(self.settle_s)
            return await self._after(action_id, receipt)

    async def _send(self, gesture: Gesture) -> bool:
        """Send the input; on any failure or cancel release held keys. False if the input failed."""
        self._sending = True
        try:
            await self.backend.send(gesture)
            return True
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self.release()
            if not isinstance(exc, Exception):
                raise  # a cancel: the caller is gone, the receipt stays uncertain
            log.warning("gui: an input failed part-way (%s); held keys released", type(exc).__name__)
            return False
        finally:
            self._sending = False

    async def _act_on_element(
        self, tool: str, action_id: str, key: str, act: ElementAct, observation: Observation
    ) -> tuple[Outcome, list[bytes]]:
        """An input on an accessible element: checked live, sent by its interface or by pointer, verified."""
        if self.accessibility is None:
            raise GuiError("invalid_arguments", "this display has no accessibility layer: use x, y instead")
        plan = await self.accessibility.prepare(act)  # refusals here leave no receipt: nothing was done
        self._fresh(observation.id, observation)
        self._check_running()
        self.receipts.reserve(action_id, key)
        if plan.gestures:
            for gesture in plan.gestures:
                if not await self._send(gesture):
                    return uncertain(action_id), []
        else:
            try:
                await self.accessibility.perform(act, plan)
            except Exception as exc:
                message = exc.message if isinstance(exc, GuiError) else f"{type(exc).__name__}: {exc}"
                log.warning("gui: an accessibility input failed (%s)", type(exc).__name__)
                failed = uncertain(action_id)
                failed.message = f"{message}. {failed.message}"
                self.receipts.finish(action_id, failed)
                return failed, []
        receipt = dispatched(
            action_id, tool, element_id=act.element.id, route=plan.route, verification="not checked yet"
        )
        self.receipts.finish(action_id, Outcome(True, receipt))
        await anyio.sleep(self.settle_s)
        after = await self.accessibility.live(act.element)
        outcome, images = await self._after(action_id, receipt)
        new = outcome.data.get("observation") or {}
        window_changed = bool(new) and new["focused_window"]["id"] != observation.screen.window_id
        screen_changed = bool(new) and new["screenshot_sha256"] != observation.sha256
        verified, seen = verify(act, plan.before, after, window_changed, screen_changed)
        outcome.data["outcome_verified"], outcome.data["verification"] = verified, seen
        return outcome, images

    async def _after(self, action_id: str, receipt: dict[str, Any]) -> tuple[Outcome, list[bytes]]:
        """The new observation that answers an input; if it fails, say the input was sent."""
        try:
            observation, png = await self._observe()
        except GuiError as exc:
            sent = bool(receipt["input_dispatched"])
            advice = "do not repeat the input: call gui.observe to see its effect" if sent else OBSERVE_AGAIN
            outcome = Outcome(
                ok=False,
                code="tool_error",
                message=f"{'the input was sent, but ' if sent else ''}the screenshot after it failed "
                f"({exc.message}); {advice}",
                data={"action_id": action_id, "input_dispatched": sent, "retry_safe": not sent},
            )
            self.receipts.finish(action_id, outcome)
            return outcome, []
        done = Outcome(True, {**receipt, "observation": observation})
        self.receipts.finish(action_id, done)
        return done, png

    async def _wait(
        self, tool: str, action_id: str, key: str, arguments: Mapping[str, Any]
    ) -> tuple[Outcome, list[bytes]]:
        """Wait (interrupted by gui.stop), then observe: no input is sent."""
        with anyio.move_on_after(float(arguments["ms"]) / 1000):
            await self._stop_event.wait()
        self._check_running()
        self.receipts.reserve(action_id, key)
        receipt = {"action_id": action_id, "tool": tool, "status": "waited", "input_dispatched": False}
        receipt |= {"outcome_verified": False, "retry_safe": True, "replayed": False, "observation": None}
        return await self._after(action_id, receipt)

    def _fresh(self, observation_id: str, taken: Observation | None = None) -> Observation:
        """The current observation if `observation_id` names it and it is at most 60 s old."""
        current = taken or self._current
        if current is None or current.id != observation_id:
            what = "there is no current observation" if current is None else "it is not the current observation"
            raise GuiError(
                "stale_observation",
                f"observation_id {observation_id[:64]!r} cannot be used: {what} (each observation allows one "
                f"input, and a stop or resume voids it); {OBSERVE_AGAIN}",
            )
        age = self.clock() - current.taken_at
        if age > OBSERVATION_TTL_S:
            self._current = None
            raise GuiError(
                "stale_observation",
                f"observation {observation_id} is {age:.0f} s old; observations expire after "
                f"{OBSERVATION_TTL_S:g} s; {OBSERVE_AGAIN}",
            )
        return current

    def marks(self) -> list[tuple[int, str, tuple[int, int, int, int]]]:
        """The visible elements of the current observation (for the live view), in screen pixels."""
        current = self._current
        if current is None:
            return []
        return [(e.id, e.name, e.bounds) for e in current.elements.values() if e.depth > 0 and e.visible]

    def invalidate(self) -> None:
        """The screen is about to change under the current observation (a launch): it is void."""
        self._current = None

    async def focus(self, window_id: int) -> None:
        """Raise and focus a window; voids the current observation."""
        with self._gate():
            self._check_running()
            self.lock.acquire()
            self._current = None
            if not await self._send(Gesture("focus", window=window_id)):
                raise GuiError("tool_error", f"focusing window {window_id} failed; call gui.windows and retry")

    def ensure_running(self) -> None:
        """Refuse with `stopped` while the stop latch holds (for tools outside `act`, e.g. gui.launch)."""
        self._check_running()

    def _check_running(self) -> None:
        if self.stopped:
            raise GuiError(
                "stopped",
                "input on this device is stopped (gui.stop, or an operator's emergency stop): input is "
                "refused until an operator resumes the device, which no tool can do; do not retry. "
                "After the resume, call gui.observe and act on the new observation",
            )

    async def stop(self) -> dict[str, Any]:
        """Latch the stop, kill an input in flight, release held buttons and modifiers."""
        self.stopped = True
        self._stop_event.set()
        self._current = None
        interrupted = self._sending and self.backend.interrupt()
        released = False
        if self.lock.held and not self._sending:
            released = await self.release()
        return {"stopped": True, "interrupted_input": interrupted, "released": released or interrupted}

    def resume(self) -> dict[str, Any]:
        """Clear the latch; observations from before stay void, so a new one is needed."""
        was = self.stopped
        self.stopped = False
        self._stop_event = anyio.Event()
        self._current = None
        return {"stopped": False, "was_stopped": was, "observation_required": True}

    async def release(self) -> bool:
        """Release buttons 1-3 and modifiers, bounded; True if that worked."""
        try:
            with anyio.fail_after(RELEASE_TIMEOUT_S + 1):
                await self.backend.release()
            return True
        except Exception as exc:
            log.warning("gui: releasing held buttons and keys failed (%s)", type(exc).__name__)
            return False

    def close(self) -> None:
        """The toolset is going away: stop any input and give the display up."""
        if self._sending:
            self.backend.interrupt()
        self._current = None
        self.lock.release()


def _describe(observation: Observation, path: Path, png: bytes) -> dict[str, Any]:
    screen = observation.screen
    return {
        "observation_id": observation.id,
        "width": observation.width,
        "height": observation.height,
        "coordinate_space": "screenshot_pixels",
        "screen_width": screen.width,
        "screen_height": screen.height,
        "focused_window": {"id": screen.window_id, "title": screen.title},
        "expires_in_s": OBSERVATION_TTL_S,
        "screenshot_path": str(path),
        "screenshot_sha256": hashlib.sha256(png).hexdigest(),
    }


def _replayed(stored: Outcome) -> Outcome:
    if not stored.ok:
        return stored
    return Outcome(True, {**stored.data, "replayed": True})


def _window(screen: Screen) -> str:
    return f"{screen.title[:60]!r} (id {screen.window_id}) on a {screen.width}x{screen.height} screen"


def dispatched(action_id: str, tool: str, **extra: Any) -> dict[str, Any]:
    """The receipt of an input sent and not yet verified (its `observation` filled in after)."""
    return {
        "action_id": action_id,
        "tool": tool,
        "status": "dispatched",
        "input_dispatched": True,
        "outcome_verified": False,
        "retry_safe": False,
        "replayed": False,
        **extra,
        "observation": None,
    }
