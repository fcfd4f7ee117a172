"""`orrery agent approvals | approve ID | deny ID | takeover | handback`: the device owner's
decisions, at the device.

These run beside a running agent and talk to it through its ledger (the data dir is private to
the owner's OS user, so being able to open it is the proof of being the owner). A decision is
written into the ledger; the waiting agent sees it within `LOCAL_POLL_S`, tells the
orchestrator, and runs the command (approve) or fails it with `approval_denied` (deny).

`takeover` and `handback` are the owner's own takeover of the device (`device_agent.takeover`):
written into the ledger, where the agent looks every `OWNER_POLL_S`, refuses the model's input
tools and tells the orchestrator, which pauses the device's agent nodes until the handback.
"""

from __future__ import annotations

import getpass
import json
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from device_agent.agent_dir import ConfigOption, DataDirOption, TokenOption, which_agent
from device_agent.datadir import LEDGER_NAME
from device_agent.ledger import APPROVAL_COLUMNS, OWNER_TAKEOVER_KEY, Approval, approval_from_row
from protocol.messages import OwnerTakeoverState

app = typer.Typer(add_completion=False, no_args_is_help=True)
COMMANDS = frozenset({"approvals", "approve", "deny", "takeover", "handback"})


def _ledgers(data_dir: Path | None, config: Path | None, token: str | None) -> list[Path]:
    """The ledger of the agent the options, ORRERY_AGENT_* and the config file name (as the agent
    itself reads them: device_agent/agent_dir.py); none named: every ./.orrery-agent/<device id>
    holding one."""
    cfg = which_agent(data_dir, config, token)
    if cfg is not None:
        data_dir = cfg.resolved_data_dir
        path = data_dir / LEDGER_NAME
        if not path.is_file():
            typer.echo(f"no agent ledger in {data_dir} (no {LEDGER_NAME}); pass the agent's --data-dir", err=True)
            raise typer.Exit(2)
        return [path]
    found = sorted(Path(".orrery-agent").glob(f"*/{LEDGER_NAME}"))
    if not found:
        typer.echo("no agent ledger under ./.orrery-agent; pass the agent's --data-dir", err=True)
        raise typer.Exit(2)
    return found


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        db.execute(f"SELECT {APPROVAL_COLUMNS} FROM approvals LIMIT 0")
    except sqlite3.OperationalError:
        db.close()
        typer.echo(f"{path} is from an agent without approvals; upgrade the agent", err=True)
        raise typer.Exit(2) from None
    return db


def _shown(rec: Approval) -> dict[str, object]:
    return {
        "id": rec.approval_id,
        "state": rec.state,
        "tool": rec.tool,
        "arguments": rec.arguments,
        "reason": rec.reason,
        "batch_id": rec.batch_id,
        "local_only": rec.local_only,
        "created_at": rec.created_at,
        "decided_by": rec.decided_by,
    }


