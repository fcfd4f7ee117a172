"""Uploads in process, on a real store and both blob stores: a device's publish survives lost
answers, racing retries and restarts, and nothing wrong is ever recorded.

Faults tried: a piece sent again after its answer was lost; two copies of a piece racing; a
piece at the wrong offset; the process restarting mid-upload (its running sha256 lost) and the
answer of the last piece lost; content that is not the declared sha256; a piece past the
declared size; finishing an upload that is short; the batch ending mid-upload; another device's
batch; over the size limit; the same content uploaded twice (in two tasks).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from orchestrator.artifacts import records
from orchestrator.artifacts.errors import (
    ArtifactNotFound,
    BatchClosed,
    IntegrityFailed,
    NotYourBatch,
    OffsetMismatch,
    TooLarge,
    UploadFailed,
    UploadIncomplete,
)
from orchestrator.artifacts.model import UploadState, UploadView
from orchestrator.artifacts.uploads import Uploads
from tests.unit.artifacts.conftest import PIECE, World, sha

DATA = os.urandom(5 * PIECE + 123)


async def send_all(uploads: Uploads, view: UploadView, data: bytes, device: str = "dev_a") -> UploadView:
    while view.state == UploadState.OPEN:
        piece = data[view.offset : view.offset + view.chunk_bytes]
        view = await uploads.receive(device, view.id, view.offset, piece)
    return view


async def test_an_upload_in_pieces_records_an_artifact_whose_blob_reads_back_whole(world: World) -> None:
    uploads = world.uploads()
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    assert (view.state, view.offset, view.chunk_bytes) == (UploadState.OPEN, 0, PIECE)
    done = await send_all(uploads, view, DATA)
    assert done.state == UploadState.COMPLETE and done.artifact is not None
    a = done.artifact
    assert (a.task_id, a.name, a.version, a.sha256, a.size) == ("t1", "big.bin", 1, sha(DATA), len(DATA))
    assert (a.node_id, a.batch_id, a.device_id) == ("n1", "b1", "dev_a")
    assert await world.read(a.sha256, 0, len(DATA)) == DATA
    assert await world.read(a.sha256, PIECE - 5, 2 * PIECE + 7) == DATA[PIECE - 5 : 2 * PIECE + 7]  # across chunks
    assert await records.newest(world.store, "t1", "big.bin") == a  # durable: read back from the store


async def test_a_piece_sent_again_after_its_answer_was_lost_is_told_where_to_go_on(world: World) -> None:
    uploads = world.uploads()
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    await uploads.receive("dev_a", view.id, 0, DATA[:PIECE])
    with pytest.raises(OffsetMismatch) as resent:
        await uploads.receive("dev_a", view.id, 0, DATA[:PIECE])
    assert resent.value.extra == {"offset": PIECE}
    with pytest.raises(OffsetMismatch):
        await uploads.receive("dev_a", view.id, 3 * PIECE, DATA[3 * PIECE : 4 * PIECE])  # a gap
    again = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))  # the publish asked again
    assert (again.id, again.offset) == (view.id, PIECE)
    done = await send_all(uploads, again, DATA)
    assert done.artifact is not None and await world.read(done.artifact.sha256, 0, len(DATA)) == DATA


async def test_two_copies_of_a_piece_racing_stage_it_once(world: World) -> None:
    uploads = world.uploads()
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    outcomes = await asyncio.gather(
        *(uploads.receive("dev_a", view.id, 0, DATA[:PIECE]) for _ in range(4)), return_exceptions=True
    )
    assert sum(isinstance(o, UploadView) for o in outcomes) == 1
    assert all(isinstance(o, OffsetMismatch) for o in outcomes if not isinstance(o, UploadView))
    assert (await uploads.status("dev_a", view.id)).offset == PIECE
    done = await send_all(uploads, await uploads.status("dev_a", view.id), DATA)
    assert done.artifact is not None and done.artifact.sha256 == sha(DATA)


async def test_a_restart_mid_upload_goes_on_from_what_is_staged_and_checks_it_all(world: World) -> None:
    first = world.uploads()
    view = await first.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    for offset in range(0, 3 * PIECE, PIECE):
        await first.receive("dev_a", view.id, offset, DATA[offset : offset + PIECE])
    restarted = world.uploads()  # a new process: the running sha256 is gone, the staged bytes are not
    resumed = await restarted.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    assert (resumed.id, resumed.offset) == (view.id, 3 * PIECE)
    done = await send_all(restarted, resumed, DATA)
    assert done.artifact is not None and await world.read(done.artifact.sha256, 0, len(DATA)) == DATA
    # The answer to the last piece was lost: the device asks again and learns it is complete.
    assert (await world.uploads().status("dev_a", view.id)).artifact == done.artifact
    finish = await world.uploads().receive("dev_a", view.id, len(DATA), b"")
    assert finish.state == UploadState.COMPLETE and finish.artifact == done.artifact


async def test_content_that_is_not_the_declared_sha256_is_refused_and_nothing_is_recorded(world: World) -> None:
    uploads = world.uploads()
    forged = bytearray(DATA)
    forged[PIECE + 1] ^= 0xFF
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    with pytest.raises(IntegrityFailed) as refused:
        await send_all(uploads, view, bytes(forged))
    assert refused.value.extra == {"sha256": sha(bytes(forged))}
    assert await records.newest(world.store, "t1", "big.bin") is None
    assert not await world.blobs.has(sha(DATA)) and not await world.blobs.has(sha(bytes(forged)))
    assert await world.blobs.staged(view.id) == 0  # its bytes are gone
    status = await uploads.status("dev_a", view.id)
    assert status.state == UploadState.FAILED and "not the declared" in (status.reason or "")
    with pytest.raises(UploadFailed):
        await uploads.receive("dev_a", view.id, 0, DATA[:PIECE])


async def test_a_short_upload_cannot_be_finished_and_bytes_past_its_size_are_refused(world: World) -> None:
    uploads = world.uploads()
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    await uploads.receive("dev_a", view.id, 0, DATA[:PIECE])
    with pytest.raises(UploadIncomplete) as short:
        await uploads.receive("dev_a", view.id, PIECE, b"")
    assert short.value.extra == {"offset": PIECE}
    with pytest.raises(TooLarge):
        await uploads.receive("dev_a", view.id, PIECE, DATA[PIECE:] + b"extra")
    assert await records.newest(world.store, "t1", "big.bin") is None
    assert (await uploads.status("dev_a", view.id)).offset == PIECE


async def test_an_upload_whose_batch_ends_is_dropped_and_nothing_more_is_taken(world: World) -> None:
    uploads = world.uploads()
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    await uploads.receive("dev_a", view.id, 0, DATA[:PIECE])
    await world.end("b1")
    with pytest.raises(BatchClosed):
        await uploads.receive("dev_a", view.id, PIECE, DATA[PIECE : 2 * PIECE])
    assert (await uploads.status("dev_a", view.id)).state == UploadState.FAILED
    assert await world.blobs.staged(view.id) == 0
    with pytest.raises(BatchClosed):
        await uploads.open("dev_a", "b1", "other.bin", 1, sha(b"x"))


async def test_abandoned_uploads_lose_their_bytes_when_the_next_one_opens(world: World) -> None:
    uploads = world.uploads()
    view = await uploads.open("dev_a", "b1", "big.bin", len(DATA), sha(DATA))
    await uploads.receive("dev_a", view.id, 0, DATA[:PIECE])
    await world.end("b1")  # the device died with the upload half done
    await world.batch("b2")
    await world.uploads().open("dev_a", "b2", "small.bin", 1, sha(b"x"))  # a new process, a new upload
    assert (await uploads.status("dev_a", view.id)).state == UploadState.FAILED
    assert await world.blobs.staged(view.id) == 0


async def test_only_the_batchs_own_device_may_upload_and_only_within_the_limit(world: World) -> None:
    uploads = world.uploads(max_bytes=1000)
    with pytest.raises(NotYourBatch):
        await uploads.open("dev_b", "b1", "x.bin", 10, sha(b"x"))
    with pytest.raises(NotYourBatch):
        await uploads.open("dev_a", "no-such-batch", "x.bin", 10, sha(b"x"))
    with pytest.raises(TooLarge):
        await uploads.open("dev_a", "b1", "x.bin", 1001, sha(b"x"))
    view = await uploads.open("dev_a", "b1", "x.bin", 1, sha(b"x"))
    with pytest.raises(ArtifactNotFound):
        await uploads.receive("dev_b", view.id, 0, b"x")  # another device cannot even see it


async def test_publishing_a_name_again_adds_a_version_unless_the_content_is_the_same(world: World) -> None:
    uploads = world.uploads()
    one, two = b"first\n", b"second\n"
    v1 = await send_all(uploads, await uploads.open("dev_a", "b1", "r.txt", len(one), sha(one)), one)
    same = await send_all(uploads, await uploads.open("dev_a", "b1", "r.txt", len(one), sha(one)), one)
    v2 = await send_all(uploads, await uploads.open("dev_a", "b1", "r.txt", len(two), sha(two)), two)
    assert v1.artifact is not None and same.artifact == v1.artifact  # idempotent: the same record
    assert v2.artifact is not None and v2.artifact.version == 2
    rows, _ = await records.page(world.store, "t1", True, 10, None)
    assert [(a.version, current) for a, current in rows] == [(2, True), (1, False)]
    assert await world.read(v1.artifact.sha256, 0, len(one)) == one  # history is kept readable


async def test_the_same_content_in_two_tasks_is_one_blob_read_by_both(world: World) -> None:
    await world.task("t2")
    await world.batch("b2", task_id="t2", device_id="dev_b")
    uploads = world.uploads()
    a = await send_all(uploads, await uploads.open("dev_a", "b1", "a.bin", len(DATA), sha(DATA)), DATA)
    b_view = await uploads.open("dev_b", "b2", "b.bin", len(DATA), sha(DATA))
    b = await send_all(uploads, b_view, DATA, device="dev_b")
    assert a.artifact is not None and b.artifact is not None and a.artifact.sha256 == b.artifact.sha256
    assert (b.artifact.task_id, b.artifact.name) == ("t2", "b.bin")
    assert await world.read(b.artifact.sha256, 0, len(DATA)) == DATA
    assert await world.blobs.staged(b_view.id) == 0  # the twin's staged copy was dropped
