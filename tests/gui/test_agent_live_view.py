"""A real agent process with the gui toolset on Xvfb, its server played frame by frame
(tests/unit/device_agent/scripted.py): what it announces, streams, refuses and records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.gui.conftest import TkApp
from tests.unit.device_agent.scripted import Connection, scripted

GUI = json.dumps(["system", "gui"])


async def connected(conn: Connection) -> Connection:
    await conn.welcome()
    return conn


def test_an_agent_with_a_display_announces_the_view_streams_frames_and_ends_an_unrenewed_stream(
    xvfb: str, tk_app: TkApp, tmp_path: Path
) -> None:
    async def run() -> None:
        async with scripted(tmp_path, DISPLAY=xvfb, ORRERY_AGENT_TOOLSETS=GUI, ORRERY_AGENT_UNATTENDED="1") as (
            server,
            agent,
        ):
            agent.start()
            conn = await connected(await server.next_connection())
            assert set(conn.hello["features"]) >= {"view"}
            await conn.send("view", stream_id="v1", fps=5, max_side=640, lease_s=2)
            first = await conn.recv("view_frame")
            second = await conn.recv("view_frame")
            assert (first["n"], second["n"], first["source"]) == (1, 2, "x11")
            assert (first["width"], first["screen_width"]) == (640, 1280)
            ended = await conn.recv("view_ended", timeout=10)  # no copy of the view came: the lease ran out
            assert (ended["stream_id"], ended["code"]) == ("v1", "lease_expired")
            at = {"x": 10, "y": 10, "frame_width": 640, "frame_height": 400}
            await conn.send("view_input", input_id="in-1", kind="click", **at)
            answer = await conn.recv("view_input_result")
            assert (answer["input_id"], answer["ok"], answer["code"]) == ("in-1", False, "not_taken_over")

    asyncio.run(run())
    assert tk_app.state()["clicks"] == 0


def test_an_owner_who_forbids_watching_gets_every_view_refused(xvfb: str, tmp_path: Path) -> None:
    async def run() -> None:
        env = {"DISPLAY": xvfb, "ORRERY_AGENT_TOOLSETS": GUI, "ORRERY_AGENT_VIEW": '{"allow_watching": false}'}
        async with scripted(tmp_path, **env) as (server, agent):
            agent.start()
            conn = await connected(await server.next_connection())
            await conn.send("view", stream_id="v1")
            ended = await conn.recv("view_ended")
            assert (ended["stream_id"], ended["code"]) == ("v1", "watch_disallowed")

    asyncio.run(run())


def test_a_recorded_batch_that_the_server_discards_leaves_no_recording(
    xvfb: str, tk_app: TkApp, tmp_path: Path
) -> None:
    async def run() -> Path:
        async with scripted(tmp_path, DISPLAY=xvfb, ORRERY_AGENT_TOOLSETS=GUI) as (server, agent):
            agent.start()
            conn = await connected(await server.next_connection())
            assert "record" in conn.hello["features"]
            await conn.send(
                "command_batch",
                reliable=True,
                batch_id="b1",
                task_id="t1",
                node_id="n1",
                attempt=1,
                fence=1,
                record="failures",
                commands=[{"call_id": "c1", "tool": "gui.windows", "timeout_s": 30}],
            )
            await conn.result_for("b1")
            recordings = agent.data_dir / "recordings"
            assert [p.name for p in recordings.iterdir()] == ["t1.n1.1"]
            await conn.send("recording_end", reliable=True, task_id="t1", node_id="n1", attempt=1, keep=False)
            async with asyncio.timeout(10):
                while any(recordings.iterdir()):
                    await asyncio.sleep(0.05)
            return recordings

    assert not any(asyncio.run(run()).iterdir())
