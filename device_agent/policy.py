"""What the device owner allows the agent to do (SPEC section 5, "Policy").

The policy is a frozen value built once from the agent's configuration. Toolsets read it from
their `ToolsetContext` at call time, never at build time, so the agent can swap in a new policy
(for example with the kill switch on) without rebuilding the MCP servers.

Every check raises `PolicyDenied`, whose `code` is the wire error code `policy_denied` (SPEC
section 4). Messages are written for whoever acts next, often an LLM planner: they say what was
refused and what would be accepted instead.

The allow and deny lists are guardrails against mistakes, not a sandbox: a program that is
allowed (a shell, an interpreter) can run anything the agent's OS user can. Owners who need a
real boundary should narrow `shell_allow` to programs that cannot start other programs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from device_agent.browser_net import URL_TOOLS, url_refusal
from protocol.messages import ToolAnnotations, ToolSpec

# Environment variable names containing one of these (case-insensitive) never reach a child
# process: the agent's own token lives in the environment, and so do the owner's cloud keys.
DEFAULT_SCRUB_ENV: tuple[str, ...] = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "API_KEY",
    "APIKEY",
    "PRIVATE_KEY",
    "ACCESS_KEY",
    "CREDENTIAL",
    # Redundant with the substrings above, listed so the intent survives an edit of them.
    "ORRERY_AGENT_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


@dataclass(frozen=True)
class Policy:
    """Limits applied by the built-in toolsets; defaults match SPEC section 5."""

    # None means any program (the owner enrolled the device to be driven); otherwise program
    # basenames (matched when argv[0] is a bare name found on PATH) or absolute paths.
    shell_allow: tuple[str, ...] | None = None
    # Always refused, checked before the allow list; matched on the basename in any spelling.
    shell_deny: tuple[str, ...] = ()
    max_output_bytes: int = 1_000_000
    default_timeout_s: float = 60
    max_timeout_s: float = 3600
    max_file_bytes: int = 10_000_000
    unattended: bool = False
    # When on, every tool that is not read-only is refused; observation keeps working so an
    # operator can still see what the device is doing.
    kill_switch: bool = False
    scrub_env: tuple[str, ...] = DEFAULT_SCRUB_ENV
    # The private origins (scheme, host, port) the `browser` profile may open; see browser_net.
    browser_private_origins: frozenset[tuple[str, str, int]] = frozenset()


class PolicyDenied(Exception):
    """An action the device policy refuses; `str(exc)` is the message for the caller."""

    code = "policy_denied"


def check_program(policy: Policy, argv0: str) -> None:
    """Refuse `argv0` if the deny list names it or an allow list exists and does not."""
    if _spellings(argv0) & _normalized(policy.shell_deny):
        raise PolicyDenied(
            f"program {argv0!r} is on this device's shell deny list; do not retry it, "
            "achieve the goal with another program or another tool"
        )
    if policy.shell_allow is None or _is_allowed(policy.shell_allow, argv0):
        return
    allowed = ", ".join(policy.shell_allow) or "(nothing)"
    raise PolicyDenied(
        f"program {argv0!r} is not on this device's shell allow list; allowed programs: {allowed}. "
        "Use one of them by name (or by the absolute path listed)"
    )


def _spellings(argv0: str) -> set[str]:
    """Every name the deny list may know `argv0` by: as given, its basename, where PATH finds it."""
    names = {argv0, PurePath(argv0).name}
    path = shutil.which(argv0) if "/" not in argv0 else argv0
    if path is not None and os.path.isabs(path):
        names |= {os.path.normpath(path), os.path.realpath(path)}
    return names


def _is_allowed(allow: tuple[str, ...], argv0: str) -> bool:
    if "/" not in argv0:
        if argv0 in allow:
            return True
        # An allow list may name absolute paths; a bare name is allowed if PATH resolves it there.
        found = shutil.which(argv0)
        return found is not None and os.path.normpath(found) in _normalized(allow)
    # A path spelling matches only an absolute entry: a basename entry must not admit a
    # same-named script dropped into the workspace (`./ls`).
    return os.path.isabs(argv0) and os.path.normpath(argv0) in _normalized(allow)


def _normalized(entries: tuple[str, ...]) -> set[str]:
    return {os.path.normpath(entry) if os.path.isabs(entry) else entry for entry in entries}


def contain(workspace: Path, relative: str, *, follow_symlinks: bool = True) -> Path:
    """Resolve `relative` inside `workspace`, refusing anything that would land outside it.

    Symlinks and `..` are resolved before the check, so a link inside the workspace that points
    outside is refused. With `follow_symlinks=False` the last component is not resolved (the
    parent still is): the path names the link itself, which is what deleting or listing needs.
    """
    hint = "use a path relative to the workspace, such as 'notes/todo.txt', without '..'"
    if "\x00" in relative:
        raise PolicyDenied(f"path {relative!r} contains a NUL byte; {hint}")
    if PurePath(relative).is_absolute() or relative.startswith(("/", "\\")):
        raise PolicyDenied(f"absolute path {relative!r} is refused: {hint}")
    root = workspace.resolve()
    lexical = PurePath(relative)
    try:
        if follow_symlinks or lexical.name in ("", ".", ".."):
            target = (root / lexical).resolve()
        else:
            target = (root / lexical.parent).resolve() / lexical.name
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop (Python 3.11)
        raise PolicyDenied(f"path {relative!r} cannot be resolved ({exc}); {hint}") from exc
    if not target.is_relative_to(root):
        raise PolicyDenied(f"path {relative!r} leads outside the workspace; {hint}")
    return target


def child_env(policy: Policy, base: Mapping[str, str]) -> dict[str, str]:
    """`base` without the variables whose names look like secrets (see `Policy.scrub_env`)."""
    needles = [needle.upper() for needle in policy.scrub_env]
    return {name: value for name, value in base.items() if not any(needle in name.upper() for needle in needles)}


def check_action(policy: Policy, tool_is_read_only: bool) -> None:
    """Refuse a tool that changes the device while the kill switch is on."""
    if policy.kill_switch and not tool_is_read_only:
        raise PolicyDenied(
            "the device owner has turned on the kill switch: actions are refused until it is "
            "turned off; read-only tools (files.read, files.list, system.*) still work"
        )


# Arguments that make a call write a file: a browser tool given `filename` saves its output
# (a snapshot, a response body, a screenshot) into the workspace instead of returning it.
WRITE_ARGUMENTS: dict[str, tuple[str, ...]] = {"browser": ("filename",)}
# Tools whose `filename` names a file they read, not one they write.
READS_FILENAME = ("browser.browser_run_code_unsafe", "browser.browser_set_storage_state")


def writes_file(tool: str, arguments: dict[str, Any]) -> bool:
    """Whether this call writes a file because of its arguments (see `WRITE_ARGUMENTS`)."""
    names = WRITE_ARGUMENTS.get(tool.partition(".")[0], ())
    return tool not in READS_FILENAME and any(arguments.get(name) not in (None, "") for name in names)


WRITE = ToolAnnotations(read_only=False, idempotent=False, destructive=True)


def call_spec(spec: ToolSpec, arguments: dict[str, Any]) -> ToolSpec:
    """`spec` as this call uses it: a read-only tool that writes a file here is a write (the kill
    switch, a stop, the safety budgets and approvals treat it as one)."""
    if writes_file(spec.name, arguments) and (spec.annotations.read_only or not spec.annotations.destructive):
        return spec.model_copy(update={"annotations": WRITE, "tool_type": "action"})
    return spec


async def argument_refusal(policy: Policy, tool: str, arguments: dict[str, Any]) -> dict[str, str] | None:
    """`{"reason", "message"}` refusing a call for its arguments (a browser URL that is not a
    public http(s) one, see device_agent.browser_net), or None."""
    url = arguments.get("url")
    if tool not in URL_TOOLS or url is None:
        return None
    if not isinstance(url, str):
        return {"reason": "url_invalid", "message": f"{tool}'s url must be a string"}
    refusal = await url_refusal(url, policy.browser_private_origins)
    return None if refusal is None else {"reason": refusal.reason, "message": refusal.message}
