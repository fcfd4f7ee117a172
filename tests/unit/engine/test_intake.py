"""The engine is the one writer of tasks (issue 15): a submission is stored in the commit of the
step that starts it, exactly once however often it is asked, and crosses replicas as plain data."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.cluster import wire
from orchestrator.domain.controls import ControlAction
from orchestrator.domain.model import DagSpec
from orchestrator.engine.intake import KeptNode, Submission
from orchestrator.engine.records import ControlDevice, DecideApproval, DeviceChanged, SubmitTask
from tests.unit.engine.harness import Harness, one_node


def submission(task_id: str, key: str | None = None, body_hash: str = "h1", **dag: object) -> Submission:
    spec = DagSpec.model_validate(dag or one_node())
    return Submission(task_id=task_id, name=task_id, body_hash=body_hash, created=1.8e9, spec=spec, idempotency_key=key)


async def test_a_submission_is_stored_by_the_engine_in_the_commit_that_starts_it(h: Harness) -> None:
    dev = await h.enroll("a")
    await h.connect(dev)
    (admitted,) = await h.step(SubmitTask(submission("task_x")))
    assert admitted == {"task_id": "task_x", "created": True, "body_hash": "h1"}
    stored = await h.task("task_x")
    assert stored["state"] == "running" and stored["nodes"] == {"n": "running"}
    assert [b.task_id for b in h.batches(dev)] == ["task_x"]  # dispatched after that same commit


async def test_a_submission_asked_again_after_its_answer_was_lost_makes_one_task(h: Harness) -> None:
    dev = await h.enroll("a")
    await h.connect(dev)
    first, again = await h.step(SubmitTask(submission("task_x")), SubmitTask(submission("task_x"), asked_before=True))
    assert first == again == {"task_id": "task_x", "created": True, "body_hash": "h1"}
    await h.restart()  # a new leader, which never saw the first answer: the store tells it
    (late,) = await h.step(SubmitTask(submission("task_x"), asked_before=True))
    assert late["task_id"] == "task_x" and late["created"] is True
    assert len((await h.task("task_x"))["attempts"]) == 1
    assert [b.task_id for b in h.batches(dev)] == ["task_x"]  # run once, never twice


async def test_one_idempotency_key_used_twice_in_one_step_makes_one_task(h: Harness) -> None:
    one, two = await h.step(
        SubmitTask(submission("task_1", key="k", body_hash="h1")),
        SubmitTask(submission("task_2", key="k", body_hash="h2")),
    )
    assert one == {"task_id": "task_1", "created": True, "body_hash": "h1"}
    assert two == {"task_id": "task_1", "created": False, "body_hash": "h1"}  # the API answers 409 (other body)
    assert await h.store.get_task("task_2") is None
    await h.restart()
    (three,) = await h.step(SubmitTask(submission("task_3", key="k", body_hash="h1")))
    assert three == {"task_id": "task_1", "created": False, "body_hash": "h1"}


def test_a_submission_crosses_replicas_as_json_unchanged() -> None:
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    sub = Submission(
        task_id="task_r",
        name="again",
        body_hash="h",
        created=1.8e9,
        spec=DagSpec.model_validate(
            {
                "nodes": [
                    {"id": "a", "commands": [{"tool": "sim.act"}]},
                    {"id": "b", "kind": "agent", "instruction": "look"},
                ],
                "edges": [{"from": "a", "to": "b"}],
            }
        ),
        request="collect the logs",
        priority=3,
        labels={"team": "ops"},
        replan=True,
        idempotency_key="k",
        rerun_of="task_old",
        kept={"a": KeptNode("succeeded", {"out": 1}, [{"call_id": "c1"}], None, at, at)},
    )
    item = wire.load(wire.dump(SubmitTask(sub)))
    assert isinstance(item, SubmitTask) and item.submission == sub
    assert item.asked_before  # the engine checks the store: the sender may be asking again


def test_a_device_change_a_control_and_a_decision_cross_replicas() -> None:
    assert wire.load(wire.dump(DeviceChanged("dev_1"))) == DeviceChanged("dev_1")
    assert wire.dump(DeviceChanged("dev_1")) == {"kind": "device_changed", "device_id": "dev_1"}  # as before
    for control in (
        ControlDevice("dev_1", ControlAction.RESUME, "resumed by k1", "req_1", expect_gen=3),
        ControlDevice("dev_1", ControlAction.STOP, "fire", "req_2"),
    ):
        assert wire.load(wire.dump(control)) == control
    decision = DecideApproval("apr_1", "denied", "api key k1", "not now")
    assert wire.load(wire.dump(decision)) == decision
