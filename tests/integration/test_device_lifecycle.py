"""REST, as a user meets it: ids by prefix and name, reusable names of revoked devices, label
changes that placement uses at once, token rotation, `drained`, device history and attempts,
and re-running a task (whole, or from a node). Real server, real agents."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.rawdevice import RawDevice
from tests.security.test_device_attacks import closed_with
from tests.support import Agent, Fleet, fleet, shell, wait_until


@pytest.fixture(scope="module")
def lc(shared_fleet: Fleet) -> Fleet:
    shared_fleet.agent("lc-worker", {"role": "lc"})
    return shared_fleet


def wait_for_file(name: str) -> dict[str, Any]:
    """A command that runs until `name` appears in the agent's workspace."""
    return shell(["sh", "-c", f"while [ ! -e {name} ]; do sleep 0.05; done"], timeout_s=120)


# ---------------------------------------------------------------- ids by prefix and by name


def test_tasks_and_devices_are_found_by_id_prefix_and_name_on_every_path(lc: Fleet) -> None:
    dev = lc.agents[0]
    lc.wait_task(lc.submit({"nodes": [{"id": "a", "commands": [shell(["true"])]}]}, name="lc-named")["id"])
    done = lc.submit({"nodes": [{"id": "a", "commands": [shell(["true"])]}]}, name="lc-named")
    lc.wait_task(done["id"])  # the newest of the two tasks named lc-named
    with lc.server.client() as c:
        for ref in (done["id"], done["id"][:9], done["id"][5:13], "lc-named"):
            assert c.get(f"/v1/tasks/{ref}").json()["id"] == done["id"], ref
            assert c.get(f"/v1/tasks/{ref}/llm").status_code == 200
            r = c.post(f"/v1/tasks/{ref}/cancel")
            assert r.status_code == 409 and done["id"] in r.json()["detail"]  # found, and already ended
            with c.stream("GET", f"/v1/tasks/{ref}/events") as events:
                assert events.status_code == 200
                assert done["id"] in "".join(events.iter_lines())
        for ref in (dev.device_id, dev.device_id[:8], dev.device_id[4:10], "lc-worker"):
            assert c.get(f"/v1/devices/{ref}").json()["id"] == dev.device_id, ref
            for path in ("history", "attempts"):
                assert c.get(f"/v1/devices/{ref}/{path}").status_code == 200
            assert c.patch(f"/v1/devices/{ref}", json={"labels": {}}).json()["id"] == dev.device_id
            for verb in ("cordon", "uncordon"):
                assert c.post(f"/v1/devices/{ref}/{verb}").json()["id"] == dev.device_id
        lc.enroll("lc-second")
        for path in ("/v1/tasks/task_", "/v1/devices/dev_"):  # a prefix of every id
            r = c.get(path)
            assert r.status_code == 409, r.text
            body = r.json()
            assert body["code"] == "ambiguous_id" and len(body["candidates"]) >= 2
            assert {"id", "name"} <= set(body["candidates"][0])
        for path in ("/v1/tasks/nope-nothing", "/v1/devices/nope-nothing", "/v1/tasks/abc/rerun"):
            r = c.get(path) if "rerun" not in path else c.post(path)
            assert r.status_code == 404 and r.json()["code"] == "not_found", path
        assert "at least 4" in c.get("/v1/devices/abc").json()["detail"]
        lc.wait_device(dev.device_id, "idle")


# ---------------------------------------------------------------- names of revoked devices


