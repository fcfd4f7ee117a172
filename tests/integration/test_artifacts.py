"""Artifacts end to end (issue 20): real orchestrator and agent processes on loopback.

A command publishes a workspace file (files.publish_artifact) and a node on another device
fetches it (files.fetch_artifact); people list and download it through the API, the CLI (and the
dashboard, tests/web/test_artifacts_page.py). With ORRERY_TEST_BACKEND=postgres (scripts/check
stage 4) the same tests run on Postgres with the database blob store.

Faults and refusals tried here: a 50 MB file (memory measured on the server and both agents);
publishing and fetching again; content that is not its declared sha256, a short upload, bytes
past the declared size, over the server's and the device's limits; API keys, no token, another
device's token and a revoked one on the device routes; a batch that has ended; another task's
artifact; paths out of the workspace and NUL bytes; a blob damaged in the store (the fetching
agent and the CLI both catch it). Restarts and cut connections mid-transfer:
tests/chaos/test_artifact_restarts.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Agent, Fleet, run_cli, shell, wait_until

MiB = 1024 * 1024
SERVER_LIMIT = 64 * MiB
TINY_LIMIT = 100  # the "tiny" agent's own cap (ORRERY_AGENT_MAX_ARTIFACT_BYTES)
DEVICE = "/v1/agent/artifacts"  # the device agents' routes


def publish(path: str, name: str | None = None, timeout_s: float = 120) -> dict[str, Any]:
    args: dict[str, Any] = {"path": path, **({"name": name} if name else {})}
    return {"tool": "files.publish_artifact", "arguments": args, "timeout_s": timeout_s}


def fetch(path: str, timeout_s: float = 120, **which: str) -> dict[str, Any]:
    return {"tool": "files.fetch_artifact", "arguments": {"path": path, **which}, "timeout_s": timeout_s}


def node(node_id: str, device: str, *commands: dict[str, Any]) -> dict[str, Any]:
    return {"id": node_id, "placement": {"device": device}, "commands": list(commands)}


def dag(*nodes: dict[str, Any], edges: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    return {"nodes": list(nodes), "edges": [{"from": a, "to": b} for a, b in edges or []]}


def hand_over(producer: Agent, path: str, consumer: Agent, target: str, name: str) -> dict[str, Any]:
    """A DAG: `producer` publishes `path` as `name`, then `consumer` fetches it to `target`."""
    return dag(
        node("pub", producer.device_id, publish(path, name=name)),
        node("get", consumer.device_id, fetch(target, name=name)),
        edges=[("pub", "get")],
    )


def random_file(path: Path, size: int) -> str:
    """Write `size` random bytes to `path` in pieces; their sha256."""
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        left = size
        while left:
            piece = os.urandom(min(MiB, left))
            f.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def sha_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while piece := f.read(MiB):
            digest.update(piece)
    return digest.hexdigest()


def run(fleet: Fleet, spec: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    return fleet.wait_task(fleet.submit(spec)["id"], timeout=timeout)


def failure_of(task: dict[str, Any], node_id: str) -> dict[str, Any]:
    (n,) = [n for n in task["nodes"] if n["id"] == node_id]
    assert n["state"] == "failed", n
    error: dict[str, Any] = n["attempts"][-1]["results"][-1]["error"]
    return error


def output(fleet: Fleet, task: dict[str, Any], node_id: str) -> dict[str, Any]:
    result: dict[str, Any] = fleet.node(task, node_id)["output"]
    return result


def memory(pid: int) -> dict[str, int]:
    """The process's resident set now and at its peak (kB, /proc/PID/status)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines) if k in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> int:
    """Start measuring the peak afresh (clear_refs 5: VmHWM := VmRSS); the resident set now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return memory(pid)["VmRSS"]


def device_client(fleet: Fleet, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=fleet.server.url, headers=headers, timeout=30)


@contextlib.contextmanager
def open_batch(fleet: Fleet, agent: Agent) -> Iterator[tuple[str, str]]:
    """A batch running on `agent` (a long sleep) for the test to act in as the device; its task
    and batch ids. The task is cancelled afterwards."""
    task = fleet.submit(dag(node("hold", agent.device_id, shell(["sleep", "60"]))))

    def running() -> str | None:
        n = fleet.node(fleet.task(task["id"]), "hold")
        return n["attempts"][-1]["batch_id"] if n["state"] == "running" and n["attempts"] else None

    batch_id = wait_until(running, 30, "the holding batch to run")
    try:
        yield task["id"], batch_id
    finally:
        with fleet.server.client() as c:
            c.post(f"/v1/tasks/{task['id']}/cancel")
        fleet.wait_task(task["id"])


def corrupt_blob(fleet: Fleet, sha256: str) -> None:
    """Flip one byte of a stored blob, in whichever store the server uses. Flipped, not set: a
    random blob's byte already holding the value set (1 in 256) would leave it intact."""
    blob = fleet.server.data_dir / "artifacts" / "blobs" / sha256[:2] / sha256
    if blob.exists():
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        return
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    async def flip() -> None:
        engine = create_async_engine(fleet.server.env["ORRERY_DATABASE_URL"])
        async with engine.begin() as conn:
            flipped = await conn.execute(
                text(
                    "UPDATE artifact_chunks SET data = set_byte(data, 0, get_byte(data, 0) # 255) "
                    "WHERE upload_id = (SELECT upload_id FROM artifact_blobs WHERE sha256 = :s) AND start_byte = 0"
                ),
                {"s": sha256},
            )
            assert flipped.rowcount == 1, f"{flipped.rowcount} chunks of blob {sha256} were damaged, not one"
        await engine.dispose()

    asyncio.run(flip())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("artifacts"), max_artifact_bytes=str(SERVER_LIMIT)) as f:
        f.agent("producer")
        f.agent("consumer")
        f.agent("tiny", ORRERY_AGENT_MAX_ARTIFACT_BYTES=str(TINY_LIMIT))
        yield f


