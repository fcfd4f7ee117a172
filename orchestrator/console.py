"""Terminal views for the CLI: device tables, task DAGs with state symbols, live watching."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator import rollout_view
from orrery.sdk import calls
from orrery.sdk.client import Client
from orrery.sdk.errors import OrreryError

SYMBOLS = {
    "pending": ("·", "dim"),
    "ready": ("○", "cyan"),
    "queued": ("◔", "cyan"),
    "running": ("◐", "yellow"),
    "waiting_approval": ("✋", "magenta"),  # `orrery approvals list` shows what it waits for
    "taken_over": ("☝", "magenta"),  # a person has its device: it waits for the handback
    "verifying": ("⧗", "blue"),  # its verify commands decide its outcome
    "succeeded": ("✔", "green"),
    "failed": ("✘", "red"),
    "skipped": ("↷", "dim"),
    "cancelled": ("⊘", "magenta"),
    "planning": ("✎", "blue"),
}
DEVICE_STYLES = {
    "idle": "green",
    "busy": "yellow",
    "suspect": "dark_orange",
    "offline": "red",
    "draining": "magenta",
    "cordoned": "magenta",
    "stopped": "bold red",
    "revoked": "dim",
    "enrolled": "cyan",
}
TERMINAL = ("succeeded", "failed", "cancelled", "skipped")


def print_table(console: Console, table: Table, widen: bool = True) -> None:
    """Print a listing. Id columns have a minimum width, so they are never cut off; when stdout is
    not a terminal (and `widen`) the table gets its natural width, so each row stays on one line
    for grep and cut."""
    if console.is_terminal or not widen:
        console.print(table)  # other columns fold to fit; id columns keep their minimum width
        return
    natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
    saved = console.width
    console.width = max(saved, natural)
    try:
        console.print(table, crop=False)
    finally:
        console.width = saved


def _id_column(table: Table, header: str, values: list[str]) -> None:
    table.add_column(header, no_wrap=True, min_width=max([len(header), *map(len, values)]))


def devices_table(devices: list[dict[str, Any]]) -> Table:
    table = Table(title="Devices", header_style="bold", expand=False)
    busy = any(_current(d) for d in devices)
    for col in ("name", "state", "platform", "labels", *(["current"] if busy else [])):
        table.add_column(col, overflow="fold")
    table.add_column("queue")
    table.add_column("last seen", overflow="fold")
    _id_column(table, "id", [d["id"] for d in devices])
    for d in devices:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(d.get("labels", {}).items()))
        seen = (d.get("last_seen") or "")[:19].replace("T", " ")
        state = d["state"]
        if d.get("takeover"):
            state = f"{state}, taken over by {d['takeover'].get('by', '?')}"
        table.add_row(
            d["name"],
            Text(state, style=DEVICE_STYLES.get(d["state"], "")),
            d.get("platform", ""),
            labels,
            *([_current(d)] if busy else []),
            str(d.get("queue_length", 0)),
            seen,
            d["id"],
        )
    return table


def _current(device: dict[str, Any]) -> str:
    """What a device is doing: its current task and node when the server says, else its batch."""
    if device.get("current_task_id"):
        return f"{device['current_task_id']}/{device.get('current_node_id') or '?'}"
    return str(device.get("current_batch") or "")


def tasks_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table(title="Tasks", header_style="bold")
    _id_column(table, "id", [t["id"] for t in tasks])
    table.add_column("name", overflow="fold")
    for col in ("state", "nodes", "created", "finished"):
        table.add_column(col)
    for t in tasks:
        counts = t.get("node_counts") or {}
        done = sum(v for k, v in counts.items() if k in TERMINAL)
        total = sum(counts.values())
        sym, style = SYMBOLS.get(t["state"], ("?", ""))
        table.add_row(
            t["id"],
            t["name"],
            Text(f"{sym} {t['state']}", style=style),
            f"{done}/{total}",
            (t.get("created_at") or "")[:19].replace("T", " "),
            (t.get("finished_at") or "")[:19].replace("T", " "),
        )
    return table


def tools_view(tools: list[dict[str, Any]], per_device: bool) -> Group:
    """Tools (from `tool_rows`), one block each: name, retry safety and devices; arguments (`?`:
    optional); the description's first paragraph (all of it with --json). Readable at any width."""
    parts: list[Any] = []
    for t in tools:
        head = Text(t["name"], style="bold")
        if t["retry_safe"]:
            why = "read-only" if t["read_only"] else "idempotent"
            head.append(f"  retry-safe ({why})", style="green")
        else:
            head.append("  not retry-safe", style="yellow")
        if not per_device:
            head.append(f"  on {', '.join(t['devices'])}", style="dim")
        summary = t["description"].split("\n\n")[0].replace("\n", " ")
        parts.append(head)
        parts.append(Padding(Text(f"args: {t['arguments']}"), (0, 0, 0, 2)))
        if summary:
            parts.append(Padding(Text(summary, style="dim"), (0, 0, 0, 2)))
    return Group(*parts)