def test_a_revoked_devices_name_can_be_enrolled_again_and_only_once_at_a_time(lc: Fleet) -> None:
    first = lc.enroll("lc-reuse")
    with lc.server.client() as c:
        again = c.post("/v1/devices", json={"name": "lc-reuse"})
        assert again.status_code == 409 and "revoke it first" in again.json()["detail"]
        assert c.delete("/v1/devices/lc-reuse").json() == {"id": first["id"], "state": "revoked"}
        second = c.post("/v1/devices", json={"name": "lc-reuse"})
        assert second.status_code == 201, second.text
        assert second.json()["id"] != first["id"]
        assert c.get("/v1/devices/lc-reuse").json()["id"] == second.json()["id"]  # the name: the live one
        assert c.get(f"/v1/devices/{first['id']}").json()["state"] == "revoked"
        names = [d["name"] for d in c.get("/v1/devices").json()["items"]]
        assert names.count("lc-reuse") == 2
        bad = c.post("/v1/devices", json={"name": "lc-bad-label", "labels": {"no spaces": "x"}})
        assert bad.status_code == 422


def test_concurrent_enrollments_of_one_name_make_one_device(lc: Fleet) -> None:
    for round_ in range(5):
        name = f"lc-race-{round_}"
        gate = threading.Barrier(2)

        def enroll(name: str = name, gate: threading.Barrier = gate) -> int:
            with lc.server.client() as c:
                gate.wait(10)
                return c.post("/v1/devices", json={"name": name}).status_code

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            codes = sorted(pool.map(lambda _: enroll(), range(2)))
        assert codes == [201, 409], codes
        with lc.server.client() as c:
            names = [d["name"] for d in c.get("/v1/devices").json()["items"]]
        assert names.count(name) == 1


# ---------------------------------------------------------------- labels


def test_patched_labels_merge_delete_and_place_work_at_once(lc: Fleet) -> None:
    agent = lc.agent("lc-label")
    dag = {"nodes": [{"id": "a", "placement": {"labels": {"zone": "lc-east"}}, "commands": [shell(["true"])]}]}
    refused = lc.submit(dag, expect=422)
    assert refused["code"] == "no_capable_device"
    with lc.server.client() as c:
        r = c.patch(f"/v1/devices/{agent.device_id}", json={"labels": {"keep": "yes", "old": "x"}})
        assert r.json()["labels"] == {"keep": "yes", "old": "x"}
        r = c.patch(f"/v1/devices/{agent.device_id}", json={"labels": {"zone": "lc-east", "old": None}})
        assert r.status_code == 200, r.text
        assert r.json()["labels"] == {"keep": "yes", "zone": "lc-east"}
        for bad in ({"labels": {"bad key": "v"}}, {"labels": {"k": 5}}, {"labels": {"k": "x" * 201}}, {"nope": 1}):
            resp = c.patch(f"/v1/devices/{agent.device_id}", json=bad)
            assert resp.status_code == 422 and resp.json()["code"] == "validation_error", bad
    task = lc.submit(dag)
    done = lc.wait_task(task["id"])
    assert done["state"] == "succeeded"
    assert lc.node(done, "a")["attempts"][0]["device_id"] == agent.device_id
    agent.stop()


# ---------------------------------------------------------------- token rotation


