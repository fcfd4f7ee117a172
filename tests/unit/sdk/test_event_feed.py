"""The resume state of an event stream, without a server: what a reader is given, what it is
spared, and when it stops trying (orrery/sdk/stream.py)."""

from __future__ import annotations

import json

import pytest
from httpx2 import ServerSentEvent

from orrery import Unauthorized, Unavailable
from orrery.sdk.stream import MAX_DROPS, EventFeed


def frame(event_id: int, type_: str = "node.state", **data: object) -> ServerSentEvent:
    return ServerSentEvent(event=type_, data=json.dumps({"task_id": "t1", **data}), id=str(event_id))


def test_an_event_already_delivered_is_not_delivered_again() -> None:
    feed = EventFeed("t1", after=0)
    assert feed.take(frame(1, node_id="a", state="running")) is not None
    assert feed.take(frame(2, node_id="a", state="succeeded")) is not None
    assert feed.take(frame(2, node_id="a", state="succeeded")) is None  # sent again after a reconnect
    assert feed.take(frame(1, node_id="a", state="running")) is None
    assert feed.params == {"after": 2}


def test_the_tasks_final_state_ends_the_feed_and_its_data_is_typed() -> None:
    feed = EventFeed("t1")
    event = feed.take(frame(7, "task.state", state="succeeded", at="2026-01-01T00:00:00+00:00"))
    assert event is not None and event.ends_task and feed.ended
    assert (event.id, event.type, event.task_id, event.state, event.at.year if event.at else None) == (
        7,
        "task.state",
        "t1",
        "succeeded",
        2026,
    )
    assert not EventFeed("t1").take(frame(1, "task.state", state="running")).ends_task  # type: ignore[union-attr]


def test_the_servers_closing_error_frame_is_unauthorized_with_its_code() -> None:
    closing = ServerSentEvent(
        event="error", data=json.dumps({"task_id": "t1", "code": "key_revoked", "detail": "gone"})
    )
    with pytest.raises(Unauthorized) as refused:
        EventFeed("t1").take(closing)
    assert (refused.value.code, refused.value.detail) == ("key_revoked", "gone")


def test_a_dropped_stream_is_retried_with_growing_delays_then_given_up_naming_where_to_resume() -> None:
    feed = EventFeed("t1")
    feed.opened = True
    feed.take(frame(5))
    delays = [feed.dropped("reset") for _ in range(MAX_DROPS)]
    assert delays == sorted(delays) and delays[-1] <= 2.0
    with pytest.raises(Unavailable) as gave_up:
        feed.dropped("reset")
    assert gave_up.value.code == "unreachable" and "after=5" in gave_up.value.detail


def test_a_new_event_starts_the_count_of_drops_again() -> None:
    feed = EventFeed("t1")
    feed.opened = True
    for n in range(1, 4 * MAX_DROPS):
        feed.dropped("reset")
        feed.take(frame(n))  # each reconnection brought something new
    assert feed.drops == 0
