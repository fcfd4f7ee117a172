"""What a change of a device means for tasks, as the fleet and the device controls decide it and
the tasks' runs carry it out (queued nodes made ready again, attempts of a lost device ended,
nodes no device can run any more, agent nodes of a stopped device ended)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.engine.records import DeviceRun, NodeKey


@dataclass(frozen=True)
class Requeue:
    """These nodes left a device's queue: they are READY again."""

    keys: list[NodeKey]


@dataclass(frozen=True)
class Lost:
    """The device is lost (a new fencing epoch): its open attempts end `device_lost`."""

    device: DeviceRun
    message: str


@dataclass(frozen=True)
class Revoked:
    """A device will never run anything again: nodes only it could run fail now."""


@dataclass(frozen=True)
class Stopped:
    """An operator stopped the device (emergency stop): its agent nodes end `device_stopped` (its
    tool batches are ended by the agent itself, which kills them and reports `device_stopped`)."""

    device: DeviceRun
    message: str


@dataclass(frozen=True)
class Takeover:
    """A person took the device over (`taken`) or handed it back: its agent nodes pause before
    their next action, or go on after observing afresh (`note`: the handback's words)."""

    device: DeviceRun
    taken: bool
    by: str
    note: str = ""


Action = Requeue | Lost | Revoked | Stopped | Takeover
