"""The router: a command's tool found in the namespaced catalogue of the agent's toolsets, the
checks it must pass (arguments, the emergency stop, the kill switch, policy, approvals, safety
budgets, the audit line), the call through its toolset's host (`device_agent.toolset_host`),
and the result made a `Result` within the output caps (SPEC section 5).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from mcp.types import (
    CallToolResult,
    ImageContent,
    TextContent,
)
from pydantic import TypeAdapter

from device_agent.approvals import ASK_TOOL, REQUEST_TOOL
from device_agent.audit import AuditLog
from device_agent.guards import Guards
from device_agent.killswitch import HOW_TO_TURN_OFF
from device_agent.policy import Policy, argument_refusal, call_spec
from device_agent.stop import StopLatch
from device_agent.takeover import TAKEN_OVER, Takeover
from device_agent.toolset_host import ToolsetHost, ToolsetUnavailable, error_result
from device_agent.toolsets.base import failure, nul_field, nul_message
from protocol.errors import MAX_ERROR_MESSAGE_CHARS, RESULT_ERROR_CODES
from protocol.messages import Command, ErrorInfo, Result, ToolSpec

log = logging.getLogger("orrery.agent.router")

# Structured content made JSON-shaped, as the wire would (`TypeAdapter.dump_python(mode="json")`
# without its wrapper's keyword handling, a third of the cost for a small value).
_JSON_SHAPED = TypeAdapter(Any).serializer.to_python
_COMPACT_JSON = TypeAdapter(Any).serializer.to_json  # pydantic's JSON: no spaces, UTF-8, bytes
# `json.dumps(value, default=str)`, which measures a result against the cap, without the encoder
# json.dumps builds for every call it makes with an argument of its own.
_ENCODE = json.JSONEncoder(default=str).encode

MAX_IMAGE_BYTES = 3 * 1024 * 1024  # base64 screenshots pass the result cap up to this, for vision models


# A tool that takes `timeout_s` enforces it itself; the router waits this much longer before it
# gives up on the call, so the tool can kill its processes and return their partial output.
TOOL_TIMEOUT_GRACE_S = 3.0

LimitSource = Literal["command", "argument", "deadline", "device"]


@dataclass(frozen=True)
class CallLimit:
    """How long one command may run, and which setting decided it (every timeout error names it)."""

    seconds: float
    source: LimitSource = "command"

    def describe(self) -> str:
        s = self.seconds
        return {
            "command": f"the command's timeout_s ({s:g} s); raise it if the work needs longer",
            "argument": f"the tool argument timeout_s ({s:g} s); raise it (up to the command's timeout_s)",
            "deadline": f"the batch deadline (the node's timeout_s): {s:g} s were left when the command started",
            "device": f"this device's maximum of {s:g} s per command; split the work into shorter commands",
        }[self.source]


class Router:
    """Routes `namespace.tool` commands to toolset hosts, applying the device policy."""

    def __init__(
        self,
        policy: Policy,
        audit: AuditLog,
        approval_required: list[str],
        max_result_bytes: int,
        on_kill: Callable[[], int] = lambda: 0,
        guards: Guards | None = None,
        stop_latch: StopLatch | None = None,
        takeover: Takeover | None = None,
    ) -> None:
        self.policy = policy
        self.stop_latch = stop_latch or StopLatch()
        self.takeover = takeover or Takeover()
        self.audit = audit
        # run-time kill switch, safety budgets, audit line before the call
        self.guards = guards or Guards(audit)
        self.approval_required = tuple(approval_required)  # fixed for the agent's life (answers are cached)
        self._asks: dict[str, bool] = {}  # needs_approval's answer per tool (the patterns never change)
        self.max_result_bytes = max_result_bytes
        self.hosts: dict[str, ToolsetHost] = {}
        self.kill_running = on_kill
        self.on_tools_changed: Callable[[], None] | None = None  # the agent sends `tools_changed`

    def tools_changed(self) -> None:
        if self.on_tools_changed is not None:
            self.on_tools_changed()

    def add(self, host: ToolsetHost) -> None:
        if host.namespace in self.hosts:
            raise ValueError(
                f"toolset namespace '{host.namespace}' is configured twice; give each MCP server its own namespace"
            )
        self.hosts[host.namespace] = host

    async def start(self) -> None:
        for host in self.hosts.values():
            try:
                await host.start()
            except (ToolsetUnavailable, TimeoutError) as exc:
                log.error("%s", exc)
        names = [t.name for h in self.hosts.values() for t in h.catalogue()]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate tool names: {sorted(dupes)}")

    async def stop(self) -> None:
        for host in self.hosts.values():
            await host.stop()

    def catalogue(self) -> list[ToolSpec]:
        return [spec for host in self.hosts.values() for spec in host.catalogue()]

    def needs_approval(self, tool: str) -> bool:
        """Whether `tool` waits for a person's approval before it runs (`device_agent.approvals`):
        `approval.request` and `approval.ask_person` always; a tool on `approval_required` unless
        the agent runs unattended."""
        if tool in (REQUEST_TOOL, ASK_TOOL):
            return True
        if self.policy.unattended:
            return False
        asks = self._asks.get(tool)
        if asks is None:  # patterns matched once per tool (asked twice for every command)
            asks = self._asks[tool] = any(fnmatch.fnmatch(tool, p) for p in self.approval_required)
        return asks

    def read_only(self, tool: str) -> bool:
        """Whether `tool` is a read-only tool of this device (unknown tools are not)."""
        host = self.hosts.get(tool.partition(".")[0])
        spec = host.spec(tool) if host else None
        return spec is not None and spec.annotations.read_only

    async def call(self, cmd: Command, batch_id: str, limit: CallLimit | float, approved: bool = False) -> Result:
        """Run `cmd` under `limit` (the command's timeout_s, or less if the batch deadline is nearer).
        `approved`: the caller holds a recorded approval for it (a tool that needs one is refused
        without it).

        A tool whose input schema has a `timeout_s` property runs under the limit itself: it is
        passed when the call did not give one, and an explicit one above the limit is lowered to it.
        """
        started = time.monotonic_ns()
        if not isinstance(limit, CallLimit):
            limit = CallLimit(float(limit))
        if limit.seconds > self.policy.max_timeout_s:
            limit = CallLimit(self.policy.max_timeout_s, "device")
        namespace, _, name = cmd.tool.partition(".")
        host = self.hosts.get(namespace)
        spec = host.spec(cmd.tool) if host else None
        audit = {"batch_id": batch_id, "call_id": cmd.call_id, "tool": cmd.tool}
        if host is None or spec is None:
            known = ", ".join(sorted(t.name for h in self.hosts.values() for t in h.catalogue())[:40])
            return self._finish(
                cmd,
                namespace,
                started,
                audit,
                "denied",
                error_result("unknown_tool", f"this device has no tool '{cmd.tool}'; it has: {known}"),
            )
        nul = nul_field(cmd.tool, cmd.arguments) if host.strict_arguments else None
        if nul is not None:  # checked before anything else looks at the strings
            return self._finish(
                cmd,
                namespace,
                started,
                audit,
                "denied",
                failure("invalid_arguments", nul_message(cmd.tool, nul), field=nul),
            )
        unknown = _undeclared(cmd.arguments, spec) if host.strict_arguments else []
        if unknown:
            return self._finish(
                cmd,
                namespace,
                started,
                audit,
                "denied",
                error_result("invalid_arguments", _undeclared_message(spec, unknown)),
            )
        spec = call_spec(spec, cmd.arguments)  # a read-only tool told to write a file is a write
        refused_arguments = await argument_refusal(self.policy, cmd.tool, cmd.arguments)
        if refused_arguments is not None:
            denied = failure("policy_denied", refused_arguments["message"], reason=refused_arguments["reason"])
            return self._finish(cmd, namespace, started, audit, "denied", denied)
        if self.stop_latch.stopped and not spec.annotations.read_only:
            refusal = error_result("device_stopped", self.stop_latch.refusal(cmd.tool))
            return self._finish(cmd, namespace, started, audit, "denied", refusal)
        if self.takeover.refuses(cmd.tool, spec.annotations.read_only):
            refusal = error_result(TAKEN_OVER, self.takeover.refusal())
            return self._finish(cmd, namespace, started, audit, "denied", refusal)
        denial = self._policy_denial(cmd.tool, spec, approved)
        if denial:
            return self._finish(cmd, namespace, started, audit, "denied", error_result("policy_denied", denial))
        refused = self.guards.before(audit, spec)
        if refused is not None:
            return self._finish(cmd, namespace, started, audit, "denied", error_result(*refused))
        arguments, limit, enforced = with_timeout(spec, cmd.arguments, limit)
        try:
            raw = await host.call(name, arguments, limit.seconds, TOOL_TIMEOUT_GRACE_S if enforced else 0.0)
        except ToolsetUnavailable as exc:
            raw = error_result("tool_error", f"{exc}; the toolset is being restarted, so the call may be retried")
        return self._finish(cmd, namespace, started, audit, "allowed", _name_limit(raw, limit))

    def refused_now(self, cmd: Command, batch_id: str) -> Result | None:
        """The refusal of `cmd` that no decision could change (the emergency stop, the kill switch,
        a breached safety budget), so that nobody is asked to approve a command that would be
        refused anyway; None if there is none now (the call's own checks still run later)."""
        namespace = cmd.tool.partition(".")[0]
        host = self.hosts.get(namespace)
        spec = host.spec(cmd.tool) if host else None
        if spec is None:
            return None
        spec = call_spec(spec, cmd.arguments)
        ann = spec.annotations
        refusal: CallToolResult | None = None
        if self.stop_latch.stopped and not ann.read_only:
            refusal = error_result("device_stopped", self.stop_latch.refusal(cmd.tool))
        elif self.takeover.refuses(cmd.tool, ann.read_only):
            refusal = error_result(TAKEN_OVER, self.takeover.refusal())
        elif self._kill_switch_refuses(spec):
            refusal = error_result("policy_denied", _kill_switch_message(cmd.tool))
        elif (breach := self.guards.budgets.refusal(ann.read_only, ann.destructive)) is not None:
            refusal = error_result("budget_exceeded", breach.refusal(spec.name))
        if refusal is None:
            return None
        audit = {"batch_id": batch_id, "call_id": cmd.call_id, "tool": cmd.tool}
        return self._finish(cmd, namespace, time.monotonic_ns(), audit, "denied", refusal)

    def _kill_switch_refuses(self, spec: ToolSpec) -> bool:
        harmless = spec.annotations.read_only or (spec.annotations.idempotent and not spec.annotations.destructive)
        # A harmless tool runs whatever the switch says: its file is looked at only for the others.
        return not harmless and (self.policy.kill_switch or self.guards.kill_switch_on())

    def _policy_denial(self, tool: str, spec: ToolSpec, approved: bool) -> str | None:
        if self._kill_switch_refuses(spec):
            return _kill_switch_message(tool)
        if not approved and self.needs_approval(tool):
            return f"'{tool}' needs a person's approval before it runs, and none was given for this call"
        return None

    def _finish(
        self, cmd: Command, namespace: str, started: int, audit: dict[str, Any], decision: str, raw: CallToolResult
    ) -> Result:
        duration = (time.monotonic_ns() - started + 500) // 1000 / 1000  # ms to the µs, without rounding a float
        result = self._convert(cmd.call_id, namespace, raw, duration)
        self.guards.after(audit, decision, result)
        return result

    def _convert(self, call_id: str, namespace: str, raw: CallToolResult, duration_ms: float) -> Result:
        # Structured content as the wire carries it (tuples become lists, ...): a built-in tool
        # called in process hands over what it built. Shaped here, for both paths, so that the
        # result is not copied to hold the shaped content.
        content = None if raw.structured_content is None else _JSON_SHAPED(raw.structured_content, mode="json")
        if raw.is_error:
            return self._failure(call_id, namespace, raw, content or {}, duration_ms)
        value = self._cap(content if content is not None else _value(raw))
        images = result_images(raw)
        if images and isinstance(value, dict):
            value = {**value, "images": images}
        return Result(call_id=call_id, status="success", result=value, namespace=namespace, duration_ms=duration_ms)

    def _failure(
        self, call_id: str, namespace: str, raw: CallToolResult, detail: dict[str, Any], duration_ms: float
    ) -> Result:
        message = str(detail.get("message") or _text(raw) or "the tool failed")
        # The SDK reports arguments that fail the input schema as untyped error text.
        default = "invalid_arguments" if "validation error" in message else "tool_error"
        code = str(detail.get("code") or default)
        extra = {k: v for k, v in detail.items() if k not in ("code", "message")}
        return Result(
            call_id=call_id,
            status="uncertain" if code == "uncertain" else "failure",
            result=self._cap(extra) if extra else None,
            error=ErrorInfo(
                code=code if code in RESULT_ERROR_CODES else "tool_error", message=message[:MAX_ERROR_MESSAGE_CHARS]
            ),
            namespace=namespace,
            duration_ms=duration_ms,
        )

    def _cap(self, value: Any) -> Any:
        """SPEC section 5 output caps: oversized results are truncated with a marker, never dropped.

        `value` is JSON-shaped (structured content shaped by `_JSON_SHAPED`, or text parts)."""
        if _certainly_fits(value, self.max_result_bytes):
            return value
        encoded = _ENCODE(value)
        size = len(encoded)
        if size <= self.max_result_bytes:
            return value
        text = value if isinstance(value, str) else encoded
        keep = self.max_result_bytes // 2
        return {"truncated": True, "original_bytes": size, "preview": text[:keep]}


def _certainly_fits(value: Any, limit: int) -> bool:
    """Whether the cap's measure of a JSON-shaped `value` (its `json.dumps` length) is certainly
    within `limit`, told from pydantic's compact JSON of it for a quarter of the measure's cost.

    json.dumps writes at most 6 characters for each byte of that JSON: `\\u007f` for a DEL,
    `\\uXXXX` for a 2- or 3-byte character (a surrogate pair for a 4-byte one), `, ` and `: ` for
    `,` and `:`, `Infinity` for `null`, a float's exponent a character longer (`1e-07` for
    `1e-7`); every other escape, number and literal alike (tests/unit/device_agent/
    test_result_cap.py checks the bound). False means: measure it.
    """
    try:
        return 6 * len(_COMPACT_JSON(value)) <= limit
    except ValueError:  # text UTF-8 cannot hold (a lone surrogate)
        return False


def with_timeout(spec: ToolSpec, arguments: dict[str, Any], limit: CallLimit) -> tuple[dict[str, Any], CallLimit, bool]:
    """The arguments to send, the limit the call runs under, and whether the tool enforces it.

    A tool that declares `timeout_s` gets the limit as that argument unless the call gave a
    smaller one (then that is the limit); a value the tool would refuse anyway is left to it.
    """
    prop = (spec.input_schema.get("properties") or {}).get("timeout_s")
    if not isinstance(prop, dict):
        return arguments, limit, False
    given = arguments.get("timeout_s")
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int | float) or given <= 0:
            return arguments, limit, True  # not a valid limit: the tool's own validation says so
        if given < limit.seconds:
            return arguments, CallLimit(float(given), "argument"), True
    value: float | int = limit.seconds
    if "integer" in _types(prop) and "number" not in _types(prop):
        value = max(1, math.floor(limit.seconds))
    return {**arguments, "timeout_s": value}, limit, True


def _types(schema: dict[str, Any]) -> set[str]:
    kinds = schema.get("type")
    found = {kinds} if isinstance(kinds, str) else set(kinds or [])
    for branch in schema.get("anyOf") or schema.get("oneOf") or []:
        if isinstance(branch, dict):
            found |= _types(branch)
    return found


def _name_limit(raw: CallToolResult, limit: CallLimit) -> CallToolResult:
    """A timeout error says which limit was hit (the command's, the argument's, the deadline, the device's)."""
    detail = raw.structured_content if isinstance(raw.structured_content, dict) else None
    if not raw.is_error or detail is None or detail.get("code") != "timeout":
        return raw
    message = f"{detail.get('message') or _text(raw) or 'the tool timed out'}; limit hit: {limit.describe()}"
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content={**detail, "message": message, "limit": limit.source, "limit_s": limit.seconds},
        is_error=True,
    )