@app.command("approvals")
def approvals(
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    all_states: Annotated[bool, typer.Option("--all", help="decided ones too")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON array")] = False,
) -> None:
    """List the approvals this device's agent waits for (with --all, decided ones too)."""
    found: list[Approval] = []
    for path in _ledgers(data_dir, config, token):
        db = _connect(path)
        try:
            where = "" if all_states else "WHERE state='pending'"
            rows = db.execute(f"SELECT {APPROVAL_COLUMNS} FROM approvals {where} ORDER BY created_at").fetchall()
        finally:
            db.close()
        found += [approval_from_row(r) for r in rows]
    if as_json:
        typer.echo(json.dumps([_shown(r) for r in found], indent=2))
        return
    if not found:
        typer.echo("nothing waits for approval" if not all_states else "no approvals recorded")
        return
    for rec in found:
        args = json.dumps(rec.arguments, ensure_ascii=False)
        typer.echo(f"{rec.approval_id}  {rec.state:9} {rec.tool}  {args[:200]}  ({rec.reason})")


def _decide(
    approval_id: str, state: str, reason: str, data_dir: Path | None, config: Path | None, token: str | None
) -> None:
    by = f"device owner {getpass.getuser()} (at the device)"
    for path in _ledgers(data_dir, config, token):
        db = _connect(path)
        try:
            row = db.execute(f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id=?", (approval_id,)).fetchone()
            if row is None:
                continue
            rec = approval_from_row(row)
            if rec.state != "pending":
                typer.echo(f"approval {approval_id} is already {rec.state} (by {rec.decided_by or '?'})", err=True)
                raise typer.Exit(1)
            cur = db.execute(
                "UPDATE approvals SET state=?, decided_by=?, decision_reason=?, decided_at=?, reported=0 "
                "WHERE approval_id=? AND state='pending'",
                (state, by, reason, time.time(), approval_id),
            )
            if cur.rowcount != 1:
                typer.echo(
                    f"approval {approval_id} was decided meanwhile; see 'orrery agent approvals --all'", err=True
                )
                raise typer.Exit(1)
        finally:
            db.close()
        typer.echo(f"{state} {approval_id} ({rec.tool}); the agent goes on within a second")
        return
    typer.echo(f"no approval '{approval_id}' on this device; see 'orrery agent approvals'", err=True)
    raise typer.Exit(1)


@app.command("approve")
def approve(
    approval_id: Annotated[str, typer.Argument(help="the id 'orrery agent approvals' shows")],
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    reason: Annotated[str, typer.Option(help="why (recorded with the decision)")] = "",
) -> None:
    """Approve a waiting command: it runs."""
    _decide(approval_id, "approved", reason, data_dir, config, token)


@app.command("deny")
def deny(
    approval_id: Annotated[str, typer.Argument(help="the id 'orrery agent approvals' shows")],
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    reason: Annotated[str, typer.Option(help="why (the model or the submitter reads it)")] = "",
) -> None:
    """Deny a waiting command: it never runs, and its node fails with approval_denied."""
    _decide(approval_id, "denied", reason, data_dir, config, token)


def _take(taken: bool, note: str, data_dir: Path | None, config: Path | None, token: str | None) -> None:
    by = f"device owner {getpass.getuser()} (at the device)"
    for path in _ledgers(data_dir, config, token):
        db = _connect(path)
        try:
            db.execute("BEGIN IMMEDIATE")  # one writer: two owner commands at once keep their order
            row = db.execute("SELECT value FROM meta WHERE key=?", (OWNER_TAKEOVER_KEY,)).fetchone()
            held = OwnerTakeoverState.model_validate_json(row[0]) if row is not None else None
            if held is not None and held.taken_over == taken:
                db.execute("ROLLBACK")
                typer.echo("the device is taken over by you already" if taken else "the device is not taken over")
                continue
            state = OwnerTakeoverState(
                taken_over=taken,
                note=note[:2000],
                by=by,
                since=datetime.now(UTC),
                gen=(held.gen if held is not None else 0) + 1,
            )
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (OWNER_TAKEOVER_KEY, state.model_dump_json()),
            )
            db.execute("COMMIT")
        finally:
            db.close()
        if taken:
            typer.echo("taken over: tasks pause before their next action; 'orrery agent handback --note ...' ends it")
        else:
            typer.echo("handed back: tasks go on within a second (the model reads your note and observes afresh)")


@app.command("takeover")
def takeover(
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
) -> None:
    """Take this device over yourself: tasks' input is refused and their agent nodes pause (not
    counting against their timeouts) until you hand it back."""
    _take(True, "", data_dir, config, token)


@app.command("handback")
def handback(
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    note: Annotated[str, typer.Option(help="what you did, for the model (it observes the screen afresh)")] = "",
) -> None:
    """Hand the device back to its tasks, with a note the model reads."""
    _take(False, note, data_dir, config, token)
