"""The cost of screen recordings: the same GUI batches with and without `record`, under Xvfb.

A real agent process (`--toolset gui`, on a private Xvfb showing the instrumented Tk app of the
GUI tests) against a scripted orchestrator (tests/unit/device_agent/scripted.py) that sends the
next batch (`gui.observe`, a step of an agent node) as soon as the last result is in, for a fixed
time, once with `record: off` and once with `record: failures` (one attempt, every batch appending
to its recording). Figures:

- wall time per batch (p50 and p95);
- the agent's CPU (its process, user + system, from /proc) per minute of running;
- the recording's bytes per minute: its JPEG frames on disk, and the WebM the agent's own
  `Recorder` encodes from them (the encode's wall time too), at `[agent.recording] fps`.

    python bench/recording.py [--seconds 30] [--fps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from device_agent.screen.recorder import Key, Recorder
from device_agent.screen.source import X11Source, ffmpeg_path
from tests.unit.device_agent.scripted import AgentProcess, Connection, ScriptedOrchestrator

ROOT = Path(__file__).resolve().parent.parent
TK_APP = ROOT / "tests" / "gui" / "tk_app.py"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start_xvfb() -> tuple[subprocess.Popen[bytes], str]:
    for number in range(150 + os.getpid() % 50, 260):
        if Path(f"/tmp/.X11-unix/X{number}").exists() or Path(f"/tmp/.X{number}-lock").exists():
            continue
        proc = subprocess.Popen(
            ["Xvfb", f":{number}", "-screen", "0", "1280x800x24", "-nolisten", "tcp", "-noreset"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            probe = subprocess.run(["xdpyinfo", "-display", f":{number}"], capture_output=True, check=False)
            if probe.returncode == 0:
                return proc, f":{number}"
            time.sleep(0.05)
        proc.kill()
    raise SystemExit("could not start Xvfb")


async def phase(conn: Connection, agent: AgentProcess, record: str, seconds: float, attempt: int) -> dict[str, float]:
    """Batches back to back for `seconds`; per-batch wall times and the agent's CPU."""
    assert agent.proc is not None
    times = []
    cpu0, t0 = cpu_s(agent.proc.pid), time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        n += 1
        batch_id = f"b-{record}-{n}"
        started = time.perf_counter()
        await conn.send(
            "command_batch",
            reliable=True,
            batch_id=batch_id,
            task_id="bench",
            node_id="step",
            attempt=attempt,
            fence=attempt * 100_000 + n,
            record=record,
            commands=[{"call_id": "c1", "tool": "gui.observe", "timeout_s": 30}],
        )
        frame = await conn.result_for(batch_id)
        times.append(time.perf_counter() - started)
        assert frame["results"][0]["status"] == "success", frame
    elapsed = time.monotonic() - t0
    cpu = cpu_s(agent.proc.pid) - cpu0
    times.sort()
    return {
        "batches": len(times),
        "p50_ms": statistics.median(times) * 1000,
        "p95_ms": times[int(len(times) * 0.95) - 1] * 1000,
        "cpu_s_per_min": cpu / elapsed * 60,
        "seconds": elapsed,
    }


async def encoded(folder: Path, display: str, fps: float) -> tuple[int, float]:
    """The WebM the agent's `Recorder` makes of the recorded frames: its size and the encode's wall time."""
    ffmpeg = ffmpeg_path()
    assert ffmpeg is not None

    async def upload(_batch: str, _path: Path, _name: str) -> None:
        return None

    recorder = Recorder(X11Source(display), folder.parent, ffmpeg, upload, fps=fps)
    started = time.monotonic()
    video = await recorder.encode(folder, Key("bench", "step", 2))
    assert video is not None
    return video.stat().st_size, time.monotonic() - started


async def run(seconds: float, fps: float, display: str, tmp: Path) -> dict[str, dict[str, float]]:
    async with ScriptedOrchestrator().running() as server:
        env = {
            "DISPLAY": display,
            "ORRERY_AGENT_TOOLSETS": json.dumps(["system", "gui"]),
            "ORRERY_AGENT_RECORDING": json.dumps({"fps": fps}),
            "ORRERY_AGENT_LOG_LEVEL": "warning",
        }
        agent = AgentProcess(tmp / "agent", server.url, **env).start()
        try:
            conn = await server.next_connection()
            await conn.welcome()
            assert "record" in conn.hello["features"], conn.hello
            await phase(conn, agent, "off", 2, 1)  # warm up
            off = await phase(conn, agent, "off", seconds, 1)
            on = await phase(conn, agent, "failures", seconds, 2)
            frames = agent.data_dir / "recordings" / "bench.step.2"
            kept = tmp / "frames" / "bench.step.2"
            shutil.copytree(frames, kept)
            on_disk = sum(p.stat().st_size for p in kept.glob("frame-*.jpg"))
            await conn.send("recording_end", reliable=True, task_id="bench", node_id="step", attempt=2, keep=False)
            video, encode_s = await encoded(kept, display, fps)
            minutes = on["seconds"] / 60
            on.update(frames_bytes_per_min=on_disk / minutes, webm_bytes_per_min=video / minutes, encode_s=encode_s)
            return {"off": off, "on": on}
        finally:
            await asyncio.to_thread(agent.stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="of batches in each phase")
    parser.add_argument("--fps", type=float, default=2.0, help="[agent.recording] fps")
    args = parser.parse_args()
    xvfb, display = start_xvfb()
    with tempfile.TemporaryDirectory() as tmp:
        app = subprocess.Popen(
            [sys.executable, str(TK_APP), str(Path(tmp) / "tk.json")], env={**os.environ, "DISPLAY": display}
        )
        try:
            result = asyncio.run(run(args.seconds, args.fps, display, Path(tmp)))
        finally:
            app.terminate()
            app.wait(10)
            xvfb.terminate()
            xvfb.wait(10)
    off, on = result["off"], result["on"]
    print(f"GUI batches (gui.observe) for {args.seconds:g} s each, recording at {args.fps:g} frames/s, 1280x800 Xvfb")
    print(f"{'':28}{'without recording':>20}{'with recording':>18}")
    print(f"{'batches':28}{off['batches']:>20.0f}{on['batches']:>18.0f}")
    print(f"{'wall per batch p50 (ms)':28}{off['p50_ms']:>20.1f}{on['p50_ms']:>18.1f}")
    print(f"{'wall per batch p95 (ms)':28}{off['p95_ms']:>20.1f}{on['p95_ms']:>18.1f}")
    print(f"{'agent CPU (s per minute)':28}{off['cpu_s_per_min']:>20.1f}{on['cpu_s_per_min']:>18.1f}")
    print(f"{'frames on disk (MB/min)':28}{'-':>20}{on['frames_bytes_per_min'] / 1e6:>18.2f}")
    print(f"{'WebM (MB/min)':28}{'-':>20}{on['webm_bytes_per_min'] / 1e6:>18.2f}")
    print(f"{'encode wall time (s)':28}{'-':>20}{on['encode_s']:>18.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
