"""Every Redis key and channel Orrery uses, in one place (DESIGN, habit 4)."""

from __future__ import annotations

PREFIX = "orrery"

EVENTS = f"{PREFIX}:events"  # pub/sub: ids of tasks with newly committed events (wakes SSE readers)
LEADER = f"{PREFIX}:leader"  # pub/sub: "replica R now leads the engine (fence F)"
INBOX = f"{PREFIX}:engine:inbox"  # pub/sub: engine inputs from any replica, read by the leader


def replica_out(replica: str) -> str:
    """pub/sub: frames to send to (and connections to close for) devices connected to `replica`."""
    return f"{PREFIX}:replica:{replica}:out"


def replica_replies(replica: str) -> str:
    """pub/sub: the leader's replies to inputs `replica` sent and waits on."""
    return f"{PREFIX}:replica:{replica}:replies"


def presence(device_id: str) -> str:
    """string with a TTL, "<replica>|<epoch>": the replica holding the device's newest connection,
    refreshed by its frames; only a connection with an epoch at least as new replaces it."""
    return f"{PREFIX}:presence:device:{device_id}"


def view(device_id: str) -> str:
    """pub/sub: the device's live view frames, view ends and input results, published by the
    replica holding its socket while a viewer or an input waits on another replica."""
    return f"{PREFIX}:view:device:{device_id}"


def features(device_id: str) -> str:
    """string: the features the device's agent announced in its last hello ("view,record")."""
    return f"{PREFIX}:features:device:{device_id}"
