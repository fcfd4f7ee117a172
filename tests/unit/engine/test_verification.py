"""Verified outcomes in the engine (issue 20), step by step on a virtual clock (harness.py): the
check after a success (before any success edge), the probe after an unknown outcome (the device
lost mid-command, or an agent that restarted mid-command and reports `uncertain`), its device,
its bound, a restart while verifying, cancel, and fan-out children verified one by one."""

from __future__ import annotations

from typing import Any

from orchestrator.domain.model import Liveness
from orchestrator.engine.records import CancelTask, FrameIn, LivenessChanged
from protocol.messages import CommandBatch, ErrorInfo, Result, ResultBatch
from tests.unit.engine.harness import TOOLS, Harness, accepted, results, tool

PINNED = {"device": "box"}


def checked(node_id: str = "x", command: str = "sim.act", **extra: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "placement": PINNED,
        "commands": [{"tool": command}],
        "verify": [{"tool": "sim.look", "arguments": {"path": "marker"}}],
        **extra,
    }


def batches(h: Harness, node_id: str = "x", kind: str = "") -> list[tuple[str, CommandBatch]]:
    """(device, batch) of the node's command batches (`kind` "verify": only its verify batches)."""
    out = []
    for s in h.links.sent:
        m = s.message
        if isinstance(m, CommandBatch) and m.node_id == node_id:
            is_verify = m.commands[0].call_id.startswith("v")
            if kind == "" or (kind == "verify") == is_verify:
                out.append((s.device_id, m))
    return out


def failing(dev: str, batch: CommandBatch, message: str = "no such file: marker") -> FrameIn:
    res = [
        Result(call_id=c.call_id, status="failure", error=ErrorInfo(code="tool_error", message=message))
        for c in batch.commands
    ]
    return FrameIn(dev, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=res))


def uncertain(dev: str, batch: CommandBatch) -> FrameIn:
    """What an agent killed mid-command reports after its restart (SPEC 4: results `uncertain`)."""
    res = [
        Result(call_id=c.call_id, status="uncertain", error=ErrorInfo(code="uncertain", message="the agent died"))
        for c in batch.commands
    ]
    return FrameIn(dev, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=res))


async def node_row(h: Harness, task: str, node_id: str = "x") -> Any:
    bundle = await h.store.get_task(task)
    assert bundle is not None
    return next(n for n in bundle.nodes if n.id == node_id)


async def lose_mid_command(h: Harness, dev: str, epoch: int, node_id: str = "x") -> None:
    (pair,) = batches(h, node_id, "main")
    await h.step(accepted(dev, pair[1]))
    await h.step(LivenessChanged(dev, Liveness.OFFLINE, epoch, "A"))


# ---------------------------------------------------------------- the check after a success


async def test_verify_runs_on_the_same_device_after_the_commands_and_before_any_success_edge(h: Harness) -> None:
    box = await h.enroll("box")
    await h.connect(box)
    task = await h.submit(
        {
            "nodes": [checked(), {"id": "next", "placement": PINNED, "commands": [{"tool": "sim.look"}]}],
            "edges": [{"from": "x", "to": "next"}],
        }
    )
    ((dev, main),) = batches(h)
    await h.step(results(dev, main))
    assert (await h.task(task))["nodes"] == {"x": "verifying", "next": "pending"}
    ((vdev, check),) = batches(h, kind="verify")
    assert (vdev, [c.tool for c in check.commands], check.commands[0].arguments) == (
        box,
        ["sim.look"],
        {"path": "marker"},
    )
    assert batches(h, "next") == []  # no success edge fires while it is verified
    await h.step(results(vdev, check))
    row = await node_row(h, task)
    assert (row.state, row.output, row.verification["state"]) == ("succeeded", {"ok": True}, "passed")
    assert len(batches(h, "next")) == 1


