"""Fan-out nodes end to end (issue 20) with real `orrery agent` processes: one child per web
agent, canary first, each child verified on its own device, the output map read downstream by
device names holding `-` and `.`; what the API, the event stream and the CLI show of the
children; and the submission checks that refuse what cannot work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Fleet, run_cli, shell

WEB = {"role": "web"}
NAMES = ("web-1", "web-2.lab", "web-3")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("fanout"), heartbeat_interval_s="1") as f:
        for name in NAMES:
            f.agent(name, WEB)
        f.agent("analysis", {"role": "analysis"})
        yield f


def rollout(**for_each: object) -> dict[str, object]:
    selector = {} if "devices" in for_each else {"labels": WEB}
    return {
        "nodes": [
            {
                "id": "deploy",
                "for_each": {**selector, **for_each},
                "commands": [{"tool": "files.write", "arguments": {"path": "release.txt", "content": "v2\n"}}],
                "verify": [{"tool": "files.read", "arguments": {"path": "release.txt"}}],
            },
            {
                "id": "report",
                "placement": {"labels": {"role": "analysis"}},
                "commands": [
                    {
                        "tool": "files.write",
                        "arguments": {"path": "seen.txt", "content": "${nodes.deploy.output.web-2.lab.sha256}"},
                    }
                ],
            },
        ],
        "edges": [{"from": "deploy", "to": "report"}],
    }


def events(fleet: Fleet, task_id: str) -> list[tuple[str, dict[str, object]]]:
    with fleet.server.client() as c:
        body = c.get(f"/v1/tasks/{task_id}/events", params={"after": 0}, timeout=30).text
    out, kind = [], ""
    for line in body.splitlines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            out.append((kind, json.loads(line[5:])))
    return out


def test_a_rollout_runs_on_every_web_agent_canary_first_each_verified_and_read_downstream(fleet: Fleet) -> None:
    task = fleet.submit(rollout(canary=1))
    done = fleet.wait_task(task["id"], timeout=90)
    assert done["state"] == "succeeded", json.dumps(done, indent=1)[:3000]
    deploy = fleet.node(done, "deploy")
    assert deploy["attempts"] == []  # a fan-out node's attempts are its children's
    children = {c["device"]: c for c in deploy["children"]}
    assert sorted(children) == sorted(NAMES)
    for name, child in children.items():
        assert child["state"] == "succeeded"
        assert [a["kind"] for a in child["attempts"]] == ["tool", "verify"]  # run once, then verified
        assert {a["device_id"] for a in child["attempts"]} == {child["device_id"]}
        assert child["verification"]["state"] == "passed"
        assert deploy["output"][name] == child["output"]
    agents = {a.name: a for a in fleet.agents}
    for name in NAMES:
        assert (agents[name].workspace / "release.txt").read_text() == "v2\n"
    canary = children["web-1"]  # the first by name
    first_end = canary["attempts"][-1]["ended_at"]
    assert all(c["attempts"][0]["started_at"] >= first_end for n, c in children.items() if n != "web-1")
    assert (agents["analysis"].workspace / "seen.txt").read_text() == deploy["output"]["web-2.lab"]["sha256"]
    child_events = [(d["device"], d["state"]) for kind, d in events(fleet, task["id"]) if kind == "node.child"]
    assert ("web-2.lab", "verifying") in child_events and ("web-2.lab", "succeeded") in child_events


def test_the_cli_shows_a_fan_out_nodes_children_and_validate_the_devices_it_would_run_on(
    fleet: Fleet, tmp_path: Path
) -> None:
    task = fleet.submit(rollout(max_parallel=2))
    fleet.wait_task(task["id"], timeout=90)
    shown = run_cli(fleet, "tasks", "show", task["id"])
    assert shown.returncode == 0, shown.stderr
    assert "3/3 children done: 3 succeeded" in shown.stdout
    for name in NAMES:
        assert f"✔ {name}" in shown.stdout
    dag = tmp_path / "dag.json"
    dag.write_text(json.dumps(rollout()))
    checked = run_cli(fleet, "validate", str(dag))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "node deploy: would fan out to 3 devices: web-1, web-2.lab, web-3" in checked.stdout


def test_a_failing_canary_leaves_the_other_devices_untouched(fleet: Fleet) -> None:
    dag = {
        "nodes": [
            {
                "id": "risky",
                "for_each": {"labels": WEB, "canary": 1},
                "commands": [shell(["sh", "-c", "touch risky-ran; exit 3"])],
            }
        ]
    }
    done = fleet.wait_task(fleet.submit(dag)["id"], timeout=60)
    risky = fleet.node(done, "risky")
    assert (done["state"], risky["error"]["code"]) == ("failed", "canary_failed")
    assert [(c["device"], c["state"]) for c in risky["children"]] == [
        ("web-1", "failed"),
        ("web-2.lab", "skipped"),
        ("web-3", "skipped"),
    ]
    ran = {a.name: (a.workspace / "risky-ran").exists() for a in fleet.agents if a.name in NAMES}
    assert ran == {"web-1": True, "web-2.lab": False, "web-3": False}


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"verify": [shell(["test", "-f", "release.txt"])]}, "verify_not_read_only"),
        ({"for_each": {"devices": ["web-1", "web-9"]}}, "unknown_device"),
    ],
)
def test_a_submission_that_cannot_work_is_refused_with_a_stable_code(
    fleet: Fleet, change: dict[str, object], code: str
) -> None:
    dag = rollout()
    nodes = dag["nodes"]
    assert isinstance(nodes, list)
    nodes[0] = {**nodes[0], **change}
    with fleet.server.client() as c:
        r = c.post("/v1/tasks", json={"dag": dag})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert code in [p["code"] for p in r.json()["problems"]], r.text


def test_a_reference_that_treats_a_fan_out_output_as_one_value_is_refused(fleet: Fleet) -> None:
    dag = rollout(devices=["web-1", "web-3"])
    report = dag["nodes"][1]  # type: ignore[index]
    with fleet.server.client() as c:
        for content, code in (
            ("${nodes.deploy.output}", "invalid_arguments"),  # a map where a string is wanted
            ("${nodes.deploy.results[0].result}", "invalid_reference"),  # it has no results list
            ("${nodes.deploy.output.web-2.lab.sha256}", "invalid_reference"),  # not one of its devices
        ):
            report["commands"][0]["arguments"]["content"] = content
            r: httpx.Response = c.post("/v1/tasks", json={"dag": dag})
            assert r.status_code == 422, r.text
            assert [p["code"] for p in r.json()["problems"]] == [code], r.text
