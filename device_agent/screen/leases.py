"""Which view streams are on, and when each is due its next frame. Pure: the time is passed in.

A stream is a lease (protocol `View`): the first copy starts it, each copy renews it, `on: false`
ends it, and one not renewed within its `lease_s` expires, so a viewer that went away, or a
replica that died, never leaves a device streaming. A stream gets `fps` frames a second on a fixed
cadence: a frame sent late (its capture took a while) does not push the next ones back, and one
more than an interval late starts the cadence again from now, so a slow capture never makes a burst.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from protocol.messages import View


class Change(StrEnum):
    STARTED = "started"
    RENEWED = "renewed"
    ENDED = "ended"
    UNKNOWN = "unknown"  # `on: false` for a stream that is not on


@dataclass
class Stream:
    stream_id: str
    fps: float
    max_side: int
    quality: int
    marks: bool
    lease_s: float
    renewed_at: float
    next_at: float  # the earliest time of its next frame
    sent: int = 0  # frames sent so far (the next one is numbered sent + 1)

    @property
    def shape(self) -> tuple[int, int, bool]:
        """What its frames look like: streams of one shape share one capture."""
        return self.max_side, self.quality, self.marks

    def expired(self, now: float) -> bool:
        return now - self.renewed_at >= self.lease_s


class Leases:
    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}

    def __bool__(self) -> bool:
        return bool(self.streams)

    def view(self, msg: View, now: float) -> Change:
        """Apply one `View` copy: start, renew (taking its newest settings) or end its stream."""
        current = self.streams.get(msg.stream_id)
        if not msg.on:
            if current is None:
                return Change.UNKNOWN
            del self.streams[msg.stream_id]
            return Change.ENDED
        if current is None:
            self.streams[msg.stream_id] = Stream(
                msg.stream_id, msg.fps, msg.max_side, msg.quality, msg.marks, msg.lease_s, now, now
            )
            return Change.STARTED
        current.renewed_at = now
        current.fps, current.max_side, current.quality = msg.fps, msg.max_side, msg.quality
        current.marks, current.lease_s = msg.marks, msg.lease_s
        current.next_at = min(current.next_at, now + 1 / msg.fps)  # a faster rate applies at once
        return Change.RENEWED

    def expire(self, now: float) -> list[str]:
        """End the streams whose lease ran out; their ids."""
        gone = [s.stream_id for s in self.streams.values() if s.expired(now)]
        for stream_id in gone:
            del self.streams[stream_id]
        return gone

    def due(self, now: float) -> list[Stream]:
        """The streams whose next frame may be sent now."""
        return [s for s in self.streams.values() if s.next_at <= now]

    def sent(self, stream: Stream, now: float) -> int:
        """A frame of `stream` went out at `now`; its number."""
        stream.sent += 1
        step = 1 / stream.fps
        planned = stream.next_at + step
        stream.next_at = planned if planned > now else now + step
        return stream.sent

    def next_wake(self, now: float) -> float | None:
        """Seconds until something is due (a frame or an expiry), or None with no stream on."""
        if not self.streams:
            return None
        soonest = min(min(s.next_at, s.renewed_at + s.lease_s) for s in self.streams.values())
        return max(0.0, soonest - now)

    def end_all(self) -> list[str]:
        ids = list(self.streams)
        self.streams.clear()
        return ids
