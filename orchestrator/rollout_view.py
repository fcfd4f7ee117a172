"""Terminal views of fan-out nodes: a node's children under it in `orrery tasks
show|watch`, most telling first (failed, then running, then the rest in rollout order), at most
`SHOWN` of them with the others counted, so a 500-device rollout stays one screen."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.text import Text

SHOWN = 12
# What to show first: trouble, then what is going on, then what is done or waiting.
_ORDER = {"failed": 0, "verifying": 1, "waiting_approval": 1, "taken_over": 1, "running": 2, "queued": 3, "ready": 3}


def summary(node: dict[str, Any]) -> str:
    """`3/6 children done: 2 succeeded, 1 failed; 3 running`, for a fan-out node's row."""
    children = node.get("children") or []
    counts = Counter(c["state"] for c in children)
    done = sum(counts[s] for s in ("succeeded", "failed", "skipped", "cancelled"))
    parts = [f"{counts[s]} {s}" for s in ("succeeded", "failed", "skipped", "cancelled") if counts[s]]
    busy = [
        f"{counts[s]} {s}"
        for s in ("verifying", "waiting_approval", "taken_over", "running", "queued", "ready", "pending")
        if counts[s]
    ]
    text = f"{done}/{len(children)} children done" + (": " + ", ".join(parts) if parts else "")
    return text + ("; " + ", ".join(busy) if busy else "")


def rows(node: dict[str, Any], symbols: dict[str, tuple[str, str]]) -> list[tuple[Text, Text, Text]]:
    """(state and device, attempts, note) for the children worth showing, and a last row saying
    how many more there are."""
    children = list(enumerate(node.get("children") or []))
    children.sort(key=lambda ic: (_ORDER.get(ic[1]["state"], 4), ic[0]))
    out = []
    for _, c in children[:SHOWN]:
        sym, style = symbols.get(c["state"], ("?", ""))
        made = len([a for a in c.get("attempts") or [] if a.get("kind", "tool") != "verify"])
        err = c.get("error") or {}
        note = f"{err.get('code')}: {str(err.get('message', ''))[:70]}" if err and c["state"] != "succeeded" else ""
        verified = (c.get("verification") or {}).get("state")
        if verified and c["state"] in ("succeeded", "verifying"):
            note = f"verify {verified}" + (f"  {note}" if note else "")
        out.append(
            (
                Text(f"  {sym} {c['device']}", style=style),
                Text(f"attempt {made}" if made else "", style="dim"),
                Text(note, style="dim"),
            )
        )
    more = len(children) - SHOWN
    if more > 0:
        out.append((Text(f"  … and {more} more", style="dim"), Text(""), Text("")))
    return out


def event_line(data: dict[str, Any], symbols: dict[str, tuple[str, str]]) -> Text:
    """One line for a `node.child` event (watching without a terminal)."""
    state = str(data.get("state"))
    sym, style = symbols.get(state, ("?", ""))
    line = Text(f"{str(data.get('at') or '')[11:19]} ")
    line.append(f"{sym} {data.get('node_id')} on {data.get('device')} {state}", style=style)
    error = data.get("error") or {}
    if error and state in ("failed", "skipped", "cancelled", "ready"):
        line.append(f"  {error.get('code')}: {str(error.get('message', ''))[:160]}", style="dim")
    return line