async def test_a_rotated_token_closes_the_old_connection_4401_and_the_new_one_works(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        dev = RawDevice(f, "rot")
        await dev.connect()
        with f.server.client() as c:
            r = c.post("/v1/devices/rot/token")
            assert r.status_code == 200, r.text
            rotated = r.json()
        assert rotated["id"] == dev.enrolled["id"] and rotated["name"] == "rot"
        assert rotated["token"] != dev.enrolled["token"]
        assert await closed_with(dev.ws) == 4401
        with pytest.raises(InvalidStatus) as info:
            await dev.connect()  # still the old token
        assert info.value.response.status_code == 401
        dev.enrolled["token"] = rotated["token"]
        await dev.connect()
        task = await asyncio.to_thread(
            f.submit, {"nodes": [{"id": "e", "placement": {"device": "rot"}, "commands": [{"tool": "raw.echo"}]}]}
        )
        batch = await dev.recv("command_batch")
        await dev.send("result_batch", **dev.result(batch, batch["fence"]))
        assert (await asyncio.to_thread(f.wait_task, task["id"]))["state"] == "succeeded"
        with f.server.client() as c:
            assert c.post("/v1/devices/rot/token", headers={"Authorization": "Bearer nope"}).status_code == 401


# ---------------------------------------------------------------- drained, current work, history, attempts


def test_a_drained_device_shows_draining_until_its_batch_ends_then_drained(lc: Fleet) -> None:
    agent = lc.agent("lc-drain", {"role": "lc-drain"})
    dag = {"nodes": [{"id": "slow", "placement": {"labels": {"role": "lc-drain"}}, "commands": [wait_for_file("go")]}]}
    task = lc.submit(dag, name="lc-drain-task")
    busy = lc.wait_device(agent.device_id, "busy")
    assert busy["current_task_id"] == task["id"] and busy["current_node_id"] == "slow"
    with lc.server.client() as c:
        assert c.post("/v1/devices/lc-drain/drain").json()["state"] == "draining"
        (agent.workspace / "go").touch()
        assert lc.wait_task(task["id"])["state"] == "succeeded"
        drained = lc.wait_device(agent.device_id, "drained")
        assert drained["current_task_id"] is None and drained["current_node_id"] is None
        listed = {d["id"]: d["state"] for d in c.get("/v1/devices").json()["items"]}
        assert listed[agent.device_id] == "drained"
        assert c.post("/v1/devices/lc-drain/uncordon").json()["state"] == "idle"
        history = c.get("/v1/devices/lc-drain/history").json()
        states = [h["state"] for h in history["items"]]
        assert states[:3] == ["idle", "drained", "draining"], history
        assert states[-1] == "enrolled" and "idle" in states[3:]
        assert history["items"][1]["reason"] == "its last batch ended"
        assert {"state", "reason", "at"} == set(history["items"][0])
        page = c.get("/v1/devices/lc-drain/history", params={"limit": 2}).json()
        assert [h["state"] for h in page["items"]] == states[:2] and page["next_cursor"]
        rest = c.get("/v1/devices/lc-drain/history", params={"limit": 50, "cursor": page["next_cursor"]}).json()
        assert [h["state"] for h in rest["items"]] == states[2:]
        attempts = c.get(f"/v1/devices/{agent.device_id}/attempts").json()["items"]
        assert attempts[0]["task_id"] == task["id"] and attempts[0]["task_name"] == "lc-drain-task"
        assert attempts[0]["node_id"] == "slow" and attempts[0]["status"] == "succeeded" and attempts[0]["n"] == 1
        assert c.get("/v1/devices/lc-drain/attempts", params={"cursor": "garbage!"}).status_code == 400
    agent.stop()


def test_an_idle_device_is_drained_at_once_and_its_history_says_when_it_went_offline(tmp_path: Path) -> None:
    with fleet(tmp_path, heartbeat_interval_s="0.5", heartbeat_timeout_s="3") as f:
        agent = f.agent("idle")
        with f.server.client() as c:
            assert c.post("/v1/devices/idle/drain").json()["state"] == "drained"
            agent.kill()
            f.wait_device(agent.device_id, "offline")
            items = c.get("/v1/devices/idle/history").json()["items"]
        states = [h["state"] for h in items]
        assert states[0] == "offline" and states[-1] == "enrolled", items
        assert states.index("drained") > 0 and states.index("drained") < len(states) - 1, items


# ---------------------------------------------------------------- re-run


def chain(a: Agent) -> dict[str, Any]:
    """a -> b -> c; each counts its runs in the workspace; c needs a file `needed` there and
    uses b's output."""
    place = {"device": a.name}

    def count(node: str) -> dict[str, Any]:
        return shell(["sh", "-c", f"echo run >> runs-{node}; echo out-{node}"])

    return {
        "nodes": [
            {"id": "a", "placement": place, "commands": [count("a")]},
            {"id": "b", "placement": place, "commands": [count("b")]},
            {
                "id": "c",
                "placement": place,
                "commands": [
                    count("c"),
                    shell(["sh", "-c", 'test -e needed && echo "got $0"', "${nodes.b.output.stdout}"]),
                ],
            },
        ],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
    }


def runs(agent: Agent, node: str) -> int:
    path = agent.workspace / f"runs-{node}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_rerun_from_a_node_runs_only_it_and_keeps_upstream_outputs(lc: Fleet) -> None:
    agent = lc.agent("lc-rerun")
    first = lc.submit(chain(agent), name="lc-chain")
    failed = lc.wait_task(first["id"])
    assert failed["state"] == "failed" and failed["rerun_of"] is None
    assert lc.node(failed, "c")["attempts"][0]["results"][1]["result"]["exit_code"] == 1  # no `needed` file
    assert [runs(agent, n) for n in "abc"] == [1, 1, 1]
    (agent.workspace / "needed").touch()
    with lc.server.client() as c:
        r = c.post("/v1/tasks/lc-chain/rerun", json={"from_node": "c"})
        assert r.status_code == 201, r.text
        second = r.json()
        assert second["rerun_of"] == first["id"] and second["id"] != first["id"] and second["name"] == "lc-chain"
        kept = {n["id"]: n for n in second["nodes"]}
        assert kept["a"]["state"] == kept["b"]["state"] == "succeeded" and kept["c"]["state"] in ("pending", "ready")
        done = lc.wait_task(second["id"])
        assert done["state"] == "succeeded", [(n["id"], n["state"], n["error"], n["attempts"]) for n in done["nodes"]]
        assert [runs(agent, n) for n in "abc"] == [1, 1, 2]  # only c ran again
        c_results = lc.node(done, "c")["attempts"][0]["results"]
        assert c_results[1]["result"]["stdout"] == "got out-b\n\n"  # b's kept output reached c
        assert lc.node(done, "b")["output"] == lc.node(failed, "b")["output"]
        assert c.get("/v1/tasks/lc-chain").json()["id"] == second["id"]  # the name: the newest

        whole = c.post(f"/v1/tasks/{first['id']}/rerun")
        assert whole.status_code == 201, whole.text
        assert whole.json()["rerun_of"] == first["id"]
        assert lc.wait_task(whole.json()["id"])["state"] == "succeeded"
        assert [runs(agent, n) for n in "abc"] == [2, 2, 3]  # every node again

        unknown = c.post(f"/v1/tasks/{first['id']}/rerun", json={"from_node": "zz"})
        assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_node"
        bad = c.post(f"/v1/tasks/{first['id']}/rerun", json={"from_nod": "c"})
        assert bad.status_code == 422 and bad.json()["code"] == "validation_error"
    agent.stop()


def test_an_unfinished_task_is_not_rerun(lc: Fleet) -> None:
    agent = lc.agent("lc-unfinished")
    dag = {"nodes": [{"id": "w", "placement": {"device": "lc-unfinished"}, "commands": [wait_for_file("go")]}]}
    task = lc.submit(dag)
    with lc.server.client() as c:
        r = c.post(f"/v1/tasks/{task['id']}/rerun")
        assert r.status_code == 409 and r.json()["code"] == "conflict", r.text
    (agent.workspace / "go").touch()
    lc.wait_task(task["id"])
    agent.stop()


def test_rerun_needs_the_operator_role(lc: Fleet) -> None:
    with lc.server.client() as c:
        key = c.post("/v1/api-keys", json={"role": "viewer"}).json()["key"]
    with httpx.Client(base_url=lc.server.url, headers={"Authorization": f"Bearer {key}"}) as viewer:
        assert viewer.post("/v1/tasks/task_/rerun").status_code == 403
        assert viewer.patch("/v1/devices/lc-worker", json={"labels": {}}).status_code == 403
        assert viewer.post("/v1/devices/lc-worker/token").status_code == 403


__all__ = ["wait_until"]
