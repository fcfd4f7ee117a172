"""A person's input through the live view (protocol `ViewInput`), answered with `ViewInputResult`.

Taken only while an operator has the device taken over (`Takeover.operator`: an owner's takeover
at the device takes none from afar), the owner allows it
(`[agent.view] allow_input`) and no emergency stop holds; at most once per `input_id` (a copy
sent again, say after a reconnect, gets the first answer and does nothing); mapped from the
frame's pixels to the screen's; audited like any action, with its kind and who sent it and never
the typed text or keys' meaning beyond the kind.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from enum import StrEnum

from device_agent.audit import AuditLog
from device_agent.screen.source import Action, ScreenSource, SourceFailed
from device_agent.takeover import Takeover
from device_agent.toolsets.gui.rules import GuiError, check_text, parse_key, to_device
from protocol.messages import ViewInput, ViewInputResult

log = logging.getLogger("orrery.agent.screen")

REMEMBERED = 512  # input ids whose answer is kept for copies sent again


class InputCode(StrEnum):
    NOT_TAKEN_OVER = "not_taken_over"
    INPUT_DISALLOWED = "input_disallowed"
    DEVICE_STOPPED = "device_stopped"
    NO_SCREEN = "no_screen"
    INVALID_ARGUMENTS = "invalid_arguments"
    INPUT_FAILED = "input_failed"


class Refusal(Exception):
    def __init__(self, code: InputCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Inputs:
    def __init__(
        self,
        source: ScreenSource | None,
        screen_size: Callable[[], tuple[int, int] | None],
        takeover: Callable[[], Takeover],
        stopped: Callable[[], bool],
        allowed: bool = True,
        audit: AuditLog | None = None,
    ) -> None:
        self.source = source
        self.screen_size = screen_size  # the screen's size in pixels, as the last frame found it
        self.takeover = takeover
        self.stopped = stopped
        self.allowed = allowed
        self.audit = audit
        self._answers: OrderedDict[str, asyncio.Future[ViewInputResult]] = OrderedDict()

    async def take(self, msg: ViewInput) -> ViewInputResult:
        """Carry out `msg` once; a copy of an input already taken (or being taken) gets its answer."""
        known = self._answers.get(msg.input_id)
        if known is not None:
            self._answers.move_to_end(msg.input_id)
            return await asyncio.shield(known)
        answer: asyncio.Future[ViewInputResult] = asyncio.get_running_loop().create_future()
        self._answers[msg.input_id] = answer
        while len(self._answers) > REMEMBERED:
            self._answers.popitem(last=False)
        try:
            result = await self._take(msg)
        except BaseException as exc:  # cancelled: a copy must not wait forever
            answer.set_exception(exc)
            answer.exception()  # retrieved: a copy that never comes must not make asyncio warn
            self._answers.pop(msg.input_id, None)
            raise
        answer.set_result(result)
        return result

    async def _take(self, msg: ViewInput) -> ViewInputResult:
        by = msg.by or self.takeover().by
        try:
            action = self._admit(msg)
            assert self.source is not None
            await self.source.send(action)
        except Refusal as exc:
            self._audit(msg, by, "denied", "failure", exc.code)
            return ViewInputResult(input_id=msg.input_id, ok=False, code=exc.code, message=exc.message)
        except SourceFailed as exc:
            self._audit(msg, by, "allowed", "failure", InputCode.INPUT_FAILED)
            log.warning("forwarded %s input %s failed: %s", msg.kind, msg.input_id, exc)
            return ViewInputResult(input_id=msg.input_id, ok=False, code=InputCode.INPUT_FAILED, message=str(exc))
        self._audit(msg, by, "allowed", "success", None)
        return ViewInputResult(input_id=msg.input_id, ok=True)

    def _admit(self, msg: ViewInput) -> Action:
        """The action to send, or a `Refusal` saying why none is."""
        if self.source is None:
            raise Refusal(InputCode.NO_SCREEN, "this device has no screen to send input to")
        if not self.allowed:
            raise Refusal(InputCode.INPUT_DISALLOWED, "the device's owner does not allow input through the live view")
        takeover = self.takeover()
        if not takeover.operator:
            # The owner's own takeover is theirs at the device: nobody's clicks come from afar then.
            why = (
                "the device's owner has it taken over at the device: input through the live view waits for "
                "their handback"
                if takeover.owner
                else "take the device over first: input is taken only while an operator has it"
            )
            raise Refusal(InputCode.NOT_TAKEN_OVER, why)
        if self.stopped():
            raise Refusal(InputCode.DEVICE_STOPPED, "the device is stopped: resume it before sending input")
        return self._action(msg)

    def _action(self, msg: ViewInput) -> Action:
        try:
            if msg.kind == "key":
                if not msg.keys:
                    raise Refusal(InputCode.INVALID_ARGUMENTS, "a key input needs keys, e.g. 'ctrl+s'")
                parse_key(msg.keys)
                return Action("key", keys=msg.keys)
            if msg.kind == "type":
                check_text(msg.text or "")
                return Action("type", text=msg.text or "")
        except GuiError as exc:
            raise Refusal(InputCode.INVALID_ARGUMENTS, exc.message) from None
        x, y = self.point(msg)
        return Action(msg.kind, x, y, button=msg.button, direction=msg.direction or "down")

    def point(self, msg: ViewInput) -> tuple[int, int]:
        """The screen pixel under the centre of the frame pixel `msg` aims at."""
        if msg.x is None or msg.y is None or msg.frame_width is None or msg.frame_height is None:
            raise Refusal(InputCode.INVALID_ARGUMENTS, f"a {msg.kind} needs x, y, frame_width and frame_height")
        if msg.x >= msg.frame_width or msg.y >= msg.frame_height:
            raise Refusal(
                InputCode.INVALID_ARGUMENTS,
                f"({msg.x}, {msg.y}) is outside the {msg.frame_width}x{msg.frame_height} frame",
            )
        screen = self.screen_size()
        if screen is None:
            raise Refusal(InputCode.NO_SCREEN, "the screen's size is not known yet: watch it first")
        return to_device(msg.x, msg.y, (msg.frame_width, msg.frame_height), screen)

    def _audit(self, msg: ViewInput, by: str, decision: str, status: str, code: str | None) -> None:
        if self.audit is None:
            return
        try:
            # The kind and who sent it; never the text or the point (SPEC section 5: no arguments).
            self.audit.record(
                tool=f"view.{msg.kind}",
                call_id=msg.input_id,
                kind=msg.kind,
                by=by,
                decision=decision,
                status=status,
                error_code=code,
                reason="forwarded input through the live view",
            )
        except OSError as exc:
            log.error("could not write the audit line of forwarded input %s: %s", msg.input_id, exc)