def schema_summary(schema: dict[str, Any]) -> str:
    """A tool's input schema in one line: `argv: array[string], cwd?: string` (`?`: optional)."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = [f"{name}{'' if name in required else '?'}: {_type_name(prop)}" for name, prop in props.items()]
    return ", ".join(parts) if parts else "(none)"


def _type_name(prop: Any) -> str:
    if not isinstance(prop, dict):
        return "any"
    if "enum" in prop:
        return "|".join(json.dumps(v) for v in prop["enum"])
    options = prop.get("anyOf") or prop.get("oneOf")
    if options:
        return "|".join(_type_name(o) for o in options)
    kind = prop.get("type", "any")
    if isinstance(kind, list):
        return "|".join(map(str, kind))
    if kind == "array":
        return f"array[{_type_name(prop.get('items'))}]" if prop.get("items") else "array"
    return str(kind)


def tool_rows(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tool of these devices once: name, description, schema, retry safety, devices having it."""
    rows: dict[str, dict[str, Any]] = {}
    for d in devices:
        for tool in d.get("tools") or []:
            notes = tool.get("annotations") or {}
            row = rows.setdefault(
                tool["name"],
                {
                    "name": tool["name"],
                    "description": (tool.get("description") or "").strip(),
                    "input_schema": tool.get("input_schema") or {},
                    "arguments": schema_summary(tool.get("input_schema") or {}),
                    "read_only": bool(notes.get("read_only")),
                    "idempotent": bool(notes.get("idempotent")),
                    "devices": [],
                },
            )
            row["devices"].append(d["name"])
    for row in rows.values():
        row["retry_safe"] = row["read_only"] or row["idempotent"]
    return sorted(rows.values(), key=lambda r: str(r["name"]))


def history_table(items: list[dict[str, Any]]) -> Table:
    table = Table(title="State history (newest first)", header_style="bold")
    table.add_column("at", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for h in items:
        state = str(h.get("state", ""))
        table.add_row(
            str(h.get("at") or "")[:19].replace("T", " "),
            Text(state, style=DEVICE_STYLES.get(state, "")),
            Text(str(h.get("reason") or "")),
        )
    return table


def layers(task: dict[str, Any]) -> list[list[str]]:
    """Node ids grouped by depth (longest path from a root), in submission order."""
    nodes = [n["id"] for n in task.get("nodes") or []]
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    for e in task.get("edges") or []:
        preds.setdefault(e["to"], []).append(e["from"])
    depth: dict[str, int] = {}

    def d(n: str, seen: frozenset[str] = frozenset()) -> int:
        if n not in depth:
            depth[n] = 0 if not preds.get(n) or n in seen else 1 + max(d(p, seen | {n}) for p in preds[n])
        return depth[n]

    out: list[list[str]] = []
    for n in nodes:
        k = d(n)
        while len(out) <= k:
            out.append([])
        out[k].append(n)
    return out


def attempts_note(node: dict[str, Any]) -> str:
    """`attempt 2/3`: attempts made of those allowed (empty before the first)."""
    made = len(node.get("attempts") or [])
    if not made:
        return ""
    allowed = (node.get("retry") or {}).get("max_attempts") or 1
    return f"attempt {made}/{max(allowed, made)}"


def task_view(task: dict[str, Any], show_outputs: bool = False, names: dict[str, str] | None = None) -> Group:
    """A task's DAG by layer: each node with its state, the device (by name) it ran or is queued on,
    its attempt count, its incoming edges and its error. `names` maps device ids to names."""
    names = names or {}
    nodes = {n["id"]: n for n in task.get("nodes") or []}
    incoming: dict[str, list[str]] = {}
    for e in task.get("edges") or []:
        cond = "" if e.get("on", "success") == "success" else f" ({e['on']})"
        incoming.setdefault(e["to"], []).append(e["from"] + cond)
    sym, style = SYMBOLS.get(task["state"], ("?", ""))
    header = Text.assemble((f"{task['name']} ", "bold"), (f"{sym} {task['state']}", style), f"  {task['id']}")
    if task.get("rerun_of"):
        header.append(f"  (re-run of {task['rerun_of']})", style="dim")
    table = Table.grid(padding=(0, 2))
    for _ in range(5):
        table.add_column()
    for i, layer in enumerate(layers(task)):
        for node_id in layer:
            n = nodes[node_id]
            s, st = SYMBOLS.get(n["state"], ("?", ""))
            attempts = n.get("attempts") or []
            device = attempts[-1]["device_id"] if attempts else (n.get("queued_on") or "")
            where = names.get(device, device)
            after = ("after " + ", ".join(incoming[node_id])) if node_id in incoming else "root"
            err = n.get("error") or {}
            note = ""
            if err and n["state"] != "succeeded":
                note = f"{err.get('code')}: {str(err.get('message', ''))[:80]}"
                if err.get("not_retried"):
                    note += f" ({err['not_retried']})"
            if n.get("children") is not None:  # a fan-out node: its children under it
                where, note = f"{len(n['children'])} devices", rollout_view.summary(n) + ("  " + note if note else "")
            table.add_row(
                Text(f"L{i}", style="dim"),
                Text(f"{s} {node_id}", style=st),
                Text(where, style="dim"),
                Text(attempts_note(n), style="dim"),
                Text(after + ("  " + note if note else ""), style="dim"),
            )
            for child, tries, child_note in rollout_view.rows(n, SYMBOLS) if n.get("children") else []:
                table.add_row(Text(""), child, Text(""), tries, child_note)
    total = len(nodes)
    done = sum(1 for n in nodes.values() if n["state"] in TERMINAL)
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(total, 1), completed=done, width=40), Text(f"{done}/{total} nodes finished"))
    parts: list[Any] = [header, table, bar]
    if show_outputs:
        parts.append(outputs_view(task))
    return Group(*parts)


