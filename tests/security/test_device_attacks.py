"""Attacks over the device WebSocket: every one refused with its documented code, nothing changed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.rawdevice import RawDevice
from tests.support import Fleet, fleet, wait_until


def snapshot(f: Fleet) -> list[Any]:
    """What an attacker must not change: every task with its nodes and attempts, every device's state."""
    with f.server.client() as c:
        tasks = [c.get(f"/v1/tasks/{t['id']}").json() for t in c.get("/v1/tasks").json()["items"]]
        devices = [(d["id"], d["state"], d["current_batch"]) for d in c.get("/v1/devices").json()["items"]]
    return [tasks, devices]


def echo_dag(name: str) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "echo", "placement": {"labels": {"raw": name}}, "commands": [{"tool": "raw.echo", "arguments": {}}]}
        ]
    }


async def closed_with(ws: Any) -> int | None:
    try:
        async with asyncio.timeout(15):
            while True:
                await ws.recv()
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None


async def test_a_session_id_from_another_device_is_not_resumed(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        victim, thief = RawDevice(f, "victim"), RawDevice(f, "thief")
        welcome = await victim.connect()
        task = await asyncio.to_thread(f.submit, echo_dag("victim"))
        batch = await victim.recv("command_batch")
        stolen = await thief.connect(resume={"session_id": welcome["session_id"], "last_seq": 0})
        assert stolen["resumed"] is False and stolen["session_id"] != welcome["session_id"]
        assert thief.ws is not None
        with pytest.raises(TimeoutError):  # none of the victim's frames are replayed to the thief
            async with asyncio.timeout(1.5):
                while True:
                    frame = json.loads(await thief.ws.recv())
                    assert frame["type"] == "heartbeat", frame
        await victim.send("result_batch", **victim.result(batch, batch["fence"]))
        assert (await asyncio.to_thread(f.wait_task, task["id"]))["state"] == "succeeded"


async def test_concurrent_device_sessions_are_isolated(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a, b = RawDevice(f, "a"), RawDevice(f, "b")
        await a.connect()
        await b.connect()
        task = await asyncio.to_thread(f.submit, echo_dag("b"))
        batch = await b.recv("command_batch")
        before = await asyncio.to_thread(snapshot, f)
        await a.send("result_batch", **a.result(batch, batch["fence"]))  # a reports b's batch
        assert (await a.recv("error"))["code"] == "unknown_batch"
        await a.send("cancel", batch_id=batch["batch_id"])  # a frame only servers send
        assert await closed_with(a.ws) == 4400
        assert await asyncio.to_thread(snapshot, f) == before
        await b.send("result_batch", **b.result(batch, batch["fence"]))
        assert (await asyncio.to_thread(f.wait_task, task["id"]))["state"] == "succeeded"


async def test_a_token_revoked_mid_session_closes_4401_and_its_results_change_nothing(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        dev = RawDevice(f, "rev")
        await dev.connect()
        task = await asyncio.to_thread(f.submit, echo_dag("rev"))
        batch = await dev.recv("command_batch")
        with f.server.client() as c:
            assert c.delete(f"/v1/devices/{dev.enrolled['id']}").status_code == 200
        assert await closed_with(dev.ws) == 4401
        with pytest.raises(InvalidStatus) as info:
            await dev.connect()
        assert info.value.response.status_code == 401
        done = await asyncio.to_thread(f.wait_task, task["id"])
        assert done["nodes"][0]["attempts"][0]["error"]["code"] == "device_lost"
        assert batch["batch_id"] == done["nodes"][0]["attempts"][0]["batch_id"]


async def test_a_handshake_flood_from_one_address_is_refused_with_429(tmp_path: Path) -> None:
    with fleet(tmp_path, handshakes_per_minute="5") as f:
        token = f.enroll("flood")["token"]
        url = f.server.url.replace("http://", "ws://") + "/v1/agent"
        statuses = []
        for _ in range(8):
            try:
                ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"})
                statuses.append(101)
                await ws.close()
            except InvalidStatus as exc:
                statuses.append(exc.response.status_code)
        assert statuses[:5] == [101] * 5 and set(statuses[5:]) == {429}


async def test_a_fleet_behind_one_address_reconnects_whole_while_token_guessing_is_cut_off(tmp_path: Path) -> None:
    """Issue 12 (recovery speed): devices behind one NAT or proxy reconnecting at once after a
    restart used to share one per-address budget, so part of the fleet waited a minute. The
    limit is per device; an address is throttled only for failed handshakes, and even then a
    valid token from it still gets in."""
    with fleet(tmp_path, handshakes_per_minute="2", auth_failures_per_minute="3") as f:
        url = f.server.url.replace("http://", "ws://") + "/v1/agent"
        tokens = [f.enroll(f"nat-{i}")["token"] for i in range(6)]

        async def status(token: str) -> int:
            try:
                ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"})
            except InvalidStatus as exc:
                return int(exc.response.status_code)
            await ws.close()
            return 101

        assert [await status(t) for t in tokens] == [101] * 6
        guesses = [await status("orrd_dev_nobody.guess") for _ in range(5)]
        assert guesses[:3] == [401] * 3 and set(guesses[3:]) == {429}
        assert await status(tokens[0]) == 101


async def test_a_slow_hello_is_cut_at_the_deadline_with_4408(tmp_path: Path) -> None:
    with fleet(tmp_path, hello_timeout_s="1") as f:
        dev = RawDevice(f, "slow")
        url = f.server.url.replace("http://", "ws://") + "/v1/agent"
        ws = await connect(url, additional_headers={"Authorization": f"Bearer {dev.enrolled['token']}"})
        await asyncio.sleep(1.5)  # the attacker dawdles past the deadline on purpose
        try:
            await ws.send(
                json.dumps(
                    {"v": 1, "type": "hello", "seq": 0, "ack": 0, "device_id": dev.enrolled["id"], "versions": [1]}
                )
            )
        except ConnectionClosed:
            pass
        assert await closed_with(ws) == 4408
        assert f.device(dev.enrolled["id"])["state"] == "enrolled"


def test_the_agent_opens_no_listening_socket(tmp_path: Path) -> None:
    """UFO ran its MCP servers over HTTP without a key; Orrery's run in-process, reachable by no one."""
    with fleet(tmp_path) as f:
        agent = f.agent("quiet")
        assert agent.proc is not None
        pids = {agent.proc.pid} | _children(agent.proc.pid)
        inodes = set()
        for pid in pids:
            fd_dir = Path(f"/proc/{pid}/fd")
            for fd in fd_dir.iterdir():
                try:
                    target = fd.readlink().as_posix()
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        listening = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A = LISTEN
                    listening.append(line)
        assert inodes, "the agent should at least hold its WebSocket"
        assert listening == []


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            out |= {child} | _children(child)
    return out


__all__ = ["wait_until"]