def agents(fleet: Fleet) -> tuple[Agent, Agent, Agent]:
    producer, consumer, tiny = fleet.agents
    return producer, consumer, tiny


# ---------------------------------------------------------------- moving files


def test_a_50_mb_file_moves_between_two_agents_streamed_checked_and_in_bounded_memory(fleet: Fleet) -> None:
    producer, consumer, _ = agents(fleet)
    # A small transfer first: what a process sets up once (TLS defaults, code paths, the store's
    # caches) is not what this measures. Growth was ~8 MiB for 50 and for 100 MiB on the fetching
    # agent, 1-3 MiB on the others: bounded, whatever the file's size.
    random_file(producer.workspace / "warm.bin", MiB)
    assert run(fleet, hand_over(producer, "warm.bin", consumer, "warm.bin", "warm.bin"))["state"] == "succeeded"
    size = 50 * MiB
    digest = random_file(producer.workspace / "logs" / "merged.log", size)
    assert fleet.server.proc is not None and producer.proc is not None and consumer.proc is not None
    pids = {"server": fleet.server.proc.pid, "producer": producer.proc.pid, "consumer": consumer.proc.pid}
    before = {name: reset_peak(pid) for name, pid in pids.items()}
    task = run(fleet, hand_over(producer, "logs/merged.log", consumer, "in/merged.log", "merged.log"), timeout=240)
    grown = {name: memory(pid)["VmHWM"] - before[name] for name, pid in pids.items()}
    assert task["state"] == "succeeded", task
    published, fetched = output(fleet, task, "pub"), output(fleet, task, "get")
    assert {k: published[k] for k in ("name", "version", "sha256", "size")} == {
        "name": "merged.log",
        "version": 1,
        "sha256": digest,
        "size": size,
    }
    assert fetched["path"] == "in/merged.log" and fetched["sha256"] == digest and fetched["size"] == size
    assert sha_of(consumer.workspace / "in" / "merged.log") == digest
    assert [p.name for p in (consumer.workspace / "in").iterdir()] == ["merged.log"]  # no partial left
    # Streamed, never held whole: no process's peak grew by anything near the file's 50 MiB.
    assert all(kb < 16 * 1024 for kb in grown.values()), f"peak resident set grew (kB): {grown}"
    print(f"peak resident set growth moving 50 MiB (kB): {grown}")


