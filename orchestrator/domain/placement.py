"""Which device may run a node, and whose queue it joins (SPEC section 2, placement)."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass, field

from orchestrator.domain.model import AdminState, DeviceState, Liveness, NodeKind, NodeSpec, Placement
from orchestrator.domain.problems import Problem


@dataclass(frozen=True)
class DeviceView:
    """What placement needs to know about a device."""

    id: str
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    platform: str = "other"
    tools: frozenset[str] = frozenset()
    admin: AdminState = AdminState.ACTIVE
    liveness: Liveness = Liveness.ENROLLED
    busy: bool = False
    queue_length: int = 0

    @property
    def takes_work(self) -> bool:
        """May get new work now: connected, live, in service (busy devices queue it)."""
        return self.admin is AdminState.ACTIVE and self.liveness is Liveness.ONLINE

    @property
    def free(self) -> bool:
        return self.takes_work and not self.busy


def capable(node: NodeSpec, device: DeviceView) -> bool:
    """The device matches the node's placement and offers every tool it uses."""
    return _matches_placement(node, device) and _has_tools(node, device)


def signature(node: NodeSpec) -> Hashable:
    """What `capable` looks at in a node: two nodes with the same signature fit the same devices
    (checks of a large DAG judge each signature once instead of each node x device)."""
    p = node.placement
    needs = frozenset(node.tools()) if node.kind is NodeKind.TOOL else ("agent", frozenset(node.tools()))
    fan = node.for_each
    selector = None if fan is None else (tuple(sorted(fan.labels.items())), fan.platform, tuple(fan.devices or ()))
    return (node.kind, p.device, p.platform, tuple(sorted(p.labels.items())), needs, selector)


def could_ever_run(node: NodeSpec, devices: Iterable[DeviceView]) -> bool:
    """Some non-revoked device is capable, connected or not."""
    return any(d.admin is not AdminState.REVOKED and capable(node, d) for d in devices)


def choose_queue(
    node: NodeSpec, devices: Iterable[DeviceView], avoid: frozenset[str] = frozenset()
) -> DeviceView | None:
    """The device whose queue the node joins: a free one first, else the shortest queue.

    Devices in `avoid` (where an earlier attempt of this node failed) come last, so a retry goes
    to another capable device when there is one.
    """
    candidates = [d for d in devices if d.takes_work and capable(node, d)]
    if not candidates:
        return None
    return min(candidates, key=lambda d: preference(d.id, avoid, d.busy or d.queue_length > 0, d.queue_length))


def preference(
    device_id: str, avoid: Collection[str], occupied: bool, queue_length: int
) -> tuple[bool, bool, int, str]:
    """Sort key of candidate devices, best first: not where this node failed before, free, then
    the shortest queue; the id breaks ties so placement is deterministic."""
    return (device_id in avoid, occupied, queue_length, device_id)


MAX_REFUSALS_SHOWN = 5


def refusals(node: NodeSpec, device: DeviceView) -> list[str]:
    """Why `device` cannot run `node`, one short phrase per unmet need (empty if it can)."""
    p = selector(node)
    why = []
    if p.device is not None and p.device not in (device.id, device.name):
        why.append(f"not device '{p.device}'")
    if node.for_each is not None and node.for_each.devices is not None and not _named(node, device):
        why.append("not one of its for_each.devices")
    if p.platform is not None and p.platform != device.platform:
        why.append(f"platform {device.platform}")
    for k, v in sorted(p.labels.items()):
        have = device.labels.get(k)
        if have != v:
            why.append(f"no label {k}" if have is None else f"{k}={have}, not {v}")
    if never_connected(device):
        why.append("never connected, so its tools are unknown")  # not "no tool X": it has not said yet
    elif node.kind is NodeKind.AGENT and not device.tools:
        why.append("no tools")
    else:
        missing = sorted({t for t in node.tools() if t not in device.tools})
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            why.append(f"no tool {shown}")
    return why


