"""Both blob stores stream what they staged and promoted, exactly, in pieces of bounded size."""

from __future__ import annotations

import os

import pytest

from orchestrator.artifacts.blobs import READ_PIECE, FileBlobs
from orchestrator.artifacts.errors import ArtifactNotFound, OffsetMismatch
from tests.unit.artifacts.conftest import World, sha

DATA = os.urandom(3 * READ_PIECE + 4321)


async def stage(world: World, upload_id: str, data: bytes, piece: int = 100_000) -> None:
    for offset in range(0, len(data), piece):
        assert await world.blobs.append(upload_id, offset, data[offset : offset + piece]) == min(
            len(data), offset + piece
        )


async def test_staged_bytes_read_back_in_any_range_and_only_at_the_staged_end(world: World) -> None:
    await stage(world, "u1", DATA)
    assert await world.blobs.staged("u1") == len(DATA)
    for start, end in [(0, len(DATA)), (0, 1), (99_999, 100_001), (250_000, len(DATA)), (len(DATA) - 1, len(DATA))]:
        got = b"".join([p async for p in world.blobs.read_staged("u1", start, end)])
        assert got == DATA[start:end], (start, end)
    with pytest.raises(OffsetMismatch) as wrong:
        await world.blobs.append("u1", 5, b"x")
    assert wrong.value.extra == {"offset": len(DATA)}


async def test_a_promoted_blob_streams_in_bounded_pieces_and_promoting_again_changes_nothing(world: World) -> None:
    await stage(world, "u1", DATA)
    await world.blobs.promote("u1", sha(DATA), len(DATA))
    await world.blobs.promote("u1", sha(DATA), len(DATA))  # the answer was lost: asked again
    assert await world.blobs.has(sha(DATA))
    pieces = [p async for p in world.blobs.read(sha(DATA), 0, len(DATA))]
    assert b"".join(pieces) == DATA
    assert max(len(p) for p in pieces) <= max(READ_PIECE, 100_000)  # never the whole blob at once
    assert await world.read(sha(DATA), 123_456, 123_460) == DATA[123_456:123_460]
    await world.blobs.discard("u1")  # the upload is forgotten, its blob is not
    assert await world.read(sha(DATA), 0, len(DATA)) == DATA


async def test_a_twin_upload_of_a_stored_blob_leaves_one_blob_and_no_staged_copy(world: World) -> None:
    await stage(world, "u1", DATA)
    await world.blobs.promote("u1", sha(DATA), len(DATA))
    await stage(world, "u2", DATA)
    await world.blobs.promote("u2", sha(DATA), len(DATA))
    assert await world.blobs.staged("u2") == 0
    assert await world.read(sha(DATA), 0, len(DATA)) == DATA


async def test_a_blob_that_is_not_there_is_not_found(world: World) -> None:
    assert not await world.blobs.has("0" * 64)
    with pytest.raises(ArtifactNotFound):
        await world.read("0" * 64, 0, 1)


async def test_the_files_store_keeps_its_directory_private_and_names_blobs_by_content(world: World) -> None:
    if not isinstance(world.blobs, FileBlobs):
        pytest.skip("the files store only")
    await stage(world, "u1", DATA)
    await world.blobs.promote("u1", sha(DATA), len(DATA))
    path = world.blobs.blob_path(sha(DATA))
    assert path == world.tmp / "artifacts" / "blobs" / sha(DATA)[:2] / sha(DATA)
    assert path.read_bytes() == DATA and not (world.tmp / "artifacts" / "uploads" / "u1").exists()
    assert (world.tmp / "artifacts").stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_bytes(b"damaged")  # bit rot after the fact
    await stage(world, "u2", DATA)
    await world.blobs.promote("u2", sha(DATA), len(DATA))  # the next checked copy heals it
    assert path.read_bytes() == DATA
