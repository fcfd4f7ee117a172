"""Engine inputs as JSON, so replicas can hand them to the engine leader through Redis."""

from __future__ import annotations

from typing import Any

from orchestrator.domain.controls import ControlAction
from orchestrator.domain.model import Liveness
from orchestrator.engine.intake import Submission
from orchestrator.engine.records import (
    CancelTask,
    ControlDevice,
    DecideApproval,
    DeviceChanged,
    DeviceHello,
    FrameIn,
    Input,
    LinkReport,
    LinkState,
    LivenessChanged,
    SubmitTask,
    TaskCreated,
)
from orchestrator.engine.schedule_records import ChangeSchedule
from protocol.codec import decode, encode


class NotPortable(ValueError):
    """This input only makes sense inside one process."""


def dump(item: Input) -> dict[str, Any]:
    if isinstance(item, SubmitTask):
        return {"kind": "submit_task", "submission": item.submission.as_json()}
    if isinstance(item, TaskCreated):
        return {"kind": "task_created", "task_id": item.task_id}
    if isinstance(item, CancelTask):
        return {"kind": "cancel_task", "task_id": item.task_id}
    if isinstance(item, DeviceChanged):
        return {"kind": "device_changed", "device_id": item.device_id}
    if isinstance(item, ControlDevice):
        return {
            "kind": "control_device",
            "device_id": item.device_id,
            "action": item.action.value,
            "reason": item.reason,
            "request_id": item.request_id,
            "expect_gen": item.expect_gen,
            "by": item.by,
        }
    if isinstance(item, DecideApproval):
        return {
            "kind": "decide_approval",
            "approval_id": item.approval_id,
            "decision": item.decision,
            "by": item.by,
            "reason": item.reason,
        }
    if isinstance(item, DeviceHello):
        return {
            "kind": "hello",
            "device_id": item.device_id,
            "frame": encode(item.hello),
            "resumed": item.resumed,
            "epoch": item.epoch,
            "replica": item.replica,
        }
    if isinstance(item, LivenessChanged):
        return {
            "kind": "liveness",
            "device_id": item.device_id,
            "liveness": item.liveness.value,
            "epoch": item.epoch,
            "replica": item.replica,
        }
    if isinstance(item, LinkReport):
        links = [
            [s.device_id, s.epoch, s.liveness.value, round(s.silent_s, 3), s.batch_id, s.control_gen]
            for s in item.links
        ]
        return {"kind": "links", "replica": item.replica, "links": links}
    if isinstance(item, FrameIn):
        return {"kind": "frame", "device_id": item.device_id, "frame": encode(item.message)}
    if isinstance(item, ChangeSchedule):
        return {"kind": "schedule", **item.as_json()}
    raise NotPortable(f"{type(item).__name__} cannot cross replicas")


def load(data: dict[str, Any]) -> Input:
    kind = data["kind"]
    if kind == "submit_task":
        return SubmitTask(Submission.from_json(data["submission"]), asked_before=True)
    if kind == "task_created":
        return TaskCreated(data["task_id"])
    if kind == "cancel_task":
        return CancelTask(data["task_id"])
    if kind == "device_changed":
        return DeviceChanged(data["device_id"])
    if kind == "control_device":
        expect = data.get("expect_gen")
        return ControlDevice(
            str(data["device_id"]),
            ControlAction(data["action"]),
            str(data.get("reason") or ""),
            str(data.get("request_id") or ""),
            int(expect) if expect is not None else None,
            str(data.get("by") or ""),
        )
    if kind == "decide_approval":
        return DecideApproval(
            str(data["approval_id"]), str(data["decision"]), str(data["by"]), str(data.get("reason") or "")
        )
    if kind == "hello":
        return DeviceHello(
            data["device_id"], decode(data["frame"]), bool(data["resumed"]), int(data["epoch"]), str(data["replica"])
        )
    if kind == "liveness":
        return LivenessChanged(data["device_id"], Liveness(data["liveness"]), int(data["epoch"]), str(data["replica"]))
    if kind == "links":
        return LinkReport(
            str(data["replica"]),
            [LinkState(str(d), int(e), Liveness(lv), float(s), b, int(g)) for d, e, lv, s, b, g in data["links"]],
        )
    if kind == "frame":
        return FrameIn(data["device_id"], decode(data["frame"]))
    if kind == "schedule":
        return ChangeSchedule.from_json(data)
    raise NotPortable(f"unknown input kind {kind!r}")
