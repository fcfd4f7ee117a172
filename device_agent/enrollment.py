"""The sample agent entrypoint's two REST calls (deploy/agent-entrypoint.sh), through the Python
SDK (`orrery.sdk`, in the base install), so the device-only image (`pip install .`: no server
extra, so no `orrery devices` client commands) can enroll itself:

    python3 -m device_agent.enrollment enroll NAME      # POST /v1/devices
    python3 -m device_agent.enrollment take-over NAME   # POST /v1/devices/NAME/token

The orchestrator's URL and the admin key come from ORRERY_URL and ORRERY_API_KEY (the environment,
never argv, so the key does not show in the process list). The answer's JSON goes to stdout; an
API problem goes to stderr as `error CODE: detail` (as `orrery devices ...` prints it), exit 1.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from typing import Any

from orrery.sdk import Client, OrreryError


class Failure(Exception):
    pass


def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    url = os.environ.get("ORRERY_URL", "").rstrip("/")
    key = os.environ.get("ORRERY_API_KEY", "")
    if not url or not key:
        raise Failure("config: set ORRERY_URL and ORRERY_API_KEY")
    try:
        with Client(url, key, timeout=30) as client:
            return client.request(method, path, json=body)
    except OrreryError as exc:  # the API's problem, or `unreachable`
        raise Failure(f"{exc.code}: {exc.detail}") from None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("enroll", "take-over"):
        print("usage: python3 -m device_agent.enrollment enroll|take-over NAME", file=sys.stderr)
        return 2
    action, name = argv
    try:
        if action == "enroll":
            answer = call("POST", "/v1/devices", {"name": name, "labels": {}})
        else:
            answer = call("POST", f"/v1/devices/{urllib.parse.quote(name, safe='')}/token")
    except Failure as exc:
        print(f"error {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
