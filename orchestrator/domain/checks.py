"""Checks of a DAG against the tool catalogues of the devices its nodes may run on (SPEC section 3,
validation at submission): tool arguments against their input schemas, retry settings a tool makes
moot, and what a device's reported policy would refuse. Pure: the caller hands in the devices.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator
from referencing import Registry

from orchestrator.domain import templates
from orchestrator.domain.model import AdminState, CommandSpec, DagSpec, NodeKind, NodeSpec
from orchestrator.domain.placement import DeviceView, capable, signature
from orchestrator.domain.problems import Problem

REFERENCE = "${nodes."  # SPEC section 2: `${nodes.<id>...}` is filled in at run time
MAX_ERRORS_PER_COMMAND = 10
# Errors about an object's keys, which a reference in one of its values cannot change.
_KEY_VALIDATORS = frozenset(
    {"required", "additionalProperties", "dependentRequired", "propertyNames", "minProperties", "maxProperties"}
)
# No `$ref` is ever fetched from the network: a device's schema is judged by what it says itself.
_NO_REMOTE: Registry[Any] = Registry()


@dataclass(frozen=True)
class CatalogDevice:
    """A device as the submission checks see it: placement facts, tool catalogue, policy."""

    view: DeviceView
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> ToolSpec as dict
    policy: Mapping[str, Any] | None = None  # `info.policy` as the agent reported it (None: unknown)

    @property
    def name(self) -> str:
        return self.view.name or self.view.id


@dataclass(frozen=True)
class SubmissionWarning:
    """Something accepted that probably does not do what its author meant."""

    code: str
    node_id: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "node_id": self.node_id, "message": self.message}


def candidates(node: NodeSpec, devices: Iterable[CatalogDevice]) -> list[CatalogDevice]:
    """Non-revoked devices the node's placement allows and that offer every tool it uses."""
    return [d for d in devices if d.view.admin is not AdminState.REVOKED and capable(node, d.view)]


# A tool's input schema with its validator compiled (None: the schema cannot be used).
Judge = tuple[Mapping[str, Any], Validator | None]


class Catalog:
    """The devices a whole DAG is checked against, and what the checks of its nodes share: the
    candidate devices of each placement signature and the distinct input schemas of a tool among
    them (compiled once), so a DAG of thousands of alike nodes is not judged node x device."""

    def __init__(self, devices: Iterable[CatalogDevice]) -> None:
        self.devices = list(devices)
        self._able: dict[Hashable, list[CatalogDevice]] = {}
        self._judges: dict[tuple[Hashable, str], list[Judge]] = {}

    def candidates(self, node: NodeSpec) -> list[CatalogDevice]:
        """`candidates(node, devices)`; the list is shared by alike nodes: do not change it."""
        key = signature(node)
        able = self._able.get(key)
        if able is None:
            able = self._able[key] = candidates(node, self.devices)
        return able

    def judges(self, node: NodeSpec, tool: str) -> list[Judge]:
        """The distinct input schemas of `tool` on the node's candidates, first seen first."""
        key = (signature(node), tool)
        found = self._judges.get(key)
        if found is None:
            schemas: dict[str, Mapping[str, Any]] = {}
            for d in self.candidates(node):
                schema = (d.tools.get(tool) or {}).get("input_schema")
                if isinstance(schema, Mapping):
                    schemas.setdefault(json.dumps(schema, sort_keys=True, default=str), schema)
            found = self._judges[key] = [(schema, _validator(schema)) for schema in schemas.values()]
        return found


def catalog(devices: Sequence[CatalogDevice] | Catalog) -> Catalog:
    return devices if isinstance(devices, Catalog) else Catalog(devices)


# ---------------------------------------------------------------- arguments


