"""Nothing a device sends can stop the control plane: every device->server frame type, every
string field of it in turn set to a NUL, a lone surrogate (sent as the JSON escape `\\ud800`), a
control character and an oversize value, from a real enrolled device to a real orchestrator
(uvicorn on loopback), on SQLite and on Postgres.

After each frame: the orchestrator still runs, the frame was refused with `malformed_frame` and
close 4400 (a tool's own output is the exception: it is kept, see protocol/text.py), and at the
end of each frame type an honest agent on the same orchestrator still gets and completes work.

The fields come from the pydantic models (`protocol.messages`): a new frame type or field is
fuzzed without editing this test. The frames that carry a batch name the attacker's real batch,
so what they say would be stored (an approval request, a breach cordoning the device)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from protocol import messages
from protocol.text import MAX_KEY, MAX_NESTED_STRING, PAYLOAD
from tests.services import fresh_database
from tests.support import Fleet

BAD = {"nul": "a\u0000b", "surrogate": "a\ud800b", "control": "a\x1b[2Jb"}
FRAME_TYPES = {
    name: cls
    for cls in typing.get_args(typing.get_args(messages.Message)[0])
    if (name := cls.model_fields["type"].default) in messages.AGENT_TO_SERVER
}
ATTACKER_TOOL = {"name": "raw.act", "namespace": "raw", "tool_type": "action"}


# ---------------------------------------------------------------- frames from the models


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether it was optional)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else annotation), True
    return annotation, False


def synth(annotation: Any) -> Any:
    """A valid value of `annotation` (the first literal, 1 for numbers: every `ge` here is 0 or 1)."""
    annotation, optional = _unwrap(annotation)
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return base(annotation)
    if origin is Literal:
        return typing.get_args(annotation)[0]
    if origin is list:
        return [synth(typing.get_args(annotation)[0])]
    if origin is dict or annotation is Any:
        return {}
    return {str: "x", int: 1, float: 1.0, bool: False}.get(annotation, None if optional else "x")


def base(model: type[BaseModel]) -> dict[str, Any]:
    """A valid payload of `model` with every field, optional ones too, so each can be fuzzed."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name in ("v", "seq", "ack"):
            continue
        out[name] = info.default if name == "type" else synth(info.annotation)
    if model is messages.Hello:
        out.update(tools=[{**base(messages.ToolSpec), **ATTACKER_TOOL}])
    if model is messages.DeviceInfo:
        out.update(platform="linux", extra_key="x")  # extras are allowed and stored: fuzzed too
    return out


def _limit(info: FieldInfo | None) -> int | None:
    if info is None:
        return MAX_NESTED_STRING
    return next((m.max_length for m in info.metadata if getattr(m, "max_length", None) is not None), None)


def string_fields(
    model: type[BaseModel], prefix: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], bool, int | None]]:
    """(path, whether it is a tool's output, max length) of every string a frame of `model` carries:
    str fields, strings in lists of models, values and keys of free-form objects."""
    for name, info in model.model_fields.items():
        if name == "type":
            continue
        annotation, _ = _unwrap(info.annotation)
        payload = PAYLOAD in info.metadata
        origin = typing.get_origin(annotation)
        path = (*prefix, name)
        if annotation is str:
            yield path, payload, _limit(info)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from string_fields(annotation, path)
        elif origin is list:
            (item,) = typing.get_args(annotation)
            if isinstance(item, type) and issubclass(item, BaseModel):
                yield from string_fields(item, (*path, 0))
        elif origin is dict or annotation is Any:
            yield (*path, "k"), payload, None if payload else MAX_NESTED_STRING  # a value
            yield (*path, None), payload, None if payload else MAX_KEY  # a key
    if model.model_config.get("extra") == "allow":
        yield (*prefix, "extra_key"), False, MAX_NESTED_STRING


def with_value(frame: dict[str, Any], path: tuple[Any, ...], value: str) -> dict[str, Any]:
    frame = json.loads(json.dumps(frame))
    target = frame
    for step in path[:-2] if path[-1] is None else path[:-1]:
        target = target[step]
    if path[-1] is None:  # a key of a free-form object
        target[path[-2]] = {value: 1}
    else:
        target[path[-1]] = value
    return frame


def cases() -> list[tuple[str, tuple[Any, ...], str, str, bool]]:
    """(frame type, path, what, value, whether the server keeps it) for every field and value."""
    out = []
    for type_, model in sorted(FRAME_TYPES.items()):
        for path, payload, limit in string_fields(model):
            for what, value in BAD.items():
                out.append((type_, path, what, value, payload))
            if limit is not None:
                out.append((type_, path, "oversize", "y" * (limit + 1), False))
    return out


def test_every_device_frame_type_has_fields_to_fuzz_and_a_valid_base() -> None:
    assert set(FRAME_TYPES) == set(messages.AGENT_TO_SERVER)
    for model in FRAME_TYPES.values():
        model.model_validate(base(model))
    fuzzed = {f"{c[0]}.{'.'.join(map(str, c[1]))}" for c in cases()}
    for field in ("approval_request.reason", "safety_breach.detail", "approval_decision.by", "hello.info.extra_key"):
        assert field in fuzzed


# ---------------------------------------------------------------- a real orchestrator


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp(f"frame-fuzz-{request.param}")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            database = f"sqlite+aiosqlite:///{tmp}/orrery.db"
        else:
            database = stack.enter_context(fresh_database(request.getfixturevalue("postgres_url")))
        f = stack.enter_context(Fleet(tmp, database_url=database, handshakes_per_minute="100000"))
        f.agent("honest", {"role": "honest"})
        yield f


