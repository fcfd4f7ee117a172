"""Prompt templates from ORRERY_PROMPTS_DIR reach the model (fake LLM over real HTTP, real server and
agent); a broken directory stops start-up with the file named; a template that fails to render
fails the node with `prompt_error`, never a server error (issue 19)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakellm import FakeLLM, call
from tests.support import Fleet, run_cli


def agent_dag(max_steps: int = 3) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "look",
                "kind": "agent",
                "placement": {"labels": {"role": "box"}},
                "instruction": "Say which platform this is.",
                "max_steps": max_steps,
            }
        ]
    }


def test_overridden_templates_are_what_the_model_receives_and_the_rest_fall_back(tmp_path: Path) -> None:
    own = tmp_path / "prompts"
    own.mkdir()
    (own / "agent_system_text.j2").write_text(
        'DEPLOYMENT PROMPT for "{{ device.name }}": {{ instruction }} ({{ max_steps }} steps)\n'
        "{{ tools }}\n"
        '{% include "agent_examples_text.j2" %}\n'
    )
    (own / "plan_user.j2").write_text("HOUSE PLANNING FORMAT. Request: {{ request }}\n{{ inventory }}")
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env(prompts_dir=str(own))) as f:
            f.agent("box-1", {"role": "box"})
            llm.add(call("finish", answer="linux"))
            done = f.wait_task(f.submit(agent_dag())["id"], timeout=60)
            assert done["state"] == "succeeded", done
            system = llm.requests[0]["messages"][0]["content"]
            assert system.startswith('DEPLOYMENT PROMPT for "box-1": Say which platform this is. (3 steps)')
            assert "system.info" in system  # the built-in tools section, rendered into the override
            assert "A worked example" in system  # a built-in template included from the override

            llm.add({"content": '{"nodes": [{"id": "n", "placement": {"device": "box-1"}, "commands": []}]}'})
            with f.server.client() as c:
                r = c.post("/v1/tasks", json={"request": "count the files"})
                assert r.status_code == 201, r.text
            f.wait_task(r.json()["id"], timeout=60)
            planning = llm.requests[1]["messages"]
            assert planning[1]["content"].startswith("HOUSE PLANNING FORMAT. Request: count the files")
            assert "Example for the request" in planning[0]["content"]  # plan_system.j2: built in
    finally:
        llm.close()


def test_a_template_that_fails_to_render_fails_the_node_with_prompt_error(tmp_path: Path) -> None:
    own = tmp_path / "prompts"
    own.mkdir()
    (own / "agent_common.j2").write_text("Operate {{ device.nickname }}.")
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env(prompts_dir=str(own))) as f:
            f.agent("box-1", {"role": "box"})
            task_id = f.submit(agent_dag())["id"]
            done = f.wait_task(task_id, timeout=60)
            node = f.node(done, "look")
            assert done["state"] == "failed" and node["error"]["code"] == "prompt_error", node
            message = node["error"]["message"]
            assert "agent_common.j2" in message or "agent_system_text.j2" in message
            assert "nickname" in message and "ORRERY_PROMPTS_DIR" in message
            assert llm.requests == []  # nothing half-rendered was sent
            with f.server.client() as c:
                assert c.get(f"/v1/tasks/{task_id}").status_code == 200
    finally:
        llm.close()


def test_a_prompts_directory_that_does_not_parse_stops_start_up_naming_the_file(tmp_path: Path) -> None:
    own = tmp_path / "prompts"
    own.mkdir()
    (own / "replan_user.j2").write_text("{% for x in items %}never closed")
    served = run_cli(None, "serve", "--prompts-dir", str(own), "--data-dir", str(tmp_path / "data"), "--port", "0")
    assert served.returncode == 2, served.stdout + served.stderr
    text = " ".join(served.stderr.split())
    assert "invalid setting" in text and "replan_user.j2" in text and "Traceback" not in served.stderr
