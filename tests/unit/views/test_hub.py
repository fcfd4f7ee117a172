"""The view hub without sockets: what a viewer holds, when the device is told to stream, where
its frames and answers go, and view ids. Frames go to a list instead of a device (the hub's
`send` is any callable); the relay is the in-process one."""

from __future__ import annotations

import asyncio

from orchestrator.security import Hasher
from orchestrator.views.hub import Viewer, ViewHub, ViewOptions
from orchestrator.views.tickets import TicketCheck, Tickets
from protocol.messages import Message, View, ViewEnded, ViewFrame, ViewInput, ViewInputResult


def frame(stream_id: str, n: int) -> ViewFrame:
    return ViewFrame(
        stream_id=stream_id, n=n, source="x11", image_b64="aGk=", width=4, height=3, screen_width=8, screen_height=6
    )


def hub(sent: list[tuple[str, Message]], lease_s: float = 30.0) -> ViewHub:
    views = ViewHub(lease_s)
    views.bind(lambda device, message: sent.append((device, message)) is None)
    return views


async def test_a_slow_viewer_holds_only_the_newest_frame_and_then_the_end() -> None:
    viewer = Viewer()
    for n in range(1, 1001):
        viewer.offer({"kind": "frame", "n": n})
    viewer.offer({"kind": "ended", "code": "device_offline"})
    viewer.offer({"kind": "frame", "n": 1001})  # nothing after the end
    assert viewer.skipped == 999
    assert await viewer.next(1) == {"kind": "frame", "n": 1000}
    assert await viewer.next(1) == {"kind": "ended", "code": "device_offline"}
    assert await viewer.next(0.01) == {"kind": "ended", "code": "device_offline"}


async def test_a_viewer_waits_for_a_frame_no_longer_than_asked() -> None:
    assert await Viewer().next(0.01) is None


async def test_the_first_viewer_starts_the_stream_and_the_last_one_stops_it() -> None:
    sent: list[tuple[str, Message]] = []
    views = hub(sent)
    async with views.watch("d1", ViewOptions(fps=2)) as one:
        await asyncio.sleep(0)  # the lease's first copy goes out from its task
        async with views.watch("d1", ViewOptions(fps=5, marks=True)) as two:
            views.take("d1", frame(views.watches["d1"].stream_id, 1))
            assert (await one.next(1) or {})["n"] == 1
            assert (await two.next(1) or {})["n"] == 1
        assert "d1" in views.watches  # one viewer is still there
    assert "d1" not in views.watches
    frames = [m for _, m in sent]
    assert all(isinstance(m, View) for m in frames)
    ons = [m for m in frames if isinstance(m, View) and m.on]
    # The first viewer's options, then the stronger ones of the second at once (not at the renewal).
    assert [(m.fps, m.marks) for m in ons] == [(2, False), (5, True)]
    last = frames[-1]
    assert isinstance(last, View) and not last.on and last.stream_id == ons[0].stream_id


async def test_frames_of_another_stream_are_not_this_replicas_and_an_end_reaches_every_viewer() -> None:
    views = hub([])
    async with views.watch("d1", ViewOptions()) as viewer:
        assert views.deliver("d1", {"kind": "frame", "stream_id": "someone-elses", "n": 1}) is False
        assert await viewer.next(0.01) is None
        views.take("d1", ViewEnded(stream_id=views.watches["d1"].stream_id, code="watch_disallowed"))
        assert (await viewer.next(1) or {})["code"] == "watch_disallowed"


async def test_a_device_that_goes_away_ends_its_viewers() -> None:
    views = hub([])
    async with views.watch("d1", ViewOptions()) as viewer:
        views.device_gone("d1")
        assert (await viewer.next(1) or {})["code"] == "device_offline"


async def test_an_input_gets_the_devices_answer_or_none_in_time() -> None:
    sent: list[tuple[str, Message]] = []
    views = hub(sent)

    async def answer() -> None:
        while not sent:
            await asyncio.sleep(0)
        forwarded = sent[-1][1]
        assert isinstance(forwarded, ViewInput)
        views.take("d1", ViewInputResult(input_id=forwarded.input_id, ok=False, code="not_taken_over"))

    answering = asyncio.create_task(answer())
    got = await views.send_input("d1", ViewInput(input_id="in_1", kind="key", keys="Return"), 5)
    await answering
    assert got is not None and got["code"] == "not_taken_over"
    assert await views.send_input("d1", ViewInput(input_id="in_2", kind="key", keys="Return"), 0.01) is None
    assert views.inputs == {}


async def test_features_say_whether_a_device_can_be_watched() -> None:
    views = hub([])
    views.device_hello("d1", ["view", "record"])
    views.device_hello("d2", [])
    assert await views.supports("d1") and not await views.supports("d2") and not await views.supports("d3")


def test_a_view_id_is_bound_to_its_device_its_key_and_its_expiry() -> None:
    tickets = Tickets(Hasher(b"k" * 32), ttl_s=60)
    ticket = tickets.issue("dev_a", "key_1", now=1000)
    assert tickets.check(ticket.view_id, "dev_a", "key_1", now=1010) is TicketCheck.OK
    assert tickets.check(ticket.view_id, "dev_b", "key_1", now=1010) is TicketCheck.SCOPE
    assert tickets.check(ticket.view_id, "dev_a", "key_2", now=1010) is TicketCheck.SCOPE
    assert tickets.check(ticket.view_id, "dev_a", "key_1", now=1061) is TicketCheck.EXPIRED
    assert tickets.check("view_x_1_y", "dev_a", "key_1", now=0) is TicketCheck.SCOPE
    other = Tickets(Hasher(b"z" * 32), ttl_s=60)  # another deployment's secret
    assert other.check(ticket.view_id, "dev_a", "key_1", now=1010) is TicketCheck.SCOPE
