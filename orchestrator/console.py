"""Terminal views for the CLI: device tables, task DAGs with state symbols, live watching."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator.client import Client

SYMBOLS = {
    "pending": ("·", "dim"),
    "ready": ("○", "cyan"),
    "queued": ("◔", "cyan"),
    "running": ("◐", "yellow"),
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
    "revoked": "dim",
    "enrolled": "cyan",
}
TERMINAL = ("succeeded", "failed", "cancelled", "skipped")


def devices_table(devices: list[dict[str, Any]]) -> Table:
    table = Table(title="Devices", header_style="bold", expand=False)
    for col in ("name", "state", "platform", "labels", "batch", "queue", "last seen", "id"):
        table.add_column(col)
    for d in devices:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(d.get("labels", {}).items()))
        seen = (d.get("last_seen") or "")[:19].replace("T", " ")
        state = d["state"]
        table.add_row(
            d["name"],
            Text(state, style=DEVICE_STYLES.get(state, "")),
            d.get("platform", ""),
            labels,
            d.get("current_batch") or "",
            str(d.get("queue_length", 0)),
            seen,
            d["id"],
        )
    return table


def tasks_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table(title="Tasks", header_style="bold")
    for col in ("id", "name", "state", "nodes", "created", "finished"):
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


def task_view(task: dict[str, Any], show_outputs: bool = False) -> Group:
    nodes = {n["id"]: n for n in task.get("nodes") or []}
    incoming: dict[str, list[str]] = {}
    for e in task.get("edges") or []:
        cond = "" if e.get("on", "success") == "success" else f" [{e['on']}]"
        incoming.setdefault(e["to"], []).append(e["from"] + cond)
    sym, style = SYMBOLS.get(task["state"], ("?", ""))
    header = Text.assemble((f"{task['name']} ", "bold"), (f"{sym} {task['state']}", style), f"  {task['id']}")
    table = Table.grid(padding=(0, 2))
    for _ in range(4):
        table.add_column()
    for i, layer in enumerate(layers(task)):
        for node_id in layer:
            n = nodes[node_id]
            s, st = SYMBOLS.get(n["state"], ("?", ""))
            attempts = n.get("attempts") or []
            where = attempts[-1]["device_id"] if attempts else (n.get("queued_on") or "")
            after = ("after " + ", ".join(incoming[node_id])) if node_id in incoming else "root"
            err = n.get("error") or {}
            note = f"{err.get('code')}: {err.get('message', '')[:80]}" if err and n["state"] != "succeeded" else ""
            table.add_row(
                Text(f"L{i}", style="dim"),
                Text(f"{s} {node_id}", style=st),
                Text(where, style="dim"),
                Text(after + ("  " + note if note else ""), style="dim"),
            )
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
            shown = out if isinstance(out, str) else json.dumps(out, indent=1)
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


def watch(
    client: Client, task_id: str, console: Console, on_event: Callable[[str, dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Follow a task live from its event stream until it ends; returns the final task."""
    task = client.task(task_id)
    with Live(task_view(task), console=console, refresh_per_second=8, transient=False) as live:
        if task["state"] not in ("succeeded", "failed", "cancelled"):
            for _id, etype, data in client.events(task_id):
                if on_event:
                    on_event(etype, data)
                if etype in ("node.state", "task.state", "dag.edited", "node.attempt"):
                    task = client.task(task_id)
                    live.update(task_view(task))
                if etype == "task.state" and data.get("state") in ("succeeded", "failed", "cancelled"):
                    break
        task = client.task(task_id)
        live.update(task_view(task, show_outputs=True))
    return task
