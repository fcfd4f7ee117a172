"""A task's event stream, followed across dropped connections (SPEC section 3: every event has
a monotonically increasing `id`; `?after=` resumes after one). No I/O here: the clients open
the stream where `EventFeed.path`/`params` say, hand each server-sent event to `take`, and ask
`dropped` how long to wait before opening it again; `take` drops an event already delivered,
so a reconnection never repeats one, and resuming after the last one delivered loses none."""

from __future__ import annotations

import json
from typing import Any

from httpx2 import ServerSentEvent

from orrery.sdk.calls import events_path
from orrery.sdk.errors import Unauthorized, Unavailable
from orrery.sdk.models import Event, Frame, ViewEnd

MAX_DROPS = 8  # reconnections in a row without a new event before giving up
READ_TIMEOUT_S = 60.0  # the server sends a keep-alive every 15 s: silence this long is a dead link
_EVENT_KEYS = ("task_id", "node_id", "state", "at")


class EventFeed:
    """Where one reader of a task's events is: the last event id delivered, whether the task's
    last event came, and how many reconnections in a row found nothing new."""

    def __init__(self, task_id: str, after: int = 0) -> None:
        self.task_id = task_id
        self.last = after
        self.ended = False
        self.drops = 0
        self.opened = False  # a connection was made once: after that, a drop is retried

    @property
    def path(self) -> str:
        return events_path(self.task_id)

    @property
    def params(self) -> dict[str, int]:
        return {"after": self.last}

    def take(self, sse: ServerSentEvent) -> Event | None:
        """The event `sse` carries, or None (a duplicate, or a frame without an id). The
        server's closing `error` frame (its API key was revoked) raises `Unauthorized`."""
        if sse.event == "error":
            body = _object(sse.data)
            raise Unauthorized(401, str(body.get("code") or "unauthorized"), str(body.get("detail") or ""), body)
        if not sse.id.isdigit() or int(sse.id) <= self.last:
            return None
        data = _object(sse.data)
        event = Event.model_validate(
            {"id": int(sse.id), "type": sse.event, "data": data, **{k: data[k] for k in _EVENT_KEYS if k in data}}
        )
        self.last = event.id
        self.drops = 0
        self.ended = self.ended or event.ends_task
        return event

    def dropped(self, why: str) -> float:
        """The stream ended before the task's last event: the seconds to wait before opening it
        again, or `Unavailable` (code `unreachable`) when it cannot be reopened."""
        self.drops += 1
        if not self.opened or self.drops > MAX_DROPS:
            raise Unavailable(
                0,
                "unreachable",
                f"lost the event stream of task {self.task_id} after event {self.last} and could not "
                f"resume it ({why}); resume with after={self.last}",
            )
        return min(0.05 * 2.0 ** (self.drops - 1), 2.0)


def _object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def view_item(sse: ServerSentEvent) -> Frame | ViewEnd | None:
    """What one event of a live view's stream carries: a frame, the end, or None (other events)."""
    if sse.event == "frame":
        return Frame.model_validate(_object(sse.data))
    if sse.event == "ended":
        data = _object(sse.data)
        return ViewEnd(code=str(data.get("code") or "ended"), message=str(data.get("message") or ""))
    return None
