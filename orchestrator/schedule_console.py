"""`orrery schedules ...`: the body `create` sends, read from a file and flags, and the
terminal views of schedules and their ticks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from orchestrator.console import SYMBOLS
from orchestrator.dagfile import DagFileError, parse_dag_text

OUTCOME_STYLES = {"created": "green", "queued": "cyan", "skipped": "dim", "missed": "dark_orange", "failed": "red"}
SCHEDULE_FIELDS = ("name", "cron", "timezone", "task", "overlap", "paused", "starting_deadline_s", "max_queued")


def schedule_body(file: Path | None, request: str | None, **flags: Any) -> dict[str, Any]:
    """The `POST /v1/schedules` body: a schedule file (`{name, cron, timezone?, task, ...}`), or a
    DAG file (`{nodes, edges}`: the task) or `request` with the schedule's fields as flags; flags
    given win over the file's. Raises DagFileError with one line saying what is wrong."""
    body: dict[str, Any] = {}
    if file is not None:
        data = _read(file)
        if "nodes" in data:
            task = {"dag": {"nodes": data["nodes"], "edges": data.get("edges", [])}}
            body = {"task": {**task, **({"name": data["name"]} if data.get("name") else {})}}
        elif "task" in data or "cron" in data:
            unknown = sorted(set(data) - set(SCHEDULE_FIELDS))
            if unknown:
                raise DagFileError(
                    f"{file}: unknown field(s) {', '.join(unknown)}; a schedule has {', '.join(SCHEDULE_FIELDS)}"
                )
            body = dict(data)
        else:
            raise DagFileError(f"{file}: give a schedule ({{name, cron, task, ...}}) or a DAG ({{nodes, edges}})")
    elif request is not None:
        body = {"task": {"request": request}}
    body.update({k: v for k, v in flags.items() if v is not None})
    missing = [k for k in ("name", "cron", "task") if k not in body]
    if missing:
        # each missing field by the way to give it (a flag, or a task: FILE or --request)
        ways = [f"--{k}" if k != "task" else "a FILE or --request" for k in missing]
        raise DagFileError(
            f"the schedule needs {' and '.join(missing)}: give them in the file or as {' and '.join(ways)}"
        )
    return body


def _read(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DagFileError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DagFileError(f"{file}: cannot read: {exc}") from None
    data = parse_dag_text(text, str(file), as_json=file.suffix.lower() == ".json")
    if not isinstance(data, dict):
        raise DagFileError(f"{file}: must hold an object (a schedule or a DAG)")
    return data


def schedules_table(items: list[dict[str, Any]]) -> Table:
    table = Table(title="Schedules", header_style="bold")
    for col in ("name", "cron", "next run", "last run", "overlap", "state"):
        table.add_column(col, overflow="fold")
    table.add_column("id", no_wrap=True, min_width=max([2, *(len(s["id"]) for s in items)]))
    for s in items:
        state = Text("paused", style="magenta") if s["paused"] else Text("active", style="green")
        table.add_row(
            s["name"],
            f"{s['cron']} ({s['timezone']})",
            (s.get("next_runs") or ["—"])[0],
            _last_run(s.get("last_run")),
            s["overlap"],
            state,
            s["id"],
        )
    return table


def _last_run(last: dict[str, Any] | None) -> Text:
    if not last:
        return Text("never", style="dim")
    state = last.get("task_state") or "?"
    sym, style = SYMBOLS.get(state, ("?", ""))
    return Text.assemble(f"{last['local']} ", (f"{sym} {state}", style), f" {last['task_id']}")


def schedule_view(s: dict[str, Any], ticks: list[dict[str, Any]]) -> Group:
    """One schedule: what it runs and when, its last run, what waits, and its newest ticks."""
    lines = [
        Text.assemble(
            (s["name"], "bold"), f"  {s['id']}  ", ("paused", "magenta") if s["paused"] else ("active", "green")
        ),
        Text(f"cron      {s['cron']} in {s['timezone']}: {s['description']}"),
        Text(
            f"overlap   {s['overlap']} (max_queued {s['max_queued']}), starting_deadline_s {s['starting_deadline_s']:g}"
        ),
        Text("next runs " + (", ".join(s.get("next_runs") or []) or "none (paused)")),
        Text.assemble("last run  ", _last_run(s.get("last_run"))),
    ]
    if s.get("queued"):
        lines.append(Text("queued    " + ", ".join(s["queued"])))
    if not ticks:  # a line, not a table of headers with nothing under them
        return Group(*lines, Text("ticks     none yet"))
    return Group(*lines, ticks_table(ticks, title="Newest ticks"))


def ticks_table(items: list[dict[str, Any]], title: str = "Ticks (newest first)") -> Table:
    """The ticks; the task and detail columns only when some tick has one (no empty column)."""
    tasks = [_tick_task(t) for t in items]
    details = [str(t.get("detail") or "") for t in items]
    table = Table(title=title, header_style="bold", title_justify="left")
    table.add_column("tick", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    if any(tasks):
        table.add_column("task", no_wrap=True)
    if any(details):
        table.add_column("detail", overflow="fold")
    for t, task, detail in zip(items, tasks, details, strict=True):
        outcome = str(t.get("outcome", ""))
        cells: list[str | Text] = [str(t.get("local") or ""), Text(outcome, style=OUTCOME_STYLES.get(outcome, ""))]
        if any(tasks):
            cells.append(task)
        if any(details):
            cells.append(Text(detail))
        table.add_row(*cells)
    return table


def _tick_task(t: dict[str, Any]) -> str:
    task = str(t.get("task_id") or "")
    return f"{task} ({t['task_state']})" if task and t.get("task_state") else task