def test_publishing_and_fetching_twice_changes_nothing(fleet: Fleet) -> None:
    """Both tools are annotated idempotent (tests/unit/device_agent/test_retry_safety.py counts on
    this test): the second publish is the same artifact version, the second fetch the same file."""
    producer, consumer, _ = agents(fleet)
    digest = random_file(producer.workspace / "twice.bin", 300_000)
    target = consumer.workspace / "got" / "twice.bin"

    def state() -> tuple[int, bytes, list[str]]:
        return target.stat().st_mode, target.read_bytes(), sorted(p.name for p in target.parent.iterdir())

    task = run(
        fleet,
        dag(
            node("pub", producer.device_id, publish("twice.bin"), publish("twice.bin")),
            node("once", consumer.device_id, fetch("got/twice.bin", name="twice.bin")),
            edges=[("pub", "once")],
        ),
    )
    assert task["state"] == "succeeded", task
    first, second = (r["result"] for r in fleet.node(task, "pub")["attempts"][-1]["results"])
    assert first == second and first["version"] == 1
    once = state()
    twice = run(
        fleet,
        dag(
            node("pub", producer.device_id, publish("twice.bin")),
            node(
                "twice",
                consumer.device_id,
                fetch("got/twice.bin", name="twice.bin"),
                fetch("got/twice.bin", sha256=digest),
            ),
            edges=[("pub", "twice")],
        ),
    )
    assert twice["state"] == "succeeded", twice
    assert state() == once
    with fleet.server.client() as c:
        history = c.get(f"/v1/tasks/{task['id']}/artifacts", params={"history": "true"}).json()["items"]
    assert [(a["name"], a["version"], a["sha256"]) for a in history] == [("twice.bin", 1, digest)]


def test_a_name_published_again_with_other_content_is_a_new_version_and_the_old_one_is_kept(fleet: Fleet) -> None:
    producer, consumer, _ = agents(fleet)
    (producer.workspace / "report-v1.txt").write_text("draft\n")
    (producer.workspace / "report-v2.txt").write_text("final\n")
    task = run(
        fleet,
        dag(
            node("draft", producer.device_id, publish("report-v1.txt", name="report.txt")),
            node("final", producer.device_id, publish("report-v2.txt", name="report.txt")),
            node("read", consumer.device_id, fetch("report.txt", name="report.txt")),
            edges=[("draft", "final"), ("final", "read")],
        ),
    )
    assert task["state"] == "succeeded", task
    assert (consumer.workspace / "report.txt").read_text() == "final\n"  # a name fetches its newest version
    with fleet.server.client() as c:
        current = c.get(f"/v1/tasks/{task['id']}/artifacts").json()["items"]
        history = c.get(f"/v1/tasks/{task['id']}/artifacts", params={"history": "true"}).json()["items"]
        old = c.get(f"/v1/tasks/{task['id']}/artifacts/report.txt/content", params={"version": 1})
    assert [(a["version"], a["current"], a["node_id"]) for a in current] == [(2, True, "final")]
    assert [(a["version"], a["current"]) for a in history] == [(2, True), (1, False)]
    assert old.content == b"draft\n"


# ---------------------------------------------------------------- people: API and CLI


