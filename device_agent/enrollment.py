"""The sample agent entrypoint's two REST calls (deploy/agent-entrypoint.sh), with the standard
library only, so the device-only image (`pip install .`: no server extra, so no `orrery devices`
client commands) can enroll itself:

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
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class Failure(Exception):
    pass


def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    url = os.environ.get("ORRERY_URL", "").rstrip("/")
    key = os.environ.get("ORRERY_API_KEY", "")
    if not url or not key:
        raise Failure("config: set ORRERY_URL and ORRERY_API_KEY")
    request = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            problem = json.loads(exc.read() or b"{}")
        except ValueError:
            problem = {}
        if not isinstance(problem, dict):
            problem = {}
        raise Failure(f"{problem.get('code', exc.code)}: {problem.get('detail', exc.reason)}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise Failure(f"unreachable: {url}: {reason}") from None


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
