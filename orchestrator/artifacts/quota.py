"""Artifact quotas: how many bytes, and how many uploads, one task and one device may publish.

A model looping `files.publish_artifact` must not fill the orchestrator's disk. Each upload
reserves its declared size (and one upload) against its task's and its device's `artifact_usage`
rows when it is opened, in the same transaction that records the upload: two conditional upserts,
each adding only while the sum stays within the quota, then the upload's insert. On Postgres the
upsert locks the usage row, so replicas opening uploads at once queue on it and each sees the
others' reservations; on SQLite the store's one writer serializes them. There is no check-then-
write window, and no byte is staged before its reservation holds (the declared size caps what a
piece may add: `TooLarge`).

A reservation is given back once, in the transaction that ends its upload, when the upload fails
(bad content, its batch ended) or records nothing new (the same content as the name's newest
version). A recorded artifact keeps it: Orrery deletes no artifacts, so the device quota counts
everything the device ever published.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.artifacts.errors import QuotaExceeded
from orchestrator.artifacts.sql import Step

UNLIMITED = 2**62  # what a quota of 0 (off) means in the statements

# Adds :size bytes and one upload to a usage row while both stay within the quota; no row back
# when it would go over. A new row needs no condition: `Quota.check_alone` refused a single
# upload over the quota before this runs.
_RESERVE = (
    "INSERT INTO artifact_usage (scope, owner_id, bytes, count) VALUES (:scope, :owner, :size, 1) "
    "ON CONFLICT (scope, owner_id) DO UPDATE SET bytes = artifact_usage.bytes + excluded.bytes, "
    "count = artifact_usage.count + 1 "
    "WHERE artifact_usage.bytes + excluded.bytes <= :max_bytes AND artifact_usage.count + 1 <= :max_count "
    "RETURNING bytes"
)
# Gives an upload's reservation back, if it holds one (`counted`); in the transaction that ends it.
_RELEASE = {
    scope: (
        "UPDATE artifact_usage SET bytes = bytes - (SELECT size FROM artifact_uploads WHERE id = :id), "
        f"count = count - 1 WHERE scope = '{scope}' AND owner_id = "
        f"(SELECT {column} FROM artifact_uploads WHERE id = :id AND counted) RETURNING bytes"
    )
    for scope, column in (("task", "task_id"), ("device", "device_id"))
}
_UNCOUNT = "UPDATE artifact_uploads SET counted = false WHERE id = :id RETURNING id"


@dataclass(frozen=True)
class Quota:
    """The quotas (0: none) as the settings give them."""

    task_bytes: int = 0
    task_count: int = 0
    device_bytes: int = 0
    device_count: int = 0

    def limits(self, scope: str) -> tuple[int, int]:
        """(bytes, uploads) a `scope` ("task" or "device") may hold, `UNLIMITED` for none."""
        got = (self.task_bytes, self.task_count) if scope == "task" else (self.device_bytes, self.device_count)
        return got[0] or UNLIMITED, got[1] or UNLIMITED

    def check_alone(self, name: str, size: int, task_id: str, device_id: str) -> None:
        """Refuse an upload that would be over a quota even if nothing else were counted."""
        for scope, owner in (("task", task_id), ("device", device_id)):
            max_bytes, _ = self.limits(scope)
            if size > max_bytes:
                raise exceeded(name, size, scope, owner, "bytes", max_bytes, 0)

    def reserve(self, task_id: str, device_id: str, size: int) -> list[Step]:
        """The steps that reserve `size` bytes and one upload for the task, then the device; a
        `transaction` that stops at step 0 or 1 is over that scope's quota."""
        steps = []
        for scope, owner in (("task", task_id), ("device", device_id)):
            max_bytes, max_count = self.limits(scope)
            params = {"scope": scope, "owner": owner, "size": size, "max_bytes": max_bytes, "max_count": max_count}
            steps.append(Step(_RESERVE, params))
        return steps


def release(upload_id: str) -> list[Step]:
    """The steps that give an upload's reservation back (nothing if it holds none); run them
    after the step that ends the upload, in its transaction, so it happens once."""
    params = {"id": upload_id}
    return [Step(_RELEASE["task"], params, False), Step(_RELEASE["device"], params, False), Step(_UNCOUNT, params)]


def exceeded(name: str, size: int, scope: str, owner: str, what: str, limit: int, used: int) -> QuotaExceeded:
    """The refusal, for whoever acts next (often a model): which quota, how full, what to do."""
    setting = f"ORRERY_ARTIFACT_{scope.upper()}_QUOTA_{'BYTES' if what == 'bytes' else 'COUNT'}"
    whose = f"this task ({owner})" if scope == "task" else f"this device ({owner})"
    if what == "bytes":
        told = (
            f"{whose} has published {used} of its {limit} bytes of artifacts, so {name!r} ({size} bytes) would go over"
        )
    else:
        told = f"{whose} has published {used} of its {limit} artifact uploads, so {name!r} would go over"
    return QuotaExceeded(
        f"artifact quota exceeded: {told} ({setting}). Nothing was uploaded. Do not publish again: publish fewer "
        "or smaller files (combine or compress them), or ask an operator to raise the quota",
        scope=scope,
        quota=what,
        limit=limit,
        used=used,
        setting=setting,
    )