def test_the_api_lists_describes_and_streams_artifacts_with_range_etag_and_short_lived_links(fleet: Fleet) -> None:
    producer, _, _ = agents(fleet)
    data = os.urandom(200_000)
    (producer.workspace / "api.bin").write_bytes(data)
    task = run(fleet, dag(node("pub", producer.device_id, publish("api.bin"))))
    assert task["state"] == "succeeded", task
    digest = hashlib.sha256(data).hexdigest()
    base = f"/v1/tasks/{task['id']}/artifacts"
    with fleet.server.client() as admin:
        viewer_key = admin.post("/v1/api-keys", json={"role": "viewer"}).json()
    with fleet.server.client(viewer_key["key"]) as c:
        (item,) = c.get(base).json()["items"]
        assert {k: item[k] for k in ("name", "version", "current", "sha256", "size", "node_id", "device_id")} == {
            "name": "api.bin",
            "version": 1,
            "current": True,
            "sha256": digest,
            "size": len(data),
            "node_id": "pub",
            "device_id": producer.device_id,
        }
        assert c.get(f"{base}/api.bin").json() == item
        whole = c.get(item["content_url"])
        assert whole.status_code == 200 and whole.content == data
        assert whole.headers["content-length"] == str(len(data)) and whole.headers["etag"] == f'"{digest}"'
        part = c.get(f"{base}/api.bin/content", headers={"Range": "bytes=1000-1999"})
        assert part.status_code == 206 and part.content == data[1000:2000]
        assert part.headers["content-range"] == f"bytes 1000-1999/{len(data)}"
        stale = c.get(f"{base}/api.bin/content", headers={"Range": "bytes=10-", "If-Range": '"other"'})
        assert stale.status_code == 200 and stale.content == data
        assert c.get(f"{base}/api.bin/content", headers={"If-None-Match": f'"{digest}"'}).status_code == 304
        beyond = c.get(f"{base}/api.bin/content", headers={"Range": f"bytes={len(data)}-"})
        assert beyond.status_code == 416 and beyond.json()["code"] == "range_not_satisfiable"
        missing = c.get(f"{base}/nothing.bin")
        assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
        assert c.get(f"{base}/api.bin", params={"version": 2}).status_code == 404
        link = c.post(f"{base}/api.bin/link")
        assert link.status_code == 200, link.text
    followed = httpx.get(f"{fleet.server.url}{link.json()['url']}")  # no API key: the link is the permission
    assert followed.status_code == 200 and followed.content == data
    assert followed.headers["content-disposition"].startswith('attachment; filename="api.bin"')
    assert viewer_key["key"] not in link.json()["url"]
    tampered = link.json()["url"][:-2] + ("00" if not link.json()["url"].endswith("00") else "11")
    assert httpx.get(f"{fleet.server.url}{tampered}").status_code == 404
    with fleet.server.client() as admin:
        assert admin.delete(f"/v1/api-keys/{viewer_key['id']}").status_code in (200, 204)
    revoked = httpx.get(f"{fleet.server.url}{link.json()['url']}")
    assert revoked.status_code == 410 and revoked.json()["code"] == "link_expired"
    assert httpx.get(f"{fleet.server.url}{base}").status_code == 401  # listing needs a key


def test_the_cli_lists_and_gets_an_artifact_checking_its_sha256(fleet: Fleet, tmp_path: Path) -> None:
    producer, _, _ = agents(fleet)
    digest = random_file(producer.workspace / "cli.bin", 3 * MiB + 5)
    task = run(fleet, dag(node("pub", producer.device_id, publish("cli.bin"))))
    assert task["state"] == "succeeded", task
    listed = run_cli(fleet, "artifacts", "list", task["id"])
    assert listed.returncode == 0, listed.stderr
    assert "cli.bin" in listed.stdout and digest in listed.stdout and "producer" in listed.stdout
    as_json = json.loads(run_cli(fleet, "artifacts", "list", task["id"], "--json").stdout)
    assert [(a["name"], a["sha256"]) for a in as_json] == [("cli.bin", digest)]
    got = run_cli(fleet, "artifacts", "get", task["id"], "cli.bin", "-o", str(tmp_path / "out.bin"))
    assert got.returncode == 0, got.stderr
    assert sha_of(tmp_path / "out.bin") == digest and digest in got.stdout
    into_dir = run_cli(fleet, "artifacts", "get", task["id"], "cli.bin", "-o", str(tmp_path))
    assert into_dir.returncode == 0 and sha_of(tmp_path / "cli.bin") == digest
    nothing = run_cli(fleet, "artifacts", "get", task["id"], "nope.bin", "-o", str(tmp_path / "nope.bin"))
    assert nothing.returncode == 1 and "not_found" in nothing.stderr and not (tmp_path / "nope.bin").exists()


