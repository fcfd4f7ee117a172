"""Approvals in the store (issue 18): read, list, and decide with one conditional update.

The engine inserts an approval (with its node's state change, in its group commit). Whoever
decides, an operator over the API, the device's owner (reported by the agent), or the expiry,
does so here: `UPDATE ... WHERE id = ? AND state = 'pending'`. The first one wins, on any
replica; the others learn that it was decided already. The engine then acts on the row.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update

from orchestrator.store.models import Approval
from orchestrator.store.repo import Store, decode_cursor, encode_cursor
from orchestrator.store.sqlite_writer import sqlite_datetime

DECIDED = ("approved", "denied", "expired", "cancelled")


async def get(store: Store, approval_id: str) -> Approval | None:
    async with store.sessions() as s:
        return await s.get(Approval, approval_id)


async def page(
    store: Store, state: str | None, task_id: str | None, limit: int, cursor: str | None, newest_first: bool = False
) -> tuple[list[Approval], str | None]:
    """Approvals oldest first (the queue's order) or newest first (a history), keyset-paginated
    on (created_at, id)."""
    if newest_first:
        q = select(Approval).order_by(Approval.created_at.desc(), Approval.id.desc()).limit(limit + 1)
    else:
        q = select(Approval).order_by(Approval.created_at, Approval.id).limit(limit + 1)
    if state:
        q = q.where(Approval.state == state)
    if task_id:
        q = q.where(Approval.task_id == task_id)
    if cursor:
        at, aid = decode_cursor(cursor)
        if newest_first:
            q = q.where((Approval.created_at < at) | ((Approval.created_at == at) & (Approval.id < aid)))
        else:
            q = q.where((Approval.created_at > at) | ((Approval.created_at == at) & (Approval.id > aid)))
    async with store.sessions() as s:
        rows = list((await s.execute(q)).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].created_at, rows[-1].id) if more and rows else None


async def pending(store: Store) -> list[Approval]:
    """Every approval still waiting (the engine's recovery)."""
    async with store.sessions() as s:
        return list((await s.execute(select(Approval).where(Approval.state == "pending"))).scalars())


async def pending_states(store: Store, ids: list[str]) -> dict[str, str]:
    """The state of each approval named (the engine's check for decisions it did not hear of)."""
    if not ids:
        return {}
    async with store.sessions() as s:
        rows = (await s.execute(select(Approval.id, Approval.state).where(Approval.id.in_(ids)))).all()
    return {str(r[0]): str(r[1]) for r in rows}


async def decide(store: Store, approval_id: str, state: str, by: str, reason: str, at: datetime) -> bool:
    """Decide a pending approval; False if it was decided already (or does not exist)."""
    if state not in DECIDED:
        raise ValueError(f"not a decision: {state}")
    writer = store.sqlite
    if writer is not None:
        rows = writer.execute(
            "UPDATE approvals SET state = ?, decided_by = ?, decision_reason = ?, decided_at = ? "
            "WHERE id = ? AND state = 'pending' RETURNING id",
            (state, by[:200], reason, sqlite_datetime(at), approval_id),
        )
        return bool(rows)
    async with store.engine.begin() as conn:
        result = await conn.execute(
            update(Approval)
            .where(Approval.id == approval_id, Approval.state == "pending")
            .values(state=state, decided_by=by[:200], decision_reason=reason, decided_at=at)
        )
        return bool(result.rowcount)
