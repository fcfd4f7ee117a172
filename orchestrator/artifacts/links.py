"""Download links a browser can follow without the API key.

The dashboard keeps its API key in the tab and sends it only as a header, so a download the
browser streams to disk (an `<a download>`) needs a URL that carries its own permission. A link
is signed with the server's secret key (shared by every replica), names one artifact version of
one task and the API key that asked for it, and lasts `LINK_TTL_S`: a revoked key's links stop
working at once, an expired one answers 410, and no link opens anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from orchestrator.artifacts.errors import ArtifactNotFound, LinkExpired
from orchestrator.security import Hasher

LINK_TTL_S = 300
_DOMAIN = "orrery-artifact-link:"  # keeps these signatures apart from the key and token hashes


@dataclass(frozen=True)
class LinkClaims:
    task_id: str
    artifact_id: str
    key_id: str
    expires: int  # unix seconds


def make_link(hasher: Hasher, task_id: str, artifact_id: str, key_id: str, now: float) -> tuple[str, LinkClaims]:
    """A signed token for one artifact version, and what it says."""
    claims = LinkClaims(task_id, artifact_id, key_id, int(now) + LINK_TTL_S)
    raw = json.dumps([claims.task_id, claims.artifact_id, claims.key_id, claims.expires], separators=(",", ":"))
    payload = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    return f"{payload}.{hasher.digest(_DOMAIN + payload)}", claims


def read_link(hasher: Hasher, token: str, now: float) -> LinkClaims:
    """What a token grants, if this server signed it and it has not expired."""
    payload, _, signature = token.partition(".")
    if not payload or not signature or not hasher.matches(_DOMAIN + payload, signature):
        raise ArtifactNotFound("no such download link; ask for a new one (POST .../artifacts/{name}/link)")
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        task_id, artifact_id, key_id, expires = json.loads(raw)
        claims = LinkClaims(str(task_id), str(artifact_id), str(key_id), int(expires))
    except (binascii.Error, ValueError, TypeError):
        raise ArtifactNotFound("no such download link; ask for a new one") from None
    if now >= claims.expires:
        raise LinkExpired(f"this download link expired (links last {LINK_TTL_S} s); ask for a new one")
    return claims
