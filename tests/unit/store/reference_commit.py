"""The group commit written plainly in SQLAlchemy Core: the reference the store's own writers
(SQLite's planned statements, Postgres's one statement of CTEs) must write the same rows as."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from sqlalchemy import Connection, Table, and_, bindparam

from orchestrator.store.models import Base, Event
from orchestrator.store.repo import _INSERT_ORDER, ChangeSet


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


def reference_write(conn: Connection, changes: ChangeSet) -> list[int]:
    """Inserts (parents first, executemany), keyed updates, deletes, then the events; their ids."""
    for model in _INSERT_ORDER:
        rows = changes.inserts.get(model)
        if rows:
            conn.execute(_table(model).insert(), rows)
    for model, by_key in changes.updates.items():
        table = _table(model)
        pk = list(table.primary_key.columns)
        groups: dict[frozenset[str], list[dict[str, Any]]] = defaultdict(list)
        for key, values in by_key.items():
            row = {f"k_{c.name}": v for c, v in zip(pk, key, strict=True)} | {f"v_{k}": v for k, v in values.items()}
            groups[frozenset(row)].append(row)
        for group in groups.values():
            columns = [k[2:] for k in group[0] if k.startswith("v_")]
            stmt = (
                table.update()
                .where(and_(*(c == bindparam(f"k_{c.name}") for c in pk)))
                .values({name: bindparam(f"v_{name}") for name in columns})
            )
            conn.execute(stmt, group)
    for model, keys in changes.deletes.items():
        table = _table(model)
        pk = list(table.primary_key.columns)
        for key in keys:
            conn.execute(table.delete().where(and_(*(c == v for c, v in zip(pk, key, strict=True)))))
    if not changes.events:
        return []
    events = _table(Event)
    result = conn.execute(events.insert().returning(events.c.id, sort_by_parameter_order=True), changes.events)
    return [int(r[0]) for r in result]
