"""Takeovers with real processes: the owner takes the device over at the device (`orrery agent
takeover`) and its work waits for the handback; a model asks a person (`approval.ask_person`) and
gets their words; a device whose agent announced no live view cannot be taken over through the
API. (The live view, forwarded input and a takeover mid agent node under X11 are in tests/gui.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fakellm import FakeLLM, call
from tests.integration.test_approvals import one_node, owner, write
from tests.support import Fleet, run_cli, wait_until


def test_the_owners_takeover_at_the_device_holds_its_work_until_the_handback(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        agent = fleet.agent("desk")
        took = owner(agent, "takeover")
        assert took.returncode == 0, took.stderr
        held = wait_until(lambda: fleet.device(agent.device_id).get("takeover"), 30, "the owner's takeover to arrive")
        assert held["source"] == "owner" and "at the device" in held["by"]

        task = fleet.submit(one_node("desk", write("later.txt")))
        node = wait_until(
            lambda: (n := fleet.node(fleet.task(task["id"]), "n1"))["state"] in ("ready", "queued") and n,
            30,
            "the node to wait for the device",
        )
        assert node["state"] in ("ready", "queued")
        assert not (agent.workspace / "later.txt").exists()

        # An operator's handback does not end the owner's takeover: it is the owner's to end.
        api = run_cli(fleet, "devices", "handback", "desk", "--note", "not mine to give")
        assert api.returncode == 0 and "still taken over" in api.stdout, api.stdout + api.stderr

        back = owner(agent, "handback", "--note", "done at the desk")
        assert back.returncode == 0, back.stderr
        done = fleet.wait_task(task["id"])
        assert done["state"] == "succeeded", json.dumps(done)[:2000]
        assert (agent.workspace / "later.txt").read_text() == "ran\n"
        assert fleet.device(agent.device_id)["takeover"] is None
        with fleet.server.client() as c:
            history = c.get(f"/v1/devices/{agent.device_id}/history").json()["items"]
        reasons = [h["reason"] for h in history]
        assert any("taken over by device owner" in r for r in reasons), reasons
        assert any("handed back" in r and "done at the desk" in r for r in reasons), reasons


def test_a_device_whose_agent_announced_no_live_view_cannot_be_taken_over(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        agent = fleet.agent("shell-only")
        with fleet.server.client() as c:
            r = c.post(f"/v1/devices/{agent.device_id}/takeover", json={"reason": "look"})
            assert r.status_code == 409 and r.json()["code"] == "takeover_unsupported", r.text
            assert c.post(f"/v1/devices/{agent.device_id}/takeover", json={"reason": 7}).status_code == 422
            assert c.post("/v1/devices/dev_nope/takeover").status_code == 404
        cli = run_cli(fleet, "devices", "takeover", "shell-only")
        assert cli.returncode != 0 and "takeover_unsupported" in cli.stdout + cli.stderr


def test_a_model_asks_a_person_and_reads_their_answer(tmp_path: Path) -> None:
    llm = FakeLLM()
    asked: list[dict[str, Any]] = []

    def answer_seen(body: dict[str, Any]) -> dict[str, Any]:
        asked.append(body)
        return call("finish", answer="signed in")

    try:
        with Fleet(tmp_path, **llm.env()) as fleet:
            fleet.agent("desk", {"role": "desk"})
            llm.add(
                call("approval__ask_person", question="The site wants the code sent to the owner's phone"), answer_seen
            )
            dag = {
                "nodes": [
                    {
                        "id": "sign-in",
                        "kind": "agent",
                        "instruction": "Sign in.",
                        "placement": {"labels": {"role": "desk"}},
                    }
                ]
            }
            task_id = fleet.submit(dag)["id"]
            with fleet.server.client() as c:

                def question() -> dict[str, Any] | None:
                    items = c.get("/v1/approvals", params={"state": "pending", "task_id": task_id}).json()["items"]
                    return next((a for a in items if a["tool"] == "approval.ask_person"), None)

                q = wait_until(question, 60, "the model's question")
                assert q["reason"] == "The site wants the code sent to the owner's phone"
                assert fleet.node(fleet.task(task_id), "sign-in")["state"] == "waiting_approval"
                r = c.post(f"/v1/approvals/{q['id']}/approve", json={"reason": "the code is 424242"})
                assert r.status_code == 200, r.text
            done = fleet.wait_task(task_id, timeout=90)
            assert done["state"] == "succeeded", json.dumps(done)[:2000]
            told = [m for m in asked[0]["messages"] if m.get("role") == "tool"]
            assert "424242" in told[-1]["content"], told[-1]
    finally:
        llm.close()
