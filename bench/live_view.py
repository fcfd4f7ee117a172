"""The live view through the whole system: frames a second a viewer gets, their size, and how long
a person's click through the view takes to be applied, on loopback.

A real orchestrator and a real agent (`--toolset gui` on a private Xvfb showing the Tk app of the
GUI tests), a viewer reading `GET /v1/devices/{id}/views/{view}/frames` over HTTP as the dashboard
does. For each requested rate: frames received in `--seconds`, the median gap between them and
the mean frame size. Then, with the device taken over, `--clicks` clicks through
`POST /v1/devices/{id}/input` (each answered once the device applied it): median and p95.

    python bench/live_view.py [--seconds 10] [--clicks 20]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.recording import TK_APP, start_xvfb
from tests.support import Fleet, wait_until


def frames(fleet: Fleet, device_id: str, fps: float, seconds: float) -> dict[str, float]:
    with fleet.server.client() as c:
        view = c.post(f"/v1/devices/{device_id}/views", json={"fps": fps}).json()
        arrived: list[float] = []
        sizes: list[int] = []
        with c.stream("GET", view["frames_url"], timeout=seconds + 30) as r:
            started = time.monotonic()
            kind = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind == "frame":
                    arrived.append(time.monotonic())
                    sizes.append(len(json.loads(line[5:])["image_b64"]) * 3 // 4)
                if time.monotonic() - started >= seconds:
                    break
    gaps = [b - a for a, b in itertools.pairwise(arrived)]
    span = arrived[-1] - arrived[0] if len(arrived) > 1 else seconds
    return {
        "asked": fps,
        "got": (len(arrived) - 1) / span if len(arrived) > 1 else 0.0,
        "gap_ms": statistics.median(gaps) * 1000 if gaps else 0.0,
        "kb": statistics.mean(sizes) / 1024 if sizes else 0.0,
    }


def clicks(fleet: Fleet, device_id: str, count: int) -> list[float]:
    with fleet.server.client() as c:
        assert c.post(f"/v1/devices/{device_id}/takeover", json={"reason": "bench"}).status_code == 200
        took = []
        for _ in range(count):
            body = {"kind": "click", "x": 300, "y": 250, "frame_width": 1280, "frame_height": 800}
            t0 = time.perf_counter()
            r = c.post(f"/v1/devices/{device_id}/input", json=body)
            took.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
        c.post(f"/v1/devices/{device_id}/handback", json={"note": "bench"})
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clicks", type=int, default=20)
    args = parser.parse_args()
    xvfb, display = start_xvfb()
    tmp = Path(tempfile.mkdtemp(prefix="orrery-bench-view-"))
    app = subprocess.Popen(
        [sys.executable, str(TK_APP), str(tmp / "tk.json")], env={"DISPLAY": display, "PATH": "/usr/bin:/bin"}
    )
    try:
        with Fleet(tmp) as fleet:
            agent = fleet.agent("desk", extra_args=["--toolset", "gui", "--unattended"], DISPLAY=display)
            wait_until(lambda: "view" in (fleet.device(agent.device_id)["info"].get("features") or []), 30, "view")
            rows: list[dict[str, Any]] = [frames(fleet, agent.device_id, fps, args.seconds) for fps in (2, 5, 10)]
            took = sorted(clicks(fleet, agent.device_id, args.clicks))
        print("| fps asked | fps received | median gap (ms) | mean frame (KB) |")
        print("|---|---|---|---|")
        for row in rows:
            print(f"| {row['asked']:g} | {row['got']:.2f} | {row['gap_ms']:.0f} | {row['kb']:.0f} |")
        p95 = took[min(len(took) - 1, int(len(took) * 0.95))]
        print(
            f"\nclick through the live view, applied by the device: median {statistics.median(took):.1f} ms, "
            f"p95 {p95:.1f} ms"
        )
    finally:
        app.kill()
        xvfb.kill()


if __name__ == "__main__":
    main()
