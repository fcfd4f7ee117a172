"""Secrets at rest: API keys and device tokens are stored only as HMAC-SHA256 digests.

The secrets are 256-bit random values, so a keyed fast hash is the right tool (a password hash
buys nothing against brute force of such a space); the server key keeps a stolen database from
being enough to forge a lookup. Comparison happens through an indexed lookup of the digest,
followed by a constant-time compare.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

API_KEY_PREFIX = "orrk"
DEVICE_TOKEN_PREFIX = "orrd"


class Hasher:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def digest(self, secret: str) -> str:
        return hmac.new(self._key, secret.encode("utf-8", "replace"), hashlib.sha256).hexdigest()

    def matches(self, secret: str, stored: str) -> bool:
        return hmac.compare_digest(self.digest(secret), stored)


def load_secret_key(configured: str | None, data_dir: Path) -> bytes:
    """The HMAC key: from settings (all replicas must share it), else `<data-dir>/secret.key`."""
    if configured:
        return configured.encode()
    path = data_dir / "secret.key"
    if path.exists():
        return path.read_bytes().strip()
    key = secrets.token_hex(32).encode()
    write_private(path, key.decode())
    return key


def write_private(path: Path, text: str) -> None:
    """Create `path` with mode 0600 (never readable by others, even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


def device_token(device_id: str) -> str:
    """A device token names its device (not secret) before the secret part, so an agent knows
    its own id from the token alone: `orrd_<device id>.<secret>`."""
    return f"{DEVICE_TOKEN_PREFIX}_{device_id}.{secrets.token_urlsafe(32)}"


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