def outputs_view(task: dict[str, Any]) -> Table:
    table = Table(title="Outputs", header_style="bold", show_lines=True)
    table.add_column("node")
    table.add_column("output")
    for n in task.get("nodes") or []:
        out = n.get("output")
        if out is None and n.get("error"):
            text = Text(f"{n['error'].get('code')}: {n['error'].get('message')}", style="red")
        else:
            if isinstance(out, dict) and "stdout" in out:
                out = out["stdout"]
            shown = out if isinstance(out, str) else json.dumps(out, indent=1, ensure_ascii=False)
            text = Text((shown or "").strip()[:1500])
        table.add_row(n["id"], text)
    return table


def llm_view(items: list[dict[str, Any]]) -> Group:
    """The model calls of a task, oldest first: what it was asked (last message) and answered."""
    parts: list[Any] = []
    for item in items:
        if "dag_edit" in item:
            parts.append(Text(f"DAG version {item['dag_edit']}: {item['reason']}", style="bold magenta"))
            continue
        head = (
            f"#{item['id']} {item['purpose']}"
            + (f" node {item['node_id']}" if item.get("node_id") else "")
            + f"  {item['prompt_tokens']}+{item['completion_tokens']} tokens, {item['latency_ms']:.0f} ms"
        )
        parts.append(Text(head, style="bold"))
        last = item["messages"][-1] if item["messages"] else {}
        asked = last.get("content") if isinstance(last.get("content"), str) else json.dumps(last.get("content"))
        parts.append(Text("  asked: " + (asked or "")[:400].replace("\n", " "), style="dim"))
        if item.get("error"):
            parts.append(Text("  error: " + item["error"], style="red"))
        else:
            parts.append(Text("  reply: " + json.dumps(item.get("reply"))[:600]))
    return Group(*parts) if parts else Group(Text("no LLM calls were made for this task"))


def device_names(client: Client) -> dict[str, str]:
    """Device id to name, for showing where nodes ran (empty if devices cannot be listed)."""
    try:
        return {d.id: d.name for d in client.devices()}
    except OrreryError:
        return {}


FINISHED = ("succeeded", "failed", "cancelled")