def argument_problems(spec: DagSpec, devices: Sequence[CatalogDevice] | Catalog) -> list[Problem]:
    """`invalid_arguments` for every command (and verify command) whose arguments fit the input
    schema of its tool on none of the node's candidate devices (arguments that fit one of them
    are accepted). An argument that is exactly a fan-out node's `${nodes.<id>.output}` is judged
    as the object it will be (a map from device name to output)."""
    fleet = catalog(devices)
    fanned = {n.id for n in spec.nodes if n.for_each is not None}
    problems: list[Problem] = []
    for node in spec.nodes:
        listed = [("command", i, c) for i, c in enumerate(node.commands)] if node.kind is NodeKind.TOOL else []
        listed += [("verify", i, c) for i, c in enumerate(node.verify)]
        for label, index, command in listed:
            typed, maps = _typed(command, fanned)
            for where, said in _command_errors(typed, fleet.judges(node, command.tool)):
                message = said
                if where in maps:
                    message = (
                        f"argument '{where}' is ${{nodes.{maps[where]}.output}}, a map from device name to output "
                        f"(node '{maps[where]}' fans out), which {command.tool} does not take here; use one "
                        f"device's: ${{nodes.{maps[where]}.output.<device>...}}"
                    )
                what = "command" if label == "command" else "verify command"
                problems.append(
                    Problem(
                        "invalid_arguments",
                        f"node '{node.id}' {what} {index} ({command.tool}): {message}",
                        {"node": node.id, "node_id": node.id, label: index, "tool": command.tool, "field": where},
                    )
                )
    return problems


def _typed(command: CommandSpec, fanned: Collection[str]) -> tuple[CommandSpec, dict[str, str]]:
    """`command` with each top-level argument that is a fan-out node's whole output replaced by an
    object, and those arguments (name -> node)."""
    if not fanned:
        return command, {}
    maps = {k: n for k, v in command.arguments.items() if (n := templates.whole_output(v, fanned)) is not None}
    if not maps:
        return command, {}
    arguments = {k: ({} if k in maps else v) for k, v in command.arguments.items()}
    return command.model_copy(update={"arguments": arguments}), maps


def _command_errors(command: CommandSpec, judges: Iterable[Judge]) -> list[tuple[str, str]]:
    best: list[tuple[str, str]] | None = None
    for schema, validator in judges:
        errors = _schema_errors(command.tool, command.arguments, schema, validator)
        if not errors:
            return []  # one candidate takes them: accepted
        if best is None or len(errors) < len(best):
            best = errors
    return best or []


