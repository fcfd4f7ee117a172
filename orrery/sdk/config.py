"""Where the server is and which key to use, found as the CLI finds them (SPEC section 3, client
CLI): `ORRERY_URL` (else `http://$ORRERY_HOST:$ORRERY_PORT`) and `ORRERY_API_KEY` (else the bare
key in `$ORRERY_DATA_DIR/admin.key`, which a local `orrery serve` writes at first start)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


def default_server() -> str:
    """`ORRERY_URL`, else the server `orrery serve` starts with the same environment."""
    if os.environ.get("ORRERY_URL"):
        return os.environ["ORRERY_URL"]
    host = os.environ.get("ORRERY_HOST", "127.0.0.1")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{os.environ.get('ORRERY_PORT', '8765')}"


def server_url(server: str) -> str:
    """A server as a user may write it: a bare `host:port` is `http://host:port`, and a ws(s)
    URL (or one ending in `/v1/agent`, as given to an agent) names the same server over http(s)."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/").removesuffix("/v1/agent")
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def default_api_key(data_dir: Path | None = None) -> str | None:
    """`ORRERY_API_KEY`, else the admin key a local server wrote to its data directory."""
    if os.environ.get("ORRERY_API_KEY"):
        return os.environ["ORRERY_API_KEY"]
    base = data_dir or Path(os.environ.get("ORRERY_DATA_DIR", ".orrery"))
    try:
        return (base / "admin.key").read_text().strip() or None
    except OSError:
        return None