async def test_a_failed_verify_fails_the_node_verification_failed_and_it_is_not_retried(h: Harness) -> None:
    box = await h.enroll("box")
    await h.connect(box)
    node = checked(retry={"max_attempts": 3, "backoff_s": 0})
    node["commands"][0]["idempotent"] = True
    task = await h.submit(
        {
            "nodes": [node, {"id": "fix", "placement": PINNED, "commands": [{"tool": "sim.look"}]}],
            "edges": [{"from": "x", "to": "fix", "on": "failure"}],
        }
    )
    ((dev, main),) = batches(h)
    await h.step(results(dev, main))
    ((_, check),) = batches(h, kind="verify")
    await h.step(failing(dev, check))
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "verification_failed")
    assert "verify command 0 (sim.look) tool_error: no such file: marker" in row.error["message"]
    assert "its verify commands showed" in row.error["not_retried"]
    assert len(batches(h, kind="main")) == 1
    assert len(batches(h, "fix")) == 1  # the failure edge fires


# ---------------------------------------------------------------- the probe after an unknown outcome


async def test_a_node_whose_device_died_mid_command_is_decided_by_the_probe_when_it_is_back(h: Harness) -> None:
    box = await h.enroll("box")
    _, epoch = await h.connect(box)
    other = await h.enroll("other")
    await h.connect(other)
    task = await h.submit({"nodes": [checked()]})
    await lose_mid_command(h, box, epoch)
    assert (await h.task(task))["nodes"] == {"x": "verifying"}
    assert (await node_row(h, task)).verification["state"] == "probing"
    await h.advance(60)
    assert batches(h, kind="verify") == []  # pinned: only its own device may say
    await h.connect(box)
    ((dev, probe),) = batches(h, kind="verify")
    assert dev == box
    await h.step(results(dev, probe))
    row = await node_row(h, task)
    assert (row.state, row.verification["state"], row.verification["after"]) == ("succeeded", "passed", "unknown")
    assert len(batches(h, kind="main")) == 1  # decided, not run again
    assert (await h.task(task))["state"] == "succeeded"


async def test_an_agent_that_restarted_mid_command_is_probed_at_once(h: Harness) -> None:
    box = await h.enroll("box")
    await h.connect(box)
    task = await h.submit({"nodes": [checked()]})
    ((dev, main),) = batches(h)
    await h.step(uncertain(dev, main))
    ((vdev, probe),) = batches(h, kind="verify")
    assert vdev == box
    await h.step(failing(vdev, probe))
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "verification_failed")
    assert "had not taken effect" in row.error["message"]


async def test_a_failed_probe_of_a_retry_safe_attempt_runs_it_again(h: Harness) -> None:
    box = await h.enroll("box")
    _, epoch = await h.connect(box)
    task = await h.submit({"nodes": [checked(command="sim.look", retry={"max_attempts": 2, "backoff_s": 0})]})
    await lose_mid_command(h, box, epoch)
    await h.connect(box)
    ((dev, probe),) = batches(h, kind="verify")
    await h.step(failing(dev, probe))
    assert (await h.task(task))["nodes"] == {"x": "running"}  # its failure is real: retried, it is safe
    again = batches(h, kind="main")[-1]
    assert again[1].attempt == 2
    await h.step(results(dev, again[1]))
    ((_, check),) = batches(h, kind="verify")[1:]
    await h.step(results(dev, check))
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_node_not_pinned_is_probed_on_any_capable_device(h: Harness) -> None:
    first = await h.enroll("first", {"pool": "p"})
    _, epoch = await h.connect(first)
    second = await h.enroll("second", {"pool": "p"})
    await h.connect(second)
    node = {**checked(), "placement": {"labels": {"pool": "p"}}}
    task = await h.submit({"nodes": [node]})
    await lose_mid_command(h, first, epoch)
    ((dev, probe),) = batches(h, kind="verify")
    assert dev == second
    await h.step(results(dev, probe))
    assert (await h.task(task))["state"] == "succeeded"


async def test_the_probe_waits_at_most_probe_timeout_s_then_the_node_fails_with_its_error(h: Harness) -> None:
    h.settings.probe_timeout_s = 120.0
    box = await h.enroll("box")
    _, epoch = await h.connect(box)
    task = await h.submit({"nodes": [checked()]})
    await lose_mid_command(h, box, epoch)
    await h.advance(119)
    assert (await h.task(task))["nodes"] == {"x": "verifying"}
    await h.advance(2)
    row = await node_row(h, task)
    assert (row.state, row.error["code"], row.verification["state"]) == ("failed", "device_lost", "timed_out")
    assert "probe_timeout_s (120s)" in row.error["message"]


