"""The no-capable-device diagnosis for a device whose agent never connected (its tools unknown)."""

from __future__ import annotations

from orchestrator.domain import placement
from orchestrator.domain.model import Liveness, NodeSpec
from orchestrator.domain.placement import DeviceView


def node(**placement_: object) -> NodeSpec:
    return NodeSpec.model_validate(
        {"id": "n", "placement": placement_, "commands": [{"tool": "shell.run", "arguments": {}}]}
    )


def test_a_never_connected_device_is_named_with_how_to_start_its_agent() -> None:
    web = DeviceView("w", "web-2", {"role": "web"}, "linux", frozenset({"shell.run"}), liveness=Liveness.ONLINE)
    cache = DeviceView("c", "cache-1", {"role": "cache"})  # enrolled, never connected: no tools yet
    p = placement.no_capable_device(node(labels={"role": "cache"}), [web, cache])
    assert p.code == "no_capable_device"
    assert "cache-1: never connected, so its tools are unknown" in p.message
    assert "no tool shell.run" not in p.message
    assert "cache-1 has never connected" in p.message and "start its agent on that machine" in p.message
    assert "ORRERY_AGENT_TOKEN=" in p.message and "orrery agent --server" in p.message
    assert "Enroll or label" not in p.message
    assert p.extra["never_connected"] == ["cache-1"]


def test_a_never_connected_device_outside_the_placement_keeps_the_old_advice() -> None:
    web = DeviceView("w", "web-2", {"role": "web"}, "linux", frozenset({"files.read"}), liveness=Liveness.ONLINE)
    cache = DeviceView("c", "cache-1", {"role": "cache"})
    p = placement.no_capable_device(node(labels={"role": "web"}), [web, cache])
    assert "web-2: no tool shell.run" in p.message
    assert "Enroll or label a device that fits" in p.message
    assert "never_connected" not in p.extra


def test_several_never_connected_devices_are_counted_not_listed_without_bound() -> None:
    fleet = [DeviceView(f"c{i}", f"cache-{i:02d}", {"role": "cache"}) for i in range(12)]
    p = placement.no_capable_device(node(labels={"role": "cache"}), fleet)
    assert "cache-00, cache-01, cache-02, cache-03, cache-04 and 7 more have never connected" in p.message
    assert "start their agents on those machines" in p.message
    assert len(p.extra["never_connected"]) == placement.MAX_REFUSALS_SHOWN