def test_a_damaged_blob_is_caught_by_the_fetching_agent_and_the_cli_and_never_saved(
    fleet: Fleet, tmp_path: Path
) -> None:
    producer, consumer, _ = agents(fleet)
    digest = random_file(producer.workspace / "fragile.bin", 2 * MiB)
    keep = consumer.workspace / "keep"
    keep.mkdir(exist_ok=True)
    (keep / "fragile.bin").write_text("the old file\n")
    (consumer.workspace / "go").unlink(missing_ok=True)
    gate = shell(["sh", "-c", "until [ -e go ]; do sleep 0.05; done"], timeout_s=60)
    task = fleet.submit(
        dag(
            node("pub", producer.device_id, publish("fragile.bin")),
            node("gate", consumer.device_id, gate),
            node("get", consumer.device_id, fetch("keep/fragile.bin", name="fragile.bin")),
            edges=[("pub", "gate"), ("gate", "get")],
        )
    )
    wait_until(lambda: fleet.node(fleet.task(task["id"]), "pub")["state"] == "succeeded", 60, "the publish")
    corrupt_blob(fleet, digest)  # bit rot in the store, after the upload was checked
    got = run_cli(fleet, "artifacts", "get", task["id"], "fragile.bin", "-o", str(tmp_path / "fragile.bin"))
    assert got.returncode == 1 and "integrity_error" in got.stderr
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial one
    (consumer.workspace / "go").touch()
    done = fleet.wait_task(task["id"])
    error = failure_of(done, "get")
    assert error["code"] == "integrity_error" and "removed" in error["message"]
    assert (keep / "fragile.bin").read_text() == "the old file\n"  # untouched
    assert sorted(p.name for p in keep.iterdir()) == ["fragile.bin"]


# ---------------------------------------------------------------- refusals