def schema_errors(tool: str, arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each way `arguments` break `schema`; [] if they fit, or if the schema
    cannot be used (a device's broken schema is not the submitter's fault; the device checks)."""
    return _schema_errors(tool, arguments, schema, _validator(schema) if schema else None)


def _schema_errors(
    tool: str, arguments: Mapping[str, Any], schema: Mapping[str, Any], validator: Validator | None
) -> list[tuple[str, str]]:
    if not schema or validator is None:
        return []
    try:
        found = list(_limited(validator.iter_errors(dict(arguments))))
    except Exception:  # any failure of a device's schema means "cannot judge", never a 500
        return []
    out: dict[str, str] = {}
    for error in found:
        if error.validator not in _KEY_VALIDATORS and has_reference(error.instance):
            continue  # `${...}` becomes its value at run time, of a type we cannot know yet
        for where, message in _describe(tool, error, schema):
            out.setdefault(where, message)
    return list(out.items())[:MAX_ERRORS_PER_COMMAND]


# Compiled validators by schema text (key order kept: it orders the errors). A memo of a pure
# function: checking a schema against its meta-schema costs milliseconds, and every submission
# to the same fleet brings the same few schemas. Bounded: emptied when full.
_VALIDATORS: dict[str, tuple[Validator | None]] = {}
_MAX_VALIDATORS = 512


def _validator(schema: Mapping[str, Any]) -> Validator | None:
    """A validator for `schema` that fetches nothing, or None if the schema is not a usable one."""
    try:
        key: str | None = json.dumps(schema, default=str)
    except Exception:  # cannot be written as text: compile it every time
        key = None
    hit = _VALIDATORS.get(key) if key is not None else None  # one lookup: safe if emptied meanwhile
    if hit is not None:
        return hit[0]
    try:
        cls = validators.validator_for(schema, default=Draft202012Validator)
        cls.check_schema(dict(schema))
        validator: Validator | None = cls(schema, registry=_NO_REMOTE)
    except Exception:  # any failure of a device's schema means "cannot judge", never a 500
        validator = None
    if key is not None:
        if len(_VALIDATORS) >= _MAX_VALIDATORS:
            _VALIDATORS.clear()
        _VALIDATORS[key] = (validator,)
    return validator


def _limited(errors: Iterator[ValidationError]) -> Iterator[ValidationError]:
    for n, error in enumerate(errors):
        if n >= 5 * MAX_ERRORS_PER_COMMAND:
            return
        yield error


def _describe(tool: str, error: ValidationError, root: Mapping[str, Any]) -> list[tuple[str, str]]:
    base = [str(p) for p in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        wanted = error.validator_value if isinstance(error.validator_value, list) else []
        return [
            (_dotted([*base, str(k)]), f"argument '{_dotted([*base, str(k)])}' is required but missing")
            for k in wanted
            if k not in instance
        ]
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        declared = error.schema.get("properties") or {} if isinstance(error.schema, Mapping) else {}
        patterns = list((error.schema.get("patternProperties") or {}) if isinstance(error.schema, Mapping) else {})
        extra = [k for k in instance if k not in declared and not any(_search(p, k) for p in patterns)]
        takes = ", ".join(sorted(declared)) or "no arguments"
        return [
            (
                _dotted([*base, k]),
                f"unknown argument '{_dotted([*base, k])}'; {tool} takes {takes}"
                if not base
                else f"unknown field '{_dotted([*base, k])}' (allowed: {takes})",
            )
            for k in extra
        ]
    where = _dotted(base)
    nul = _nul_refusal(error)
    if nul is not None:  # a device's built-in tools refuse NUL bytes (the OS would cut the string there)
        where = _dotted([str(p) for p in nul.absolute_path])
        what = "a key of argument" if "propertyNames" in nul.schema_path else "argument"
        return [(where, f"{what} '{where}' contains a NUL byte (U+0000), which {tool} refuses; remove it")]
    text = error.message if len(error.message) <= 300 else error.message[:300] + "..."
    return [(where, f"argument '{where}': {text}" if where else text)]


def _nul_refusal(error: ValidationError) -> ValidationError | None:
    """The failed `pattern` behind `error` that a string with a NUL broke: `error` itself, or one in
    the branches of an `anyOf`/`oneOf` (`cwd: string | null`, `env: object | null`)."""
    if error.validator == "pattern" and isinstance(error.instance, str) and "\x00" in error.instance:
        return error
    if error.validator in ("anyOf", "oneOf"):
        for branch in error.context or []:
            found = _nul_refusal(branch)
            if found is not None:
                return found
    return None


def _dotted(parts: Sequence[str]) -> str:
    return ".".join(parts)


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False


def has_reference(value: Any) -> bool:
    """`value` is, or contains, a `${nodes...}` reference (strings nested in lists and objects)."""
    if isinstance(value, str):
        return REFERENCE in value
    if isinstance(value, list):
        return any(has_reference(v) for v in value)
    if isinstance(value, dict):
        return any(has_reference(v) for v in value.values())
    return False


# ---------------------------------------------------------------- retry


def retry_warnings(spec: DagSpec, devices: Sequence[CatalogDevice] | Catalog) -> list[SubmissionWarning]:
    """`retry_not_safe`: a node asks for retries, but uses a tool that is neither read-only nor
    idempotent (on some device it may be placed on) in a command not declared `idempotent`, so a
    failure after that command started is not retried (SPEC section 2, retries)."""
    fleet = catalog(devices)
    out: list[SubmissionWarning] = []
    for node in spec.nodes:
        if node.kind is not NodeKind.TOOL or node.retry.max_attempts <= 1:
            continue
        able = fleet.candidates(node)
        unsafe: list[str] = []
        for command in node.commands:
            if command.idempotent or command.tool in unsafe:
                continue
            if any(not retry_safe_tool(d.tools.get(command.tool)) for d in able if command.tool in d.tools):
                unsafe.append(command.tool)
        if unsafe:
            names = ", ".join(unsafe)
            verb = "is" if len(unsafe) == 1 else "are"
            out.append(
                SubmissionWarning(
                    "retry_not_safe",
                    node.id,
                    f"node '{node.id}' has retry.max_attempts {node.retry.max_attempts}, but {names} {verb} "
                    "neither read-only nor idempotent, so a failure after it started is not retried; "
                    "mark the command idempotent: true if it is safe to repeat",
                )
            )
    return out


def retry_safe_tool(tool: Mapping[str, Any] | None) -> bool:
    annotations = (tool or {}).get("annotations") or {}
    return bool(annotations.get("read_only")) or bool(annotations.get("idempotent"))


# ---------------------------------------------------------------- device policy


def refusals(node: NodeSpec, device: CatalogDevice) -> list[dict[str, Any]]:
    """Commands of `node` that `device`'s reported policy would refuse (`policy_denied`).

    Mirrors the agent's checks as far as the server can see them: the shell allow and deny lists
    by program name (the agent also resolves names on its PATH, which the server cannot) and the
    kill switch. A tool that needs a person's approval is not refused: it waits for one
    (`waiting_approval`). No policy reported (an older agent): nothing is predicted."""
    policy = device.policy
    if not isinstance(policy, Mapping) or node.kind is not NodeKind.TOOL:
        return []
    out = []
    for index, command in enumerate(node.commands):
        reason = _refusal(command, device.tools.get(command.tool), policy)
        if reason:
            out.append(
                {
                    "command": index,
                    "tool": command.tool,
                    "device": device.name,
                    "code": "policy_denied",
                    "message": f"{device.name} would refuse node '{node.id}' command {index} "
                    f"({command.tool}): {reason}",
                }
            )
    return out


def _refusal(command: CommandSpec, tool: Mapping[str, Any] | None, policy: Mapping[str, Any]) -> str | None:
    if policy.get("kill_switch") and not bool(((tool or {}).get("annotations") or {}).get("read_only")):
        return "the device owner has turned on the kill switch, which refuses every tool that is not read-only"
    if command.tool == "shell.run":
        return _program_refusal(command.arguments.get("argv"), policy)
    return None


def _program_refusal(argv: Any, policy: Mapping[str, Any]) -> str | None:
    if not isinstance(argv, list) or not argv or not isinstance(argv[0], str) or has_reference(argv[0]):
        return None
    program = argv[0]
    name = posixpath.basename(program)
    deny = {posixpath.normpath(p) for p in policy.get("shell_deny") or [] if isinstance(p, str)}
    if {program, name, posixpath.normpath(program)} & deny:
        return f"program '{program}' is on its shell deny list"
    allow = policy.get("shell_allow")
    if not isinstance(allow, list):
        return None  # null: any program
    entries = [e for e in allow if isinstance(e, str)]
    if "/" in program:
        allowed = posixpath.normpath(program) in {posixpath.normpath(e) for e in entries if e.startswith("/")}
    else:  # a bare name may also be allowed through an absolute entry that PATH resolves it to
        allowed = program in entries or any(e.startswith("/") and posixpath.basename(e) == program for e in entries)
    if allowed:
        return None
    return f"program '{program}' is not on its shell allow list ({', '.join(entries) or 'nothing is allowed'})"