def no_capable_device(node: NodeSpec, devices: Iterable[DeviceView]) -> Problem:
    """The problem for a node no device can run: what it needs, how many devices come close in
    counts, and at most `MAX_REFUSALS_SHOWN` of the nearest misses by name, never the whole
    fleet (the message goes into API answers, node errors and LLM prompts)."""
    p = selector(node)
    wanted = []
    if p.device:
        wanted.append(f"device '{p.device}'")
    if node.for_each is not None and node.for_each.devices is not None:
        wanted.append(
            "one of the devices "
            + ", ".join(node.for_each.devices[:5])
            + ("..." if len(node.for_each.devices) > 5 else "")
        )
    if p.platform:
        wanted.append(f"platform '{p.platform}'")
    if p.labels:
        wanted.append("labels " + ", ".join(f"{k}={v}" for k, v in sorted(p.labels.items())))
    if node.tools():
        wanted.append("tools " + ", ".join(sorted(set(node.tools()))))
    fleet = [d for d in devices if d.admin is not AdminState.REVOKED]
    head = f"node '{node.id}' needs {'; '.join(wanted) or 'a device'}"
    if not fleet:
        return Problem("no_capable_device", f"{head}, and no devices are enrolled", {"node": node.id})
    with_tools = sum(1 for d in fleet if _has_tools(node, d))
    placed = sum(1 for d in fleet if _matches_placement(node, d))
    online = sum(1 for d in fleet if d.liveness is Liveness.ONLINE)
    misses = sorted(((refusals(node, d), d.name or d.id) for d in fleet), key=lambda m: (len(m[0]), m[1]))
    shown = [f"{name}: {', '.join(why)}" for why, name in misses[:MAX_REFUSALS_SHOWN]]
    more = len(misses) - len(shown)
    counts = {"enrolled": len(fleet), "online": online, "with_tools": with_tools, "matching_placement": placed}
    silent = never_connected_matching(node, fleet)
    extra: dict[str, object] = {"node": node.id, "devices": counts}
    if silent:
        extra["never_connected"] = silent[:MAX_REFUSALS_SHOWN]
    return Problem(
        "no_capable_device",
        f"{head}, and none of the {len(fleet)} enrolled devices ({online} online) matches: "
        f"{with_tools} have the tools, {placed} match the placement. Nearest: "
        + "; ".join(shown)
        + (f"; and {more} more" if more else "")
        + ". "
        + (start_agent_advice(silent) if silent else ADVICE_NO_FIT),
        extra,
    )


ADVICE_NO_FIT = "Enroll or label a device that fits, or change the node's placement or tools."


def never_connected(device: DeviceView) -> bool:
    """Enrolled, but its agent never connected: its tools are not known yet."""
    return device.liveness is Liveness.ENROLLED and not device.tools


def never_connected_matching(node: NodeSpec, devices: Iterable[DeviceView]) -> list[str]:
    """Names of the non-revoked devices the node's placement means whose agent never connected."""
    return sorted(
        d.name or d.id
        for d in devices
        if d.admin is not AdminState.REVOKED and never_connected(d) and _matches_placement(node, d)
    )


def start_agent_advice(names: list[str]) -> str:
    """What to do about devices that match a node's placement but whose agent never connected."""
    shown = ", ".join(names[:MAX_REFUSALS_SHOWN]) + (
        f" and {len(names) - MAX_REFUSALS_SHOWN} more" if len(names) > MAX_REFUSALS_SHOWN else ""
    )
    them = "its agent" if len(names) == 1 else "their agents"
    return (
        f"{shown} {'has' if len(names) == 1 else 'have'} never connected, so the server does not know "
        f"{'its' if len(names) == 1 else 'their'} tools yet: start {them} "
        f"on {'that machine' if len(names) == 1 else 'those machines'} "
        "(ORRERY_AGENT_TOKEN=<the token from enrollment> orrery agent --server <this server's URL>), "
        "then submit again."
    )


def selector(node: NodeSpec) -> Placement:
    """What picks a node's devices: its placement, or for a fan-out node its for_each's labels
    and platform (a for_each.devices list is matched by `_named`)."""
    fan = node.for_each
    if fan is None:
        return node.placement
    return Placement(labels=fan.labels, platform=fan.platform)


def _named(node: NodeSpec, device: DeviceView) -> bool:
    names = node.for_each.devices if node.for_each is not None else None
    return names is None or device.id in names or device.name in names


def _matches_placement(node: NodeSpec, device: DeviceView) -> bool:
    p = selector(node)
    return (
        (p.device is None or p.device in (device.id, device.name))
        and (p.platform is None or p.platform == device.platform)
        and all(device.labels.get(k) == v for k, v in p.labels.items())
        and _named(node, device)
    )


def _has_tools(node: NodeSpec, device: DeviceView) -> bool:
    if node.kind is NodeKind.AGENT:
        return bool(device.tools) and all(t in device.tools for t in node.tools())  # its verify tools
    return all(t in device.tools for t in node.tools())


def state_of(device: DeviceView) -> DeviceState:
    from orchestrator.domain.lifecycle import device_state

    return device_state(device.admin, device.liveness, device.busy, device.queue_length)
