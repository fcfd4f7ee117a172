"""Approvals in the store, for the API: read one, list them. Only the engine writes them
(`orchestrator.engine.approvals`): the request, the decisions asked of the device, and the
decision the device reports, each in a step commit."""

from __future__ import annotations

from sqlalchemy import select

from orchestrator.store.models import Approval
from orchestrator.store.repo import Store, decode_cursor, encode_cursor


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
