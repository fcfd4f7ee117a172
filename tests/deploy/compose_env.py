"""docker-compose.yml read as processes: each service's argv and environment, without Docker.

A smoke test can start "the same commands with the same environment as local processes":

    procs = services({"POSTGRES_PASSWORD": "pw", "ORRERY_SECRET_KEY": "s", "ORRERY_ADMIN_KEY": "k"},
                     addresses={"postgres:5432": "127.0.0.1:54321", "redis:6379": "127.0.0.1:6390"})
    procs["orchestrator"].local_argv()  # [python, -m, orchestrator.cli, serve, --host, 0.0.0.0, --no-migrate]
    procs["orchestrator"].environment  # ORRERY_DATABASE_URL=postgresql+asyncpg://orrery:pw@127.0.0.1:54321/orrery ...

`${VAR}` references are interpolated the way Compose does it (`${VAR:-default}`, `${VAR-default}`,
`${VAR:?error}`, `${VAR?error}`, `${VAR:+alt}`, `${VAR+alt}`, `$VAR`, `$$`), from the dict given
only: no implicit `.env` and no process environment, so the result does not depend on the machine.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is missing, or a malformed reference."""


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """`text` with every `${...}` / `$VAR` replaced as Compose would, from `variables`."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "$":
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            end = _closing_brace(text, i + 2)
            out.append(_expand(text[i + 2 : end], variables))
            i = end + 1
        elif (m := _NAME.match(text, i + 1)) is not None:
            out.append(variables.get(m.group(), ""))
            i = m.end()
        else:
            out.append("$")
            i += 1
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    for j in range(start, len(text)):
        if text[j] == "{" and text[j - 1] == "$":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise InterpolationError(f"unclosed '${{' in {text!r}")


def _expand(body: str, variables: Mapping[str, str]) -> str:
    m = _NAME.match(body)
    if m is None:
        raise InterpolationError(f"invalid reference '${{{body}}}'")
    name, rest = m.group(), body[m.end() :]
    value = variables.get(name)
    if not rest:
        return value or ""
    op, arg = (rest[:2], rest[2:]) if rest[:2] in (":-", ":?", ":+") else (rest[:1], rest[1:])
    unset_or_empty = not value if op.startswith(":") else value is None
    if op in (":-", "-"):
        return interpolate(arg, variables) if unset_or_empty else str(value)
    if op in (":?", "?"):
        if unset_or_empty:
            raise InterpolationError(f"{name}: {interpolate(arg, variables) or 'required variable is missing'}")
        return str(value)
    if op in (":+", "+"):
        return "" if unset_or_empty else interpolate(arg, variables)
    raise InterpolationError(f"invalid reference '${{{body}}}'")


def _interpolate_tree(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [_interpolate_tree(v, variables) for v in node]
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, variables) for k, v in node.items()}
    return node


def load(compose_file: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as data (YAML anchors and `<<` merges resolved), not interpolated."""
    data: dict[str, Any] = yaml.safe_load(compose_file.read_text())
    return data


# ---------------------------------------------------------------- the image built from deploy/Dockerfile


@dataclass(frozen=True)
class Image:
    """What a service built from a Dockerfile runs by default, and the repo files it installs."""

    entrypoint: list[str]
    cmd: list[str]
    programs: dict[str, Path]  # program name on the image's PATH -> the repository file it is
    healthcheck: list[str] = field(default_factory=list)  # HEALTHCHECK's command, exec form

    @classmethod
    def from_dockerfile(cls, dockerfile: Path, context: Path, target: str | None = None) -> Image:
        """The image of stage `target` (default: the last stage), with what it inherits from the
        stages it is built `FROM`."""
        stages: list[tuple[str, str, list[str]]] = []  # (name, the image or stage it is FROM, instructions)
        for instruction in _instructions(dockerfile.read_text()):
            keyword, _, args = instruction.partition(" ")
            if keyword.upper() == "FROM":
                words = args.split()
                name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
                stages.append((name, words[0], []))
            elif stages:
                stages[-1][2].append(instruction)
        by_name = {name: (parent, body) for name, parent, body in stages}
        if target is not None and target not in by_name:
            raise ValueError(f"{dockerfile} has no stage {target!r}")
        chain: list[list[str]] = []
        stage = target if target is not None else stages[-1][0]
        while stage in by_name:
            parent, body = by_name[stage]
            chain.insert(0, body)
            stage = parent
        entrypoint: list[str] = []
        cmd: list[str] = []
        healthcheck: list[str] = []
        programs: dict[str, Path] = {}
        for instruction in (i for body in chain for i in body):
            keyword, _, args = instruction.partition(" ")
            keyword = keyword.upper()
            if keyword == "ENTRYPOINT":
                entrypoint, cmd = _exec_form(args), []  # a new ENTRYPOINT resets CMD
            elif keyword == "CMD":
                cmd = _exec_form(args)
            elif keyword == "HEALTHCHECK":
                healthcheck = _exec_form(args.split(" CMD ", 1)[1]) if " CMD " in f" {args}" else []
            elif keyword == "COPY":
                words = [w for w in shlex.split(args) if not w.startswith("--")]
                if len(words) == 2 and words[1].startswith("/usr/local/bin/"):
                    programs[words[1].rsplit("/", 1)[1]] = context / words[0]
        return cls(entrypoint, cmd, programs, healthcheck)