# Arguments that moved to a tool of their own, so the message can point the caller there.
MOVED_ARGUMENTS = {("files.write", "append"): "to add to the end of a file use files.append"}


def _undeclared(arguments: dict[str, Any], spec: ToolSpec) -> list[str]:
    declared = spec.input_schema.get("properties") or {}
    if arguments.keys() <= declared.keys():  # the usual answer, without a loop in Python
        return []
    return sorted(k for k in arguments if k not in declared)


def _undeclared_message(spec: ToolSpec, unknown: list[str]) -> str:
    declared = sorted(spec.input_schema.get("properties") or {})
    hints = [MOVED_ARGUMENTS[(spec.name, k)] for k in unknown if (spec.name, k) in MOVED_ARGUMENTS]
    return (
        f"{spec.name} has no argument {', '.join(repr(k) for k in unknown)}; its arguments are "
        f"{', '.join(declared) or 'none'}" + "".join(f"; {h}" for h in hints)
    )


def _text(raw: CallToolResult) -> str:
    return "\n".join(c.text for c in raw.content if isinstance(c, TextContent))


def result_images(raw: CallToolResult) -> list[dict[str, Any]]:
    """Image parts of a structured result, kept out of the text cap (a model may need to see them)."""
    if raw.structured_content is None or raw.is_error:
        return []
    images = [c for c in raw.content if isinstance(c, ImageContent)]
    # Over the cap, the newest images win: a tool lists its most useful one last (the gui
    # toolset's marked screenshot comes after the plain one), and a model is shown the last.
    out: list[dict[str, Any]] = []
    total = 0
    for c in reversed(images):
        total += len(c.data)
        if total > MAX_IMAGE_BYTES:
            out.append({"type": "image", "mime_type": c.mime_type, "omitted": f"over {MAX_IMAGE_BYTES} bytes"})
        else:
            out.append({"type": "image", "mime_type": c.mime_type, "data": c.data})
    return out[::-1]


def _value(raw: CallToolResult) -> Any:
    """The result of a tool without structured content: its text; images as base64 parts."""
    parts: list[Any] = []
    for c in raw.content:
        if isinstance(c, TextContent):
            parts.append(c.text)
        elif isinstance(c, ImageContent):
            parts.append({"type": "image", "mime_type": c.mime_type, "data": c.data})
        else:
            parts.append(c.model_dump(mode="json"))
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    return parts or None


__all__ = ["CallLimit", "Router", "ToolsetHost"]


def _kill_switch_message(tool: str) -> str:
    return (
        f"the device owner has switched off action tools (kill switch), so '{tool}' is refused; "
        f"only read-only tools may run until {HOW_TO_TURN_OFF}"
    )
