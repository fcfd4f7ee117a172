"""Which device may run a node, and whose queue it joins (SPEC section 2, placement)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from orchestrator.domain.model import AdminState, DeviceState, Liveness, NodeKind, NodeSpec
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
    p = node.placement
    if p.device is not None and p.device not in (device.id, device.name):
        return False
    if p.platform is not None and p.platform != device.platform:
        return False
    if any(device.labels.get(k) != v for k, v in p.labels.items()):
        return False
    if node.kind is NodeKind.AGENT:
        return bool(device.tools)
    return all(t in device.tools for t in node.tools())


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


def no_capable_device(node: NodeSpec, devices: Iterable[DeviceView]) -> Problem:
    p = node.placement
    wanted = []
    if p.device:
        wanted.append(f"device '{p.device}'")
    if p.platform:
        wanted.append(f"platform '{p.platform}'")
    if p.labels:
        wanted.append("labels " + ", ".join(f"{k}={v}" for k, v in sorted(p.labels.items())))
    if node.tools():
        wanted.append("tools " + ", ".join(sorted(set(node.tools()))))
    names = ", ".join(sorted(d.name or d.id for d in devices if d.admin is not AdminState.REVOKED))
    return Problem(
        "no_capable_device",
        f"node '{node.id}' needs {'; '.join(wanted) or 'a device'}, and no enrolled device matches"
        + (f" (enrolled: {names})" if names else " (no devices are enrolled)"),
        {"node": node.id},
    )


def state_of(device: DeviceView) -> DeviceState:
    from orchestrator.domain.lifecycle import device_state

    return device_state(device.admin, device.liveness, device.busy, device.queue_length)
