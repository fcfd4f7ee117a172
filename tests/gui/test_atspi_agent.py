"""Element-grounded GUI through the whole system (issue 19): a real agent process with the `gui`
toolset on Xvfb, a real session D-Bus and AT-SPI bus, and the GTK app; driven by tool nodes and by
an agent node with the fake LLM. The app's state file is the ground truth."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fakellm import FakeLLM, call
from tests.gui.conftest import TkApp
from tests.support import Fleet

ROOT = Path(__file__).resolve().parents[2]
LOOK = {"id": "look", "placement": {"device": "gtk-desktop"}, "commands": [{"tool": "gui.observe"}]}


def after_looking(node_id: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Observe, then run `tool` on that observation."""
    args = {"observation_id": "${nodes.look.output.observation_id}", **arguments}
    act = {"id": node_id, "placement": {"device": "gtk-desktop"}, "commands": [{"tool": tool, "arguments": args}]}
    return {"nodes": [LOOK, act], "edges": [{"from": "look", "to": node_id}]}


def test_tool_nodes_act_on_elements_through_a_real_agent(
    tmp_path: Path, a11y_bus: dict[str, str], gtk_app: TkApp
) -> None:
    with Fleet(tmp_path) as f:
        f.agent("gtk-desktop", extra_args=["--toolset", "gui", "--toolset", "system", "--unattended"], **a11y_bus)
        done = f.wait_task(f.submit({"nodes": [LOOK]})["id"])
        assert done["state"] == "succeeded", done
        tree = f.node(done, "look")["output"]["accessibility"]
        ids = {e["name"]: e["id"] for e in tree["elements"]}
        assert {"Press me", "Name", "Volume", "Locked"} <= set(ids), tree

        press = {"action_id": "agent-press-1", "element_id": ids["Press me"], "name": "Press me"}
        done = f.wait_task(f.submit(after_looking("press", "gui.click", press))["id"])
        assert done["state"] == "succeeded", f.node(done, "press")
        assert f.node(done, "press")["output"]["route"] == "accessibility action 'click'"
        gtk_app.wait_for(lambda s: s["clicks"] == 1, "the press through the agent")

        typed = {"action_id": "agent-type-01", "element_id": ids["Name"], "name": "Name", "text": "Lovelace"}
        done = f.wait_task(f.submit(after_looking("fill", "gui.type", typed))["id"])
        assert done["state"] == "succeeded", f.node(done, "fill")
        assert f.node(done, "fill")["output"]["outcome_verified"] is True
        gtk_app.wait_for(lambda s: s["entry"] == "Lovelace", "the typed name")

        mismatch = {"action_id": "agent-wrong-1", "element_id": ids["Press me"], "name": "Locked"}
        done = f.wait_task(f.submit(after_looking("wrong", "gui.click", mismatch))["id"])
        wrong = f.node(done, "wrong")
        assert wrong["state"] == "failed" and wrong["error"]["code"] == "element_mismatch", wrong
        locked = {"action_id": "agent-lock-01", "element_id": ids["Locked"], "name": "Locked"}
        done = f.wait_task(f.submit(after_looking("locked", "gui.click", locked))["id"])
        refused = f.node(done, "locked")
        assert refused["state"] == "failed" and refused["error"]["code"] == "element_not_actionable", refused
        assert gtk_app.state()["clicks"] == 1 and gtk_app.state()["locked_clicks"] == 0


def _element(body: dict[str, Any], name: str) -> tuple[str, int]:
    """(observation_id, element id of `name`) from the newest observation the model was shown."""
    for message in reversed(body["messages"]):
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str):
            continue
        oid = re.search(r'"observation_id":\s*"([^"]+)"', content)
        found = re.search(r'\{"id":\s*(\d+),\s*"role":\s*"[^"]*",\s*"name":\s*"' + re.escape(name) + '"', content)
        if oid and found:
            return oid.group(1), int(found.group(1))
    raise AssertionError(f"the model was not shown an element named {name!r}")


def _call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """`fakellm.call`, for arguments that include a `name` (its own first parameter)."""
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


def test_an_agent_node_sets_a_value_and_presses_by_element(
    tmp_path: Path, a11y_bus: dict[str, str], gtk_app: TkApp
) -> None:
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env()) as f:
            f.agent(
                "gtk-desktop",
                {"screen": "yes"},
                extra_args=["--toolset", "gui", "--toolset", "system", "--unattended"],
                **a11y_bus,
            )

            def set_volume(body: dict[str, Any]) -> dict[str, Any]:
                oid, eid = _element(body, "Volume")
                args = {"observation_id": oid, "action_id": "llm-volume-1", "element_id": eid, "name": "Volume"}
                return _call("gui__set_value", args | {"value": 55})

            def press(body: dict[str, Any]) -> dict[str, Any]:
                oid, eid = _element(body, "Press me")
                args = {"observation_id": oid, "action_id": "llm-press-01", "element_id": eid, "name": "Press me"}
                return _call("gui__click", args)

            llm.add(call("gui__observe"), set_volume, press, call("finish", answer="done"))
            dag = {
                "nodes": [
                    {
                        "id": "drive",
                        "kind": "agent",
                        "placement": {"labels": {"screen": "yes"}},
                        "instruction": "Set the volume to 55, then press 'Press me'.",
                        "max_steps": 6,
                    }
                ]
            }
            done = f.wait_task(f.submit(dag)["id"], timeout=90)
            assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:2000]
            shown = [str(m.get("content"))[:300] for m in llm.requests[-1]["messages"] if m.get("role") == "tool"]
            what = f"the value and the press (the model was shown {shown})"
            state = gtk_app.wait_for(lambda s: s["clicks"] == 1 and s["volume"] == 55.0, what)
            assert state["clicks"] == 1
            assert any(
                '"route": "accessibility Value", "verification": "the element\'s value is now 55"' in c for c in shown
            )
            tools = [t["function"]["name"] for t in llm.requests[0]["tools"]]
            assert {"gui__set_value", "gui__windows", "gui__focus_window", "gui__launch"} <= set(tools)
    finally:
        llm.close()


def test_agent_check_reports_the_accessibility_bus(xvfb: str, a11y_bus: dict[str, str], tmp_path: Path) -> None:
    base = [
        sys.executable,
        "-m",
        "orrery",
        "agent",
        "--check",
        "--data-dir",
        str(tmp_path / "agent"),
        "--toolset",
        "gui",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "AT_SPI_BUS_ADDRESS")}
    with_bus = subprocess.run(
        base, env={**env, **a11y_bus}, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert with_bus.returncode == 0, with_bus.stderr
    report = json.loads(with_bus.stdout)["toolsets"]["gui"]["accessibility"]
    assert report["available"] is True and "at-spi2-core" in report["packages"], report
    assert isinstance(report["applications"], int) and report["dbus_daemon"] and report["at_spi_bus_launcher"]

    without = subprocess.run(
        base, env={**env, "DISPLAY": xvfb}, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert without.returncode == 0, without.stderr  # coordinates still work: the toolset is ready
    report = json.loads(without.stdout)["toolsets"]["gui"]["accessibility"]
    assert report["available"] is False and "DBUS_SESSION_BUS_ADDRESS" in report["reason"], report
