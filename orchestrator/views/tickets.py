"""View ids: who may read a live view's frames, and of which device.

A view id is a capability bound to one device and one API key, signed with the replicas' shared
secret (`ORRERY_SECRET_KEY`): any replica can check it without a shared record, and none is
stored (a view is a viewer attached to a socket, gone with it). The device and key are not
written in the id; the signature covers them, so an id used under another device or another key
fails its check (`view_scope`), and one past its expiry fails it too (`view_expired`).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from orchestrator.security import Hasher

PREFIX = "view"
SIGNATURE_CHARS = 32


class TicketCheck(StrEnum):
    OK = "ok"
    SCOPE = "view_scope"  # another device's or another key's view, or not a view id at all
    EXPIRED = "view_expired"


@dataclass(frozen=True, slots=True)
class Ticket:
    view_id: str
    device_id: str
    key_id: str
    expires_at: datetime


class Tickets:
    """Issues and checks view ids with the replicas' HMAC key."""

    def __init__(self, hasher: Hasher, ttl_s: float) -> None:
        self.hasher = hasher
        self.ttl_s = ttl_s

    def issue(self, device_id: str, key_id: str, now: float) -> Ticket:
        nonce = secrets.token_hex(8)
        expires = int(now + self.ttl_s)
        head = f"{PREFIX}_{nonce}_{expires}"
        view_id = f"{head}_{self._sign(head, device_id, key_id)}"
        return Ticket(view_id, device_id, key_id, datetime.fromtimestamp(expires, UTC))

    def check(self, view_id: str, device_id: str, key_id: str, now: float) -> TicketCheck:
        parts = view_id.split("_")
        if len(parts) != 4 or parts[0] != PREFIX or not parts[2].isdigit():
            return TicketCheck.SCOPE
        head = "_".join(parts[:3])
        if not hmac.compare_digest(parts[3], self._sign(head, device_id, key_id)):
            return TicketCheck.SCOPE
        if int(parts[2]) < now:
            return TicketCheck.EXPIRED
        return TicketCheck.OK

    def _sign(self, head: str, device_id: str, key_id: str) -> str:
        return self.hasher.digest(f"{head}|{device_id}|{key_id}")[:SIGNATURE_CHARS]
