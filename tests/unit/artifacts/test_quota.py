"""Artifact quotas on a real store (SQLite and Postgres, both blob stores): a task and a device
may publish only so many bytes and uploads, the check holds when several processes (each with
its own store, as replicas have) open uploads at once, and what a failed or redundant upload
reserved is given back exactly once.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from orchestrator.artifacts import records
from orchestrator.artifacts.errors import IntegrityFailed, QuotaExceeded
from orchestrator.artifacts.model import UploadState
from orchestrator.artifacts.quota import Quota
from orchestrator.artifacts.uploads import Uploads
from orchestrator.store.models import ArtifactUpload
from orchestrator.store.repo import Store
from tests.unit.artifacts.conftest import AT, PIECE, World, sha
from tests.unit.artifacts.test_uploads import send_all


def uploads(world: World, quota: Quota, store: Store | None = None) -> Uploads:
    return Uploads(store or world.store, world.blobs, 10 * 1024 * 1024, PIECE, quota=quota)


async def publish(up: Uploads, name: str, data: bytes, batch: str = "b1", device: str = "dev_a") -> None:
    view = await up.open(device, batch, name, len(data), sha(data))
    await send_all(up, view, data, device)


async def upload_rows(world: World) -> int:
    async with world.store.sessions() as s:
        return len((await s.execute(ArtifactUpload.__table__.select())).all())


async def test_a_task_over_its_byte_quota_is_refused_before_anything_is_staged(world: World) -> None:
    up = uploads(world, Quota(task_bytes=1000))
    await publish(up, "a.bin", os.urandom(600))
    rows = await upload_rows(world)
    with pytest.raises(QuotaExceeded) as refused:
        await up.open("dev_a", "b1", "b.bin", 600, sha(os.urandom(600)))
    err = refused.value
    assert (err.status, err.code) == (413, "quota_exceeded")
    assert err.extra == {
        "scope": "task",
        "quota": "bytes",
        "limit": 1000,
        "used": 600,
        "setting": "ORRERY_ARTIFACT_TASK_QUOTA_BYTES",
    }
    assert "quota" in err.detail and "Do not publish again" in err.detail
    assert await upload_rows(world) == rows  # no upload opened, so no byte can be staged
    assert await records.usage(world.store, "task", "t1") == (600, 1)
    await publish(up, "c.bin", os.urandom(400))  # what is left can still be used
    assert await records.usage(world.store, "task", "t1") == (1000, 2)


async def test_one_file_larger_than_a_quota_is_refused_even_on_an_empty_task(world: World) -> None:
    up = uploads(world, Quota(task_bytes=100))
    with pytest.raises(QuotaExceeded) as refused:
        await up.open("dev_a", "b1", "big.bin", 101, sha(b"x" * 101))
    assert refused.value.extra["scope"] == "task" and refused.value.extra["used"] == 0
    assert await records.usage(world.store, "task", "t1") == (0, 0)


async def test_a_devices_quota_counts_what_it_published_in_every_task(world: World) -> None:
    await world.task("t2")
    await world.batch("b2", task_id="t2")
    up = uploads(world, Quota(device_bytes=1000))
    await publish(up, "a.bin", os.urandom(700))
    with pytest.raises(QuotaExceeded) as refused:
        await up.open("dev_a", "b2", "a.bin", 700, sha(os.urandom(700)))
    assert refused.value.extra["scope"] == "device" and refused.value.extra["used"] == 700
    assert refused.value.extra["setting"] == "ORRERY_ARTIFACT_DEVICE_QUOTA_BYTES"
    assert await records.usage(world.store, "task", "t2") == (0, 0)  # the task's reservation rolled back too
    await world.batch("b3", task_id="t2", device_id="dev_b")  # another device has its own quota
    await publish(up, "a.bin", os.urandom(700), batch="b3", device="dev_b")


async def test_a_task_may_publish_only_so_many_uploads(world: World) -> None:
    up = uploads(world, Quota(task_count=2))
    await publish(up, "a.bin", b"a")
    await publish(up, "b.bin", b"b")
    with pytest.raises(QuotaExceeded) as refused:
        await up.open("dev_a", "b1", "c.bin", 1, sha(b"c"))
    assert (refused.value.extra["quota"], refused.value.extra["limit"]) == ("count", 2)
    assert refused.value.extra["setting"] == "ORRERY_ARTIFACT_TASK_QUOTA_COUNT"


async def test_a_failed_upload_and_the_same_content_again_give_their_reservation_back(world: World) -> None:
    up = uploads(world, Quota(task_bytes=1200))  # room for a second copy while it is checked
    data = os.urandom(600)
    bad = await up.open("dev_a", "b1", "a.bin", len(data), sha(b"other" * 120))
    assert await records.usage(world.store, "task", "t1") == (600, 1)  # reserved at open
    with pytest.raises(IntegrityFailed):
        await send_all(up, bad, data)
    assert await records.usage(world.store, "task", "t1") == (0, 0)
    await publish(up, "a.bin", data)
    await publish(up, "a.bin", data)  # the same content again: the same version, nothing more stored
    assert await records.usage(world.store, "task", "t1") == (600, 1)
    await publish(up, "a.bin", data)
    assert await records.usage(world.store, "task", "t1") == (600, 1)
    # Ending an ended upload again (a racing replica, a sweep) gives nothing back a second time.
    assert not await records.end_upload(world.store, bad.id, UploadState.FAILED, AT, give_back=True)
    assert await records.usage(world.store, "task", "t1") == (600, 1)


async def test_an_upload_abandoned_by_its_batch_gives_its_bytes_back(world: World) -> None:
    up = uploads(world, Quota(task_bytes=10 * PIECE))
    data = os.urandom(3 * PIECE)
    view = await up.open("dev_a", "b1", "a.bin", len(data), sha(data))
    await up.receive("dev_a", view.id, 0, data[:PIECE])
    await world.end("b1")  # the device died mid-upload
    await world.batch("b2")
    up.clock = lambda: time.time() + 120  # the next open looks for abandoned uploads
    await up.open("dev_a", "b2", "b.bin", 1, sha(b"b"))
    assert await records.usage(world.store, "task", "t1") == (1, 1)


async def test_replicas_opening_uploads_at_once_never_go_past_the_quota(world: World) -> None:
    """Four processes' stores (their own connections, as replicas have) open 40 uploads of 100
    bytes at once against a quota of 1000: exactly 10 are accepted, and the count says 1000."""
    replicas = [Store(world.store.url) for _ in range(4)]
    try:
        ups = [uploads(world, Quota(task_bytes=1000), store) for store in replicas]
        datas = [os.urandom(100) for _ in range(40)]
        outcomes = await asyncio.gather(
            *(ups[i % 4].open("dev_a", "b1", f"f{i}.bin", 100, sha(d)) for i, d in enumerate(datas)),
            return_exceptions=True,
        )
    finally:
        for store in replicas:
            await store.close()
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, QuotaExceeded) for o in refused), refused
    assert len(outcomes) - len(refused) == 10
    assert await records.usage(world.store, "task", "t1") == (1000, 10)