class Attacker:
    """An enrolled device speaking the protocol by hand, holding one batch of real work."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.enrolled = fleet.enroll("attacker", {"role": "attacker"})
        self.session: str | None = None
        self.last_seq = 0  # of the server's frames
        self.seq = 0  # of ours, accepted by the server
        self.batch: dict[str, Any] = {}

    def hello(self, **over: Any) -> dict[str, Any]:
        resume = {"session_id": self.session, "last_seq": self.last_seq} if self.session else None
        return {
            "v": 1,
            "type": "hello",
            "seq": 0,
            "ack": self.last_seq,
            "device_id": self.enrolled["id"],
            "versions": [1],
            "info": {"platform": "linux"},
            "tools": [ATTACKER_TOOL],
            "resume": resume,
            **over,
        }

    async def open(self, hello: dict[str, Any] | None = None) -> ClientConnection:
        url = self.fleet.server.url.replace("http://", "ws://") + "/v1/agent"
        ws = await connect(url, additional_headers={"Authorization": f"Bearer {self.enrolled['token']}"})
        await ws.send(json.dumps(hello or self.hello()))
        return ws

    async def welcomed(self) -> ClientConnection:
        ws = await self.open()
        welcome = await self.next(ws, "welcome")
        self.session = welcome["session_id"]
        return ws

    async def next(self, ws: ClientConnection, type_: str) -> dict[str, Any]:
        async with asyncio.timeout(30):
            while True:
                frame = json.loads(await ws.recv())
                self.last_seq = max(self.last_seq, frame["seq"])
                if frame["type"] == type_:
                    return frame


async def refusal(ws: ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    frames = []
    try:
        async with asyncio.timeout(30):
            while True:
                frames.append(json.loads(await ws.recv()))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None


def honest_work(f: Fleet) -> None:
    dag = {
        "nodes": [
            {
                "id": "a",
                "placement": {"labels": {"role": "honest"}},
                "commands": [{"tool": "system.echo", "arguments": {"text": "hi"}}],
            }
        ]
    }
    task = f.wait_task(f.submit(dag)["id"], timeout=30)
    assert task["state"] == "succeeded", task


async def test_no_device_frame_stops_the_orchestrator_or_its_honest_devices(fleet: Fleet) -> None:
    f = fleet
    attacker = Attacker(f)
    ws = await attacker.welcomed()
    placed = {
        "id": "a",
        "placement": {"labels": {"role": "attacker"}},
        "commands": [{"tool": "raw.act"}],
        "timeout_s": 600,
    }
    f.submit({"nodes": [placed]})
    attacker.batch = await attacker.next(ws, "command_batch")
    attacker.seq = 1
    await ws.send(
        json.dumps(
            {
                "v": 1,
                "type": "batch_accepted",
                "seq": 1,
                "ack": attacker.last_seq,
                "batch_id": attacker.batch["batch_id"],
            }
        )
    )
    await ws.close()
    command = attacker.batch["commands"][0]
    real = {"batch_id": attacker.batch["batch_id"], "call_id": command["call_id"], "tool": command["tool"]}

    done_types: set[str] = set()
    for type_, path, what, value, kept in cases():
        model = FRAME_TYPES[type_]
        frame = {
            **base(model),
            **({k: v for k, v in real.items() if k in model.model_fields} if type_ == "approval_request" else {}),
        }
        if type_ == "result_batch":
            frame["batch_id"] = "b_not_current"  # a tool output that is kept must change nothing here
        if type_ == "approval_request":
            frame["approval_id"] = f"apr_{len(done_types)}_{abs(hash((path, what))) % 10**8}"
        frame = with_value(frame, path, value)
        reliable = type_ in messages.RELIABLE_TYPES
        label = f"{type_}.{'.'.join(map(str, path))} = {what}"
        if type_ == "hello":
            ws = await attacker.open({**attacker.hello(), **{k: v for k, v in frame.items() if k != "type"}})
        else:
            ws = await attacker.welcomed()
            frame.update(v=1, seq=attacker.seq + 1 if reliable else 0, ack=attacker.last_seq)
            await ws.send(json.dumps(frame))
        if kept:
            # A tool's output keeps what the tool printed: the frame is taken, the link lives on.
            await ws.send(
                json.dumps({"v": 1, "type": "heartbeat", "seq": 0, "ack": attacker.last_seq, "state": "busy"})
            )
            reply = await attacker.next(ws, "heartbeat")
            assert reply["type"] == "heartbeat", label
            attacker.seq += reliable
            await ws.close()
        else:
            frames, code = await refusal(ws)
            errors = [fr for fr in frames if fr["type"] == "error"]
            assert errors and errors[-1]["code"] == "malformed_frame" and code == 4400, (label, frames, code)
            assert "\u0000" not in errors[-1]["message"], label
        assert f.server.proc is not None and f.server.proc.poll() is None, f"the server exited after {label}"
        if type_ not in done_types:
            if done_types:
                honest_work(f)  # after each frame type, an honest device still gets and completes work
            done_types.add(type_)
    honest_work(f)
    log = f.server.log()
    assert "the engine stopped" not in log
    assert "Traceback" not in log
    assert {c[0] for c in cases()} == done_types
