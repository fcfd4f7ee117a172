"""The view leases on a clock the tests move by hand."""

from __future__ import annotations

from device_agent.screen.leases import Change, Leases
from protocol.messages import View


def view(stream_id: str = "s1", **fields: object) -> View:
    return View(stream_id=stream_id, **fields)  # type: ignore[arg-type]


def test_a_stream_starts_on_its_first_view_and_each_copy_renews_it() -> None:
    leases = Leases()
    assert leases.view(view(lease_s=10), now=0.0) is Change.STARTED
    assert leases.view(view(lease_s=10), now=8.0) is Change.RENEWED
    assert leases.expire(now=17.0) == []  # renewed at 8: good until 18
    assert leases.expire(now=18.0) == ["s1"]
    assert not leases


def test_a_stream_nobody_renews_expires_after_its_lease() -> None:
    leases = Leases()
    leases.view(view("a", lease_s=5), now=0.0)
    leases.view(view("b", lease_s=20), now=0.0)
    assert leases.expire(now=4.99) == []
    assert leases.expire(now=5.0) == ["a"]
    assert list(leases.streams) == ["b"]


def test_view_off_ends_the_stream_at_once_and_an_unknown_one_is_ignored() -> None:
    leases = Leases()
    leases.view(view(), now=0.0)
    assert leases.view(view(on=False), now=1.0) is Change.ENDED
    assert leases.view(view(on=False), now=1.0) is Change.UNKNOWN
    assert leases.next_wake(now=1.0) is None


def test_a_stream_never_gets_more_than_fps_frames_a_second() -> None:
    leases = Leases()
    leases.view(view(fps=4, lease_s=60), now=0.0)
    sent = []
    now = 0.0
    while now < 10.0:  # asked every 10 ms for ten seconds
        for stream in leases.due(now):
            sent.append(leases.sent(stream, now))
        now = round(now + 0.01, 2)
    assert len(sent) == 40
    assert sent == list(range(1, 41))  # numbered from 1, no gaps


def test_a_slow_capture_keeps_the_rate_without_a_burst() -> None:
    """Each frame goes out 60 ms after it was due (its capture): the stream still gets `fps` frames
    a second, and after a stall longer than an interval it goes on from now, not in a burst."""
    leases = Leases()
    leases.view(view(fps=2, lease_s=60), now=0.0)
    sent_at = []
    now = 0.0
    while now < 10.0:
        for stream in leases.due(now):
            now = round(now + 0.06, 2)  # the capture
            leases.sent(stream, now)
            sent_at.append(now)
        now = round(now + 0.01, 2)
    assert len(sent_at) == 20
    (stream,) = leases.streams.values()
    leases.sent(stream, 30.0)  # after a long stall
    assert stream.next_at == 30.5


def test_the_next_wake_is_the_sooner_of_the_next_frame_and_the_lease_end() -> None:
    leases = Leases()
    leases.view(view(fps=2, lease_s=0.3), now=0.0)
    (stream,) = leases.due(0.0)
    leases.sent(stream, 0.0)
    assert leases.next_wake(now=0.0) == 0.3  # the lease ends before the next frame (0.5)
    leases.view(view(fps=2, lease_s=10), now=0.1)
    assert leases.next_wake(now=0.1) == 0.4


def test_streams_of_one_shape_share_a_capture() -> None:
    leases = Leases()
    leases.view(view("a", max_side=800, quality=70), now=0.0)
    leases.view(view("b", max_side=800, quality=70), now=0.0)
    leases.view(view("c", max_side=400, quality=70), now=0.0)
    shapes = {s.shape for s in leases.due(0.0)}
    assert shapes == {(800, 70, False), (400, 70, False)}