async def test_a_restart_while_waiting_for_the_probe_decides_it_the_same_way(h: Harness) -> None:
    box = await h.enroll("box")
    _, epoch = await h.connect(box)
    task = await h.submit({"nodes": [checked()]})
    await lose_mid_command(h, box, epoch)
    await h.restart()
    await h.connect(box)
    ((dev, probe),) = batches(h, kind="verify")
    await h.step(failing(dev, probe))
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "verification_failed")
    assert len(batches(h, kind="main")) == 1


async def test_a_restart_while_the_check_runs_takes_its_results_afterwards(h: Harness) -> None:
    box = await h.enroll("box")
    await h.connect(box)
    task = await h.submit({"nodes": [checked()]})
    ((dev, main),) = batches(h)
    await h.step(results(dev, main))
    ((_, check),) = batches(h, kind="verify")
    await h.step(accepted(dev, check))
    await h.restart()
    await h.connect(box, resumed=True)
    await h.step(results(dev, check))
    row = await node_row(h, task)
    assert (row.state, row.output) == ("succeeded", {"ok": True})
    assert len(batches(h, kind="verify")) == 2  # the check re-sent after the restart, under the same batch id
    assert len({b.batch_id for _, b in batches(h, kind="verify")}) == 1


async def test_cancel_while_waiting_for_the_probe_cancels_the_node(h: Harness) -> None:
    box = await h.enroll("box")
    _, epoch = await h.connect(box)
    task = await h.submit({"nodes": [checked()]})
    await lose_mid_command(h, box, epoch)
    await h.step(CancelTask(task))
    assert (await h.task(task))["state"] == "cancelled"
    await h.connect(box)
    assert batches(h, kind="verify") == []


async def test_fan_out_children_are_each_verified_on_their_own_device(h: Harness) -> None:
    devices = {}
    for name in ("w1", "w2"):
        devices[name] = await h.enroll(name, {"role": "web"})
        _, devices[name + "-epoch"] = await h.connect(devices[name])
    node = {
        "id": "x",
        "for_each": {"labels": {"role": "web"}},
        "commands": [{"tool": "sim.act"}],
        "verify": [{"tool": "sim.look"}],
    }
    task = await h.submit({"nodes": [node]})
    main = dict(batches(h, kind="main"))
    await h.step(results("dev_w1", main["dev_w1"]))
    await h.step(accepted("dev_w2", main["dev_w2"]))
    await h.step(LivenessChanged("dev_w2", Liveness.OFFLINE, int(devices["w2-epoch"]), "A"))
    (check,) = batches(h, kind="verify")
    assert check[0] == "dev_w1"
    await h.step(results(*check))
    bundle = await h.store.get_task(task)
    assert bundle is not None
    assert {c.device_name: c.state for c in bundle.children} == {"w1": "succeeded", "w2": "verifying"}
    await h.connect("dev_w2")
    probe = batches(h, kind="verify")[-1]
    assert probe[0] == "dev_w2"
    await h.step(results(*probe))
    row = await node_row(h, task)
    assert (row.state, sorted(row.output)) == ("succeeded", ["w1", "w2"])
    assert row.output["w2"] is None  # its commands' results were lost with the device; the probe decided


async def test_verify_tools_must_be_on_the_device_for_it_to_be_placed(h: Harness) -> None:
    only_act = await h.enroll("box")
    epoch = await h.store.open_session(only_act)
    from orchestrator.engine.records import DeviceHello

    hello = h.hello_frame(only_act, tools=[t for t in TOOLS if t.name == "sim.act"] + [tool("sim.other")])
    await h.step(DeviceHello(only_act, hello, False, epoch, "A"))
    task = await h.submit({"nodes": [checked()]})
    assert (await h.task(task))["errors"] == {"x": "no_capable_device"}


async def test_a_verify_tool_that_is_not_read_only_on_the_device_is_never_run(h: Harness) -> None:
    """Submission refuses it (verify_not_read_only); a re-plan's edit or a device whose catalogue
    changed since must not get it run either: the node fails instead."""
    box = await h.enroll("box")
    await h.connect(box)
    task = await h.submit({"nodes": [{**checked(), "verify": [{"tool": "sim.act"}]}]})
    ((dev, main),) = batches(h)
    await h.step(results(dev, main))
    assert batches(h, kind="verify") == []
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "verification_failed")
    assert "sim.act is not read-only on box" in row.error["message"]
