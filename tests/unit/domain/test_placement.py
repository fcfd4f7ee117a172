"""Placement: explicit device, labels, platform, tool presence; free devices first."""

from __future__ import annotations

from orchestrator.domain import placement
from orchestrator.domain.model import AdminState, Liveness, NodeSpec
from orchestrator.domain.placement import DeviceView


def node(**placement_: object) -> NodeSpec:
    return NodeSpec.model_validate(
        {"id": "n", "placement": placement_, "commands": [{"tool": "shell.run", "arguments": {}}]}
    )


def dev(device_id: str, **kw: object) -> DeviceView:
    base: dict[str, object] = {
        "id": device_id,
        "name": device_id,
        "tools": frozenset({"shell.run"}),
        "liveness": Liveness.ONLINE,
        "platform": "linux",
    }
    base.update(kw)
    return DeviceView(**base)  # type: ignore[arg-type]


def test_explicit_device_by_id_or_name() -> None:
    assert placement.capable(node(device="a"), dev("a"))
    assert placement.capable(node(device="web"), dev("a", name="web"))
    assert not placement.capable(node(device="a"), dev("b"))


def test_labels_platform_and_tools_must_all_match() -> None:
    assert placement.capable(node(labels={"role": "web"}), dev("a", labels={"role": "web", "x": "y"}))
    assert not placement.capable(node(labels={"role": "web"}), dev("a", labels={"role": "db"}))
    assert not placement.capable(node(platform="windows"), dev("a"))
    assert not placement.capable(node(), dev("a", tools=frozenset({"files.read"})))


def test_a_free_device_is_preferred_then_the_shortest_queue() -> None:
    busy = dev("a", busy=True, queue_length=0)
    free = dev("b")
    assert placement.choose_queue(node(), [busy, free]) == free
    short = dev("c", busy=True, queue_length=1)
    long_ = dev("d", busy=True, queue_length=5)
    assert placement.choose_queue(node(), [long_, short]) == short


def test_devices_out_of_service_take_no_work_but_could_still_run_it_later() -> None:
    offline = dev("a", liveness=Liveness.OFFLINE)
    cordoned = dev("b", admin=AdminState.CORDONED)
    assert placement.choose_queue(node(), [offline, cordoned]) is None
    assert placement.could_ever_run(node(), [offline])
    assert not placement.could_ever_run(node(), [dev("c", admin=AdminState.REVOKED)])


def test_no_capable_device_problem_says_what_was_needed() -> None:
    p = placement.no_capable_device(node(labels={"role": "gpu"}), [dev("a")])
    assert p.code == "no_capable_device"
    assert "role=gpu" in p.message and "shell.run" in p.message
    assert "a: no label role" in p.message  # why the one device does not fit


def test_no_capable_device_problem_is_bounded_counts_the_fleet_and_shows_the_nearest_misses() -> None:
    fleet = [dev(f"web-{i:03d}", labels={"role": "web"}) for i in range(500)]
    fleet += [
        dev("gpu-box", labels={"role": "gpu"}, tools=frozenset({"files.read"})),
        dev("old", labels={"role": "gpu"}, admin=AdminState.REVOKED),
        dev("gpu-off", labels={"role": "gpu"}, liveness=Liveness.OFFLINE, tools=frozenset()),
    ]
    p = placement.no_capable_device(node(labels={"role": "gpu"}), fleet)
    assert len(p.message) < 1000
    assert "502 enrolled devices (501 online)" in p.message
    assert "500 have the tools, 2 match the placement" in p.message
    # the nearest misses first: the two that only lack the tool, then the rest by name
    assert "Nearest: gpu-box: no tool shell.run; gpu-off: no tool shell.run; web-000: role=web, not gpu" in p.message
    assert "and 497 more" in p.message
    assert sum(f"web-{i:03d}" in p.message for i in range(500)) == 3
    assert "old" not in p.message  # revoked devices are not the fleet
    assert p.extra["devices"] == {"enrolled": 502, "online": 501, "with_tools": 500, "matching_placement": 2}


def test_no_capable_device_problem_for_a_named_device_and_platform() -> None:
    p = placement.no_capable_device(node(device="db-9", platform="windows"), [dev("a"), dev("b", platform="windows")])
    assert "b: not device 'db-9'" in p.message and "a: not device 'db-9', platform linux" in p.message
    assert p.message.index("b:") < p.message.index("a:")  # fewer unmet needs first


def test_no_capable_device_problem_with_no_devices_says_so() -> None:
    p = placement.no_capable_device(node(), [dev("x", admin=AdminState.REVOKED)])
    assert p.message.endswith("no devices are enrolled")