def _instructions(text: str) -> list[str]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    joined: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        joined.append(current + line)
        current = ""
    return joined


def _exec_form(args: str) -> list[str]:
    args = args.strip()
    if args.startswith("["):
        return [str(a) for a in json.loads(args)]
    return ["/bin/sh", "-c", args]


# ---------------------------------------------------------------- services as processes


@dataclass(frozen=True)
class ServiceProcess:
    name: str
    argv: list[str]  # what the container execs: entrypoint + command (image defaults filled in)
    environment: dict[str, str]  # env_file entries overlaid by `environment:`, interpolated
    depends_on: dict[str, str] = field(default_factory=dict)  # service -> condition
    image: str | None = None
    image_programs: dict[str, Path] = field(default_factory=dict)

    @property
    def runs_orrery(self) -> bool:
        """Built from this repository's Dockerfile, so runnable as a local process here."""
        return bool(self.image_programs) or (bool(self.argv) and self.argv[0] == "orrery")

    def local_argv(self, orrery: list[str] | None = None) -> list[str]:
        """`argv` for this machine: `orrery` as the venv's Python module, an image program
        (e.g. `orrery-agent-entrypoint`) as the repository script it was copied from. A script
        that calls `orrery` itself needs the venv's bin directory on PATH."""
        orrery = orrery or [sys.executable, "-m", "orchestrator.cli"]
        if not self.argv:
            return []
        head, *rest = self.argv
        if head == "orrery":
            return [*orrery, *rest]
        if head in self.image_programs:
            return [str(self.image_programs[head]), *rest]
        return list(self.argv)


def services(
    variables: Mapping[str, str],
    *,
    addresses: Mapping[str, str] | None = None,
    compose_file: Path = COMPOSE_FILE,
    read_env_files: bool = False,
) -> dict[str, ServiceProcess]:
    """Every service of `compose_file` as a process: argv and environment, `${...}` taken from
    `variables`. `addresses` maps `service:port` as the containers see it to `host:port` here,
    rewritten in argv and environment wherever it stands as a URL's host (`//redis:6379`, `@postgres:5432`).
    With `read_env_files`, the env files a service names (`.env`) are read too where they exist."""
    doc = _interpolate_tree(load(compose_file), variables)
    base = compose_file.parent
    out: dict[str, ServiceProcess] = {}
    for name, svc in doc.get("services", {}).items():
        image = _built_image(svc, base)
        entrypoint = _words(svc["entrypoint"]) if "entrypoint" in svc else None
        command = _words(svc["command"]) if "command" in svc else None
        if image is not None:
            if entrypoint is None:
                entrypoint = image.entrypoint
                command = image.cmd if command is None else command
            elif command is None:
                command = []  # Compose: an entrypoint set on the service drops the image's CMD
        argv = [*(entrypoint or []), *(command or [])]
        env: dict[str, str] = {}
        if read_env_files:
            for path in _env_files(svc.get("env_file"), base):
                env.update({k: interpolate(v, variables) for k, v in _read_env_file(path).items()})
        env.update(_mapping(svc.get("environment")))
        if addresses:
            argv = [rewrite_addresses(a, addresses) for a in argv]
            env = {k: rewrite_addresses(v, addresses) for k, v in env.items()}
        out[name] = ServiceProcess(
            name=name,
            argv=argv,
            environment=env,
            depends_on=_depends_on(svc.get("depends_on")),
            image=svc.get("image"),
            image_programs=image.programs if image is not None else {},
        )
    return out


def rewrite_addresses(value: str, addresses: Mapping[str, str]) -> str:
    """Replace `service:port` where it is a URL's host part (after `//` or `@`) by its local address."""
    for inside, local in addresses.items():
        value = re.sub(rf"(?<=[/@]){re.escape(inside)}(?=[/?#]|$)", local, value)
    return value


def _built_image(svc: Mapping[str, Any], base: Path) -> Image | None:
    build = svc.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        build = {"context": build}
    context = (base / build.get("context", ".")).resolve()
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    return Image.from_dockerfile(dockerfile, context, build.get("target"))


def _words(value: str | list[Any] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _mapping(value: Mapping[str, Any] | list[str] | None) -> dict[str, str]:
    """`environment:` as a map or as a list of `KEY=value`; a bare `KEY` (value from the host) is left out."""
    if not value:
        return {}
    if isinstance(value, Mapping):
        return {k: _scalar(v) for k, v in value.items() if v is not None}
    pairs = (item.partition("=") for item in value)
    return {k: v for k, sep, v in pairs if sep}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _env_files(value: Any, base: Path) -> list[Path]:
    if value is None:
        return []
    entries = value if isinstance(value, list) else [value]
    paths: list[Path] = []
    for entry in entries:
        spec = {"path": entry} if isinstance(entry, str) else entry
        path = base / spec["path"]
        if path.exists():
            paths.append(path)
        elif spec.get("required", True):
            raise FileNotFoundError(f"env file {path} named by {COMPOSE_FILE.name} does not exist")
    return paths


def _read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines; `#` comments and blank lines skipped; one pair of surrounding quotes removed."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _depends_on(value: Any) -> dict[str, str]:
    if not value:
        return {}
    if isinstance(value, list):
        return {name: "service_started" for name in value}
    return {name: spec.get("condition", "service_started") for name, spec in value.items()}
