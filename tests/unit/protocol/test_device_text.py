"""The server's check of device text (protocol/text.py): what a device says is stored, so text the
store cannot hold is refused at the boundary as `malformed_frame`, naming the field; a tool's own
output keeps what the tool printed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.errors import ErrorCode, MalformedFrame, bounded_result_error
from protocol.messages import ResultBatch, Welcome
from protocol.session import Channel, Role, Session


def server_channel() -> Channel:
    channel = Channel(Role.SERVER)
    hello = channel.receive(json.dumps({"v": 1, "type": "hello", "device_id": "d1", "versions": [1]}))
    assert hello is not None
    welcome = Welcome(
        session_id="s1",
        version=1,
        heartbeat_interval_s=1,
        heartbeat_timeout_s=5,
        max_frame_bytes=1 << 20,
        resumed=False,
    )
    channel.accept(hello, Session("s1", 1), welcome)  # type: ignore[arg-type]
    return channel


def frame(type_: str, **payload: Any) -> str:
    return json.dumps({"v": 1, "type": type_, "seq": 1, **payload})


APPROVAL = {"approval_id": "apr_1", "batch_id": "b1", "call_id": "c1", "tool": "shell.run"}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (frame("approval_request", **APPROVAL, reason="why\u0000"), "approval_request.reason"),
        (frame("safety_breach", budget="destructive_per_minute", limit=1, detail="\u0000"), "safety_breach.detail"),
        (frame("approval_decision", approval_id="apr_1", decision="approved", by="me\u0000"), "approval_decision.by"),
        (frame("approval_request", **APPROVAL, arguments={"argv": ["a\ud800"]}), "approval_request.arguments.argv.0"),
        (frame("approval_request", **APPROVAL, arguments={"k\u0000": 1}), "approval_request.arguments key"),
        (frame("approval_request", **APPROVAL, reason="\x1b[2J"), "approval_request.reason"),
        (frame("tools_changed", tools=[{"name": "a.b\n", "namespace": "a"}]), "tools_changed.tools.0.name"),
        (frame("approval_request", **{**APPROVAL, "approval_id": "a" * 65}), "approval_id"),
        (frame("approval_request", **APPROVAL, arguments={"x": "y" * 20_000}), "approval_request.arguments.x"),
    ],
)
def test_text_the_store_cannot_hold_is_a_malformed_frame_naming_the_field(text: str, where: str) -> None:
    with pytest.raises(MalformedFrame) as refused:
        server_channel().receive(text)
    assert refused.value.code is ErrorCode.MALFORMED_FRAME
    assert where in refused.value.message
    assert "\x00" not in refused.value.message and "\x1b" not in refused.value.message


def test_free_text_keeps_tabs_and_newlines_and_unicode() -> None:
    msg = server_channel().receive(frame("approval_request", **APPROVAL, reason="line 1\n\tline 2 — ü ✓"))
    assert msg is not None and msg.reason == "line 1\n\tline 2 — ü ✓"  # type: ignore[union-attr]


def test_a_tools_output_keeps_its_nul_and_only_a_lone_surrogate_is_replaced() -> None:
    result = {
        "call_id": "c1",
        "status": "failure",
        "result": {"text": "a\u0000b\ud800", "bytes\udc80": [1]},
        "error": {"code": "tool_error", "message": "stderr: \u0000\x1b"},
    }
    msg = server_channel().receive(frame("result_batch", batch_id="b1", fence=1, results=[result]))
    assert isinstance(msg, ResultBatch)
    (got,) = msg.results
    assert got.result == {"text": "a\u0000b\ufffd", "bytes\ufffd": [1]}
    assert got.error is not None and got.error.message == "stderr: \u0000\x1b"


def test_the_agent_side_is_unchanged_a_server_frame_is_not_checked_as_device_text() -> None:
    agent = Channel(Role.AGENT)
    welcome = {"session_id": "s1", "version": 1, "heartbeat_interval_s": 1, "heartbeat_timeout_s": 5}
    agent.receive(frame("welcome", seq=0, **welcome, max_frame_bytes=1000, resumed=False))
    agent.open_agent(Welcome(**welcome, max_frame_bytes=1000, resumed=False), Session("s1", 1))  # type: ignore[arg-type]
    cmd = {"call_id": "c1", "tool": "shell.run", "arguments": {"argv": ["rm\u0000x"]}}
    batch = agent.receive(
        frame("command_batch", batch_id="b1", task_id="t", node_id="n", attempt=1, fence=1, commands=[cmd])
    )
    assert batch is not None  # the agent refuses the NUL itself, as invalid_arguments (test_nul_bytes)


def test_skipped_is_a_known_result_code() -> None:
    assert bounded_result_error("skipped", "an earlier command failed") == ("skipped", "an earlier command failed")
