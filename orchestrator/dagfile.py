"""Reading a DAG file (JSON or YAML) for `orrery submit` and `orrery validate`: YAML 1.2 booleans,
so an unquoted `on:` edge key stays a string, and one-line errors naming file:line:column."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


class DagFileError(Exception):
    """A DAG file that cannot be read or parsed; the message is one line, with file:line:column."""


class DagLoader(yaml.SafeLoader):
    """A safe loader where only `true`/`false` are booleans (as in YAML 1.2), so the edge key `on:`
    and values such as `yes`, `no`, `on`, `off` stay strings."""


DagLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
DagLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_dag_text(text: str, source: str, as_json: bool = False) -> Any:
    """Parse JSON or YAML text; a syntax error becomes a DagFileError naming source:line:column."""
    if as_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise DagFileError(f"{source}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    try:
        return yaml.load(text, Loader=DagLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or "not valid YAML"
        context = f" ({exc.context})" if exc.context else ""
        raise DagFileError(f"{where}: invalid YAML: {problem}{context}") from None
    except yaml.YAMLError as exc:
        raise DagFileError(f"{source}: invalid YAML: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def load_dag_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DagFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DagFileError(f"{path}: is a directory, not a DAG file") from None
    except UnicodeDecodeError:
        raise DagFileError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise DagFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    data = parse_dag_text(text, str(path), as_json=path.suffix.lower() == ".json")
    if not isinstance(data, dict) or "nodes" not in data:
        raise DagFileError(f"{path}: must hold an object with 'nodes' (and optionally 'edges', 'name')")
    return data


def locate(path: Path, loc: Sequence[str | int]) -> str | None:
    """`file:line:column` of the key or item at `loc` (keys and list indexes from the top of the
    file, as a validation problem's `loc` names them after `body.dag`), or None when the file is
    not YAML (JSON is YAML too) or holds nothing there."""
    try:
        node: yaml.Node | None = yaml.compose(path.read_text(encoding="utf-8"), Loader=DagLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    mark = node.start_mark if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next(
                ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None
            )
            if found is None:
                return None
            mark, node = found[0].start_mark, found[1]
        elif isinstance(node, yaml.SequenceNode) and str(part).isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            mark = node.start_mark
        else:
            return None
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else None
