"""Is this agent connected? For container health checks (the agent image's HEALTHCHECK).

While the agent holds a session, it keeps `<data dir>/session.json` (written at the welcome and
at every heartbeat while the server is heard from, removed when the session ends):

    python3 -m device_agent.health [DATA_DIR]   # exit 0 if connected, else 1 and the reason

DATA_DIR defaults to ORRERY_AGENT_DATA_DIR. "Connected" means the file exists and was refreshed
within the server's heartbeat timeout (it says so in the file).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from device_agent.datadir import PRIVATE_FILE, SESSION_NAME

FILE = SESSION_NAME


def write(data_dir: Path, url: str, session_id: str, stale_after_s: float) -> None:
    """Replace the session file (0600, like everything the agent keeps in its data dir)."""
    state = {"server": url, "session": session_id, "at": time.time(), "stale_after_s": stale_after_s}
    tmp = data_dir / f".{FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), PRIVATE_FILE)  # whatever the umask, and if a wider one was there
        out.write(json.dumps(state))
    os.replace(tmp, data_dir / FILE)


def clear(data_dir: Path) -> None:
    (data_dir / FILE).unlink(missing_ok=True)


def check(data_dir: Path, now: float | None = None) -> str | None:
    """None if the agent is connected, else why not."""
    path = data_dir / FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
        age = (time.time() if now is None else now) - float(state["at"])
        stale_after = float(state["stale_after_s"])
    except FileNotFoundError:
        return f"not connected (no {path})"
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return f"unreadable {path}: {exc}"
    if age > stale_after:
        return f"no word from the orchestrator for {age:.0f}s (more than {stale_after:.0f}s)"
    return None


def main(argv: list[str]) -> int:
    where = argv[0] if argv else os.environ.get("ORRERY_AGENT_DATA_DIR", "")
    if not where:
        print("usage: python3 -m device_agent.health DATA_DIR (or set ORRERY_AGENT_DATA_DIR)", file=sys.stderr)
        return 2
    problem = check(Path(where))
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    print("connected")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