def watch(
    client: Client, task_id: str, console: Console, on_event: Callable[[str, dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Follow a task from its event stream until it ends; returns the final task. On a terminal a
    live view is redrawn; otherwise (a pipe, a log, CI) one line is printed per node state change
    as it happens, then the final view."""
    task = _task(client, task_id)
    task_id = task["id"]  # the server may have resolved a prefix or a name
    names = device_names(client)
    if not console.is_terminal:
        return _watch_lines(client, task, console, names, on_event)
    with Live(task_view(task, names=names), console=console, refresh_per_second=8, transient=False) as live:
        if task["state"] not in FINISHED:
            for event in client.events(task_id):
                etype, data = event.type, event.data
                if on_event:
                    on_event(etype, data)
                if etype in ("node.state", "task.state", "dag.edited", "node.attempt", "node.child"):
                    task = _task(client, task_id)
                    if any(dev not in names for dev in _devices_of(task)):
                        names = device_names(client)
                    live.update(task_view(task, names=names))
                if etype == "task.state" and data.get("state") in FINISHED:
                    break
        task = _task(client, task_id)
        live.update(task_view(task, show_outputs=True, names=names))
    return task


def _task(client: Client, task_id: str) -> dict[str, Any]:
    """A task as the server sent it (the views read its JSON)."""
    task: dict[str, Any] = client.request("GET", calls.task(task_id).path)
    return task


def _devices_of(task: dict[str, Any]) -> set[str]:
    return {a["device_id"] for n in task.get("nodes") or [] for a in n.get("attempts") or []} | {
        c["device_id"] for n in task.get("nodes") or [] for c in n.get("children") or []
    }


def _running_on(client: Client, task_id: str, node_id: str) -> tuple[str, int]:
    """The device id a running node's latest attempt is on, and the number of attempts."""
    for n in client.task(task_id).nodes or []:
        if n.id == node_id and n.attempts:
            return n.attempts[-1].device_id, len(n.attempts)
    return "", 0


def _watch_lines(
    client: Client,
    task: dict[str, Any],
    console: Console,
    names: dict[str, str],
    on_event: Callable[[str, dict[str, Any]], None] | None,
) -> dict[str, Any]:
    def say(text: Text) -> None:
        console.print(text, soft_wrap=True)
        console.file.flush()

    task_id = task["id"]
    say(Text(f"task {task_id} {task['name']}: {task['state']}"))
    where: dict[str, str] = {}
    if task["state"] not in FINISHED:
        for event in client.events(task_id):
            etype, data = event.type, event.data
            if on_event:
                on_event(etype, data)
            at = str(data.get("at") or "")[11:19]
            node = data.get("node_id")
            if etype == "node.state" and node:
                state = str(data.get("state"))
                sym, style = SYMBOLS.get(state, ("?", ""))
                line = Text(f"{at} ")
                line.append(f"{sym} {node} {state}", style=style)
                if state == "running":
                    where[node], tries = _running_on(client, task_id, node)
                    if where[node] and where[node] not in names:
                        names = device_names(client) or names
                    if where[node]:  # a fan-out node runs on its children: their lines name the devices
                        line.append(f" on {names.get(where[node], where[node])}")
                    if tries > 1:
                        line.append(f" (attempt {tries})", style="yellow")
                elif state in ("succeeded", "failed") and where.get(node):
                    line.append(f" on {names.get(where[node], where[node])}")
                error = data.get("error") or {}
                if error and state in ("failed", "cancelled", "ready"):
                    line.append(f"  {error.get('code')}: {str(error.get('message', ''))[:160]}", style="dim")
                say(line)
            elif etype == "node.child":
                say(rollout_view.event_line(data, SYMBOLS))
            elif etype == "dag.edited":
                say(Text(f"{at} ✎ DAG edited: version {data.get('version', '?')}", style="blue"))
            elif etype == "task.state" and data.get("state") in FINISHED:
                break
    task = _task(client, task_id)
    console.print(task_view(task, show_outputs=True, names=names))
    return task


# ---- artifacts


def artifacts_table(items: list[dict[str, Any]], names: dict[str, str]) -> Table:
    """A task's artifacts (`orrery artifacts list`): name, version, size, sha256, where from."""
    table = Table(title="Artifacts", header_style="bold")
    for col in ("name", "version", "size", "sha256", "node", "device", "published"):
        table.add_column(col, overflow="fold")
    for a in items:
        version = f"{a['version']}" + ("" if a.get("current", True) else " (old)")
        table.add_row(
            a["name"],
            version,
            f"{a['size']:,}",
            a["sha256"],
            a["node_id"],
            names.get(a["device_id"], a["device_id"]),
            (a.get("created_at") or "")[:19].replace("T", " "),
        )
    return table