def test_the_device_routes_take_only_the_batchs_own_device_token(fleet: Fleet) -> None:
    producer, consumer, _ = agents(fleet)
    body = {"name": "x.bin", "size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    with open_batch(fleet, producer) as (_, batch_id):
        body["batch_id"] = batch_id
        with device_client(fleet, None) as c:
            assert c.post(f"{DEVICE}/uploads", json=body).status_code == 401
        with device_client(fleet, fleet.server.api_key) as c:
            refused = c.post(f"{DEVICE}/uploads", json=body)
            assert refused.status_code == 403 and "device token" in refused.json()["detail"]
        with device_client(fleet, consumer.token) as c:
            other = c.post(f"{DEVICE}/uploads", json=body)
            assert other.status_code == 403 and other.json()["code"] == "batch_not_yours"
            assert c.get(DEVICE, params={"batch_id": batch_id, "name": "x.bin"}).json()["code"] == "batch_not_yours"
        with device_client(fleet, "orrd_dev_nobody.forged") as c:
            assert c.post(f"{DEVICE}/uploads", json=body).status_code == 401
        with device_client(fleet, producer.token) as c:
            opened = c.post(f"{DEVICE}/uploads", json=body)
            assert opened.status_code == 201, opened.text
            assert c.get(f"{DEVICE}/uploads/{opened.json()['id']}").json()["offset"] == 0
        with device_client(fleet, consumer.token) as c:  # another device cannot see that upload
            assert c.get(f"{DEVICE}/uploads/{opened.json()['id']}").status_code == 404
    with device_client(fleet, producer.token) as c:  # the batch has ended
        closed = c.post(f"{DEVICE}/uploads", json=body)
        assert closed.status_code == 409 and closed.json()["code"] == "batch_closed"
    with fleet.server.client() as admin:
        doomed = fleet.enroll("doomed")
        admin.delete(f"/v1/devices/{doomed['id']}")
    with device_client(fleet, doomed["token"]) as c:
        assert c.post(f"{DEVICE}/uploads", json=body).status_code == 401  # a revoked device's token


def test_a_recording_is_taken_after_its_attempt_ended_and_nothing_else_is(fleet: Fleet) -> None:
    """A screen recording is encoded once the orchestrator told the device its attempt ended and
    that it keeps it: its upload (`recording-....webm`) is taken for the ended batch, within the
    late window, from the batch's own device only; any other name is refused as before."""
    producer, consumer, _ = agents(fleet)
    video = b"\x1a\x45\xdf\xa3 a recording"
    recording = {"name": "recording-hold-1.webm", "size": len(video), "sha256": hashlib.sha256(video).hexdigest()}
    other = {"name": "late.bin", "size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    with open_batch(fleet, producer) as (task_id, batch_id):
        pass
    with device_client(fleet, producer.token) as c:  # the batch has ended
        refused = c.post(f"{DEVICE}/uploads", json={**other, "batch_id": batch_id})
        assert refused.status_code == 409 and refused.json()["code"] == "batch_closed"
        opened = c.post(f"{DEVICE}/uploads", json={**recording, "batch_id": batch_id})
        assert opened.status_code == 201, opened.text
        sent = c.patch(f"{DEVICE}/uploads/{opened.json()['id']}", content=video, headers={"Upload-Offset": "0"})
        assert sent.status_code == 200, sent.text
    with device_client(fleet, consumer.token) as c:
        assert c.post(f"{DEVICE}/uploads", json={**recording, "batch_id": batch_id}).status_code == 403
    with fleet.server.client() as admin:
        listed = admin.get(f"/v1/tasks/{task_id}/artifacts").json()["items"]
    (kept,) = [a for a in listed if a["name"] == "recording-hold-1.webm"]
    assert kept["size"] == len(video) and kept["content_type"] == "video/webm"


def test_a_corrupted_short_or_oversized_upload_is_refused_and_records_nothing(fleet: Fleet) -> None:
    producer, _, _ = agents(fleet)
    data = os.urandom(3 * MiB)
    digest = hashlib.sha256(data).hexdigest()
    with open_batch(fleet, producer) as (task_id, batch_id), device_client(fleet, producer.token) as c:
        declare = {"batch_id": batch_id, "size": len(data), "sha256": digest}
        too_big = c.post(f"{DEVICE}/uploads", json={**declare, "name": "huge.bin", "size": SERVER_LIMIT + 1})
        assert too_big.status_code == 413 and too_big.json()["code"] == "artifact_too_large"
        assert "ORRERY_MAX_ARTIFACT_BYTES" in too_big.json()["detail"]

        bad = c.post(f"{DEVICE}/uploads", json={**declare, "name": "forged.bin"}).json()
        forged = bytearray(data)
        forged[-1] ^= 1
        offset, answer = 0, None
        while offset < len(data):
            piece = bytes(forged[offset : offset + bad["chunk_bytes"]])
            answer = c.patch(f"{DEVICE}/uploads/{bad['id']}", content=piece, headers={"Upload-Offset": str(offset)})
            offset += len(piece)
        assert answer is not None and answer.status_code == 422 and answer.json()["code"] == "integrity_error"
        assert c.get(f"{DEVICE}/uploads/{bad['id']}").json()["state"] == "failed"

        short = c.post(f"{DEVICE}/uploads", json={**declare, "name": "short.bin"}).json()
        half = short["chunk_bytes"]
        assert (
            c.patch(f"{DEVICE}/uploads/{short['id']}", content=data[:half], headers={"Upload-Offset": "0"}).status_code
            == 200
        )
        finish = c.patch(f"{DEVICE}/uploads/{short['id']}", content=b"", headers={"Upload-Offset": str(half)})
        assert finish.status_code == 409 and finish.json()["code"] == "upload_incomplete"
        assert finish.json()["offset"] == half
        past = c.patch(
            f"{DEVICE}/uploads/{short['id']}", content=data[half:] + b"!", headers={"Upload-Offset": str(half)}
        )
        assert past.status_code == 413
        gap = c.patch(f"{DEVICE}/uploads/{short['id']}", content=data[:10], headers={"Upload-Offset": str(half + 10)})
        assert gap.status_code == 409 and gap.json()["code"] == "offset_mismatch" and gap.json()["offset"] == half
        no_offset = c.patch(f"{DEVICE}/uploads/{short['id']}", content=b"abc")
        assert no_offset.status_code == 422
        with fleet.server.client() as admin:
            assert admin.get(f"/v1/tasks/{task_id}/artifacts", params={"history": "true"}).json()["items"] == []


def test_a_node_cannot_fetch_another_tasks_artifacts(fleet: Fleet) -> None:
    producer, consumer, _ = agents(fleet)
    digest = random_file(producer.workspace / "secret.bin", 10_000)
    first = run(fleet, dag(node("pub", producer.device_id, publish("secret.bin"))))
    assert first["state"] == "succeeded", first
    by_name = run(fleet, dag(node("peek", consumer.device_id, fetch("stolen.bin", name="secret.bin"))))
    by_sha = run(fleet, dag(node("peek", consumer.device_id, fetch("stolen.bin", sha256=digest))))
    for task in (by_name, by_sha):
        assert failure_of(task, "peek")["code"] == "artifact_not_found"
    assert not (consumer.workspace / "stolen.bin").exists()
    with open_batch(fleet, consumer) as (_, batch_id), device_client(fleet, consumer.token) as c:
        assert c.get(f"{DEVICE}/{digest}/content", params={"batch_id": batch_id}).status_code == 404


def test_over_a_limit_nothing_moves_and_the_error_says_which_limit(fleet: Fleet) -> None:
    producer, _, tiny = agents(fleet)
    (tiny.workspace / "big.txt").write_text("x" * (TINY_LIMIT + 1))
    (producer.workspace / "small.txt").write_text("y" * (TINY_LIMIT + 1))
    own = run(fleet, dag(node("pub", tiny.device_id, publish("big.txt"))))
    error = failure_of(own, "pub")
    assert error["code"] == "artifact_too_large" and "this device's limit" in error["message"]
    task = run(fleet, hand_over(producer, "small.txt", tiny, "small.txt", "small.txt"))
    assert failure_of(task, "get")["code"] == "artifact_too_large"
    assert not (tiny.workspace / "small.txt").exists()


def test_a_name_ending_in_a_newline_is_refused_by_the_agent_and_by_the_orchestrator(fleet: Fleet) -> None:
    """`$` in a Python regex also matches before a final newline: the file `rep\n` (the default
    name) was published, and its download link dropped the connection (`Illegal header value`)."""
    producer, _, _ = agents(fleet)
    (producer.workspace / "rep\n").write_text("the report\n")
    task = run(fleet, dag(node("pub", producer.device_id, publish("rep\n"))))
    error = failure_of(task, "pub")
    assert error["code"] == "invalid_arguments" and "cannot be an artifact name" in error["message"], error
    digest = hashlib.sha256(b"the report\n").hexdigest()
    with open_batch(fleet, producer) as (task_id, batch_id), device_client(fleet, producer.token) as c:
        for name in ("rep\n", "rep\r\n"):  # a device that skips its own check
            body = {"batch_id": batch_id, "name": name, "size": 11, "sha256": digest}
            refused = c.post(f"{DEVICE}/uploads", json=body)
            assert refused.status_code == 422 and refused.json()["code"] == "validation_error", refused.text
            looked_up = c.get(DEVICE, params={"batch_id": batch_id, "name": name})
            assert looked_up.status_code == 422 and looked_up.json()["code"] == "validation_error"
        with fleet.server.client() as admin:
            for tid in (task["id"], task_id):
                assert admin.get(f"/v1/tasks/{tid}/artifacts", params={"history": "true"}).json()["items"] == []


def test_paths_outside_the_workspace_and_nul_bytes_are_refused(fleet: Fleet) -> None:
    producer, _, _ = agents(fleet)
    (producer.workspace / "escape").symlink_to("/etc")
    for path in ("../../etc/hostname", "/etc/hostname", "escape/hostname"):
        task = run(fleet, dag(node("pub", producer.device_id, publish(path))))
        assert failure_of(task, "pub")["code"] == "invalid_arguments", path
    with fleet.server.client() as c:
        r = c.post("/v1/tasks", json={"dag": dag(node("pub", producer.device_id, publish("a\u0000b")))})
    assert r.status_code == 422 and r.json()["code"] == "invalid_arguments"
