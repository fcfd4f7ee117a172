"""The emergency stop across replicas (issue 18): an operator on one replica stops a device whose
agent is connected to another; the running command dies, the device takes no work, and the
resume from a third path (the other replica again) reaches it the same way."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.replicaset import ReplicaSet
from tests.support import shell, wait_until


def test_a_stop_on_one_replica_reaches_a_device_on_another(tmp_path: Path, postgres_db: str, redis_db: str) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        a, b = rs.replicas
        agent = rs.agent_on(b, "es-on-b", {"where": "b"})
        long = {"id": "long", "placement": {"device": "es-on-b"}}
        long["commands"] = [shell(["sh", "-c", "touch started; exec sleep 300"], timeout_s=600)]
        with a.client() as c:
            task = c.post("/v1/tasks", json={"dag": {"nodes": [long]}}).json()
            wait_until((agent.workspace / "started").exists, 60, "the long command to start")
            r = c.post("/v1/devices/es-on-b/stop", json={"reason": "from replica a"})
            assert r.status_code == 200, r.text
        done = rs.wait_task(task["id"], timeout=30)
        assert done["nodes"][0]["error"]["code"] == "device_stopped", done
        with b.client() as c:  # the other replica tells the same
            device = c.get("/v1/devices/es-on-b").json()
            assert device["state"] == "stopped" and "from replica a" in device["stop_reason"]
        with a.client() as c:
            pinned = {"id": "after", "placement": {"device": "es-on-b"}, "commands": [shell(["touch", "after"])]}
            later = c.post("/v1/tasks", json={"dag": {"nodes": [pinned]}}).json()
            assert c.post("/v1/devices/es-on-b/resume").status_code == 200
        assert rs.wait_task(later["id"])["state"] == "succeeded"
        assert (agent.workspace / "after").exists()
        wait_until(lambda: "resumed by an operator" in agent.log(), 30, "the agent to hear the resume")
